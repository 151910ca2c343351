"""The one-screen layout summary: the derived degrees of both grids, when they are whole numbers."""

from __future__ import annotations

from typing import Any

from planner.pipeline import SplitError, stage_split
from planner.schema import Config


def grids_computable(cfg: Config) -> bool:
    """Both grids tile the world exactly (otherwise DP/EDP are fractions and nothing else is defined)."""
    world = cfg.parallel.world_size
    return world % cfg.dense_model_size == 0 and world % cfg.expert_model_size == 0


def layout_summary(cfg: Config) -> dict[str, Any] | None:
    """N, degrees, DP/EDP, ranks per stage, experts per rank, microbatches; None if not computable."""
    if not grids_computable(cfg):
        return None
    p, m = cfg.parallel, cfg.model
    try:
        vpp = stage_split(cfg).vpp
    except SplitError:
        vpp = p.vpp or 1
    return {
        "world_size": p.world_size,
        "tp": p.tp, "cp": p.cp, "pp": p.pp, "vpp": vpp, "ep": p.ep, "etp": p.etp,
        "gtp": p.gtp, "egtp": p.egtp,
        "dp": cfg.dp, "edp": cfg.edp,
        "ranks_per_stage": p.world_size // p.pp,
        "experts_per_rank": m.num_experts // p.ep if m.num_experts % p.ep == 0 else None,
        "microbatches": cfg.microbatches if cfg.global_batch_size % cfg.batch_unit == 0 else None,
        "global_batch_size": cfg.global_batch_size,
        "micro_batch_size": cfg.training.micro_batch_size,
        "padded_vocab_size": cfg.padded_vocab_size,
        "order": p.order,
        "nodes": cfg.cluster.nodes,
        "gpus_per_node": cfg.cluster.gpus_per_node,
    }

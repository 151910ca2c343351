"""The one-screen layout summary: the degrees and their derived sizes (planner/degrees.py) when both
grids tile the world, plus the batch and cluster numbers a reader wants beside them."""

from __future__ import annotations

from typing import Any

from planner.config.schema import Config
from planner.layout.pipeline import SplitError, stage_split


def grids_computable(cfg: Config) -> bool:
    """Both grids tile the world exactly (otherwise DP/EDP are fractions and nothing else is defined)."""
    return cfg.degrees.divides


def layout_summary(cfg: Config) -> dict[str, Any] | None:
    """N, degrees, DP/EDP, ranks per stage, experts per rank, microbatches; None if not computable."""
    degrees = cfg.degrees
    if not degrees.divides:
        return None
    d, p = degrees, cfg.parallel
    try:
        vpp = stage_split(cfg).vpp
    except SplitError:
        vpp = p.vpp or 1
    return {
        "world_size": d.world_size,
        "tp": d.tp, "cp": d.cp, "pp": d.pp, "vpp": vpp, "ep": d.ep, "etp": d.etp,
        "gtp": d.gtp, "egtp": d.egtp,
        "dp": degrees.dp, "edp": degrees.edp,
        "ranks_per_stage": degrees.ranks_per_stage,
        "experts_per_rank": degrees.experts_per_rank,
        "microbatches": cfg.microbatches if cfg.global_batch_size % cfg.batch_unit == 0 else None,
        "global_batch_size": cfg.global_batch_size,
        "micro_batch_size": cfg.training.micro_batch_size,
        "padded_vocab_size": cfg.padded_vocab_size,
        "order": p.order,
        "nodes": cfg.cluster.nodes,
        "gpus_per_node": cfg.cluster.gpus_per_node,
    }

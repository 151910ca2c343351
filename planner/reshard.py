"""Reshard plan: when a checkpoint saved under one layout is loaded under another, which routed-expert
shards each new rank must read, from which old ranks, and how many bytes.

Experts are addressed by global expert id, as Megatron's checkpoints store them (Megatron-LM
dev@d48bd6be megatron/core/transformer/moe/experts.py sharded_state_dict: local expert i of EP rank
r is global expert r·E/EP + i), so EP64 local expert 0 is not EP32 local expert 0.
An ETP shard is an offset range of the expert's intermediate dimension I (FC1/FC3 columns, FC2 rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.config.schema import Config
from planner.drops import drop_difference
from planner.findings import Finding
from planner.layout.grid import ExpertOwnership, Grid
from planner.layout.spec import grid_spec_from_config

# Fields that define the logical tensors of the model; any difference means another model.
MODEL_IDENTITY_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
    "ffn_hidden_size", "vocab_size", "num_experts", "moe_router_topk", "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size", "moe_layer_freq", "moe_n_hash_layers", "mtp_num_layers",
    "untie_embeddings_and_output_weights", "add_bias_linear", "attention_variant", "q_lora_rank",
    "kv_lora_rank", "o_groups", "o_lora_rank", "enable_hyper_connections", "num_residual_streams",
)

_PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ADAM_STATE_BYTES = 12  # fp32 master weight + two fp32 moments per parameter


def _identity(cfg: Config) -> dict[str, Any]:
    """`section.field` -> value of every field that shapes a logical tensor (moe_latent_size sizes
    the routed experts and adds the latent projections)."""
    fields = {f"model.{name}": getattr(cfg.model, name) for name in MODEL_IDENTITY_FIELDS}
    return {**fields, "moe.moe_latent_size": cfg.moe.moe_latent_size}


def model_differences(old: Config, new: Config) -> list[Finding]:
    """One finding per model field that differs: a checkpoint cannot move between different models."""
    findings = []
    olds, news = _identity(old), _identity(new)
    for path, a in olds.items():
        b, name = news[path], path.split(".")[1]
        if a != b:
            findings.append(Finding(
                "RSH001", "error", path,
                f"the two configs describe different models: {name} {a} → {b}",
                f"keep {path} = {a} in the new config; resharding moves shards, it cannot "
                "change logical tensor shapes",
                "Megatron-LM dev@d48bd6be megatron/core/dist_checkpointing (sharded tensors keep "
                "their global shape)"))
    return findings


@dataclass
class RankRead:
    """What one rank of the new layout needs for its routed experts."""

    rank: int
    stage: int
    expert_ids: tuple[int, ...]
    layers: tuple[int, ...]
    shard: tuple[int, int]  # [start, stop) of the intermediate dimension
    local_bytes: int = 0
    read_bytes: int = 0
    sources: dict[int, int] = field(default_factory=dict)  # old rank -> bytes read from it

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "stage": self.stage, "expert_ids": list(self.expert_ids),
                "layers": list(self.layers), "intermediate_range": list(self.shard),
                "local_bytes": self.local_bytes, "read_bytes": self.read_bytes,
                "sources": {str(k): v for k, v in sorted(self.sources.items())}}


Shard = tuple[int, int]  # [start, stop) of the intermediate dimension I


def _layer_stages(grid: Grid) -> dict[int, int]:
    """MoE layer -> the old pipeline stage that holds it."""
    spec = grid.spec
    return {layer: stage for stage in range(spec.pp) for layer in spec.moe_layers_of_stage(stage)}


def _shard(own: ExpertOwnership, inter: int) -> Shard:
    """The rank's ETP slice of the intermediate dimension."""
    width = inter // own.etp_size
    return own.etp_rank * width, (own.etp_rank + 1) * width


def _holders(grid: Grid, inter: int) -> dict[tuple[int, int], dict[Shard, int]]:
    """(old stage, expert) -> {ETP shard of I: the lowest old rank holding it}. Every MoE layer of
    a stage is held by the same ranks, and replicas (expert-DP peers) are interchangeable, so the
    table has one entry per shard instead of one per replica: the plan stays linear in ranks."""
    out: dict[tuple[int, int], dict[Shard, int]] = {}
    for rank in range(grid.spec.world_size):  # ascending: the first holder seen is the lowest
        own = grid.expert_ownership(rank, with_replicas=False)
        shard = _shard(own, inter)
        for expert in own.expert_ids if own.experts_by_layer else ():
            out.setdefault((own.stage, expert), {}).setdefault(shard, rank)
    return out


def _bytes_per_intermediate_row(cfg: Config) -> int:
    """W1, W3 columns and a W2 row per unit of I: 3·h parameters (3·latent with latent MoE),
    weights plus Adam state."""
    per_param = _PRECISION_BYTES[cfg.training.precision] + ADAM_STATE_BYTES
    return 3 * (cfg.moe.moe_latent_size or cfg.model.hidden_size) * per_param


def reshard_plan(old: Config, new: Config) -> dict[str, Any]:
    """Per new rank: expert shards held, bytes already local, bytes to read and from whom.

    A needed range is read from the old holder whose shard overlaps it, preferring the rank itself
    (no transfer), then the lowest old rank; replicas (old expt_dp peers) are interchangeable.
    """
    old_grid, new_grid = Grid(grid_spec_from_config(old)), Grid(grid_spec_from_config(new))
    inter = new.model.moe_ffn_hidden_size
    holders, layer_stage = _holders(old_grid, inter), _layer_stages(old_grid)
    row_bytes = _bytes_per_intermediate_row(new)
    reads: list[RankRead] = []
    for rank in range(new_grid.spec.world_size):
        own = new_grid.expert_ownership(rank, with_replicas=False)
        start, stop = _shard(own, inter)
        entry = RankRead(rank, own.stage, own.expert_ids, tuple(sorted(own.experts_by_layer)),
                         (start, stop))
        kept = _kept_in_place(old_grid, rank, inter)
        layers_per_stage: dict[int, int] = {}  # the layers of one old stage read alike: count them
        for layer in own.experts_by_layer:
            stage = layer_stage.get(layer, -1)
            layers_per_stage[stage] = layers_per_stage.get(stage, 0) + 1
        for stage, layers in layers_per_stage.items():
            for expert in own.expert_ids:
                mine = kept.get((stage, expert))
                for src, lo, hi in _pieces(holders.get((stage, expert), {}), mine, start, stop, rank):
                    amount = (hi - lo) * row_bytes * layers
                    if src == rank:
                        entry.local_bytes += amount
                    else:
                        entry.read_bytes += amount
                        entry.sources[src] = entry.sources.get(src, 0) + amount
        reads.append(entry)
    total_read = sum(r.read_bytes for r in reads)
    return {
        "same_model": True,
        "old": {"world_size": old.parallel.world_size, "ep": old.parallel.ep, "etp": old.parallel.etp,
                "pp": old.parallel.pp, "edp": old.edp},
        "new": {"world_size": new.parallel.world_size, "ep": new.parallel.ep, "etp": new.parallel.etp,
                "pp": new.parallel.pp, "edp": new.edp},
        "bytes_per_parameter": _PRECISION_BYTES[new.training.precision] + ADAM_STATE_BYTES,
        "total_read_bytes": total_read,
        "total_local_bytes": sum(r.local_bytes for r in reads),
        "drops": drop_difference(old, new),
        "ranks": [r.as_dict() for r in reads],
    }


def _kept_in_place(grid: Grid, rank: int, inter: int) -> dict[tuple[int, int], Shard]:
    """(old stage, expert) -> the shard of I this rank already held in the old layout."""
    if rank >= grid.spec.world_size:
        return {}
    own = grid.expert_ownership(rank, with_replicas=False)
    shard = _shard(own, inter)
    return {(own.stage, expert): shard for expert in own.expert_ids} if own.experts_by_layer else {}


def _pieces(shards: dict[Shard, int], mine: Shard | None, start: int, stop: int,
            rank: int) -> list[tuple[int, int, int]]:
    """Cover [start, stop) of I with old shards (aligned: equal or disjoint): from the rank itself
    where it holds the shard, else from the lowest old rank holding it."""
    pieces = []
    for (lo, hi), lowest in shards.items():
        lo, hi = max(lo, start), min(hi, stop)
        if lo < hi:
            pieces.append((rank if _within(lo, hi, mine) else lowest, lo, hi))
    return pieces


def _within(lo: int, hi: int, shard: Shard | None) -> bool:
    return shard is not None and shard[0] <= lo and hi <= shard[1]

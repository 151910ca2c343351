"""Every process-group kind Megatron-Core builds, one record each, in Megatron's creation order.

A record says which grid the kind lives in, how it is built (one generator token, or a cut of one
token's groups: planner/layout/constructions.py), when Megatron builds it and what for, and which
Megatron function it follows. `Grid` dispatches `groups`, `group_size`, `num_groups` and `group_of`
on the record and builds exactly the kinds whose `absent` says nothing; `moeplan groups`, the
report and the plan read the same records.

Adding a kind: one `GroupKind` in `KINDS` at its place in Megatron's creation order (with a new
`Construction` only when no existing one cuts it), then its hand-derived groups in
tests/unit/layout/test_grid.py and its row in docs/parallelism.md (tests/unit/layout/test_group_kinds.py
checks the record is complete and documented; tests/integration/megatron/test_megatron_core_groups.py
compares it with megatron-core where megatron-core builds it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.layout.constructions import (
    Chunks,
    Construction,
    Hierarchical,
    Joined,
    Stages,
    Token,
    dp_cp_chunk_sizes,
    embedding_stages,
    first_stage,
    hcp_levels,
    instance_split,
)
from planner.layout.rank_generator import GridName
from planner.layout.spec import GridSpec

DEV = "Megatron-LM dev@d48bd6be megatron/core/parallel_state.py"
MAIN = "Megatron-LM main@d98e8a64 megatron/core/parallel_state.py"
CORE_0_16 = "megatron-core 0.16.1 megatron/core/parallel_state.py"


def always(spec: GridSpec) -> str | None:
    """Megatron builds the kind for every layout it accepts."""
    return None


@dataclass(frozen=True, eq=False)  # records compare by identity: one per kind
class GroupKind:
    """One process-group kind: where it lives, how it is built, and when and why Megatron builds it."""

    name: str
    grid: GridName  # the generator it is built from
    built_from: str  # how it is built, as `moeplan groups` and the report show it
    construction: Construction
    megatron: str  # the Megatron source path and function it follows
    why: str  # what Megatron uses it for
    absent: Callable[[GridSpec], str | None] = always  # why it is not built here, None when it is


# ----------------------------------------------------------------- when a kind is not built


def _alias_until(degree: str, twin: str) -> Callable[[GridSpec], str | None]:
    """A GTP kind is built only when its degree is > 1; until then it is its twin's ranks."""

    def absent(spec: GridSpec) -> str | None:
        if getattr(spec, degree) > 1:
            return None
        return f"{degree.upper()} = 1: Megatron-LM main aliases it to {twin} instead of building it"

    return absent


def _one_instance_alias(twin: str) -> Callable[[GridSpec], str | None]:
    """An instance kind is built only with several distributed-optimizer instances."""

    def absent(spec: GridSpec) -> str | None:
        if spec.dist_opt_instances > 1:
            return None
        return f"num_distributed_optimizer_instances = 1: Megatron aliases it to {twin} instead"

    return absent


def _one_instance(spec: GridSpec) -> str | None:
    if spec.dist_opt_instances > 1:
        return None
    return "num_distributed_optimizer_instances = 1: one instance has nothing to reduce across, not built"


def _no_hcp(spec: GridSpec) -> str | None:
    return None if spec.hcp_sizes else "hierarchical_context_parallel_sizes is not set"


def _chunks_off(mode: str, flag: str) -> Callable[[GridSpec], str | None]:
    """A chunk family is built only under its flag, and only when DP·CP leaves a chunk size."""

    def absent(spec: GridSpec) -> str | None:
        if spec.dp_cp_chunks != mode:
            return f"{flag} is off"
        width = spec.degrees.dp_cp_size
        if not dp_cp_chunk_sizes(mode, width):
            return f"DP·CP = {width} leaves no power-of-two chunk below it"
        return None

    return absent


# ----------------------------------------------------------------- the registry

KINDS: tuple[GroupKind, ...] = (
    GroupKind(
        "gtp_remat", "dense", "gtp_remat", Token("gtp_remat"),
        megatron=f"{MAIN} initialize_model_parallel",
        why=("dense weight rematerialisation (GTP): built from the gtp_remat axis whatever its size, one "
             "single-rank group per rank when GTP = 1"),
    ),
    GroupKind(
        "dp_cp", "dense", "dp-cp", Token("dp-cp"),
        megatron=f"{DEV} initialize_model_parallel",
        why=("dense gradient reduction and distributed-optimizer sharding; built first because only the "
             "first groups created may use SHARP"),
    ),
    GroupKind(
        "intra_dp_cp", "dense", "dp_cp cut in I slices", Hierarchical("dp-cp", instance_split, level=0),
        megatron=f"{DEV} initialize_model_parallel",
        why="the optimizer shards of one distributed-optimizer instance",
        absent=_one_instance_alias("dp_cp"),
    ),
    GroupKind(
        "hybrid_dp_cp", "dense", "dp_cp cut in chunks of 2, 4, …", Chunks("dp-cp", "hybrid"),
        megatron=f"{CORE_0_16} create_hybrid_dp_cp_groups",
        why="hybrid context parallelism regroups DP×CP ranks per batch",
        absent=_chunks_off("hybrid", "hybrid_context_parallel"),
    ),
    GroupKind(
        "dynamic_dp_cp", "dense", "dp_cp cut in chunks of 1, 2, 4, …", Chunks("dp-cp", "dynamic"),
        megatron=f"{DEV} create_dynamic_dp_cp_groups",
        why="dynamic context parallelism regroups DP×CP ranks per batch",
        absent=_chunks_off("dynamic", "dynamic_context_parallel"),
    ),
    GroupKind(
        "dp", "dense", "dp", Token("dp"),
        megatron=f"{DEV} initialize_model_parallel",
        why="data-parallel ranks without CP",
    ),
    GroupKind(
        "dp_gtp_remat", "dense", "gtp_remat-dp", Token("gtp_remat-dp"),
        megatron=f"{MAIN} initialize_model_parallel",
        why="a data group spanning GTP",
        absent=_alias_until("gtp", "dp"),
    ),
    GroupKind(
        "dp_cp_gtp_remat", "dense", "gtp_remat-dp-cp", Token("gtp_remat-dp-cp"),
        megatron=f"{MAIN} initialize_model_parallel",
        why="a data-and-context group spanning GTP",
        absent=_alias_until("gtp", "dp_cp"),
    ),
    GroupKind(
        "cp", "dense", "cp", Token("cp"),
        megatron=f"{DEV} initialize_model_parallel",
        why="attention's context exchange (ring or all-gather of K/V)",
    ),
    GroupKind(
        "hcp", "dense", "levels of each cp group", Hierarchical("cp", hcp_levels),
        megatron=f"{DEV} create_hierarchical_groups",
        why="hierarchical context parallelism: one group per level of each cp group",
        absent=_no_hcp,
    ),
    GroupKind(
        "mp", "dense", "tp-gtp_remat-pp", Token("tp-gtp_remat-pp"),
        megatron=f"{MAIN} initialize_model_parallel",
        why="the model-parallel group: every rank of one dense replica",
    ),
    GroupKind(
        "tp", "dense", "tp", Token("tp"),
        megatron=f"{DEV} initialize_model_parallel",
        why="dense tensor and sequence parallelism; the shared expert's TP",
    ),
    GroupKind(
        "pp", "dense", "pp", Token("pp"),
        megatron=f"{DEV} initialize_model_parallel",
        why="pipeline sends and receives",
    ),
    GroupKind(
        "embd", "dense", "embedding stages of pp", Stages("pp", embedding_stages),
        megatron=f"{DEV} initialize_model_parallel",
        why=("word-embedding gradient sync over the stages pretrain_gpt.py get_embedding_ranks names "
             "(first; last when tied and PP > 1; MTP stages)"),
    ),
    GroupKind(
        "pos_embd", "dense", "first stage of pp", Stages("pp", first_stage),
        megatron=f"{DEV} initialize_model_parallel",
        why="position-embedding gradient sync",
    ),
    GroupKind(
        "tp_dp_cp", "dense", "tp-gtp_remat-dp-cp", Token("tp-gtp_remat-dp-cp"),
        megatron=f"{MAIN} initialize_model_parallel",
        why="expert-bias token counts, global aux loss, FP8 amax",
    ),
    GroupKind(
        "tp_dp", "dense", "tp-gtp_remat-dp", Token("tp-gtp_remat-dp"),
        megatron=f"{MAIN} initialize_model_parallel",
        why="the tensor-and-data group",
    ),
    GroupKind(
        "tp_cp", "dense", "tp-cp", Token("tp-cp"),
        megatron=f"{DEV} initialize_model_parallel",
        why="aux-loss and sequence-aux-loss token counts",
    ),
    GroupKind(
        "expt_gtp_remat", "expert", "gtp_remat", Token("gtp_remat"),
        megatron=f"{MAIN} initialize_model_parallel",
        why="expert weight rematerialisation (EGTP): single-rank groups when EGTP = 1",
    ),
    GroupKind(
        "ep", "expert", "ep", Token("ep"),
        megatron=f"{DEV} initialize_model_parallel",
        why="the token dispatcher's all-to-all",
    ),
    GroupKind(
        "expt_tp", "expert", "tp (size ETP)", Token("tp"),
        megatron=f"{DEV} initialize_model_parallel",
        why="ETP all-gather / reduce-scatter of expert rows",
    ),
    GroupKind(
        "tp_ep", "expert", "tp-ep", Token("tp-ep"),
        megatron=f"{DEV} initialize_model_parallel",
        why="the whole dispatch domain (ETP fastest); token-count exchange, AllGather and Flex dispatchers",
    ),
    GroupKind(
        "tp_ep_pp", "expert", "tp-ep-pp", Token("tp-ep-pp"),
        megatron=f"{DEV} initialize_model_parallel",
        why="one full expert set across the pipeline",
    ),
    GroupKind(
        "tp_ep_pp_with_egtp_remat", "expert", "tp-ep-gtp_remat-pp", Token("tp-ep-gtp_remat-pp"),
        megatron=f"{MAIN} initialize_model_parallel",
        why="one full expert set across the pipeline and EGTP",
        absent=_alias_until("egtp", "tp_ep_pp"),
    ),
    GroupKind(
        "expt_dp", "expert", "dp (size EDP)", Token("dp"),
        megatron=f"{DEV} initialize_model_parallel",
        why="routed-expert gradient reduction and optimizer sharding",
    ),
    GroupKind(
        "intra_expt_dp", "expert", "expt_dp level 0 [EDP/I, I]", Hierarchical("dp", instance_split, level=0),
        megatron=f"{DEV} initialize_model_parallel",
        why="expert optimizer shards inside one distributed-optimizer instance",
        absent=_one_instance_alias("expt_dp"),
    ),
    GroupKind(
        "inter_dist_opt", "expert", "expt_dp level 1 [EDP/I, I]", Hierarchical("dp", instance_split, level=1),
        megatron=f"{DEV} initialize_model_parallel",
        why="the all-reduce across distributed-optimizer instances",
        absent=_one_instance,
    ),
    GroupKind(
        "expt_dp_gtp_remat", "expert", "gtp_remat-dp", Token("gtp_remat-dp"),
        megatron=f"{MAIN} initialize_model_parallel",
        why="an expert data group spanning EGTP",
        absent=_alias_until("egtp", "expt_dp"),
    ),
    GroupKind(
        "intra_dist_opt", "expert", "tp-ep-pp joined EDP/I at a time", Joined("tp-ep-pp"),
        megatron=f"{DEV} initialize_model_parallel",
        why="one distributed-optimizer instance",
    ),
)

KIND_BY_NAME: dict[str, GroupKind] = {kind.name: kind for kind in KINDS}

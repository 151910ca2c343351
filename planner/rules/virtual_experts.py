"""VEX: virtual experts (HybridEP load balancing by temporary expert replicas) and their limits."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import VIRTUAL_EXPERTS

SOURCE = VIRTUAL_EXPERTS
_ON = ("moe: {moe_virtual_experts: true, moe_token_dispatcher_type: flex, "
       "moe_flex_dispatcher_backend: hybridep}")


def _on(f: Facts) -> bool:
    return f.moe.moe_virtual_experts


@rule(
    "VEX001", "error", "virtual experts need ETP = 1",
    source=SOURCE,
    why="""A replica slot receives a hot expert's whole weights; expert tensor parallelism would
    split them over ranks the planner does not move together.""",
    bad=_ON + "\nparallel: {ep: 2, etp: 2}",
    good=_ON + "\nparallel: {ep: 4, etp: 1}",
)
def virtual_experts_etp1(f: Facts) -> Iterator[Violation]:
    if _on(f) and f.etp > 1:
        yield Violation("parallel.etp", f"moe_virtual_experts with etp {f.etp}", "set parallel.etp: 1")


@rule(
    "VEX002", "error", "virtual experts need a fixed local token count",
    source=SOURCE,
    why="""The replica planner sizes temporary slots and assignment shares from a fixed number of
    local tokens per rank; variable sequence lengths (or sequence packing) change it per batch.""",
    bad=_ON + "\ntraining: {variable_seq_lengths: true}",
    good=_ON + "\ntraining: {variable_seq_lengths: false}",
)
def virtual_experts_fixed_tokens(f: Facts) -> Iterator[Violation]:
    if _on(f) and f.variable_seq_lengths:
        yield Violation("training.variable_seq_lengths",
                        "moe_virtual_experts with variable sequence lengths",
                        "turn off variable_seq_lengths / sequence_packing_scheduler")


@rule(
    "VEX003", "error", "virtual experts need the expert bias off",
    source=SOURCE,
    why="""The expert bias and the replica planner both react to expert load; run together they
    would fight over the same imbalance.""",
    bad=_ON + "\nmodel: {moe_router_enable_expert_bias: true, moe_router_score_function: sigmoid}",
    good=_ON + "\nmodel: {moe_router_enable_expert_bias: false, moe_router_score_function: sigmoid}",
)
def virtual_experts_no_expert_bias(f: Facts) -> Iterator[Violation]:
    if _on(f) and f.model.moe_router_enable_expert_bias:
        yield Violation("model.moe_router_enable_expert_bias",
                        "moe_virtual_experts with moe_router_enable_expert_bias",
                        "set moe_router_enable_expert_bias: false or drop virtual experts")


@rule(
    "VEX004", "error", "virtual experts exclude FP4",
    source=SOURCE,
    why="Replicating FP4 expert weights (with their scales) is not supported.",
    bad=_ON + "\ntraining: {fp4: true}",
    good=_ON + "\ntraining: {fp4: false}",
)
def virtual_experts_no_fp4(f: Facts) -> Iterator[Violation]:
    if _on(f) and f.train.fp4:
        yield Violation("training.fp4", "moe_virtual_experts with fp4", "set training.fp4: false")


@rule(
    "VEX005", "error", "virtual experts exclude FSDP",
    source=SOURCE,
    why="""Replica weights are copied from the owner's full expert parameters; FSDP keeps them
    sharded over the data-parallel ranks.""",
    bad=_ON + "\ntraining: {use_megatron_fsdp: true}",
    good=_ON + "\ntraining: {use_megatron_fsdp: false}",
)
def virtual_experts_no_fsdp(f: Facts) -> Iterator[Violation]:
    if _on(f) and f.fsdp:
        yield Violation(f"training.{f.fsdp}", f"moe_virtual_experts with {f.fsdp}",
                        f"set training.{f.fsdp}: false")


# --- the dispatcher, backend and overlap the replica planner runs under.


@rule(
    "VEX006", "error", "virtual experts need the flex dispatcher",
    source=SOURCE,
    why="""The replica planner is built into the flex dispatcher's HybridEP path: it rewrites the
    routing map into physical slots before the fused dispatch. The alltoall and allgather
    dispatchers route by the fixed owner of each expert and cannot send an assignment to a
    replica.""",
    bad="moe: {moe_virtual_experts: true, moe_token_dispatcher_type: alltoall}",
    good=_ON,
)
def virtual_experts_need_flex(f: Facts) -> Iterator[Violation]:
    kind = f.moe.moe_token_dispatcher_type
    if _on(f) and kind != "flex":
        yield Violation("moe.moe_token_dispatcher_type", f"moe_virtual_experts with the {kind} dispatcher",
                        "set moe_token_dispatcher_type: flex with moe_flex_dispatcher_backend: hybridep")


@rule(
    "VEX007", "error", "virtual experts need the hybridep backend",
    source=SOURCE,
    why="""Virtual-expert load balancing is added to HybridEP only; DeepEP, DeepEP v2 and NCCL EP
    dispatch to the static expert owners.""",
    bad="moe: {moe_virtual_experts: true, moe_token_dispatcher_type: flex, "
        "moe_flex_dispatcher_backend: deepep}",
    good=_ON,
)
def virtual_experts_need_hybridep(f: Facts) -> Iterator[Violation]:
    backend = f.flex_backend
    if _on(f) and backend is not None and backend != "hybridep":
        yield Violation("moe.moe_flex_dispatcher_backend", f"moe_virtual_experts with the {backend} "
                        "backend", "set moe_flex_dispatcher_backend: hybridep")


@rule(
    "VEX008", "warning", "virtual experts with batch-level EP overlap",
    source=SOURCE,
    why="""The replica weights move asynchronously between the planner's decision and the expert
    GEMMs, on the streams batch-level EP overlap (overlap_moe_expert_parallel_comm) schedules
    dispatch and combine on; the pull request lists BF16/MXFP8, expert GTP, repeated MTP and
    activation offloading as supported and not this overlap, and the DeepSeek-V4 Megatron write-up
    says some overlaps are restricted.""",
    bad=_ON + "\nparallel: {pp: 1}\noverlap: {overlap_moe_expert_parallel_comm: true}",
    good=_ON + "\nparallel: {pp: 1}",
)
def virtual_experts_with_ep_overlap(f: Facts) -> Iterator[Violation]:
    if _on(f) and f.ovl.overlap_moe_expert_parallel_comm:
        yield Violation("overlap.overlap_moe_expert_parallel_comm",
                        "moe_virtual_experts with overlap_moe_expert_parallel_comm (not among the "
                        "supported combinations)", "turn off overlap_moe_expert_parallel_comm")


RULES = (
    virtual_experts_etp1, virtual_experts_fixed_tokens, virtual_experts_no_expert_bias,
    virtual_experts_no_fp4, virtual_experts_no_fsdp, virtual_experts_need_flex,
    virtual_experts_need_hybridep, virtual_experts_with_ep_overlap,
)

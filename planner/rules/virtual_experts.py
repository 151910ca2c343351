"""VEX: virtual experts (HybridEP load balancing by temporary expert replicas) and their limits."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import VIRTUAL_EXPERTS

SOURCE = VIRTUAL_EXPERTS
_ON = "moe: {moe_virtual_experts: true}"


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


RULES = (
    virtual_experts_etp1, virtual_experts_fixed_tokens, virtual_experts_no_expert_bias,
    virtual_experts_no_fp4, virtual_experts_no_fsdp,
)

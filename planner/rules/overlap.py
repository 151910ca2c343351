"""OVL: communication/computation overlap switches and what each one requires."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import TRANSFORMER_CONFIG, VALIDATE_ARGS, dev

EP_OVERLAP = "overlap.overlap_moe_expert_parallel_comm"
_OVERLAP_ON = "overlap: {overlap_moe_expert_parallel_comm: true}"
_PP1 = "parallel: {pp: 1}"


def _ep_overlap(f: Facts) -> bool:
    return f.ovl.overlap_moe_expert_parallel_comm


@rule(
    "OVL001", "error", "shared-expert overlap and batch-level EP overlap are exclusive",
    source=TRANSFORMER_CONFIG,
    why="""Both schedule the shared expert's computation against the EP all-to-all: the
    shared-expert overlap within one microbatch, the batch-level overlap across two. Megatron
    allows only one of them.""",
    bad="""
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, moe_shared_expert_overlap: true}
    """,
    good="""
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, moe_shared_expert_overlap: false}
    """,
)
def shared_overlap_exclusive(f: Facts) -> Iterator[Violation]:
    if _ep_overlap(f) and f.ovl.moe_shared_expert_overlap:
        yield Violation("overlap.moe_shared_expert_overlap",
                        "moe_shared_expert_overlap and overlap_moe_expert_parallel_comm are both on",
                        "turn one of them off")


@rule(
    "OVL002", "error", "batch-level EP overlap needs EP > 1",
    source=TRANSFORMER_CONFIG,
    why="""overlap_moe_expert_parallel_comm hides the EP all-to-all behind another microbatch's
    compute; with EP = 1 there is no all-to-all to hide.""",
    bad=_OVERLAP_ON + "\nparallel: {pp: 1, ep: 1}",
    good=_OVERLAP_ON + "\nparallel: {pp: 1, ep: 4}",
)
def ep_overlap_needs_ep(f: Facts) -> Iterator[Violation]:
    if _ep_overlap(f) and f.par.ep == 1:
        yield Violation(EP_OVERLAP, "overlap_moe_expert_parallel_comm is on but ep is 1",
                        "raise parallel.ep or turn the overlap off")


@rule(
    "OVL003", "error", "batch-level EP overlap with PP > 1 needs VPP",
    source=TRANSFORMER_CONFIG,
    why="""With pipelining, the overlap pairs the forward of one model chunk with the backward of
    another on the same rank, which only the interleaved (VPP) schedule provides.""",
    bad=_OVERLAP_ON,
    good=_OVERLAP_ON + "\nparallel: {vpp: 2}",
)
def ep_overlap_needs_vpp(f: Facts) -> Iterator[Violation]:
    if _ep_overlap(f) and f.par.pp > 1 and f.vpp <= 1:
        yield Violation(EP_OVERLAP, f"overlap_moe_expert_parallel_comm with pp {f.par.pp} and no "
                        "virtual pipeline stages", "set parallel.vpp >= 2 or a layout with "
                        "several stages per rank")


@rule(
    "OVL004", "error", "batch-level EP overlap needs the alltoall or flex dispatcher",
    source=TRANSFORMER_CONFIG,
    why="""The overlap splits dispatch and combine into separately scheduled all-to-alls; the
    allgather dispatcher has no such phases.""",
    bad=_OVERLAP_ON + "\n" + _PP1 + "\nmoe: {moe_token_dispatcher_type: allgather}",
    good=_OVERLAP_ON + "\n" + _PP1 + "\nmoe: {moe_token_dispatcher_type: alltoall}",
)
def ep_overlap_needs_a2a(f: Facts) -> Iterator[Violation]:
    kind = f.moe.moe_token_dispatcher_type
    if _ep_overlap(f) and kind not in ("alltoall", "flex"):
        yield Violation("moe.moe_token_dispatcher_type",
                        f"overlap_moe_expert_parallel_comm with the {kind} dispatcher",
                        "use moe_token_dispatcher_type alltoall or flex")


@rule(
    "OVL005", "error", "delay_wgrad_compute needs batch-level EP overlap",
    source=TRANSFORMER_CONFIG,
    why="""Delaying the weight-gradient GEMMs (dW = Xᵀ·Ȳ) only pays off when the overlap schedule
    fills the gap they leave; Megatron requires overlap_moe_expert_parallel_comm.""",
    bad="overlap: {delay_wgrad_compute: true}",
    good="""
    parallel: {pp: 1}
    overlap: {delay_wgrad_compute: true, overlap_moe_expert_parallel_comm: true}
    """,
)
def delay_wgrad_needs_overlap(f: Facts) -> Iterator[Violation]:
    if f.ovl.delay_wgrad_compute and not _ep_overlap(f):
        yield Violation("overlap.delay_wgrad_compute",
                        "delay_wgrad_compute is on but overlap_moe_expert_parallel_comm is off",
                        "turn on overlap.overlap_moe_expert_parallel_comm or drop delay_wgrad_compute")


@rule(
    "OVL006", "error", "shared-expert overlap needs the alltoall or flex dispatcher",
    source=TRANSFORMER_CONFIG,
    why="""The shared expert is overlapped with the dispatcher's all-to-all (token A2A → shared
    FC1 → probability A2A); the allgather dispatcher offers no such slots.""",
    bad="""
    moe: {moe_token_dispatcher_type: allgather}
    overlap: {moe_shared_expert_overlap: true}
    """,
    good="""
    moe: {moe_token_dispatcher_type: alltoall}
    overlap: {moe_shared_expert_overlap: true}
    """,
)
def shared_overlap_needs_a2a(f: Facts) -> Iterator[Violation]:
    kind = f.moe.moe_token_dispatcher_type
    if f.ovl.moe_shared_expert_overlap and kind not in ("alltoall", "flex"):
        yield Violation("moe.moe_token_dispatcher_type",
                        f"moe_shared_expert_overlap with the {kind} dispatcher",
                        "use moe_token_dispatcher_type alltoall or flex")


@rule(
    "OVL007", "error", "batch-level EP overlap needs bf16 or fp16",
    source=TRANSFORMER_CONFIG,
    why="The overlap schedule is implemented for half-precision training only.",
    bad=_OVERLAP_ON + "\n" + _PP1 + "\ntraining: {precision: fp32}",
    good=_OVERLAP_ON + "\n" + _PP1 + "\ntraining: {precision: bf16}",
)
def ep_overlap_needs_half_precision(f: Facts) -> Iterator[Violation]:
    if _ep_overlap(f) and f.train.precision not in ("bf16", "fp16"):
        yield Violation("training.precision",
                        f"overlap_moe_expert_parallel_comm with precision {f.train.precision}",
                        "use precision bf16 or fp16, or turn the overlap off")


@rule(
    "OVL008", "error", "batch-level EP overlap excludes recomputing 'moe'",
    source=TRANSFORMER_CONFIG,
    why="""Recomputing the whole MoE module re-runs routing and both all-to-alls inside backward,
    which breaks the overlap's pairing of communication with the other microbatch.""",
    bad="""
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, recompute_granularity: selective,
              recompute_modules: [moe]}
    """,
    good="""
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, recompute_granularity: selective,
              recompute_modules: [moe_act]}
    """,
)
def ep_overlap_without_moe_recompute(f: Facts) -> Iterator[Violation]:
    if _ep_overlap(f) and "moe" in (f.ovl.recompute_modules or []):
        yield Violation("overlap.recompute_modules",
                        "overlap_moe_expert_parallel_comm with 'moe' in recompute_modules",
                        "recompute finer modules such as moe_act, or turn the overlap off")


@rule(
    "OVL009", "error", "full recompute needs recompute_method and recompute_num_layers",
    source=TRANSFORMER_CONFIG,
    why="""Full recompute re-runs whole groups of blocks: recompute_method says how the blocks are
    grouped (uniform: every recompute_num_layers blocks; block: the first recompute_num_layers
    of each stage), and Megatron refuses full granularity without both.""",
    bad="overlap: {recompute_granularity: full}",
    good="overlap: {recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1}",
)
def full_recompute_needs_method(f: Facts) -> Iterator[Violation]:
    if f.ovl.recompute_granularity != "full":
        return
    if f.ovl.recompute_method is None:
        yield Violation("overlap.recompute_method", "recompute_granularity full without recompute_method",
                        "set overlap.recompute_method: uniform (or block)")
    if f.ovl.recompute_num_layers is None:
        yield Violation("overlap.recompute_num_layers",
                        "recompute_granularity full without recompute_num_layers",
                        "set overlap.recompute_num_layers, e.g. 1 (every block recomputed on its own)")


@rule(
    "OVL010", "error", "selective recompute takes no recompute_method or recompute_num_layers",
    source=VALIDATE_ARGS + "; " + TRANSFORMER_CONFIG,
    why="""Selective recompute re-runs the chosen modules (recompute_modules) inside every block;
    there are no block groups to pick, and Megatron refuses a recompute_method or
    recompute_num_layers with it instead of ignoring them.""",
    bad="overlap: {recompute_granularity: selective, recompute_method: uniform}",
    good="overlap: {recompute_granularity: selective, recompute_modules: [core_attn]}",
)
def selective_recompute_without_method(f: Facts) -> Iterator[Violation]:
    if f.ovl.recompute_granularity != "selective":
        return
    for name in ("recompute_method", "recompute_num_layers"):
        value = getattr(f.ovl, name)
        if value is not None:
            yield Violation(f"overlap.{name}", f"recompute_granularity selective with {name} {value}",
                            f"remove overlap.{name}, or use recompute_granularity: full")


@rule(
    "OVL011", "error", "batch-level EP overlap supports at most one MTP layer",
    source=TRANSFORMER_CONFIG,
    why="""The overlap schedule pairs one MTP block with the other microbatch's work; Megatron
    refuses overlap_moe_expert_parallel_comm with more than one MTP layer.""",
    bad="""
    model: {mtp_num_layers: 2}
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true}
    """,
    good="""
    model: {mtp_num_layers: 1}
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true}
    """,
)
def ep_overlap_single_mtp_layer(f: Facts) -> Iterator[Violation]:
    if _ep_overlap(f) and f.model.mtp_num_layers > 1:
        yield Violation("model.mtp_num_layers",
                        f"overlap_moe_expert_parallel_comm with mtp_num_layers {f.model.mtp_num_layers}",
                        "use mtp_num_layers: 1 or turn the overlap off")


@rule(
    "OVL012", "error", "MTP with uniform full recompute needs recompute_num_layers 1",
    source=dev("core/transformer/multi_token_prediction.py",
               "MultiTokenPredictionLayer._checkpointed_forward"),
    why="""Under full recompute every MTP block is checkpointed on its own; with the uniform method
    Megatron asserts recompute_num_layers == 1 in the MTP layer's first training forward (and at
    start-up when the batch-level EP overlap is on).""",
    bad="""
    model: {mtp_num_layers: 1}
    overlap: {recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 2}
    """,
    good="""
    model: {mtp_num_layers: 1}
    overlap: {recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1}
    """,
)
def mtp_uniform_recompute_one_layer(f: Facts) -> Iterator[Violation]:
    o = f.ovl
    if (f.model.mtp_num_layers and o.recompute_granularity == "full"
            and o.recompute_method == "uniform" and (o.recompute_num_layers or 1) != 1):
        yield Violation("overlap.recompute_num_layers",
                        f"mtp_num_layers {f.model.mtp_num_layers} with uniform full recompute of "
                        f"recompute_num_layers {o.recompute_num_layers}",
                        "set overlap.recompute_num_layers: 1, or recompute_method: block")


@rule(
    "OVL013", "error", "batch-level EP overlap with full recompute needs dropout 0",
    source=TRANSFORMER_CONFIG,
    why="""Under overlap_moe_expert_parallel_comm the full-recompute replay is scheduled by hand
    across the interleaved microbatches, so the forward RNG stream cannot be replayed: Megatron
    asserts attention_dropout == 0 and hidden_dropout == 0 (its defaults are 0.1).""",
    bad="""
    model: {hidden_dropout: 0.1, attention_dropout: 0.1}
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, recompute_granularity: full,
              recompute_method: uniform, recompute_num_layers: 1}
    """,
    good="""
    model: {hidden_dropout: 0.0, attention_dropout: 0.0}
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, recompute_granularity: full,
              recompute_method: uniform, recompute_num_layers: 1}
    """,
)
def ep_overlap_full_recompute_without_dropout(f: Facts) -> Iterator[Violation]:
    if not (_ep_overlap(f) and f.ovl.recompute_granularity == "full"):
        return
    for name in ("hidden_dropout", "attention_dropout"):
        value = getattr(f.model, name)
        if value:
            yield Violation(f"model.{name}",
                            f"{name} {value} with overlap_moe_expert_parallel_comm and full recompute",
                            f"set model.{name}: 0.0, or drop full recompute")


@rule(
    "OVL014", "error", "batch-level EP overlap without full recompute takes no recompute method",
    source=TRANSFORMER_CONFIG,
    why="""Outside full recompute the overlap schedule has no layer grouping to control, and
    Megatron asserts recompute_method and recompute_num_layers are unset when
    overlap_moe_expert_parallel_comm is on.""",
    bad="""
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, recompute_num_layers: 1}
    """,
    good="""
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true}
    """,
)
def ep_overlap_without_recompute_method(f: Facts) -> Iterator[Violation]:
    if not _ep_overlap(f) or f.ovl.recompute_granularity == "full":
        return
    for name in ("recompute_method", "recompute_num_layers"):
        value = getattr(f.ovl, name)
        if value is not None:
            yield Violation(f"overlap.{name}",
                            f"{name} {value} with overlap_moe_expert_parallel_comm and "
                            + (f"recompute_granularity {f.ovl.recompute_granularity}"
                               if f.ovl.recompute_granularity else "no full recompute"),
                            f"remove overlap.{name}, or use recompute_granularity: full")


RULES = (
    shared_overlap_exclusive, ep_overlap_needs_ep, ep_overlap_needs_vpp, ep_overlap_needs_a2a,
    delay_wgrad_needs_overlap, shared_overlap_needs_a2a, ep_overlap_needs_half_precision,
    ep_overlap_without_moe_recompute, full_recompute_needs_method, selective_recompute_without_method,
    ep_overlap_single_mtp_layer, mtp_uniform_recompute_one_layer,
    ep_overlap_full_recompute_without_dropout, ep_overlap_without_recompute_method,
)

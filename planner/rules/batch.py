"""BAT: sequence length vs CP, the global batch vs data parallelism, microbatches vs the schedule."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.hints import multiple_hint
from planner.rules.sources import VALIDATE_ARGS, dev


@rule(
    "BAT001", "error", "seq_length divisible by 2·CP",
    source=VALIDATE_ARGS,
    why="""Context parallelism with load balancing cuts every sequence into 2·CP chunks and gives
    each CP rank two of them (one early, one late), so the sequence length must split into 2·CP
    equal parts.""",
    bad="""
    parallel: {cp: 2}
    training: {seq_length: 250}
    """,
    good="""
    parallel: {cp: 2}
    training: {seq_length: 256}
    """,
)
def seq_length_divisible_by_cp(f: Facts) -> Iterator[Violation]:
    cp, seq = f.par.cp, f.train.seq_length
    if cp > 1 and seq % (2 * cp):
        yield Violation(
            "training.seq_length",
            f"seq_length {seq} is not divisible by 2·cp = {2 * cp}",
            f"use a seq_length that is a multiple of {2 * cp}, e.g. {multiple_hint(2 * cp, seq)}",
        )


@rule(
    "BAT002", "error", "global batch divisible by micro batch · DP · GTP",
    source=dev("core/num_microbatches_calculator.py", "ConstantNumMicroBatchesCalculator"),
    why="""One step feeds m = B / (b · D_a · GTP / q_s) microbatches to every pipeline replica. CP, EP
    and ETP ranks add no independent samples, so only the attention data-parallel size (and the
    GTP axis) divides the batch.""",
    bad="training: {global_batch_size: 10}",
    good="training: {global_batch_size: 12}",
)
def global_batch_divisible(f: Facts) -> Iterator[Violation]:
    unit, batch = f.batch_unit, f.cfg.global_batch_size
    if batch % unit:
        t, shards = f.train, f.sequence_shards
        by_shards = "/q_s" if shards > 1 else ""
        yield Violation(
            "training.global_batch_size",
            f"global_batch_size {batch} is not divisible by micro_batch_size·DP·GTP{by_shards} = "
            f"{t.micro_batch_size}·{f.dp}·{f.par.gtp}{f'/{shards}' if shards > 1 else ''} = {unit}",
            f"use a global batch that is a multiple of {unit}, e.g. {multiple_hint(unit, batch)}",
        )


@rule(
    "BAT003", "error", "microbatch count fits the interleaved schedule",
    source=dev("core/pipeline_parallel/schedules.py", "forward_backward_pipelining_with_interleaving"),
    why="""The interleaved (VPP) schedule runs microbatches in groups of
    microbatch_group_size_per_vp_stage (default PP). The group must lie in [PP, m], and a
    remainder m % group below PP would create dependency bubbles; with the default group this
    means m >= PP and m % PP == 0.""",
    bad="""
    parallel: {vpp: 2}
    training: {global_batch_size: 4}
    """,
    good="""
    parallel: {vpp: 2}
    training: {global_batch_size: 16}
    """,
)
def microbatches_fit_interleaving(f: Facts) -> Iterator[Violation]:
    if f.vpp <= 1:
        return
    pp, m = f.par.pp, f.microbatches
    group = f.par.microbatch_group_size_per_vp_stage or pp
    unit = f.batch_unit
    if not pp <= group <= m:
        if group < pp:
            path = "parallel.microbatch_group_size_per_vp_stage"
            fix = f"set microbatch_group_size_per_vp_stage to at least pp {pp}"
        else:
            path = "training.global_batch_size"
            fix = (f"raise global_batch_size to at least {group * unit} ({group} microbatches) "
                   "or lower microbatch_group_size_per_vp_stage")
        yield Violation(
            path,
            f"interleaved schedule (vpp {f.vpp}) needs pp {pp} <= microbatch group {group} <= "
            f"microbatches {m}",
            fix,
        )
    elif m % group and m % group < pp:
        yield Violation(
            "training.global_batch_size",
            f"{m} microbatches leave a remainder {m % group} < pp {pp} over groups of {group} "
            "(dependency bubbles in the interleaved schedule)",
            f"use a multiple of {group} microbatches, e.g. global_batch_size "
            f"{multiple_hint(group * unit, f.cfg.global_batch_size)}",
        )


@rule(
    "BAT004", "warning", "at least one microbatch per pipeline stage",
    source=dev("core/pipeline_parallel/schedules.py", "forward_backward_pipelining_without_interleaving"),
    why="""The 1F1B schedule warms up with min(PP − stage − 1, m) forward passes before its steady
    state. With fewer microbatches than stages it never gets there: Megatron still runs, but every
    stage idles for most of the step (bubble (PP−1)/(m+PP−1) ≥ 1/2), and the PyTorch 1F1B
    schedule (torch.distributed.pipelining, the bundled runtime) refuses such a step.""",
    bad="""
    parallel: {pp: 2}
    training: {global_batch_size: 4}
    """,
    good="""
    parallel: {pp: 2}
    training: {global_batch_size: 8}
    """,
)
def microbatches_fill_pipeline(f: Facts) -> Iterator[Violation]:
    pp, m = f.par.pp, f.microbatches
    if pp > 1 and f.vpp <= 1 and m < pp:
        unit = f.batch_unit
        yield Violation(
            "training.global_batch_size",
            f"{m} microbatch(es) for pp {pp} stages: the 1F1B pipeline never fills",
            f"raise global_batch_size to at least {pp * unit} ({pp} microbatches)",
        )


RULES = (seq_length_divisible_by_cp, global_batch_divisible, microbatches_fit_interleaving,
         microbatches_fill_pipeline)

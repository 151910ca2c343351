"""The order in which one pipeline stage runs its forward and backward passes, and the peak of the
activations it holds: Megatron's 1F1B and interleaved 1F1B schedules, replayed exactly.

A forward pass of model chunk c stores that chunk's activations for one microbatch; its backward
pass frees them. With unequal chunks (an embedding or loss-only chunk) "in-flight microbatches ×
the stage's average chunk" misses the peak, so the budget replays the order and sums the live
chunks instead. Facts follow Megatron-LM dev@d48bd6be megatron/core/pipeline_parallel/schedules.py:
`get_pp_rank_microbatches` (warm-up count), `get_schedule_table` (microbatch groups per virtual
stage) and `forward_backward_pipelining_with_interleaving` / `..._without_interleaving` (one
forward then one backward in the steady state, backward chunks in reverse order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

Number = int | Fraction


@dataclass(frozen=True)
class Pass:
    """One forward or backward pass of (model chunk, microbatch) on the stage."""

    forward: bool
    chunk: int  # virtual chunk index on this stage, 0..VPP-1
    microbatch: int


@dataclass(frozen=True)
class Peak:
    """The most activation bytes the stage holds, and when: after forward pass `forward_pass`
    (1-based count of forwards so far), with `live[c]` microbatches of chunk c stored."""

    bytes: Number
    forward_pass: int
    live: tuple[int, ...]

    @property
    def live_passes(self) -> int:
        return sum(self.live)


def warmup_passes(pp: int, vpp: int, stage: int, microbatches: int, group_size: int | None = None,
                  extra_warmup: int = 0) -> int:
    """Forward passes before the first backward: PP − s − 1 for 1F1B; for interleaved 1F1B
    2·(PP − s − 1) + (VPP − 1)·G (+1 with EP-overlap's extra forward), at most every pass."""
    total = microbatches * vpp
    if pp == 1:
        return 0
    if vpp == 1:
        warmup = pp - stage - 1
    else:
        warmup = 2 * (pp - stage - 1) + (vpp - 1) * (group_size or pp) + extra_warmup
    return min(warmup, total)


def schedule_table(microbatches: int, vpp: int, group_size: int) -> list[tuple[int, int]]:
    """(microbatch, chunk) of each forward in order: groups of G microbatches run through chunk 0,
    then chunk 1, ...; the last group takes whatever microbatches remain."""
    table: list[tuple[int, int]] = []
    for first in range(0, microbatches, group_size):
        last = min(first + group_size, microbatches)
        table.extend((m, c) for c in range(vpp) for m in range(first, last))
    return table


def pipeline_order(pp: int, vpp: int, stage: int, microbatches: int,
                   group_size: int | None = None, extra_warmup: int = 0) -> list[Pass]:
    """Every pass of stage `stage` in execution order: warm-up forwards, then one forward and one
    backward at a time, then the cool-down backwards."""
    if microbatches < 1 or vpp < 1 or not 0 <= stage < pp:
        raise ValueError(f"no schedule for pp={pp} vpp={vpp} stage={stage} m={microbatches}")
    if pp == 1:  # no pipelining (Megatron has no interleaving without PP): one microbatch at a time
        return [Pass(forward, c, m) for m in range(microbatches)
                for forward, chunks in ((True, range(vpp)), (False, range(vpp - 1, -1, -1)))
                for c in chunks]
    table = schedule_table(microbatches, vpp, group_size or pp)
    forwards = [Pass(True, c, m) for m, c in table]
    backwards = [Pass(False, vpp - 1 - c, m) for m, c in table]
    warmup = warmup_passes(pp, vpp, stage, microbatches, group_size, extra_warmup)
    order = forwards[:warmup]
    for k in range(warmup, len(forwards)):
        order += [forwards[k], backwards[k - warmup]]
    return order + backwards[len(forwards) - warmup:]


def activation_peak(order: Sequence[Pass], chunk_bytes: Sequence[Number]) -> Peak:
    """Replay `order`, adding a chunk's bytes at its forward and freeing them at its backward; the
    first moment the sum is largest (among equal sums, the one holding the most passes)."""
    live = [0] * len(chunk_bytes)
    held: Number = 0
    best = Peak(0, 0, tuple(live))
    forwards = 0
    for step in order:
        if step.forward:
            forwards += 1
            live[step.chunk] += 1
            held += chunk_bytes[step.chunk]
            if forwards == 1 or (held, sum(live)) > (best.bytes, best.live_passes):
                best = Peak(held, forwards, tuple(live))
        else:
            live[step.chunk] -= 1
            held -= chunk_bytes[step.chunk]
    return best


def stage_peak(pp: int, vpp: int, stage: int, microbatches: int, chunk_bytes: Sequence[Number],
               group_size: int | None = None, extra_warmup: int = 0) -> Peak:
    """`_stage_peak`, remembered (search replays the same stages for many knob settings). Float
    bytes (search's ranking) and exact ones are remembered apart: 2.0 == 2 would share a key."""
    floats = any(type(b) is float for b in chunk_bytes)
    return _stage_peak(pp, vpp, stage, microbatches, tuple(chunk_bytes), group_size, extra_warmup,
                       floats)


@lru_cache(maxsize=16384)
def _stage_peak(pp: int, vpp: int, stage: int, microbatches: int, chunk_bytes: tuple[Number, ...],
                group_size: int | None, extra_warmup: int, floats: bool) -> Peak:
    """`activation_peak` of the stage's order (chunk bytes ≥ 0), in time independent of the
    microbatch count and the group size.

    Away from the warm-up and the last microbatch group the schedule repeats every G·VPP passes
    (each window gains G microbatches of every chunk on both ends), so whole groups in the middle
    change no live count; they are left out and the peak's pass number restored. What remains is
    replayed run by run: while the forward and the backward chunk stay the same, each
    forward/backward pair changes the held bytes by the same amount, so a run peaks at an end.
    """
    if microbatches < 1 or vpp < 1 or not 0 <= stage < pp:
        raise ValueError(f"no schedule for pp={pp} vpp={vpp} stage={stage} m={microbatches}")
    if pp == 1:  # one microbatch through every chunk, then its backward
        return Peak(sum(chunk_bytes), vpp, (1,) * vpp)
    group = group_size or pp
    period = group * vpp
    warmup = warmup_passes(pp, vpp, stage, microbatches, group_size, extra_warmup)
    full_groups = -(-microbatches // group) - 1  # groups before the last one
    dropped = max((full_groups * period - warmup - period) // period - 1, 0)
    kept = microbatches - dropped * group
    peak = _peak_by_runs(_table_runs(kept, vpp, group), list(chunk_bytes), warmup)
    if peak.forward_pass > (full_groups - dropped) * period:
        peak = Peak(peak.bytes, peak.forward_pass + dropped * period, peak.live)
    return peak


def _table_runs(microbatches: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """`schedule_table` as (chunk, consecutive forwards) runs."""
    return [(c, min(group, microbatches - first)) for first in range(0, microbatches, group)
            for c in range(vpp)]


class _Cursor:
    """Walks the forward order run by run (backward chunks are the mirror, VPP − 1 − c)."""

    def __init__(self, runs: list[tuple[int, int]]) -> None:
        self.runs, self.index, self.used = runs, 0, 0

    def chunk(self) -> int:
        return self.runs[self.index][0]

    def left(self) -> int:
        return self.runs[self.index][1] - self.used

    def advance(self, n: int) -> None:
        self.used += n
        while self.index < len(self.runs) and self.used >= self.runs[self.index][1]:
            self.used -= self.runs[self.index][1]
            self.index += 1


def _peak_by_runs(runs: list[tuple[int, int]], sizes: list[Number], warmup: int) -> Peak:
    vpp, total = len(sizes), sum(n for _, n in runs)
    live, held = [0] * vpp, 0
    forward = _Cursor(runs)
    while sum(live) < warmup:  # warm-up: forwards only, the held bytes only grow
        n = min(forward.left(), warmup - sum(live))
        live[forward.chunk()] += n
        held += n * sizes[forward.chunk()]
        forward.advance(n)
    best = Peak(held, warmup, tuple(live)) if warmup else Peak(-1, 0, tuple(live))
    backward, done = _Cursor(runs), warmup
    while done < total:  # steady state: forward `done`, then backward `done - warmup`
        f, b = forward.chunk(), vpp - 1 - backward.chunk()
        n = min(forward.left(), backward.left())
        step = sizes[f] - sizes[b]
        j = n - 1 if step > 0 else 0  # the run's highest point (the first one on a tie)
        candidate = [*live]
        candidate[f] += j + 1
        candidate[b] -= j
        value = held + sizes[f] + j * step
        if (value, sum(candidate)) > (best.bytes, best.live_passes):
            best = Peak(value, done + j + 1, tuple(candidate))
        held += n * step
        live[f] += n
        live[b] -= n
        forward.advance(n)
        backward.advance(n)
        done += n
    return best

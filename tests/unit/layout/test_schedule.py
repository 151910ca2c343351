"""The pipeline schedule replay (planner/layout/schedule.py): hand-simulated tables, Megatron's own
schedule functions as judge, and properties of the activation peak."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.layout.schedule import Pass, Peak, activation_peak, pipeline_order, stage_peak, warmup_passes
from tests.support.megatron_source import megatron_functions


def text(order: list[Pass]) -> str:
    return " ".join(f"{'F' if p.forward else 'B'}{p.chunk}.{p.microbatch}" for p in order)


def running(order: list[Pass], chunk_bytes: tuple[int, ...]) -> list[int]:
    held, out = 0, []
    for p in order:
        held += chunk_bytes[p.chunk] if p.forward else -chunk_bytes[p.chunk]
        out.append(held)
    return out


# ----------------------------------------------------------------- hand-simulated schedules

def test_pp2_vpp2_m4_by_hand():
    # Stage 0: warm-up 2·(2−0−1) + (2−1)·2 = 4 forwards; groups of G = PP = 2 microbatches run
    # chunk 0 then chunk 1; backward k runs chunk VPP−1−(chunk of forward k).
    stage0 = pipeline_order(2, 2, 0, 4)
    assert text(stage0) == ("F0.0 F0.1 F1.0 F1.1 F0.2 B1.0 F0.3 B1.1 F1.2 B0.0 F1.3 B0.1 "
                            "B1.2 B1.3 B0.2 B0.3")
    # Chunk 0 stores 3 B per microbatch, chunk 1 stores 5 B.
    assert running(stage0, (3, 5)) == [3, 6, 11, 16, 19, 14, 17, 12, 17, 14, 19, 16, 11, 6, 3, 0]
    peak = activation_peak(stage0, (3, 5))
    assert (peak.bytes, peak.forward_pass, peak.live) == (19, 5, (3, 2))  # first of two 19s
    # Stage 1: warm-up 0 + 2 = 2.
    stage1 = pipeline_order(2, 2, 1, 4)
    assert text(stage1) == ("F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 "
                            "F1.3 B1.3 B0.2 B0.3")
    assert running(stage1, (3, 5)) == [3, 6, 11, 6, 11, 6, 9, 6, 9, 6, 11, 6, 11, 6, 3, 0]
    peak = activation_peak(stage1, (3, 5))
    assert (peak.bytes, peak.forward_pass, peak.live) == (11, 3, (2, 1))


def test_pp4_vpp2_m8_peak_comes_after_the_warmup_when_chunk_0_is_heavier():
    # Stage 0: warm-up 2·3 + 1·4 = 10 forwards: microbatches 0-3 through chunk 0, 0-3 through
    # chunk 1, 4-5 through chunk 0. The steady state then adds chunk-0 work while freeing chunk 1.
    order = pipeline_order(4, 2, 0, 8)
    assert warmup_passes(4, 2, 0, 8) == 10
    assert text(order) == (
        "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 F0.4 F0.5 "
        "F0.6 B1.0 F0.7 B1.1 F1.4 B1.2 F1.5 B1.3 F1.6 B0.0 F1.7 B0.1 "
        "B0.2 B0.3 B1.4 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7")
    sizes = (7, 2)  # e.g. chunk 0 holds the embedding, chunk 1 is small
    assert running(order, sizes)[:14] == [7, 14, 21, 28, 30, 32, 34, 36, 43, 50,
                                          57, 55, 62, 60]
    peak = activation_peak(order, sizes)
    # Forward 12 (F0.7) holds 8 chunk-0 and 3 chunk-1 microbatches: 8·7 + 3·2 = 62 B. The old
    # estimate, (warm-up + 1)/VPP microbatches × the stage's chunks, gave 11/2 · 9 = 49.5 B.
    assert (peak.bytes, peak.forward_pass, peak.live) == (62, 12, (8, 3))
    # Mirror sizes: the peak is at the end of the warm-up plus one, 7·2 + 4·7 = 42 B.
    peak = activation_peak(order, (2, 7))
    assert (peak.bytes, peak.forward_pass, peak.live) == (42, 11, (7, 4))


def test_plain_1f1b_by_hand():
    order = pipeline_order(4, 1, 1, 5)  # warm-up 4 − 1 − 1 = 2
    assert text(order) == "F0.0 F0.1 F0.2 B0.0 F0.3 B0.1 F0.4 B0.2 B0.3 B0.4"
    assert activation_peak(order, (10,)).bytes == 30 == 10 * min(5, 4 - 1)
    assert activation_peak(pipeline_order(4, 1, 0, 2), (10,)).bytes == 20  # m < PP − s


def test_without_pipelining_each_microbatch_runs_through_every_chunk():
    order = pipeline_order(1, 2, 0, 2)  # not a Megatron layout (VPP needs PP > 1), still defined
    assert text(order) == "F0.0 F1.0 B1.0 B0.0 F0.1 F1.1 B1.1 B0.1"
    assert activation_peak(order, (3, 5)).bytes == 8


def test_group_size_and_ep_overlap_change_the_warmup():
    assert warmup_passes(2, 2, 0, 6, group_size=3) == 2 + 3
    assert warmup_passes(2, 2, 0, 6, extra_warmup=1) == 2 + 2 + 1
    assert warmup_passes(2, 2, 0, 1) == 2  # never more than every pass
    assert text(pipeline_order(2, 2, 1, 5, group_size=3)).startswith(
        "F0.0 F0.1 F0.2 F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F0.3 B0.0")


# ----------------------------------------------------------------- Megatron's functions as judge

@pytest.fixture(scope="module")
def megatron_schedule() -> dict[str, Any]:
    """Megatron-LM dev@d48bd6be megatron/core/pipeline_parallel/schedules.py: the three pure
    functions that fix the order (`get_pp_rank_microbatches`, `get_schedule_table`,
    `convert_schedule_table_to_order`)."""
    return megatron_functions(
        "core/pipeline_parallel/schedules.py",
        {"get_pp_rank_microbatches", "get_schedule_table", "convert_schedule_table_to_order"},
        Optional=Any, P2PCommunicator=Any, parallel_state=None)


class _Group:
    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


class _P2P:
    """Only what get_pp_rank_microbatches reads from its communicator."""

    def __init__(self, pp: int, stage: int, vpp: int | None) -> None:
        self.pp_group = _Group(pp, stage)
        self.virtual_pipeline_model_parallel_size = vpp


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 6), st.integers(2, 4), st.data())
def test_interleaved_order_matches_megatron(megatron_schedule, pp, vpp, data):
    m = data.draw(st.integers(pp, 3 * pp), label="microbatches")
    group = data.draw(st.integers(pp, m), label="group size")
    stage = data.draw(st.integers(0, pp - 1), label="stage")
    overlap = data.draw(st.booleans(), label="EP overlap")
    _, _, warmup, _ = megatron_schedule["get_pp_rank_microbatches"](
        m, vpp, group, overlap_moe_expert_parallel_comm=overlap,
        p2p_communicator=_P2P(pp, stage, vpp))
    assert warmup_passes(pp, vpp, stage, m, group, int(overlap)) == warmup
    table = megatron_schedule["get_schedule_table"](m, vpp, group)
    # Megatron's order: +c+1 is a forward of chunk c, c−VPP a backward (chunk VPP−1−c).
    expected = megatron_schedule["convert_schedule_table_to_order"](warmup, vpp, table)
    ours = [p.chunk + 1 if p.forward else -(p.chunk + 1)
            for p in pipeline_order(pp, vpp, stage, m, group, int(overlap))]
    assert ours == expected


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 8), st.data())
def test_plain_1f1b_warmup_matches_megatron(megatron_schedule, pp, data):
    stage, m = data.draw(st.integers(0, pp - 1)), data.draw(st.integers(1, 20))
    _, _, warmup, _ = megatron_schedule["get_pp_rank_microbatches"](
        m, 1, pp, p2p_communicator=_P2P(pp, stage, None))
    assert warmup_passes(pp, 1, stage, m) == warmup


# ----------------------------------------------------------------- properties

schedules = st.tuples(st.integers(1, 8), st.integers(1, 4), st.integers(1, 24)).filter(
    lambda t: t[0] > 1 or t[1] == 1).flatmap(
    lambda t: st.tuples(st.just(t[0]), st.just(t[1]), st.integers(0, t[0] - 1), st.just(t[2]),
                        st.lists(st.integers(0, 10**6), min_size=t[1], max_size=t[1])))


@settings(max_examples=300, deadline=None)
@given(schedules)
def test_every_pass_runs_once_and_backward_follows_forward(case):
    pp, vpp, stage, m, _ = case
    order = pipeline_order(pp, vpp, stage, m)
    forwards = [(p.chunk, p.microbatch) for p in order if p.forward]
    backwards = [(p.chunk, p.microbatch) for p in order if not p.forward]
    every = {(c, i) for c in range(vpp) for i in range(m)}
    assert sorted(forwards) == sorted(backwards) == sorted(every)
    seen: set[tuple[int, int]] = set()
    for p in order:
        key = (p.chunk, p.microbatch)
        assert (key not in seen) if p.forward else (key in seen)
        seen.add(key) if p.forward else seen.discard(key)


@settings(max_examples=300, deadline=None)
@given(schedules)
def test_peak_bounds(case):
    pp, vpp, stage, m, sizes = case
    peak = activation_peak(pipeline_order(pp, vpp, stage, m), sizes)
    warmup = warmup_passes(pp, vpp, stage, m)
    assert all(peak.bytes >= size for size in sizes)
    assert peak.bytes <= (warmup + 1) * max(sizes)
    assert peak.bytes == sum(n * size for n, size in zip(peak.live, sizes, strict=True))


@settings(max_examples=300, deadline=None)
@given(schedules)
def test_equal_chunks_give_in_flight_times_one_chunk(case):
    pp, vpp, stage, m, sizes = case
    in_flight = min(warmup_passes(pp, vpp, stage, m) + 1, m * vpp)
    peak = activation_peak(pipeline_order(pp, vpp, stage, m), [sizes[0]] * vpp)
    assert peak.bytes == in_flight * sizes[0]
    if vpp == 1:  # plain 1F1B: stage s holds min(m, PP − s) microbatches
        assert peak.live_passes == min(m, pp - stage)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 5), st.integers(1, 3), st.data())
def test_stage_peak_skips_repeating_groups_without_changing_the_answer(pp, vpp, data):
    m = data.draw(st.integers(1, 80), label="microbatches")
    stage = data.draw(st.integers(0, pp - 1), label="stage")
    pp = data.draw(st.sampled_from([pp, 1]) if vpp > 1 else st.just(pp), label="pp")
    stage = min(stage, pp - 1)
    group = data.draw(st.none() | st.integers(1, m + 3), label="group size") if vpp > 1 \
        else None
    extra = data.draw(st.integers(0, 1), label="extra warm-up") if vpp > 1 else 0
    sizes = data.draw(st.lists(st.integers(0, 50), min_size=vpp, max_size=vpp), label="sizes")
    full = activation_peak(pipeline_order(pp, vpp, stage, m, group, extra), sizes)
    assert stage_peak(pp, vpp, stage, m, sizes, group, extra) == full


def test_stage_peak_is_fast_for_huge_microbatch_counts():
    # Last stage of PP16 VPP2: 16 chunk-0 forwards of warm-up, 16 chunk-1 forward/backward pairs,
    # then F0.16 comes before B0.0: 17 chunk-0 microbatches live at forward 33.
    peak = stage_peak(16, 2, 15, 10**9, (5, 3))
    assert (peak.live, peak.bytes, peak.forward_pass) == ((17, 0), 17 * 5, 33)
    peak = stage_peak(16, 2, 15, 10**9, (3, 5))
    assert (peak.live, peak.bytes, peak.forward_pass) == ((16, 1), 16 * 3 + 5, 17)
    # One group of every microbatch: chunk 0 for all of them, then chunk 1. Stage 0 warms up with
    # 2·3 + 10^9 forwards, so everything is in flight once the last chunk-0 pass has run.
    peak = stage_peak(4, 2, 0, 10**9, (5, 3), group_size=10**9)
    assert peak.live == (10**9, 7) and peak.forward_pass == 10**9 + 7
    assert stage_peak(1, 3, 0, 10**9, (5, 3, 1)) == Peak(9, 3, (1, 1, 1))

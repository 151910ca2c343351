"""Placement facts (`rank_values`) are remembered per grid spec and, with pp outermost, carried
from stage 0 to the same position of a later stage when the stages lie a whole number of nodes
apart: every group but the embedding's is then stage 0's moved by whole nodes. These tests hold
the shortcut to the full computation."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.budget.placement import SPANS_STAGES, placement
from planner.budget.symbols import TOPOLOGY_GROUPS, rank_values
from planner.layout.grid import Grid
from planner.layout.rank_generator import GridError
from planner.layout.spec import GridSpec

EXPERTS = (16, 2, None, None)


def fresh(grid: Grid, rank: int, node_size: int) -> dict:
    """rank_values from the rank's own groups, with no memory and no shortcut."""
    kinds = set(grid.kinds)
    groups = {kind: grid.group_of(kind, rank) for kind in TOPOLOGY_GROUPS if kind in kinds}
    return rank_values(rank, node_size, groups, grid.group_of("pp", rank), EXPERTS)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(tp=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2]), pp=st.sampled_from([2, 4, 8]),
       ep=st.sampled_from([1, 2, 4, 8]), etp=st.sampled_from([1, 2]),
       dp=st.sampled_from([1, 2, 4]), node=st.sampled_from([1, 2, 4, 8]),
       order=st.sampled_from(["tp-cp-ep-dp-pp", "tp-ep-cp-dp-pp", "tp-cp-ep-pp-dp"]))
def test_moved_placement_equals_the_full_one(tp, cp, pp, ep, etp, dp, node, order) -> None:
    world = tp * cp * pp * dp
    assume(etp in (1, tp))
    try:
        grid = Grid(GridSpec(world, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, num_experts=16,
                             order=order))
    except (GridError, ValueError):
        assume(False)
        return
    width = world // pp
    for stage in range(pp):
        for rank in (stage * width, stage * width + width - 1):
            assert placement(grid, rank, node, EXPERTS).values == fresh(grid, rank, node), \
                (order, stage, rank)


def test_only_the_embedding_group_spans_stages() -> None:
    """The shortcut's premise on a layout with every group kind: with pp outermost, a rank's
    groups in stage s are its stage-0 twin's moved by s·N/PP ranks, except the embedding's."""
    grid = Grid(GridSpec(64, tp=2, cp=2, pp=4, ep=4, etp=2, num_experts=16, mtp_stages=(3,)))
    width = 16
    for kind in [k for k in TOPOLOGY_GROUPS if k in set(grid.kinds)]:
        for rank in range(width, 64):
            moved = [m + rank // width * width for m in grid.group_of(kind, rank % width)]
            assert (grid.group_of(kind, rank) == moved) != (kind in SPANS_STAGES), (kind, rank)

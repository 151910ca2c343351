"""Rank placement: a rank's process groups laid on nodes, as the rank inputs of the formula book.

`placement` gives one rank's embedding group and `rank_values` (symbols.py: peers on its node,
nodes spanned, ring edges crossing nodes, for every topology group kind), remembered per grid
spec: every knob setting search times on one layout places its ranks alike. It belongs to the
book, not to planner/layout/: what it makes is formula input (the book's `RANK_SYMBOLS`), and
layout code never reads the book.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from planner.budget.book import read_items
from planner.budget.expr import Number
from planner.budget.symbols import TOPOLOGY_GROUPS, moved_rank_values, rank_values
from planner.layout.nodes import Places
from planner.memo import HashedOnce, HeldByIdentity, Memo

if TYPE_CHECKING:
    from planner.layout.grid import Grid

# Topology group kinds that span pipeline stages (the rest lie inside one stage's ranks).
SPANS_STAGES = frozenset({"embd"})


@dataclass(eq=False)
class Placement:
    """A rank's embedding group and `rank_values`, with their sharing keys per formula book."""

    embd: list[int] | None
    values: dict[str, Number]
    keys: dict[frozenset[str], HashedOnce] = field(default_factory=dict)

    def key(self, read: frozenset[str]) -> HashedOnce:
        """The values a book with inputs `read` reads (see `read_items`), hashed once."""
        if read not in self.keys:
            self.keys[read] = HashedOnce(read_items(self.values, read))
        return self.keys[read]


_PLACEMENTS: Memo[tuple[Any, ...], Placement] = Memo("rank placements", 65536)


def placement(grid: Grid, rank: int, node_size: Places, experts: tuple[Any, ...]) -> Placement:
    """The rank's placement on nodes of `node_size` GPUs (or a NodeMap: planner/layout/nodes.py);
    `experts` is (E, k, G, g) of the model (symbols.rank_values). Remembered per grid spec and
    placement, which is all a grid's placement depends on."""
    return _PLACEMENTS.get((_groups_key(grid), rank, node_size, experts), _place, grid, rank,
                           node_size, experts)


def _groups_key(grid: Grid) -> HashedOnce:
    """What decides the grid's groups: its spec but the MoE layers of each stage, which only say
    which layers a rank's experts serve (Grid.expert_ownership), never who is in a group. Search
    times several pipeline layouts of one family: they share their ranks' placements. The last
    grid's key is kept with it (stage after stage asks for the same grid)."""
    return _GROUPS_KEYS.get(grid, lambda g: HashedOnce((replace(g.spec, moe_layers_by_stage=()),)))


_GROUPS_KEYS: HeldByIdentity[HashedOnce] = HeldByIdentity(1)


def _place(grid: Grid, rank: int, node_size: Places, experts: tuple[Any, ...]) -> Placement:
    enabled = set(grid.kinds)
    kinds = [kind for kind in TOPOLOGY_GROUPS if kind in enabled]
    spec, pp_group = grid.spec, grid.group_of("pp", rank)
    width = spec.world_size // spec.pp  # ranks per pipeline stage
    shift = rank // width * width
    if isinstance(node_size, int) and shift and shift % node_size == 0 and spec.order.endswith("pp"):
        # With pp outermost, every group but the embedding's (which spans stages) is the same
        # rank's in stage 0 moved by `shift` ranks: whole nodes here.
        origin = placement(grid, rank - shift, node_size, experts)
        moved = {kind: grid.group_of(kind, rank) for kind in kinds if kind in SPANS_STAGES}
        values = moved_rank_values(origin.values, rank, node_size, moved, pp_group)
    else:
        moved = {kind: grid.group_of(kind, rank) for kind in kinds}
        values = rank_values(rank, node_size, moved, pp_group, experts)
    return Placement(moved.get("embd"), values)

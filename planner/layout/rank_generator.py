"""Megatron's `RankGenerator`: N ranks laid out along named axes, groups read off by rank arithmetic.

Megatron-Core builds every process group from a generator (Megatron-LM dev@d48bd6be
megatron/core/parallel_state.py RankGenerator, generate_masked_orthogonal_rank_groups): the axes of
an order string, leftmost fastest, and a group of token `a-b` is "the ranks that agree on every axis
but a and b", groups listed in mixed-radix order of the other axes, ranks in mixed-radix order of the
masked ones. Wrong-group bugs are silent, so this reproduces that order exactly.

A rank's coordinates and groups come from strides (O(number of axes) each), so one rank's view of a
131,072-rank job needs no enumeration; full listings are linear in N. This module knows nothing of
configs or group kinds: `planner/layout/spec.py` sizes the two generators of a layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from math import prod
from typing import Literal

GTP_AXIS = "gtp_remat"
ORDER_TOKENS = ("tp", "cp", "ep", "dp", "pp", GTP_AXIS)
# Megatron appends the axes an order string leaves out in its size map's key order.
_APPEND_ORDER = ("tp", "pp", "dp", "ep", "cp", GTP_AXIS)

GridName = Literal["dense", "expert"]


class GridError(ValueError):
    """The layout cannot be built, or Megatron would reject it while building groups.

    It lives with the generator because the generator is the first to refuse (Megatron's
    RankGenerator raises on an order that leaves out an axis of size > 1)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class RankGenerator:
    """One generator: axis names in order-string order (leftmost fastest) and their sizes."""

    name: GridName
    axes: tuple[str, ...]
    sizes: tuple[int, ...]
    strides: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        strides, running = [], 1
        for size in self.sizes:
            strides.append(running)
            running *= size
        object.__setattr__(self, "strides", tuple(strides))

    @property
    def world_size(self) -> int:
        return prod(self.sizes)

    @property
    def order(self) -> str:
        return "-".join(self.axes)

    def size(self, axis: str) -> int:
        return self.sizes[self.axes.index(axis)]

    def coordinate(self, rank: int, axis: str) -> int:
        i = self.axes.index(axis)
        return (rank // self.strides[i]) % self.sizes[i]

    def coordinates(self, rank: int) -> dict[str, int]:
        return {a: (rank // g) % s for a, s, g in zip(self.axes, self.sizes, self.strides, strict=True)}

    def mask(self, token: str) -> tuple[int, ...]:
        """Axis indices named by a token; name order inside the token has no effect."""
        return _token_mask(self.axes, token)

    def group_size(self, token: str) -> int:
        return prod(self.sizes[i] for i in self.mask(token))

    def num_groups(self, token: str) -> int:
        return self.world_size // self.group_size(token)

    def group_index(self, token: str, rank: int) -> int:
        """Position of the rank's group in generator order (unmasked coordinates, mixed radix)."""
        return self._digits_value(rank, self._unmasked(self.mask(token)))

    def position_in_group(self, token: str, rank: int) -> int:
        """Position of the rank inside its group (masked coordinates, mixed radix)."""
        return self._digits_value(rank, self.mask(token))

    def group_containing(self, token: str, rank: int) -> list[int]:
        masked = self.mask(token)
        base = rank - sum(((rank // self.strides[i]) % self.sizes[i]) * self.strides[i]
                          for i in masked)
        return [base + offset for offset in self._offsets(masked)]

    def group_at(self, token: str, index: int) -> list[int]:
        masked = self.mask(token)
        base = 0
        for i in self._unmasked(masked):
            base += (index % self.sizes[i]) * self.strides[i]
            index //= self.sizes[i]
        return [base + offset for offset in self._offsets(masked)]

    def groups(self, token: str) -> list[list[int]]:
        """All groups of a token, in Megatron's output order (groups by q, ranks by r)."""
        masked = self.mask(token)
        offsets = self._offsets(masked)
        return [[base + o for o in offsets] for base in self._offsets(self._unmasked(masked))]

    def _unmasked(self, masked: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(i for i in range(len(self.axes)) if i not in masked)

    def _digits_value(self, rank: int, indices: tuple[int, ...]) -> int:
        value, weight = 0, 1
        for i in indices:
            value += ((rank // self.strides[i]) % self.sizes[i]) * weight
            weight *= self.sizes[i]
        return value

    def _offsets(self, indices: tuple[int, ...]) -> list[int]:
        return list(_mixed_radix_offsets(tuple((self.sizes[i], self.strides[i]) for i in indices)))


def generator_from_order(
    name: GridName, order: str, sizes: dict[str, int]
) -> tuple[RankGenerator | None, list[str]]:
    """The generator of an order string and axis sizes, or None and why Megatron would refuse it.

    As RankGenerator.__init__ does: the order is lower-cased, gtp_remat goes after its anchor
    (Megatron-LM main@d98e8a64: dense after tp, expert after ep), and the axes the order leaves out
    are appended (a left-out axis of size > 1 raises RuntimeError).
    """
    tokens, problems = _parse_order(order)
    if problems:
        return None, problems
    tokens = _inject_gtp_axis(tokens, "tp" if name == "dense" else "ep")
    for axis in _APPEND_ORDER:
        if axis in tokens:
            continue
        if sizes[axis] != 1:
            problems.append(
                f"{name} {axis} size is {sizes[axis]} but order '{order}' does not name "
                f"'{axis}' (Megatron RankGenerator raises RuntimeError)"
            )
        tokens.append(axis)
    if problems:
        return None, problems
    return RankGenerator(name, tuple(tokens), tuple(sizes[t] for t in tokens)), []


@lru_cache(maxsize=4096)
def stage_ranks(generator: RankGenerator, stage: int) -> tuple[int, ...]:
    """Ranks of one pipeline stage, ascending (remembered: estimates ask for every stage of the same
    generators again and again)."""
    pp_index = generator.axes.index("pp")
    unmasked = tuple(i for i in range(len(generator.axes)) if i != pp_index)
    offsets = _mixed_radix_offsets(tuple((generator.sizes[i], generator.strides[i]) for i in unmasked))
    base = stage * generator.strides[pp_index]
    return tuple(sorted(base + o for o in offsets))


@lru_cache(maxsize=256)
def _token_mask(axes: tuple[str, ...], token: str) -> tuple[int, ...]:
    names = token.lower().split("-")
    unknown = [n for n in names if n not in axes]
    if unknown:
        raise GridError([f"token '{token}' names {unknown}, not in order '{'-'.join(axes)}'"])
    return tuple(sorted({axes.index(n) for n in names}))


@lru_cache(maxsize=256)
def _mixed_radix_offsets(dims: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    """Σ digit·stride for every digit tuple, first dimension varying fastest."""
    offsets = [0]
    for size, stride in dims:
        offsets = [o + digit * stride for digit in range(size) for o in offsets]
    return tuple(offsets)


def _parse_order(order: str) -> tuple[list[str], list[str]]:
    """Order tokens (lower-cased, as Megatron does) and the problems found in them."""
    tokens = order.lower().split("-")
    problems = []
    bad = [t for t in tokens if t not in ORDER_TOKENS]
    if bad:
        problems.append(
            f"order '{order}' has unknown token(s) {bad}; allowed: {', '.join(ORDER_TOKENS[:5])}"
        )
    dupes = sorted({t for t in tokens if tokens.count(t) > 1})
    if dupes:
        problems.append(f"order '{order}' names {dupes} more than once")
    return tokens, problems


def _inject_gtp_axis(tokens: list[str], anchor: str) -> list[str]:
    """Megatron main inserts gtp_remat after the anchor (dense: tp, expert: ep)."""
    if GTP_AXIS in tokens:
        return list(tokens)
    for where in (anchor, "tp"):
        if where in tokens:
            at = tokens.index(where) + 1
            return tokens[:at] + [GTP_AXIS] + tokens[at:]
    return [GTP_AXIS, *tokens]

"""How a group kind's groups come out of its generator: one token, or a cut of one token's groups.

Each construction answers the four questions `Grid` asks of every kind: the listing in Megatron's
creation order, the size of one group, how many groups there are, and the group holding one rank
(by arithmetic, never by listing). A *family* (hierarchical CP levels, DP×CP chunks) is one kind
made of differently sized members, listed member by member (`hcp_l0`, `hybrid_dp_cp_4`, …); it
answers for the family name where that makes sense and refuses where it does not.

`kind` below is the name as listed (a member or the family itself); `generator` is the record's
grid (planner/layout/group_kinds.py says which).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from math import prod
from typing import Literal

from planner.layout.rank_generator import GridError, RankGenerator
from planner.layout.spec import GridSpec


class Construction(ABC):
    """The interface every kind's construction answers (see the module docstring).

    Plain slotted classes, not dataclasses: `moeplan check` imports the registry, and a frozen
    dataclass costs about half a millisecond to define."""

    __slots__: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(getattr(self, n)) for n in self.__slots__)})"

    def members(self, kind: str, generator: RankGenerator, spec: GridSpec) -> tuple[str, ...]:
        """The member kinds of a family (empty when none is built); () for a plain kind."""
        return ()

    @abstractmethod
    def groups(self, kind: str, generator: RankGenerator, spec: GridSpec) -> list[list[int]]:
        ...

    @abstractmethod
    def size(self, kind: str, generator: RankGenerator, spec: GridSpec) -> int:
        ...

    def count(self, kind: str, generator: RankGenerator, spec: GridSpec) -> int:
        return spec.world_size // self.size(kind, generator, spec)

    @abstractmethod
    def member(self, kind: str, generator: RankGenerator, spec: GridSpec, rank: int) -> list[int]:
        """The group of `kind` holding `rank`; [] when the rank is in none."""
        ...


class Token(Construction):
    """The generator's groups of one token, as they are (RankGenerator.get_ranks(token))."""

    __slots__ = ("token",)

    def __init__(self, token: str) -> None:
        self.token = token

    def groups(self, kind: str, generator: RankGenerator, spec: GridSpec) -> list[list[int]]:
        return generator.groups(self.token)

    def size(self, kind: str, generator: RankGenerator, spec: GridSpec) -> int:
        return generator.group_size(self.token)

    def member(self, kind: str, generator: RankGenerator, spec: GridSpec, rank: int) -> list[int]:
        return generator.group_containing(self.token, rank)


class Chunks(Construction):
    """A family: each group of a token cut into consecutive chunks of k ranks for every power of two
    k below its width (hybrid from 2, dynamic from 1); the last chunk may be short."""

    __slots__ = ("token", "mode")

    def __init__(self, token: str, mode: Literal["hybrid", "dynamic"]) -> None:
        self.token = token
        self.mode = mode

    def _sizes(self, kind: str, generator: RankGenerator) -> list[int]:
        suffix = kind.rpartition("_")[2]
        if suffix.isdigit():
            return [int(suffix)]
        return dp_cp_chunk_sizes(self.mode, generator.group_size(self.token))

    def members(self, kind: str, generator: RankGenerator, spec: GridSpec) -> tuple[str, ...]:
        if spec.dp_cp_chunks != self.mode:
            return ()
        return tuple(f"{kind}_{k}" for k in self._sizes(kind, generator))

    def groups(self, kind: str, generator: RankGenerator, spec: GridSpec) -> list[list[int]]:
        chunks = self._sizes(kind, generator)
        return [g[i:i + k] for g in generator.groups(self.token) for k in chunks
                for i in range(0, len(g), k)]

    def size(self, kind: str, generator: RankGenerator, spec: GridSpec) -> int:
        if not kind.rpartition("_")[2].isdigit():
            members = self.members(kind, generator, spec)
            raise GridError([f"{kind} chunks differ in size; ask for {members}"])
        return self._sizes(kind, generator)[0]

    def count(self, kind: str, generator: RankGenerator, spec: GridSpec) -> int:
        width = generator.group_size(self.token)  # a chunk size need not divide it: the last is short
        return spec.world_size // width * sum(-(-width // k) for k in self._sizes(kind, generator))

    def member(self, kind: str, generator: RankGenerator, spec: GridSpec, rank: int) -> list[int]:
        if not kind.rpartition("_")[2].isdigit():
            members = self.members(kind, generator, spec)
            raise GridError([f"{kind} has one group per chunk size; ask for {members}"])
        k = self._sizes(kind, generator)[0]
        group = generator.group_containing(self.token, rank)
        start = generator.position_in_group(self.token, rank) // k * k
        return group[start:start + k]


def hcp_levels(width: int, spec: GridSpec) -> tuple[int, ...]:
    """hierarchical_context_parallel_sizes: the levels of each cp group, innermost first."""
    return spec.hcp_sizes or ()


def instance_split(width: int, spec: GridSpec) -> tuple[int, ...]:
    """[W/I, I] over a data-parallel group of W ranks: inside one distributed-optimizer instance
    (level 0: W/I contiguous ranks), then across the I instances (level 1)."""
    instances = spec.dist_opt_instances
    return (width // instances, instances)


class Hierarchical(Construction):
    """Each group of a token viewed as nested levels of the given sizes; one level, or (level None)
    a family of every level, member `<kind>_l<i>`."""

    __slots__ = ("token", "split", "level")

    def __init__(
        self, token: str, split: Callable[[int, GridSpec], tuple[int, ...]], level: int | None = None
    ) -> None:
        self.token = token
        self.split = split
        self.level = level

    def _sizes(self, generator: RankGenerator, spec: GridSpec) -> tuple[int, ...]:
        return self.split(generator.group_size(self.token), spec)

    def _levels(self, kind: str, generator: RankGenerator, spec: GridSpec) -> list[int] | None:
        """The levels a listed kind stands for; None for a family's own name."""
        if self.level is not None:
            return [self.level]
        suffix = kind.rpartition("_l")[2]
        return [int(suffix)] if suffix.isdigit() else None

    def members(self, kind: str, generator: RankGenerator, spec: GridSpec) -> tuple[str, ...]:
        if self.level is not None:
            return ()
        return tuple(f"{kind}_l{i}" for i in range(len(self._sizes(generator, spec))))

    def groups(self, kind: str, generator: RankGenerator, spec: GridSpec) -> list[list[int]]:
        sizes = self._sizes(generator, spec)
        levels = self._levels(kind, generator, spec) or range(len(sizes))
        return [sub for g in generator.groups(self.token) for level in levels
                for sub in _hierarchical_groups(g, sizes, level)]

    def size(self, kind: str, generator: RankGenerator, spec: GridSpec) -> int:
        levels = self._levels(kind, generator, spec)
        if levels is None:
            members = self.members(kind, generator, spec)
            raise GridError([f"{kind} levels differ in size; ask for {members}"])
        return self._sizes(generator, spec)[levels[0]]

    def count(self, kind: str, generator: RankGenerator, spec: GridSpec) -> int:
        if self._levels(kind, generator, spec) is None:
            return sum(spec.world_size // size for size in self._sizes(generator, spec))
        return super().count(kind, generator, spec)

    def member(self, kind: str, generator: RankGenerator, spec: GridSpec, rank: int) -> list[int]:
        levels = self._levels(kind, generator, spec)
        if levels is None:
            members = self.members(kind, generator, spec)
            raise GridError([f"{kind} has one group per level; ask for {members}"])
        group = generator.group_containing(self.token, rank)
        position = generator.position_in_group(self.token, rank)
        return _hierarchical_member(group, self._sizes(generator, spec), levels[0], position)


class Stages(Construction):
    """The given pipeline stages of each group of a (pp) token; ranks on other stages are in none."""

    __slots__ = ("token", "stages")

    def __init__(self, token: str, stages: Callable[[GridSpec], tuple[int, ...]]) -> None:
        self.token = token
        self.stages = stages

    def groups(self, kind: str, generator: RankGenerator, spec: GridSpec) -> list[list[int]]:
        stages = self.stages(spec)
        return [[g[i] for i in stages] for g in generator.groups(self.token)]

    def size(self, kind: str, generator: RankGenerator, spec: GridSpec) -> int:
        return len(self.stages(spec))

    def count(self, kind: str, generator: RankGenerator, spec: GridSpec) -> int:
        return spec.ranks_per_stage

    def member(self, kind: str, generator: RankGenerator, spec: GridSpec, rank: int) -> list[int]:
        stages = self.stages(spec)
        if generator.coordinate(rank, self.token) not in stages:
            return []
        group = generator.group_containing(self.token, rank)
        return [group[i] for i in stages]


def embedding_stages(spec: GridSpec) -> tuple[int, ...]:
    return spec.embedding_stages()


def first_stage(spec: GridSpec) -> tuple[int, ...]:
    return (0,)


class Joined(Construction):
    """A token's groups joined EDP/I at a time, in generator order (not sorted); every rank in one
    group when GTP or EGTP > 1 (Megatron-LM main@d98e8a64, where I must be 1)."""

    __slots__ = ("token",)

    def __init__(self, token: str) -> None:
        self.token = token

    def _width(self, spec: GridSpec) -> int:
        return spec.edp // spec.dist_opt_instances

    def groups(self, kind: str, generator: RankGenerator, spec: GridSpec) -> list[list[int]]:
        if spec.gtp_active:
            return [list(range(spec.world_size))]
        width, sources = self._width(spec), generator.groups(self.token)
        return [[r for g in sources[i:i + width] for r in g] for i in range(0, len(sources), width)]

    def size(self, kind: str, generator: RankGenerator, spec: GridSpec) -> int:
        return spec.world_size // spec.dist_opt_instances

    def member(self, kind: str, generator: RankGenerator, spec: GridSpec, rank: int) -> list[int]:
        if spec.gtp_active:
            return list(range(spec.world_size))
        width = self._width(spec)
        first = generator.group_index(self.token, rank) // width * width
        return [r for q in range(first, first + width) for r in generator.group_at(self.token, q)]


def dp_cp_chunk_sizes(mode: str, width: int) -> list[int]:
    """Powers of two below a DP×CP group's width (2^i for i < ⌊log2 width⌋).

    hybrid starts at 2 (megatron-core 0.16.1 / Megatron-LM main megatron/core/parallel_state.py
    create_hybrid_dp_cp_groups); dynamic starts at min_dynamic_context_parallel_size, 1 by
    default (Megatron-LM dev@d48bd6be create_dynamic_dp_cp_groups).
    """
    sizes = [2**i for i in range(max(width.bit_length() - 1, 0))]
    return sizes[1:] if mode == "hybrid" else sizes


def _hierarchical_groups(ranks: list[int], sizes: tuple[int, ...], level: int) -> list[list[int]]:
    """Level ℓ groups over a list viewed as (l, s, u).

    Megatron-LM dev@d48bd6be megatron/core/parallel_state.py create_hierarchical_groups.
    """
    u, s, lo = prod(sizes[:level]), sizes[level], prod(sizes[level + 1:])
    return [[ranks[a * s * u + b * u + c] for b in range(s)] for a in range(lo) for c in range(u)]


def _hierarchical_member(
    ranks: list[int], sizes: tuple[int, ...], level: int, position: int
) -> list[int]:
    u, s = prod(sizes[:level]), sizes[level]
    a, c = position // (s * u), position % u
    return [ranks[a * s * u + b * u + c] for b in range(s)]

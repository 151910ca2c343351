"""Megatron-exact process groups for one MoE layout: both generators of a spec and every group kind.

Megatron-Core (`parallel_state.initialize_model_parallel`) lays the same N ranks out twice: a
dense generator (attention; EP axis 1) and an expert generator (routed experts; CP axis 1,
TP = ETP, DP = EDP). `Grid` holds both (planner/layout/rank_generator.py, sized by
planner/layout/spec.py) and answers for every kind in planner/layout/group_kinds.py, the registry
it dispatches on (Megatron-LM dev@d48bd6be megatron/core/parallel_state.py RankGenerator,
generate_masked_orthogonal_rank_groups, initialize_model_parallel).

A rank's coordinates and groups are derived from strides (O(number of axes) per coordinate),
so one rank's view of a 131,072-rank job needs no enumeration; full listings are linear in N.
No torch and no sympy (planner/layout/coordinates.py writes the formulas' texts from the strides and
loads sympy only for its expressions): `moeplan check` and `moeplan groups --rank` must start fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from planner.layout.coordinates import CoordinateFormula, coordinate_formula
from planner.layout.group_kinds import KIND_BY_NAME, KINDS, GroupKind
from planner.layout.rank_generator import GTP_AXIS, GridError, GridName, RankGenerator, stage_ranks
from planner.layout.spec import GridSpec, dense_generator, expert_generator, layout_problems

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Iterable


# --------------------------------------------------------------------------- views

@dataclass(frozen=True)
class ExpertOwnership:
    """What one rank holds of the routed experts, and who holds the same parameters."""

    rank: int
    stage: int
    ep_rank: int
    ep_size: int
    etp_rank: int
    etp_size: int
    egtp_rank: int
    egtp_size: int
    expert_ids: tuple[int, ...]
    experts_by_layer: dict[int, tuple[int, ...]]
    replica_peers: tuple[int, ...]
    note: str = ""

    @property
    def shard(self) -> str:
        """Which matrix shard of each held expert this rank stores (ETP: FC1/FC3 columns, FC2 rows)."""
        parts = []
        if self.etp_size > 1:
            parts.append(
                f"ETP shard {self.etp_rank} of {self.etp_size}: FC1/FC3 column shard, "
                "FC2 row shard"
            )
        if self.egtp_size > 1:
            parts.append(f"EGTP weight shard {self.egtp_rank} of {self.egtp_size}")
        return "; ".join(parts) or "whole matrices"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "stage": self.stage,
            "ep_rank": self.ep_rank,
            "ep_size": self.ep_size,
            "etp_rank": self.etp_rank,
            "etp_size": self.etp_size,
            "egtp_rank": self.egtp_rank,
            "egtp_size": self.egtp_size,
            "expert_ids": list(self.expert_ids),
            "experts_by_layer": {str(k): list(v) for k, v in self.experts_by_layer.items()},
            "shard": self.shard,
            "replica_peers": list(self.replica_peers),
            "note": self.note,
        }

@dataclass(frozen=True)
class RankView:
    """Everything one rank holds and talks to.

    `groups` is computed on first use: materialising a group costs its size (intra_dist_opt
    spans N/I ranks), and callers that only need coordinates and experts should not pay it.
    """

    rank: int
    stage: int
    dense_coords: dict[str, int]
    expert_coords: dict[str, int]
    experts: ExpertOwnership
    formulas: dict[str, CoordinateFormula]
    grid: Grid = field(repr=False, compare=False)

    @cached_property
    def groups(self) -> dict[str, list[int]]:
        return self.grid.rank_groups(self.rank)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "stage": self.stage,
            "dense_coords": self.dense_coords,
            "expert_coords": self.expert_coords,
            "groups": self.groups,
            "experts": self.experts.to_dict(),
            "formulas": {
                name: {
                    "global": f.text(),
                    "stage": f.text(stage=True),
                    "ranges": f.ranges(),
                    "inverse": f.inverse_text(),
                }
                for name, f in self.formulas.items()
            },
        }


class Grid:
    """Both generators of one spec and every process group Megatron would build from them."""

    def __init__(self, spec: GridSpec) -> None:
        problems = layout_problems(spec)
        if problems:
            raise GridError(problems)
        self.spec = spec
        self.dense = dense_generator(spec)
        self.expert = expert_generator(spec)
        self.degrees = spec.degrees
        self.dp, self.edp = self.degrees.dp, self.degrees.edp
        reasons = {kind.name: kind.absent(spec) for kind in KINDS}
        # Why each kind Megatron would not build here is absent (every kind not in `kinds`).
        self.absent: dict[str, str] = {name: why for name, why in reasons.items() if why is not None}
        self.kinds: tuple[str, ...] = tuple(name for name, why in reasons.items() if why is None)
        # Families: kinds made of several differently sized members, listed member by member.
        self.members: dict[str, tuple[str, ...]] = {}
        # Every listed kind (a plain kind, a family, its members) with its record and generator.
        self._built: dict[str, tuple[GroupKind, RankGenerator]] = {}
        for name in self.kinds:
            kind = KIND_BY_NAME[name]
            generator = self.generator(kind.grid)
            built = (kind, generator)
            self._built[name] = built
            members = kind.construction.members(name, generator, spec)
            if members:
                self.members[name] = members
                self._built.update(dict.fromkeys(members, built))

    # ----------------------------------------------------------------- catalogue

    def generator(self, grid: GridName) -> RankGenerator:
        return self.dense if grid == "dense" else self.expert

    def listing_kinds(self) -> list[str]:
        """Enabled kinds in creation order, each family replaced by its members."""
        out: list[str] = []
        for kind in self.kinds:
            out.extend(self.members.get(kind, (kind,)))
        return out

    def group_kind(self, kind: str) -> GroupKind:
        """The registry record a listed kind (a family member included) belongs to."""
        return self._lookup(kind)[0]

    def _lookup(self, kind: str) -> tuple[GroupKind, RankGenerator]:
        built = self._built.get(kind)
        if built is None:
            known = ", ".join(self.listing_kinds())
            why = f" ({self.absent[kind]})" if kind in self.absent else ""
            raise GridError([f"unknown or disabled group kind '{kind}'{why}; this layout has: {known}"])
        return built

    # ----------------------------------------------------------------- listings

    def groups(self, kind: str) -> list[list[int]]:
        """Every group of a kind, in the order Megatron creates them."""
        record, generator = self._lookup(kind)
        return record.construction.groups(kind, generator, self.spec)

    def all_groups(self) -> dict[str, list[list[int]]]:
        """Every enabled kind, in creation order."""
        return {kind: self.groups(kind) for kind in self.kinds}

    def group_size(self, kind: str) -> int:
        record, generator = self._lookup(kind)
        return record.construction.size(kind, generator, self.spec)

    def num_groups(self, kind: str) -> int:
        record, generator = self._lookup(kind)
        return record.construction.count(kind, generator, self.spec)

    # ----------------------------------------------------------------- one rank

    def _check_rank(self, rank: int) -> None:
        if not isinstance(rank, int) or not 0 <= rank < self.spec.world_size:
            raise GridError([f"rank {rank} is outside 0..{self.spec.world_size - 1}"])

    def stage_of(self, rank: int) -> int:
        self._check_rank(rank)
        return self.dense.coordinate(rank, "pp")

    def group_of(self, kind: str, rank: int) -> list[int]:
        """The group of `kind` containing `rank`, by arithmetic; [] when the rank has none.

        `hcp` holds one group per level: ask for `hcp_l0`, `hcp_l1`, … instead.
        """
        self._check_rank(rank)
        record, generator = self._lookup(kind)
        return record.construction.member(kind, generator, self.spec, rank)

    def expert_ownership(self, rank: int, *, with_replicas: bool = True) -> ExpertOwnership:
        """Global expert ids this rank holds per MoE layer of its stage, and its replicas.
        with_replicas=False leaves replica_peers empty: listing them costs EDP per rank, which a
        caller asking for every rank (the reshard plan) would pay N times."""
        self._check_rank(rank)
        s, x = self.spec, self.expert
        stage = x.coordinate(rank, "pp")
        ep_rank = x.coordinate(rank, "ep")
        per_rank = s.experts_per_rank
        note = ""
        if per_rank is None:
            ids: tuple[int, ...] = ()
            note = (
                "no routed experts configured" if s.num_experts <= 0 else
                f"{s.num_experts} experts do not split evenly over EP = {s.ep}"
            )
        else:
            ids = tuple(range(ep_rank * per_rank, (ep_rank + 1) * per_rank))
        layers = s.moe_layers_of_stage(stage)
        return ExpertOwnership(
            rank=rank,
            stage=stage,
            ep_rank=ep_rank,
            ep_size=s.ep,
            etp_rank=x.coordinate(rank, "tp"),
            etp_size=s.etp,
            egtp_rank=x.coordinate(rank, GTP_AXIS),
            egtp_size=s.egtp,
            expert_ids=ids,
            experts_by_layer={layer: ids for layer in layers} if ids else {},
            replica_peers=tuple(x.group_containing("dp", rank)) if with_replicas else (),
            note=note,
        )

    def rank_groups(self, rank: int) -> dict[str, list[int]]:
        """Every group containing the rank, creation order; families as one entry per member."""
        out: dict[str, list[int]] = {}
        for kind in self.listing_kinds():
            group = self.group_of(kind, rank)
            if group:
                out[kind] = group
        return out

    def rank_view(self, rank: int, *, with_formulas: bool = True) -> RankView:
        self._check_rank(rank)
        stage = self.dense.coordinate(rank, "pp")
        return RankView(
            rank=rank,
            stage=stage,
            dense_coords=_shown_coords(self.dense, rank, hidden="ep"),
            expert_coords=_shown_coords(self.expert, rank, hidden="cp"),
            experts=self.expert_ownership(rank),
            formulas=self.formulas(stage) if with_formulas else {},
            grid=self,
        )

    def stage_ranks(self, stage: int) -> list[int]:
        """Ranks of one pipeline stage, ascending."""
        if not 0 <= stage < self.spec.pp:
            raise GridError([f"stage {stage} is outside 0..{self.spec.pp - 1}"])
        return list(stage_ranks(self.dense, stage))


    def formulas(self, stage: int = 0) -> dict[str, CoordinateFormula]:
        """Each generator's rank as a formula of its coordinates (texts without sympy)."""
        return {"dense": coordinate_formula(self.dense, stage),
                "expert": coordinate_formula(self.expert, stage)}


def _shown_coords(generator: RankGenerator, rank: int, hidden: str) -> dict[str, int]:
    """Coordinates a reader cares about: the forced-1 axis and idle gtp axis are left out."""
    coords = generator.coordinates(rank)
    return {a: v for a, v in coords.items()
            if a != hidden and not (a == GTP_AXIS and generator.size(a) == 1)}


def nodes_spanned(group: Iterable[int], ranks_per_node: int) -> int:
    """How many nodes a group touches when ranks fill nodes in order (launcher default)."""
    return len({r // ranks_per_node for r in group})

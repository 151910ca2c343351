"""Megatron-exact process groups for one MoE layout, computed by rank arithmetic.

Megatron-Core (`parallel_state.initialize_model_parallel`) lays the same N ranks out twice: a
dense generator (attention; EP axis 1) and an expert generator (routed experts; CP axis 1,
TP = ETP, DP = EDP). Every process group is "the ranks that agree on all axes but the masked
ones", listed in a fixed generator order. Wrong-group bugs are silent (a gradient averaged over
ranks holding different experts trains a different model), so this module reproduces that
order exactly (Megatron-LM dev@d48bd6be megatron/core/parallel_state.py: RankGenerator,
generate_masked_orthogonal_rank_groups, initialize_model_parallel).

A rank's coordinates and groups are derived from strides (O(number of axes) per coordinate),
so one rank's view of a 131,072-rank job needs no enumeration; full listings are linear in N.
No torch and no sympy at import time: `moeplan check` must start fast.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from functools import cached_property, lru_cache
from math import prod
from typing import TYPE_CHECKING, Any, Literal

from planner.degrees import Degrees

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Iterable

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
GTP_AXIS = "gtp_remat"
ORDER_TOKENS = ("tp", "cp", "ep", "dp", "pp", GTP_AXIS)
# Megatron appends the axes an order string leaves out in its size map's key order.
_APPEND_ORDER = ("tp", "pp", "dp", "ep", "cp", GTP_AXIS)

LayoutName = Literal["dense", "expert"]

# Kinds built directly from one generator token: kind -> (layout, token).
_TOKEN_KINDS: dict[str, tuple[LayoutName, str]] = {
    "gtp_remat": ("dense", "gtp_remat"),
    "dp_cp": ("dense", "dp-cp"),
    "dp": ("dense", "dp"),
    "dp_gtp_remat": ("dense", "gtp_remat-dp"),
    "dp_cp_gtp_remat": ("dense", "gtp_remat-dp-cp"),
    "cp": ("dense", "cp"),
    "mp": ("dense", "tp-gtp_remat-pp"),
    "tp": ("dense", "tp"),
    "pp": ("dense", "pp"),
    "tp_dp_cp": ("dense", "tp-gtp_remat-dp-cp"),
    "tp_dp": ("dense", "tp-gtp_remat-dp"),
    "tp_cp": ("dense", "tp-cp"),
    "expt_gtp_remat": ("expert", "gtp_remat"),
    "ep": ("expert", "ep"),
    "expt_tp": ("expert", "tp"),
    "tp_ep": ("expert", "tp-ep"),
    "tp_ep_pp": ("expert", "tp-ep-pp"),
    "tp_ep_pp_with_egtp_remat": ("expert", "tp-ep-gtp_remat-pp"),
    "expt_dp": ("expert", "dp"),
    "expt_dp_gtp_remat": ("expert", "gtp_remat-dp"),
}

# Every kind in Megatron's creation order, with how it is built (Megatron-LM main@d98e8a64
# megatron/core/parallel_state.py initialize_model_parallel; dev lacks the gtp_remat kinds).
KIND_SOURCES: dict[str, tuple[LayoutName, str]] = {
    "gtp_remat": ("dense", "gtp_remat"),
    "dp_cp": ("dense", "dp-cp"),
    "intra_dp_cp": ("dense", "dp_cp cut in I slices"),
    "hybrid_dp_cp": ("dense", "dp_cp cut in chunks of 2, 4, …"),
    "dynamic_dp_cp": ("dense", "dp_cp cut in chunks of 1, 2, 4, …"),
    "dp": ("dense", "dp"),
    "dp_gtp_remat": ("dense", "gtp_remat-dp"),
    "dp_cp_gtp_remat": ("dense", "gtp_remat-dp-cp"),
    "cp": ("dense", "cp"),
    "hcp": ("dense", "levels of each cp group"),
    "mp": ("dense", "tp-gtp_remat-pp"),
    "tp": ("dense", "tp"),
    "pp": ("dense", "pp"),
    "embd": ("dense", "embedding stages of pp"),
    "pos_embd": ("dense", "first stage of pp"),
    "tp_dp_cp": ("dense", "tp-gtp_remat-dp-cp"),
    "tp_dp": ("dense", "tp-gtp_remat-dp"),
    "tp_cp": ("dense", "tp-cp"),
    "expt_gtp_remat": ("expert", "gtp_remat"),
    "ep": ("expert", "ep"),
    "expt_tp": ("expert", "tp (size ETP)"),
    "tp_ep": ("expert", "tp-ep"),
    "tp_ep_pp": ("expert", "tp-ep-pp"),
    "tp_ep_pp_with_egtp_remat": ("expert", "tp-ep-gtp_remat-pp"),
    "expt_dp": ("expert", "dp (size EDP)"),
    "intra_expt_dp": ("expert", "expt_dp level 0 [EDP/I, I]"),
    "inter_dist_opt": ("expert", "expt_dp level 1 [EDP/I, I]"),
    "expt_dp_gtp_remat": ("expert", "gtp_remat-dp"),
    "intra_dist_opt": ("expert", "tp-ep-pp joined EDP/I at a time"),
}
KIND_ORDER: tuple[str, ...] = tuple(KIND_SOURCES)

# Symbols of the coordinate formulas (the V4-Pro layout reads r = c + 2·d_a = e + 64·d_e).
_SYMBOLS: dict[LayoutName, dict[str, str]] = {
    "dense": {"tp": "t", GTP_AXIS: "g", "cp": "c", "ep": "e", "dp": "d_a", "pp": "p"},
    "expert": {"tp": "t_e", GTP_AXIS: "g_e", "cp": "c", "ep": "e", "dp": "d_e", "pp": "p"},
}


class GridError(ValueError):
    """The layout cannot be built, or Megatron would reject it while building groups."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# --------------------------------------------------------------------------- spec


@dataclass(frozen=True)
class GridSpec(Degrees):
    """The layout degrees plus every other setting that decides group membership. DP and EDP are
    exact here (a GridError names what does not divide); everything else Megatron refuses while
    building groups is in `layout_problems`."""

    order: str = DEFAULT_ORDER
    hcp_sizes: tuple[int, ...] | None = None
    # Power-of-two DP×CP chunk groups: "hybrid" (Megatron-LM main / megatron-core 0.16.1
    # --hybrid-context-parallel) or "dynamic" (dev --dynamic-context-parallel).
    dp_cp_chunks: Literal["none", "hybrid", "dynamic"] = "none"
    dist_opt_instances: int = 1
    tied_embeddings: bool = True
    mtp_stages: tuple[int, ...] = ()
    embedding_rule: Literal["gpt", "core"] = "gpt"
    moe_layers_by_stage: tuple[tuple[int, ...], ...] = ()

    @cached_property
    def degrees(self) -> Degrees:
        """The layout degrees alone, as the schema and the rule facts see them."""
        return Degrees(**{f.name: getattr(self, f.name) for f in fields(Degrees)})

    @property
    def dp(self) -> int:
        if not self.dense_divides:
            raise GridError(self.problems()[:1])
        return super().dp

    @property
    def edp(self) -> int:
        if not self.expert_divides:
            raise GridError(self.problems()[-1:])
        return super().edp

    @property
    def gtp_active(self) -> bool:
        return self.gtp > 1 or self.egtp > 1

    def embedding_stages(self) -> tuple[int, ...]:
        """Pipeline stages whose ranks join the embedding group.

        `gpt` is pretrain_gpt's rule (first stage; last stage when tied; MTP stages: Megatron-LM
        dev@d48bd6be pretrain_gpt.py get_embedding_ranks); `core` is Megatron-Core's default (first
        and last stage: megatron/core/parallel_state.py default_embedding_ranks).
        """
        last = self.pp - 1
        if self.embedding_rule == "core":
            return (0,) if self.pp == 1 else (0, last)
        stages = {0}
        if self.pp > 1 and self.tied_embeddings:
            stages.add(last)
        stages.update(self.mtp_stages)
        return tuple(sorted(stages))

    def moe_layers_of_stage(self, stage: int) -> tuple[int, ...]:
        if 0 <= stage < len(self.moe_layers_by_stage):
            return tuple(self.moe_layers_by_stage[stage])
        return ()


# --------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    """One RankGenerator: axis names in order-string order (leftmost fastest) and sizes."""

    name: LayoutName
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


@lru_cache(maxsize=4096)
def _stage_ranks(dense: Layout, stage: int) -> tuple[int, ...]:
    """Ranks of one pipeline stage of a dense layout, ascending (remembered: estimates ask for
    every stage of the same layouts again and again)."""
    pp_index = dense.axes.index("pp")
    unmasked = tuple(i for i in range(len(dense.axes)) if i != pp_index)
    offsets = _mixed_radix_offsets(tuple((dense.sizes[i], dense.strides[i]) for i in unmasked))
    base = stage * dense.strides[pp_index]
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


def _layout_axes(
    name: LayoutName, order: str, sizes: dict[str, int]
) -> tuple[Layout | None, list[str]]:
    tokens, problems = _parse_order(order)
    if problems:
        return None, problems
    tokens = _inject_gtp_axis(tokens, "tp" if name == "dense" else "ep")
    for axis in _APPEND_ORDER:
        if axis in tokens:
            continue
        if sizes[axis] != 1:
            label = {"dense": "dense", "expert": "expert"}[name]
            problems.append(
                f"{label} {axis} size is {sizes[axis]} but order '{order}' does not name "
                f"'{axis}' (Megatron RankGenerator raises RuntimeError)"
            )
        tokens.append(axis)
    if problems:
        return None, problems
    return Layout(name, tuple(tokens), tuple(sizes[t] for t in tokens)), []


@lru_cache(maxsize=4096)
def dense_layout(spec: GridSpec) -> Layout:
    """The dense ("decoder") generator: EP axis 1 (remembered per spec, as `expert_layout`:
    rules and budgets ask for the same layouts again and again)."""
    layout, problems = _layout_axes(
        "dense",
        spec.order,
        {"tp": spec.tp, "cp": spec.cp, "ep": 1, "dp": spec.dp, "pp": spec.pp,
         GTP_AXIS: spec.gtp},
    )
    if layout is None:
        raise GridError(problems)
    return layout


@lru_cache(maxsize=4096)
def expert_layout(spec: GridSpec) -> Layout:
    """The expert generator: CP axis 1, TP = ETP, DP = EDP, gtp_remat = EGTP."""
    layout, problems = _layout_axes(
        "expert",
        spec.order,
        {"tp": spec.etp, "cp": 1, "ep": spec.ep, "dp": spec.edp, "pp": spec.pp,
         GTP_AXIS: spec.egtp},
    )
    if layout is None:
        raise GridError(problems)
    return layout


# --------------------------------------------------------------------------- checks


def order_dp_rule_holds(spec: GridSpec) -> bool:
    """initialize_model_parallel's first assertion: raw order ends with pp, or PP == 1, or EDP == DP.

    Megatron tests the order string as given (not lower-cased). When DP or EDP cannot be
    computed Megatron fails earlier on divisibility, so this check has nothing to report.
    """
    if spec.order.endswith("pp") or spec.pp == 1:
        return True
    try:
        return spec.dp == spec.edp
    except GridError:
        return True


def pp_group_mismatch(spec: GridSpec) -> tuple[list[list[int]], list[list[int]]] | None:
    """initialize_model_parallel's second assertion: None when dense and expert pp groups agree.

    Returns (dense pp groups, expert pp groups) when they differ. A spec whose layouts
    cannot be built at all returns None; `layout_problems` reports why.
    """
    if spec.order.endswith("pp"):
        return None  # pp-last: both generators give the pp groups of stride N/PP
    try:
        dense, expert = dense_layout(spec), expert_layout(spec)
    except GridError:
        return None
    dense_pp, expert_pp = dense.groups("pp"), expert.groups("pp")
    return None if dense_pp == expert_pp else (dense_pp, expert_pp)


def layout_problems(spec: GridSpec) -> list[str]:
    """Every reason the groups cannot be computed or Megatron would refuse to build them."""
    degrees = spec.degrees  # the plain degrees: DP and EDP below are whole once they divide
    problems = degrees.problems(also={"dist_opt_instances": spec.dist_opt_instances})
    if problems:
        return problems
    for build in (dense_layout, expert_layout):
        try:
            build(spec)
        except GridError as err:
            problems.extend(p for p in err.problems if p not in problems)
    if spec.hcp_sizes:
        if any(s < 1 for s in spec.hcp_sizes) or prod(spec.hcp_sizes) != spec.cp:
            problems.append(
                f"hierarchical_context_parallel_sizes {list(spec.hcp_sizes)} must be positive "
                f"and multiply to CP = {spec.cp}"
            )
    if spec.dp_cp_chunks != "none" and degrees.dp_cp_size % 2:
        problems.append(
            f"{spec.dp_cp_chunks} context parallelism needs an even DP·CP, got "
            f"{degrees.dp}·{spec.cp} = {degrees.dp_cp_size}"
        )
    instances = spec.dist_opt_instances
    if instances > 1:
        if spec.gtp_active:
            problems.append(
                f"GTP {spec.gtp} / EGTP {spec.egtp} > 1 requires "
                f"num_distributed_optimizer_instances = 1, got {instances}"
            )
        if degrees.dp_cp_size % instances:
            problems.append(
                f"DP·CP = {degrees.dp_cp_size} is not divisible by "
                f"num_distributed_optimizer_instances = {instances}"
            )
        if degrees.edp % instances:
            problems.append(
                f"EDP = {degrees.edp} is not divisible by "
                f"num_distributed_optimizer_instances = {instances}"
            )
    bad_mtp = [s for s in spec.mtp_stages if not 0 <= s < spec.pp]
    if bad_mtp:
        problems.append(f"MTP stages {bad_mtp} are outside the {spec.pp} pipeline stages")
    if problems:
        return problems
    if not order_dp_rule_holds(spec):
        problems.append(
            f"order '{spec.order}' does not end with pp, PP = {spec.pp} > 1 and "
            f"DP = {spec.dp} != EDP = {spec.edp}: Megatron requires equal attention and MoE "
            "data-parallel sizes without pp-last rank ordering"
        )
        return problems  # Megatron's first assertion stops group building here
    mismatch = pp_group_mismatch(spec)
    if mismatch is not None:
        problems.append(
            f"dense pp groups {_abbreviate(mismatch[0])} differ from expert pp groups "
            f"{_abbreviate(mismatch[1])} under order '{spec.order}'"
        )
    return problems


def _abbreviate(groups: list[list[int]], limit: int = 3) -> str:
    shown = ", ".join(str(g) for g in groups[:limit])
    return f"[{shown}{', …' if len(groups) > limit else ''}]"


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
class LayoutFormula:
    """A layout's rank as a linear form of its coordinates, derived from its strides."""

    layout: LayoutName
    terms: tuple[tuple[int, str, int], ...]  # (stride, symbol, size), fastest first
    expression: Any  # sympy Expr: global rank
    stage_expression: Any  # sympy Expr: rank inside one stage (p substituted)
    stage: int
    inverse: dict[str, Any]  # symbol -> sympy Expr of r

    def text(self, *, stage: bool = False) -> str:
        """`r = c + 2*d_a + 128*p`, terms fastest axis first (the order sympy would lose)."""
        pieces = []
        for stride, symbol, _size in self.terms:
            if symbol == "p" and stage:
                if self.stage:
                    pieces.insert(0, str(stride * self.stage))
                continue
            pieces.append(symbol if stride == 1 else f"{stride}*{symbol}")
        return "r = " + (" + ".join(pieces) or "0")

    def ranges(self, *, stage: bool = False) -> str:
        return ", ".join(
            f"{sym}∈[0,{size - 1}]" for _st, sym, size in self.terms if not (stage and sym == "p")
        )


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
    formulas: dict[str, LayoutFormula]
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
                    "inverse": {sym: str(expr) for sym, expr in f.inverse.items()},
                }
                for name, f in self.formulas.items()
            },
        }


def _dp_cp_chunk_sizes(mode: str, width: int) -> list[int]:
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


class Grid:
    """Both layouts of one spec and every process group Megatron would build from them."""

    def __init__(self, spec: GridSpec) -> None:
        problems = layout_problems(spec)
        if problems:
            raise GridError(problems)
        self.spec = spec
        self.dense = dense_layout(spec)
        self.expert = expert_layout(spec)
        self.degrees = spec.degrees
        self.dp, self.edp = self.degrees.dp, self.degrees.edp
        levels = len(spec.hcp_sizes) if spec.hcp_sizes else 0
        self.hcp_kinds = tuple(f"hcp_l{i}" for i in range(levels))
        # Families: kinds made of several differently sized members, listed member by member.
        self.members: dict[str, tuple[str, ...]] = {"hcp": self.hcp_kinds}
        if spec.dp_cp_chunks != "none":
            family = f"{spec.dp_cp_chunks}_dp_cp"
            sizes = _dp_cp_chunk_sizes(spec.dp_cp_chunks, self.degrees.dp_cp_size)
            self.members[family] = tuple(f"{family}_{k}" for k in sizes)
        self._member_of = {m: f for f, ms in self.members.items() for m in ms}
        self.kinds: tuple[str, ...] = tuple(k for k in KIND_ORDER if self._enabled(k))

    # ----------------------------------------------------------------- catalogue

    def _enabled(self, kind: str) -> bool:
        s = self.spec
        # gtp_remat / expt_gtp_remat exist even at size 1 (singleton groups); the other GTP
        # kinds are aliases of their non-GTP twins until GTP/EGTP > 1.
        if kind in ("dp_gtp_remat", "dp_cp_gtp_remat"):
            return s.gtp > 1
        if kind in ("tp_ep_pp_with_egtp_remat", "expt_dp_gtp_remat"):
            return s.egtp > 1
        if kind in ("intra_dp_cp", "intra_expt_dp", "inter_dist_opt"):
            return s.dist_opt_instances > 1
        if kind in ("hcp", "hybrid_dp_cp", "dynamic_dp_cp"):
            return bool(self.members.get(kind))
        return True

    def listing_kinds(self) -> list[str]:
        """Enabled kinds in creation order, each family replaced by its members."""
        out: list[str] = []
        for kind in self.kinds:
            out.extend(self.members.get(kind, (kind,)))
        return out

    def layout_of(self, kind: str) -> Layout:
        return self.dense if KIND_SOURCES[self.base_kind(kind)][0] == "dense" else self.expert

    def base_kind(self, kind: str) -> str:
        """The catalogue kind (a KIND_SOURCES key) a listed kind belongs to."""
        if kind in self._member_of:
            return self._member_of[kind]
        if kind not in self.kinds:
            known = ", ".join(self.listing_kinds())
            raise GridError([f"unknown or disabled group kind '{kind}'; this layout has: {known}"])
        return kind

    # ----------------------------------------------------------------- listings

    def groups(self, kind: str) -> list[list[int]]:
        """Every group of a kind, in the order Megatron creates them."""
        base = self.base_kind(kind)
        s = self.spec
        if base in _TOKEN_KINDS:
            layout, token = _TOKEN_KINDS[base]
            return (self.dense if layout == "dense" else self.expert).groups(token)
        if base == "intra_dp_cp":
            width = self.degrees.dp_cp_size // s.dist_opt_instances
            return [g[i * width:(i + 1) * width]
                    for g in self.dense.groups("dp-cp") for i in range(s.dist_opt_instances)]
        if base == "hcp":
            sizes = s.hcp_sizes or ()
            levels = range(len(sizes)) if kind == "hcp" else [int(kind.removeprefix("hcp_l"))]
            return [sub for g in self.dense.groups("cp") for level in levels
                    for sub in _hierarchical_groups(g, sizes, level)]
        if base in ("hybrid_dp_cp", "dynamic_dp_cp"):
            chunks = self._chunk_sizes(kind)
            return [g[i:i + k] for g in self.dense.groups("dp-cp") for k in chunks
                    for i in range(0, len(g), k)]
        if base == "embd":
            stages = s.embedding_stages()
            return [[g[i] for i in stages] for g in self.dense.groups("pp")]
        if base == "pos_embd":
            return [[g[0]] for g in self.dense.groups("pp")]
        if base in ("intra_expt_dp", "inter_dist_opt"):
            sizes = self._partial_edp_sizes()
            level = 0 if base == "intra_expt_dp" else 1
            return [sub for g in self.expert.groups("dp")
                    for sub in _hierarchical_groups(g, sizes, level)]
        if base == "intra_dist_opt":
            if s.gtp_active:
                return [list(range(s.world_size))]
            width = self.edp // s.dist_opt_instances
            sources = self.expert.groups("tp-ep-pp")
            return [[r for g in sources[i:i + width] for r in g]
                    for i in range(0, len(sources), width)]
        raise AssertionError(f"kind {kind} has no builder")  # pragma: no cover

    def all_groups(self) -> dict[str, list[list[int]]]:
        """Every enabled kind, in creation order."""
        return {kind: self.groups(kind) for kind in self.kinds}

    def group_size(self, kind: str) -> int:
        base = self.base_kind(kind)
        s = self.spec
        if base in _TOKEN_KINDS:
            layout, token = _TOKEN_KINDS[base]
            return (self.dense if layout == "dense" else self.expert).group_size(token)
        sizes = {
            "intra_dp_cp": self.degrees.dp_cp_size // s.dist_opt_instances,
            "embd": len(s.embedding_stages()),
            "pos_embd": 1,
            "intra_expt_dp": self.edp // s.dist_opt_instances,
            "inter_dist_opt": s.dist_opt_instances,
            "intra_dist_opt": s.world_size // s.dist_opt_instances,
        }
        if base == "hcp":
            if kind == "hcp":
                raise GridError([f"hcp levels differ in size; ask for {self.hcp_kinds}"])
            return (s.hcp_sizes or ())[int(kind.removeprefix("hcp_l"))]
        if base in ("hybrid_dp_cp", "dynamic_dp_cp"):
            if kind == base:
                raise GridError([f"{base} chunks differ in size; ask for {self.members[base]}"])
            return self._chunk_sizes(kind)[0]
        return sizes[base]

    def num_groups(self, kind: str) -> int:
        base = self.base_kind(kind)
        s = self.spec
        if base in ("embd", "pos_embd"):
            return s.ranks_per_stage
        if base == "hcp" and kind == "hcp":
            return sum(s.world_size // size for size in s.hcp_sizes or ())
        if base in ("hybrid_dp_cp", "dynamic_dp_cp"):
            width = self.degrees.dp_cp_size  # a chunk size need not divide DP·CP: the last chunk is short
            return s.world_size // width * sum(-(-width // k) for k in self._chunk_sizes(kind))
        return s.world_size // self.group_size(kind)

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
        base = self.base_kind(kind)
        s = self.spec
        if base in _TOKEN_KINDS:
            layout, token = _TOKEN_KINDS[base]
            return (self.dense if layout == "dense" else self.expert).group_containing(token, rank)
        if base == "intra_dp_cp":
            width = self.degrees.dp_cp_size // s.dist_opt_instances
            group = self.dense.group_containing("dp-cp", rank)
            start = self.dense.position_in_group("dp-cp", rank) // width * width
            return group[start:start + width]
        if base == "hcp":
            if kind == "hcp":
                raise GridError([f"hcp has one group per level; ask for {self.hcp_kinds}"])
            level = int(kind.removeprefix("hcp_l"))
            group = self.dense.group_containing("cp", rank)
            position = self.dense.position_in_group("cp", rank)
            return _hierarchical_member(group, s.hcp_sizes or (), level, position)
        if base in ("hybrid_dp_cp", "dynamic_dp_cp"):
            if kind == base:
                raise GridError([f"{base} has one group per chunk size; ask for {self.members[base]}"])
            k = self._chunk_sizes(kind)[0]
            group = self.dense.group_containing("dp-cp", rank)
            start = self.dense.position_in_group("dp-cp", rank) // k * k
            return group[start:start + k]
        if base in ("embd", "pos_embd"):
            stages = s.embedding_stages() if base == "embd" else (0,)
            if self.dense.coordinate(rank, "pp") not in stages:
                return []
            pp_group = self.dense.group_containing("pp", rank)
            return [pp_group[i] for i in stages]
        if base in ("intra_expt_dp", "inter_dist_opt"):
            group = self.expert.group_containing("dp", rank)
            position = self.expert.position_in_group("dp", rank)
            level = 0 if base == "intra_expt_dp" else 1
            return _hierarchical_member(group, self._partial_edp_sizes(), level, position)
        if base == "intra_dist_opt":
            if s.gtp_active:
                return list(range(s.world_size))
            width = self.edp // s.dist_opt_instances
            first = self.expert.group_index("tp-ep-pp", rank) // width * width
            return [r for q in range(first, first + width)
                    for r in self.expert.group_at("tp-ep-pp", q)]
        raise AssertionError(f"kind {kind} has no arithmetic")  # pragma: no cover

    def _chunk_sizes(self, kind: str) -> list[int]:
        """Chunk sizes of a DP×CP chunk family, or the one size of a member."""
        base = self.base_kind(kind)
        if kind == base:
            return [int(m.rsplit("_", 1)[1]) for m in self.members[base]]
        return [int(kind.rsplit("_", 1)[1])]

    def _partial_edp_sizes(self) -> tuple[int, int]:
        instances = self.spec.dist_opt_instances
        return (self.edp // instances, instances)

    def expert_ownership(self, rank: int) -> ExpertOwnership:
        """Global expert ids this rank holds per MoE layer of its stage, and its replicas."""
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
            replica_peers=tuple(x.group_containing("dp", rank)),
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
        return list(_stage_ranks(self.dense, stage))

    def formulas(self, stage: int = 0) -> dict[str, LayoutFormula]:
        return {"dense": layout_formula(self.dense, stage), "expert": layout_formula(self.expert, stage)}


def _shown_coords(layout: Layout, rank: int, hidden: str) -> dict[str, int]:
    """Coordinates a reader cares about: the forced-1 axis and idle gtp axis are left out."""
    coords = layout.coordinates(rank)
    return {a: v for a, v in coords.items()
            if a != hidden and not (a == GTP_AXIS and layout.size(a) == 1)}


def layout_formula(layout: Layout, stage: int = 0) -> LayoutFormula:
    """r as Σ stride·coordinate over axes of size > 1, plus each coordinate as a function of r."""
    import sympy  # lazy: 0.25 s that `moeplan check` should not pay

    names = _SYMBOLS[layout.name]
    # Plain symbols, so callers can substitute by name: expr.subs({"c": 1, "d_a": 5}).
    r = sympy.Symbol("r")
    terms = tuple(
        (stride, names[axis], size)
        for axis, size, stride in zip(layout.axes, layout.sizes, layout.strides, strict=True)
        if size > 1
    )
    symbols = {sym: sympy.Symbol(sym) for _s, sym, _z in terms}
    expression = sympy.Add(*(stride * symbols[sym] for stride, sym, _z in terms))
    p = symbols.get("p")
    stage_expression = expression.subs(p, stage) if p is not None else expression
    inverse = {
        sym: sympy.Mod(sympy.floor(r / stride), size) if stride > 1 else sympy.Mod(r, size)
        for stride, sym, size in terms
    }
    return LayoutFormula(layout.name, terms, expression, stage_expression, stage, inverse)


def nodes_spanned(group: Iterable[int], ranks_per_node: int) -> int:
    """How many nodes a group touches when ranks fill nodes in order (launcher default)."""
    return len({r // ranks_per_node for r in group})


# --------------------------------------------------------------------------- config


def grid_spec_from_config(cfg: Any) -> GridSpec:
    """Collect the layout degrees, embedding stages and MoE layers of a validated Config."""
    p, t, m = cfg.parallel, cfg.training, cfg.model
    moe_layers, mtp_stages = _stage_layers(cfg)
    hcp = p.hierarchical_context_parallel_sizes
    return GridSpec(
        **asdict(Degrees.from_config(cfg)),
        order=p.order,
        hcp_sizes=tuple(hcp) if hcp else None,
        dp_cp_chunks=(
            "dynamic" if getattr(p, "dynamic_context_parallel", False)
            else "hybrid" if getattr(p, "hybrid_context_parallel", False) else "none"
        ),
        dist_opt_instances=t.num_distributed_optimizer_instances,
        tied_embeddings=not m.untie_embeddings_and_output_weights,
        mtp_stages=mtp_stages,
        embedding_rule=getattr(p, "embedding_ranks_rule", "gpt"),
        moe_layers_by_stage=moe_layers,
    )


def _stage_layers(cfg: Any) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """MoE layer ids per physical stage, and the stages whose ranks hold MTP layers.

    Megatron's `get_mtp_ranks` puts MTP on the last stage unless a pipeline layout says
    where it is; without a usable split the MoE lists stay empty.
    """
    from planner.layout.pipeline import SplitError, stage_split

    pp = cfg.parallel.pp
    has_mtp = (getattr(cfg.model, "mtp_num_layers", 0) or 0) > 0
    last_stage_mtp = (pp - 1,) if has_mtp else ()
    try:
        split = stage_split(cfg)
    except SplitError:
        return (), last_stage_mtp
    moe: list[set[int]] = [set() for _ in range(pp)]
    mtp: set[int] = set()
    for stage in split.stages:
        if 0 <= stage.stage < pp:
            moe[stage.stage].update(stage.moe_layers)
            if stage.mtp_layers:
                mtp.add(stage.stage)
    if not getattr(cfg.parallel, "pipeline_model_parallel_layout", None):
        mtp = set(last_stage_mtp)
    return tuple(tuple(sorted(s)) for s in moe), tuple(sorted(mtp))

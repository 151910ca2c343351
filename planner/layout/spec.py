"""The grid spec: every setting that decides group membership, and Megatron's checks on it.

A `GridSpec` is the layout degrees (planner/degrees.py) plus the order string, hierarchical CP,
DP×CP chunks, distributed-optimizer instances and embedding stages. From it come the two generators
Megatron-Core builds (Megatron-LM dev@d48bd6be megatron/core/parallel_state.py
initialize_model_parallel: `decoder_rank_generator` with EP axis 1 and `expert_decoder_rank_generator`
with CP axis 1, TP = ETP, DP = EDP) and `layout_problems`, every reason Megatron would refuse to
build the groups. The rules (PAR, DOP) and `Grid` read both; this module never lists groups by kind.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import cached_property, lru_cache
from math import prod
from typing import TYPE_CHECKING, Any, Literal

from planner.degrees import Degrees
from planner.layout.rank_generator import GTP_AXIS, GridError, RankGenerator, generator_from_order
from planner.memo import Memo, section_key

if TYPE_CHECKING:
    from planner.config.schema import Config

DEFAULT_ORDER = "tp-cp-ep-dp-pp"


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

    def to_json(self) -> dict[str, Any]:
        """Every field, as JSON writes it (tuples become lists): what a cached grid is read from."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GridSpec:
        """The spec `to_json` described; a missing or unknown field raises TypeError."""
        return cls(**{name: _tuples(value) for name, value in data.items()})

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



def _tuples(value: Any) -> Any:
    """JSON's lists back as the tuples a spec holds (nested: the MoE layers of each stage)."""
    return tuple(_tuples(item) for item in value) if isinstance(value, list) else value


@lru_cache(maxsize=4096)
def dense_generator(spec: GridSpec) -> RankGenerator:
    """The dense ("decoder") generator: EP axis 1 (remembered per spec, as `expert_generator`:
    rules and budgets ask for the same generators again and again)."""
    generator, problems = generator_from_order(
        "dense",
        spec.order,
        {"tp": spec.tp, "cp": spec.cp, "ep": 1, "dp": spec.dp, "pp": spec.pp,
         GTP_AXIS: spec.gtp},
    )
    if generator is None:
        raise GridError(problems)
    return generator


@lru_cache(maxsize=4096)
def expert_generator(spec: GridSpec) -> RankGenerator:
    """The expert generator: CP axis 1, TP = ETP, DP = EDP, gtp_remat = EGTP."""
    generator, problems = generator_from_order(
        "expert",
        spec.order,
        {"tp": spec.etp, "cp": 1, "ep": spec.ep, "dp": spec.edp, "pp": spec.pp,
         GTP_AXIS: spec.egtp},
    )
    if generator is None:
        raise GridError(problems)
    return generator


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
        dense, expert = dense_generator(spec), expert_generator(spec)
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
    for build in (dense_generator, expert_generator):
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


# --------------------------------------------------------------------------- config


def grid_spec(cfg: Config) -> GridSpec:
    """`grid_spec_from_config`, remembered by what it reads (`_SPECS`): search asks for every
    candidate's, in its budget and in the rules, for a handful of layouts."""
    from planner.layout.pipeline import split_key  # as `_stage_layers`: only when asked

    key = (split_key(cfg), section_key(cfg.parallel),
           cfg.training.num_distributed_optimizer_instances)
    return _SPECS.get(key, grid_spec_from_config, cfg)


# Grid specs by what they read: the model and the pipeline split (`split_key`), the parallel
# section and the distributed optimizer's instances.
_SPECS: Memo[Any, GridSpec] = Memo("grid specs", 4096)


def grid_spec_from_config(cfg: Config) -> GridSpec:
    """Collect the layout degrees, embedding stages and MoE layers of a validated Config."""
    p, t, m = cfg.parallel, cfg.training, cfg.model
    moe_layers, mtp_stages = _stage_layers(cfg)
    hcp = p.hierarchical_context_parallel_sizes
    return GridSpec(
        **asdict(Degrees.from_config(cfg)),
        order=p.order,
        hcp_sizes=tuple(hcp) if hcp else None,
        dp_cp_chunks=(
            "dynamic" if p.dynamic_context_parallel
            else "hybrid" if p.hybrid_context_parallel else "none"
        ),
        dist_opt_instances=t.num_distributed_optimizer_instances,
        tied_embeddings=not m.untie_embeddings_and_output_weights,
        mtp_stages=mtp_stages,
        embedding_rule=p.embedding_ranks_rule,
        moe_layers_by_stage=moe_layers,
    )


def _stage_layers(cfg: Any) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """MoE layer ids per physical stage, and the stages whose ranks hold MTP layers.

    Megatron's `get_mtp_ranks` puts MTP on the last stage unless a pipeline layout says
    where it is; without a usable split the MoE lists stay empty.
    """
    # Imported here: the pipeline split reads the schema, which a cached grid spec never loads.
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

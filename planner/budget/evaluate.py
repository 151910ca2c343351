"""The evaluator of the formula book: one config's globals once, then per stage, then per rank.

`Accounting` evaluates a book (or the subset some targets need) exactly (ints and rationals) or in
floats; stages and ranks that read alike share one evaluation. `Budget` is one evaluated quantity
with its formula and values (for `--explain`). planner/accounting.py, the entry, builds the
commands' budgets from it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import TYPE_CHECKING, Any

from planner.budget.book import FormulaBook, formula_book, read_items
from planner.budget.explain import number_text, substitute
from planner.budget.expr import Evaluator, Number, Quantity, sympy_expression
from planner.budget.placement import placement
from planner.budget.symbols import Holdings, global_values, holdings, variant_of
from planner.budget.variant import Variant
from planner.config.schema import Config
from planner.layout.grid import Grid
from planner.layout.nodes import Places
from planner.layout.pipeline import Chunk, SplitError, StageSplit, stage_split
from planner.layout.rank_generator import GridError
from planner.layout.schedule import Peak, stage_peak
from planner.layout.spec import grid_spec
from planner.memo import HeldByIdentity, Memo

if TYPE_CHECKING:
    from planner.layout.grid import Grid


class BudgetError(ValueError):
    """The budgets cannot be computed: the pipeline split or the grids are not buildable."""


@dataclass(frozen=True)
class Budget:
    """One evaluated quantity for one scope: its value, how it was computed, and for whom.

    `value` is an int, or an exact Fraction when not whole (it compares equal to the sympy
    Rational; `rational` converts). `substitution` is rendered on first use.
    """

    name: str
    value: Number
    unit: str
    formula: str
    scope: str
    stage: int | None
    category: str = ""
    doc: str = ""
    values: Mapping[str, Number] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def substitution(self) -> str:
        return substitute(self.formula, self.values)

    @property
    def rational(self) -> Any:
        import sympy

        return sympy.Rational(self.value)

    @property
    def expression(self) -> Any:
        """The sympy expression of the formula."""
        return sympy_expression(self.formula)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": json_value(self.value), "unit": self.unit,
                "formula": self.formula, "scope": self.scope, "stage": self.stage}


def json_value(value: Any) -> int | str:
    """Whole numbers as JSON numbers, other rationals as exact "p/q" strings."""
    if isinstance(value, int):
        return value
    text = str(value)
    return int(text) if text.lstrip("-").isdigit() else text


# What a model chunk's activations alone need (`Accounting._chunk_book`): the schedule replay sums
# them into a stage's activation peak.
CHUNK_PARTS = ("act_per_microbatch", "microbatches")


class Accounting:
    """Evaluates one config's formula book: globals once, then per stage, then per rank."""

    def __init__(self, cfg: Config, targets: tuple[str, ...] | None = None,
                 exact: bool = True) -> None:
        """`exact=False` evaluates in floats (search's ranking only; see planner/budget/expr.py)."""
        self.cfg = cfg
        self.exact = exact
        self.split, self.holdings, self.variant, self.inputs = _front(cfg)
        full = formula_book(self.variant)
        self.book = full.subset(targets) if targets else full
        self._peaks: dict[int, Peak] = {}
        self._chunk_results: dict[tuple[Any, ...], dict[str, Number]] = {}
        # Books without the activation peak (the time subset) skip the schedule replay, and
        # stages (ranks) with equal inputs share one evaluation.
        self._read = self.book.reads  # inputs a formula reads
        self._needs_peak = not self._read.isdisjoint(("live_passes", "act_live_peak"))
        self._envs: dict[tuple[Any, ...], dict[str, Number]] = {}
        self.placed_keys: dict[int, tuple[Any, ...]] = {}  # stage -> what its evaluation read
        # stage -> what a model chunk's evaluation reads of its stage besides the chunk's own
        # counts (planner/budget/pipeline.py chunk_times): the rank's placement, as every count of
        # the stage is replaced by the chunk's; the whole stage where its env holds the
        # activation peak (not a count).
        self.chunk_keys: dict[int, Any] = {}
        self._full = full
        # In floats the rational inputs are turned into floats once here, not by every level's
        # function that reads them (each casts its inputs; a float casts to itself).
        self._inputs = self.inputs if exact else _FLOAT_INPUTS.get(self.inputs, _float_inputs)
        try:
            self.globals = self._evaluate("global", dict(self._inputs))
        except ZeroDivisionError as exc:
            raise BudgetError(f"a layout degree is zero ({exc})") from None

    @cached_property
    def _chunk_evaluator(self) -> Evaluator:
        """Each model chunk's activations alone, compiled only when a schedule is replayed (a
        book without the activation peak, e.g. model_size's parameters, never needs it)."""
        return self._chunk_book.evaluator(None, self.exact)

    @cached_property
    def _chunk_book(self) -> FormulaBook:
        return self._full.subset(CHUNK_PARTS)

    @property
    def chunk_formula(self) -> str:
        return self._full.by_name["act_per_microbatch"].formula

    def stage_env(self, stage: int, embd_group: list[int] | None = None) -> dict[str, Number]:
        values = dict(self.holdings.stage(stage, embd_group))
        if self._needs_peak:
            peak = self._peak(stage)
            values.update(live_passes=peak.live_passes, act_live_peak=peak.bytes)
        key = ("stage", *self._read_items(values))
        if key not in self._envs:
            env = dict(self.globals)
            env.update(values)
            self._envs[key] = self._evaluate("stage", env)
        env = dict(self._envs[key])
        env.update(values)  # this stage's own counts (those no formula reads may differ)
        return env

    def _read_items(self, values: dict[str, Number]) -> tuple[Any, ...]:
        """The values a formula of the book reads: what decides an evaluation (stages and ranks
        that agree on them share one)."""
        return read_items(values, self._read)

    @property
    def full_book(self) -> FormulaBook:
        """The variant's whole book (`book` when no targets were asked for)."""
        return self._full

    def evaluate_level(self, level: str, env: dict[str, Number]) -> dict[str, Number]:
        """One level's quantities of the book evaluated into `env` (the function `_evaluate`
        uses, compiled once)."""
        return self._evaluate(level, env)

    def _evaluate(self, level: str, env: dict[str, Number]) -> dict[str, Number]:
        env.update(self.book.evaluator(level, self.exact)(env))
        return env

    def schedule(self, stage: int) -> tuple[list[dict[str, Number]], Peak]:
        """Each model chunk of the stage evaluated alone (its activations per microbatch), and the
        peak of live chunks over the stage's pipeline order."""
        chunks = self.split.stages[stage].chunks
        envs = [{**self.inputs, **self.holdings.chunk(c), **self._chunk_alone(c)} for c in chunks]
        return envs, self._peak(stage)

    def _chunk_alone(self, chunk: Chunk) -> dict[str, Number]:
        """The chunk formulas evaluated on one model chunk's counts, shared by the chunks whose
        counts read alike (a stage's chunks mostly hold the same layers)."""
        counts = self.holdings.chunk(chunk)
        key = read_items(counts, self._chunk_book.reads)
        results = self._chunk_results.get(key)
        if results is None:
            results = self._chunk_results[key] = self._chunk_evaluator({**self._inputs, **counts})
        return results

    def _peak(self, stage: int) -> Peak:
        """The stage's activation peak over its pipeline order (`schedule`), once per stage."""
        peak = self._peaks.get(stage)
        if peak is None:
            peak = self._peaks[stage] = self._replay(stage)
        return peak

    def _replay(self, stage: int) -> Peak:
        alone = [self._chunk_alone(c) for c in self.split.stages[stage].chunks]
        par, overlap = self.cfg.parallel, self.cfg.overlap.overlap_moe_expert_parallel_comm
        microbatches = max(1, math.ceil(alone[0]["microbatches"]))  # whole on any valid config
        return stage_peak(par.pp, self.split.vpp, stage, microbatches,
                          [results["act_per_microbatch"] for results in alone],
                          par.microbatch_group_size_per_vp_stage,
                          int(overlap and self.split.vpp > 1))

    def schedule_budgets(self, stage: int, scope: str) -> list[Budget]:
        """Rows that explain act_live_peak: each chunk's activations, then the live sum."""
        envs, peak = self.schedule(stage)
        rows = []
        for chunk, env in zip(self.split.stages[stage].chunks, envs, strict=True):
            held = [f"layers {chunk.layers[0]}-{chunk.layers[-1]}" if chunk.layers else "no layers"]
            held += ["MTP"] * bool(chunk.mtp_layers) + ["embedding"] * chunk.embedding
            held += ["loss"] * chunk.loss
            rows.append(Budget(f"act_chunk.{chunk.virtual}", env["act_per_microbatch"], "bytes",
                               self.chunk_formula, scope, stage, "memory",
                               f"per microbatch: model chunk {chunk.virtual} alone (pipeline chunk "
                               f"{chunk.index}: {', '.join(held)})", env))
        terms = [f"{n} * act_chunk_{v}" for v, n in enumerate(peak.live)]
        total = envs[0]["microbatches"] * self.split.vpp
        rows.append(Budget("act_live_peak", peak.bytes, "bytes", " + ".join(terms), scope, stage,
                           "memory", f"stored activations at the schedule's peak, after forward "
                           f"pass {peak.forward_pass} of {number_text(total)}: live passes of each "
                           "chunk times its activations",
                           {f"act_chunk_{row.name.split('.')[1]}": row.value for row in rows}))
        return rows

    def rank_env(self, stage_env: dict[str, Number], values: dict[str, Number]) -> dict[str, Number]:
        env = dict(stage_env)
        env.update(values)
        return self._evaluate("rank", env)

    def _placed(self, stage: int, embd_group: list[int] | None, values: dict[str, Number],
                values_key: Any) -> tuple[dict[str, Number], dict[str, Number]]:
        """rank_env(stage_env(...)), shared by stages whose inputs and placement are equal (the
        key is kept in `placed_keys`), and this stage's and rank's own facts."""
        counts = self.holdings.stage(stage, embd_group)
        stage_key = ("stage-of", stage) if self._needs_peak else self._read_items(counts)
        key = ("rank", stage_key, values_key)
        if key not in self._envs:
            env = self.stage_env(stage, embd_group)  # a copy of its own: evaluated into in place
            env.update(values)
            self._envs[key] = self._evaluate("rank", env)
        self.placed_keys[stage] = key
        self.chunk_keys[stage] = key if self._needs_peak else values_key
        return self._envs[key], {**counts, **values}

    def placed(self, grid: Grid, stage: int, rank: int,
               node_size: Places) -> tuple[dict[str, Number], dict[str, Number]]:
        """`placed_env` in two parts: every quantity, evaluated once for all stages and ranks that
        read alike (shared: never change it), and the facts of this stage and rank that no
        formula reads (they may differ among those)."""
        model = self.cfg.model
        experts = (model.num_experts, model.moe_router_topk, model.moe_router_num_groups,
                   model.moe_router_group_topk)
        try:
            placed = placement(grid, rank, node_size, experts)
            return self._placed(stage, placed.embd, placed.values, placed.key(self._read))
        except ZeroDivisionError as exc:
            raise BudgetError(f"stage {stage}: a quantity divides by zero ({exc})") from None

    def placed_env(self, grid: Grid, stage: int, rank: int, node_size: Places) -> dict[str, Number]:
        """Every quantity for `rank` on `stage`, its groups placed on nodes of `node_size` GPUs
        (budgets use the node, the time estimate the NVLink domain)."""
        shared, own = self.placed(grid, stage, rank, node_size)
        return {**shared, **own}

    def budget(self, q: Quantity, env: dict[str, Number], scope: str, stage: int | None) -> Budget:
        return Budget(q.name, env[q.ident], q.unit, q.formula, scope, stage, q.category, q.doc,
                      env)


def _front(cfg: Config) -> tuple[StageSplit, Holdings, Variant, dict[str, Number]]:
    """The config's split, holdings, variant and global inputs: what every Accounting of it
    starts from. The last few configs' are kept with the configs themselves (configs are frozen):
    search judges a candidate's memory and times it, two Accountings of one config."""
    return _FRONTS.get(cfg, _make_front)


def _make_front(cfg: Config) -> tuple[StageSplit, Holdings, Variant, dict[str, Number]]:
    try:
        split = stage_split(cfg)
    except SplitError as exc:
        raise BudgetError(f"no pipeline split: {exc.message}") from None
    return split, holdings(cfg, split), variant_of(cfg, split), global_values(cfg, split)


_FRONTS: HeldByIdentity[tuple[StageSplit, Holdings, Variant, dict[str, Number]]] = HeldByIdentity(64)


def _float_inputs(inputs: dict[str, Number]) -> dict[str, Number]:
    return {name: float(value) if type(value) is Fraction else value
            for name, value in inputs.items()}


# The float view of the last few configs' inputs (`_front`'s, shared: never changed), by their
# identity: search's memory verdict and time estimate of one candidate read the same.
_FLOAT_INPUTS: HeldByIdentity[dict[str, Number]] = HeldByIdentity(4)


# Grids by spec: search estimates many candidates of one layout (knobs only differ), and a Grid
# (group arithmetic, Megatron's build-time checks) depends on nothing but its spec.
_GRIDS: Memo[Any, Grid] = Memo("budget grids", 1024)


def budget_grid(cfg: Config) -> Grid:
    """The config's grid, or BudgetError when its groups cannot be built."""
    spec = grid_spec(cfg)
    return _GRIDS.get_or_raise(spec, _grid, spec, errors=(BudgetError,))


def _grid(spec: Any) -> Grid:
    try:
        return Grid(spec)
    except GridError as exc:
        raise BudgetError(f"no grid: {exc}") from None

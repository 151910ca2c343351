"""Symbolic per-rank budgets: what every rank computes, sends, receives and holds.

Each quantity is one named formula (planner/accounting_comm.py, planner/accounting_memory.py)
over the config symbols of planner/accounting_symbols.py; it is evaluated exactly (ints and
rationals) and explained as formula → substitution → value. `budgets` gives them for one
representative rank per stage (or a chosen rank/stage), `plan_budgets` is the compiled plan's
list, `memory_findings` turns the memory peak into MEM001/MEM002 without importing sympy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache, cached_property
from typing import Any

from planner.accounting_comm import (
    add_layer_bytes,
    add_layout,
    add_rows,
    add_scaling,
    add_steps,
    add_topology,
)
from planner.accounting_expr import (
    Book,
    Number,
    Quantity,
    evaluate,
    number_text,
    substitute,
    sympy_expression,
)
from planner.accounting_memory import add_memory, add_params
from planner.accounting_symbols import (
    ALL_SYMBOLS,
    TOPOLOGY_GROUPS,
    Variant,
    chunk_values,
    global_values,
    rank_values,
    stage_values,
    variant_of,
)
from planner.findings import Finding
from planner.pipeline import SplitError, StageSplit, stage_split
from planner.schedule import Peak, stage_peak
from planner.schema import Config
from planner.units import fixed, format_bytes

CATEGORIES: tuple[str, ...] = ("layout", "rows", "bytes", "step", "topology", "memory", "scaling")
MEMORY_SOURCE = ("Megatron-LM dev@d48bd6be megatron/training/theoretical_memory_usage.py "
                 "report_theoretical_memory (weights, grads, optimizer, activations); "
                 "megatron/core/pipeline_parallel/schedules.py (microbatches in flight)")
_MEMORY_PARTS = ("weight_bytes", "grad_bytes", "optimizer_bytes", "buffer_bytes",
                 "activation_bytes", "comm_buffer_bytes", "in_flight_microbatches",
                 "peak_memory_bytes", "gpu_memory_bytes", "memory_utilization")


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


@dataclass(frozen=True)
class FormulaBook:
    """The quantities of one variant, split by the level they depend on (global < stage < rank)."""

    quantities: tuple[Quantity, ...]

    def at(self, level: str) -> tuple[Quantity, ...]:
        return tuple(q for q in self.quantities if q.level == level)

    def subset(self, targets: tuple[str, ...]) -> FormulaBook:
        """Only what `targets` need, in the same order (for cheap memory checks)."""
        return _subset(self, targets)


@cache
def formula_book(variant: Variant) -> FormulaBook:
    """Build (once per variant) every formula in dependency order."""
    book = Book(ALL_SYMBOLS)
    add_layout(book, variant)
    add_rows(book, variant)
    add_params(book, variant)
    add_layer_bytes(book, variant)
    collectives = add_steps(book, variant)
    add_topology(book, variant, collectives)
    add_memory(book, variant)
    add_scaling(book, variant)
    return FormulaBook(tuple(book.quantities))


@cache
def _subset(book: FormulaBook, targets: tuple[str, ...]) -> FormulaBook:
    by_ident = {q.ident: q for q in book.quantities}
    needed: set[str] = set()
    stack = list(targets)
    while stack:
        key = stack.pop()
        if key in needed or key not in by_ident:
            continue
        needed.add(key)
        stack.extend(by_ident[key].refs)
    return FormulaBook(tuple(q for q in book.quantities if q.ident in needed))


class Accounting:
    """Evaluates one config's formula book: globals once, then per stage, then per rank."""

    def __init__(self, cfg: Config, targets: tuple[str, ...] | None = None) -> None:
        self.cfg = cfg
        try:
            self.split: StageSplit = stage_split(cfg)
        except SplitError as exc:
            raise BudgetError(f"no pipeline split: {exc.message}") from None
        self.variant = variant_of(cfg, self.split)
        full = formula_book(self.variant)
        self.book = full.subset(targets) if targets else full
        self.inputs = global_values(cfg, self.split)
        self._schedules: dict[int, tuple[list[dict[str, Number]], Peak]] = {}
        self.chunk_book = full.subset(("act_per_microbatch", "microbatches")).quantities
        self.chunk_formula = next(q.formula for q in full.quantities
                                  if q.name == "act_per_microbatch")
        try:
            self.globals = evaluate(self.book.at("global"), dict(self.inputs))
        except ZeroDivisionError as exc:
            raise BudgetError(f"a layout degree is zero ({exc})") from None

    def stage_env(self, stage: int, embd_group: list[int] | None = None) -> dict[str, Number]:
        env = dict(self.globals)
        env.update(stage_values(self.cfg, self.split, stage, embd_group))
        peak = self.schedule(stage)[1]
        env.update(live_passes=peak.live_passes, act_live_peak=peak.bytes)
        return evaluate(self.book.at("stage"), env)

    def schedule(self, stage: int) -> tuple[list[dict[str, Number]], Peak]:
        """Each model chunk of the stage evaluated alone (its activations per microbatch), and the
        peak of live chunks over the stage's pipeline order."""
        if stage not in self._schedules:
            self._schedules[stage] = self._replay(stage)
        return self._schedules[stage]

    def _replay(self, stage: int) -> tuple[list[dict[str, Number]], Peak]:
        envs = [evaluate(self.chunk_book, {**self.inputs, **chunk_values(self.cfg, self.split, c)})
                for c in self.split.stages[stage].chunks]
        par, overlap = self.cfg.parallel, self.cfg.overlap.overlap_moe_expert_parallel_comm
        microbatches = max(1, math.ceil(envs[0]["microbatches"]))  # whole on any valid config
        peak = stage_peak(par.pp, self.split.vpp, stage, microbatches,
                          [env["act_per_microbatch"] for env in envs],
                          par.microbatch_group_size_per_vp_stage,
                          int(overlap and self.split.vpp > 1))
        return envs, peak

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
        return evaluate(self.book.at("rank"), env)

    def budget(self, q: Quantity, env: dict[str, Number], scope: str, stage: int | None) -> Budget:
        return Budget(q.name, env[q.ident], q.unit, q.formula, scope, stage, q.category, q.doc,
                      env)


def budgets(cfg: Config, *, stage: int | None = None, rank: int | None = None) -> list[Budget]:
    """Global budgets once, then stage and rank budgets for the chosen ranks: the given rank,
    the first rank of the given stage, or the first rank of every stage."""
    from planner.grid import Grid, GridError, grid_spec_from_config

    acc = Accounting(cfg)
    try:
        grid = Grid(grid_spec_from_config(cfg))
        if rank is not None:
            chosen = [(grid.stage_of(rank), rank)]
        elif stage is not None:
            chosen = [(stage, grid.stage_ranks(stage)[0])]
        else:
            chosen = [(s, grid.stage_ranks(s)[0]) for s in range(cfg.parallel.pp)]
    except GridError as exc:
        raise BudgetError(f"no grid: {exc}") from None
    out = [acc.budget(q, acc.globals, "all ranks", None) for q in acc.book.at("global")]
    kinds = set(grid.kinds)
    for s, r in chosen:
        groups = {kind: grid.group_of(kind, r) for kind in TOPOLOGY_GROUPS if kind in kinds}
        try:
            stage_env = acc.stage_env(s, groups.get("embd"))
            env = acc.rank_env(stage_env, rank_values(r, cfg.cluster.gpus_per_node, groups,
                                                      grid.group_of("pp", r)))
        except ZeroDivisionError as exc:
            raise BudgetError(f"stage {s}: a quantity divides by zero ({exc})") from None
        scope = f"stage {s} (rank {r})"
        for q in acc.book.quantities:
            if q.name == "in_flight_microbatches":
                out.extend(acc.schedule_budgets(s, scope))
            if q.level != "global":
                out.append(acc.budget(q, env, scope, s))
    return out


def plan_budgets(cfg: Config) -> list[dict[str, Any]]:
    """The compiled plan's budgets: first rank of each stage, including the per-step collective
    predictions `step.<collective>.<phase>.send_bytes` / `.recv_bytes`."""
    return [b.as_json() for b in budgets(cfg)]


def memory_by_stage(cfg: Config) -> list[dict[str, Number]]:
    """The memory parts of every stage (first-rank view; memory does not depend on placement)."""
    acc = Accounting(cfg, _MEMORY_PARTS)
    return [acc.stage_env(s) for s in range(cfg.parallel.pp)]


def memory_findings(cfg: Config) -> list[Finding]:
    """MEM001 (error) when a stage's estimated peak exceeds `cluster.gpu_memory_gib`, MEM002
    (warning) above 80 %. Plain rational arithmetic, no sympy: `moeplan check` calls this."""
    from planner.layout import grids_computable

    if not grids_computable(cfg):
        return []
    try:
        stages = memory_by_stage(cfg)
    except (BudgetError, SplitError, ZeroDivisionError, ValueError):
        return []
    over = [(s, env) for s, env in enumerate(stages) if env["memory_utilization"] > 1]
    high = [(s, env) for s, env in enumerate(stages) if Fraction(4, 5) < env["memory_utilization"] <= 1]
    findings = []
    for code, severity, hits, what in (("MEM001", "error", over, "above 100 %"),
                                       ("MEM002", "warning", high, "above 80 %")):
        if not hits:
            continue
        s, env = max(hits, key=lambda item: item[1]["memory_utilization"])
        others = f"; {len(hits)} of {len(stages)} stages {what}" if len(hits) > 1 else ""
        findings.append(Finding(code, severity, "cluster.gpu_memory_gib",
                                f"stage {s} needs an estimated {_memory_text(env)}{others}",
                                _memory_fix(cfg, s), MEMORY_SOURCE))
    return findings


def _memory_text(env: dict[str, Number]) -> str:
    share = Fraction(env["memory_utilization"]) * 100
    parts = ", ".join(f"{label} {format_bytes(env[key], digits=2)}" for key, label in (
        ("weight_bytes", "weights"), ("grad_bytes", "grads"), ("optimizer_bytes", "optimizer"),
        ("activation_bytes", "activations"), ("comm_buffer_bytes", "comm buffers")))
    flight = number_text(env["in_flight_microbatches"])
    return (f"{format_bytes(env['peak_memory_bytes'], digits=2)} per rank, "
            f"{fixed(share, 1)} % of {format_bytes(env['gpu_memory_bytes'], digits=2)} ({parts}; "
            f"{flight} microbatch(es) in flight)")


def _memory_fix(cfg: Config, stage: int) -> str:
    hints = []
    if not cfg.training.use_distributed_optimizer:
        hints.append("training.use_distributed_optimizer: true")
    if cfg.overlap.recompute_granularity != "full":
        # Megatron refuses full recompute without a method and a layer count (OVL009).
        hints.append("overlap: {recompute_granularity: full, recompute_method: uniform, "
                     "recompute_num_layers: 1}")
    hints.append("a larger EP or PP")
    return f"try {', '.join(hints)}; see `moeplan budget --stage {stage}` for every part"

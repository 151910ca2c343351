"""The formula book's one entry: what the rest of moeplan imports of planner/budget/.

Each budget is one named formula on a page of the book (planner/budget/book.py) over the config
symbols of planner/budget/symbols.py, evaluated exactly (ints and rationals) by
planner/budget/evaluate.py and explained as formula → substitution → value. `budgets` gives them
for one representative rank per stage (or a chosen rank/stage), `plan_budgets` is the compiled
plan's list, `stage_memory` the per-stage memory parts MEM001/MEM002 judge
(planner/rules/memory.py). Only this module (and the book itself) imports the book's pages
(tests/unit/test_import_cycles.py); the collectives table is a leaf verify and the runtime may
import directly.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

from planner.budget.book import PAGES, FormulaBook, formula_book
from planner.budget.collectives import (
    DIRECTIONS,
    RECOMPUTE,
    Collective,
    UnknownCollective,
    collective,
    phase_label,
)
from planner.budget.collectives import TABLE as COLLECTIVES
from planner.budget.evaluate import CHUNK_PARTS, Accounting, Budget, BudgetError, budget_grid
from planner.budget.explain import number_text, pretty, value_text
from planner.budget.expr import Number, Quantity
from planner.budget.hardware import dispatch_efficiency, overlap_symbol
from planner.budget.layer_kinds import KINDS as LAYER_KINDS
from planner.budget.pipeline import PAGE as PIPELINE_PAGE
from planner.budget.pipeline import (
    chunk_microbatch_time,
    chunk_times,
    is_dualpipe,
    pipeline_page,
    pipeline_step,
)
from planner.budget.symbols import ALL_SYMBOLS, CSA_RATIO, variant_of
from planner.budget.time import DDP_WINDOWS
from planner.budget.variant import Variant
from planner.config.schema import Config
from planner.layout.nodes import rank_places
from planner.layout.pipeline import SplitError, stage_split
from planner.layout.rank_generator import GridError
from planner.layout.summary import grids_computable

__all__ = [  # the formula book's public names, re-exported: import them from here
    "ALL_SYMBOLS", "CATEGORIES", "COLLECTIVES", "CSA_RATIO", "DDP_WINDOWS", "DIRECTIONS", "LAYER_KINDS",
    "PAGES",
    "PIPELINE_PAGE",
    "RECOMPUTE", "Accounting", "Budget", "BudgetError", "Collective", "FormulaBook", "Number",
    "Quantity", "UnknownCollective", "Variant", "budget_grid", "budgets", "chunk_microbatch_time",
    "chunk_times", "collective", "dispatch_efficiency", "formula_book", "is_dualpipe", "memory_alike",
    "memory_by_stage", "number_text", "overlap_symbol", "phase_label", "pipeline_page", "pipeline_step",
    "plan_budgets", "pretty", "stage_memory", "value_text", "variant_of",
]

CATEGORIES: tuple[str, ...] = ("layout", "rows", "bytes", "step", "topology", "memory", "scaling")
_MEMORY_PARTS = ("weight_bytes", "grad_bytes", "optimizer_bytes", "buffer_bytes",
                 "activation_bytes", "comm_buffer_bytes", "in_flight_microbatches",
                 "peak_memory_bytes", "gpu_memory_bytes", "memory_utilization",
                 "hot_rank_memory_peak_bytes", "device_memory_bytes", "device_memory_utilization")


def budgets(cfg: Config, *, stage: int | None = None, rank: int | None = None) -> list[Budget]:
    """Global budgets once, then stage and rank budgets for the chosen ranks: the given rank,
    the first rank of the given stage, or the first rank of every stage."""
    acc = Accounting(cfg)
    grid = budget_grid(cfg)
    try:
        if rank is not None:
            chosen = [(grid.stage_of(rank), rank)]
        elif stage is not None:
            chosen = [(stage, grid.stage_ranks(stage)[0])]
        else:
            chosen = [(s, grid.stage_ranks(s)[0]) for s in range(cfg.parallel.pp)]
    except GridError as exc:
        raise BudgetError(f"no grid: {exc}") from None
    out = [acc.budget(q, acc.globals, "all ranks", None) for q in acc.book.at("global")]
    for s, r in chosen:
        env = acc.placed_env(grid, s, r, rank_places(cfg))
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


def memory_by_stage(cfg: Config, exact: bool = True) -> list[dict[str, Number]]:
    """The memory parts of every stage (first-rank view; memory does not depend on placement)."""
    acc = Accounting(cfg, _MEMORY_PARTS, exact=exact)
    return [acc.stage_env(s) for s in range(cfg.parallel.pp)]


def stage_memory(cfg: Config, exact: bool = True) -> list[dict[str, Number]] | None:
    """`memory_by_stage`, or None when the layout cannot be budgeted (other rules say why).
    Plain rational arithmetic, no sympy: `moeplan check` calls this for MEM001/MEM002
    (`exact=False`: floats, for search's verdicts far from a threshold)."""
    if not grids_computable(cfg):
        return None
    try:
        return memory_by_stage(cfg, exact)
    except (BudgetError, SplitError, ZeroDivisionError, ValueError):
        return None


def memory_alike(a: Config, b: Config) -> bool:
    """Whether two configs that differ in nothing but a selective recompute choice (none, or
    selective with other modules) hold the same memory on every stage. The recompute choice
    reaches `memory_by_stage` only through the variant, which picks the formulas: no input
    symbol reads the selective modules, and the stage holdings read the recompute setting only
    under full recompute (planner/budget/symbols.py variant_of, _recompute_values). So when the
    two variants agree but for the recompute fields and the memory formulas they pick read
    alike, the bytes are equal. Search uses it to skip a setting whose extra modules hold
    nothing (selective `core_attn` under fused attention keeps the same tensors) beside one that
    does not fit."""
    if "full" in (a.overlap.recompute_granularity, b.overlap.recompute_granularity):
        return False
    try:
        va, vb = variant_of(a, stage_split(a)), variant_of(b, stage_split(b))
    except (SplitError, BudgetError, ValueError, ZeroDivisionError):
        return False
    if _without_recompute(va) != _without_recompute(vb):
        return False
    return _memory_formulas(va) == _memory_formulas(vb)


def _without_recompute(variant: Variant) -> Variant:
    return replace(variant, recompute=None, recompute_method=None, recompute_modules=frozenset())


@cache
def _memory_formulas(variant: Variant) -> tuple[tuple[str, str], ...]:
    """Every formula `memory_by_stage` evaluates for the variant: its parts and what they read,
    and the model chunks' activations its schedule replay sums (`Accounting._chunk_book`)."""
    book = formula_book(variant)
    return tuple((q.ident, q.formula) for part in (_MEMORY_PARTS, CHUNK_PARTS)
                 for q in book.subset(part).quantities)


# --- the busiest rank's rows against NCCL EP's static receive capacity.
_RECEIVE_PARTS = ("hot_gemm_rows", "ncclep_recv_rows")


def ncclep_receive_check(cfg: Config) -> dict[str, Number] | None:
    """Stage 0's hot_gemm_rows and ncclep_recv_rows (rows are alike on every stage), or None when
    the config has no NCCL EP backend or cannot be budgeted (other rules say why)."""
    moe = cfg.moe
    if moe.moe_token_dispatcher_type != "flex" or moe.moe_flex_dispatcher_backend != "ncclep" \
            or moe.moe_expert_rank_capacity_factor is None or not grids_computable(cfg):
        return None
    try:
        env = Accounting(cfg, _RECEIVE_PARTS).stage_env(0)
    except (BudgetError, SplitError, ZeroDivisionError, ValueError):
        return None
    return {name: env[name] for name in _RECEIVE_PARTS}

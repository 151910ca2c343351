"""`moeplan budget CONFIG`: rows, bytes, memory, scaling and topology per rank, by category.

Budgets print for any config whose grids are computable; findings (memory over budget included)
go to stderr and decide the exit code. `--json` prints only the JSON list on stdout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from planner.cli_common import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_USAGE,
    collect_findings,
    fail,
    load_config_or_exit,
    print_findings,
    stdout,
)
from planner.findings import has_errors

TITLES = {
    "layout": "layout: degrees, groups, microbatches",
    "rows": "token rows per rank, per MoE layer, per microbatch",
    "bytes": "bytes per rank, per MoE layer, per microbatch (send payload)",
    "step": "collectives per optimizer step (× MoE layers × microbatches)",
    "topology": "topology split per step (node-major placement, ring algorithms)",
    "memory": "memory per rank",
    "scaling": "gradient scaling",
}
QUIET_WHEN_ZERO = ("step", "topology")


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("quantity", style="bold", no_wrap=True)
    for column in columns:
        table.add_column(column, justify="right" if column != "formula → substitution" else "left")
    return table


def _explained(budget) -> str:
    from planner.accounting import pretty

    return (f"[dim]{escape(budget.doc)}[/]\n{escape(pretty(budget.formula))}\n"
            f"= {escape(budget.substitution)}")


def render(items: list, *, explain: bool) -> None:
    """One table per category: global values once, stage values side by side (or per stage)."""
    from planner.accounting import CATEGORIES, value_text

    stages = sorted({b.stage for b in items if b.stage is not None})
    scopes = {b.stage: b.scope for b in items if b.stage is not None}
    for category in CATEGORIES:
        shared = [b for b in items if b.category == category and b.stage is None]
        per_stage = [b for b in items if b.category == category and b.stage is not None]
        omitted = _omit_zeros(category, {b.name: [b] for b in shared})
        if len(omitted) < len(shared):
            table = _table(f"{TITLES[category]} — all ranks",
                           ["value", "unit"] + (["formula → substitution"] if explain else []))
            for b in shared:
                if b.name not in omitted:
                    table.add_row(b.name, value_text(b.value, b.unit), b.unit,
                                  *([_explained(b)] if explain else []))
            stdout.print(table)
        _note(omitted)
        if not per_stage:
            continue
        if explain or len(stages) == 1:
            for stage in stages:
                rows = [b for b in per_stage if b.stage == stage]
                omitted = _omit_zeros(category, {b.name: [b] for b in rows})
                table = _table(f"{TITLES[category]} — {scopes[stage]}",
                               ["value", "unit"] + (["formula → substitution"] if explain else []))
                for b in rows:
                    if b.name not in omitted:
                        table.add_row(b.name, value_text(b.value, b.unit), b.unit,
                                      *([_explained(b)] if explain else []))
                stdout.print(table)
                _note(omitted)
            continue
        by_name: dict[str, list] = {}
        for b in per_stage:
            by_name.setdefault(b.name, []).append(b)
        omitted = _omit_zeros(category, by_name)
        runs = _identical_stage_runs(stages, by_name)
        table = _table(TITLES[category], [_run_label(run, scopes) for run in runs] + ["unit"])
        for name, row in by_name.items():
            if name not in omitted:
                first = {b.stage: b for b in row}
                table.add_row(name, *(value_text(first[run[0]].value, first[run[0]].unit, short=True)
                                      for run in runs), row[0].unit)
        stdout.print(table)
        _note(omitted)


def _identical_stage_runs(stages: list[int], by_name: dict[str, list]) -> list[list[int]]:
    """Consecutive stages whose every value in the table is equal share one column."""
    values = {s: tuple(next(b.value for b in row if b.stage == s) for row in by_name.values())
              for s in stages}
    runs: list[list[int]] = []
    for stage in stages:
        if runs and values[runs[-1][-1]] == values[stage]:
            runs[-1].append(stage)
        else:
            runs.append([stage])
    return runs


def _run_label(run: list[int], scopes: dict[int, str]) -> str:
    if len(run) == 1:
        return scopes[run[0]]
    return f"stages {run[0]}–{run[-1]} (each)"


def _omit_zeros(category: str, by_name: dict[str, list]) -> set[str]:
    """Collectives that are not issued (zero everywhere) only clutter the step/topology tables."""
    if category not in QUIET_WHEN_ZERO:
        return set()
    return {name for name, row in by_name.items() if all(b.value == 0 for b in row)}


def _note(omitted: set[str]) -> None:
    if omitted:
        stdout.print(f"[dim]{len(omitted)} zero rows not shown (collectives not issued on these "
                     "ranks; see --json)[/]", markup=True)


def budget(
    config: Annotated[Path, typer.Argument(help="YAML config to budget")],
    rank: Annotated[int | None, typer.Option("--rank", help="budget this rank")] = None,
    stage: Annotated[int | None, typer.Option("--stage", help="budget the first rank of this "
                                              "stage")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="formula and substitution per row")]
    = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON list only")] = False,
) -> None:
    """Per-rank budgets: token rows, bytes per collective, memory, gradient scaling, topology."""
    cfg = load_config_or_exit(config)
    if rank is not None and stage is not None:
        fail(EXIT_USAGE, "give --rank or --stage, not both")
    world, pp = cfg.parallel.world_size or 0, cfg.parallel.pp
    if rank is not None and not 0 <= rank < world:
        fail(EXIT_USAGE, f"--rank {rank} is outside 0..{world - 1}")
    if stage is not None and not 0 <= stage < pp:
        fail(EXIT_USAGE, f"--stage {stage} is outside 0..{pp - 1}")
    from planner.accounting import BudgetError, budgets

    findings = collect_findings(cfg)
    try:
        items = budgets(cfg, stage=stage, rank=rank)
    except BudgetError as exc:
        print_findings(findings)
        fail(EXIT_CONFIG, f"no budgets for {config}: {exc}")
    if as_json:
        rows = [b.as_json() | ({"substitution": b.substitution, "doc": b.doc} if explain else {})
                for b in items]
        print(json.dumps(rows, indent=1))
    else:
        render(items, explain=explain)
    print_findings(findings)
    raise typer.Exit(EXIT_CONFIG if has_errors(findings) else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("budget")(budget)

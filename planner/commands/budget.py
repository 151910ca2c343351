"""`moeplan budget CONFIG`: rows, bytes, memory, scaling and topology per rank, by category.

The default output is one screen: the verdict, peak memory per stage, the largest collectives per
step and the step-time estimate; `--all` prints every table. Budgets print for any config whose
grids are computable; findings (memory over budget included) go to stderr and decide the exit
code. `--json` prints only the JSON list on stdout.
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
    CalibrationOption,
    calibrated_or_exit,
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
        explained = column == "formula → substitution"
        table.add_column(column, justify="left" if explained else "right", no_wrap=not explained)
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
        rows = []
        for name, row in by_name.items():
            if name not in omitted:
                first = {b.stage: b for b in row}
                rows.append([name, *_row_cells([first[run[0]] for run in runs], value_text)])
        headers = [_run_label(run, scopes) for run in runs]
        for chunk in _column_chunks(headers, rows, stdout.width):
            stdout.print(_stage_table(TITLES[category], [headers[i] for i in chunk],
                                      [[r[0], *(r[1 + i] for i in chunk), r[-1]] for r in rows]))
        _note(omitted)


def _column_chunks(headers: list[str], rows: list[list[str]], width: int) -> list[list[int]]:
    """Stage columns split into groups that fit the terminal beside the quantity and unit
    columns, so no number is ever cut or wrapped (one table when everything fits)."""
    def col(i: int) -> int:  # column i of a row: 0 quantity, 1.. stages, -1 unit
        return max([len(r[i]) for r in rows] + [len(h) for h in
                                                 ([*headers, "unit"][i - 1].split("\n"))]) + 3

    fixed = min(max((len(r[0]) for r in rows), default=8), 24) + 3 + col(len(headers) + 1) + 1
    chunks: list[list[int]] = [[]]
    used = fixed
    for i in range(len(headers)):
        if chunks[-1] and used + col(i + 1) > width:
            chunks.append([])
            used = fixed
        chunks[-1].append(i)
        used += col(i + 1)
    return chunks


def _stage_table(title: str, headers: list[str], rows: list[list[str]]) -> Table:
    """Stage values side by side: number and unit columns are as wide as their widest cell and
    never wrap; only the quantity names fold when the terminal is narrow."""
    table = Table(title=title, title_justify="left", show_lines=False)
    longest = max((len(r[0]) for r in rows), default=8)
    table.add_column("quantity", style="bold", overflow="fold", min_width=min(longest, 24))
    for i, header in enumerate([*headers, "unit"], start=1):
        width = max([len(r[i]) for r in rows] + [len(line) for line in header.split("\n")])
        table.add_column(header, justify="right", no_wrap=True, min_width=width)
    for row in rows:
        table.add_row(*row)
    return table


def _row_cells(cells: list, value_text) -> list[str]:
    """One row of a stage table: bytes counted in one unit chosen for the row (its largest value),
    named once in the unit column, so stage cells hold bare numbers that never wrap."""
    from planner.units import binary_unit, in_unit

    unit = cells[0].unit
    if unit != "bytes":
        return [value_text(b.value, unit, short=True) for b in cells] + [unit]
    name, size = binary_unit(max(abs(b.value) for b in cells))
    return [in_unit(b.value, size) for b in cells] + [name]


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
        return scopes[run[0]].replace(" (", "\n(")
    return f"stages {run[0]}–{run[-1]}\n(each)"


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
    show_all: Annotated[bool, typer.Option("--all", help="every table in full (the default is "
                                           "the one-screen answer)")] = False,
    calibration: CalibrationOption = None,
) -> None:
    """Per-rank budgets: token rows, bytes per collective, memory, gradient scaling, topology."""
    cfg, _ = calibrated_or_exit(load_config_or_exit(config), calibration)
    if rank is not None and stage is not None:
        fail(EXIT_USAGE, "give --rank or --stage, not both")
    world, pp = cfg.parallel.world_size, cfg.parallel.pp
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
    elif show_all or explain or stage is not None or rank is not None:
        render(items, explain=explain)
    else:
        from planner.commands.budget_screen import render_screen
        from planner.summary import summarize

        render_screen(summarize(cfg, findings, items))
    print_findings(findings)
    raise typer.Exit(EXIT_CONFIG if has_errors(findings) else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("budget")(budget)

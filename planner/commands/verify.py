"""`moeplan verify PLAN [REPORT]`: the bytes each rank really moved next to what the plan predicted.

Without REPORT it checks the plan alone: its derived figures are what its own config compiles to.
The runtime asks exactly this, in a child process, before any process group forms
(runtime/rederive.py), so the user and the runtime run one check.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from planner.cli_common import EXIT_CONFIG, EXIT_OK, EXIT_USAGE, fail, stdout
from planner.plan_format import PlanFileError, read_plan
from planner.verify import (
    DERIVED,
    EXACT,
    EXPECTATION,
    MISMATCH,
    UNPREDICTED,
    Verification,
    VerifyInputError,
    check_rederived,
    read_report,
    verify,
)

_TABLE_WIDTH = 100
_STATUS_STYLE = {EXACT: "green", MISMATCH: "bold red", EXPECTATION: "cyan", UNPREDICTED: "yellow"}


def _ratio_text(ratio: object) -> str:
    return "—" if ratio is None else f"{float(ratio):.4f}"


def _bytes_text(value: Fraction | int | None) -> str:
    """Exact byte counts with thousands separators; a fractional expectation keeps 2 decimals."""
    if value is None:
        return "—"
    value = Fraction(value)
    return f"{int(value):,}" if value.denominator == 1 else f"{float(value):,.2f}"


def _table(result: Verification, rank: int | None, only_mismatches: bool) -> Table:
    table = Table(title="bytes per rank, one optimizer step: measured vs predicted",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1))
    for column, justify in (("rank", "right"), ("collective.phase", "left"), ("dir", "left"),
                            ("calls", "right"), ("predicted", "right"), ("measured", "right"),
                            ("ratio", "right"), ("status", "left")):
        table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for figure in result.figures:
        if rank is not None and figure.rank != rank:
            continue
        if only_mismatches and figure.status != MISMATCH:
            continue
        style = _STATUS_STYLE[figure.status]
        table.add_row(
            str(figure.rank), f"{figure.collective}.{figure.phase}",
            figure.direction.removesuffix("_bytes"), str(figure.calls),
            _bytes_text(figure.predicted), _bytes_text(figure.measured),
            _ratio_text(figure.ratio), f"[{style}]{figure.status}[/]",
        )
    return table


def _plan_only(plan_path: Path, as_json: bool) -> NoReturn:
    """The plan passed its re-derivation: say so and exit 0."""
    if as_json:
        print(json.dumps({"ok": True, "plan": str(plan_path), "rederived": True}, indent=2))
    else:
        stdout.print(f"{plan_path}: its {', '.join(DERIVED)} are what its config compiles to")
    raise typer.Exit(EXIT_OK)


def verify_command(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN", help="plan.json from moeplan compile")],
    report_path: Annotated[Path | None, typer.Argument(
        metavar="[REPORT]", help="report.json from python -m runtime; without it, check only that "
        "the plan's figures are what its config compiles to")] = None,
    rank: Annotated[int | None, typer.Option("--rank", help="show one rank only")] = None,
    mismatches_only: Annotated[bool, typer.Option("--mismatches", help="show mismatches only")
                               ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Compare a runtime report with its plan; exit 0 only when every checked figure matches."""
    try:
        plan = read_plan(plan_path)
        check_rederived(plan)  # the digest proves the file intact, this that its figures follow
        if report_path is None:
            _plan_only(plan_path, as_json)
        result = verify(plan, read_report(report_path))
    except (PlanFileError, VerifyInputError) as exc:
        fail(EXIT_USAGE, str(exc))
    code = EXIT_OK if result.ok else EXIT_CONFIG
    if as_json:
        print(json.dumps({"ok": result.ok, "balanced": result.balanced,
                          "reference": result.reference,
                          "figures": [f.as_dict() for f in result.figures]}, indent=2))
        raise typer.Exit(code)
    # Never squeeze the numbers: a pipe's default 80 columns would truncate them.
    wide = Console(highlight=False, width=max(stdout.width, _TABLE_WIDTH))
    wide.print(_table(result, rank, mismatches_only))
    routing = ("forced balanced routing: every figure is checked exactly" if result.balanced else
               "learned routing: routing-free figures are checked, EP/ETP receive sizes are "
               "expectations")
    stdout.print(f"{routing}.")
    stdout.print(f"{result.count(EXACT)} exact, [bold]{len(result.mismatches)} mismatch(es)[/], "
                 f"{result.count(EXPECTATION)} shown against expectation, "
                 f"{result.count(UNPREDICTED)} measured without a prediction", markup=True)
    reference = result.reference
    if reference.get("checked"):
        verdict = "[green]ok[/]" if reference.get("ok") else "[bold red]MISMATCH[/]"
        stdout.print(f"reference check: {verdict}, max relative error "
                     f"{float(reference.get('max_rel_error', 0.0)):.3e} (tolerance "
                     f"{reference.get('tolerance')})", markup=True)
        for mismatch in reference.get("mismatches", [])[:10]:
            stdout.print(f"  rank {mismatch.get('rank')}: {mismatch.get('tensor')} "
                         f"({mismatch.get('rel_error')})")
    else:
        stdout.print("reference check: not run (python -m runtime --check-reference)")
    verdict = "[bold green]verified[/]" if result.ok else "[bold red]NOT verified[/]"
    stdout.print(f"{report_path}: {verdict}", markup=True)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("verify")(verify_command)

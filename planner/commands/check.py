"""`moeplan check CONFIG`: every finding at once, then the layout summary."""

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
    collect_findings,
    findings_json,
    load_config_or_exit,
    print_findings,
    stdout,
)
from planner.findings import has_errors
from planner.layout import layout_summary

_ROWS = [
    ("world_size", "N (world size)"), ("tp", "TP"), ("cp", "CP"), ("pp", "PP"), ("vpp", "VPP"),
    ("ep", "EP"), ("etp", "ETP"), ("dp", "DP (attention data parallel)"),
    ("edp", "EDP (expert data parallel)"), ("ranks_per_stage", "ranks per stage"),
    ("experts_per_rank", "experts per rank (per MoE layer)"), ("microbatches", "microbatches per step"),
]


def _summary_table(layout: dict) -> Table:
    table = Table(title="layout", show_header=False, title_justify="left")
    table.add_column("quantity", style="bold")
    table.add_column("value", justify="right")
    for key, label in _ROWS:
        value = layout.get(key)
        table.add_row(label, "n/a" if value is None else str(value))
    if layout["gtp"] > 1 or layout["egtp"] > 1:
        table.add_row("GTP / EGTP", f"{layout['gtp']} / {layout['egtp']}")
    return table


def check(
    config: Annotated[Path, typer.Argument(help="YAML config to check")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Report every violated rule (errors first) and the layout summary; exit 1 on errors."""
    cfg = load_config_or_exit(config, as_json=as_json)
    findings = collect_findings(cfg)
    layout = layout_summary(cfg)
    ok = not has_errors(findings)
    if as_json:
        payload = {"ok": ok, "findings": findings_json(findings)}
        if layout is not None:
            payload["layout"] = layout
        print(json.dumps(payload, indent=2))
    else:
        print_findings(findings, stdout)
        if layout is not None:
            stdout.print(_summary_table(layout))
        errors = sum(f.severity == "error" for f in findings)
        warnings = sum(f.severity == "warning" for f in findings)
        verdict = "[bold green]valid[/]" if ok else "[bold red]invalid[/]"
        stdout.print(f"{escape(str(config))}: {verdict} — {errors} error(s), {warnings} warning(s)",
                     markup=True)
    raise typer.Exit(EXIT_OK if ok else EXIT_CONFIG)


def register(app: typer.Typer) -> None:
    app.command("check")(check)

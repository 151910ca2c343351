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
from planner.layout.summary import layout_summary
from planner.model_size import ModelSize, model_size

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


_SIZE_ROWS = [
    ("total_params", "total parameters (without MTP)"), ("mtp_params", "MTP parameters"),
    ("active_params", "activated parameters per token"),
    ("embedding_params", "embedding + output-layer parameters"),
]


def _size_table(size: ModelSize) -> Table:
    table = Table(title="model", show_header=False, title_justify="left")
    table.add_column("quantity", style="bold")
    table.add_column("value", justify="right")
    table.add_column("exact", justify="right")
    values = size.as_json()
    for key, label in _SIZE_ROWS:
        table.add_row(label, f"{values[key] / 1e9:,.2f} B", f"{values[key]:,}")
    return table


def check(
    config: Annotated[Path, typer.Argument(help="YAML config to check")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Report every violated rule (errors first) and the layout summary; exit 1 on errors."""
    cfg = load_config_or_exit(config, as_json=as_json)
    findings = collect_findings(cfg)
    layout = layout_summary(cfg)
    size = model_size(cfg)
    ok = not has_errors(findings)
    if as_json:
        payload = {"ok": ok, "findings": findings_json(findings)}
        if layout is not None:
            payload["layout"] = layout
        if size is not None:
            payload["model"] = size.as_json()
        print(json.dumps(payload, indent=2))
    else:
        print_findings(findings, stdout)
        if layout is not None:
            stdout.print(_summary_table(layout))
        if size is not None:
            stdout.print(_size_table(size))
        errors = sum(f.severity == "error" for f in findings)
        warnings = sum(f.severity == "warning" for f in findings)
        verdict = "[bold green]valid[/]" if ok else "[bold red]invalid[/]"
        stdout.print(f"{escape(str(config))}: {verdict} — {errors} error(s), {warnings} warning(s)",
                     markup=True)
    raise typer.Exit(EXIT_OK if ok else EXIT_CONFIG)


def register(app: typer.Typer) -> None:
    app.command("check")(check)

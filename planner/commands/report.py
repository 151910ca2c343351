"""`moeplan report CONFIG -o report.html [--search]`: one self-contained HTML page for a planning
review (planner/report). A config with errors still gets its page, the failure and its fix at the
top; the exit code is then 1, as for `check`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner.cli_common import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_USAGE,
    CalibrationOption,
    calibrated_or_exit,
    check_output_or_exit,
    collect_findings,
    fail,
    load_config_or_exit,
    print_findings,
    stdout,
    write_or_exit,
)
from planner.findings import has_errors


def report(
    config: Annotated[Path, typer.Argument(help="YAML config to report on")],
    output: Annotated[Path, typer.Option("-o", "--output", help="HTML file to write")],
    search: Annotated[bool, typer.Option("--search", help="also run `moeplan search` and plot its "
                                         "candidates")] = False,
    top: Annotated[int, typer.Option("--top", min=1, help="candidates plotted with --search")] = 20,
    calibration: CalibrationOption = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
) -> None:
    """Write one self-contained HTML page: verdict, layout, memory, communication, step time."""
    check_output_or_exit(output, force=force)
    cfg, _ = calibrated_or_exit(load_config_or_exit(config), calibration)
    try:
        import matplotlib  # noqa: F401  (the `report` extra; charts.py imports it lazily below)

        from planner.report.page import build_report
    except ImportError as exc:
        fail(EXIT_USAGE, f"moeplan report needs the `report` extra ({exc.name} is missing): "
                         "pip install 'moeplan[report]'")
    findings = collect_findings(cfg)
    html = build_report(cfg, config, findings, top if search else None)
    write_or_exit(output, html, parents=True)
    print_findings(findings)
    stdout.print(f"wrote {output}")
    raise typer.Exit(EXIT_CONFIG if has_errors(findings) else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("report")(report)

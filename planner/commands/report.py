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
    collect_findings,
    fail,
    load_config_or_exit,
    print_findings,
    stdout,
)
from planner.findings import has_errors


def report(
    config: Annotated[Path, typer.Argument(help="YAML config to report on")],
    output: Annotated[Path, typer.Option("-o", "--output", help="HTML file to write")],
    search: Annotated[bool, typer.Option("--search", help="also run `moeplan search` and plot its "
                                         "candidates")] = False,
    top: Annotated[int, typer.Option("--top", min=1, help="candidates plotted with --search")] = 20,
    calibration: CalibrationOption = None,
) -> None:
    """Write one self-contained HTML page: verdict, layout, memory, communication, step time."""
    cfg, _ = calibrated_or_exit(load_config_or_exit(config), calibration)
    if output.is_dir():
        fail(EXIT_USAGE, f"-o {output} is a directory; give a file name such as report.html")
    try:
        import matplotlib  # noqa: F401  (the `report` extra; charts.py imports it lazily below)

        from planner.report.page import build_report
    except ImportError as exc:
        fail(EXIT_USAGE, f"moeplan report needs the `report` extra ({exc.name} is missing): "
                         "pip install 'moeplan[report]'")
    from planner.plan import write_atomic

    findings = collect_findings(cfg)
    html = build_report(cfg, config, findings, top if search else None)
    try:
        write_atomic(output, html)
    except OSError as exc:
        fail(EXIT_USAGE, f"cannot write {output}: {exc.strerror or exc}")
    print_findings(findings)
    stdout.print(f"wrote {output}")
    raise typer.Exit(EXIT_CONFIG if has_errors(findings) else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("report")(report)

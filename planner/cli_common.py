"""What every command does first: load the config (exit 2 if unreadable, 1 if invalid) and report
findings in one format."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from planner.files.writing import WriteFailed, check_target, write_atomic
from planner.findings import Finding, has_errors, sort_findings

if TYPE_CHECKING:
    from rich.console import Console

    from planner.config.schema import Config

    stdout: Console
    stderr: Console

EXIT_OK, EXIT_CONFIG, EXIT_USAGE = 0, 1, 2

# Piped output gets room for side-by-side stage tables instead of rich's 80-column default.
_PIPE_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160
_CONSOLES: dict[str, dict[str, Any]] = {
    "stdout": {"highlight": False, "soft_wrap": True, "width": _PIPE_WIDTH},
    "stderr": {"stderr": True, "highlight": False, "soft_wrap": True},
}


def __getattr__(name: str) -> Any:
    """`stdout` and `stderr`, rich Consoles made on first use: a command that prints only JSON
    (`groups --rank R --json`) never imports rich, about a tenth of its start-up."""
    if name not in _CONSOLES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _console(name)


def _console(name: str) -> Console:
    """The module's `stdout`/`stderr` Console, made and kept on first use."""
    console = globals().get(name)
    if console is None:
        from rich.console import Console

        console = globals()[name] = Console(**_CONSOLES[name])
    return console

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def print_findings(findings: list[Finding], console: Console | None = None) -> None:
    """Each finding on one line, errors first, on `console` (else stderr)."""
    from rich.markup import escape

    if console is None:
        console = _console("stderr")
    for f in sort_findings(findings):
        console.print(f"[{_STYLE[f.severity]}]{f.code} {f.severity}[/] {escape(f.path)}: "
                      f"{escape(f.message)} [dim]({escape(f.fix)})[/]", markup=True)


def findings_json(findings: list[Finding]) -> list[dict[str, str]]:
    return [f.as_dict() for f in sort_findings(findings)]


def fail(code: int, message: str) -> NoReturn:
    from rich.markup import escape

    _console("stderr").print(f"[bold red]error:[/] {escape(message)}", markup=True)
    raise typer.Exit(code)


def exit_with_findings(findings: list[Finding], *, as_json: bool = False) -> NoReturn:
    """Print a config's findings (JSON or the table) and exit 1: the one way commands refuse."""
    if as_json:
        print(json.dumps({"ok": False, "findings": findings_json(findings)}, indent=2))
    else:
        print_findings(findings)
    raise typer.Exit(EXIT_CONFIG)


def load_config_or_exit(path: Path | str, *, as_json: bool = False, text: str | None = None) -> Config:
    """Load or exit: 2 for unreadable input, 1 (printing every finding) for an invalid config;
    `text`: the file's contents, when the caller has read them (planner/config/loader.py)."""
    from planner.config.loader import InvalidConfig, UnreadableConfig, load_config

    try:
        return load_config(path, text)
    except UnreadableConfig as exc:
        if as_json:
            print(json.dumps({"ok": False, "error": str(exc), "findings": []}))
        fail(EXIT_USAGE, str(exc))
    except InvalidConfig as exc:
        exit_with_findings(exc.findings, as_json=as_json)


def check_output_or_exit(path: Path, *, force: bool, option: str = "-o") -> None:
    """Before any work: refuse an output that is a directory or a device, or exists without --force."""
    try:
        check_target(path, force=force, option=option)
    except WriteFailed as exc:
        fail(EXIT_USAGE, f"{option} {exc}")


def write_or_exit(path: Path, text: str | bytes, *, mode: int = 0o644, parents: bool = False) -> None:
    """Write atomically (planner/files/writing.py) or exit 2 naming the path and the cause;
    parents: create missing folders (else a missing folder is the refusal)."""
    try:
        write_atomic(path, text, mode=mode, parents=parents)
    except WriteFailed as exc:
        fail(EXIT_USAGE, str(exc))


def collect_findings(cfg: Config, *, budget: bool = True) -> list[Finding]:
    """Every rule of the catalog plus the budget findings (memory), `ignore:` applied;
    `budget=False`: without the rules that judge the formula book's figures (memory)."""
    from planner.rules import run_rules

    return sort_findings(run_rules(cfg, budget=budget))


def exit_on_errors(cfg: Config, *, as_json: bool = False, budget: bool = True) -> list[Finding]:
    """For commands that need a valid layout: print the findings and exit 1 when any is an error
    (`budget=False`: a layout that does not fit memory still passes)."""
    findings = collect_findings(cfg, budget=budget)
    if has_errors(findings):
        exit_with_findings(findings, as_json=as_json)
    return findings



# --- step-time calibration profiles -------------------------------------------------
CalibrationOption = Annotated[Path | None, typer.Option(
    "--calibration", metavar="FILE", help="a `moeplan calibrate` profile: its fitted efficiency "
    "factors replace the defaults (else cluster.calibration)")]


def calibrated_or_exit(cfg: Config, path: Path | None) -> tuple[Config, str]:
    """The config with the profile's factors applied (the option's, else cluster.calibration's)
    and what was used, for the output; exit 2 on a profile that cannot be read."""
    target = path or cfg.cluster.calibration
    if not target:
        return cfg, "none (default factors)"
    from planner.calibrate.profile import ProfileError, apply_profile  # only with a profile
    from planner.config.loader import UnreadableConfig

    try:
        return apply_profile(cfg, target), str(target)
    except (ProfileError, UnreadableConfig) as exc:
        fail(EXIT_USAGE, f"calibration profile: {exc}")

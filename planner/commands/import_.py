"""`moeplan import {megatron,…} SOURCE [-o job.yaml]`: write the moeplan config equivalent to what a
user already has, report what could not be mapped, then every finding of the result at once.

One typer sub-app named `import`; each importer adds one command to it (`import_app.command`).
Exit codes: 0 valid, 1 when the imported config has errors (the YAML is still written, so it can be
edited into shape), 2 when the input cannot be read or the output cannot be written. The YAML is
written atomically: a complete file or none.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from planner.cli_common import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_USAGE,
    check_output_or_exit,
    collect_findings,
    fail,
    findings_json,
    print_findings,
    stderr,
    write_or_exit,
)
from planner.findings import Finding, has_errors

import_app = typer.Typer(
    name="import",
    help="Write a moeplan config from what you already have (a Megatron-LM command line, …).",
    no_args_is_help=True,
    add_completion=False,
)

SECTION_ORDER = ("model", "parallel", "training", "moe", "overlap", "cluster", "launch")

Output = Annotated[Path | None, typer.Option("-o", "--output", help="YAML file to write (default: stdout)")]
AsJson = Annotated[bool, typer.Option("--json", help="machine-readable report on stdout")]
Force = Annotated[bool, typer.Option("--force", help="overwrite an existing -o file")]


def read_source(source: str, kind: str = "args") -> str:
    """The text of SOURCE (`-` for stdin, with a deadline) through the bounded reader (the kind's
    size cap, regular files only); exit 2 when it cannot be read as UTF-8 text."""
    from planner.config.loader import UnreadableConfig, read_text

    try:
        return read_text(source, kind)
    except UnreadableConfig as exc:
        fail(EXIT_USAGE, str(exc))


def config_yaml(data: dict[str, dict[str, Any]], header: list[str]) -> str:
    """Sections in the schema's order, leaf lists inline, `#` header lines first."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(list, lambda dumper, value: dumper.represent_sequence(
        "tag:yaml.org,2002:seq", value, flow_style=True))
    ordered = {s: data[s] for s in SECTION_ORDER if data.get(s)}
    ordered.update({s: v for s, v in data.items() if s not in ordered and v})
    body = yaml.dump(ordered, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)
    return "".join(f"# {line}\n" for line in header) + body


def validate(data: dict[str, dict[str, Any]]) -> list[Finding]:
    """Schema findings, or (when the config loads) every rule's findings."""
    from planner.config.loader import InvalidConfig, parse_config

    try:
        cfg = parse_config(data)
    except InvalidConfig as exc:
        return exc.findings
    return collect_findings(cfg)


def unmapped_table(rows: list[Any]) -> Table:
    table = Table(title="arguments not mapped to a config field", title_justify="left")
    for column in ("argument", "value", "why"):
        table.add_column(column, overflow="fold")
    for row in rows:
        style = "red" if row.error else ""
        table.add_row(escape(row.argument), escape(row.value), escape(row.why), style=style)
    return table


def finish(text: str, data: dict[str, dict[str, Any]], unmapped: list[Any], output: Path | None,
           as_json: bool, extra: dict[str, Any], *, force: bool = False) -> None:
    """Write the YAML, report the unmapped arguments and every finding, exit 0/1 (2 if unwritable,
    or if -o exists and force is not given: each command also checks that before its work)."""
    findings = validate(data)
    ok = not has_errors(findings) and not any(u.error for u in unmapped)
    if output is not None:
        check_output_or_exit(output, force=force)
        write_or_exit(output, text)
    if as_json:
        payload = {"ok": ok, "output": None if output is None else str(output), **extra,
                   "config": data, "unmapped": [u.as_dict() for u in unmapped],
                   "findings": findings_json(findings)}
        if output is None:
            payload["yaml"] = text
        print(json.dumps(payload, indent=2))
    else:
        if output is None:
            sys.stdout.write(text)
        if unmapped:
            stderr.print(unmapped_table(unmapped))
        print_findings(findings, stderr)
        verdict = "[bold green]valid[/]" if ok else "[bold red]invalid[/]"
        where = f"wrote {escape(str(output))}" if output is not None else "imported config"
        errors = sum(f.severity == "error" for f in findings) + sum(u.error for u in unmapped)
        stderr.print(f"{where}: {verdict} — {errors} error(s), "
                     f"{sum(f.severity == 'warning' for f in findings)} warning(s), "
                     f"{len(unmapped)} argument(s) not mapped", markup=True)
    raise typer.Exit(EXIT_OK if ok else EXIT_CONFIG)


@import_app.command("megatron")
def import_megatron(
    args: Annotated[str, typer.Argument(metavar="ARGS", help="file of Megatron-LM arguments (a command "
                                        "line, one or many per line, torchrun and the entry script may "
                                        "lead), or - for stdin")],
    output: Output = None,
    world_size: Annotated[int | None, typer.Option("--world-size", min=1, help="ranks of the job, when "
                                                   "no torchrun --nnodes/--nproc-per-node gives them")
                          ] = None,
    as_json: AsJson = False,
    force: Force = False,
) -> None:
    """Turn a Megatron-LM command line into a moeplan config; report what it could not map."""
    from planner.config.importers.megatron_args import UnreadableArgs, import_arguments

    if output is not None:
        check_output_or_exit(output, force=force)
    text = read_source(args)
    try:
        result = import_arguments(text, world_size)
    except UnreadableArgs as exc:
        fail(EXIT_USAGE, f"{args}: {exc}")
    kept = [u for u in result.unmapped if not u.error]
    header = [f"imported by `moeplan import megatron` from {'stdin' if args == '-' else args}"
              + (f" (entry {result.entry})" if result.entry else "")]
    if kept and "megatron_extra_args" not in result.data.get("launch", {}):
        header += ["arguments moeplan does not model (this moeplan has no launch.megatron_extra_args; "
                   "pass them to Megatron-LM yourself):", "  " + shlex.join(result.extra_args)]
    finish(config_yaml(result.data, header), result.data, result.unmapped, output, as_json,
           {"entry": result.entry, "env": result.env}, force=force)


def register(app: typer.Typer) -> None:
    app.add_typer(import_app, name="import")

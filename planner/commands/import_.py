"""`moeplan import {megatron,…} SOURCE [-o job.yaml]`: write the moeplan config equivalent to what a
user already has, report what could not be mapped, then every finding of the result at once.

One typer sub-app named `import`; each importer adds one command to it (`import_app.command`).
Exit codes: 0 valid, 1 when the imported config has errors (the YAML is still written, so it can be
edited into shape), 2 when the input cannot be read or the output cannot be written. The YAML is
written atomically: a complete file or none.
"""

from __future__ import annotations

import json
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
    size cap, regular files only); exit 2 when it cannot be read as UTF-8 text. A file over the
    kind's cap may still be a Megatron training log: it is streamed under the log cap, keeping the
    lines the log importer reads (a log is a log, however long the run after its argument dump)."""
    from planner.config.loader import UnreadableConfig, read_text

    try:
        if source != "-" and (log := _long_log(source, kind)) is not None:
            return log
        return read_text(source, kind)
    except UnreadableConfig as exc:
        fail(EXIT_USAGE, str(exc))


def _long_log(source: str, kind: str) -> str | None:
    """The essential lines of SOURCE when it is a regular file over the kind's cap holding a
    Megatron argument dump (planner/config/importers/megatron_log.py log_essentials), else None."""
    import os
    import stat

    from planner.config.importers.megatron_log import log_essentials
    from planner.config.loader import read_lines
    from planner.files.reading import cap_of

    try:
        info = os.stat(source)
    except OSError:
        return None  # read_text names what is wrong with it
    if not stat.S_ISREG(info.st_mode) or info.st_size <= cap_of(kind):
        return None
    kept = log_essentials(read_lines(source, "log"))
    return None if kept is None else "\n".join(kept)


def config_yaml(data: dict[str, dict[str, Any]], header: list[str]) -> str:
    """Sections in the schema's order, leaf lists inline, `#` header lines first."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(list, lambda dumper, value: dumper.represent_sequence(
        "tag:yaml.org,2002:seq", value, flow_style=True))
    Dumper.add_representer(str, _string_representer)
    ordered = {s: data[s] for s in SECTION_ORDER if data.get(s)}
    ordered.update({s: v for s, v in data.items() if s not in ordered and v})
    body = yaml.dump(ordered, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)
    return "".join(f"# {line}\n" for line in header) + body


def _string_representer(dumper: Any, value: str) -> Any:
    """Quote a string the config loader would read as another type: moeplan's loader reads YAML 1.2
    numbers (`1e-6` is a float there, a string to PyYAML's YAML 1.1 dumper), so a value such as
    `--min-lr 1e-6` kept in launch.megatron_extra_args must be written quoted to load back."""
    from planner.config.loader import loads_as_string

    style = None if loads_as_string(value) else "'"
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def validate(data: dict[str, dict[str, Any]],
             placeholders: dict[str, tuple[Any, str]] | None = None) -> list[Finding]:
    """Schema findings, or (when the config loads) every rule's findings. Where the only schema
    errors are required fields the import has a stated placeholder for, those stay errors and every
    rule runs on the config with the placeholders filled in: all findings in one pass."""
    from planner.config.loader import InvalidConfig, UnreadableConfig, parse_config

    try:
        cfg = parse_config(data)
    except InvalidConfig as exc:
        return _with_placeholders(data, exc.findings, placeholders or {})
    except UnreadableConfig as exc:  # the model.hf_config the import names is not on this machine
        return [Finding("FILE001", "error", "model.hf_config", str(exc), "put the checkpoint's config.json "
                        "there, or point model.hf_config at it", "moeplan (the file the model is read from)")]
    return collect_findings(cfg)


def _with_placeholders(data: dict[str, dict[str, Any]], missing: list[Finding],
                       placeholders: dict[str, tuple[Any, str]]) -> list[Finding]:
    from dataclasses import replace

    from planner.config.loader import SCHEMA_SOURCE, InvalidConfig, parse_config

    def absent(dotted: str) -> bool:
        section, name = dotted.split(".", 1)
        return name not in data.get(section, {})

    filled = {p for p in placeholders if absent(p)}
    if not filled or any(f.path not in filled for f in missing):
        return missing  # errors no placeholder stands for come first, as the schema reports them
    trial = {section: dict(values) for section, values in data.items()}
    for dotted in filled:
        section, name = dotted.split(".", 1)
        trial.setdefault(section, {})[name] = placeholders[dotted][0]
    try:
        cfg = parse_config(trial)
    except InvalidConfig as exc:  # other schema errors: those, beside the missing fields
        return [*missing, *(f for f in exc.findings if f.path not in filled)]
    said = "; ".join(f"{p} {placeholders[p][0]} ({placeholders[p][1]})" for p in sorted(filled))
    found = {f.path: f for f in missing}
    named = [replace(found.get(p) or Finding("CFG003", "error", p, f"required field '{p}' is missing",
                                             f"add {p}: <value>", SCHEMA_SOURCE),
                     message=f"{found[p].message if p in found else f'{p} is not set'}; the findings "
                             f"below assume {said}") for p in sorted(filled)]
    return [*named, *collect_findings(cfg)]


def unmapped_table(rows: list[Any]) -> Table:
    table = Table(title="arguments not mapped to a config field", title_justify="left")
    for column in ("argument", "value", "why"):
        table.add_column(column, overflow="fold")
    for row in rows:
        style = "red" if row.error else ""
        table.add_row(escape(row.argument), escape(row.value), escape(row.why), style=style)
    return table


def finish(text: str, data: dict[str, dict[str, Any]], unmapped: list[Any], output: Path | None,
           as_json: bool, extra: dict[str, Any], *, force: bool = False,
           placeholders: dict[str, tuple[Any, str]] | None = None) -> None:
    """Write the YAML, report the unmapped arguments and every finding, exit 0/1 (2 if unwritable,
    or if -o exists and force is not given: each command also checks that before its work)."""
    findings = validate(data, placeholders)
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


def parse_sets(sets: list[str]) -> dict[str, str]:
    """`--set NAME=VALUE` options as a mapping; exit 2 on one without `=`."""
    values: dict[str, str] = {}
    for item in sets:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            fail(EXIT_USAGE, f"--set {item!r}: expected NAME=VALUE (a variable of the launch script or "
                             "argument map)")
        values[name.strip()] = value
    return values


def _card_folder(source: str) -> str | None:
    """The catalog card a folder of SOURCE's path is named exactly for (Primus keeps one experiment
    folder per card: examples/megatron/configs/MI300X/), the innermost; None for stdin or none."""
    from planner.config.gpus import GPUS

    if source == "-":
        return None
    return next((part for part in reversed(Path(source).resolve().parent.parts) if part in GPUS), None)


@import_app.command("megatron")
def import_megatron(
    args: Annotated[str, typer.Argument(metavar="SOURCE", help="what you launch Megatron-LM with: an "
                                        "argument file (a command line; torchrun and the entry script may "
                                        "lead), a shell launch script (read, never run), a YAML argument "
                                        "map (MODEL_ARGS), or a training log with Megatron's argument dump; "
                                        "- for stdin")],
    positional: Annotated[list[str] | None, typer.Argument(metavar="[VALUE]...", help="the values a "
                                                         "launch script reads as $1 $2 …, given after "
                                                         "it as its README runs it")] = None,
    output: Output = None,
    world_size: Annotated[int | None, typer.Option("--world-size", min=1, help="ranks of the job, when "
                                                   "no launcher in SOURCE gives them")] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", metavar="NAME=VALUE", help="value of a "
                                                   "variable the script or map leaves to its environment "
                                                   "(repeatable)")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", metavar="NAME", help="the GPU the job runs on "
                                            "(a cluster.gpu catalog name: H100, H20, A100-80GB, …); "
                                            "wins over a card the log names")] = None,
    as_json: AsJson = False,
    force: Force = False,
) -> None:
    """Turn a Megatron-LM launch (arguments, script, argument map or log) into a moeplan config."""
    from planner.config.gpus import GPUS
    from planner.config.importers.megatron_args import Unmapped, UnreadableArgs
    from planner.config.importers.sources import NotAnImport, import_text

    if gpu is not None and gpu not in GPUS:
        fail(EXIT_USAGE, f"--gpu {gpu}: not in the GPU catalog (cluster.gpu): name one of "
                         f"{', '.join(GPUS)}, or set cluster.gpu_memory_gib and the peaks yourself")
    if output is not None:
        check_output_or_exit(output, force=force)
    text = read_source(args)
    origin = None if args == "-" else Path(args).resolve().parent
    try:
        given = {str(i + 1): value for i, value in enumerate(positional or [])}
        result, front = import_text(text, {**given, **parse_sets(sets or [])}, world_size, origin)
    except (UnreadableArgs, NotAnImport) as exc:
        fail(EXIT_USAGE, f"{args}: {exc}")
    if gpu is not None:  # the card judges memory and time: every finding of the report is on it
        result.set("cluster.gpu", gpu)
    elif not result.has("cluster.gpu") and (card := _card_folder(args)) is not None:
        result.set("cluster.gpu", card)
        result.unmapped.append(Unmapped("GPU", card, f"the file lies in a folder named for the card "
                                        f"({card}/, as Primus's examples/megatron/configs/MI300X/): "
                                        f"cluster.gpu {card}; --gpu NAME says otherwise"))
    header = [f"imported by `moeplan import megatron` from {'stdin' if args == '-' else args}"
              + (f" (entry {result.entry})" if result.entry else ""),
              f"read as: {front.described}",
              *(f"error: {u.argument} {u.value}".rstrip() + f": {u.why}" for u in result.unmapped if u.error)]
    if not as_json:
        stderr.print(f"read {escape('stdin' if args == '-' else args)} as: {escape(front.described)}")
    finish(config_yaml(result.data, header), result.data, result.unmapped, output, as_json,
           {"form": front.form, "launch": front.facts.summary, "entry": result.entry, "env": result.env},
           force=force, placeholders=result.placeholders)


def register(app: typer.Typer) -> None:
    app.add_typer(import_app, name="import")

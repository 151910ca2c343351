"""`moeplan rules [CODE] [--json]`: list the rule catalog, or explain one rule like a linter's docs."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from planner.cli_common import EXIT_OK, EXIT_USAGE, fail, stdout

if TYPE_CHECKING:  # pragma: no cover - typing only
    from planner.rules import Rule


def _catalog_table() -> Table:
    from planner.rules import CATALOG

    table = Table(title=f"moeplan rules ({len(CATALOG)})", title_justify="left")
    for column in ("code", "severity", "title", "ignorable", "source"):
        table.add_column(column, overflow="fold")
    for entry in CATALOG:
        table.add_row(entry.code, entry.severity, Text(entry.title),
                      "no" if entry.cannot_ignore else "yes", Text(entry.source))
    return table


def _example_block(label: str, yaml_text: str) -> Text:
    body = "\n".join("    " + line for line in yaml_text.splitlines())
    return Text(f"{label}\n", style="bold") + Text(body + "\n")


def _explain(entry: Rule) -> None:
    checked_by = "loader (schema validation)" if entry.check is None else "`moeplan check`"
    stdout.print(Text(f"{entry.code} ({entry.severity}): {entry.title}", style="bold"))
    ignorable = f"no — {entry.cannot_ignore}" if entry.cannot_ignore else "yes (`ignore:` list)"
    stdout.print(Text(f"source: {entry.source}\nreported by: {checked_by}\n"
                      f"ignorable: {ignorable}\n"))
    stdout.print(Text("Why\n", style="bold") + Text(entry.why + "\n"))
    if entry.whole_file_examples:
        note = "Examples are whole config files."
    else:
        note = ("Examples are fragments merged onto a small valid 8-rank config "
                "(`moeplan rules --base` prints it).")
    stdout.print(Text(note + "\n", style="dim"))
    stdout.print(_example_block("Bad", entry.bad))
    stdout.print(_example_block("Good", entry.good))


def rules(
    code: Annotated[str | None, typer.Argument(help="a rule code to explain, e.g. PAR001")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    base: Annotated[bool, typer.Option("--base", help="print the config the examples extend")] = False,
) -> None:
    """List every rule (code, severity, title, ignorable, source), or explain one: what, why,
    bad/good, source, and why it cannot be ignored when it cannot."""
    from planner.rules import CATALOG, find_rule, suggest_codes

    if base:
        from planner.rules.example_base import EXAMPLE_BASE_YAML

        stdout.print(Text(EXAMPLE_BASE_YAML.rstrip()))
        raise typer.Exit(EXIT_OK)
    if code is None:
        if as_json:
            print(json.dumps([entry.as_dict() for entry in CATALOG], indent=2))
        else:
            stdout.print(_catalog_table())
        raise typer.Exit(EXIT_OK)
    entry = find_rule(code)
    if entry is None:
        close = suggest_codes(code)
        hint = f"; did you mean {' or '.join(close)}?" if close else "; `moeplan rules` lists them all"
        fail(EXIT_USAGE, escape(f"unknown rule code {code!r}{hint}"))
    if as_json:
        print(json.dumps(entry.as_dict(), indent=2))
    else:
        _explain(entry)
    raise typer.Exit(EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("rules")(rules)

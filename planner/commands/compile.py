"""`moeplan compile CONFIG -o plan.json`: the artifact the runtime and launchers consume."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner.cli_common import EXIT_USAGE, exit_on_errors, fail, load_config_or_exit, stdout
from planner.plan import compile_plan, write_plan


def compile_command(
    config: Annotated[Path, typer.Argument(help="YAML config to compile")],
    output: Annotated[Path, typer.Option("-o", "--output", help="where to write plan.json")] = Path(
        "plan.json"),
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
) -> None:
    """Validate CONFIG and write the compiled plan (refused when the config has errors)."""
    cfg = load_config_or_exit(config)
    findings = exit_on_errors(cfg)
    if output.exists() and not force:
        fail(EXIT_USAGE, f"{output} exists; pass --force to overwrite it")
    plan = compile_plan(cfg, findings)
    write_plan(plan, output)
    layout = plan["layout"]
    stdout.print(f"wrote {output}: {layout['world_size']} ranks, DP {layout['dp']}, EDP {layout['edp']}, "
                 f"{len(plan['groups'])} group kinds, {len(plan['budgets'])} budgets, {plan['digest'][:19]}…")


def register(app: typer.Typer) -> None:
    app.command("compile")(compile_command)

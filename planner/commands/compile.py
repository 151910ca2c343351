"""`moeplan compile CONFIG -o plan.json`: the artifact the runtime and launchers consume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from planner.cli_common import (
    check_output_or_exit,
    exit_on_errors,
    load_config_or_exit,
    stdout,
    write_or_exit,
)


def compile_command(
    config: Annotated[Path, typer.Argument(help="YAML config to compile")],
    output: Annotated[Path, typer.Option("-o", "--output", help="where to write plan.json")] = Path(
        "plan.json"),
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
) -> None:
    """Validate CONFIG and write the compiled plan (refused when the config has errors)."""
    check_output_or_exit(output, force=force)
    cfg = load_config_or_exit(config)
    findings = exit_on_errors(cfg)
    from planner.plan import compile_plan

    plan = compile_plan(cfg, findings)
    write_or_exit(output, json.dumps(plan, indent=1) + "\n", parents=True)
    layout = plan["layout"]
    stdout.print(f"wrote {output}: {layout['world_size']} ranks, DP {layout['dp']}, EDP {layout['edp']}, "
                 f"{len(plan['groups'])} group kinds, {len(plan['budgets'])} budgets, {plan['digest'][:19]}…")


def register(app: typer.Typer) -> None:
    app.command("compile")(compile_command)

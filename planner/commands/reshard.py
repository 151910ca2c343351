"""`moeplan reshard-plan OLD.yaml NEW.yaml`: how a checkpoint's routed experts move between layouts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from planner.cli_common import (
    EXIT_CONFIG,
    exit_on_errors,
    findings_json,
    load_config_or_exit,
    print_findings,
    stdout,
)
from planner.units import format_bytes


def reshard_plan_command(
    old: Annotated[Path, typer.Argument(help="config the checkpoint was saved under")],
    new: Annotated[Path, typer.Argument(help="config it will be loaded under")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    limit: Annotated[int, typer.Option(help="ranks to list in the table")] = 16,
) -> None:
    """Which rank's experts (global ids, ETP shards) move where, and the bytes each rank reads."""
    from planner.reshard import model_differences, reshard_plan

    old_cfg = load_config_or_exit(old, as_json=as_json)
    new_cfg = load_config_or_exit(new, as_json=as_json)
    exit_on_errors(old_cfg, as_json=as_json)
    exit_on_errors(new_cfg, as_json=as_json)
    differences = model_differences(old_cfg, new_cfg)
    if differences:
        if as_json:
            print(json.dumps({"same_model": False, "findings": findings_json(differences)}, indent=2))
        else:
            print_findings(differences)
        raise typer.Exit(EXIT_CONFIG)
    plan = reshard_plan(old_cfg, new_cfg)
    if as_json:
        print(json.dumps(plan, indent=2))
        return
    o, n = plan["old"], plan["new"]
    stdout.print(f"same model; EP {o['ep']}×ETP {o['etp']}×PP {o['pp']} (EDP {o['edp']}) → "
                 f"EP {n['ep']}×ETP {n['etp']}×PP {n['pp']} (EDP {n['edp']}); "
                 f"{plan['bytes_per_parameter']} B per expert parameter (weight + Adam state)")
    table = Table(title="routed-expert reads per new rank", title_justify="left")
    for column in ("rank", "stage", "global experts", "I range", "already local", "to read", "from"):
        table.add_column(column, justify="right" if column in {"rank", "stage"} else "left")
    for row in plan["ranks"][:limit]:
        ids = row["expert_ids"]
        experts = f"{ids[0]}–{ids[-1]}" if ids else "-"
        sources = ", ".join(sorted(row["sources"], key=int)[:6]) + ("…" if len(row["sources"]) > 6 else "")
        i_range = "{}:{}".format(*row["intermediate_range"])
        table.add_row(str(row["rank"]), str(row["stage"]), experts, i_range,
                      format_bytes(row["local_bytes"]), format_bytes(row["read_bytes"]), sources or "-")
    stdout.print(table)
    stdout.print(f"total to read: {format_bytes(plan['total_read_bytes'])}; already in place: "
                 f"{format_bytes(plan['total_local_bytes'])}")
    if plan["drops"] is not None:  # capacity dropping: do both layouts drop the same assignments?
        stdout.print(f"capacity drops: {plan['drops']['why']}")


def register(app: typer.Typer) -> None:
    app.command("reshard-plan")(reshard_plan_command)

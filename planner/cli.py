"""The `moeplan` command line: typer parses arguments, the command modules call the library.

Each module in COMMAND_MODULES exposes `register(app)`; heavy imports stay inside the commands so
`moeplan check` starts fast.
"""

from __future__ import annotations

import importlib

import typer

COMMAND_MODULES: tuple[str, ...] = (
    "planner.commands.check",
    "planner.commands.groups",
    "planner.commands.compile",
    "planner.commands.rules",
    "planner.commands.reshard",
    "planner.commands.emit",
    "planner.commands.launch",
    "planner.commands.budget",
    "planner.commands.verify",
    "planner.commands.import_",
    "planner.commands.import_hf",
    "planner.commands.estimate",
    "planner.commands.calibrate",
    "planner.commands.report",
    "planner.commands.search",
)

app = typer.Typer(
    name="moeplan",
    help="Compile a Megatron MoE training config: check it, list its groups, budget it, launch it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


if __name__ == "__main__":
    app()

"""The `moeplan` command line: typer parses arguments, the command modules call the library.

Each module in COMMANDS exposes `register(app)`. A run imports only the module(s) of the command it
names (`moeplan check …` never imports the search, the emitters or the report, nor has typer read
the other fourteen commands' signatures); `moeplan --help`, a mistyped command and anything that
reads the app as a whole (typer's test runner) see every command.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def _imports_without_collection() -> Iterator[None]:
    """Start-up builds a few hundred thousand objects (modules, classes, pydantic's schema) and frees
    almost none: the cycle collector's passes over them find nothing and cost a few percent of a
    command's start. It is off while modules load and back as it was before the command runs."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


with _imports_without_collection():
    import typer
    import typer.main

# moeplan validates its own schema only: pydantic's plugin hook would look for observers with an
# entry-point scan of every installed distribution when the first model class is built (a third of
# the schema's build time, more in a large environment). Set PYDANTIC_DISABLE_PLUGINS yourself
# (empty: every plugin) to have them loaded.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

# Command name -> the modules whose register(app) adds it, in `moeplan --help` order.
COMMANDS: dict[str, tuple[str, ...]] = {
    "check": ("planner.commands.check",),
    "groups": ("planner.commands.groups",),
    "compile": ("planner.commands.compile",),
    "rules": ("planner.commands.rules",),
    "reshard-plan": ("planner.commands.reshard",),
    "emit": ("planner.commands.emit",),
    "launch": ("planner.commands.launch",),
    "budget": ("planner.commands.budget",),
    "verify": ("planner.commands.verify",),
    "import": ("planner.commands.import_", "planner.commands.import_hf"),
    "estimate": ("planner.commands.estimate",),
    "calibrate": ("planner.commands.calibrate",),
    "report": ("planner.commands.report",),
    "search": ("planner.commands.search",),
}
COMMAND_MODULES: tuple[str, ...] = tuple(m for modules in COMMANDS.values() for m in modules)


class CommandLine(typer.Typer):
    """A Typer app whose commands are registered when first needed.

    `registered_commands`/`registered_groups` load every command on first read (typer builds the
    click group from them); `__call__` loads only the command named on the command line and builds
    the same click group from it alone, so the invoked command parses, helps and fails as in the
    full group."""

    def __init__(self, **kwargs: Any) -> None:
        self._loaded: list[str] = []
        self._partial = False  # registering, or building a group of the commands loaded so far
        self._commands: list[Any] = []
        self._groups: list[Any] = []
        super().__init__(**kwargs)

    def _load(self, modules: tuple[str, ...]) -> None:
        partial, self._partial = self._partial, True  # register() appends through the lists below
        try:
            for module in modules:
                if module not in self._loaded:
                    self._loaded.append(module)
                    importlib.import_module(module).register(self)
        finally:
            self._partial = partial

    def _load_all(self) -> None:
        if not self._partial:
            self._load(COMMAND_MODULES)

    @property  # type: ignore[override]
    def registered_commands(self) -> list[Any]:
        self._load_all()
        return self._commands

    @registered_commands.setter
    def registered_commands(self, value: list[Any]) -> None:
        self._commands = value

    @property  # type: ignore[override]
    def registered_groups(self) -> list[Any]:
        self._load_all()
        return self._groups

    @registered_groups.setter
    def registered_groups(self, value: list[Any]) -> None:
        self._groups = value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        argv = kwargs.get("args", args[0] if args else None)
        own_command_line = argv is None  # the console script and `python -m planner.cli`
        argv = sys.argv[1:] if argv is None else list(argv)
        modules = COMMANDS.get(argv[0]) if argv else None
        if modules is None:
            return super().__call__(*args, **kwargs)
        with _imports_without_collection():
            self._load(modules)
            # The group typer would build from every command (pretty exceptions are off, so
            # typer's own __call__ adds nothing else), holding only the ones loaded so far: the one
            # asked for, and any an earlier call in this process loaded.
            self._partial = True
            try:
                group = typer.main.get_group(self)
            finally:
                self._partial = False
        if own_command_line:
            # What start-up built lives as long as the process: the collector's later passes (and
            # the one at interpreter exit) need not walk it again. A caller that passes arguments
            # (a test runner running many commands) keeps collecting normally.
            gc.freeze()
        return group(*args, **kwargs)


app = CommandLine(
    name="moeplan",
    help="Compile a Megatron MoE training config: check it, list its groups, budget it, launch it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


if __name__ == "__main__":
    app()

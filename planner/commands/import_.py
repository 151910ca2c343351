"""`moeplan import …`: turn what users already have into a moeplan config (minimal sub-app; each
importer module exposes `register(import_app)`)."""

from __future__ import annotations

import importlib

import typer

IMPORTER_MODULES: tuple[str, ...] = ("planner.commands.import_hf",)

import_app = typer.Typer(name="import", help="Write a moeplan config from an existing model or launch "
                         "description.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    for module in IMPORTER_MODULES:
        importlib.import_module(module).register(import_app)
    app.add_typer(import_app, name="import")

"""Run a few pure functions of the Megatron-LM oracle straight from its source, without importing
its GPU stack: the function definitions are compiled from the file and run as they are."""

from __future__ import annotations

import ast
from typing import Any

import pytest

from tests.support.oracle import megatron_lm_dir


def megatron_functions(relative: str, names: set[str], **scope: Any) -> dict[str, Any]:
    """The named top-level functions of `megatron/<relative>`, with `scope` standing in for the
    module-level names they read; skips the test when the source is absent."""
    root, why_missing = megatron_lm_dir()
    if root is None:
        pytest.skip(why_missing)
    path = root / "megatron" / relative
    tree = ast.parse(path.read_text())
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in found} == names, f"{relative} lacks {names - {n.name for n in found}}"
    namespace: dict[str, Any] = dict(scope)
    exec(compile(ast.Module(found, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace

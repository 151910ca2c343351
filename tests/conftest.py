"""Shared fixtures. Constants tests import live in tests/support/ (paths, base_configs)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.base_configs import MINIMAL_V4


@pytest.fixture
def minimal_v4() -> dict[str, Any]:
    return copy.deepcopy(MINIMAL_V4)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`-n 2 --dist loadgroup`, the README's command) a module whose tests share
    a module-scoped fixture of its own — a multi-rank run, the local Slurm cluster (munge's socket
    is machine-wide), a compiled search — runs on one worker, so that fixture is built once and
    never twice at the same time. Every other test is spread test by test."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = any(definition.scope != "function" and definition.baseid
                     for definitions in info.name2fixturedefs.values() for definition in definitions)
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))

"""Shared fixtures. Constants tests import live in tests/support/ (paths, base_configs).

The README runs the suite on two pytest-xdist workers with `--dist loadfile`: each test file stays
on one worker, so a module-scoped fixture (a multi-rank run, the local Slurm cluster whose munge
socket is machine-wide, a compiled search) is built once. (`--dist loadgroup` would spread finer,
but xdist 3.8.0 groups by rewriting `item._nodeid`, which pytest 9 no longer reads.)
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest

from tests.support.base_configs import MINIMAL_V4

if "PYTEST_XDIST_WORKER" in os.environ:
    # xdist's workers start with COLUMNS=80 and LINES=24; a user's pipe has neither, and the CLI
    # chooses its piped width (planner/cli_common.py) on whether COLUMNS is set.
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


# The result cache (planner/files/result_cache.py) is off unless a test turns it on: no test reads an
# answer another test, or an earlier run of the suite, stored.
os.environ["MOEPLAN_CACHE_DIR"] = ""


@pytest.fixture
def minimal_v4() -> dict[str, Any]:
    return copy.deepcopy(MINIMAL_V4)

"""Shared fixtures. Constants tests import live in tests/support/ (paths, base_configs).

The README runs the suite on two pytest-xdist workers with `--dist loadfile`: each test file stays
on one worker, so a module-scoped fixture (a multi-rank run, the local Slurm cluster whose munge
socket is machine-wide, a compiled search) is built once. (`--dist loadgroup` would spread finer,
but xdist 3.8.0 groups by rewriting `item._nodeid`, which pytest 9 no longer reads.)

The files are handed out heaviest first (tests/support/suite_order.py): xdist's own order
(`--loadscope-reorder`, on by default) is by test count alone, which left the few-test files that
each run a multi-rank job or Megatron for the end, one worker finishing alone.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
from hypothesis import settings

from tests.support.base_configs import MINIMAL_V4
from tests.support.suite_order import heaviest_first

if "PYTEST_XDIST_WORKER" in os.environ:
    # xdist's workers start with COLUMNS=80 and LINES=24; a user's pipe has neither, and the CLI
    # chooses its piped width (planner/cli_common.py) on whether COLUMNS is set.
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


# No per-example deadline for property tests (hypothesis's default is 200 ms of wall time): on two
# cores shared with other workers' torchrun ranks, an example that fits it alone took 721 ms and
# failed the suite (test_moe_layer_dist.py test_chunk_sort_index_makes_rows_expert_major). A
# test's own @settings still wins; the suite's timeout (pyproject.toml) bounds a runaway test.
settings.register_profile("moeplan", deadline=None)
settings.load_profile("moeplan")

# The result cache (planner/files/result_cache.py) is off unless a test turns it on: no test reads an
# answer another test, or an earlier run of the suite, stored.
os.environ["MOEPLAN_CACHE_DIR"] = ""


def pytest_configure(config: pytest.Config) -> None:
    """`--dist loadfile` hands out the files in collection order, which `pytest_collection_modifyitems`
    sets, instead of xdist's by-test-count order."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files heaviest first (tests/support/suite_order.py); every worker sorts the same
    collection the same way, as xdist requires."""
    items[:] = heaviest_first([item.nodeid for item in items], items)


@pytest.fixture
def minimal_v4() -> dict[str, Any]:
    return copy.deepcopy(MINIMAL_V4)

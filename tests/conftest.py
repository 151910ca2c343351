"""Shared fixtures. Constants tests import live in tests/support/ (paths, base_configs).

The README runs the suite on two pytest-xdist workers with `--dist loadfile`: each test file stays
on one worker, so a module-scoped fixture (a multi-rank run, the local Slurm cluster whose munge
socket is machine-wide, a compiled search) is built once. (`--dist loadgroup` would spread finer,
but xdist 3.8.0 groups by rewriting `item._nodeid`, which pytest 9 no longer reads.)

The files are handed out heaviest first (`HEAVY_FILES`, then the rest by test count as xdist
would order them): xdist's own order (`--loadscope-reorder`, on by default) is by test count
alone, which left the few-test files that each run a multi-rank job or Megatron for the end,
one worker finishing alone.
"""

from __future__ import annotations

import copy
import os
from collections import Counter
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


# Seconds a file took on an idle 2-core machine (pytest --durations=0, summed per file, 2026-12-07),
# heaviest first: a file of a few tests that each start torchrun, Megatron or Slurm can outweigh
# one of hundreds of unit tests. Only the order depends on these figures.
HEAVY_FILES = (
    "tests/integration/megatron/test_megatron_oracle.py",
    "tests/unit/search/test_search.py",
    "tests/integration/cli/test_fuzz_pipeline.py",
    "tests/unit/config/test_presets.py",
    "tests/unit/config/test_launch_corpus.py",
    "tests/integration/runtime/test_runtime_equivalence.py",
    "tests/integration/runtime/test_checkpoint.py",
    "tests/integration/runtime/test_hung.py",
    "tests/integration/runtime/test_runtime_cli.py",
    "tests/unit/config/test_import_megatron.py",
    "tests/integration/runtime/test_moe_layer_dist.py",
    "tests/integration/runtime/test_failure.py",
    "tests/integration/slurm/test_slurm.py",
    "tests/unit/budget/test_whole_bytes.py",
    "tests/integration/runtime/test_emit_run.py",
    "tests/integration/runtime/test_pipeline_runtime.py",
    "tests/unit/runtime/test_plan_reading.py",
    "tests/integration/megatron/test_megatron_core_groups.py",
    "tests/unit/layout/test_grid.py",
    "tests/integration/cli/test_golden_outputs.py",
    "tests/integration/cli/test_hostile_inputs.py",
    "tests/unit/config/test_model_fields.py",
    "tests/unit/runtime/test_comm.py",
    "tests/integration/transformers/test_meta_counts.py",
    "tests/integration/browser/test_report.py",
    "tests/unit/emit/test_emit.py",
    "tests/integration/slurm/test_wheel.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """`--dist loadfile` hands out the files in collection order, which `pytest_collection_modifyitems`
    sets, instead of xdist's by-test-count order."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each file's tests stay together and in their order; the files heaviest first (`HEAVY_FILES`),
    then the rest by test count, most first, as xdist orders them. Every worker sorts the same
    collection the same way, as xdist requires."""
    files = [item.nodeid.split("::", 1)[0] for item in items]
    counts = Counter(files)
    first_seen = {name: place for place, name in reversed(list(enumerate(files)))}
    rank = {name: place for place, name in enumerate(HEAVY_FILES)}

    def key(name: str) -> tuple[int, int, int]:
        return rank.get(name, len(HEAVY_FILES)), -counts[name], first_seen[name]

    order = {name: key(name) for name in counts}
    items[:] = [item for _, item in sorted(enumerate(items),
                                           key=lambda pair: (order[files[pair[0]]], pair[0]))]


@pytest.fixture
def minimal_v4() -> dict[str, Any]:
    return copy.deepcopy(MINIMAL_V4)

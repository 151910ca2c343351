"""Megatron-LM as the tests' judge, through the shipped pre-flight (`planner.emit.megatron_check`,
which runs `planner/emit/megatron_probe.py`): no test-only way of running Megatron exists.

Megatron's import is most of a probe run's cost (6-7 s with torch's, then well under a second per config), so
the fixed configs of every test module share one run: a module registers each config when it is
imported (pytest imports every module before it runs a test), and the first verdict asked for
judges everything registered so far in one subprocess. Generated (hypothesis) configs are judged
in batches with `judge_configs`. Tests skip, with the reason, where there is no Megatron-LM checkout.

Under pytest-xdist every worker imports every module, so every worker registers the same cases: the
first worker to ask judges them and leaves the run in a folder of this test run's own
(`PYTEST_XDIST_TESTRUNUID`), and the others wait on its lock and read it instead of starting
Megatron again. The batch is known by its cases' names (one run's workers register the same
cases under the same names), so a worker that reads the run does not compile the cases' plans.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from planner.cli_common import collect_findings
from planner.config.schema import Config
from planner.emit.megatron_check import (
    CheckRequest,
    CheckResult,
    CheckRun,
    expected_values,
    judge,
    megatron_hashed,
    request_for,
)
from planner.findings import has_errors
from planner.plan import compile_plan
from tests.support.oracle import megatron_lm_dir

Case = Callable[[], tuple[CheckRequest, dict[str, Any]]]

_pending: dict[str, Case] = {}
_verdicts: dict[str, CheckResult] = {}
_stand_ins: list[str] = []


def require_oracle() -> Path:
    """The Megatron-LM checkout, or skip with the reason (it is absent outside this repository's CI)."""
    folder, why_missing = megatron_lm_dir()
    if folder is None:
        pytest.skip(why_missing)
    return folder


def plan_of(cfg: Config) -> dict[str, Any]:
    findings = collect_findings(cfg)
    assert not has_errors(findings), [f.as_dict() for f in findings if f.severity == "error"]
    return compile_plan(cfg, findings)


def case_of(cfg: Config, name: str) -> Case:
    """The emitted request for `cfg` and the plan's values, made when the batch runs; Megatron's own
    config container is asked for the `emit bridge` overrides too (planner/emit/bridge.py)."""
    return lambda: (request_for(cfg, name, bridge=True), expected_values(cfg, plan_of(cfg), bridge=True))


def register(name: str, case: Case) -> None:
    """Judge `case` in the shared run; `verdict(name)` reads the result. A name stands for one case:
    registering it again keeps the first (several modules register the examples by file name)."""
    if name not in _pending and name not in _verdicts:
        _pending[name] = case


def verdict(name: str) -> CheckResult:
    """Megatron's verdict on a registered case (the first call judges every case registered so far)."""
    megatron = require_oracle()
    if name not in _verdicts:
        names = list(_pending)
        run = _shared_judge(names, [_pending.pop(one) for one in names], megatron)
        _verdicts.update(zip(names, run.results, strict=True))
        _stand_ins[:] = run.stand_ins
    return _verdicts[name]


def _judged(cases: list[Case], megatron: Path) -> CheckRun:
    made = [case() for case in cases]
    return judge([request for request, _ in made], [want for _, want in made], megatron, sys.executable)


def _shared_judge(names: list[str], cases: list[Case], megatron: Path) -> CheckRun:
    """`judge` on the batch, once per test run: workers with the same batch read the first one's run."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:  # one process: nobody to share with
        return _judged(cases, megatron)
    key = hashlib.sha256(json.dumps(names).encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"moeplan-oracle-{run_id}"
    folder.mkdir(mode=0o700, exist_ok=True)
    saved = folder / f"{key}.pickle"
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if saved.exists():
            with saved.open("rb") as stream:
                return pickle.load(stream)  # noqa: S301 - written by this test run's own worker
        run = _judged(cases, megatron)
        partial = saved.with_suffix(".partial")
        with partial.open("wb") as stream:
            pickle.dump(run, stream)
        partial.replace(saved)
        return run


def shared_stand_ins() -> list[str]:
    """The stand-ins the shared run listed (after at least one `verdict`)."""
    return list(_stand_ins)


def judge_configs(configs: list[Config]) -> list[CheckResult]:
    """Megatron's verdicts on `configs`, all in one probe subprocess."""
    megatron = require_oracle()
    requests = [request_for(cfg, f"config {i}") for i, cfg in enumerate(configs)]
    expected = [expected_values(cfg, plan_of(cfg)) for cfg in configs]
    return judge(requests, expected, megatron, sys.executable).results


def hashed_blocks(result: CheckResult) -> set[int]:
    """The plan's MoE blocks Megatron hash-routed, over every pipeline rank and virtual stage."""
    ours = {(c["stage"], c["virtual"]): c for c in result.expected["chunks"]}
    built = result.derived.get("hash_routing_built")
    found: set[int] = set()
    for chunk in result.derived["chunks"]:
        hashed = megatron_hashed(ours[chunk["stage"], chunk["virtual"]], chunk, built)
        assert hashed is not None, (result.name, chunk)
        found.update(hashed)
    return found


class _CountingRequest(CheckRequest):
    """A request that also asks the probe for the parameters of Megatron's model built whole."""

    def as_json(self) -> dict[str, Any]:
        return {**super().as_json(), "count_parameters": True}


def counting(plain: CheckRequest) -> CheckRequest:
    """The same request, asking the probe also for the parameters of Megatron's model built whole
    (derived["parameters"]); it can join the shared run through `register`."""
    return _CountingRequest(plain.name, plain.entry, plain.argv, plain.env, plain.world_size)

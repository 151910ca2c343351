"""Failing cleanly: a rank that dies or raises mid-step ends the whole torchrun job fast, with a
non-zero exit and a message naming the rank; a tampered or other-version plan never starts one.

The faults are injected with the test-only MOEPLAN_TEST_FAIL variable (runtime/failure.py):
rank 1 of a 2-rank EP2 job raises, and rank 3 (last stage) of a 4-rank PP2×EP2 job is killed by
SIGKILL, in microbatch 1 of step 1 — after the other ranks have entered the step's collectives,
so without teardown they would wait forever.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runtime.failure import FAIL_VARIABLE, maybe_inject_failure, rank_failure_message
from tests.support.launch import ENV, small
from tests.support.paths import ROOT

PYTHON = sys.executable
DEADLINE_S = 60.0


def _run_with_fault(plan: Path, fault: str, nproc: int = 2
                    ) -> tuple[subprocess.CompletedProcess[str], float]:
    # A long group timeout: the job must end because the failure is propagated, not because a
    # collective timed out.
    env = {**ENV, FAIL_VARIABLE: fault, "MOEPLAN_GROUP_TIMEOUT_S": "600"}
    command = [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "runtime", "--plan", str(plan), "--steps", "3"]
    started = time.monotonic()
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return run, time.monotonic() - started


def test_a_raising_rank_ends_the_job_and_is_named(tmp_path: Path) -> None:
    plan = small(tmp_path)
    run, elapsed = _run_with_fault(plan, "raise:1:1:1")
    assert run.returncode != 0
    assert elapsed < DEADLINE_S, f"the job took {elapsed:.1f} s to end"
    assert "moeplan runtime: rank 1 failed: InjectedFailure" in run.stderr, run.stderr[-3000:]
    # the run was really mid-job: step 1 of 3 had begun on the surviving rank
    assert "step 1/3" in run.stderr


def test_a_killed_last_stage_rank_ends_a_pipelined_job(tmp_path: Path) -> None:
    """PP2×EP2 on 4 ranks: rank 3 (last stage, in an EP2 group) dies by SIGKILL in microbatch 1
    of step 1 while the first stage waits for its activation gradients and its EP peer in the
    dispatch; the job still ends well within the deadline and torchrun's agent names the dead
    worker and its signal. (The kill of rank 1 in a 2-rank EP2 job had a launch of its own.)"""
    plan = small(tmp_path, "pp2", model={"num_layers": 2},
                 parallel={"world_size": 4, "pp": 2, "ep": 2})
    run, elapsed = _run_with_fault(plan, "kill:3:1:1", nproc=4)
    assert run.returncode != 0
    assert elapsed < DEADLINE_S, f"the job took {elapsed:.1f} s to end"
    output = run.stdout + run.stderr
    assert "rank      : 3" in output or "rank: 3" in output, output[-3000:]
    assert "SIGKILL" in output or "-9" in output
    assert "step 1/3" in run.stderr


def test_injection_is_inert_without_the_variable_and_on_other_ranks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAIL_VARIABLE, raising=False)
    maybe_inject_failure(0, 0, 0)
    monkeypatch.setenv(FAIL_VARIABLE, "raise:1:2:3")
    maybe_inject_failure(0, 2, 3)
    maybe_inject_failure(1, 2, 2)
    with pytest.raises(RuntimeError, match="step 2, microbatch 3"):
        maybe_inject_failure(1, 2, 3)
    monkeypatch.setenv(FAIL_VARIABLE, "explode:1:2:3")  # malformed: ignored, never a crash
    maybe_inject_failure(1, 2, 3)


def test_failure_message_names_the_rank() -> None:
    message = rank_failure_message(5, ValueError("bad shape\nmore"))
    assert message.startswith("rank 5 failed: ValueError: bad shape;")
    assert "\n" not in message


TAMPERED = [
    (lambda d: d["layout"].update(ep=1), "digest mismatch"),
    (lambda d: d.update(version=99), "version 99"),
    (lambda d: d.update(moeplan_version="0.0.0-other"), "digest mismatch"),
]


def _tampered(folder: Path, edit: Any, message: str) -> Path:
    from planner.plan_format import plan_digest

    document = json.loads(small(folder).read_text())
    edit(document)
    if "version 99" in message:  # another version, digested consistently
        document["digest"] = plan_digest(document)
    target = folder / "edited.plan.json"
    target.write_text(json.dumps(document))
    return target


@pytest.mark.parametrize(("edit", "message"), TAMPERED)
def test_tampered_or_foreign_plans_are_refused_before_any_group(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, message: str) -> None:
    """In-process `main`: exit 2 with the message, before torch.distributed starts."""
    import torch.distributed as dist

    from runtime.__main__ import main

    assert main(["--plan", str(_tampered(tmp_path, edit, message))]) == 2
    assert message in capsys.readouterr().err
    assert not dist.is_initialized()


def test_a_tampered_plan_never_starts_a_torchrun_job(tmp_path: Path) -> None:
    """Under torchrun with 2 ranks: every rank refuses (exit 2) before any process group forms,
    so no rendezvous timeout, no traceback. Each rank refuses in `load_plan`, before torch
    loads, whatever the edit (the edits above): one job shows it for all."""
    edit, message = TAMPERED[1]
    target = _tampered(tmp_path, edit, message)
    started = time.monotonic()
    run = subprocess.run(
        [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
         "runtime", "--plan", str(target)],
        cwd=ROOT, env={**ENV, "MOEPLAN_WORLD_TIMEOUT_S": "600"}, capture_output=True,
        text=True, timeout=120)
    assert run.returncode != 0
    assert time.monotonic() - started < 30
    assert message in run.stderr
    # torchrun's launcher prints its own ChildFailedError traceback; no frame may be ours.
    assert not re.search(r'File "[^"]*/runtime/', run.stderr), run.stderr[-3000:]

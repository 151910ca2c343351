"""A rank that stops, or never arrives, ends the job within a bound and is named.

Both run `python -m runtime`'s own `main` on real TCP stores and gloo groups, in processes forked
from this one (torch is already imported here: a world costs a fraction of a second, where a
torchrun launch costs three torch imports); the torchrun figures are in docs/runtime.md.

* SIGSTOP (runtime/failure.py `stop`): rank 1 of a 2-rank job stops itself in microbatch 1 of
  step 1. It raises nothing and keeps its sockets open; rank 0's heartbeat watcher
  (runtime/heartbeat.py) names it after half the group timeout (4 s here), SIGKILLs it (same
  host) and exits 4.
* Rendezvous (runtime/rendezvous.py), in this process: rank 0 of 2 whose peer never starts, and
  rank 1 of 2 whose store (rank 0 hosts it) never comes up, each end after the rendezvous timeout
  (1 s here) with exit 4 and the missing rank or address named.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest

import runtime.checkpoint  # noqa: F401 - what main imports, loaded before the clock starts
import runtime.groups
import runtime.train  # noqa: F401
from runtime.__main__ import EXIT_PEER_LOST, main
from runtime.failure import FAIL_VARIABLE
from tests.support.launch import small
from tests.support.ports import free_port

BOUND_S = 15.0


def _job_env(monkeypatch: pytest.MonkeyPatch, world: int) -> None:
    """The variables torchrun would set, less the agent store: rank 0 hosts the store."""
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    for variable, value in {"LOCAL_RANK": 0, "WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": free_port()}.items():
        monkeypatch.setenv(variable, str(value))


def test_a_stopped_rank_is_named_and_ends_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    plan = small(tmp_path)
    _job_env(monkeypatch, 2)
    monkeypatch.setenv(FAIL_VARIABLE, "stop:1:1:1")
    monkeypatch.setattr(runtime.groups, "GROUP_TIMEOUT", timedelta(seconds=4))

    def rank_main(rank: int) -> None:
        os.environ["RANK"] = str(rank)
        os._exit(main(["--plan", str(plan), "--steps", "3"]))

    fork = multiprocessing.get_context("fork")
    ranks = [fork.Process(target=rank_main, args=(rank,)) for rank in range(2)]
    started = time.monotonic()
    try:
        for process in ranks:
            process.start()
        for process in ranks:
            process.join(BOUND_S)
    finally:
        for process in ranks:  # SIGKILL reaches a stopped process too: none is left behind
            if process.is_alive():
                process.kill()
                process.join()
    elapsed = time.monotonic() - started
    err = capfd.readouterr().err
    assert elapsed < BOUND_S, f"the job took {elapsed:.1f} s to end"
    assert [process.exitcode for process in ranks] == [EXIT_PEER_LOST, -9], err[-3000:]
    assert "rank 1 stops itself" in err
    assert "moeplan runtime: rank 0: rank 1 stopped responding: no heartbeat for" in err
    assert "step 1/3" in err  # it really was mid-run
    # the beat thread wakes at each new step; whether it ran before the stop is up to the scheduler
    assert re.search(r"rank 1's last beat reported step [01], microbatch \d", err)


@pytest.mark.parametrize(("rank", "named"), ids=["peer_never_starts", "store_never_up"], argvalues=[
    (0, r"rank 0: 1 of 2 ranks never arrived at the rendezvous at 127\.0\.0\.1:\d+ within 1 s "
        r"\(MOEPLAN_RENDEZVOUS_TIMEOUT_S\): rank 1; the job stops"),
    (1, r"rank 1: no rendezvous store answered at 127\.0\.0\.1:\d+ within 1 s .*rank 0 hosts it"),
])
def test_a_dead_rendezvous_ends_in_bounded_time_naming_what_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        rank: int, named: str) -> None:
    plan = small(tmp_path)
    _job_env(monkeypatch, 2)
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setattr(runtime.groups, "RENDEZVOUS_TIMEOUT", timedelta(seconds=1))
    started = time.monotonic()
    code = main(["--plan", str(plan)])
    elapsed = time.monotonic() - started
    assert code == EXIT_PEER_LOST
    assert elapsed < 5, f"the rendezvous took {elapsed:.1f} s to give up"
    assert re.search(named, capsys.readouterr().err)

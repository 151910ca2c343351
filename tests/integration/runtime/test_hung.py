"""A rank that stops, or never arrives, ends the job within a bound and is named.

Both run `python -m runtime` on real TCP stores and gloo groups: the stopped rank's job as two
`python -m runtime` processes with the variables torchrun would set (rank 0 hosts the store; no
agent, so no third torch import), the rendezvous cases as `main` in this process. The torchrun
figures are in docs/runtime.md.

* SIGSTOP (runtime/failure.py `stop`): rank 1 of a 2-rank job stops itself in microbatch 1 of
  step 1. It raises nothing and keeps its sockets open; rank 0's heartbeat watcher
  (runtime/heartbeat.py) names it after half the group timeout (4 s here), SIGKILLs it (same
  host) and exits 4.
* Rendezvous (runtime/rendezvous.py), in this process: rank 0 of 2 whose peer never starts, and
  rank 1 of 2 whose store (rank 0 hosts it) never comes up, each end after the rendezvous timeout
  (1 s here) with exit 4 and the missing rank or address named.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest

import runtime.checkpoint  # noqa: F401 - what main imports, loaded before the clock starts
import runtime.groups
import runtime.train  # noqa: F401
from runtime.__main__ import EXIT_PEER_LOST, main
from runtime.failure import FAIL_VARIABLE
from tests.support.launch import ENV, PYTHON, small
from tests.support.paths import ROOT
from tests.support.ports import free_port

GROUP_TIMEOUT_S = 4
# a guard against a hang, not the claim: two interpreters start on a loaded CI box within it
BOUND_S = 120


def _job_env(monkeypatch: pytest.MonkeyPatch, world: int) -> None:
    """The variables torchrun would set, less the agent store: rank 0 hosts the store."""
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    for variable, value in {"LOCAL_RANK": 0, "WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": free_port()}.items():
        monkeypatch.setenv(variable, str(value))


def _two_ranks(plan: Path, fail: str) -> tuple[list[int], list[str]]:
    """Ranks 0 and 1 as two `python -m runtime` processes (rank 0 hosts the store), the one FAIL
    names stopping itself; each rank's exit code and stderr, none left behind."""
    port = free_port()
    env = {key: value for key, value in ENV.items() if key != "TORCHELASTIC_USE_AGENT_STORE"}
    env.update(WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               MOEPLAN_GROUP_TIMEOUT_S=str(GROUP_TIMEOUT_S), **{FAIL_VARIABLE: fail})
    ranks = [subprocess.Popen([PYTHON, "-m", "runtime", "--plan", str(plan), "--steps", "3"],
                              cwd=ROOT, env={**env, "RANK": str(rank)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    stopped = int(fail.split(":")[1])
    try:  # the rank that stopped itself never ends: collect the other first
        errs = {rank: ranks[rank].communicate(timeout=BOUND_S)[1] for rank in (1 - stopped,)}
    finally:
        for process in ranks:  # SIGKILL reaches a stopped process too: none is left behind
            if process.poll() is None:
                process.kill()
    errs[stopped] = ranks[stopped].communicate()[1]
    return [process.returncode for process in ranks], [errs[0], errs[1]]


def test_a_stopped_rank_is_named_and_ends_the_job(tmp_path: Path) -> None:
    codes, errs = _two_ranks(small(tmp_path), "stop:1:1:1")
    err = "".join(errs)
    assert codes == [EXIT_PEER_LOST, -9], err[-3000:]
    assert "rank 1 stops itself" in err
    named = re.search(r"moeplan runtime: rank 0: rank 1 stopped responding: no heartbeat for "
                      r"([\d.]+) s", err)
    assert named is not None, err[-3000:]
    # named after half the group timeout, before any collective's own timeout blames rank 0
    assert GROUP_TIMEOUT_S / 2 <= float(named.group(1)) < GROUP_TIMEOUT_S
    assert "step 1/3" in err  # it really was mid-run
    # the beat thread wakes at each new step; whether it ran before the stop is up to the scheduler
    assert re.search(r"rank 1's last beat reported step [01], microbatch \d", err)


def test_a_frozen_head_node_is_named_within_the_group_timeout(tmp_path: Path) -> None:
    """Rank 0 stops (SIGSTOP: a frozen head node) and, as it hosts the store, the store with it:
    rank 1's store watchdog names the store's host and the head node within half the group
    timeout. Before, rank 1 ended in a raw gloo send timeout that named nobody."""
    codes, (zero, one) = _two_ranks(small(tmp_path), "stop:0:1:1")
    assert codes == [-9, EXIT_PEER_LOST], (zero + one)[-3000:]
    assert "rank 0 stops itself" in zero and "step 1/3" in zero  # it really was mid-run
    named = re.search(r"moeplan runtime: rank 1: the job's store at 127\.0\.0\.1:\d+ \(rank 0 "
                      r"hosts it\) has not answered for ([\d.]+) s \(limit 2 s, half of "
                      r"MOEPLAN_GROUP_TIMEOUT_S\); rank 0 stopped responding; the head node \S+ "
                      r"\(rank 0\) was last heard ([\d.]+) s ago; the job stops", one)
    assert named is not None, one[-3000:]
    assert GROUP_TIMEOUT_S / 2 <= float(named.group(1)) < GROUP_TIMEOUT_S
    assert float(named.group(2)) < GROUP_TIMEOUT_S
    assert "Traceback" not in one and "gloo" not in one.lower()  # no raw collective timeout


def _children(pid: int) -> list[int]:
    return [int(child) for child in
            Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _state(pid: int) -> str:
    """A process's state letter (R, S, T stopped, Z exited and not yet reaped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_stopped_store_host_is_named_by_every_rank(tmp_path: Path) -> None:
    """torchrun's agent hosts the store; SIGSTOP it mid-run (a stopped agent, a frozen launcher):
    both ranks' store watchdogs name the store and its host and exit within half the group
    timeout. Before, the ranks trained on with no message (step 970, killed from outside)."""
    log = tmp_path / "job.err"
    env = {**ENV, "MOEPLAN_GROUP_TIMEOUT_S": str(GROUP_TIMEOUT_S)}
    with log.open("w") as sink:
        agent = subprocess.Popen(
            [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
             "-m", "runtime", "--plan", str(small(tmp_path)), "--steps", "100000"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        deadline = time.monotonic() + BOUND_S
        while "step 2/" not in log.read_text() and time.monotonic() < deadline:
            assert agent.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        ranks = _children(agent.pid)
        assert len(ranks) == 2, log.read_text()[-3000:]
        agent.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 3 * GROUP_TIMEOUT_S  # generous: a loaded CI box
        while any(_state(rank) != "Z" for rank in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        states = [_state(rank) for rank in ranks]  # exited: zombies the stopped agent cannot reap
    finally:
        agent.kill()
        agent.communicate()
    err = log.read_text()
    assert states == ["Z", "Z"], err[-3000:]
    for rank in (0, 1):
        named = re.search(rf"moeplan runtime: rank {rank}: the job's store at \S+:\d+ \(torchrun's "
                          r"agent hosts it\) has not answered for ([\d.]+) s \(limit 2 s, half of "
                          r"MOEPLAN_GROUP_TIMEOUT_S\); torchrun's agent stopped responding", err)
        assert named is not None, err[-3000:]
        assert GROUP_TIMEOUT_S / 2 <= float(named.group(1)) < GROUP_TIMEOUT_S
    assert "Traceback" not in err


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

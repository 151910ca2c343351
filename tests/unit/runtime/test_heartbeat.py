"""The heartbeat's judgement in one process: real stores and threads, no ranks launched.

Two `Heartbeat`s for ranks 0 and 1 of a 2-rank job share a store this test hosts; the one whose
thread never starts plays the stopped process. `_end` (print, SIGKILL a local peer, exit) is
replaced by a recorder, since ending the test process is the real one's job.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from runtime.heartbeat import PROGRESS, Heartbeat, Limits, describe, note_microbatch, note_phase
from runtime.rendezvous import (
    DifferentPlanError,
    Endpoint,
    LaunchEnvironmentError,
    RendezvousError,
    check_in,
    rank_list,
)
from tests.support.ports import free_port

LIMITS = Limits(stall_after=0.6, period=0.1)  # loose enough for a loaded CI box


class Recorded(Heartbeat):
    """A heartbeat whose ending is written down instead of carried out."""

    ended: list[tuple[str, list[int]]]

    def _end(self, message: str, stalled: list[int]) -> None:
        self.ended.append((message, stalled))
        self.stopping.set()


def _job(world: int = 2) -> tuple[dist.TCPStore, list[Endpoint]]:
    port = free_port()
    endpoints = [Endpoint("127.0.0.1", port, rank, world, agent_store=True, attempt="0")
                 for rank in range(world)]
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=5))
    for endpoint in endpoints:
        store.set(endpoint.key("arrived", endpoint.rank), "elsewhere 1")  # never killed here
    return store, endpoints


def _heartbeat(endpoint: Endpoint) -> Recorded:
    beat = Recorded(endpoint, LIMITS, exit_code=4)
    beat.ended = []
    return beat


def _wait_for(condition: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


def test_limits_follow_the_group_timeout() -> None:
    assert Limits.of(timedelta(seconds=120)) == Limits(stall_after=60.0, period=5.0)
    assert Limits.of(timedelta(seconds=4)) == Limits(stall_after=2.0, period=0.2)
    assert Limits.of(timedelta(seconds=1)).period == 0.1


def test_a_silent_peer_is_named_with_its_last_progress() -> None:
    store, (first, second) = _job()
    note_microbatch(2, 1)
    stopped = _heartbeat(second)
    stopped.beat()  # it beat once, then its process stopped
    watcher = _heartbeat(first).start()
    try:
        _wait_for(lambda: watcher.ended, 3.0)
    finally:
        watcher.stopping.set()
        note_phase("starting")
    assert len(watcher.ended) == 1
    message, stalled = watcher.ended[0]
    assert stalled == [1]
    assert message.startswith("rank 0: rank 1 stopped responding: no heartbeat for")
    assert "rank 1's last beat reported step 2, microbatch 1" in message
    del store


def test_healthy_and_finished_peers_are_never_named() -> None:
    store, endpoints = _job(3)
    beats = [_heartbeat(endpoint).start() for endpoint in endpoints]
    time.sleep(1.5 * LIMITS.stall_after)
    beats[2].stop()  # done early: its silence from now on is not a stall
    time.sleep(1.5 * LIMITS.stall_after)
    for beat in beats[:2]:
        beat.stop()
    assert [beat.ended for beat in beats] == [[], [], []]
    assert store.get(endpoints[0].key("beat", 2)) == b"done"
    del store


def test_a_store_that_stops_answering_is_named() -> None:
    store, (_, second) = _job()
    watcher = _heartbeat(second)
    watcher.watched = []  # only the store: its peers are not the point here
    watcher.start()
    del store  # the host of the store goes away
    try:
        _wait_for(lambda: watcher.ended, 3.0)
    finally:
        watcher.stopping.set()
    assert watcher.ended, "the lost store was never noticed"
    assert "the job's store at 127.0.0.1:" in watcher.ended[0][0]
    assert "torchrun's agent stopped responding" in watcher.ended[0][0]


def test_progress_reads_as_words() -> None:
    assert describe("7 train 3 1") == "step 3, microbatch 1"
    assert describe("2 reference -1 -1") == "the reference check"
    assert describe("garbage") == "none reported"
    assert rank_list([9, 1, 4, 5, 6, 7]) == "1, 4-7, 9"
    assert PROGRESS.encode(5).split()[0] == "5"


def test_check_in_names_the_ranks_that_never_came() -> None:
    port = free_port()
    endpoint = Endpoint("127.0.0.1", port, 2, 6, agent_store=False, attempt="0")
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=5))
    for rank in (0, 1, 5):
        store.set(endpoint.key("arrived", rank), "host 1")
        store.add(endpoint.key("arrivals"), 1)
    with pytest.raises(RendezvousError, match=r"2 of 6 ranks never arrived .* rank 3-4; the job"):
        check_in(store, endpoint, timedelta(seconds=0.3))


def test_a_rank_with_another_plan_stops_the_job_named_by_both_sides() -> None:
    """Rank 0 alone re-derives its plan (runtime/rederive.py); a rank that loaded another copy
    (a node's own plan.json, edited there) is refused at the rendezvous, before any group forms."""
    port = free_port()
    zero, one, two = (Endpoint("127.0.0.1", port, rank, 3, agent_store=True, attempt="0")
                      for rank in range(3))
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=5))
    plans = {0: "sha256:" + "a" * 64, 1: "sha256:" + "a" * 64, 2: "sha256:" + "b" * 64}
    for endpoint in (one, two):  # checked in already, each with its own plan
        store.set(endpoint.key("plan", endpoint.rank), plans[endpoint.rank])
        store.set(endpoint.key("arrived", endpoint.rank), "host 1")
        store.add(endpoint.key("arrivals"), 1)
    with pytest.raises(DifferentPlanError, match=r"^rank 0: rank 2 loaded another plan than rank "
                       r"0's \(sha256:aaaaaaaaaaaa…; rank 2's is sha256:bbbbbbbbbbbb…\): give "
                       "every rank the same plan.json"):
        check_in(store, zero, timedelta(seconds=2), plans[0])
    check_in(store, one, timedelta(seconds=2), plans[1])  # rank 0's plan: joins
    with pytest.raises(DifferentPlanError, match=r"^rank 2: this rank loaded the plan "
                       r"sha256:bbbbbbbbbbbb…, rank 0 loaded sha256:aaaaaaaaaaaa…"):
        check_in(store, two, timedelta(seconds=2), plans[2])
    assert issubclass(DifferentPlanError, LaunchEnvironmentError)  # exit 2, like the environment


def test_a_launch_without_its_variables_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "29500x")
    with pytest.raises(LaunchEnvironmentError, match="lacks MASTER_ADDR: start the runtime with"):
        Endpoint.from_env()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(LaunchEnvironmentError, match="MASTER_PORT='29500x', not a whole number"):
        Endpoint.from_env()


class _FrozenStore:
    """A store whose host was stopped: writes leave, reads never return (as a TCPStore's do once
    its server is SIGSTOPped: it logs its poll timeout and polls again)."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def set(self, key: str, value: str) -> None:
        pass

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.released.wait()
        raise RuntimeError("released")


def test_a_stopped_store_host_is_named_though_its_reads_never_return() -> None:
    """Before, the beating thread hung in the store read and the ranks trained on (step 970)."""
    store, (first, second) = _job()
    watcher = _heartbeat(second).start()
    time.sleep(3 * LIMITS.period)  # rank 0's beat is heard once
    frozen = _FrozenStore()
    watcher.store = frozen
    started = time.monotonic()
    try:
        _wait_for(lambda: watcher.ended, 5.0)
    finally:
        watcher.stopping.set()
        frozen.released.set()
    assert watcher.ended, "the stopped store was never noticed"
    assert time.monotonic() - started < 4 * LIMITS.stall_after
    message = watcher.ended[0][0]
    assert message.startswith("rank 1: the job's store at 127.0.0.1:")
    assert "(torchrun's agent hosts it) has not answered for" in message
    assert "the head node elsewhere (rank 0) was last heard" in message
    del store


def test_a_broken_collective_blames_a_silent_store_not_itself() -> None:
    """The failures race: rank 0's watchdog names the stopped store and exits, and rank 1's
    collective with it breaks ("Connection reset by peer") before rank 1's own watchdog fires.
    A rank whose main thread fails asks the store first: a silent one is named by the watchdog
    before the rank would report its own error; an answering one costs the report one read."""
    store, (first, second) = _job()
    store.set(first.key("beat", 0), "1 train 0 0")  # rank 0 beats (a read of no key would wait)
    watcher = _heartbeat(second).start()
    time.sleep(3 * LIMITS.period)
    started = time.monotonic()
    watcher.blame_store()  # the store answers: the rank's own error is the report
    assert time.monotonic() - started < LIMITS.stall_after and watcher.ended == []
    frozen = _FrozenStore()
    watcher.store = frozen
    started = time.monotonic()
    try:
        watcher.blame_store()  # the store host stopped: wait for its watchdog
    finally:
        watcher.stopping.set()
        frozen.released.set()
    assert watcher.ended, "the broken collective was reported before the silent store"
    assert watcher.ended[0][0].startswith("rank 1: the job's store at 127.0.0.1:")
    assert time.monotonic() - started < 4 * LIMITS.stall_after
    del store


def test_a_store_whose_host_is_gone_does_not_hold_up_the_report() -> None:
    """A store that refuses at once (its host process exited) is not silent: the failing rank
    reports its own error without waiting out the store limit."""
    store, (first, second) = _job()
    watcher = _heartbeat(second)
    watcher.watched = []
    watcher.start()
    del store
    started = time.monotonic()
    try:
        watcher.blame_store()
    finally:
        watcher.stopping.set()
    assert time.monotonic() - started < LIMITS.stall_after
    assert watcher.ended == []

"""A rank whose process stops (SIGSTOP, a frozen host, a cut link) ends the job, and is named.

A stopped rank raises nothing and keeps its sockets open, so its peers wait in a collective until
the group timeout and then fail themselves: torchrun blames whichever rank gave up first. Here a
daemon thread on every rank bumps a counter in the job's store every `period` and reads the
counters it watches: rank 0 watches every rank, every other rank watches rank 0, so each rank is
watched and the store sees O(world) requests per period. A counter that has not moved for
`stall_after` seconds, timed on the watcher's own monotonic clock (no clocks to agree), means its
process stopped running: the watcher prints one line naming the rank and the last progress it
reported, SIGKILLs it if it runs on this host (a stopped process cannot act on torchrun's SIGTERM,
and torchrun would wait out its 30 s grace first), and exits, so torchrun ends the job.

The thread beats while the main thread computes or waits (rank 0 training the reference for
minutes included), so only a process that does not run at all misses beats. `stall_after` is half
the group timeout: a collective waiting on the stopped rank would time out at the full timeout and
name the wrong rank. A rank that finishes writes `done` and is watched no more.

A store whose host is stopped (SIGSTOP of torchrun's agent, a frozen head node) keeps its socket
open, and a TCPStore read then waits past its own timeout for good (torch 2.13 logs the poll
timeout and polls again): the beating thread would hang in it and the ranks train on, watched by
nobody. So a second thread, the store watchdog, touches no store: it reads when the beating thread
last heard from the store and, past `stall_after`, ends the job naming the store's address, who
hosts it, and the head node (rank 0's host) with the last beat heard from rank 0.

The failures race: the peer whose watchdog fires first exits, and a rank training with it then
sees its collective break ("Connection reset by peer") before its own watchdog fires. So a rank
whose main thread fails asks the store first (`blame_store`): a store that answers, or refuses at
once, lets the rank report its own error; a store that stays silent is the cause, and the rank
waits for its watchdog to name it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from runtime.rendezvous import Endpoint, arrival_of, open_store, rank_list

DONE = "done"


@dataclass
class Progress:
    """What this rank is doing, set by the main thread and published with every beat; `moved`
    wakes the beating thread at each new phase or step, so the last progress a stopped rank
    published is the step it stopped in (microbatches are sampled: they can come by the hundred
    a second)."""

    phase: str = "starting"
    step: int = -1
    microbatch: int = -1
    moved: threading.Event = field(default_factory=threading.Event)

    def encode(self, count: int) -> str:
        return f"{count} {self.phase} {self.step} {self.microbatch}"


PROGRESS = Progress()


def note_phase(phase: str) -> None:
    """The main thread enters PHASE (one word: groups, model, load, save, reference, report)."""
    PROGRESS.phase = phase
    PROGRESS.moved.set()


def note_microbatch(step: int, microbatch: int) -> None:
    """The main thread starts microbatch MICROBATCH of optimizer step STEP."""
    new_step = (PROGRESS.phase, PROGRESS.step) != ("train", step)
    PROGRESS.phase, PROGRESS.step, PROGRESS.microbatch = "train", step, microbatch
    if new_step:
        PROGRESS.moved.set()


def describe(beat: str) -> str:
    """A published beat as words: `step 1, microbatch 1` or the phase."""
    parts = beat.split()
    if len(parts) != 4:
        return "none reported"
    _, phase, step, microbatch = parts
    if phase == "train":
        return f"step {step}, microbatch {microbatch}"
    return {"starting": "forming the world group", "groups": "building process groups",
            "model": "building the model", "load": "loading the checkpoint",
            "save": "saving the checkpoint", "reference": "the reference check",
            "report": "gathering the report"}.get(phase, phase)


@dataclass(frozen=True)
class Limits:
    """How often to beat and how long a silent peer is tolerated."""

    stall_after: float
    period: float

    @classmethod
    def of(cls, group_timeout: timedelta) -> Limits:
        stall_after = group_timeout.total_seconds() / 2
        return cls(stall_after=stall_after, period=min(5.0, max(0.1, stall_after / 10)))


class Heartbeat:
    """This rank's beating and watching thread (see the module docstring)."""

    def __init__(self, endpoint: Endpoint, limits: Limits, exit_code: int) -> None:
        self.endpoint, self.limits, self.exit_code = endpoint, limits, exit_code
        rank, world = endpoint.rank, endpoint.world_size
        self.watched = [r for r in range(world) if r != rank] if rank == 0 else [0]
        self.store = open_store(endpoint, timedelta(seconds=limits.stall_after), client=True)
        self.count = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="moeplan-heartbeat", daemon=True)
        self.watchdog = threading.Thread(target=self._watch_store, name="moeplan-store-watchdog",
                                         daemon=True)
        self.store_ok = time.monotonic()  # when the store last answered this rank
        self.store_failed = 0.0  # when a store call last raised at once (its host gone, say)
        self.probe = threading.Event()  # the main thread asks for a read now (`blame_store`)
        self.head_heard = time.monotonic()  # when rank 0's counter last moved (rank 0: itself)
        self.head_host = "its host"  # rank 0's host, read once at start while the store answers

    def key(self, rank: int) -> str:
        return self.endpoint.key("beat", rank)

    def beat(self) -> None:
        self.count += 1
        self.store.set(self.key(self.endpoint.rank), PROGRESS.encode(self.count))

    def start(self) -> Heartbeat:
        self.beat()
        try:
            arrival = arrival_of(self.store, self.endpoint, 0)
            self.head_host = arrival[0] if arrival else self.head_host
        except (RuntimeError, ValueError):
            pass  # a check-in of another form: the message says "its host"
        self.store_ok = time.monotonic()
        self.thread.start()
        self.watchdog.start()
        return self

    def _watch_store(self) -> None:
        """End the job when the beating thread has not heard from the store for `stall_after`
        (it may be stuck inside a store call that never returns)."""
        while not self.stopping.wait(self.limits.period):
            silent = time.monotonic() - self.store_ok
            if silent > self.limits.stall_after:
                self._store_lost(silent)
                return

    def blame_store(self) -> None:
        """The main thread failed (a broken collective, say): if the store has gone silent, that
        is the cause, whichever rank's failure arrived first, so wait for the watchdog to name
        it (it exits the process). Returns as soon as a read made after the failure answers or
        raises: then the store is not what stopped the job."""
        asked = time.monotonic()
        self.probe.set()
        PROGRESS.moved.set()
        deadline = asked + self.limits.stall_after + 2 * self.limits.period
        while (self.store_ok < asked and self.store_failed < asked
               and time.monotonic() < deadline):
            time.sleep(min(0.05, self.limits.period))

    def stop(self) -> None:
        """This rank is done: stop beating and tell the watchers not to wait for more."""
        self.stopping.set()
        PROGRESS.moved.set()
        self.thread.join()
        self.watchdog.join()
        try:
            self.store.set(self.key(self.endpoint.rank), DONE)
        except RuntimeError:
            pass  # the store's host left first: nobody is left to watch this rank

    def _run(self) -> None:
        seen: dict[int, bytes] = {}
        since = dict.fromkeys(self.watched, time.monotonic())
        keys = [self.key(rank) for rank in self.watched]
        next_watch = time.monotonic() + self.limits.period
        while True:
            PROGRESS.moved.wait(max(0.0, next_watch - time.monotonic()))
            if self.stopping.is_set():
                return
            now = time.monotonic()
            watch = now >= next_watch or self.probe.is_set()
            self.probe.clear()
            if watch:
                next_watch = now + self.limits.period
            try:
                if watch or PROGRESS.moved.is_set():
                    PROGRESS.moved.clear()
                    self.beat()
                if not watch:
                    continue  # a set returns before the store answers: only a read proves it
                beats = dict(zip(self.watched, self.store.multi_get(keys), strict=True))
            except RuntimeError:  # torch's DistError and its kin: the store did not answer
                if time.monotonic() - self.store_ok > self.limits.stall_after:
                    self._store_lost(time.monotonic() - self.store_ok)
                self.store_failed = time.monotonic()
                continue
            now = self.store_ok = time.monotonic()
            for rank, value in beats.items():
                if value != seen.get(rank):
                    seen[rank], since[rank] = value, now
            if 0 in since:
                self.head_heard = since[0]
            stalled = [rank for rank in self.watched if seen.get(rank) != DONE.encode()
                       and now - since[rank] > self.limits.stall_after]
            if stalled:
                self._peers_lost(stalled, {rank: seen.get(rank, b"").decode() for rank in stalled},
                                 now - min(since[rank] for rank in stalled))

    def _peers_lost(self, ranks: list[int], beats: dict[int, str], silent: float) -> None:
        last = "; ".join(f"rank {rank}'s last beat reported {describe(beats[rank])}"
                         for rank in ranks)
        self._end(f"rank {self.endpoint.rank}: rank {rank_list(ranks)} stopped responding: no "
                  f"heartbeat for {silent:.1f} s (limit {self.limits.stall_after:g} s, half of "
                  f"MOEPLAN_GROUP_TIMEOUT_S); {last}; the job stops", ranks)

    def _store_lost(self, silent: float) -> None:
        host = self.endpoint.store_host
        head = ("" if self.endpoint.rank == 0 else
                f"; the head node {self.head_host} (rank 0) was last heard "
                f"{time.monotonic() - self.head_heard:.1f} s ago")
        self._end(f"rank {self.endpoint.rank}: the job's store at {self.endpoint.address} "
                  f"({host} hosts it) has not answered for {silent:.1f} s (limit "
                  f"{self.limits.stall_after:g} s, half of MOEPLAN_GROUP_TIMEOUT_S); "
                  f"{host} stopped responding{head}; the job stops", [])

    def _end(self, message: str, stalled: list[int]) -> None:
        print(f"moeplan runtime: {message}", file=sys.stderr, flush=True)
        here = socket.gethostname()
        for rank in stalled:
            try:
                arrival = arrival_of(self.store, self.endpoint, rank)
                if arrival is not None and arrival[0] == here:
                    os.kill(arrival[1], signal.SIGKILL)
            except (RuntimeError, ProcessLookupError, PermissionError):
                pass  # gone already, or not ours to end: torchrun's teardown still reaches it
        os._exit(self.exit_code)

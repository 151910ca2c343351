"""Joining the job under a bounded wait that names who never came.

torch's env:// rendezvous waits on the store for the whole process-group timeout — the world
group's, which must outwait rank 0 training the single-process reference — so a rank that never
started, or a store nobody hosts, held every other rank for half an hour and named nobody. Here
the store is opened the way torch's env:// handler opens it (torch/distributed/rendezvous.py
`_create_c10d_store`: a client of torchrun's agent store, or, launched without torchrun, hosted
by rank 0) and every rank checks in under its own deadline; only then does the world group form
on that store. Check-in leaves one key per rank (its host and pid), which is how the message can
name the ranks that are missing and how the heartbeat (runtime/heartbeat.py) finds a peer's pid.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

PROBE_PAUSE_S = 0.5  # between connection attempts to a store that is not up yet


class RendezvousError(RuntimeError):
    """The job cannot form: the store did not answer, or some ranks never arrived."""


class LaunchEnvironmentError(ValueError):
    """The variables that say where to meet are missing or malformed: a usage error."""


@dataclass(frozen=True)
class Endpoint:
    """Where this rank meets the others, as torchrun (or the user) put it in the environment."""

    host: str
    port: int
    rank: int
    world_size: int
    agent_store: bool  # torchrun's agent hosts the store (else rank 0 does)
    attempt: str  # torchrun's restart count: keys of an earlier attempt never count

    @classmethod
    def from_env(cls) -> Endpoint:
        env = os.environ
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
                   if not env.get(name)]
        malformed = [name for name in ("MASTER_PORT", "RANK", "WORLD_SIZE")
                     if env.get(name) and not env[name].isdigit()]
        if missing or malformed:
            what = (f"lacks {', '.join(missing)}" if missing
                    else f"has {', '.join(f'{n}={env[n]!r}' for n in malformed)}, not a whole number")
            raise LaunchEnvironmentError(
                f"the job's environment {what}: start the runtime with torchrun (it sets "
                "MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE), or with none of them for one rank")
        return cls(host=env["MASTER_ADDR"], port=int(env["MASTER_PORT"]), rank=int(env["RANK"]),
                   world_size=int(env["WORLD_SIZE"]),
                   agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
                   attempt=env.get("TORCHELASTIC_RESTART_COUNT", "0"))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def store_host(self) -> str:
        return "torchrun's agent" if self.agent_store else "rank 0"

    def key(self, *parts: object) -> str:
        return "/".join(["moeplan", self.attempt, *map(str, parts)])


def rank_list(ranks: Iterable[int]) -> str:
    """Ranks as short runs: `1, 4-7, 9`."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _listening(host: str, port: int, deadline: float) -> bool:
    """Whether anything accepts on HOST:PORT before DEADLINE (monotonic): plain TCP probes, since
    torch's own client connect lasts its timeout plus a random back-off plus a second try."""
    while True:
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(remaining, 5.0))) as probe:
                # With nothing listening on a local port in the ephemeral range, a connect can
                # pick that very port as its source and reach itself (TCP simultaneous open).
                if probe.getsockname() != probe.getpeername():
                    return True
        except OSError:
            pass
        if time.monotonic() + PROBE_PAUSE_S >= deadline:
            return False
        time.sleep(PROBE_PAUSE_S)


def open_store(endpoint: Endpoint, timeout: timedelta, *, client: bool = False) -> dist.TCPStore:
    """The job's TCPStore: hosted here on rank 0 without torchrun, a client otherwise (or when
    `client` asks for a second connection, as the heartbeat's own)."""
    host_here = endpoint.rank == 0 and not endpoint.agent_store and not client
    deadline = time.monotonic() + timeout.total_seconds()
    try:
        if not host_here and not _listening(endpoint.host, endpoint.port, deadline):
            raise dist.DistError("nothing listens there")
        connect = max(1.0, deadline - time.monotonic()) if not host_here else timeout.total_seconds()
        store = dist.TCPStore(endpoint.host, endpoint.port, is_master=host_here,
                              timeout=timedelta(seconds=connect), wait_for_workers=False,
                              multi_tenant=host_here)
    except dist.DistError as exc:
        if host_here:
            raise RendezvousError(
                f"rank 0 could not host the rendezvous store at {endpoint.address}: "
                f"{_first_line(exc)}; pick a free MASTER_PORT") from None
        raise RendezvousError(
            f"rank {endpoint.rank}: no rendezvous store answered at {endpoint.address} within "
            f"{timeout.total_seconds():g} s (MOEPLAN_RENDEZVOUS_TIMEOUT_S); {endpoint.store_host} "
            "hosts it: check that it started and that MASTER_ADDR/MASTER_PORT reach it") from None
    store.set_timeout(timeout)
    return store


class DifferentPlanError(LaunchEnvironmentError):
    """Ranks loaded different plans: the job cannot form (a usage error, like the environment)."""


def check_in(store: dist.Store, endpoint: Endpoint, timeout: timedelta,
             plan_digest: str | None = None) -> None:
    """Say this rank is here, then wait (server side, no polling) until every rank is; with
    PLAN_DIGEST, every rank must have loaded the plan rank 0 loaded (and re-derived)."""
    if plan_digest is not None:
        store.set(endpoint.key("plan", endpoint.rank), plan_digest)
    store.set(endpoint.key("arrived", endpoint.rank), f"{socket.gethostname()} {os.getpid()}")
    everyone = endpoint.key("everyone_arrived")
    if store.add(endpoint.key("arrivals"), 1) == endpoint.world_size:
        store.set(everyone, "1")
    try:
        store.wait([everyone], timeout)
    except dist.DistError:
        missing = [rank for rank in range(endpoint.world_size)
                   if not store.check([endpoint.key("arrived", rank)])]
        raise RendezvousError(
            f"rank {endpoint.rank}: {len(missing)} of {endpoint.world_size} ranks never arrived at "
            f"the rendezvous at {endpoint.address} within {timeout.total_seconds():g} s "
            f"(MOEPLAN_RENDEZVOUS_TIMEOUT_S): rank {rank_list(missing)}; the job stops") from None
    if plan_digest is not None:
        check_same_plan(store, endpoint, plan_digest)


def check_same_plan(store: dist.Store, endpoint: Endpoint, digest: str) -> None:
    """Rank 0 reads every rank's plan digest (one request), every other rank reads rank 0's: a
    rank whose plan.json differs (a copy per node, edited on one) stops the job before any group
    forms, named by both sides. Rank 0 alone re-derives its plan (runtime/rederive.py); equal
    digests carry that check to every rank."""
    rank = endpoint.rank
    watched = list(range(endpoint.world_size)) if rank == 0 else [0]
    try:
        digests = [value.decode("utf-8", "replace") for value in
                   store.multi_get([endpoint.key("plan", r) for r in watched])]
    except dist.DistError as exc:
        raise RendezvousError(f"rank {rank}: the rendezvous store at {endpoint.address} stopped "
                              f"answering ({_first_line(exc)}); {endpoint.store_host} hosts it; "
                              "the job stops") from None
    other = [r for r, theirs in zip(watched, digests, strict=True) if theirs != digest]
    if not other:
        return
    if rank == 0:
        raise DifferentPlanError(
            f"rank 0: rank {rank_list(other)} loaded another plan than rank 0's ({digest[:19]}…; "
            f"rank {other[0]}'s is {digests[watched.index(other[0])][:19]}…): give every rank "
            "the same plan.json; the job stops")
    raise DifferentPlanError(
        f"rank {rank}: this rank loaded the plan {digest[:19]}…, rank 0 loaded {digests[0][:19]}… "
        "(and re-derived it from its config): give every rank the same plan.json; the job stops")


def arrival_of(store: dist.Store, endpoint: Endpoint, rank: int) -> tuple[str, int] | None:
    """The host and pid RANK checked in with, if it did."""
    key = endpoint.key("arrived", rank)
    if not store.check([key]):
        return None
    host, pid = store.get(key).decode().split()
    return host, int(pid)


def join(timeout: timedelta, plan_digest: str | None = None) -> tuple[dist.TCPStore, Endpoint]:
    """Open the store and check in; RendezvousError names what failed, within TIMEOUT."""
    endpoint = Endpoint.from_env()
    store = open_store(endpoint, timeout)
    check_in(store, endpoint, timeout, plan_digest)
    return store, endpoint

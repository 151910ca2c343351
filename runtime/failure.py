"""Failing cleanly: a rank that breaks must end the whole job fast, with its rank named.

Two halves. `rank_failure_message` is what `python -m runtime` prints when this rank raises: one
line naming the rank (torchrun's agent then sees a non-zero exit and tears the other ranks down,
so nobody waits on a collective that will never complete). `maybe_inject_failure` is test-only
fault injection driven by an environment variable, so the tests can make rank R raise, die by
SIGKILL, or stop by SIGSTOP (a hung rank: it raises nothing and keeps its sockets open, which
only the heartbeat in runtime/heartbeat.py catches) in the middle of a step, exactly where a
real crash, an OOM kill or a frozen process would hit.

    MOEPLAN_TEST_FAIL=<kill|raise|stop>:<rank>:<step>:<microbatch>
"""

from __future__ import annotations

import os
import signal
import sys

FAIL_VARIABLE = "MOEPLAN_TEST_FAIL"
_ACTIONS = ("kill", "raise", "stop")


class InjectedFailure(RuntimeError):
    """The test-only fault: raised on purpose to prove the job ends cleanly."""


def _parse(text: str) -> tuple[str, int, int, int] | None:
    parts = text.split(":")
    if len(parts) != 4 or parts[0] not in _ACTIONS or not all(p.isdigit() for p in parts[1:]):
        return None
    return parts[0], int(parts[1]), int(parts[2]), int(parts[3])


def maybe_inject_failure(rank: int, step: int, microbatch: int) -> None:
    """Kill, stop or raise on the configured (rank, step, microbatch); a no-op otherwise."""
    spec = _parse(os.environ.get(FAIL_VARIABLE, ""))
    if spec is None:
        return
    action, fail_rank, fail_step, fail_microbatch = spec
    if (rank, step, microbatch) != (fail_rank, fail_step, fail_microbatch):
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "stop":  # the pid lets a test end the stopped process whatever happens
        print(f"rank {rank} stops itself: SIGSTOP, pid {os.getpid()}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    raise InjectedFailure(f"injected failure at step {step}, microbatch {microbatch}")


def rank_failure_message(rank: int | None, exc: BaseException) -> str:
    """One line that says which rank failed and why, for stderr."""
    where = f"rank {rank}" if rank is not None else "a rank"
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    kind = type(exc).__name__
    return (f"{where} failed: {kind}: {detail}" if detail else f"{where} failed: {kind}") + (
        "; the job stops (torchrun ends the other ranks)")

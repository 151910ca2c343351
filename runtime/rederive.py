"""Whether a plan's figures are what its own config compiles to, asked of the planner in a child.

The digest proves the file intact, not that its figures follow from its config: a plan edited and
digested again (a doubled gradient scale, a re-paired group) passes it and would train wrongly.
Only the planner's compiler can tell, and the runtime imports none of it (its door into plans is
the leaf planner/plan_format.py, so the runtime never carries a second copy of a formula). So rank
0 runs `moeplan verify PLAN` — the very check a user runs by hand — in a child process, started
as soon as the plan reads (it overlaps torch's import) and waited for before any process group or
store forms. Every rank then checks at the rendezvous that it loaded the plan rank 0 checked
(runtime/rendezvous.py `check_in`), so one re-derivation covers the job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

VERIFY = ("-m", "planner.cli", "verify")
# The 1,024-rank examples re-derive in about 1.5 s; the bound is for a child that never answers.
TIMEOUT_VARIABLE = "MOEPLAN_REDERIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600
MESSAGE_CHARS = 2000  # of the child's stderr: its message, or a crash's last lines


def rederive_timeout() -> float:
    text = os.environ.get(TIMEOUT_VARIABLE, "")
    return float(text) if text.isdigit() and int(text) > 0 else float(DEFAULT_TIMEOUT_S)


def checks_here() -> bool:
    """Rank 0 re-derives (RANK unset: a single process, rank 0 too); the rest compare digests."""
    return os.environ.get("RANK", "0").strip() == "0"


class Rederivation:
    """One running `moeplan verify PLAN` child; `problem()` waits for its answer."""

    def __init__(self, plan_path: Path) -> None:
        self.plan_path = plan_path
        # soft-wrapped, uncoloured: the message comes back as one line
        env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb"}
        self.process = subprocess.Popen(
            [sys.executable, *VERIFY, str(plan_path)], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)

    def problem(self, timeout: float | None = None) -> str | None:
        """None when the plan is what its config compiles to, else the message to refuse with."""
        limit = rederive_timeout() if timeout is None else timeout
        try:
            _, err = self.process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            self.cancel()
            return (f"re-deriving {self.plan_path} from its config (`moeplan verify "
                    f"{self.plan_path}`) did not finish within {limit:g} s "
                    f"({TIMEOUT_VARIABLE}); nothing ran")
        if self.process.returncode == 0:
            return None
        text = err[-MESSAGE_CHARS:].decode("utf-8", "replace").strip()
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        message = " ".join(lines).removeprefix("error: ") if lines else "no message"
        if self.process.returncode == 2 and lines and lines[0].startswith("error: "):
            return message  # the planner's own refusal names the figure (or the unreadable file)
        return (f"could not re-derive {self.plan_path} from its config: `moeplan verify "
                f"{self.plan_path}` ended with exit {self.process.returncode} ({message[-600:]}); "
                "nothing ran")

    def cancel(self) -> None:
        """The run is refused for another reason: end the child (ours) and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()

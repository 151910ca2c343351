"""Python run against a Megatron-LM checkout, in a subprocess: the one way the test helpers that read
Megatron's parser, print its logs or count its router's ops start Megatron outside the pre-flight.

Megatron imports torch and asks for a CUDA device at import, so a snippet runs in its own Python
after the pre-flight's stand-ins (planner/emit/megatron_probe.py install_stand_ins) put the
checkout on sys.path and answer the device queries. Every snippet gets the same environment: the
test process's, one OpenMP thread, Python's warnings off (Megatron's deprecation warnings would
mix into a printed log) and this repository on PYTHONPATH, run from its root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.paths import ROOT

# What every snippet starts with: `json`, `sys` and `Path` imported, Megatron importable from the
# checkout in sys.argv[1].
PREAMBLE = """\
import json, sys
from pathlib import Path
from planner.emit.megatron_probe import install_stand_ins
install_stand_ins(Path(sys.argv[1]))
"""


class SnippetFailed(RuntimeError):
    """The snippet's Python exited non-zero; the message is the end of what it wrote to stderr."""


def run_snippet(body: str, megatron: Path, stdin: Any = None, *, env: dict[str, str] | None = None,
                timeout_s: float = 300) -> str:
    """What `PREAMBLE + body` prints, run on `megatron` with `stdin` (JSON-encoded) as its input;
    `env` adds to the shared environment (see the module docstring)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
                   "PYTHONPATH": path, **(env or {})}
    done = subprocess.run([sys.executable, "-c", PREAMBLE + body, str(megatron)],
                          input=None if stdin is None else json.dumps(stdin), capture_output=True,
                          text=True, cwd=ROOT, env=environment, timeout=timeout_s, check=False)
    if done.returncode:
        raise SnippetFailed(done.stderr[-3000:] or f"exit code {done.returncode}")
    return done.stdout


def snippet_json(body: str, megatron: Path, stdin: Any = None, **options: Any) -> Any:
    """The JSON value on the last line `PREAMBLE + body` prints (see `run_snippet`)."""
    return json.loads(run_snippet(body, megatron, stdin, **options).strip().splitlines()[-1])

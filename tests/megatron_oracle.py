"""Where tests find Megatron-LM (dev, the DeepSeek-V4 branch) to use as the judge, and how they run
code against it: in a subprocess with the Megatron tree first on PYTHONPATH."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.oracle import megatron_lm_dir

ROOT = Path(__file__).resolve().parent.parent


def require_oracle() -> Path:
    """The Megatron tree, or skip: the judge is absent outside this repository's CI."""
    path, why_missing = megatron_lm_dir()
    if path is None:
        pytest.skip(why_missing)
    return path


def run_with_megatron(script: Path, payload: Any, timeout: float = 600) -> Any:
    """Run `script` with Megatron importable, `payload` as JSON on stdin; its last stdout line is JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(require_oracle()), str(ROOT)]),
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, str(script)], input=json.dumps(payload), capture_output=True,
                          text=True, env=env, timeout=timeout, check=False)
    assert done.returncode == 0, f"{script.name} failed under Megatron:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def answer_cases(answer: Callable[[dict[str, Any]], Any]) -> None:
    """The probe's side of `run_with_megatron`: JSON cases on stdin, one JSON line of answers on
    stdout; whatever Megatron prints meanwhile is dropped."""
    cases = json.load(sys.stdin)
    with contextlib.redirect_stdout(io.StringIO()):
        answers = [answer(case) for case in cases]
    print(json.dumps(answers))

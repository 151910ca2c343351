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

ROOT = Path(__file__).resolve().parent.parent
ENV_VAR = "MOEPLAN_MEGATRON_LM"


def oracle_dir() -> Path:
    """$MOEPLAN_MEGATRON_LM, else the checkout kept beside this repository in its CI."""
    configured = os.environ.get(ENV_VAR)
    return Path(configured) if configured else ROOT.parent / "shared" / "oracle" / "megatron-lm-dev"


def require_oracle() -> Path:
    """The Megatron tree, or skip: the judge is absent outside this repository's CI."""
    path = oracle_dir()
    if not (path / "megatron" / "core").is_dir():
        pytest.skip(f"Megatron-LM dev not found at {path} (set {ENV_VAR} to a Megatron-LM checkout)")
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

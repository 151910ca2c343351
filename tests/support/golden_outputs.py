"""Byte-for-byte fingerprints of what the CLI prints for every bundled example.

A refactor must not change a single byte of `check --json`, `budget --json`, `groups --json` or
the compiled plan. The outputs are megabytes, so the recorded golden is a sha256 and a length per
(example, command). Re-record on purpose, after a reviewed behaviour change:

    python -m tests.support.golden_outputs --update
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "support" / "golden" / "cli_outputs.json"
COMMANDS = ("check", "budget", "groups", "compile")


def examples() -> list[Path]:
    base = ROOT / "examples"
    return sorted(base.glob("*.yaml")) + sorted(base.glob("*/*.yaml"))


def _run(command: str, config: Path) -> tuple[int, bytes]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    cli = [sys.executable, "-m", "planner.cli", command]
    if command == "compile":
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "plan.json"
            done = subprocess.run([*cli, str(config), "-o", str(out)], capture_output=True,
                                  cwd=ROOT, env=env, timeout=300)
            return done.returncode, out.read_bytes() if out.exists() else b""
    done = subprocess.run([*cli, "--json", str(config)], capture_output=True, cwd=ROOT, env=env,
                          timeout=300)
    return done.returncode, done.stdout


def fingerprint(command: str, config: Path) -> dict[str, int | str]:
    code, output = _run(command, config)
    return {"exit": code, "bytes": len(output), "sha256": hashlib.sha256(output).hexdigest()}


def key(config: Path) -> str:
    return config.relative_to(ROOT).as_posix()


def record() -> dict[str, dict[str, dict[str, int | str]]]:
    return {key(c): {cmd: fingerprint(cmd, c) for cmd in COMMANDS} for c in examples()}


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.support.golden_outputs --update")
    GOLDEN.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print(f"recorded {GOLDEN.relative_to(ROOT)}")

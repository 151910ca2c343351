"""Snapshots of what the CLI prints for every bundled example, so a refactor that changes a byte
says which line changed.

Covered: `check --json`, `budget --json`, `groups --json`, the plan `compile` writes and the
`megatron_args.sh` that `emit megatron` writes, for every example under examples/ (valid, invalid/
and warnings/). Each runs in-process through typer's
CliRunner (byte-identical to the subprocess: `--against-subprocess` checks that). One text file per
(example, command) under tests/support/golden/: a header with the exit code, the byte count and
the sha256 of the exact bytes, then a readable form of the output.

The raw outputs are 14.6 MB (the 1024-rank budgets and plans), so the readable form is normalised,
3.8 MB: JSON leaf records on one line, budget rows grouped under their name, unit and formula
(one `scope: value` line per row), one line per process group, and the plan's `budgets` and
`groups` written once (in budget.txt and groups.txt) when they equal those commands' output. The
form keeps every value; what it drops (JSON whitespace, row order inside a name) is still held by
the sha256 in the header, so every byte change fails the check. Re-record on purpose, after a
reviewed behaviour change:

    python -m tests.support.golden_outputs --update
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.support.paths import EXAMPLES, ROOT

GOLDEN = ROOT / "tests" / "support" / "golden"
COMMANDS = ("check", "budget", "groups", "compile", "emit-megatron")
EMITTED = "megatron_args.sh"  # the file `emit megatron` writes that the emit-megatron snapshot holds
ENV = {"COLUMNS": "400", "NO_COLOR": "1"}
SHOWN_DIFF_LINES = 80
LINE = 200  # the longest record `pretty` keeps on one line
UPDATE = "python -m tests.support.golden_outputs --update"


def examples() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml")) + sorted(EXAMPLES.glob("*/*.yaml"))


def key(config: Path) -> str:
    return config.relative_to(ROOT).as_posix()


def snapshot_path(command: str, config: Path) -> Path:
    return GOLDEN / config.relative_to(EXAMPLES).with_suffix("") / f"{command}.txt"


def _arguments(command: str, config: Path, plan: Path) -> list[str]:
    if command == "compile":
        return [command, str(config), "-o", str(plan)]
    if command == "emit-megatron":  # the config as a path under the repository: the script names it
        return ["emit", "megatron", key(config), "-o", str(plan.parent / "run")]
    return [command, "--json", str(config)]


def _written(command: str, result_code: int, stdout: bytes, plan: Path) -> tuple[int, bytes]:
    """The bytes a command's snapshot holds: the written plan for compile, the written
    megatron_args.sh for emit-megatron (stdout when it wrote none), stdout for the --json commands."""
    if command == "compile":
        return result_code, plan.read_bytes() if plan.exists() else b""
    if command == "emit-megatron":
        script = plan.parent / "run" / EMITTED
        return result_code, script.read_bytes() if script.exists() else stdout
    return result_code, stdout


@functools.cache
def output(command: str, config: Path) -> tuple[int, bytes]:
    """Exit code and bytes: stdout for the --json commands, the written plan for compile."""
    from typer.testing import CliRunner

    from planner.cli import app

    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(ROOT):
        plan = Path(tmp) / "plan.json"
        result = CliRunner().invoke(app, _arguments(command, config, plan), env=ENV)
        return _written(command, result.exit_code, result.stdout_bytes, plan)


def subprocess_output(command: str, config: Path) -> tuple[int, bytes]:
    """The same through `python -m planner.cli`, as a user runs it."""
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        done = subprocess.run([sys.executable, "-m", "planner.cli", *_arguments(command, config, plan)],
                              capture_output=True, cwd=ROOT, env={**os.environ, **ENV}, timeout=300)
        return _written(command, done.returncode, done.stdout, plan)


# ------------------------------------------------------------------------------ readable forms


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, dict | list)


def _is_leaf(value: Any) -> bool:
    """What one line holds: a scalar, a list of scalars, a short record of those."""
    if isinstance(value, list) and all(map(_is_scalar, value)):
        return True
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return _is_scalar(value) or (all(map(_is_leaf, items)) and len(json.dumps(value)) <= LINE)


def pretty(value: Any, indent: int = 0) -> str:
    """JSON with every leaf record on one line: a changed value shows as one changed line."""
    if _is_leaf(value):
        return json.dumps(value, ensure_ascii=False)
    pad = " " * (indent + 1)
    if isinstance(value, dict):
        rows = [f"{pad}{json.dumps(k)}: {pretty(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(rows) + "\n" + " " * indent + "}"
    return "[\n" + ",\n".join(pad + pretty(v, indent + 1) for v in value) + "\n" + " " * indent + "]"


def _budget_rows(rows: list[dict[str, Any]]) -> str:
    """Rows grouped under `name [unit] = formula`, then `scope: value` per row."""
    grouped: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((row["name"], row["unit"], row["formula"]), []).append(row)
    lines = []
    for (name, unit, formula), members in grouped.items():
        lines.append(f"{name} [{unit}] = {formula}")
        for row in members:
            scope = row["scope"]
            implied = None if scope == "all ranks" else scope.removeprefix("stage ").split(" ")[0]
            stage = "" if str(row["stage"]) == str(implied) else f" (stage {json.dumps(row['stage'])})"
            lines.append(f"  {scope}{stage}: {json.dumps(row['value'])}")
    return "\n".join(lines)


def _group_lines(groups: dict[str, list[list[int]]]) -> str:
    return "\n".join(f"{kind} {i}: {json.dumps(group)}" for kind, members in groups.items()
                     for i, group in enumerate(members))


def _is_budget_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(r, dict) and set(r) == {"name", "value", "unit", "formula", "scope", "stage"}
        for r in value)


def readable(command: str, config: Path, data: bytes) -> str:
    if not data:
        return "(no output)"
    if command in ("check", "emit-megatron"):
        return data.decode()
    document = json.loads(data)
    if command == "budget" and _is_budget_list(document):
        return _budget_rows(document)
    if command == "groups" and isinstance(document, dict) and "groups" in document:
        head = {k: v for k, v in document.items() if k != "groups"}
        return pretty(head) + "\ngroups:\n" + _group_lines(document["groups"])
    if command == "compile":
        return _plan(config, document)
    return pretty(document)


def _plan(config: Path, plan: dict[str, Any]) -> str:
    budget_rows = json.loads(output("budget", config)[1] or b"null")
    groups = json.loads(output("groups", config)[1] or b"null") or {}
    body = {k: v for k, v in plan.items() if k not in ("budgets", "groups")}
    tail = []
    if plan.get("budgets") == budget_rows:
        body["budgets"] = "the rows of budget.txt"
    else:
        tail.append("budgets:\n" + _budget_rows(plan["budgets"]))
    if plan.get("groups") == groups.get("groups"):
        body["groups"] = "the groups of groups.txt"
    else:
        tail.append("groups:\n" + _group_lines(plan["groups"]))
    return "\n".join([pretty(body), *tail])


def snapshot(command: str, config: Path) -> str:
    code, data = output(command, config)
    shown = {"compile": f"moeplan compile {key(config)}",
             "emit-megatron": f"moeplan emit megatron {key(config)} -o DIR ({EMITTED})"}.get(
        command, f"moeplan {command} --json {key(config)}")
    return (f"# {shown}\n# exit {code}, {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}\n"
            f"{readable(command, config, data)}\n")


# ----------------------------------------------------------------------------------- checking


def difference(recorded: str, now: str, name: str) -> str | None:
    """None when equal, else a unified diff trimmed to SHOWN_DIFF_LINES lines."""
    if recorded == now:
        return None
    diff = list(difflib.unified_diff(recorded.splitlines(), now.splitlines(), f"recorded/{name}",
                                     f"now/{name}", n=2, lineterm=""))
    shown = diff[:SHOWN_DIFF_LINES]
    if len(diff) > len(shown):
        shown.append(f"… {len(diff) - len(shown)} more diff lines")
    if all(line.startswith(("---", "+++", "@@", " ", "-# exit", "+# exit")) for line in diff):
        shown.append("(only the header changed: the bytes differ in what the readable form does not "
                     "show — JSON whitespace or the order of rows within a name)")
    return "\n".join(shown)


def record() -> list[Path]:
    written = []
    for config in examples():
        for command in COMMANDS:
            path = snapshot_path(command, config)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(snapshot(command, config), encoding="utf-8")
            written.append(path)
    return written


def against_subprocess() -> list[str]:
    """Every (example, command) whose in-process output is not the subprocess's, byte for byte."""
    return [f"{key(c)} {command}" for c in examples() for command in COMMANDS
            if output(command, c) != subprocess_output(command, c)]


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        stale = {p for p in GOLDEN.rglob("*.txt")}
        fresh = set(record())
        for path in stale - fresh:
            path.unlink()
        print(f"recorded {len(fresh)} snapshots under {GOLDEN.relative_to(ROOT)}")
    elif sys.argv[1:] == ["--against-subprocess"]:
        differing = against_subprocess()
        print("\n".join(differing) or "in-process output is byte-identical to the subprocess's")
        sys.exit(1 if differing else 0)
    else:
        sys.exit("usage: python -m tests.support.golden_outputs --update | --against-subprocess")

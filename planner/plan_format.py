"""The compiled plan's file format: its name and version, the digest that seals it, and the one
reader and writer of plan files. A leaf (it imports only the bounded reader and writer of
planner/files/) so the runtime reads plans without loading the schema, the grid or the formula
book; planner/plan.py builds the plan.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from planner.files.json_input import read_json
from planner.files.reading import UnreadableInput
from planner.files.writing import write_atomic

PLAN_FORMAT = "moeplan-plan"
PLAN_VERSION = 1
MOEPLAN_VERSION = "0.1.0"


class PlanFileError(Exception):
    """A plan file that is unreadable, from another version, or tampered with."""


def canonical_json(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def plan_digest(plan: dict[str, Any]) -> str:
    """sha256 over the canonical JSON of everything except the digest itself."""
    body = {key: value for key, value in plan.items() if key != "digest"}
    return "sha256:" + hashlib.sha256(canonical_json(body).encode()).hexdigest()


def write_plan(plan: dict[str, Any], path: Path) -> None:
    write_atomic(path, json.dumps(plan, indent=1) + "\n")


def read_artifact(path: Path | str, *, what: str, fmt: str, version: int,
                  error: type[Exception], remedy: str, kind: str = "plan") -> dict[str, Any]:
    """Load one of moeplan's JSON artifacts (plan, report) through the bounded reader (its kind's
    size cap, JSON depth and integer limits) and check its format and version."""
    try:
        data = read_json(path, kind)
    except UnreadableInput as exc:
        if exc.code == "FILE001":
            raise error(f"{path}: no such {what} file") from None
        raise error(f"{path}: not a readable {what}: {exc.reason} [{exc.code}]") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        found = f" (format {data.get('format')!r})" if isinstance(data, dict) else ""
        raise error(f"{path}: not a moeplan {what}{found}")
    if data.get("version") != version:
        raise error(f"{path}: {what} format version {data.get('version')!r}, this moeplan reads "
                    f"version {version}; {remedy}")
    return data


def read_plan(path: Path | str) -> dict[str, Any]:
    """Load a plan and refuse anything that is not an untouched plan of this format and version."""
    plan = read_artifact(path, what="plan", fmt=PLAN_FORMAT, version=PLAN_VERSION,
                         error=PlanFileError, remedy="recompile it with `moeplan compile`")
    if plan.get("digest") != plan_digest(plan):
        raise PlanFileError(f"{path}: digest mismatch — the plan was edited after compilation; "
                            "recompile it with `moeplan compile`")
    return plan

"""The compiled plan: a versioned, self-checking JSON artifact holding everything the runtime and the
launchers need — the resolved config, layout, stage split, process groups, expert ownership and
budgets. The runtime reads only this file; it never re-derives the layout.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from planner.config.schema import Config
from planner.files.json_input import read_json
from planner.files.reading import UnreadableInput
from planner.files.writing import write_atomic
from planner.findings import Finding, has_errors

PLAN_FORMAT = "moeplan-plan"
PLAN_VERSION = 1
MOEPLAN_VERSION = "0.1.0"


class PlanError(Exception):
    """The config has errors: no plan is produced. Carries the findings."""

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__(f"{sum(f.severity == 'error' for f in findings)} config error(s)")
        self.findings = findings


class PlanFileError(Exception):
    """A plan file that is unreadable, from another version, or tampered with."""


def canonical_json(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def plan_digest(plan: dict[str, Any]) -> str:
    """sha256 over the canonical JSON of everything except the digest itself."""
    body = {key: value for key, value in plan.items() if key != "digest"}
    return "sha256:" + hashlib.sha256(canonical_json(body).encode()).hexdigest()


def _stages(cfg: Config) -> list[dict[str, Any]]:
    from planner.layout.pipeline import stage_split

    split = stage_split(cfg)
    return [
        {
            "stage": s.stage,
            "layers": list(s.layers),
            "moe_layers": list(s.moe_layers),
            "hash_layers": list(s.hash_layers),
            "mtp_layers": list(s.mtp_layers),
            "embedding": s.embedding,
            "output_head": s.output_head,
            "chunks": [
                {"index": c.index, "virtual": c.virtual, "layers": list(c.layers),
                 "mtp_layers": list(c.mtp_layers), "embedding": c.embedding, "loss": c.loss}
                for c in s.chunks
            ],
        }
        for s in split.stages
    ]


def _ranks(grid: Any) -> list[dict[str, Any]]:
    """Per-rank coordinates and owned experts, read off the grid (never recomputed downstream)."""
    rows = []
    for rank in range(grid.spec.world_size):
        view = grid.rank_view(rank, with_formulas=False)
        own = view.experts
        rows.append({
            "rank": rank,
            "stage": view.stage,
            "tp_rank": view.dense_coords.get("tp", 0),
            "cp_rank": view.dense_coords.get("cp", 0),
            "dp_rank": view.dense_coords.get("dp", 0),
            "ep_rank": own.ep_rank,
            "etp_rank": own.etp_rank,
            "edp_rank": view.expert_coords.get("dp", 0),
            "experts": {"first": own.expert_ids[0] if own.expert_ids else 0,
                        "count": len(own.expert_ids), "ids": list(own.expert_ids)},
        })
    return rows


def compile_plan(cfg: Config, findings: list[Finding]) -> dict[str, Any]:
    """Build the plan for a config whose findings carry no error (else PlanError)."""
    if has_errors(findings):
        raise PlanError(findings)
    from planner.accounting import plan_budgets
    from planner.layout.grid import Grid
    from planner.layout.spec import grid_spec_from_config
    from planner.layout.summary import layout_summary

    grid = Grid(grid_spec_from_config(cfg))
    plan: dict[str, Any] = {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "moeplan_version": MOEPLAN_VERSION,
        "config": cfg.model_dump(mode="json"),
        "layout": layout_summary(cfg),
        "stages": _stages(cfg),
        "groups": grid.all_groups(),
        "ranks": _ranks(grid),
        "budgets": plan_budgets(cfg),
        "findings": [f.as_dict() for f in findings],
    }
    plan["digest"] = plan_digest(plan)
    return plan


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

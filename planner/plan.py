"""The compiled plan: a versioned, self-checking JSON artifact holding everything the runtime and the
launchers need — the resolved config, layout, stage split, process groups, expert ownership and
budgets. The runtime reads only this file (through planner/plan_format.py); it never re-derives the
layout. Only `moeplan compile`, `emit` and `launch` build a plan, and they import this module when
run, so the book and the grid it loads stay off every other command's start.
"""

from __future__ import annotations

from typing import Any

from planner.accounting import plan_budgets
from planner.config.schema import Config
from planner.findings import Finding, has_errors
from planner.layout.grid import Grid
from planner.layout.pipeline import stage_split
from planner.layout.spec import grid_spec_from_config
from planner.layout.summary import layout_summary
from planner.plan_format import MOEPLAN_VERSION, PLAN_FORMAT, PLAN_VERSION, plan_digest


class PlanError(Exception):
    """The config has errors: no plan is produced. Carries the findings."""

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__(f"{sum(f.severity == 'error' for f in findings)} config error(s)")
        self.findings = findings


def _stages(cfg: Config) -> list[dict[str, Any]]:
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


def _ranks(grid: Grid) -> list[dict[str, Any]]:
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

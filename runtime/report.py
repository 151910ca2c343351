"""report.json: what every rank really moved and held during one optimizer step.

Each rank contributes its ledger (bytes per `<collective>.<phase>` over its last optimizer step:
all MoE layers × all microbatches, plus the gradient reductions) and its memory peaks; rank 0
gathers the shares and writes the file next to the plan's digest, so `moeplan verify` can refuse
a report that belongs to another plan.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch.distributed as dist

from planner.files.writing import write_atomic
from runtime.plan_io import Plan
from runtime.train import RankResult, RunOptions

REPORT_FORMAT = "moeplan-report"
REPORT_VERSION = 1


def rank_share(result: RankResult) -> dict[str, Any]:
    return {
        "rank": result.rank,
        "stage": result.stage,
        "collectives": result.collectives,
        "memory": result.memory,
        "step_losses": result.step_losses,
    }


def build_report(plan: Plan, options: RunOptions, seed: int, shares: list[dict[str, Any]],
                 reference: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "plan_digest": plan.digest,
        "world_size": plan.world_size,
        "steps": options.steps,
        "balanced": options.balanced,
        "seed": seed,
        "reference": reference,
        "ranks": sorted(shares, key=lambda share: share["rank"]),
    }


def gather_report(plan: Plan, options: RunOptions, seed: int, result: RankResult,
                  reference: dict[str, Any]) -> dict[str, Any] | None:
    """Collective: rank 0 returns the merged report, the other ranks None."""
    shares: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(rank_share(result), shares, dst=0)
    if shares is None:
        return None
    return build_report(plan, options, seed, shares, reference)


def write_report(report: dict[str, Any], path: Path) -> None:
    write_atomic(path, json.dumps(report, indent=1) + "\n")

"""The answer to "does it fit, what dominates, how long": one config's verdict, per-stage peak
memory, largest per-step collectives and the step-time estimate, gathered from what `budget` and
`estimate` compute. `moeplan budget`'s first screen and `moeplan report` both render this; neither
computes a figure of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.accounting import BudgetError, budgets, phase_label
from planner.config.schema import ClusterSection, Config
from planner.estimate import estimate
from planner.findings import Finding, has_errors

# The memory parts a stage's peak is made of (planner/budget/memory.py peak_memory_bytes), by what
# people call them; buffers are the stage's own buffers plus one layer's transient comm buffers.
MEMORY_PARTS: dict[str, tuple[str, ...]] = {
    "weights": ("weight_bytes",),
    "grads": ("grad_bytes",),
    "optimizer": ("optimizer_bytes",),
    "activations": ("activation_bytes",),
    "buffers": ("buffer_bytes", "comm_buffer_bytes", "vex_slot_bytes", "transient_extra_bytes",
                "workspace_bytes"),
}
# MEM002 above this share of GPU memory for the device total under the default
# cluster.memory_margin (planner/rules/memory.py headroom_share reads the config's own).
HEADROOM_SHARE = 1 - ClusterSection.model_fields["memory_margin"].default
MEMORY_CODES = ("MEM001", "MEM002")


@dataclass(frozen=True)
class StageMemory:
    stage: int
    rank: int
    parts: dict[str, float]
    peak: float
    gpu: float
    device: float = 0.0  # the device total of the stage's busiest EP rank

    @property
    def share(self) -> float:
        return self.peak / self.gpu if self.gpu else 0.0

    @property
    def device_share(self) -> float:
        return self.device / self.gpu if self.gpu else 0.0


@dataclass(frozen=True)
class CollectiveStep:
    """One collective phase's per-step bytes on the stage where they are largest."""
    name: str
    phase: str
    label: str
    stage: int
    wire: float
    intra: float
    inter: float


@dataclass
class Summary:
    findings: list[Finding]
    stages: list[StageMemory] = field(default_factory=list)
    collectives: list[CollectiveStep] = field(default_factory=list)
    estimate: dict[str, Any] | None = None
    budget_error: str | None = None
    estimate_error: str | None = None
    line: float = HEADROOM_SHARE  # 1 - cluster.memory_margin

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def verdict(self) -> str:
        """`fits`, `MEM001` (does not fit), `MEM002` (under cluster.memory_margin free) or
        `errors`."""
        codes = {f.code for f in self.findings}
        if "MEM001" in codes:
            return "MEM001"
        if has_errors(self.findings):
            return "errors"
        return "MEM002" if "MEM002" in codes else "fits"

    def headline(self) -> str:
        """One sentence: the verdict and the closest stage to the limit."""
        worst = max(self.stages, key=lambda s: s.device_share, default=None)
        closest = (f"highest device total {gib(worst.device)} of {gib(worst.gpu)} "
                   f"({worst.device_share:.1%}; allocated peak {gib(worst.peak)}) on stage "
                   f"{worst.stage}" if worst else f"no budgets: {self.budget_error}")
        others = sorted({f.code for f in self.errors if f.code not in MEMORY_CODES})
        rules = f"; rule errors: {', '.join(others)}" if others else ""
        return {"fits": f"fits: every stage under {self.line * 100:.0f} % of GPU memory — {closest}",
                "MEM002": f"MEM002: fits, but a stage leaves under {(1 - self.line) * 100:.0f} % "
                          f"headroom — {closest}{rules}",
                "MEM001": f"MEM001: does not fit — {closest}{rules}",
                "errors": f"does not pass: {', '.join(others)} — {closest}"}[self.verdict]


def gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


def summarize(cfg: Config, findings: list[Finding], items: list | None = None) -> Summary:
    """The summary of `cfg` from `budgets(cfg)` (given, or computed here) and `estimate(cfg)`."""
    summary = Summary(findings, line=1 - cfg.cluster.memory_margin)
    if items is None:
        try:
            items = budgets(cfg)
        except BudgetError as exc:
            summary.budget_error = str(exc)
            return summary
    summary.stages = stage_memory(items)
    summary.collectives = largest_collectives(items)
    try:
        summary.estimate = estimate(cfg).as_json()
    except (BudgetError, KeyError, ZeroDivisionError) as exc:
        summary.estimate_error = str(exc)
    return summary


def stage_memory(items: list) -> list[StageMemory]:
    """Peak memory and its parts per stage (first rank of each stage)."""
    shared = {b.name: float(b.value) for b in items if b.stage is None}
    by_stage: dict[int, dict[str, float]] = {}
    ranks: dict[int, int] = {}
    for b in items:
        if b.stage is not None:
            by_stage.setdefault(b.stage, {})[b.name] = float(b.value)
            ranks.setdefault(b.stage, int(b.scope.rsplit("rank ", 1)[-1].rstrip(")")))
    out = []
    for stage, values in sorted(by_stage.items()):
        values = shared | values
        parts = {part: sum(values.get(n, 0.0) for n in names) for part, names in MEMORY_PARTS.items()}
        out.append(StageMemory(stage, ranks[stage], parts, values["peak_memory_bytes"],
                               values["gpu_memory_bytes"], values.get("device_memory_bytes", 0.0)))
    return out


def largest_collectives(items: list) -> list[CollectiveStep]:
    """Every issued `step.<name>.<phase>` on its busiest stage, most wire bytes first."""
    rows: dict[tuple[str, str], dict[int, dict[str, float]]] = {}
    for b in items:
        if b.stage is None or not b.name.startswith("step."):
            continue
        _, name, phase, figure = b.name.split(".")
        rows.setdefault((name, phase), {}).setdefault(b.stage, {})[figure] = float(b.value)
    out = []
    for (name, phase), stages in rows.items():
        stage, figures = max(stages.items(), key=lambda kv: (kv[1].get("wire_bytes", 0.0), -kv[0]))
        if figures.get("wire_bytes", 0.0) > 0:
            out.append(CollectiveStep(name, phase, phase_label(name, phase), stage,
                                      figures["wire_bytes"], figures.get("intra_node_bytes", 0.0),
                                      figures.get("inter_node_bytes", 0.0)))
    return sorted(out, key=lambda c: -c.wire)

"""The report's charts: matplotlib figures rendered to inline SVG text (no network, no files).

Each function draws figures that planner/summary.py and planner/estimate.py computed; none
computes a figure of its own. Text stays text in the SVG (svg.fonttype none), so a browser's DOM
holds the labels and the page needs no embedded fonts.
"""

from __future__ import annotations

import io
import re
from typing import Any

import matplotlib

matplotlib.use("svg")  # before any figure: the SVG backend, never a GUI one

from matplotlib.figure import Figure  # noqa: E402

from planner.summary import HEADROOM_SHARE, CollectiveStep, StageMemory  # noqa: E402

GIB = 2**30
PART_COLOURS = {"weights": "#4e79a7", "grads": "#f28e2b", "optimizer": "#76b7b2",
                "activations": "#e15759", "buffers": "#b07aa1"}
NVLINK, NETWORK = "#59a14f", "#edc948"
TIME_PARTS = (("compute_s", "compute", "#4e79a7"), ("exposed_comm_s", "exposed comm", "#e15759"),
              ("bubble_s", "pipeline bubble", "#bab0ac"), ("optimizer_s", "optimizer", "#76b7b2"))
_RC = {"svg.fonttype": "none", "svg.hashsalt": "moeplan-report", "font.size": 9,
       "font.family": "sans-serif"}


def _svg(fig: Figure, chart_id: str) -> str:
    """The figure as an inline <svg> element carrying `chart_id` (no XML prolog or DOCTYPE)."""
    buffer = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    return re.sub(r"<svg ", f'<svg id="{chart_id}" class="chart" role="img" ', text, count=1)


def _figure(width: float, height: float) -> Figure:
    with matplotlib.rc_context(_RC):
        return Figure(figsize=(width, height), layout="constrained")


def memory_chart(stages: list[StageMemory]) -> str:
    """Stacked memory parts per stage against the GPU capacity and the 80 % line."""
    with matplotlib.rc_context(_RC):
        fig = _figure(8, 3.6)
        ax = fig.add_subplot()
        labels = [f"stage {s.stage}" for s in stages]
        bottom = [0.0] * len(stages)
        for part, colour in PART_COLOURS.items():
            heights = [s.parts[part] / GIB for s in stages]
            ax.bar(labels, heights, bottom=bottom, color=colour, label=part, width=0.65)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        gpu = stages[0].gpu / GIB
        ax.axhline(gpu, color="#333333", linewidth=1.4, label=f"GPU capacity ({gpu:.0f} GiB)")
        ax.axhline(gpu * HEADROOM_SHARE, color="#333333", linewidth=1, linestyle="--",
                   label=f"MEM002 line at the default margin, {HEADROOM_SHARE:.0%} "
                         f"({gpu * HEADROOM_SHARE:.0f} GiB)")
        for i, s in enumerate(stages):
            ax.text(i, s.peak / GIB, f"{s.peak / GIB:.1f}\n{s.share:.0%}", ha="center",
                    va="bottom", fontsize=7)
        ax.set_ylabel("GiB per GPU (first rank of the stage)")
        ax.set_ylim(0, max(gpu, max(s.peak for s in stages) / GIB) * 1.15)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
        ax.spines[["top", "right"]].set_visible(False)
        return _svg(fig, "chart-memory")


def comm_chart(collectives: list[CollectiveStep], top: int = 14) -> str:
    """Bytes per step of the largest collective phases, NVLink (intra-node) vs network."""
    rows = list(reversed(collectives[:top]))
    with matplotlib.rc_context(_RC):
        fig = _figure(8, 0.32 * len(rows) + 1.2)
        ax = fig.add_subplot()
        labels = [f"{c.name} · {c.label} (stage {c.stage})" for c in rows]
        intra = [c.intra / GIB for c in rows]
        inter = [c.inter / GIB for c in rows]
        ax.barh(labels, intra, color=NVLINK, label="intra-node (NVLink)")
        ax.barh(labels, inter, left=intra, color=NETWORK, label="inter-node (network)")
        ax.set_xlabel("GiB per optimizer step on the wire (busiest stage)")
        ax.legend(loc="lower right", frameon=False)
        ax.spines[["top", "right"]].set_visible(False)
        return _svg(fig, "chart-comm")


def time_chart(estimate: dict[str, Any]) -> str:
    """Seconds per step of every stage by part; the slowest stage sets the step."""
    stages = estimate["breakdown"]["stages"]
    with matplotlib.rc_context(_RC):
        fig = _figure(8, 3.2)
        ax = fig.add_subplot()
        labels = [f"stage {s['stage']}" for s in stages]
        bottom = [0.0] * len(stages)
        for key, label, colour in TIME_PARTS:
            heights = [s[key] for s in stages]
            ax.bar(labels, heights, bottom=bottom, color=colour, label=label, width=0.65)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.axhline(estimate["step_time_s"], color="#333333", linewidth=1, linestyle=":",
                   label=f"step {estimate['step_time_s']:.2f} s")
        ax.set_ylabel("seconds per optimizer step")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
        ax.spines[["top", "right"]].set_visible(False)
        return _svg(fig, "chart-time")


def search_chart(points: list[dict[str, Any]]) -> str:
    """Candidates as step time vs peak memory; the winner (first point) and the user's layout
    marked."""
    with matplotlib.rc_context(_RC):
        fig = _figure(8, 3.6)
        ax = fig.add_subplot()
        rest = [p for p in points[1:] if not p.get("is_user")]
        ax.scatter([p["peak_bytes"] / GIB for p in rest], [p["step_time_s"] for p in rest],
                   color="#4e79a7", s=18, label="candidates")
        yours = [p for p in points[1:] if p.get("is_user")]
        if yours:
            ax.scatter([p["peak_bytes"] / GIB for p in yours], [p["step_time_s"] for p in yours],
                       color="#333333", marker="D", s=36, label="your layout")
        best = points[0]
        ax.scatter([best["peak_bytes"] / GIB], [best["step_time_s"]], color="#e15759", marker="*",
                   s=160, label=f"winner: {best['label']}", zorder=3)
        ax.set_xlabel("peak memory per GPU (GiB, largest stage)")
        ax.set_ylabel("step time (s)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
        ax.spines[["top", "right"]].set_visible(False)
        return _svg(fig, "chart-search")

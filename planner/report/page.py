"""One self-contained HTML page for a planning review: the verdict and findings with fixes first,
then the layout, memory, communication, step time and (with a search) the candidates.

The page renders what `check`, `groups`, `budget`, `estimate` and `search` compute (through
planner/summary.py and the grid); it computes no figure of its own. Charts are inline SVG from
planner/report/charts.py; the jinja2 template holds the CSS, so the page loads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.config.schema import Config
from planner.findings import Finding
from planner.layout.grid import Grid
from planner.layout.rank_generator import GridError
from planner.layout.spec import grid_spec_from_config
from planner.report.grid_svg import render_stage_svg
from planner.search.run import search as run_search
from planner.summary import Summary, gib, summarize

EXPERT_ROWS = 4  # EP ranks listed in the expert-ownership table before "…"


@dataclass
class SearchOutcome:
    points: list[dict[str, Any]]  # winner first: label, step_time_s, peak_bytes
    note: str


def search_outcome(cfg: Config, top: int) -> SearchOutcome:
    """The candidates of `moeplan search` (planner.search.run.search), or why there are none."""
    result = run_search(cfg, top=top)
    points = [{"label": _candidate_label(c), "step_time_s": float(c.step_time_s),
               "peak_bytes": float(c.peak_memory_bytes), "is_user": bool(c.is_user)}
              for c in result.candidates]
    if result.user is not None and not any(p["is_user"] for p in points):
        points.append({"label": "your layout", "step_time_s": float(result.user.step_time_s),
                       "peak_bytes": float(result.user.peak_memory_bytes), "is_user": True})
    note = (f"{len(result.candidates)} fitting candidates shown of {result.fitting} fitting, "
            f"{result.explored} explored" if points else "no candidate fits")
    return SearchOutcome(points, note)


def _candidate_label(candidate: Any) -> str:
    data = candidate.as_json()
    p = data["parallel"]
    return (f"TP{p['tp']} CP{p['cp']} PP{p['pp']} VPP{p['vpp']} EP{p['ep']} ETP{p['etp']} "
            f"mbs{data['training']['micro_batch_size']} {data['recompute']}"
            + (" (yours)" if data.get("is_user_layout") else ""))


def layout_context(cfg: Config) -> dict[str, Any] | None:
    """The stage rank map, the group sizes and the expert ownership of stage 0; None without a grid."""
    try:
        grid = Grid(grid_spec_from_config(cfg))
    except GridError:
        return None
    s = grid.spec
    groups = []
    for kind in grid.listing_kinds():
        record = grid.group_kind(kind)
        groups.append({"kind": kind, "layout": record.grid, "built_from": record.built_from,
                       "size": grid.group_size(kind), "count": grid.num_groups(kind)})
    experts, seen = [], set()
    for rank in grid.stage_ranks(0):
        own = grid.rank_view(rank, with_formulas=False).experts
        if own.ep_rank in seen or not own.expert_ids:
            continue
        seen.add(own.ep_rank)
        experts.append({"rank": rank, "ep_rank": own.ep_rank, "ep_size": own.ep_size,
                        "experts": f"{own.expert_ids[0]}–{own.expert_ids[-1]}",
                        "count": len(own.expert_ids), "replicas": list(own.replica_peers)})
        if len(experts) == EXPERT_ROWS:
            break
    svg = render_stage_svg(grid, 0)
    return {"header": {"world size": s.world_size, "DP": grid.dp, "EDP": grid.edp, "PP": s.pp,
                       "ranks per stage": s.ranks_per_stage,
                       "dense order": f"{grid.dense.order} {list(grid.dense.sizes)}",
                       "expert order": f"{grid.expert.order} {list(grid.expert.sizes)}"},
            "groups": groups, "experts": experts,
            "num_experts": cfg.model.num_experts, "ep": cfg.parallel.ep,
            "rank_map": svg[svg.index("<svg"):] if "<svg" in svg else svg}


def page_context(cfg: Config, config_path: Path, findings: list[Finding],
                 search_top: int | None = None) -> dict[str, Any]:
    """Everything the template shows; the charts only where their figures exist."""
    from planner.report import charts

    summary: Summary = summarize(cfg, findings)
    charts_svg: dict[str, str] = dict.fromkeys(("memory", "comm", "time", "search"), "")
    if summary.stages:
        charts_svg["memory"] = charts.memory_chart(summary.stages)
    if summary.collectives:
        charts_svg["comm"] = charts.comm_chart(summary.collectives)
    if summary.estimate is not None:
        charts_svg["time"] = charts.time_chart(summary.estimate)
    search = None
    if search_top is not None:
        search = search_outcome(cfg, search_top)
        if search.points:
            charts_svg["search"] = charts.search_chart(search.points)
    return {
        "config": str(config_path), "name": config_path.stem,
        "summary": summary, "verdict": summary.verdict, "headline": summary.headline(),
        "findings": findings, "layout": layout_context(cfg), "charts": charts_svg,
        "stages": [{"stage": s.stage, "rank": s.rank, "peak": gib(s.peak), "share": f"{s.share:.1%}",
                    "parts": {k: gib(v) for k, v in s.parts.items()}} for s in summary.stages],
        "collectives": summary.collectives[:14], "estimate": summary.estimate, "search": search,
    }


def render_page(context: dict[str, Any]) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("planner.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html.j2"]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters["gib"] = gib
    return env.get_template("report.html.j2").render(**context)


def build_report(cfg: Config, config_path: Path, findings: list[Finding],
                 search_top: int | None = None) -> str:
    return render_page(page_context(cfg, config_path, findings, search_top))

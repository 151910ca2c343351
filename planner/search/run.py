"""`moeplan search`: which layout of the same model, cluster and batch runs fastest.

Search is a loop around the one pipeline `check` and `estimate` use: every candidate is a real
Config (the user's with the layout knobs changed), refused by the rule catalog (MEM001 is the
memory budget's verdict; `memory_headroom` may demand more margin) and timed by the step-time
estimate. Nothing here re-states a rule or a formula: the cheap pruning before the catalog is
only the degrees' own divisibility (planner/degrees.py), and pipeline layouts are generated as
Megatron layout strings that planner/layout/pipeline.py splits (or refuses) as for any config.

The space is searched in two phases:

1. every (TP, CP, PP, EP, ETP) family that divides the world (TP·CP inside one NVLink domain),
   with one anchor layout (the slot-balanced VPP-1 layout, or the user's own) and the user's
   knobs, full recompute when those do not fit; within a (TP, CP, PP, ETP) group EPs go largest
   first and stop at the first whose anchor does not fit even with full recompute and MBS 1 (a
   smaller EP holds more experts per rank: more memory, never less);
2. the `refine` fastest families (and the user's): cost-balanced layouts for VPP 1, 2, 4 (from the
   family's own per-stage times, see `layer_costs`), the slot-balanced and even layouts, timed
   with the anchor's knobs; then for the `layouts` fastest fitting ones (and the fastest of all
   when it does not fit with the anchor's knobs) the whole knob grid — every micro-batch size ×
   recompute preset × dispatcher/backend × EP overlap — with three exact prunings: a recompute
   preset is skipped when a preset recomputing a subset of its modules already fits (recomputing
   more never makes a step faster nor is ever needed for memory then), a preset is skipped at a
   micro-batch size when it did not fit at a smaller one (activations grow with the
   micro-batch), and a preset is skipped beside one recomputing a subset of its modules that did
   not fit when the extra modules hold no memory (planner/accounting.py `memory_alike`:
   selective core_attn under fused attention).

`refine=0` (the default) refines every family that fits: the whole space. Ranking uses the
float estimate (planner/budget/expr.py); the printed candidates are re-evaluated exactly.

Branch and bound keeps the whole space fast and the result exact (planner/search/bound.py): phase
2 takes the families lowest `family_floor` first, in rounds, and skips a family whose floor
exceeds the top-th step time found (it could hold no candidate of the top, nor the winner's
refusals). The user's config is always a candidate, so the winner is never slower than it.

The rooms: planner/search/space.py (families, pipeline layouts, the cost-balanced programme,
recompute presets), knobs.py (the `Knobs` record a candidate sets), judge.py (one candidate
judged and timed), bound.py (branch and bound with its process pool) and this module (the run
and its results).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

from planner.config.schema import Config
from planner.rules.memory import headroom_share
from planner.search.bound import (
    SIDE_SHARE,
    Floors,
    Phase1Item,
    Work,
    default_workers,
    floor_dispatcher,
    floors_pool,
    floors_work,
    grid_work,
    layouts_work,
    phase1_floors_work,
    phase1_work,
    run_units,
    worker_pool,
)
from planner.search.judge import (
    FLOAT_MARGIN,
    Candidate,
    Judge,
    Rejected,
    exact,
    exact_refusal,
    verdict_key,
)
from planner.search.knobs import Family, Knobs, Pipeline, family_of
from planner.search.space import (
    MBS_CHOICES,
    Group,
    dispatchers,
    groups,
    pipeline_choices,
    recompute_presets,
)

# How many layouts the knob grid's first round takes, most promising first (each later round twice
# as many): the most promising few set a tight bound for all the others; two keep both workers busy.
GRID_FIRST_ROUND = 2
# How many families (lowest `family_floor` first) get layouts and knob grids in the first round
# (each later round four times as many): enough to set a bound near the best before the others.
FAMILY_FIRST_ROUND = 4


@dataclass
class SearchResult:
    candidates: list[Candidate]  # fitting, fastest first, at most `top`
    user: Candidate | None  # the user's own layout (None when it does not fit)
    ruled_out: list[Rejected]  # faster than the winner but refused, nearest first
    explored: int  # configs built and judged by the catalog
    legal: int  # no rule error (MEM001 and the headroom aside)
    fitting: int  # no rule error at all, inside the headroom (timed)
    wall_s: float = 0.0
    pruned: int = 0  # families and knob settings never judged, for the reasons in `pruned_by`
    pruned_by: dict[str, int] = field(default_factory=dict)
    memory_headroom: float = 1.0  # the share the device total may use (resolved)

    @property
    def winner(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def as_json(self) -> dict[str, Any]:
        return {"candidates": [c.as_json() for c in self.candidates],
                "user": self.user.as_json() if self.user else None,
                "ruled_out": [{"difference": r.difference, "reason": r.reason, "codes": list(r.codes),
                               "step_time_s": r.step_time_s} for r in self.ruled_out],
                "explored": self.explored, "legal": self.legal, "fitting": self.fitting,
                "pruned": self.pruned, "pruned_by": self.pruned_by,
                "memory_headroom": self.memory_headroom, "wall_s": self.wall_s}


Progress = Callable[[int, int], None]

# Phase-1 settings (family x EP, planner/search/space.py groups) below which the default search
# judges in this process: a forked worker warms its own formula books, grids and placements, which
# pays only when there is enough to share. Measured on an idle 2-core machine (whole
# `search(cfg, top=2)` processes, one worker against two, medians of 5 pairs): tiny-cpu-8.yaml at
# world size 2 (8 settings) 0.92x wall in process; at world size 4 (30 settings) 1.22x; as
# bundled (77 settings) 1.19x, though with 25% less CPU. A loaded machine favours the single
# process for longer (0.72x at 78 settings with other jobs on both cores).
IN_PROCESS_BELOW = 12


def search(cfg: Config, *, top: int = 10, refine: int = 0, layouts: int = 1, max_ruled_out: int = 3,
           progress: Progress | None = None, workers: int | None = None,
           memory_headroom: float | None = None) -> SearchResult:
    """Rank the fitting layouts of `cfg`'s model, cluster and batch by predicted step time.

    Phase 1 anchors every family; phase 2 refines the `refine` fastest families (0: all that fit)
    and the user's: cost-balanced layouts, then the knob grid on the `layouts` best of them (see
    the module doc). A candidate fits when every stage's device total (busiest EP rank) is at
    most `memory_headroom` of the GPU's memory (None: 1 - cluster.memory_margin, MEM002's line;
    1: MEM001's own threshold). `workers` processes share
    the judging (default: up to 2 cores, or this process alone for a small space, IN_PROCESS_BELOW).
    """
    space = groups(cfg)
    if workers is None:
        settings = sum(len(eps) for eps in space[0].values())
        workers = 1 if settings < IN_PROCESS_BELOW else default_workers()
    if memory_headroom is None:
        memory_headroom = float(headroom_share(cfg))
    with worker_pool(workers) as pool:
        return _search(cfg, space, top, refine, layouts, max_ruled_out, progress, pool,
                       memory_headroom)


def _search(cfg: Config, space: tuple[dict[Group, list[int]], int], top: int, refine: int,
            layouts: int, max_ruled_out: int, progress: Progress | None, pool: Executor | None,
            memory_headroom: float) -> SearchResult:
    start = time.perf_counter()
    judge = Judge(cfg, memory_headroom)
    user = judge.judge(None, is_user=True)
    by_group, pruned_degrees = space
    pruned: dict[str, int] = {"families the degrees rule out": pruned_degrees}
    user_family = family_of(cfg)
    plan: list[Phase1Item] = []
    for (tp, cp, pp, etp), eps in by_group.items():
        pipes = pipeline_choices(cfg, pp, (1,))
        if (tp, cp, pp, etp) == (user_family[0], user_family[1], user_family[2], user_family[4]):
            pipes.insert(0, Pipeline.of(cfg))
        plan.append(((tp, cp, pp, etp), eps, pipes))
    shares = max(1, min(len(plan), 16))
    units = [plan[i::shares] for i in range(shares)]
    sizes = [sum(len(eps) for _, eps, _ in unit) for unit in units]
    done, total = 0, sum(sizes) * 2

    def tick(count: int) -> None:
        nonlocal done
        done += count
        if progress:
            progress(done, max(total, done))

    def count(reason: str, settings: int) -> None:
        pruned[reason] = pruned.get(reason, 0) + settings

    def absorb(part: Work) -> None:
        judge.absorb(part.judge)
        for reason, settings in part.pruned.items():
            count(reason, settings)

    family_floors: dict[Family, float | None] = {}
    # Phase 1 runs in this process, before the pool's workers fork (at its first unit): anchoring
    # every family builds the formula books, compiled levels, grids and placements most later
    # units use, which the workers then inherit instead of each building its own. The anchored
    # families' floors (an estimate per micro-batch size each, a third of phase 1's work) are
    # timed beside it, in a process of their own (`floors_pool`), unit by unit.
    # The floors' process anchors the last units itself (`SIDE_SHARE`), submitted first; their
    # verdicts are absorbed after the parent's, in the units' order as when one process runs all.
    with floors_pool(pool) as side:
        own = len(units) if side is None else max(1, len(units) - len(units) * SIDE_SHARE // 16)
        ahead = [side.submit(phase1_floors_work, cfg, memory_headroom, unit)
                 for unit in units[own:]] if side is not None else []
        floors: list[Future[Work]] = []
        for unit, size in zip(units[:own], sizes[:own], strict=True):
            part = phase1_work(cfg, memory_headroom, unit)
            absorb(part)
            tick(size)
            if side is None:
                family_floors.update(floors_work(cfg, memory_headroom, part.anchored).family_floors)
            else:
                floors.append(side.submit(floors_work, cfg, memory_headroom, part.anchored))
        for future, size in zip(ahead, sizes[own:], strict=True):
            part = future.result()
            absorb(part)
            tick(size)
            family_floors.update(part.family_floors)
        for future in floors:
            family_floors.update(future.result().family_floors)
    anchors: list[Candidate] = []
    for cand in sorted(judge.timed(), key=lambda c: c.step_time_s):
        if all(family_of(cand.cfg) != family_of(b.cfg) for b in anchors):
            anchors.append(cand)
    chosen = anchors[:refine] if refine > 0 else anchors
    if isinstance(user, Candidate) and all(family_of(b.cfg) != user_family for b in chosen):
        chosen.append(user)
    pruned["families not refined"] = len(anchors) - len(chosen)
    choices = dispatchers(cfg)
    lower, bounded = floor_dispatcher(cfg, choices)
    per_layout = len(recompute_presets(cfg)) * len(MBS_CHOICES) * 2 * len(choices)
    total = done + 10 * len(chosen)

    def floor_of(anchor: Candidate) -> float:
        """The family's lower bound (`family_floor`); the user's family is always refined."""
        fam = family_of(anchor.cfg)
        floor = family_floors.get(fam)
        return -float("inf") if floor is None or fam == user_family else floor

    # Families lowest floor first, in rounds of growing sizes: before each round, the families
    # whose floor exceeds the bound (the top-th step time known) are skipped whole, then the
    # round's families get their layouts and those layouts' knob grids (`_grids`), which tighten
    # the bound for the next round.
    pending = sorted(chosen, key=floor_of)
    size = FAMILY_FIRST_ROUND
    while pending:
        bound = judge.bound(top)
        slow = [a for a in pending if floor_of(a) > bound * (1 + FLOAT_MARGIN)]
        if slow:
            count("families slower on every layout, without recompute, than the best found",
                  len(slow))
            tick(10 * len(slow))
            pending = [a for a in pending if floor_of(a) <= bound * (1 + FLOAT_MARGIN)]
        batch, pending = pending[:size], pending[size:]
        size *= 4
        queue: list[tuple[float, tuple[bool, float], int, Knobs, Floors]] = []
        for part in run_units(layouts_work, cfg, memory_headroom,
                              [(anchor, layouts, bound) for anchor in batch], [10] * len(batch),
                              pool, tick):
            absorb(part)
            for promise, layout, floors in part.layouts:
                known = [t for t in floors.values() if t is not None]
                # A layout whose floors are all known and bound every dispatcher can be skipped
                # whole; the others never are.
                whole = lower is not None and bounded == set(choices) and \
                    len(known) == len(MBS_CHOICES)
                queue.append((min(known) if whole else -float("inf"), promise, len(queue),
                              layout, floors))
        total += per_layout * len(queue)
        _grids(cfg, judge, queue, top, per_layout, memory_headroom, pool, tick, count, absorb)
    if progress:
        progress(total, total)
    # Ties go to the user's layout, then to the candidate that changes fewest of its fields.
    shown, user = _exact_top(cfg, judge.timed(), top, pool, user)
    winner = shown[0] if shown else None
    ruled_out = _ruled_out(judge, winner, max_ruled_out, pool) if winner else []
    return SearchResult(shown, user if isinstance(user, Candidate) else None, ruled_out,
                        judge.explored, judge.legal, judge.fitting,
                        time.perf_counter() - start, sum(pruned.values()), pruned,
                        memory_headroom)


def _grids(cfg: Config, judge: Judge, queue: list[tuple[float, tuple[bool, float], int, Knobs, Floors]],
           top: int, per_layout: int, memory_headroom: float, pool: Executor | None,
           tick: Callable[[int], None], count: Callable[[str, int], None],
           absorb: Callable[[Work], None]) -> None:
    """Branch and bound over the knob grids of `queue`'s layouts: `top` candidates already fit
    at the bound (the top-th step time known), so a layout (or grid cell) whose floor exceeds it
    cannot enter the top (nor be a faster candidate that was ruled out). The layouts go most
    promising first (fitting at the anchor's knobs, fastest there: the likeliest to hold the
    best, so the bound tightens soonest), in rounds of fixed, growing sizes (whatever the
    workers, so the counts never depend on them); each starts from the bound the earlier ones
    set."""
    queue = sorted(queue, key=lambda item: item[1:3])
    size = GRID_FIRST_ROUND
    while queue:
        bound = judge.bound(top)
        slow = [item for item in queue if item[0] > bound * (1 + FLOAT_MARGIN)]
        if slow:
            count("settings slower without recompute than the best found", per_layout * len(slow))
            tick(per_layout * len(slow))
            queue = [item for item in queue if item[0] <= bound * (1 + FLOAT_MARGIN)]
            if not queue:
                break
        batch, queue = queue[:size], queue[size:]
        units = [(layout, floors, bound, max(top, 1)) for _, _, _, layout, floors in batch]
        for part in run_units(grid_work, cfg, memory_headroom, units,
                              [per_layout] * len(units), pool, tick):
            absorb(part)
        size *= 2


def _ruled_out(judge: Judge, winner: Candidate, count: int,
               pool: Executor | None = None) -> list[Rejected]:
    """Refused candidates of the winner's family (its layouts and its knob grid) that would have
    been faster, nearest first, one per distinct verdict (`verdict_key`); the listed ones are
    re-evaluated exactly (in the pool's processes when there is one)."""
    fam = family_of(winner.cfg)
    refused = [r for r in judge.seen.values()
               if isinstance(r, Rejected) and family_of(r.cfg) == fam]
    for r in refused:
        judge.time_rejected(r)
    # Ranked in floats: "faster" means by more than their rounding (1e-12 of the step).
    faster = sorted((r for r in refused if r.step_time_s is not None
                     and r.step_time_s < winner.step_time_s * (1 - FLOAT_MARGIN)),
                    key=lambda r: -(r.step_time_s or 0))
    out, seen = [], set()
    mine = Knobs.of(winner.cfg)
    for r in faster:
        verdict = verdict_key(r.codes)
        if verdict not in seen:
            seen.add(verdict)
            r.difference = mine.diff(Knobs.of(r.cfg))
            out.append(r)
    listed = out[:count]
    units = [(judge.cfg, judge.headroom, r) for r in listed]
    again = list(pool.map(exact_refusal, units)) if pool is not None and len(units) > 1 else \
        [exact_refusal(unit) for unit in units]
    for r, (step_time, reason) in zip(listed, again, strict=True):
        r.step_time_s = step_time
        r.reason = reason or r.reason
    return listed


def _exact_top(cfg: Config, timed: list[Candidate], top: int, pool: Executor | None = None,
               user: Candidate | Rejected | None = None,
               ) -> tuple[list[Candidate], Candidate | Rejected | None]:
    """The `top` fastest, ranked on exact step times: every candidate within the float margin of
    the top-th float time is re-evaluated exactly (in the pool's processes when there is one),
    then ranked (ties go to the user's layout, then to the candidate that changes fewest of its
    fields); and the user's layout when it fits, evaluated exactly with them (`user` as it was
    otherwise)."""
    mine = Knobs.of(cfg)

    def key(c: Candidate) -> tuple[float, bool, int]:
        return (c.step_time_s, not c.is_user, len(mine.diff(Knobs.of(c.cfg))))

    ranked = sorted(timed, key=key)
    limit = ranked[min(top, len(ranked)) - 1].step_time_s * (1 + 4 * FLOAT_MARGIN) if ranked \
        else -float("inf")
    close = [c for c in ranked if c.step_time_s <= limit]
    # The user's layout is timed exactly beside them (it is among them when close to the top).
    extra = [user] if isinstance(user, Candidate) and all(c is not user for c in close) else []
    todo = close + extra
    again = list(pool.map(exact, todo)) if pool is not None and len(todo) > 1 else \
        [exact(c) for c in todo]
    if isinstance(user, Candidate):
        user = again[next(i for i, c in enumerate(todo) if c is user)]
    return sorted(again[:len(close)], key=key)[:top], user


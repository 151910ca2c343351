"""Branch and bound over the space, with its process pool: what search judges and what it can skip.

The bound is the `top`-th fitting step time known, and a setting whose time without recompute
exceeds it is skipped with all its presets (recomputing more is never faster), so the top K and
the ruled-out list are those of the unpruned grid. One such time stands for several settings:
with EP overlap on a setting is never slower than with it off, and HybridEP's time bounds every
dispatcher no more efficient than it (`floor_dispatcher`); the least of a layout's floors over
the micro-batch sizes bounds its whole grid, and `family_floor` bounds every layout of a family.
So the families are taken lowest floor first and their layouts most promising first, in rounds of
fixed, growing sizes whose bound the earlier rounds set (planner/search/run.py), and inside a grid
the settings are judged fastest first; a family's slower layouts are timed but judged only when
they could still be chosen or be a candidate.

Each `*_work` function is one unit of work a worker process runs on its own judge; its verdicts
come back in a `Work` and the parent absorbs them in the units' order.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from planner.accounting import (
    COLLECTIVES,
    DDP_WINDOWS,
    BudgetError,
    dispatch_efficiency,
    memory_alike,
    overlap_symbol,
)
from planner.config.schema import Config
from planner.estimate import estimate
from planner.memo import HeldByIdentity
from planner.search.judge import (
    FLOAT_MARGIN,
    MEMORY_VERDICTS,
    NOT_FITTING,
    Candidate,
    Judge,
    Rejected,
    identity,
)
from planner.search.knobs import Dispatcher, Family, Knobs, Pipeline, Recompute, vpp_of
from planner.search.space import (
    FULL_RECOMPUTE,
    MBS_CHOICES,
    NO_RECOMPUTE,
    Group,
    cost_balanced_choices,
    dispatchers,
    dominates,
    layer_costs,
    pipeline_choices,
    recompute_presets,
    recomputed,
)


@dataclass
class Work:
    """What one worker returns: its judge's verdicts and what it pruned, by reason."""

    judge: Judge
    pruned: dict[str, int] = field(default_factory=dict)
    # Chosen for the knob grid, each with its promise (does not fit, step time at the anchor's
    # knobs) and its `floors`, by which the grid takes the layouts (most promising first).
    layouts: list[tuple[tuple[bool, float], Knobs, Floors]] = field(default_factory=list)
    # The families whose anchor fits, in the order phase 1 anchored them (`phase1_work`).
    anchored: list[Family] = field(default_factory=list)
    # Per anchored family that fits: `family_floor`, a lower bound of every setting it has
    # (`floors_work`).
    family_floors: dict[Family, float | None] = field(default_factory=dict)

    def prune(self, reason: str, count: int = 1) -> None:
        self.pruned[reason] = self.pruned.get(reason, 0) + count


Floors = dict[int, float | None]  # per micro-batch size
Phase1Item = tuple[Group, list[int], list[Pipeline]]  # a group, its EPs, its anchor layouts


# The knobs an anchor falls back to when the user's are illegal on every layout of a family
# (e.g. EP overlap, which Megatron refuses without VPP on PP > 1): the plainest dispatcher.
def plain(knobs: Knobs) -> Knobs:
    return replace(knobs, ep_overlap=False, dispatcher=("alltoall", None))


def _anchor(judge: Judge, knobs: Knobs, pipes: list[Pipeline]) -> Candidate | Rejected | None:
    """The family's first legal pipeline layout with the user's knobs (then the `plain` ones);
    full recompute at MBS 1 when those do not fit. None when every layout is illegal."""
    for settings in (knobs, plain(knobs)):
        for pipe in pipes:
            out = judge.judge(replace(settings, pipeline=pipe))
            if isinstance(out, Rejected) and out.codes in MEMORY_VERDICTS:
                out = judge.judge(replace(settings, pipeline=pipe, micro_batch_size=1,
                                          recompute=FULL_RECOMPUTE))
            if isinstance(out, Candidate) or out.codes in NOT_FITTING:
                return out
    return None


def phase1_work(cfg: Config, headroom: float, items: list[Phase1Item]) -> Work:
    """Anchor every family of a share of the (TP, CP, PP, ETP) groups (one process's work)."""
    work, knobs = Work(Judge(cfg, headroom)), Knobs.of(cfg)
    for (tp, cp, pp, etp), eps, pipes in items:
        for i, ep in enumerate(eps):
            out = _anchor(work.judge, knobs.of_family((tp, cp, pp, ep, etp)), pipes)
            if isinstance(out, Rejected) and out.codes in MEMORY_VERDICTS:
                # Even full recompute at MBS 1 does not fit: smaller EPs hold more experts. (Its
                # other layouts are not tried: the slot-balanced one spreads memory evenly.)
                work.prune("families whose anchor does not fit even with full recompute")
                work.prune("families with a smaller EP than one that does not fit", len(eps) - i - 1)
                break
            if isinstance(out, Candidate):
                work.anchored.append((tp, cp, pp, ep, etp))
    return work


def floors_work(cfg: Config, headroom: float, families: list[Family]) -> Work:
    """`family_floor` of anchored families: a pure function of the family, so where it runs (a
    process of its own, beside phase 1: `floors_pool`) changes nothing but the time."""
    work = Work(Judge(cfg, headroom))
    work.family_floors = {family: family_floor(cfg, family) for family in families}
    return work


def phase1_floors_work(cfg: Config, headroom: float, items: list[Phase1Item]) -> Work:
    """`phase1_work` and the floors of the families it anchors, in one unit: the share of phase 1
    the floors' process takes on beside the parent (`SIDE_SHARE`)."""
    work = phase1_work(cfg, headroom, items)
    work.family_floors = {family: family_floor(cfg, family) for family in work.anchored}
    return work


def _ddp_window_excess(env: dict[str, Any]) -> float:
    """How much more of the data-parallel buffers' collectives the one-stage model exposes than a
    bound may count. On the first stage they hide only beside one microbatch pass, all buckets but
    one (planner/budget/time.py DDP_WINDOWS); split over stages, the later ones hide theirs behind
    their whole compute, so the stages' exposures can sum to less than the one stage's. The floor
    counts each at most t - min(eff_overlap * t, compute), what every stage's exposure is at least,
    and the stages' sum never undercuts that."""
    excess = 0.0
    for name in DDP_WINDOWS:
        t = float(env.get(f"time_{name}_fwd", 0))
        flag = COLLECTIVES[name].overlap
        on = float(env.get(overlap_symbol(flag), 0)) if flag else 0.0
        loose = t - on * min(float(env["eff_overlap"]) * t, float(env["time_compute_s"]))
        excess += max(float(env.get(f"time_{name}_fwd_exposed", t)) - loose, 0.0)
    return excess


def family_floor(cfg: Config, family: Family) -> float | None:
    """A lower bound of the step time of every setting of a family, whatever its pipeline split,
    VPP and knobs (None when the family has none that holds).

    The family's model on one pipeline stage (PP 1, the same TP, CP, EP, ETP and DP, so the same
    microbatches; world size and nodes over PP) at the floor knobs of `_floors` (HybridEP with EP
    overlap on, no recompute): its busy time plus optimizer step, over PP, at its fastest
    micro-batch size. Sound because a stage's step is its busy time, bubble (never negative) and
    optimizer step, the slowest stage's is at least the stages' mean, and every busy and optimizer
    term of the time page is a sum over the layers and parameters a stage holds, a per-stage cost
    or an exposure max(0, hidden − window) of such sums, none of which a split makes smaller in
    total (the data-parallel buffers' exposure counted as loosely as any stage exposes it:
    `_ddp_window_excess`). Only where every stage's ranks are placed alike (PP outermost in the
    rank order, block placement, a stage a whole number of nodes and NVLink domains): then each
    stage's groups are stage 0's, shifted by whole nodes. tests/unit/search/test_search.py checks
    it against every layout search times."""
    c, par = cfg.cluster, cfg.parallel
    tp, cp, pp, ep, etp = family
    world = par.world_size // pp
    per_node = c.gpus_per_node or 1
    choices = dispatchers(cfg)
    lower, bounded = floor_dispatcher(cfg, choices)
    if (lower is None or bounded != set(choices) or not par.order.endswith("pp")
            or c.rank_nodes or c.rank_distribution != "block" or world % per_node
            or world % (c.nvlink_domain or per_node)):
        return None
    one = replace(Knobs.of(cfg).of_family((tp, cp, 1, ep, etp)), pipeline=Pipeline())
    best: float | None = None
    for mbs in MBS_CHOICES:
        stage = cell(one, lower, True, NO_RECOMPUTE, mbs).apply(cfg)
        stage = stage.model_copy(update={
            "parallel": stage.parallel.model_copy(update={"world_size": world}),
            "cluster": stage.cluster.model_copy(update={"nodes": math.ceil(world / per_node)})})
        try:
            est = estimate(stage, exact=False)
        except (BudgetError, ValueError, ZeroDivisionError, KeyError):
            return None  # no bound for one micro-batch size: none for the family
        shared = est.parts[0][0]
        t = float(shared["time_busy_s"] + shared["time_optimizer_s"] - _ddp_window_excess(shared)) / pp
        best = t if best is None else min(best, t)
    return best


def layouts_work(cfg: Config, headroom: float, unit: tuple[Candidate, int, float]) -> Work:
    """One family: its cost-balanced and slot-balanced layouts at the anchor's knobs; the best
    `layouts` of them go to the knob grid (`Work.layouts`). `bound` as for `_grid`."""
    anchor, layouts, bound = unit
    work = Work(Judge(cfg, headroom))
    work.judge.seen[identity(anchor.cfg)] = anchor  # judged in phase 1: not again
    knobs = Knobs.of(anchor.cfg)
    knobs = knobs.of_family(knobs.family)
    pp = knobs.pp
    pipes = pipeline_choices(cfg, pp)
    if pp > 1:
        probe = replace(knobs, pipeline=pipes[0]).apply(cfg)
        try:
            if Pipeline.of(anchor.cfg) == Pipeline.of(probe):  # the anchor is the probe: reuse its rows
                rows = [{"step_s": step, "bubble_s": bubble} for step, bubble
                        in zip(anchor.stage_step_s, anchor.stage_bubble_s, strict=True)]
            else:
                rows = estimate(probe, exact=False).stages
            costs = layer_costs(probe, rows)
        except (BudgetError, ValueError, ZeroDivisionError):
            pass
        else:
            pipes = cost_balanced_choices(cfg, pp, costs) + pipes
    if pp == cfg.parallel.pp:
        pipes.append(Pipeline.of(cfg))
    pipes.append(Pipeline.of(anchor.cfg))
    settings = [replace(knobs, pipeline=pipe) for pipe in dict.fromkeys(pipes)]
    # Timed first, judged fastest first: once `layouts` of them fit, a slower one is judged only
    # when it could still be a candidate (no slower than `bound`); it is never chosen.
    times = [work.judge.step_time(one) for one in settings]
    timed: list[tuple[bool, float, int]] = []  # (does not fit, step time, index)
    fits: list[float] = []
    for t, i in sorted((t, i) for i, t in enumerate(times) if t is not None):
        if len(fits) >= layouts and t > fits[layouts - 1] * (1 + 4 * FLOAT_MARGIN) and t > bound:
            work.judge.forget(settings[i])
            work.prune("layouts slower than the chosen ones and the best found", 1)
            continue
        out = work.judge.judge(settings[i])
        if isinstance(out, Candidate):
            fits.append(t)
        if isinstance(out, Candidate) or out.codes in MEMORY_VERDICTS:
            # A layout that does not fit at the anchor's settings may fit with more recompute.
            timed.append((isinstance(out, Rejected), t, i))
    for i, t in enumerate(times):
        if t is None:  # no estimate: the catalog says why
            work.judge.judge(settings[i])
    # The fastest fitting layouts, and the fastest of all when it is faster but does not fit at
    # the anchor's settings (other recompute settings may make it fit).
    # Ranked in floats: layouts as fast as the `layouts`-th up to rounding (exact ties) all go.
    ranked = sorted(timed)
    cut = ranked[min(layouts, len(ranked)) - 1] if ranked and layouts > 0 else None
    chosen = [i for bad, t, i in ranked
              if cut is not None and (bad, t) <= (cut[0], cut[1] * (1 + 4 * FLOAT_MARGIN))]
    fastest = min(timed, key=lambda item: item[1:], default=None)
    if fastest is not None and fastest[2] not in chosen:
        chosen.append(fastest[2])
    promise = {i: (bad, t) for bad, t, i in timed}
    for i in chosen:
        work.layouts.append((promise[i], settings[i], _floors(work, cfg, settings[i])))
    work.judge.forget_all()  # estimates are not sent back to the parent process
    return work


def grid_work(cfg: Config, headroom: float, unit: tuple[Knobs, Floors, float, int]) -> Work:
    """The knob grid of one layout (a unit small enough to share)."""
    layout, floors, bound, top = unit
    work = Work(Judge(cfg, headroom))
    _grid(work, cfg, layout, bound, top, floors=floors)
    work.judge.forget_all()  # estimates are not sent back to the parent process
    return work


def cell(layout: Knobs, dispatcher: Dispatcher, ep_overlap: bool, preset: Recompute,
         mbs: int) -> Knobs:
    """One cell of a layout's knob grid. Every cell fuses the permutations (Transformer Engine's
    fused permute kernels): in the model that is never slower and changes no memory, so trying
    it off could only add slower rows."""
    return replace(layout, micro_batch_size=mbs, recompute=preset, dispatcher=dispatcher,
                   permute_fusion=True, ep_overlap=ep_overlap)


def _floors(work: Work, cfg: Config, layout: Knobs) -> Floors:
    """Per micro-batch size, the layout's time at the floor dispatcher with EP overlap on and no
    recompute (`floor_dispatcher`): a lower bound of every grid cell it bounds."""
    lower, _ = floor_dispatcher(cfg, dispatchers(cfg))
    if lower is None:
        return {}
    return {mbs: work.judge.step_time(cell(layout, lower, True, NO_RECOMPUTE, mbs))
            for mbs in MBS_CHOICES}


NO_EP_OVERLAP = "settings with EP overlap on a pipeline without virtual stages (OVL003)"
SAME_MEMORY = ("settings recomputing modules that hold no memory here beside a setting that does "
               "not fit")


def ep_overlap_runs(cfg: Config) -> bool:
    """Whether the layout can run batch-level EP overlap: not with PP > 1 and no virtual stages
    (rule OVL003, planner/rules/overlap.py ep_overlap_needs_vpp)."""
    return cfg.parallel.pp == 1 or vpp_of(cfg) > 1


def floor_dispatcher(cfg: Config, choices: tuple[Dispatcher, ...]
                     ) -> tuple[Dispatcher | None, set[Dispatcher]]:
    """The dispatcher whose time bounds the others' from below on any layout, knobs alike, and
    the dispatchers it bounds: HybridEP (flex), whose node-deduplicated rows are the fewest any
    dispatcher moves and which permutes nothing (its kernel writes expert order), over every
    dispatcher whose efficiency factor is no higher than its own (step time only grows with
    exchanged bytes and permuted elements; tests/unit/search/test_search.py checks it on the examples).

    Kept with the user's config (`_FLOOR_DISPATCHERS`): every family floor, layout and grid of a
    search asks again, and each asking built a config per dispatcher."""
    known = _FLOOR_DISPATCHERS.get(cfg, lambda _: {})
    if choices not in known:
        known[choices] = _floor_dispatcher(cfg, choices)
    lower, bounded = known[choices]
    return lower, set(bounded)


# `floor_dispatcher` of the last few configs (the user's: configs are frozen), per choice of
# dispatchers.
_FLOOR_DISPATCHERS: HeldByIdentity[dict[tuple[Dispatcher, ...],
                                        tuple[Dispatcher | None, frozenset[Dispatcher]]]] = \
    HeldByIdentity(4)


def _floor_dispatcher(cfg: Config, choices: tuple[Dispatcher, ...]
                      ) -> tuple[Dispatcher | None, frozenset[Dispatcher]]:
    lower: Dispatcher = ("flex", "hybridep")
    if len(choices) == 1:  # one dispatcher (a dense model): EP overlap on bounds it alone
        return choices[0], frozenset(choices)
    if lower not in choices:
        return None, frozenset()
    knobs = Knobs.of(cfg)

    def efficiency(d: Dispatcher) -> float:
        return dispatch_efficiency(replace(knobs, dispatcher=d).apply(cfg))

    ceiling = efficiency(lower)
    return lower, frozenset(d for d in choices if efficiency(d) <= ceiling)


def _grid(work: Work, cfg: Config, layout: Knobs, bound: float = float("inf"),
          top: int = 1, found: list[float] | None = None, floors: Floors | None = None) -> None:
    """Every micro-batch × dispatcher × EP overlap × recompute preset of one layout, but the
    exact prunings (see the module doc). `bound`: a step time `top` fitting candidates already
    beat (or the `top`-th best of `found`, the fitting step times known to the caller, which
    the grid extends); a setting whose time without recompute exceeds it is skipped with all
    its presets, recomputing more never being faster. Lower bounds make one time stand for
    several settings: with EP overlap on a setting is never slower than with it off (the flag
    only hides exchange time), and HybridEP bounds the dispatchers `floor_dispatcher` names.
    The settings left are judged fastest first (by their time without recompute), so the
    bound tightens early. `floors`: `_floors` of the layout, when known."""
    presets = recompute_presets(cfg)
    by_modules = {recomputed(p): p for p in presets}
    choices = dispatchers(cfg)
    lower, bounded = floor_dispatcher(cfg, choices)
    found = [] if found is None else found
    floors = floors or {}

    def setting(dispatcher: Dispatcher, flag: bool, preset: Recompute, mbs: int) -> Knobs:
        return cell(layout, dispatcher, flag, preset, mbs)

    def best() -> float:
        return min(bound, sorted(found)[top - 1] if len(found) >= top else float("inf"))

    def slower(dispatcher: Dispatcher, flag: bool, mbs: int, settings: int,
               floor: float | None) -> bool:
        """Whether the setting's time without recompute (`floor`) beats no `top` fitting ones
        (then the `settings` it bounds are pruned)."""
        if floor is None or floor <= best() * (1 + FLOAT_MARGIN):
            return False
        work.judge.forget(setting(dispatcher, flag, presets[0], mbs))
        work.prune("settings slower without recompute than the best found",
                   settings * len(presets))
        return True

    def floor_of(dispatcher: Dispatcher, flag: bool, mbs: int) -> float | None:
        if (dispatcher, flag) == (lower, True) and mbs in floors:
            return floors[mbs]  # timed already (`_floors`)
        if best() == float("inf"):
            return None  # nothing to prune against: no need to time before judging
        return work.judge.step_time(setting(dispatcher, flag, presets[0], mbs))

    # (dispatcher, EP overlap, smaller modules, modules) -> `memory_alike` of the two presets: the
    # variant that decides it reads no micro-batch size, so one answer serves the whole column.
    alike: dict[tuple[Dispatcher, bool, frozenset[str], frozenset[str]], bool] = {}

    def alike_to_a_refused(dispatcher: Dispatcher, flag: bool, mbs: int, preset: Recompute,
                           failed: dict[frozenset[str], int]) -> bool:
        """Whether `preset` holds the same memory as a preset recomputing a subset of its modules
        that did not fit at this micro-batch size or a smaller one (where activations are
        smaller): then it does not fit either, and recomputing more it is never faster, so
        judging it could add nothing but another refusal (planner/accounting.py
        `memory_alike`: selective `core_attn` under fused attention keeps the same tensors)."""
        if preset.granularity == "full":
            return False
        mine = recomputed(preset)
        for smaller, at in failed.items():
            if at > mbs or not smaller < mine:
                continue
            key = (dispatcher, flag, smaller, mine)
            if key not in alike:
                alike[key] = memory_alike(
                    work.judge.build(setting(dispatcher, flag, by_modules[smaller], mbs)),
                    work.judge.build(setting(dispatcher, flag, preset, mbs)))
            if alike[key]:
                return True
        return False

    settings: list[tuple[float, int, Dispatcher, bool, int]] = []
    overlap_runs = ep_overlap_runs(layout.apply(cfg))
    for mbs in MBS_CHOICES:
        remaining = sorted(choices, key=lambda d: d != lower)  # the likely fastest first
        if lower is not None and slower(lower, True, mbs, 2 * len(bounded),
                                        floor_of(lower, True, mbs)):
            remaining = [d for d in remaining if d not in bounded]
        for dispatcher in remaining:
            floor = floor_of(dispatcher, True, mbs)
            if slower(dispatcher, True, mbs, 2, floor):
                continue
            for flag in (True, False):
                if flag and not overlap_runs:
                    # Its time still bounds the flag off (above); judging it only meets OVL003.
                    work.prune(NO_EP_OVERLAP, len(presets))
                    continue
                if not flag:
                    floor = floor_of(dispatcher, flag, mbs)
                    if slower(dispatcher, flag, mbs, 1, floor):
                        continue
                rank = float("inf") if floor is None else floor
                settings.append((rank, len(settings), dispatcher, flag, mbs))
    # Presets that did not fit, per dispatcher and EP overlap: the smallest micro-batch each
    # failed at (activations grow with the micro-batch, so larger ones fail too).
    too_big: dict[tuple[Dispatcher, bool], dict[frozenset[str], int]] = {}
    for floor, _, dispatcher, flag, mbs in sorted(settings):
        if slower(dispatcher, flag, mbs, 1, None if floor == float("inf") else floor):
            continue
        fitting: list[frozenset[str]] = []
        failed = too_big.setdefault((dispatcher, flag), {})
        for preset in presets:
            mine = recomputed(preset)
            if failed.get(mine, mbs) < mbs:
                work.prune("settings at a larger micro-batch than one that does not fit")
                continue
            if any(dominates(f, mine) for f in fitting):
                work.prune("settings recomputing more than a fitting one")
                continue
            if alike_to_a_refused(dispatcher, flag, mbs, preset, failed):
                work.prune(SAME_MEMORY)
                continue
            out = work.judge.judge(setting(dispatcher, flag, preset, mbs))
            if isinstance(out, Candidate):
                fitting.append(mine)
                found.append(out.step_time_s)
            elif out.codes in MEMORY_VERDICTS:
                failed[mine] = min(failed.get(mine, mbs), mbs)


def run_units(work: Callable[..., Work], cfg: Config, headroom: float, units: list[Any],
              sizes: list[int], pool: Executor | None, tick: Callable[[int], None]) -> list[Work]:
    """Run `work(cfg, headroom, unit)` for every unit, in the pool's processes when there is one;
    the results come back in the units' order (so the outcome never depends on the workers)."""
    if pool is None or len(units) <= 1:
        out = []
        for unit, size in zip(units, sizes, strict=True):
            out.append(work(cfg, headroom, unit))
            tick(size)
        return out
    results: list[Work | None] = [None] * len(units)
    futures = {pool.submit(work, cfg, headroom, unit): i for i, unit in enumerate(units)}
    for future in as_completed(futures):
        i = futures[future]
        results[i] = future.result()
        tick(sizes[i])
    return [r for r in results if r is not None]


@contextmanager
def worker_pool(workers: int) -> Iterator[Executor | None]:
    """`workers` processes for the whole search, or None to judge in-process. They are forked
    once, so each keeps what it computed (compiled formula books, grids, placements) for its
    later units; where fork is missing the search judges in-process."""
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield None
        return
    with ProcessPoolExecutor(max_workers=workers,
                             mp_context=multiprocessing.get_context("fork")) as pool:
        yield pool


# The share of phase 1's units the floors' process anchors itself (`phase1_floors_work`), the
# last ones: timing the floors of every anchored family is about half as much work as anchoring
# them, so with a quarter of the anchoring too both processes finish phase 1 near together.
SIDE_SHARE = 4


@contextmanager
def floors_pool(pool: Executor | None) -> Iterator[Executor | None]:
    """One process beside phase 1, when the search has a pool: most of phase 1 runs in the parent
    (so the pool's workers, forked after it, inherit what it built); the second core anchors the
    last units itself (`SIDE_SHARE`) and times every anchored family's floors (`floors_work`) as
    phase 1 finds them."""
    if pool is None:
        yield None
        return
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork")) as side:
        yield side


def default_workers() -> int:
    """Up to two of the cores this process may run on."""
    return max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


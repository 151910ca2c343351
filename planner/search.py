"""`moeplan search`: which layout of the same model, cluster and batch runs fastest.

Search is a loop around the one pipeline `check` and `estimate` use: every candidate is a real
Config (the user's with the layout knobs changed), rejected by the rule catalog (errors; MEM001 is
the memory budget's verdict) and timed by the step-time estimate. Nothing here re-states a rule or
a formula: the cheap pruning before the catalog is only the degrees' own divisibility
(planner/degrees.py), and pipeline layouts are generated as Megatron layout strings that
planner/pipeline.py then splits (or refuses) as for any config.

The space is searched in two phases so that it stays fast:

1. every (TP, CP, PP, EP, ETP) family that divides the world, times every pipeline layout of its
   PP (the even split, the embedding/loss-aware split, balanced layout strings for VPP 1, 2, 4
   and the user's own layout), with the user's other knobs (micro-batch size, recompute,
   dispatcher, EP overlap) — full recompute tried when those do not fit;
2. the fastest `refine` layouts of phase 1 with every micro-batch size, recompute preset,
   dispatcher/backend and EP-overlap setting.

The user's own config is always a candidate, so the winner is never slower than it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.degrees import Degrees
from planner.findings import Finding
from planner.rules.hints import divisors
from planner.schema import Config

Changes = dict[str, dict[str, Any]]  # section -> field -> value, over the user's config

# The layout fields a candidate sets (the rest of the user's config is kept).
PIPELINE_FIELDS = ("vpp", "pipeline_model_parallel_layout", "decoder_first_pipeline_num_layers",
                   "decoder_last_pipeline_num_layers", "num_layers_per_virtual_pipeline_stage",
                   "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                   "microbatch_group_size_per_vp_stage")
VPP_CHOICES = (1, 2, 4)
MBS_CHOICES = (1, 2, 4)
# (dispatcher, flex backend) pairs; the catalog refuses those a layout cannot use (e.g. MOE008).
DISPATCHERS = (("alltoall", None), ("allgather", None), ("flex", "deepep"), ("flex", "hybridep"))


@dataclass
class Candidate:
    """One timed, fitting layout: the config, what changed from the user's, and its figures."""

    cfg: Config
    changes: Changes
    step_time_s: float
    tflops_per_gpu: float
    tokens_per_s_per_gpu: float
    peak_memory_bytes: int  # the largest per-rank peak over the stages
    peak_stage: int
    stage_peak_bytes: list[int]
    is_user: bool = False

    def as_json(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "parallel": {"tp": c.parallel.tp, "cp": c.parallel.cp, "pp": c.parallel.pp,
                         "vpp": _vpp(c), "ep": c.parallel.ep, "etp": c.parallel.etp,
                         "dp": c.dp, "edp": c.edp,
                         "pipeline_model_parallel_layout": c.parallel.pipeline_model_parallel_layout,
                         "account_for_embedding_in_pipeline_split":
                             c.parallel.account_for_embedding_in_pipeline_split,
                         "account_for_loss_in_pipeline_split":
                             c.parallel.account_for_loss_in_pipeline_split},
            "training": {"micro_batch_size": c.training.micro_batch_size},
            "recompute": recompute_label(c),
            "moe": {"moe_token_dispatcher_type": c.moe.moe_token_dispatcher_type,
                    "moe_flex_dispatcher_backend": c.moe.moe_flex_dispatcher_backend},
            "overlap_moe_expert_parallel_comm": c.overlap.overlap_moe_expert_parallel_comm,
            "is_user_layout": self.is_user,
            "step_time_s": self.step_time_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_stage": self.peak_stage,
            "stage_peak_memory_bytes": self.stage_peak_bytes,
        }


@dataclass
class Rejected:
    """A candidate the catalog or the memory budget refused, with why (and its time if known)."""

    cfg: Config
    changes: Changes
    reason: str
    codes: tuple[str, ...]
    step_time_s: float | None = None
    difference: dict[str, Any] | None = None  # from the winner, when listed as ruled out


@dataclass
class SearchResult:
    candidates: list[Candidate]  # fitting, fastest first, at most `top`
    user: Candidate | None  # the user's own layout (None when it does not fit)
    ruled_out: list[Rejected]  # faster than the winner but refused, nearest first
    explored: int  # configs built and judged by the catalog
    legal: int  # no rule error other than MEM001
    fitting: int  # no rule error at all (timed)
    wall_s: float = 0.0
    pruned: int = 0  # layouts the degrees rejected before any config was built

    @property
    def winner(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def as_json(self) -> dict[str, Any]:
        return {"candidates": [c.as_json() for c in self.candidates],
                "user": self.user.as_json() if self.user else None,
                "ruled_out": [{"difference": r.difference, "reason": r.reason, "codes": list(r.codes),
                               "step_time_s": r.step_time_s} for r in self.ruled_out],
                "explored": self.explored, "legal": self.legal, "fitting": self.fitting,
                "pruned": self.pruned, "wall_s": self.wall_s}


Progress = Callable[[int, int], None]


# ----------------------------------------------------------------------------- the space
def _vpp(cfg: Config) -> int:
    from planner.pipeline import SplitError, stage_split

    try:
        return stage_split(cfg).vpp
    except SplitError:
        return cfg.parallel.vpp or 1


def recompute_label(cfg: Config) -> str:
    ov = cfg.overlap
    if ov.recompute_granularity == "full":
        return f"full {ov.recompute_method} {ov.recompute_num_layers}"
    if ov.recompute_granularity == "selective":
        return "selective " + ",".join(ov.recompute_modules or ["core_attn"])
    return "none"


def _powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in divisors(n) if d <= limit]


def families(cfg: Config) -> tuple[list[tuple[int, int, int, int, int]], int]:
    """(TP, CP, PP, EP, ETP) that tile the world, split the experts and the global batch; and how
    many were pruned on the way. TP·CP stays inside one NVLink domain (tensor and context
    parallelism across the scale-out network is never the fast choice) and ETP is 1 or TP."""
    par, model = cfg.parallel, cfg.model
    world = int(par.world_size or 1)
    domain = cfg.cluster.nvlink_domain or cfg.cluster.gpus_per_node or 8
    gbs = cfg.global_batch_size
    experts = model.num_experts or 0
    out, pruned = [], 0
    tps = _powers_of_two(min(domain, 8))
    pps = _divisors(world, model.num_layers + model.mtp_num_layers)
    eps = _divisors(experts, world) if experts else [1]
    user = (par.tp, par.cp, par.pp, par.ep, par.etp or par.tp)
    for tp in tps:
        for cp in _powers_of_two(domain // tp):
            for pp in pps:
                for ep in eps:
                    for etp in sorted({1, tp}):
                        key = (tp, cp, pp, ep, etp)
                        deg = Degrees(world, tp, cp, pp, ep, etp, par.gtp, par.egtp, experts)
                        if key != user and (deg.problems() or (experts and deg.experts_per_rank is None)
                                            or gbs % deg.dp):
                            pruned += 1
                            continue
                        out.append(key)
    if user not in out:
        out.insert(0, user)
    return out, pruned


def balanced_layout(layers: int, mtp: int, pp: int, vpp: int) -> str | None:
    """A Megatron layout string over PP·VPP chunks in which the embedding, the loss and each MTP
    layer count as one decoder layer (as the account-for-embedding/loss flags count them): the
    earlier chunks take the extra layer when the slots do not divide. None when a chunk would hold
    no decoder layer besides the first and last."""
    chunks = pp * vpp
    if chunks < 2:
        return None
    slots = layers + 2 + mtp
    base, extra = divmod(slots, chunks)
    sizes = [base + (1 if i < extra else 0) for i in range(chunks)]
    counts = list(sizes)
    counts[0] -= 1  # E
    counts[-1] -= 1 + mtp  # m... L
    if min(counts[1:-1] or [1]) < 1 or counts[0] < 0 or counts[-1] < 0 or sum(counts) != layers:
        return None
    parts = [f"E{_layers(counts[0])}"] + [_layers(c) for c in counts[1:-1]] + \
        [f"{_layers(counts[-1])}{'m' * mtp}L"]
    return _compress(parts)


def _layers(count: int) -> str:
    return f"t*{count}" if count > 2 else "t" * count


def _compress(parts: list[str]) -> str:
    """Join chunk strings with '|', writing runs of equal middle chunks as (..|)*n."""
    out, i = [parts[0]], 1
    while i < len(parts) - 1:
        j = i
        while j < len(parts) - 1 and parts[j] == parts[i]:
            j += 1
        run = j - i
        out.append(f"({parts[i]}|)*{run}" if run > 1 else f"{parts[i]}|")
        i = j
    return out[0] + "|" + "".join(out[1:]) + parts[-1]


def pipeline_choices(cfg: Config, pp: int,
                     vpps: tuple[int, ...] = VPP_CHOICES) -> list[dict[str, Any]]:
    """The pipeline layouts tried for a PP and VPPs: each a full set of PIPELINE_FIELDS values."""
    model = cfg.model
    blank: dict[str, Any] = {name: None for name in PIPELINE_FIELDS}
    blank.update(account_for_embedding_in_pipeline_split=False,
                 account_for_loss_in_pipeline_split=False)
    out: list[dict[str, Any]] = []
    if pp == 1:
        return [blank]
    if model.num_layers % pp == 0 and 1 in vpps:
        out.append(dict(blank))
    if (model.num_layers + 2) % pp == 0 and 1 in vpps:
        out.append(blank | {"account_for_embedding_in_pipeline_split": True,
                            "account_for_loss_in_pipeline_split": True})
    seen = set()
    for vpp in vpps:
        layout = balanced_layout(model.num_layers, model.mtp_num_layers, pp, vpp)
        if layout and layout not in seen:
            seen.add(layout)
            out.append(blank | {"pipeline_model_parallel_layout": layout})
    for vpp in [v for v in vpps if v > 1]:  # even split with VPP (MTP rides on the last chunk)
        if model.num_layers % (pp * vpp) == 0:
            out.append(blank | {"vpp": vpp})
    return out


def recompute_presets(cfg: Config) -> list[dict[str, Any]]:
    """none; selective presets (core attention; the MoE activation and norms, plus the MLA up
    projections on MLA models; all of them); full uniform 1; and the user's own setting."""
    mla = cfg.model.attention_variant in ("mla", "dsv4_hybrid")
    light = (["mla_up_proj"] if mla else []) + ["moe_act", "layernorm"]
    off = {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None,
           "recompute_modules": None}
    presets = [off,
               off | {"recompute_granularity": "selective", "recompute_modules": ["core_attn"]},
               off | {"recompute_granularity": "selective", "recompute_modules": light},
               off | {"recompute_granularity": "selective",
                      "recompute_modules": ["core_attn", *light]},
               off | {"recompute_granularity": "full", "recompute_method": "uniform",
                      "recompute_num_layers": 1}]
    ov = cfg.overlap
    user = {k: getattr(ov, k) for k in off}
    if user not in presets:
        presets.insert(0, user)
    return presets


FULL_RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform",
                  "recompute_num_layers": 1, "recompute_modules": None}


# ----------------------------------------------------------------------------- judging
def build(cfg: Config, changes: Changes) -> Config:
    """The user's config with `changes` applied, section by section (no re-validation needed:
    every value set is one the schema accepts, and the catalog judges the combination)."""
    update = {}
    for section, values in changes.items():
        update[section] = getattr(cfg, section).model_copy(update=values)
    return cfg.model_copy(update=update)


def _identity(cfg: Config) -> str:
    """What makes two candidates the same layout (the sections a candidate changes)."""
    return repr((cfg.parallel.model_dump(), cfg.training.micro_batch_size,
                 cfg.overlap.model_dump(), cfg.moe.model_dump()))


def _errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


def _memory_reason(findings: list[Finding]) -> str:
    """MEM001's own verdict, shortened: "does not fit: stage s needs an estimated X per rank, …"."""
    message = next(f.message for f in findings if f.code == "MEM001")
    return "does not fit: " + message.split(" (", 1)[0] + " (MEM001)"


class _Judge:
    """Builds, judges and times candidates, counting and remembering what it refused."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.seen: dict[str, Candidate | Rejected] = {}  # by the candidate's identity

    @property
    def explored(self) -> int:
        return len(self.seen)

    @property
    def legal(self) -> int:
        """No rule error besides MEM001 (the memory budget's verdict)."""
        return sum(1 for out in self.seen.values()
                   if isinstance(out, Candidate) or out.codes in (("MEM001",), ("EST",)))

    @property
    def fitting(self) -> int:
        return sum(1 for out in self.seen.values() if isinstance(out, Candidate))

    def timed(self) -> list[Candidate]:
        return [out for out in self.seen.values() if isinstance(out, Candidate)]

    def absorb(self, other: _Judge) -> None:
        """Take another judge's verdicts (a worker's), keeping the first of equal candidates."""
        for key, out in other.seen.items():
            self.seen.setdefault(key, out)

    def judge(self, changes: Changes, *, is_user: bool = False) -> Candidate | Rejected:
        from planner.accounting import BudgetError
        from planner.estimate import estimate
        from planner.rules import run_rules

        cand = build(self.cfg, changes)
        key = _identity(cand)
        if key in self.seen:
            return self.seen[key]
        errors = _errors(run_rules(cand))
        codes = tuple(sorted({f.code for f in errors}))
        if codes and codes != ("MEM001",):
            out: Candidate | Rejected = Rejected(cand, changes, "rule " + ", ".join(codes), codes)
        else:
            if codes:
                out = Rejected(cand, changes, _memory_reason(errors), codes)
            else:
                try:
                    est = estimate(cand)
                except BudgetError as exc:  # the catalog passed it: report, do not crash
                    out = Rejected(cand, changes, f"no estimate: {exc}", ("EST",))
                else:
                    out = _candidate(cand, changes, est, is_user)
        self.seen[key] = out
        return out

    def time_rejected(self, r: Rejected) -> None:
        """The step time a refused candidate would have (when its grids build)."""
        from planner.accounting import BudgetError
        from planner.estimate import estimate

        if r.step_time_s is None and "EST" not in r.codes:
            try:
                r.step_time_s = estimate(r.cfg).step_time_s
            except (BudgetError, ValueError, ZeroDivisionError, KeyError):
                pass


def _candidate(cfg: Config, changes: Changes, est: Any, is_user: bool) -> Candidate:
    figures = est.as_json()
    peaks = [int(env["peak_memory_bytes"]) for env in est.envs]
    stage = max(range(len(peaks)), key=peaks.__getitem__)
    return Candidate(cfg, changes, est.step_time_s, figures["tflops_per_gpu"],
                     figures["tokens_per_s_per_gpu"], peaks[stage], stage, peaks, is_user)


# ----------------------------------------------------------------------------- the loop
def _family_changes(cfg: Config, fam: tuple[int, int, int, int, int],
                    pipe: dict[str, Any]) -> Changes:
    tp, cp, pp, ep, etp = fam
    return {"parallel": {"tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp,
                         "sequence_parallel": tp > 1, **pipe}}


def _user_pipe(cfg: Config) -> dict[str, Any]:
    return {name: getattr(cfg.parallel, name) for name in PIPELINE_FIELDS}


def _knobs_of(cfg: Config) -> Changes:
    """The knobs phase 2 varies, as a config sets them."""
    ov, moe = cfg.overlap, cfg.moe
    return {"training": {"micro_batch_size": cfg.training.micro_batch_size},
            "overlap": {"recompute_granularity": ov.recompute_granularity,
                        "recompute_method": ov.recompute_method,
                        "recompute_num_layers": ov.recompute_num_layers,
                        "recompute_modules": ov.recompute_modules,
                        "overlap_moe_expert_parallel_comm": ov.overlap_moe_expert_parallel_comm},
            "moe": {"moe_token_dispatcher_type": moe.moe_token_dispatcher_type,
                    "moe_flex_dispatcher_backend": moe.moe_flex_dispatcher_backend}}


def _groups(cfg: Config) -> tuple[dict[tuple[int, int, int, int], list[int]], int]:
    """Families grouped by (TP, CP, PP, ETP), their EPs largest first (fewest experts per rank)."""
    fams, pruned = families(cfg)
    groups: dict[tuple[int, int, int, int], list[int]] = {}
    for tp, cp, pp, ep, etp in fams:
        groups.setdefault((tp, cp, pp, etp), []).append(ep)
    return {k: sorted(v, reverse=True) for k, v in groups.items()}, pruned


def _merge(*parts: Changes) -> Changes:
    out: Changes = {}
    for part in parts:
        for section, values in part.items():
            out[section] = {**out.get(section, {}), **values}
    return out


Phase1Item = tuple[tuple[int, int, int, int], dict[str, Any], list[int]]


def _phase1_work(cfg: Config, items: list[Phase1Item]) -> tuple[_Judge, int]:
    """Judge a share of phase 1 (one process's work); returns the judge and the EPs skipped."""
    judge, knobs, skipped = _Judge(cfg), _knobs_of(cfg), 0
    for (tp, cp, pp, etp), pipe, eps in items:
        for i, ep in enumerate(eps):
            base = {"parallel": _family_changes(cfg, (tp, cp, pp, ep, etp), pipe)["parallel"]}
            out = judge.judge(_merge(base, knobs))
            if isinstance(out, Rejected) and out.codes == ("MEM001",):
                out = judge.judge(_merge(base, knobs, {"overlap": dict(FULL_RECOMPUTE)}))
            if isinstance(out, Rejected) and out.codes == ("MEM001",):
                skipped += len(eps) - i - 1
                break
    return judge, skipped


def _refine_work(cfg: Config, base: Candidate) -> tuple[_Judge, int]:
    judge = _Judge(cfg)
    _refine(judge, cfg, base)
    return judge, 0


def _run_units(work: Callable[..., tuple[_Judge, int]], cfg: Config, units: list[Any],
               sizes: list[int], workers: int, tick: Callable[[int], None]
               ) -> list[tuple[_Judge, int]]:
    """Run `work(cfg, unit)` for every unit, in `workers` processes when more than one; the
    results come back in the units' order (so the outcome never depends on the workers)."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        workers = 1  # the workers inherit the loaded code by forking; elsewhere judge in-process
    if workers <= 1 or len(units) <= 1:
        out = []
        for unit, size in zip(units, sizes, strict=True):
            out.append(work(cfg, unit))
            tick(size)
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: list[tuple[_Judge, int] | None] = [None] * len(units)
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(work, cfg, unit): i for i, unit in enumerate(units)}
        for future in as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            tick(sizes[i])
    return [r for r in results if r is not None]


def _default_workers() -> int:
    import os

    return max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def search(cfg: Config, *, top: int = 10, refine: int = 6, max_ruled_out: int = 3,
           progress: Progress | None = None, workers: int | None = None) -> SearchResult:
    """Rank the fitting layouts of `cfg`'s model, cluster and batch by predicted step time.

    Phase 1 judges every family with each VPP-1 pipeline layout and the user's other knobs,
    retrying full recompute when that does not fit; within a (TP, CP, PP, ETP) group EPs go
    largest first and stop at the first that does not fit even then (a smaller EP holds more
    experts per rank). Phase 2 refines the `refine` fastest layouts (and the user's): VPP layouts,
    then micro-batch size × recompute preset, then dispatcher/backend × EP overlap, each step
    keeping the fastest. `workers` processes share the judging (default: up to 2 cores).
    """
    start = time.perf_counter()
    workers = _default_workers() if workers is None else workers
    judge = _Judge(cfg)
    user = judge.judge({}, is_user=True)
    groups, pruned = _groups(cfg)
    user_pipe = _user_pipe(cfg)
    plan: list[Phase1Item] = []
    for (tp, cp, pp, etp), eps in groups.items():
        pipes = pipeline_choices(cfg, pp, (1,))
        if pp == cfg.parallel.pp and user_pipe not in pipes:
            pipes.insert(0, user_pipe)
        plan += [((tp, cp, pp, etp), pipe, eps) for pipe in pipes]
    shares = max(1, min(len(plan), 8 * workers))
    units = [plan[i::shares] for i in range(shares)]
    sizes = [sum(len(eps) for _, _, eps in unit) for unit in units]
    done, total = 0, sum(sizes) + refine * 40

    def tick(count: int) -> None:
        nonlocal done
        done += count
        if progress:
            progress(done, max(total, done))

    skipped = 0
    for part, skip in _run_units(_phase1_work, cfg, units, sizes, workers, tick):
        judge.absorb(part)
        skipped += skip
    bases: list[Candidate] = []
    for cand in sorted(judge.timed(), key=lambda c: c.step_time_s):
        if len(bases) >= refine:
            break
        if all(_family_key(cand.cfg) != _family_key(b.cfg) for b in bases):
            bases.append(cand)
    if isinstance(user, Candidate) and all(b is not user for b in bases):
        bases.append(user)
    sizes = [_phase2_size(cfg, b) for b in bases]
    total = done + sum(sizes)
    for part, _ in _run_units(_refine_work, cfg, bases, sizes, workers, tick):
        judge.absorb(part)
    if progress:
        progress(total, total)
    # Ties go to the user's layout, then to the candidate that changes fewest of its fields.
    ranked = sorted(judge.timed(), key=lambda c: (c.step_time_s, not c.is_user,
                                                  len(difference(cfg, c.cfg))))
    winner = ranked[0] if ranked else None
    ruled_out = _ruled_out(judge, winner, max_ruled_out) if winner else []
    return SearchResult(ranked[:top], user if isinstance(user, Candidate) else None, ruled_out,
                        judge.explored, judge.legal, judge.fitting,
                        time.perf_counter() - start, pruned + skipped)


def _family_key(cfg: Config) -> tuple[Any, ...]:
    p = cfg.parallel
    return (p.tp, p.cp, p.pp, p.ep, p.etp)


def _phase2_size(cfg: Config, base: Candidate) -> int:
    dispatchers = len(DISPATCHERS) * 2 if cfg.model.num_experts else 1
    return (len(pipeline_choices(cfg, base.cfg.parallel.pp)) + len(MBS_CHOICES)
            * len(recompute_presets(cfg)) + dispatchers)


def _best(judge: _Judge, options: list[Changes], current: Candidate) -> Candidate:
    for changes in options:
        out = judge.judge(changes)
        if isinstance(out, Candidate) and out.step_time_s < current.step_time_s:
            current = out
    return current


def _refine(judge: _Judge, cfg: Config, base: Candidate) -> None:
    """Coordinate steps from one fast layout: pipeline (VPP), MBS × recompute, dispatcher × overlap."""
    par = base.cfg.parallel
    fam = (par.tp, par.cp, par.pp, par.ep, par.etp or par.tp)
    knobs = _knobs_of(base.cfg)
    family = {"parallel": {k: v for k, v in _family_changes(cfg, fam, {})["parallel"].items()}
              | {"sequence_parallel": par.sequence_parallel}}
    pipes = [_merge(family, {"parallel": pipe}, knobs) for pipe in pipeline_choices(cfg, par.pp)]
    best = _best(judge, pipes, base)
    pipe = {"parallel": {k: getattr(best.cfg.parallel, k) for k in PIPELINE_FIELDS}}
    layout = _merge(family, pipe)
    overlap_flag = best.cfg.overlap.overlap_moe_expert_parallel_comm
    options = [_merge(layout, knobs, {"training": {"micro_batch_size": mbs},
                                      "overlap": rc | {"overlap_moe_expert_parallel_comm": overlap_flag}})
               for mbs in MBS_CHOICES for rc in recompute_presets(cfg)]
    best = _best(judge, options, best)
    knobs = _knobs_of(best.cfg)
    if cfg.model.num_experts:
        options = [_merge(layout, knobs, {"moe": {"moe_token_dispatcher_type": kind,
                                                  "moe_flex_dispatcher_backend": backend},
                                          "overlap": {"overlap_moe_expert_parallel_comm": flag}})
                   for kind, backend in DISPATCHERS for flag in (False, True)]
        _best(judge, options, best)


def _ruled_out(judge: _Judge, winner: Candidate, count: int) -> list[Rejected]:
    """Refused candidates of the winner's family that would have been faster, nearest first,
    one per distinct difference from the winner."""
    fam = _family_key(winner.cfg)
    near = [r for r in judge.seen.values() if isinstance(r, Rejected)
            and _family_key(r.cfg) == fam]
    for r in near:
        judge.time_rejected(r)
    faster = sorted((r for r in near if r.step_time_s is not None
                     and r.step_time_s < winner.step_time_s), key=lambda r: -(r.step_time_s or 0))
    out, seen = [], set()
    for r in faster:
        r.difference = difference(winner.cfg, r.cfg)
        key = (r.reason, tuple(sorted(r.difference.items())))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out[:count]


def knob_view(cfg: Config) -> dict[str, Any]:
    """The fields search varies, flat, for saying how two candidates differ."""
    p, ov, moe = cfg.parallel, cfg.overlap, cfg.moe
    view = {k: getattr(p, k) for k in ("tp", "cp", "pp", "ep", "etp", *PIPELINE_FIELDS)}
    view.update(micro_batch_size=cfg.training.micro_batch_size, recompute=recompute_label(cfg),
                moe_token_dispatcher_type=moe.moe_token_dispatcher_type,
                moe_flex_dispatcher_backend=moe.moe_flex_dispatcher_backend,
                overlap_moe_expert_parallel_comm=ov.overlap_moe_expert_parallel_comm)
    return view


def difference(base: Config, other: Config) -> dict[str, Any]:
    """The varied fields whose value in `other` differs from `base`."""
    a, b = knob_view(base), knob_view(other)
    return {k: b[k] for k in b if b[k] != a[k]}


# ----------------------------------------------------------------------------- emitting
def emitted_data(raw: dict[str, Any], cand: Candidate) -> dict[str, Any]:
    """The user's YAML data with the winner's layout fields written over it (None drops a key)."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for section, values in cand.changes.items():
        target = data.setdefault(section, {})
        for key, value in values.items():
            for alias in _aliases(section, key):
                target.pop(alias, None)
            if value is not None and value is not False or key in target:
                target[key] = value
            if value is None:
                target.pop(key, None)
    return data


def _aliases(section: str, key: str) -> list[str]:
    """The other spellings the schema accepts for a field (e.g. tensor_model_parallel_size)."""
    from planner.schema import Config as Schema

    model = Schema.model_fields[section].annotation
    info = getattr(model, "model_fields", {}).get(key)
    choices = getattr(getattr(info, "validation_alias", None), "choices", None) or []
    return [c for c in choices if isinstance(c, str) and c != key]


__all__ = ["Candidate", "Rejected", "SearchResult", "balanced_layout", "build", "emitted_data",
           "difference", "families", "knob_view", "pipeline_choices", "recompute_presets", "search"]

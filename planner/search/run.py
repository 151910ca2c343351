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
   recompute preset × dispatcher/backend × EP overlap — with two exact prunings: a recompute
   preset is skipped when a preset recomputing a subset of its modules already fits (recomputing
   more never makes a step faster nor is ever needed for memory then), and a preset is skipped
   at a micro-batch size when it did not fit at a smaller one (activations grow with the
   micro-batch).

`refine=0` (the default) refines every family that fits: the whole space. Ranking uses the
float estimate (planner/budget/expr.py); the printed candidates are re-evaluated exactly.

Branch and bound keeps the whole space fast and the result exact: the bound is the `top`-th
fitting step time known, and a setting whose time without recompute exceeds it is skipped with
all its presets (recomputing more is never faster), so the top K and the ruled-out list are those
of the unpruned grid. One such time stands for several settings: with EP overlap on a setting is
never slower than with it off, and HybridEP's time bounds every dispatcher no more efficient than
it (`_floor_dispatcher`); the least of a layout's floors over the micro-batch sizes bounds its
whole grid. So the layouts are taken lowest floor first, in rounds of fixed, growing sizes whose
bound the earlier rounds set, and inside a grid the settings are judged fastest first; a family's
slower layouts are timed but judged only when they could still be chosen or be a candidate. The
user's config is always a candidate, so the winner is never slower than it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Any

from planner.config.schema import Config
from planner.degrees import Degrees
from planner.findings import Finding
from planner.rules.hints import divisors

if TYPE_CHECKING:
    from concurrent.futures import Executor

Changes = dict[str, dict[str, Any]]  # section -> field -> value, over the user's config

# The layout fields a candidate sets (the rest of the user's config is kept).
PIPELINE_FIELDS = ("vpp", "pipeline_model_parallel_layout", "decoder_first_pipeline_num_layers",
                   "decoder_last_pipeline_num_layers", "num_layers_per_virtual_pipeline_stage",
                   "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                   "microbatch_group_size_per_vp_stage")
VPP_CHOICES = (1, 2, 4)
MBS_CHOICES = (1, 2, 4)
# How many layouts the knob grid's first round takes, lowest floor first (each later round four
# times as many): the most promising few set a tight bound for all the others.
GRID_FIRST_ROUND = 1
# (dispatcher, flex backend) pairs; the catalog refuses those a layout cannot use (e.g. MOE008).
DISPATCHERS = (("alltoall", None), ("allgather", None), ("flex", "deepep"), ("flex", "hybridep"))
# Every grid setting fuses the permutations (Transformer Engine's fused permute kernels): in the
# model that is never slower and changes no memory, so trying it off could only add slower rows.
FUSED_PERMUTE = {"moe_permute_fusion": True}
# Verdicts that leave a candidate legal (every other rule passes) but not fitting: the memory
# verdicts (MEM001, the stricter headroom), and no estimate.
MEMORY_VERDICTS = (("MEM001",), ("HEADROOM",))
NOT_FITTING = (*MEMORY_VERDICTS, ("EST",))


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
    stage_step_s: list[float] = field(default_factory=list)  # each stage's step time
    stage_bubble_s: list[float] = field(default_factory=list)  # and its pipeline bubble

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
            "stage_step_time_s": self.stage_step_s,
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
    legal: int  # no rule error (MEM001 and the headroom aside)
    fitting: int  # no rule error at all, inside the headroom (timed)
    wall_s: float = 0.0
    pruned: int = 0  # families and knob settings never judged, for the reasons in `pruned_by`
    pruned_by: dict[str, int] = field(default_factory=dict)
    memory_headroom: float = 1.0

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


# ----------------------------------------------------------------------------- the space
def _vpp(cfg: Config) -> int:
    from planner.layout.pipeline import SplitError, stage_split

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
    return layout_string(counts, mtp)


def layout_string(counts: list[int], mtp: int) -> str:
    """The Megatron layout string of decoder-layer counts per chunk (pipeline order): the
    embedding opens the first chunk, the MTP layers and the loss close the last."""
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


@dataclass(frozen=True)
class LayerCosts:
    """Seconds of a stage's step that each piece of the model brings, read off one estimate."""

    embedding: float
    layers: tuple[float, ...]  # per decoder layer
    tail: float  # the MTP layers and the loss (with its output layer), which close the last chunk


def _layer_kind(cfg: Config, layer: int) -> tuple[bool, bool]:
    model = cfg.model
    moe = model.is_moe_layer(layer)
    return moe, moe and layer < model.moe_n_hash_layers


def layer_costs(cfg: Config, stages: list[dict[str, Any]]) -> LayerCosts:
    """Per-piece costs from the estimate's stage rows of a VPP-1 config (`Estimate.stages`).

    A stage's work is its step time less its bubble (compute, exposed communication and optimizer
    step scale with what the stage holds; the bubble is set by the slowest stage). A decoder
    layer costs its kind's (dense, MoE, hash-routed MoE) work per layer on the stages holding only
    that kind; a kind seen nowhere alone shares what is left of the first stage holding it. The
    embedding and the tail (MTP + loss) cost what is left of the first and last stage."""
    from planner.layout.pipeline import stage_split

    split = stage_split(cfg)
    work = [float(row["step_s"]) - float(row["bubble_s"]) for row in stages]
    kinds = [_layer_kind(cfg, i) for i in range(cfg.model.num_layers)]
    samples: dict[tuple[bool, bool], list[float]] = {}
    for st, w in zip(split.stages, work, strict=True):
        seen = {kinds[i] for i in st.layers}
        if len(seen) == 1 and not (st.embedding or st.output_head or st.mtp_layers):
            samples.setdefault(seen.pop(), []).append(w / len(st.layers))
    per_kind = {k: median(v) for k, v in samples.items()}
    for st, w in zip(split.stages, work, strict=True):
        unknown = [i for i in st.layers if kinds[i] not in per_kind]
        if unknown:
            known = sum(per_kind[kinds[i]] for i in st.layers if kinds[i] in per_kind)
            share = max(0.0, w - known) / len(unknown)
            for kind in {kinds[i] for i in unknown}:
                per_kind[kind] = share
    layers = tuple(per_kind.get(k, 0.0) for k in kinds)

    def rest(s: int) -> float:
        return max(0.0, work[s] - sum(layers[i] for i in split.stages[s].layers))

    return LayerCosts(rest(0), layers, rest(len(work) - 1) if len(work) > 1 else 0.0)


def cost_balanced_layout(costs: LayerCosts, mtp: int, pp: int, vpp: int) -> str | None:
    """The layout over PP·VPP chunks that evens the stages' costs: the embedding in the first
    chunk, the MTP layers and the loss in the last, at least one decoder layer in every other
    chunk; None when there are too few layers.

    A stage's fair share is the total cost over PP; what its embedding or tail leaves of that is
    split evenly over its VPP chunks (chunk j belongs to stage j mod PP), and the layers are
    placed so that the largest excess of a chunk over its share is smallest (ties: the smallest
    sum of squared excesses, then lighter early chunks, as the first stages hold the most
    microbatches). With VPP 1 a chunk is a stage, so this minimises the busiest stage's time; with
    VPP > 1 a stage's excess is at most VPP times the largest chunk excess.

    Dynamic programme over (chunk, layers placed): best[j][b] is the (max, sum of squares) of the
    excesses of chunks 0..j holding layers 0..b-1."""
    n, chunks = len(costs.layers), pp * vpp
    if chunks < 2 or n < chunks - 2:
        return None
    prefix = [0.0]
    for c in costs.layers:
        prefix.append(prefix[-1] + c)
    fair = (prefix[-1] + costs.embedding + costs.tail) / pp
    extra = [0.0] * pp
    extra[0] += costs.embedding
    extra[-1] += costs.tail
    share = [(fair - extra[j % pp]) / vpp for j in range(chunks)]

    inf = float("inf")
    # worst[j][b], squares[j][b]: the (max, sum of squares) of the excesses of chunks 0..j
    # holding layers 0..b-1; start[j][b]: where chunk j starts then.
    worst = [[inf] * (n + 1) for _ in range(chunks)]
    squares = [[inf] * (n + 1) for _ in range(chunks)]
    start = [[0] * (n + 1) for _ in range(chunks)]
    for b in range(n + 1):
        c = prefix[b] - prefix[0] - share[0]  # the chunk's excess over its share
        worst[0][b], squares[0][b] = c, c * c
    for j in range(1, chunks):
        last = j == chunks - 1
        least = 0 if last else 1
        prev_worst, prev_squares, fair_j = worst[j - 1], squares[j - 1], share[j]
        # Chunk j ends after layer b-1; b leaves every later middle chunk at least one layer,
        # and chunks 1..j-1 hold at least one each, so chunk j starts at a >= j - 1.
        for b in [n] if last else range(j, n + 1 - (chunks - 2 - j)):
            high, low, begin, end = inf, inf, 0, prefix[b]
            for a in range(b - least, j - 2, -1):
                c = end - prefix[a] - fair_j
                if c > high:
                    break  # the chunk only grows as it starts earlier
                m = prev_worst[a]
                if c > m:
                    m = c
                q = prev_squares[a] + c * c
                if m < high or (m == high and q <= low):  # a tie: the later chunk takes more
                    high, low, begin = m, q, a
            worst[j][b], squares[j][b], start[j][b] = high, low, begin
    if worst[-1][n] == inf:
        return None
    counts, b = [], n
    for j in range(chunks - 1, 0, -1):
        a = start[j][b]
        counts.append(b - a)
        b = a
    counts.append(b)
    return layout_string(counts[::-1], mtp)


def _blank_pipe() -> dict[str, Any]:
    blank: dict[str, Any] = {name: None for name in PIPELINE_FIELDS}
    blank.update(account_for_embedding_in_pipeline_split=False,
                 account_for_loss_in_pipeline_split=False)
    return blank


def pipeline_choices(cfg: Config, pp: int,
                     vpps: tuple[int, ...] = VPP_CHOICES) -> list[dict[str, Any]]:
    """The slot-balanced and even pipeline layouts for a PP and VPPs, slot-balanced VPP 1 first:
    each a full set of PIPELINE_FIELDS values."""
    model = cfg.model
    blank = _blank_pipe()
    out: list[dict[str, Any]] = []
    if pp == 1:
        return [blank]
    seen = set()
    for vpp in vpps:
        layout = balanced_layout(model.num_layers, model.mtp_num_layers, pp, vpp)
        if layout and layout not in seen:
            seen.add(layout)
            out.append(blank | {"pipeline_model_parallel_layout": layout})
    if model.num_layers % pp == 0 and 1 in vpps:
        out.append(dict(blank))
    if (model.num_layers + 2) % pp == 0 and 1 in vpps:
        out.append(blank | {"account_for_embedding_in_pipeline_split": True,
                            "account_for_loss_in_pipeline_split": True})
    for vpp in [v for v in vpps if v > 1]:  # even split with VPP (MTP rides on the last chunk)
        if model.num_layers % (pp * vpp) == 0:
            out.append(blank | {"vpp": vpp})
    return out


def cost_balanced_choices(cfg: Config, pp: int, costs: LayerCosts) -> list[dict[str, Any]]:
    """`cost_balanced_layout` for every VPP, as PIPELINE_FIELDS values."""
    layouts = [cost_balanced_layout(costs, cfg.model.mtp_num_layers, pp, vpp) for vpp in VPP_CHOICES]
    return [_blank_pipe() | {"pipeline_model_parallel_layout": layout}
            for layout in dict.fromkeys(layouts) if layout]


ALL_RECOMPUTED = frozenset({"*"})  # full recompute: every module, a superset of any selective set


def recompute_presets(cfg: Config) -> list[dict[str, Any]]:
    """none; selective presets (core attention; the MoE activation and norms, plus the MLA up
    projections on MLA models; all of them); full uniform 1; and the user's own setting —
    ordered by what they recompute, fewest modules first (see `recomputed`)."""
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
        presets.append(user)
    return sorted(presets, key=lambda p: (p["recompute_granularity"] == "full", len(recomputed(p))))


def recomputed(preset: dict[str, Any]) -> frozenset[str]:
    """What a recompute setting recomputes: nothing, its selective modules, or everything. A
    setting that recomputes a superset of another's modules costs at least as much time (it
    repeats at least the same forward work) and holds at most as many activations."""
    granularity = preset.get("recompute_granularity")
    if granularity == "full":
        return ALL_RECOMPUTED | frozenset(str(preset.get("recompute_num_layers")))
    if granularity == "selective":
        return frozenset(preset.get("recompute_modules") or ["core_attn"])
    return frozenset()


def _dominates(lesser: frozenset[str], greater: frozenset[str]) -> bool:
    """`greater` recomputes everything `lesser` does (full recompute covers any selective set;
    full with other layer counts is not compared)."""
    if "*" in greater and "*" not in lesser:
        return True
    return lesser <= greater


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
    """Builds, judges and times candidates, counting and remembering what it refused.

    The catalog judges first (MEM001 included: the memory page alone is cheaper than a whole
    estimate); a candidate whose busiest stage needs more than `headroom` of the GPU's memory is
    refused as HEADROOM; the rest are timed."""

    def __init__(self, cfg: Config, headroom: float = 1.0, float_memory: bool = True) -> None:
        self.cfg = cfg
        self.headroom = headroom
        self.float_memory = float_memory
        self.seen: dict[str, Candidate | Rejected] = {}  # by the candidate's identity
        self._estimates: dict[str, Any] = {}  # timed by `step_time` before being judged

    @property
    def explored(self) -> int:
        return len(self.seen)

    @property
    def legal(self) -> int:
        """No rule error besides the memory verdict."""
        return sum(1 for out in self.seen.values()
                   if isinstance(out, Candidate) or out.codes in NOT_FITTING)

    @property
    def fitting(self) -> int:
        return sum(1 for out in self.seen.values() if isinstance(out, Candidate))

    def timed(self) -> list[Candidate]:
        return [out for out in self.seen.values() if isinstance(out, Candidate)]

    def bound(self, top: int) -> float:
        """The `top`-th fastest fitting step time known (inf while fewer are known): what a
        candidate must beat to enter the top."""
        known = sorted(c.step_time_s for c in self.timed())
        return known[top - 1] if top >= 1 and len(known) >= top else float("inf")

    def absorb(self, other: _Judge) -> None:
        """Take another judge's verdicts (a worker's), keeping the first of equal candidates."""
        for key, out in other.seen.items():
            self.seen.setdefault(key, out)

    def judge(self, changes: Changes, *, is_user: bool = False) -> Candidate | Rejected:
        from planner.accounting import BudgetError
        from planner.estimate import estimate
        from planner.rules import run_rules
        from planner.rules.catalog import CODES
        from planner.rules.facts import Facts

        cand = build(self.cfg, changes)
        key = _identity(cand)
        if key in self.seen:
            return self.seen[key]
        facts = Facts(cand, known_codes=CODES)
        if self.float_memory:
            self._float_memory(facts)
        errors = _errors(run_rules(cand, facts=facts))
        codes = tuple(sorted({f.code for f in errors}))
        out: Candidate | Rejected
        if codes == ("MEM001",):
            out = Rejected(cand, changes, _memory_reason(errors), codes)
        elif codes:
            out = Rejected(cand, changes, "rule " + ", ".join(codes), codes)
        elif (over := self._over_headroom(facts.stage_memory or [])) is not None:
            out = Rejected(cand, changes, over, ("HEADROOM",))
        else:
            try:
                est = self._estimates.pop(key, None) or estimate(cand, exact=False)
            except BudgetError as exc:  # the catalog passed it: report, do not crash
                out = Rejected(cand, changes, f"no estimate: {exc}", ("EST",))
            else:
                out = _candidate(cand, changes, est, is_user, facts.stage_memory)
        self._estimates.pop(key, None)
        self.seen[key] = out
        return out

    def _float_memory(self, facts: Any) -> None:
        """Give the catalog the memory budget in floats when every stage is clear of the
        thresholds a verdict compares with (MEM001's 100 %, MEM002's 80 %, the headroom) by far
        more than float rounding: the verdicts are then those of the exact budget. Otherwise
        the catalog evaluates it exactly, as `moeplan check` does."""
        from planner.accounting import stage_memory
        from planner.rules.memory import HEADROOM

        stages = stage_memory(facts.cfg, exact=False)
        if stages is None:
            return
        for env in stages:
            share = float(env["memory_utilization"])
            if any(abs(share - float(t)) <= FLOAT_MARGIN * float(t)
                   for t in (1.0, HEADROOM, self.headroom)):
                return
        facts.give_stage_memory(stages)

    def step_time(self, changes: Changes) -> float | None:
        """The candidate's step time without judging it (None when it cannot be estimated); the
        estimate is kept for `judge`."""
        cand = build(self.cfg, changes)
        key = _identity(cand)
        if key in self.seen:
            return self.seen[key].step_time_s
        if key in self._estimates:
            return float(self._estimates[key].step_time_s)
        est = _float_estimate(cand)
        if est is None:
            return None
        self._estimates[key] = est
        return float(est.step_time_s)

    def forget_all(self) -> None:
        self._estimates.clear()

    def forget(self, changes: Changes) -> None:
        """Drop a kept estimate (its candidate was pruned, not judged)."""
        self._estimates.pop(_identity(build(self.cfg, changes)), None)

    def _over_headroom(self, stages: list[dict[str, Any]]) -> str | None:
        """Why the busiest stage is above the headroom (None when every stage is inside it)."""
        from planner.units import format_bytes

        if self.headroom >= 1 or not stages:
            return None  # MEM001 already holds every stage to the whole GPU memory
        shares = [float(env["memory_utilization"]) for env in stages]
        worst = max(range(len(shares)), key=shares.__getitem__)
        if shares[worst] <= self.headroom:
            return None
        env = stages[worst]
        return (f"does not fit the {self.headroom:.0%} memory headroom: stage {worst} needs an "
                f"estimated {format_bytes(int(env['peak_memory_bytes']), digits=2)} per rank, "
                f"{shares[worst]:.1%} of {format_bytes(int(env['gpu_memory_bytes']), digits=2)}")

    def time_rejected(self, r: Rejected) -> None:
        """The step time a refused candidate would have (when its grids build)."""
        if r.step_time_s is None and "EST" not in r.codes:
            est = _float_estimate(r.cfg)
            if est is not None:
                r.step_time_s = est.step_time_s


def _float_estimate(cand: Config) -> Any:
    """The float estimate of a candidate that may not be judged yet, or None when a layout the
    catalog would refuse cannot be estimated at all."""
    from planner.accounting import BudgetError
    from planner.estimate import estimate

    try:
        return estimate(cand, exact=False)
    except (BudgetError, ValueError, ZeroDivisionError, KeyError):
        return None


def _candidate(cfg: Config, changes: Changes, est: Any, is_user: bool,
               memory: list[dict[str, Any]] | None = None) -> Candidate:
    """The candidate's figures; peaks from the catalog's memory budget when given (a float
    estimate holds none)."""
    peaks = [int(env["peak_memory_bytes"]) for env in (memory or est.envs)]
    stage = max(range(len(peaks)), key=peaks.__getitem__)
    return Candidate(cfg, changes, est.step_time_s, est.tflops_per_gpu, est.tokens_per_s_per_gpu,
                     peaks[stage], stage, peaks, is_user,
                     [float(t) for t in est.page_values("time_stage_step_s")],
                     [float(t) for t in est.page_values("time_bubble_s")])


# ----------------------------------------------------------------------------- the loop
Family = tuple[int, int, int, int, int]


def _family_changes(fam: Family, pipe: dict[str, Any]) -> Changes:
    tp, cp, pp, ep, etp = fam
    return {"parallel": {"tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp,
                         "sequence_parallel": tp > 1, **pipe}}


def _knobs_of(cfg: Config) -> Changes:
    """The knobs the grid varies, as a config sets them."""
    ov, moe = cfg.overlap, cfg.moe
    return {"training": {"micro_batch_size": cfg.training.micro_batch_size},
            "overlap": {"recompute_granularity": ov.recompute_granularity,
                        "recompute_method": ov.recompute_method,
                        "recompute_num_layers": ov.recompute_num_layers,
                        "recompute_modules": ov.recompute_modules,
                        "overlap_moe_expert_parallel_comm": ov.overlap_moe_expert_parallel_comm},
            "moe": {"moe_token_dispatcher_type": moe.moe_token_dispatcher_type,
                    "moe_flex_dispatcher_backend": moe.moe_flex_dispatcher_backend,
                    "moe_permute_fusion": moe.moe_permute_fusion}}


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


def _family_key(cfg: Config) -> Family:
    p = cfg.parallel
    return (p.tp, p.cp, p.pp, p.ep, p.etp or p.tp)


@dataclass
class _Work:
    """What one worker returns: its judge's verdicts and what it pruned, by reason."""

    judge: _Judge
    pruned: dict[str, int] = field(default_factory=dict)
    # Chosen for the knob grid, each with its promise (does not fit, step time at the anchor's
    # knobs) and its `_floors`, by which the grid takes the layouts (most promising first).
    layouts: list[tuple[tuple[bool, float], Changes, dict[int, float | None]]] = field(
        default_factory=list)

    def prune(self, reason: str, count: int = 1) -> None:
        self.pruned[reason] = self.pruned.get(reason, 0) + count


Phase1Item = tuple[tuple[int, int, int, int], list[int], list[dict[str, Any]]]


# The knobs an anchor falls back to when the user's are illegal on every layout of a family
# (e.g. EP overlap, which Megatron refuses without VPP on PP > 1): the plainest dispatcher.
PLAIN_KNOBS: Changes = {"overlap": {"overlap_moe_expert_parallel_comm": False},
                        "moe": {"moe_token_dispatcher_type": "alltoall",
                                "moe_flex_dispatcher_backend": None}}


def _anchor(judge: _Judge, base: Changes, knobs: Changes,
            pipes: list[dict[str, Any]]) -> Candidate | Rejected | None:
    """The family's first legal pipeline layout with the user's knobs (then the plain ones);
    full recompute at MBS 1 when those do not fit. None when every layout is illegal."""
    for settings in (knobs, _merge(knobs, PLAIN_KNOBS)):
        for pipe in pipes:
            out = judge.judge(_merge(base, {"parallel": pipe}, settings))
            if isinstance(out, Rejected) and out.codes in MEMORY_VERDICTS:
                out = judge.judge(_merge(base, {"parallel": pipe}, settings,
                                         {"training": {"micro_batch_size": 1},
                                          "overlap": dict(FULL_RECOMPUTE)}))
            if isinstance(out, Candidate) or out.codes in NOT_FITTING:
                return out
    return None


def _phase1_work(cfg: Config, headroom: float, items: list[Phase1Item]) -> _Work:
    """Anchor every family of a share of the (TP, CP, PP, ETP) groups (one process's work)."""
    work, knobs = _Work(_Judge(cfg, headroom)), _knobs_of(cfg)
    for (tp, cp, pp, etp), eps, pipes in items:
        for i, ep in enumerate(eps):
            base = _family_changes((tp, cp, pp, ep, etp), {})
            out = _anchor(work.judge, base, knobs, pipes)
            if isinstance(out, Rejected) and out.codes in MEMORY_VERDICTS:
                # Even full recompute at MBS 1 does not fit: smaller EPs hold more experts. (Its
                # other layouts are not tried: the slot-balanced one spreads memory evenly.)
                work.prune("families whose anchor does not fit even with full recompute")
                work.prune("families with a smaller EP than one that does not fit", len(eps) - i - 1)
                break
    return work


def _layouts_work(cfg: Config, headroom: float, unit: tuple[Candidate, int, float]) -> _Work:
    """One family: its cost-balanced and slot-balanced layouts at the anchor's knobs; the best
    `layouts` of them go to the knob grid (`_Work.layouts`). `bound` as for `_grid`."""
    from planner.accounting import BudgetError
    from planner.estimate import estimate

    anchor, layouts, bound = unit
    work = _Work(_Judge(cfg, headroom))
    work.judge.seen[_identity(anchor.cfg)] = anchor  # judged in phase 1: not again
    fam = _family_key(anchor.cfg)
    base = _family_changes(fam, {})
    knobs = _knobs_of(anchor.cfg)
    pipes = pipeline_choices(cfg, fam[2])
    if fam[2] > 1:
        probe = build(cfg, _merge(base, {"parallel": pipes[0]}, knobs))
        try:
            if _pipe_of(anchor.cfg) == _pipe_of(probe):  # the anchor is the probe: reuse its rows
                rows = [{"step_s": step, "bubble_s": bubble} for step, bubble
                        in zip(anchor.stage_step_s, anchor.stage_bubble_s, strict=True)]
            else:
                rows = estimate(probe, exact=False).stages
            costs = layer_costs(probe, rows)
        except (BudgetError, ValueError, ZeroDivisionError):
            pass
        else:
            pipes = cost_balanced_choices(cfg, fam[2], costs) + pipes
    if fam[2] == cfg.parallel.pp:
        pipes.append(_pipe_of(cfg))
    pipes.append(_pipe_of(anchor.cfg))
    unique = list({repr(sorted(p.items())): p for p in pipes}.values())
    settings = [_merge(base, {"parallel": pipe}, knobs) for pipe in unique]
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
        layout = _merge(base, {"parallel": unique[i]})
        work.layouts.append((promise[i], layout, _floors(work, cfg, layout)))
    work.judge.forget_all()  # estimates are not sent back to the parent process
    return work


def _grid_work(cfg: Config, headroom: float,
               unit: tuple[Changes, dict[int, float | None], float, int]) -> _Work:
    """The knob grid of one layout (a unit small enough to share)."""
    layout, floors, bound, top = unit
    work = _Work(_Judge(cfg, headroom))
    _grid(work, cfg, layout, bound, top, floors=floors)
    work.judge.forget_all()  # estimates are not sent back to the parent process
    return work


def _pipe_of(cfg: Config) -> dict[str, Any]:
    """The pipeline fields of a config, as a candidate's changes set them."""
    return {name: getattr(cfg.parallel, name) for name in PIPELINE_FIELDS}


def _dispatchers(cfg: Config) -> tuple[tuple[str, str | None], ...]:
    if cfg.model.num_experts:
        return DISPATCHERS
    return ((cfg.moe.moe_token_dispatcher_type, cfg.moe.moe_flex_dispatcher_backend),)


def _setting(layout: Changes, dispatcher: tuple[str, str | None], flag: bool,
             preset: dict[str, Any], mbs: int) -> Changes:
    """One cell of a layout's knob grid."""
    return _merge(layout, {
        "training": {"micro_batch_size": mbs},
        "overlap": preset | {"overlap_moe_expert_parallel_comm": flag},
        "moe": {"moe_token_dispatcher_type": dispatcher[0],
                "moe_flex_dispatcher_backend": dispatcher[1], **FUSED_PERMUTE}})


def _floors(work: _Work, cfg: Config, layout: Changes) -> dict[int, float | None]:
    """Per micro-batch size, the layout's time at the floor dispatcher with EP overlap on and no
    recompute (`_floor_dispatcher`): a lower bound of every grid cell it bounds."""
    lower, _ = _floor_dispatcher(cfg, _dispatchers(cfg))
    if lower is None:
        return {}
    none = recompute_presets(cfg)[0]
    return {mbs: work.judge.step_time(_setting(layout, lower, True, none, mbs))
            for mbs in MBS_CHOICES}


def _floor_dispatcher(cfg: Config, dispatchers: tuple[tuple[str, str | None], ...]
                      ) -> tuple[tuple[str, str | None] | None, set[tuple[str, str | None]]]:
    """The dispatcher whose time bounds the others' from below on any layout, knobs alike, and
    the dispatchers it bounds: HybridEP (flex), whose node-deduplicated rows are the fewest any
    dispatcher moves and which permutes nothing (its kernel writes expert order), over every
    dispatcher whose efficiency factor is no higher than its own (step time only grows with
    exchanged bytes and permuted elements; tests/unit/search/test_search.py checks it on the examples)."""
    from planner.budget.hardware import dispatch_efficiency

    lower = ("flex", "hybridep")
    if len(dispatchers) == 1:  # one dispatcher (a dense model): EP overlap on bounds it alone
        return dispatchers[0], set(dispatchers)
    if lower not in dispatchers:
        return None, set()

    def efficiency(d: tuple[str, str | None]) -> float:
        return dispatch_efficiency(build(cfg, {"moe": {"moe_token_dispatcher_type": d[0],
                                                       "moe_flex_dispatcher_backend": d[1]}}))

    ceiling = efficiency(lower)
    return lower, {d for d in dispatchers if efficiency(d) <= ceiling}


def _grid(work: _Work, cfg: Config, layout: Changes, bound: float = float("inf"),
          top: int = 1, found: list[float] | None = None,
          floors: dict[int, float | None] | None = None) -> None:
    """Every micro-batch × dispatcher × EP overlap × recompute preset of one layout, but the
    exact prunings (see the module doc). `bound`: a step time `top` fitting candidates already
    beat (or the `top`-th best of `found`, the fitting step times known to the caller, which
    the grid extends); a setting whose time without recompute exceeds it is skipped with all
    its presets, recomputing more never being faster. Lower bounds make one time stand for
    several settings: with EP overlap on a setting is never slower than with it off (the flag
    only hides exchange time), and HybridEP bounds the dispatchers `_floor_dispatcher` names.
    The settings left are judged fastest first (by their time without recompute), so the
    bound tightens early. `floors`: `_floors` of the layout, when known."""
    presets = recompute_presets(cfg)
    dispatchers = _dispatchers(cfg)
    lower, bounded = _floor_dispatcher(cfg, dispatchers)
    found = [] if found is None else found
    floors = floors or {}

    def setting(dispatcher: tuple[str, str | None], flag: bool, preset: dict[str, Any],
                mbs: int) -> Changes:
        return _setting(layout, dispatcher, flag, preset, mbs)

    def best() -> float:
        return min(bound, sorted(found)[top - 1] if len(found) >= top else float("inf"))

    def slower(dispatcher: tuple[str, str | None], flag: bool, mbs: int, settings: int,
               floor: float | None) -> bool:
        """Whether the setting's time without recompute (`floor`) beats no `top` fitting ones
        (then the `settings` it bounds are pruned)."""
        if floor is None or floor <= best() * (1 + FLOAT_MARGIN):
            return False
        work.judge.forget(setting(dispatcher, flag, presets[0], mbs))
        work.prune("settings slower without recompute than the best found",
                   settings * len(presets))
        return True

    def floor_of(dispatcher: tuple[str, str | None], flag: bool, mbs: int) -> float | None:
        if (dispatcher, flag) == (lower, True) and mbs in floors:
            return floors[mbs]  # timed already (`_floors`)
        if best() == float("inf"):
            return None  # nothing to prune against: no need to time before judging
        return work.judge.step_time(setting(dispatcher, flag, presets[0], mbs))

    settings: list[tuple[float, int, tuple[str, str | None], bool, int]] = []
    for mbs in MBS_CHOICES:
        remaining = sorted(dispatchers, key=lambda d: d != lower)  # the likely fastest first
        if lower is not None and slower(lower, True, mbs, 2 * len(bounded),
                                        floor_of(lower, True, mbs)):
            remaining = [d for d in remaining if d not in bounded]
        for dispatcher in remaining:
            floor = floor_of(dispatcher, True, mbs)
            if slower(dispatcher, True, mbs, 2, floor):
                continue
            for flag in (True, False):
                if not flag:
                    floor = floor_of(dispatcher, flag, mbs)
                    if slower(dispatcher, flag, mbs, 1, floor):
                        continue
                rank = float("inf") if floor is None else floor
                settings.append((rank, len(settings), dispatcher, flag, mbs))
    # Presets that did not fit, per dispatcher and EP overlap: the smallest micro-batch each
    # failed at (activations grow with the micro-batch, so larger ones fail too).
    too_big: dict[tuple[tuple[str, str | None], bool], dict[frozenset[str], int]] = {}
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
            if any(_dominates(f, mine) for f in fitting):
                work.prune("settings recomputing more than a fitting one")
                continue
            out = work.judge.judge(setting(dispatcher, flag, preset, mbs))
            if isinstance(out, Candidate):
                fitting.append(mine)
                found.append(out.step_time_s)
            elif out.codes in MEMORY_VERDICTS:
                failed[mine] = min(failed.get(mine, mbs), mbs)


def _run_units(work: Callable[..., _Work], cfg: Config, headroom: float, units: list[Any],
               sizes: list[int], pool: Executor | None, tick: Callable[[int], None]) -> list[_Work]:
    """Run `work(cfg, headroom, unit)` for every unit, in the pool's processes when there is one;
    the results come back in the units' order (so the outcome never depends on the workers)."""
    if pool is None or len(units) <= 1:
        out = []
        for unit, size in zip(units, sizes, strict=True):
            out.append(work(cfg, headroom, unit))
            tick(size)
        return out
    from concurrent.futures import as_completed

    results: list[_Work | None] = [None] * len(units)
    futures = {pool.submit(work, cfg, headroom, unit): i for i, unit in enumerate(units)}
    for future in as_completed(futures):
        i = futures[future]
        results[i] = future.result()
        tick(sizes[i])
    return [r for r in results if r is not None]


@contextmanager
def _worker_pool(workers: int) -> Iterator[Executor | None]:
    """`workers` processes for the whole search, or None to judge in-process. They are forked
    once, so each keeps what it computed (compiled formula books, grids, placements) for its
    later units; where fork is missing the search judges in-process."""
    import multiprocessing

    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield None
        return
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers,
                             mp_context=multiprocessing.get_context("fork")) as pool:
        yield pool


def _default_workers() -> int:
    import os

    return max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def search(cfg: Config, *, top: int = 10, refine: int = 0, layouts: int = 1, max_ruled_out: int = 3,
           progress: Progress | None = None, workers: int | None = None,
           memory_headroom: float = 1.0) -> SearchResult:
    """Rank the fitting layouts of `cfg`'s model, cluster and batch by predicted step time.

    Phase 1 anchors every family; phase 2 refines the `refine` fastest families (0: all that fit)
    and the user's: cost-balanced layouts, then the knob grid on the `layouts` best of them (see
    the module doc). A candidate fits when every stage's estimated peak is at most
    `memory_headroom` of the GPU's memory (1: MEM001's own threshold). `workers` processes share
    the judging (default: up to 2 cores).
    """
    with _worker_pool(_default_workers() if workers is None else workers) as pool:
        return _search(cfg, top, refine, layouts, max_ruled_out, progress, pool, memory_headroom)


def _search(cfg: Config, top: int, refine: int, layouts: int, max_ruled_out: int,
            progress: Progress | None, pool: Executor | None,
            memory_headroom: float) -> SearchResult:
    start = time.perf_counter()
    judge = _Judge(cfg, memory_headroom)
    user = judge.judge({}, is_user=True)
    groups, pruned_degrees = _groups(cfg)
    pruned: dict[str, int] = {"families the degrees rule out": pruned_degrees}
    user_family = _family_key(cfg)
    plan: list[Phase1Item] = []
    for (tp, cp, pp, etp), eps in groups.items():
        pipes = pipeline_choices(cfg, pp, (1,))
        if (tp, cp, pp, etp) == (user_family[0], user_family[1], user_family[2], user_family[4]):
            pipes.insert(0, _pipe_of(cfg))
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

    def absorb(part: _Work) -> None:
        judge.absorb(part.judge)
        for reason, settings in part.pruned.items():
            count(reason, settings)

    for part in _run_units(_phase1_work, cfg, memory_headroom, units, sizes, pool, tick):
        absorb(part)
    anchors: list[Candidate] = []
    for cand in sorted(judge.timed(), key=lambda c: c.step_time_s):
        if all(_family_key(cand.cfg) != _family_key(b.cfg) for b in anchors):
            anchors.append(cand)
    chosen = anchors[:refine] if refine > 0 else anchors
    if isinstance(user, Candidate) and all(_family_key(b.cfg) != user_family for b in chosen):
        chosen.append(user)
    pruned["families not refined"] = len(anchors) - len(chosen)
    dispatchers = _dispatchers(cfg)
    lower, bounded = _floor_dispatcher(cfg, dispatchers)
    per_layout = len(recompute_presets(cfg)) * len(MBS_CHOICES) * 2 * len(dispatchers)
    total = done + 10 * len(chosen)
    queue: list[tuple[float, tuple[bool, float], int, Changes, dict[int, float | None]]] = []
    bound = judge.bound(top)
    for part in _run_units(_layouts_work, cfg, memory_headroom,
                           [(anchor, layouts, bound) for anchor in chosen], [10] * len(chosen),
                           pool, tick):
        absorb(part)
        for promise, layout, floors in part.layouts:
            known = [t for t in floors.values() if t is not None]
            # A layout whose floors are all known and bound every dispatcher can be skipped
            # whole; the others go first.
            whole = lower is not None and bounded == set(dispatchers) and \
                len(known) == len(MBS_CHOICES)
            queue.append((min(known) if whole else -float("inf"), promise, len(queue), layout,
                           floors))
    total += per_layout * len(queue)
    # Branch and bound over every chosen layout, the lowest floor first: `top` candidates
    # already fit at the bound (the top-th step time known), so a layout (or grid cell) whose
    # floor exceeds it cannot enter the top (nor be a faster candidate that was ruled out).
    # Rounds of fixed, growing sizes (whatever the workers, so the counts never depend on
    # them); each starts from the bound the earlier ones set.
    queue.sort(key=lambda item: item[:3])
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
        for part in _run_units(_grid_work, cfg, memory_headroom, units,
                               [per_layout] * len(units), pool, tick):
            absorb(part)
        size *= 4
    if progress:
        progress(total, total)
    # Ties go to the user's layout, then to the candidate that changes fewest of its fields.
    shown = _exact_top(cfg, judge.timed(), top, pool)
    winner = shown[0] if shown else None
    ruled_out = _ruled_out(judge, winner, max_ruled_out, pool) if winner else []
    if isinstance(user, Candidate):
        user = next((c for c in shown if c.is_user), None) or _exact(user)
    return SearchResult(shown, user if isinstance(user, Candidate) else None, ruled_out,
                        judge.explored, judge.legal, judge.fitting,
                        time.perf_counter() - start, sum(pruned.values()), pruned,
                        memory_headroom)


def _ruled_out(judge: _Judge, winner: Candidate, count: int,
               pool: Executor | None = None) -> list[Rejected]:
    """Refused candidates of the winner's family (its layouts and its knob grid) that would have
    been faster, nearest first, one per distinct verdict (`_verdict_key`); the listed ones are
    re-evaluated exactly (in the pool's processes when there is one)."""
    fam = _family_key(winner.cfg)
    refused = [r for r in judge.seen.values()
               if isinstance(r, Rejected) and _family_key(r.cfg) == fam]
    for r in refused:
        judge.time_rejected(r)
    # Ranked in floats: "faster" means by more than their rounding (1e-12 of the step).
    faster = sorted((r for r in refused if r.step_time_s is not None
                     and r.step_time_s < winner.step_time_s * (1 - FLOAT_MARGIN)),
                    key=lambda r: -(r.step_time_s or 0))
    out, seen = [], set()
    for r in faster:
        verdict = _verdict_key(r.codes)
        if verdict not in seen:
            seen.add(verdict)
            r.difference = difference(winner.cfg, r.cfg)
            out.append(r)
    listed = out[:count]
    units = [(judge.cfg, judge.headroom, r) for r in listed]
    exact = list(pool.map(_exact_refusal, units)) if pool is not None and len(units) > 1 else \
        [_exact_refusal(unit) for unit in units]
    for r, (step_time, reason) in zip(listed, exact, strict=True):
        r.step_time_s = step_time
        r.reason = reason or r.reason
    return listed


def _exact_refusal(unit: tuple[Config, float, Rejected]) -> tuple[float, str | None]:
    """A listed refusal's step time evaluated exactly, and its memory verdict judged on the exact
    budget (None when no memory verdict is involved): as printed, whereas search judged the
    memory verdicts in floats."""
    from planner.estimate import estimate

    cfg, headroom, r = unit
    reason = None
    if set(r.codes) & {"MEM001", "HEADROOM"}:
        exact = _Judge(cfg, headroom, float_memory=False).judge(r.changes)
        if isinstance(exact, Rejected):
            reason = exact.reason
    return estimate(r.cfg).step_time_s, reason


# Float ranking is within this relative distance of the exact step time (a few dozen roundings of
# 1e-16 each); candidates that close to the K-th are re-evaluated exactly before ranking.
FLOAT_MARGIN = 1e-12


def _exact(cand: Candidate) -> Candidate:
    """The candidate's figures evaluated exactly (as `moeplan estimate` prints them)."""
    from planner.estimate import estimate

    return _candidate(cand.cfg, cand.changes, estimate(cand.cfg), cand.is_user)


def _exact_top(cfg: Config, timed: list[Candidate], top: int,
               pool: Executor | None = None) -> list[Candidate]:
    """The `top` fastest, ranked on exact step times: every candidate within the float margin of
    the top-th float time is re-evaluated exactly (in the pool's processes when there is one),
    then ranked (ties go to the user's layout, then to the candidate that changes fewest of its
    fields)."""
    def key(c: Candidate) -> tuple[float, bool, int]:
        return (c.step_time_s, not c.is_user, len(difference(cfg, c.cfg)))

    ranked = sorted(timed, key=key)
    if not ranked:
        return []
    limit = ranked[min(top, len(ranked)) - 1].step_time_s * (1 + 4 * FLOAT_MARGIN)
    close = [c for c in ranked if c.step_time_s <= limit]
    exact = list(pool.map(_exact, close)) if pool is not None and len(close) > 1 else \
        [_exact(c) for c in close]
    return sorted(exact, key=key)[:top]


def _verdict_key(codes: tuple[str, ...]) -> tuple[str, ...]:
    """Which verdict a refusal is, for listing each once: its rule codes, memory aside when a
    rule also refuses it (that rule is the reason; fixing memory would not help)."""
    rules = tuple(c for c in codes if c not in ("MEM001", "HEADROOM"))
    return rules or codes


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
    from planner.config.schema import Config as Schema

    model = Schema.model_fields[section].annotation
    info = getattr(model, "model_fields", {}).get(key)
    choices = getattr(getattr(info, "validation_alias", None), "choices", None) or []
    return [c for c in choices if isinstance(c, str) and c != key]


__all__ = ["Candidate", "LayerCosts", "Rejected", "SearchResult", "balanced_layout", "build",
           "cost_balanced_layout", "emitted_data", "difference", "families", "knob_view",
           "layer_costs", "layout_string", "pipeline_choices", "recompute_presets", "search"]

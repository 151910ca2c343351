"""The space search covers: the degree families, their pipeline layouts (slot-balanced, even and
cost-balanced), the knob grid's micro-batch sizes, dispatchers and recompute presets.

Nothing here judges: the only pruning is the degrees' own divisibility (planner/degrees.py), and
pipeline layouts are written as Megatron layout strings (planner/config/layout_strings.py) that
planner/layout/pipeline.py splits, or refuses, as for any config.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

from planner.config.layout_strings import layout_string
from planner.config.schema import Config
from planner.degrees import Degrees
from planner.layout.pipeline import stage_split
from planner.rules.hints import divisors
from planner.search.knobs import Dispatcher, Family, Pipeline, Recompute, family_of

VPP_CHOICES = (1, 2, 4)
MBS_CHOICES = (1, 2, 4)
# (dispatcher, flex backend) pairs; the catalog refuses those a layout cannot use (e.g. MOE008).
DISPATCHERS: tuple[Dispatcher, ...] = (("alltoall", None), ("allgather", None), ("flex", "deepep"),
                                       ("flex", "hybridep"))
# The (TP, CP, PP, ETP) of a family: its EPs are searched together, largest first.
Group = tuple[int, int, int, int]


# ----------------------------------------------------------------------------- degrees
def _powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in divisors(n) if d <= limit]


def families(cfg: Config) -> tuple[list[Family], int]:
    """(TP, CP, PP, EP, ETP) that tile the world, split the experts and the global batch; and how
    many were pruned on the way. TP·CP stays inside one NVLink domain (tensor and context
    parallelism across the scale-out network is never the fast choice) and ETP is 1 or TP."""
    par, model = cfg.parallel, cfg.model
    world = par.world_size
    domain = cfg.cluster.nvlink_domain or cfg.cluster.gpus_per_node or 8
    gbs = cfg.global_batch_size
    experts = model.num_experts
    out, pruned = [], 0
    tps = _powers_of_two(min(domain, 8))
    pps = _divisors(world, model.num_layers + model.mtp_num_layers)
    eps = _divisors(experts, world) if experts else [1]
    user = family_of(cfg)
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


def groups(cfg: Config) -> tuple[dict[Group, list[int]], int]:
    """Families grouped by (TP, CP, PP, ETP), their EPs largest first (fewest experts per rank)."""
    fams, pruned = families(cfg)
    by_group: dict[Group, list[int]] = {}
    for tp, cp, pp, ep, etp in fams:
        by_group.setdefault((tp, cp, pp, etp), []).append(ep)
    return {k: sorted(v, reverse=True) for k, v in by_group.items()}, pruned


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


# ----------------------------------------------------------------------------- layouts
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


def pipeline_choices(cfg: Config, pp: int, vpps: tuple[int, ...] = VPP_CHOICES) -> list[Pipeline]:
    """The slot-balanced and even pipeline layouts for a PP and VPPs, slot-balanced VPP 1 first."""
    model = cfg.model
    if pp == 1:
        return [Pipeline()]
    out: list[Pipeline] = []
    seen = set()
    for vpp in vpps:
        layout = balanced_layout(model.num_layers, model.mtp_num_layers, pp, vpp)
        if layout and layout not in seen:
            seen.add(layout)
            out.append(Pipeline(pipeline_model_parallel_layout=layout))
    if model.num_layers % pp == 0 and 1 in vpps:
        out.append(Pipeline())
    if (model.num_layers + 2) % pp == 0 and 1 in vpps:
        out.append(Pipeline(account_for_embedding_in_pipeline_split=True,
                            account_for_loss_in_pipeline_split=True))
    for vpp in [v for v in vpps if v > 1]:  # even split with VPP (MTP rides on the last chunk)
        if model.num_layers % (pp * vpp) == 0:
            out.append(Pipeline(vpp=vpp))
    return out


def cost_balanced_choices(cfg: Config, pp: int, costs: LayerCosts) -> list[Pipeline]:
    """`cost_balanced_layout` for every VPP."""
    layouts = [cost_balanced_layout(costs, cfg.model.mtp_num_layers, pp, vpp) for vpp in VPP_CHOICES]
    return [Pipeline(pipeline_model_parallel_layout=layout)
            for layout in dict.fromkeys(layouts) if layout]


# ----------------------------------------------------------------------------- knob grid
def dispatchers(cfg: Config) -> tuple[Dispatcher, ...]:
    """Every dispatcher for an MoE model; a dense model keeps its own (it dispatches nothing)."""
    if cfg.model.num_experts:
        return DISPATCHERS
    return ((cfg.moe.moe_token_dispatcher_type, cfg.moe.moe_flex_dispatcher_backend),)


ALL_RECOMPUTED = frozenset({"*"})  # full recompute: every module, a superset of any selective set
NO_RECOMPUTE = Recompute()
FULL_RECOMPUTE = Recompute.full("uniform", 1)


def recompute_presets(cfg: Config) -> list[Recompute]:
    """none; selective presets (core attention; the MoE activation and norms, plus the MLA up
    projections on MLA models; all of them); full uniform 1; and the user's own setting —
    ordered by what they recompute, fewest modules first (see `recomputed`)."""
    mla = cfg.model.attention_variant in ("mla", "dsv4_hybrid")
    light = (("mla_up_proj",) if mla else ()) + ("moe_act", "layernorm")
    presets = [NO_RECOMPUTE, Recompute.selective("core_attn"), Recompute.selective(*light),
               Recompute.selective("core_attn", *light), FULL_RECOMPUTE]
    user = Recompute.of(cfg)
    if user not in presets:
        presets.append(user)
    return sorted(presets, key=lambda p: (p.granularity == "full", len(recomputed(p))))


def recomputed(preset: Recompute) -> frozenset[str]:
    """What a recompute setting recomputes: nothing, its selective modules, or everything. A
    setting that recomputes a superset of another's modules costs at least as much time (it
    repeats at least the same forward work) and holds at most as many activations. Full
    recompute is everything plus one token for its method and layer count, so that two full
    settings are never subsets of one another (they are not compared)."""
    if preset.granularity == "full":
        return ALL_RECOMPUTED | {f"full {preset.method} {preset.num_layers}"}
    if preset.granularity == "selective":
        return frozenset(preset.modules or ["core_attn"])
    return frozenset()


def dominates(lesser: frozenset[str], greater: frozenset[str]) -> bool:
    """`greater` recomputes everything `lesser` does (full recompute covers any selective set;
    full with another method or layer count is not compared)."""
    if "*" in greater and "*" not in lesser:
        return True
    return lesser <= greater

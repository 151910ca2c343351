"""Page 3, communication: bytes per collective per MoE layer, the per-step predictions
`step.<collective>.<phase>.*` and their split into intra- and inter-node wire bytes, following
Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py
(MoEAlltoAllTokenDispatcher, MoEAllGatherTokenDispatcher, MoEFlexTokenDispatcher) and
megatron/core/distributed/distributed_data_parallel.py (gradient reduction).

Every collective is an entry of planner/budget/collectives.py (its group, algorithm per phase,
routing dependence and overlap flag); `Collectives.add` refuses a name, phase, group or algorithm
the table does not list. Bytes are per rank, per MoE layer, per microbatch unless the name starts
with `step.` (one optimizer step: × MoE layers on the stage × microbatches). Wire bytes assume ring
algorithms for all-gather, reduce-scatter and all-reduce, direct sends for all-to-all and pipeline
p2p. A collective over a one-rank group is not issued and predicts 0 bytes. A forward that
activation recompute runs again in backward (the table's `recomputed_with`) also predicts
`step.<collective>.recompute.*`, derived by `Collectives.add` from the forward's formulas.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from planner.budget.collectives import (
    ALGORITHMS,
    DIRECTIONS,
    RECOMPUTE,
    TRANSPOSE,
    Collective,
    Exchange,
    UnknownCollective,
    collective,
)
from planner.budget.expr import Book
from planner.budget.layer_kinds import MIXERS, kinds_of, write_cp_bytes
from planner.budget.tp_comm import add_tp_bytes, add_tp_steps
from planner.budget.variant import Variant, routed_width

PAGE = "comm"

ONE_RANK = "group of one rank: no collective"
WHOLE_BYTES = "shares of a buffer and expectations are rounded up to whole bytes"


class GroupSize(NamedTuple):
    symbol: str  # its size in the formulas (the ring and all-to-all wire bytes)
    label: str  # how a reason names it: "EP = 1: group of one rank: no collective"


# The groups the comm page prices collectives over, without an explicit size (planner/layout/
# group_kinds.py). The intra-instance and inter-instance groups always come with their size.
GROUPS: Mapping[str, GroupSize] = MappingProxyType({
    "ep": GroupSize("EP", "EP"), "expt_tp": GroupSize("ETP", "ETP"),
    "tp_ep": GroupSize("tp_ep_size", "ETP·EP"), "cp": GroupSize("CP", "CP"),
    "tp_cp": GroupSize("(TP * CP)", "TP·CP"), "dp_cp": GroupSize("dp_cp_size", "dp_cp"),
    "expt_dp": GroupSize("expert_dp", "expt_dp"), "tp_dp_cp": GroupSize("tp_dp_cp_size", "tp_dp_cp"),
    "embd": GroupSize("embd_size", "embd"), "gtp_remat": GroupSize("GTP", "GTP"),
    "expt_gtp_remat": GroupSize("EGTP", "EGTP"), "tp": GroupSize("TP", "TP"),
    "pp": GroupSize("PP", "PP"),
})


def _group(group: str) -> GroupSize:
    try:
        return GROUPS[group]
    except KeyError:
        raise UnknownCollective(f"group {group!r} has no size in GROUPS (planner/budget/comm.py); "
                                "give the collective its size") from None


def group_size(group: str) -> str:
    """The symbol of `group`'s size; a group the page does not know fails loudly."""
    return _group(group).symbol


def one_rank(group: str) -> str:
    """Why a collective over `group` is not issued when the group has one rank."""
    return f"{_group(group).label} = 1: {ONE_RANK}"


def add_layer_bytes(book: Book, v: Variant) -> None:
    """Bytes per rank per MoE layer per microbatch, one direction, send payload only. Token rows
    move at `routed_width` (latent MoE dispatches the projected rows, Megatron-LM dev@d48bd6be
    megatron/core/transformer/moe/moe_layer.py MoELayer.preprocess / postprocess), in the training
    precision `p` under FP8 too: Megatron casts to FP8 inside the experts, after the dispatch. The
    alltoall dispatcher exchanges the BF16 rows, DeepEP gets the BF16 tensor
    (megatron/core/transformer/moe/fused_a2a.py FusedDispatch.forward) and HybridEP is called with
    FP8 dispatch off (HybridEPDispatch.forward: "Currently, we do not support fp8 dispatch");
    DeepEP's own FP8 dispatch, which DeepSeek-V3 trains with, is not one Megatron issues."""
    add, w = book.add, routed_width(v)
    add("pp_activation_bytes", "tokens_per_rank * h * n_hc * p", "bytes", "bytes",
        "one pipeline message [n, h·n_hc] (mHC widens the residual stream)")
    if v.pp:
        add("pp_send_chunks", "VPP - is_last_stage", "count", "bytes",
            "model chunks on this stage that send activations forward")
        add("pp_recv_chunks", "VPP - is_first_stage", "count", "bytes",
            "model chunks on this stage that receive activations")
    write_cp_bytes(book, v)
    if v.dispatcher == "alltoall":
        add("dispatch_send_bytes", f"dispatch_send_rows * {w} * p", "bytes", "bytes",
            "EP dispatch hidden, including the chunk a rank sends to itself")
        add("dispatch_remote_bytes", "ceiling(dispatch_send_bytes * (EP - 1) / EP)", "bytes", "bytes",
            "the part that leaves the rank under uniform routing (rounded up to whole bytes)")
        add("dispatch_probs_send_bytes", "dispatch_send_rows * p", "bytes", "bytes",
            "EP dispatch of the permuted probs")
        add("combine_send_bytes", f"expected_recv_rows * {w} * p", "bytes", "bytes",
            "EP combine hidden (expert outputs go back)")
        add("combine_remote_bytes", "ceiling(combine_send_bytes * (EP - 1) / EP)", "bytes", "bytes",
            "combine bytes that leave the rank (rounded up to whole bytes)")
        add("ep_fwd_remote_bytes", "dispatch_remote_bytes + combine_remote_bytes", "bytes",
            "bytes", "forward dispatch + combine, remote")
        add("ep_fwd_bwd_remote_bytes", "2 * ep_fwd_remote_bytes", "bytes", "bytes",
            "the four EP hidden exchanges (backward mirrors forward), remote")
        add("count_exchange_send_bytes", "E * 8", "bytes", "bytes",
            "per-expert token counts, an int64 vector of length E, all-gathered over tp_ep")
        add("etp_gather_send_bytes", f"expected_recv_rows * {w} * p", "bytes", "bytes",
            "ETP all-gather of the received rows (own shard)")
        add("etp_scatter_send_bytes", f"expert_gemm_rows * {w} * p", "bytes", "bytes",
            "ETP reduce-scatter of the expert partial sums (whole input)")
    elif v.dispatcher == "allgather":
        add("ag_gather_send_bytes", f"tokens_per_rank * {w} * p", "bytes", "bytes",
            "AllGather dispatcher: own hidden shard")
        add("ag_gather_recv_bytes", f"allgather_dispatch_rows * {w} * p", "bytes", "bytes",
            "AllGather dispatcher: gathered hidden over tp_ep")
        add("ag_probs_send_bytes", "tokens_per_rank * E * p", "bytes", "bytes", "probs [n, E]")
        add("ag_routing_map_send_bytes", "tokens_per_rank * E", "bytes", "bytes",
            "routing map [n, E], one byte per bool")
    else:
        add("flex_dispatch_send_bytes", f"flex_dispatch_send_rows * {w} * p", "bytes", "bytes",
            "Flex dispatch over tp_ep, before backend de-duplication")
        add("flex_dispatch_remote_bytes", "ceiling(flex_dispatch_send_bytes * (tp_ep_size - 1) / tp_ep_size)",
            "bytes", "bytes", "the part that leaves the rank (rounded up to whole bytes)")
        add("flex_combine_send_bytes", f"expert_gemm_rows * {w} * p", "bytes", "bytes",
            "Flex combine of the expert outputs")
        _add_flex_dedup(book, w)
    if v.virtual_experts:
        mats = v.mlp_matrices
        add("vex_expert_weight_bytes", f"{mats} * {w} * I * p", "bytes", "bytes",
            f"one whole routed expert ({'W1, W3, W2' if v.swiglu else 'FC1, FC2'}; virtual experts "
            "need ETP = 1): what a temporary "
            "slot receives, and the size of the replica's gradient sent back")


# A table entry's layer_kind -> the stage count of those layers that full recompute re-runs:
# the blocks, MoE and dense layers, and each counted mixer's (planner/budget/layer_kinds.py), so a
# mixer with a recomputed CP exchange of its own needs no entry here.
RECOMPUTED_LAYERS = {"blocks": "blocks_recomputed", "L_moe": "L_moe_recomputed",
                     "L_dense": "L_dense_recomputed",
                     **{kind.count: f"{kind.count}_recomputed" for kind in MIXERS
                        if kind.count and not kind.unmodelled}}


class Collectives:
    """Adds `step.<collective>.<phase>.*` predictions and their topology split, keeping a list of
    the wire/intra/inter quantities for the totals.

    `exchange` declares a collective once, by its forward: the backward follows from the table.
    `close` gives every phase of the named entries that the config did not issue its zero rows,
    with the reason: a group of one rank, or the entry's own `not_issued`.

    Given the variant, each forward of an entry with `recomputed_with` that the config's
    recompute re-runs also gets its `recompute` phase: the forward's bytes times the share of its
    layers recomputed (see `recompute_share`)."""

    def __init__(self, book: Book, variant: Variant | None = None) -> None:
        self.book = book
        self.variant = variant
        self.intra: list[str] = []
        self.inter: list[str] = []
        self._shares: set[str] = set()
        self._written: set[tuple[str, str]] = set()

    def recompute_share(self, entry: Collective) -> str | None:
        """The share of `entry`'s forward that recompute runs again, as a formula (a named
        quantity, or "1"); None when the config re-runs none of it."""
        v = self.variant
        if v is None or not entry.recomputed_with:
            return None
        if v.recompute == "selective" and entry.recomputed_with & v.recompute_modules:
            return "1"  # a selective module is recomputed in every layer that has it
        if v.recompute != "full" or "full" not in entry.recomputed_with:
            return None
        kind = entry.layer_kind
        name = f"recompute_share_{kind}"
        if name not in self._shares:
            self._shares.add(name)
            self.book.add(name, f"{RECOMPUTED_LAYERS[kind]} / Max({kind}, 1)", "share", "step",
                          f"share of the stage's {kind} layers whose forward full recompute "
                          f"re-runs in backward ({v.recompute_method} method)")
        return name

    def exchange(self, *exchanges: Exchange) -> None:
        """Issue each exchange's forward as declared and its backward as the table derives it:
        the backward phase's algorithm, and, where that is the forward's transpose, send and
        receive swapped (else the forward's figures again). Several exchanges are written phase
        by phase: every forward, then every backward, as Megatron runs them."""
        backwards = []
        for x in exchanges:
            phases = collective(x.name).phases
            forward = x.algorithm or _only(x.name, "fwd", phases["fwd"])
            transposed = TRANSPOSE[forward] in phases.get("bwd", ())
            backward = TRANSPOSE[forward] if transposed else _only(x.name, "bwd", phases.get("bwd", ()))
            self.add(x.name, "fwd", x.group, forward, x.send, x.recv, x.doc, size=x.size, split=x.split)
            figures = (x.recv, x.send) if transposed else (x.send, x.recv)
            backwards.append((x, backward, figures))
        for x, backward, (send, recv) in backwards:
            self.add(x.name, "bwd", x.group, backward, send, recv, x.back, size=x.size, split=x.split)

    def close(self, *names: str, group: str | None = None, phase: str | None = None,
              why: str | None = None) -> None:
        """Zero rows for every phase (or only `phase`) of each named entry not yet written. The
        reason: `why`, else `group` has one rank, else the entry's `not_issued`."""
        for name in names:
            entry = collective(name)
            for p in (phase,) if phase else entry.phases:
                entry.check(p)
            left = [p for p in ((phase,) if phase else entry.phases)
                    if p != RECOMPUTE and (name, p) not in self._written]
            if not left:
                continue
            reason = why or (one_rank(group) if group else self._not_issued(entry))
            for p in left:
                self._written.add((name, p))
                for part in DIRECTIONS:
                    self.book.add(f"step.{name}.{p}.{part}", "0", "bytes", "step", reason)

    def _not_issued(self, entry: Collective) -> str:
        if not entry.not_issued:
            raise UnknownCollective(f"{entry.name} has no not_issued reason in the collectives "
                                    "table: name the group of one rank that leaves it out")
        fields = {} if self.variant is None else vars(self.variant)
        return entry.not_issued.format_map(fields)

    def add(self, name: str, phase: str, group: str, algorithm: str, send: str, recv: str,
            doc: str, *, size: str | None = None, split: tuple[str, str] | None = None) -> None:
        """Issue one phase. `split` = (inter-node, intra-node) wire bytes, for collectives whose
        backend routes around the plain model (the flex backends' node de-duplication)."""
        entry = collective(name)
        entry.check(phase, group, algorithm)
        self._written.add((name, phase))
        share = self.recompute_share(entry) if phase == "fwd" else None
        if share is None:
            self._add(name, phase, group, algorithm, send, recv, doc, size, split)
            return

        def scaled(part: str, factor: str) -> str:
            # whole bytes: a per-step expectation rounded once (Flex) times a layer share
            return f"ceiling(({part}) * {factor})"

        def scaled_split(factor: str) -> tuple[str, str] | None:
            if split is None:
                return None
            return scaled(split[0], factor), scaled(split[1], factor)

        again = (send, recv) if share == "1" else (scaled(send, share), scaled(recv, share))
        again_split = split if share == "1" else scaled_split(share)
        if entry.grad_only:  # skipped by the recomputed layers' no-grad first forward
            rest = f"(1 - {share})"
            self._add(name, phase, group, algorithm, scaled(send, rest), scaled(recv, rest),
                      f"{doc} (only layers not recomputed: it needs grad)", size, scaled_split(rest))
        else:
            self._add(name, phase, group, algorithm, send, recv, doc, size, split)
        self._add(name, RECOMPUTE, group, algorithm, *again,
                  f"{doc}, run again by recompute in backward", size, again_split)

    def _add(self, name: str, phase: str, group: str, algorithm: str, send: str, recv: str,
             doc: str, size: str | None, split: tuple[str, str] | None = None) -> None:
        add, base = self.book.add, f"step.{name}.{phase}"
        where = f"over {group}, {ALGORITHMS[algorithm]}"
        s = add(f"{base}.send_bytes", send, "bytes", "step", f"{doc}; {where}")
        add(f"{base}.recv_bytes", recv, "bytes", "step", f"{doc}: received (expectation)")
        g = size if size is not None else group_size(group)
        if split:
            wire, inter = f"{split[0]} + {split[1]}", split[0]
        elif algorithm == "alltoall":
            wire = f"ceiling({s} * ({g} - 1) / {g})"
            inter = f"ceiling({s} * ({g} - {group}_on_node) / {g})"
        else:
            wire = {"allgather": f"{s} * ({g} - 1)",
                    "reduce_scatter": f"ceiling({s} * ({g} - 1) / {g})",
                    "allreduce": f"2 * ceiling({s} * ({g} - 1) / {g})", "p2p": s}[algorithm]
        w = add(f"{base}.wire_bytes", wire, "bytes", "topology",
                f"bytes this rank puts on the wire ({where}; {WHOLE_BYTES})")
        if algorithm == "p2p":  # forward to the next rank of the group, backward to the previous
            inter = f"ceiling({w} * {group}_{'prev' if phase == 'bwd' else 'next'}_offnode)"
        elif algorithm != "alltoall" and not split:
            inter = f"ceiling({w} * {group}_ring_offnode)"
        x = add(f"{base}.inter_node_bytes", inter, "bytes", "topology",
                f"wire bytes that cross nodes (node-major placement; {WHOLE_BYTES})")
        self.inter.append(x)
        self.intra.append(add(f"{base}.intra_node_bytes", f"{w} - {x}", "bytes", "topology",
                              "wire bytes that stay inside the node"))


def _only(name: str, phase: str, algorithms: tuple[str, ...]) -> str:
    if len(algorithms) != 1:
        raise UnknownCollective(f"{name}.{phase} is {' or '.join(algorithms) or 'not in the table'}: "
                                "an exchange names its forward algorithm")
    return algorithms[0]


def _add_flex_dedup(book: Book, width: str) -> None:
    """The flex backends move one copy of a token per destination rank and per destination node,
    not one per expert: DeepEP's get_dispatch_layout gives is_token_in_rank and
    num_tokens_per_rdma_rank (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/fused_a2a.py
    FusedDispatch.forward; RDMA buffers only when tp_ep spans nodes, get_buffer), HybridEP takes
    the routing map and permutes only after the exchange (HybridEPDispatch.forward), and NCCL EP's
    high-throughput backend runs HybridEP's kernels (token_dispatcher.py
    _NCCLEPManager._ensure_bootstrap names hybridep_adapter.cu). A row crosses to each remote
    destination node once, landing on the peer with its local index, which fans it out over
    NVLink; combine sums inside the node before crossing back, so it moves the same rows."""
    add = book.add
    add("flex_dest_ranks", "tp_ep_size * (1 - miss_rank)", "ranks", "bytes",
        "expected tp_ep ranks one token reaches: the ETP shards of every EP rank holding one of "
        "its k experts, ETP·EP·(1 − C(E − E/EP, k)/C(E, k)) (uniform routing)")
    add("flex_dedup_rows", "tokens_per_rank * flex_dest_ranks", "rows", "bytes",
        "rows one rank delivers per layer: one per token and destination rank, itself included "
        "(n·ETP·k before de-duplication)")
    add("flex_dedup_send_bytes", f"ceiling(flex_dedup_rows * {width} * p)", "bytes", "bytes",
        f"hidden bytes of those rows ({WHOLE_BYTES})")
    add("flex_dest_nodes", "tp_ep_nodes * (1 - miss_node)", "nodes", "topology",
        "expected nodes of the tp_ep group one token reaches, G·(1 − C(E − E/G, k)/C(E, k)) for "
        "G nodes holding E/G experts each")
    add("flex_rdma_rows", "tokens_per_rank * (tp_ep_nodes - 1) * (1 - miss_node)", "rows",
        "topology", "rows that cross nodes: one per token and remote destination node, "
        "n·(G − 1)·(1 − C(E − E/G, k)/C(E, k))")
    add("flex_nvlink_rows", "tokens_per_rank * (tp_ep_size - tp_ep_nodes) * (1 - miss_rank)",
        "rows", "topology", "NVLink deliveries: every destination rank but the source itself and "
        "each remote node's landing peer, n·(ETP·EP − G)·(1 − C(E − E/EP, k)/C(E, k)); a rank "
        "forwards, by symmetry, as many rows as are forwarded for it")
    add("flex_rdma_bytes", f"ceiling(flex_rdma_rows * {width} * p)", "bytes", "topology",
        f"hidden bytes per layer that cross nodes ({WHOLE_BYTES})")
    add("flex_nvlink_bytes", f"ceiling(flex_nvlink_rows * {width} * p)", "bytes", "topology",
        f"hidden bytes per layer over NVLink ({WHOLE_BYTES})")


def add_steps(book: Book, v: Variant) -> Collectives:
    """Per-step predictions under the measured-collective names shared with the runtime report."""
    c = Collectives(book, v)
    _dispatcher_exchanges(c, v)
    _add_grad_steps(c, v)
    _add_weight_steps(c, v)
    _router_steps(c, v)
    c.add("embd_grad_reduce", "fwd", "embd", "allreduce", "embd_sync * embedding_params * bytes_grad",
          "embd_sync * embedding_params * bytes_grad",
          "embedding-group sync of word-embedding grads (tied output, MTP copies)")
    if v.pp:
        c.exchange(Exchange("pp_activation", "pp", "pp_activation_bytes * pp_send_chunks * microbatches",
                            "pp_activation_bytes * pp_recv_chunks * microbatches",
                            "pipeline activations", "pipeline input grads"))
    c.close("pp_activation", group="pp")
    _cp_exchanges(c, v)
    add_tp_steps(c, v)
    return c


def _dispatcher_exchanges(c: Collectives, v: Variant) -> None:
    """The token dispatcher's exchanges per step (add_layer_bytes gives one layer's payloads)."""
    calls = "moe_layer_passes"
    if v.dispatcher == "alltoall":
        d, k = f"dispatch_send_bytes * {calls}", f"combine_send_bytes * {calls}"
        probs, recv = f"dispatch_probs_send_bytes * {calls}", f"expected_recv_rows * p * {calls}"
        if v.ep:
            c.exchange(Exchange("ep_dispatch_hidden", "ep", d, k, "EP dispatch hidden",
                                "EP dispatch hidden grads"),
                       Exchange("ep_combine_hidden", "ep", k, d, "EP combine hidden",
                                "EP combine hidden grads"))
            c.exchange(Exchange("ep_dispatch_probs", "ep", probs, recv, "EP dispatch of probs",
                                "EP dispatch of prob grads"))
        c.close("ep_dispatch_hidden", "ep_combine_hidden", "ep_dispatch_probs", group="ep")
        if v.tp_ep and v.capacity != "pad":
            c.add("ep_count_exchange", "fwd", "tp_ep", "allgather", f"count_exchange_send_bytes * {calls}",
                  f"tp_ep_size * count_exchange_send_bytes * {calls}", "per-expert token counts")
        c.close("ep_count_exchange", group=None if v.tp_ep else "tp_ep")
        gather, scatter = f"etp_gather_send_bytes * {calls}", f"etp_scatter_send_bytes * {calls}"
        gemm = f"expert_gemm_rows * p * {calls}"
        for x in (Exchange("etp_gather_hidden", "expt_tp", gather, f"ETP * {gather}",
                           "ETP all-gather of received rows", "its backward reduce-scatter of row grads"),
                  Exchange("etp_gather_probs", "expt_tp", recv, gemm, "ETP all-gather of probs",
                           "its backward reduce-scatter of prob grads"),
                  Exchange("etp_scatter_hidden", "expt_tp", scatter, gather,
                           "ETP reduce-scatter of expert partial sums",
                           "its backward all-gather of output grads")):
            if v.etp:
                c.exchange(x)
        c.close("etp_gather_hidden", "etp_gather_probs", "etp_scatter_hidden", group="expt_tp")
    elif v.dispatcher == "allgather":
        gs, gr = f"ag_gather_send_bytes * {calls}", f"ag_gather_recv_bytes * {calls}"
        probs, routing = f"ag_probs_send_bytes * {calls}", f"ag_routing_map_send_bytes * {calls}"
        if v.tp_ep:
            c.exchange(Exchange("ag_gather_hidden", "tp_ep", gs, gr, "AllGather dispatcher: hidden",
                                "its backward reduce-scatter"))
            c.exchange(Exchange("ag_gather_probs", "tp_ep", probs, f"tp_ep_size * {probs}",
                                "AllGather dispatcher: probs", "its backward reduce-scatter of prob grads"))
            c.add("ag_gather_routing_map", "fwd", "tp_ep", "allgather", routing,
                  f"tp_ep_size * {routing}", "routing map (no grad)")
            c.exchange(Exchange("ag_scatter_hidden", "tp_ep", gr, gs,
                                "AllGather dispatcher: reduce-scatter of outputs", "its backward all-gather"))
        c.close("ag_gather_hidden", "ag_gather_probs", "ag_gather_routing_map", "ag_scatter_hidden",
                group="tp_ep")
    else:
        if v.tp_ep:
            # one rounding per step (rows are expectations), not one per layer pass
            w, b = routed_width(v), v.flex_backend
            rows = f"ceiling(flex_dedup_rows * {w} * p * {calls})"
            split = (f"ceiling(flex_rdma_rows * {w} * p * {calls})",
                     f"ceiling(flex_nvlink_rows * {w} * p * {calls})")
            per_rank, per_node = "one row per token and destination rank", "summed per node before crossing"
            c.exchange(Exchange("ep_dispatch_hidden", "tp_ep", rows, rows, f"Flex ({b}) dispatch, {per_rank}",
                                f"Flex ({b}) dispatch grads, {per_rank}", split=split),
                       Exchange("ep_combine_hidden", "tp_ep", rows, rows, f"Flex ({b}) combine, {per_node}",
                                f"Flex ({b}) combine grads, {per_node}", split=split))
        c.close("ep_dispatch_hidden", "ep_combine_hidden", group="tp_ep")


def _router_steps(c: Collectives, v: Variant) -> None:
    """Virtual experts' weight traffic and the routers' token-count reductions."""
    calls = "moe_layer_passes"
    if v.virtual_experts:
        if v.ep:
            weights = f"vex_slots * vex_expert_weight_bytes * {calls}"
            c.add("vex_weight_transfer", "fwd", "ep", "alltoall", weights, weights,
                  "virtual experts: a hot expert's weights copied to each temporary slot")
            grads = f"vex_slots * 3 * {routed_width(v)} * I * bytes_grad * {calls}"
            c.add("vex_grad_return", "bwd", "ep", "alltoall", grads, grads,
                  "virtual experts: each replica's fp32 weight gradient back to the owner")
        c.close("vex_weight_transfer", "vex_grad_return", group="ep")
    if v.expert_bias and v.tp_dp_cp:
        c.add("expert_bias_count_reduce", "fwd", "tp_dp_cp", "allreduce", "bias_routers * E * 8",
              "bias_routers * E * 8",
              "once per step: int64 token counts of every expert-bias router on the stage")
    c.close("expert_bias_count_reduce", group="tp_dp_cp" if v.expert_bias else None)
    if v.aux_counts:
        counts = "b * E" if v.aux_counts == "seq_aux_loss" else "E"
        c.add("aux_loss_count_reduce", "fwd", "tp_cp", "allreduce", f"{counts} * 4 * {calls}",
              f"{counts} * 4 * {calls}",
              f"{v.aux_counts} token counts (fp32), all-reduced over tp_cp in every router pass")
    c.close("aux_loss_count_reduce")


def _cp_exchanges(c: Collectives, v: Variant) -> None:
    """The context-parallel exchanges of the layer kinds present, per step, in `KINDS` order: each
    record's declarations (planner/budget/layer_kinds.py `cp_exchanges`; its per-layer payloads
    come from `cp_bytes`), then zero rows for the entries it names and did not issue. CP = 1
    issues none."""
    for kind in kinds_of(v):
        exchanges = kind.cp_exchanges(v)
        for together in exchanges.declare:
            c.exchange(*together)
        c.close(*exchanges.close, group="cp")


def _add_grad_steps(c: Collectives, v: Variant) -> None:
    """Dense grads over dp_cp, routed-expert grads over expt_dp, once per step (Megatron-LM
    dev@d48bd6be megatron/core/distributed/distributed_data_parallel.py DistributedDataParallel).

    With several distributed-optimizer instances the reduce-scatter runs inside an instance
    (intra_dp_cp / intra_expt_dp) and the shard is all-reduced across instances (inter_dist_opt).
    """
    for kind, group, inner, params, shards in (
            ("dense", "dp_cp", "intra_dp_cp", "dense_grad_params", "dense_opt_shards"),
            ("expert", "expt_dp", "intra_expt_dp", "expert_grad_params", "expert_opt_shards")):
        name, buffer = f"{kind}_grad_reduce", f"{params} * bytes_grad"
        gather = (f"{kind}_param_gather",) if v.dist_opt else ()
        fsdp = _fsdp_names(kind, v)
        if kind == "expert" and not v.expert_buffer:
            instance = ("expert_grad_instance_reduce",) if v.instances else ()
            c.close(name, *gather, *instance, *fsdp, why=NO_EXPERT_BUFFER)
            continue
        if not (v.dp_cp if kind == "dense" else v.edp):
            c.close(name, *gather, *fsdp, group=group)
            continue
        if not v.dist_opt:
            c.add(name, "fwd", group, "allreduce", buffer, buffer, f"{kind} grad buffer all-reduce")
            continue
        shard_group = inner if v.instances else group
        shard, padded = f"{kind}_shard_params", f"{kind}_buffer_params"
        if v.fsdp in ("optim_grads", "optim_grads_params"):
            c.close(name)
            c.add(f"fsdp_{kind}_grad_reduce", "bwd", shard_group, "reduce_scatter",
                  f"{padded} * bytes_grad * microbatches", f"{shard} * bytes_grad * microbatches",
                  f"Megatron-FSDP {kind} grad reduce-scatter after every microbatch's backward",
                  size=shards)
        elif v.optimizer == "muon" and not v.fsdp:
            c.add(name, "fwd", group, "allreduce", buffer, buffer, f"{kind} grad buffer all-reduce "
                  "(Muon's layer-wise distributed optimizer keeps whole grads; Megatron-LM "
                  "dev@d48bd6be megatron/core/optimizer/layer_wise_optimizer.py "
                  "LayerWiseDistributedOptimizer)")
        else:
            c.add(name, "fwd", shard_group, "reduce_scatter", f"{padded} * bytes_grad",
                  f"{shard} * bytes_grad",
                  f"{kind} grad buffer reduce-scatter (distributed optimizer)", size=shards)
        if v.fsdp == "optim_grads_params":
            c.close(f"{kind}_param_gather")
            c.exchange(Exchange(f"fsdp_{kind}_param_gather", shard_group, f"{shard} * p * microbatches",
                                f"{padded} * p * microbatches",
                                f"Megatron-FSDP {kind} parameter all-gather before each forward, every "
                                "microbatch", f"Megatron-FSDP {kind} parameter all-gather again before "
                                "backward, every microbatch", size=shards))
        elif v.fp8_param_gather and not v.fsdp:
            whole = _fp8_gather_buffers(c.book, v, kind)
            c.add(f"{kind}_param_gather", "fwd", shard_group, "allgather", f"{whole} / {shards}",
                  whole, f"{kind} parameter all-gather after the sharded update, FP8 weights at "
                  "fp8_gather_bytes_per_param (fp8_param_gather)", size=shards)
        else:
            c.add(f"{kind}_param_gather", "fwd", shard_group, "allgather", f"{shard} * p",
                  f"{padded} * p", f"{kind} parameter all-gather after the sharded update",
                  size=shards)
        if v.instances:
            c.add(f"{kind}_grad_instance_reduce", "fwd", "inter_dist_opt", "allreduce",
                  f"{shard} * bytes_grad", f"{shard} * bytes_grad",
                  "all-reduce of the grad shard across optimizer instances", size="I_opt")


# Why the expert buffer's collectives are zero when the experts share the dense buffer.
NO_EXPERT_BUFFER = ("EP 1, ETP = TP and EGTP = GTP: the routed experts share the dense grad buffer "
                    "(dense_grad_reduce moves them over dp_cp)")


def _fp8_gather_buffers(book: Book, v: Variant, kind: str) -> str:
    """Under fp8_param_gather Megatron keeps the FP8 weights in a buffer of their own (uint8
    storage), apart from the training-precision parameters, each padded and sharded alike
    (Megatron-LM dev@d48bd6be megatron/core/distributed/param_and_grad_buffer.py
    group_params_for_buffers); the sharded update's all-gather moves both. Returns the bytes of
    both whole buffers."""
    add = book.add
    if "fp8_gather_bytes_per_param" not in book.levels:
        # mxfp8 weights share the grad buffer and are gathered through its bf16 view
        # (_ParamAndGradBuffer.__init__ shared_param_grad_buffer); the other recipes gather the
        # uint8 rowwise data.
        add("fp8_gather_bytes_per_param", "2" if v.fp8_weights == "mxfp8" else "1", "bytes",
            "bytes", "bytes one FP8 weight moves in the parameter all-gather: its FP8 rowwise data"
            if v.fp8_weights != "mxfp8" else "bytes one FP8 weight moves in the parameter "
            "all-gather: mxfp8 gathers bf16 through the grad buffer and requantises after")
    fp8, pad = f"{kind}_fp8_params_on_rank", f"pad_{kind}"
    if not v.expert_buffer:  # the experts' weights sit in the dense buffers (NO_EXPERT_BUFFER)
        fp8 = "fp8_params_on_rank" if kind == "dense" else "0"
    add(f"{kind}_fp8_buffer_params", f"ceiling({fp8} / {pad}) * {pad}", "params", "memory",
        f"fp8_param_gather: the {kind} FP8-weight buffer, padded like the others")
    add(f"{kind}_hp_buffer_params", f"ceiling(({kind}_grad_params - {fp8}) / {pad}) * {pad}",
        "params", "memory", f"fp8_param_gather: the {kind} buffer of everything else (padded)")
    return (f"({kind}_fp8_buffer_params * fp8_gather_bytes_per_param"
            f" + {kind}_hp_buffer_params * p)")


def _fsdp_names(kind: str, v: Variant) -> tuple[str, ...]:
    """The Megatron-FSDP collectives a sharding strategy adds for one buffer kind."""
    names: tuple[str, ...] = ()
    if v.fsdp in ("optim_grads", "optim_grads_params"):
        names += (f"fsdp_{kind}_grad_reduce",)
    if v.fsdp == "optim_grads_params":
        names += (f"fsdp_{kind}_param_gather",)
    return names


def _add_weight_steps(c: Collectives, v: Variant) -> None:
    """GTP/EGTP weight rematerialisation (Megatron-LM main@d98e8a64 megatron/core/tensor_parallel/
    generalized_tensor_parallelism.py) and Muon's TP gather (Megatron-LM dev@d48bd6be
    megatron/core/optimizer/emerging_optimizers.py TensorParallelMuon).

    Every microbatch gathers each sliced weight twice (forward, backward) and reduce-scatters its
    whole temporary wgrad once; the gathers and the wgrad move weights in the training precision.
    Muon follows Megatron: under --muon-tp-mode duplicated TensorParallelMuon gathers each
    TP-sliced fp32 momentum whole and every TP rank runs Newton-Schulz on it; the default,
    blockwise, orthogonalises each rank's own shard and gathers nothing (newton_schulz_tp's
    partition_dim None path). The DeepSeek-V4 Megatron
    write-up's Muon all-to-all (BF16 gradients, stochastically rounded, exchanged so each rank
    holds whole expert matrices) is DeepSeek's own trainer, not Megatron's, and is not priced.
    """
    for kind, on, group, size, shard in (
            ("gtp", v.gtp, "gtp_remat", "GTP", "dense_sliced_params"),
            ("egtp", v.egtp, "expt_gtp_remat", "EGTP", "expert_params_on_rank")):
        if on:
            own, whole = f"{shard} * p * microbatches", f"{size} * {shard} * p * microbatches"
            label = kind.upper()
            c.exchange(Exchange(f"{kind}_weight_gather", group, own, whole,
                                f"{label} weight all-gather before the forward GEMMs, every microbatch",
                                f"{label} weight all-gather again for the backward, every microbatch"))
            c.add(f"{kind}_wgrad_scatter", "bwd", group, "reduce_scatter", whole, own,
                  f"{label} wgrad reduce-scatter to the permanent shard, every microbatch")
        c.close(f"{kind}_weight_gather", f"{kind}_wgrad_scatter", group=group)
    if v.gtp:
        c.add("gtp_replicated_grad_reduce", "fwd", "gtp_remat", "allreduce",
              "dense_replicated_params * bytes_grad", "dense_replicated_params * bytes_grad",
              "once per step: grads of the parameters GTP does not slice")
    c.close("gtp_replicated_grad_reduce", group="gtp_remat")
    if v.optimizer != "muon":
        return
    if v.muon_tp and v.tp:
        c.add("muon_dense_tp_gather", "fwd", "tp", "allgather", "dense_sliced_params * 4",
              "TP * dense_sliced_params * 4", "once per step: fp32 momentum of the TP-sliced "
              "dense matrices, gathered whole for Newton-Schulz")
    c.close("muon_dense_tp_gather", group="tp")
    if v.muon_tp and v.etp:
        c.add("muon_expert_tp_gather", "fwd", "expt_tp", "allgather", "expert_params_on_rank * 4",
              "ETP * expert_params_on_rank * 4", "once per step: fp32 momentum of the ETP-sliced "
              "expert matrices, gathered whole for Newton-Schulz")
    c.close("muon_expert_tp_gather", group="expt_tp")


def add_topology(book: Book, v: Variant, c: Collectives) -> None:
    add = book.add
    add("rank_node", "node", "count", "topology", "node of this rank (as the launcher places it: "
        "cluster.rank_distribution / rank_nodes)")
    a2a = "tp_ep" if v.dispatcher == "flex" else "ep"
    size = group_size(a2a)
    add(f"{a2a}_group_nodes", f"{a2a}_nodes", "count", "topology", f"nodes one {a2a} group spans")
    add(f"{a2a}_offnode_share", f"({size} - {a2a}_on_node) / {size}", "ratio", "topology",
        "share of dispatched rows whose destination is on another node (uniform routing)")
    if v.dispatcher == "alltoall":
        add("ep_rows_leaving_node", "dispatch_send_rows * ep_offnode_share", "rows", "topology",
            "dispatched rows per layer per microbatch that leave the node")
    for kind in ("cp", "dp_cp", "expt_dp"):
        add(f"{kind}_group_nodes", f"{kind}_nodes", "count", "topology",
            f"nodes one {kind} group spans")
    add("intra_node_bytes_per_step", " + ".join(c.intra) or "0", "bytes", "topology",
        "wire bytes per step that stay inside the node, all collectives")
    add("inter_node_bytes_per_step", " + ".join(c.inter) or "0", "bytes", "topology",
        "wire bytes per step that cross nodes, all collectives")


def add_hot_rank_bytes(book: Book, v: Variant) -> None:
    """The busiest rank's EP payloads at its stated-quantile rows: what it
    receives in dispatch and sends back in combine (the others' sends stay n·k rows, exact)."""
    w = routed_width(v)
    book.add("hot_dispatch_recv_bytes", f"hot_recv_rows_quantile * {w} * p", "bytes", "bytes",
             "the busiest rank's dispatch receive payload (hot_recv_rows_quantile rows)")
    book.add("hot_combine_send_bytes", f"hot_recv_rows_quantile * {w} * p", "bytes", "bytes",
             "the busiest rank's combine send payload: its expert outputs go back")
    if v.etp:
        book.add("hot_etp_gather_recv_bytes", f"hot_gemm_rows * {w} * p", "bytes", "bytes",
                 "the busiest rank's rows after the ETP all-gather")


def write(book: Book, v: Variant) -> None:
    add_layer_bytes(book, v)
    add_hot_rank_bytes(book, v)
    add_tp_bytes(book, v)
    add_topology(book, v, add_steps(book, v))

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

from planner.budget.collectives import ALGORITHMS, RECOMPUTE, Collective, collective
from planner.budget.expr import Book
from planner.budget.symbols import Variant

PAGE = "comm"

ONE_RANK = "group of one rank: no collective"
WHOLE_BYTES = "shares of a buffer and expectations are rounded up to whole bytes"
GROUP_SIZE = {"ep": "EP", "expt_tp": "ETP", "tp_ep": "tp_ep_size", "cp": "CP", "tp_cp": "(TP * CP)",
              "dp_cp": "dp_cp_size", "expt_dp": "expert_dp", "tp_dp_cp": "tp_dp_cp_size",
              "embd": "embd_size"}


def add_layer_bytes(book: Book, v: Variant) -> None:
    """Bytes per rank per MoE layer per microbatch, one direction, send payload only."""
    add = book.add
    add("pp_activation_bytes", "tokens_per_rank * h * n_hc * p", "bytes", "bytes",
        "one pipeline message [n, h·n_hc] (mHC widens the residual stream)")
    if v.pp:
        add("pp_send_chunks", "VPP - is_last_stage", "count", "bytes",
            "model chunks on this stage that send activations forward")
        add("pp_recv_chunks", "VPP - is_first_stage", "count", "bytes",
            "model chunks on this stage that receive activations")
    if v.cp_kv_gather:
        add("cp_kv_bytes", "b * S / cp_runtime * 2 * groups * d * p / TP", "bytes", "bytes",
            "local K and V of one attention layer (all-gathered over CP)")
    if v.dispatcher == "alltoall":
        add("dispatch_send_bytes", "dispatch_send_rows * h * p", "bytes", "bytes",
            "EP dispatch hidden, including the chunk a rank sends to itself")
        add("dispatch_remote_bytes", "ceiling(dispatch_send_bytes * (EP - 1) / EP)", "bytes", "bytes",
            "the part that leaves the rank under uniform routing (rounded up to whole bytes)")
        add("dispatch_probs_send_bytes", "dispatch_send_rows * p", "bytes", "bytes",
            "EP dispatch of the permuted probs")
        add("combine_send_bytes", "expected_recv_rows * h * p", "bytes", "bytes",
            "EP combine hidden (expert outputs go back)")
        add("combine_remote_bytes", "ceiling(combine_send_bytes * (EP - 1) / EP)", "bytes", "bytes",
            "combine bytes that leave the rank (rounded up to whole bytes)")
        add("ep_fwd_remote_bytes", "dispatch_remote_bytes + combine_remote_bytes", "bytes",
            "bytes", "forward dispatch + combine, remote")
        add("ep_fwd_bwd_remote_bytes", "2 * ep_fwd_remote_bytes", "bytes", "bytes",
            "the four EP hidden exchanges (backward mirrors forward), remote")
        add("count_exchange_send_bytes", "E * 8", "bytes", "bytes",
            "per-expert token counts, an int64 vector of length E, all-gathered over tp_ep")
        add("etp_gather_send_bytes", "expected_recv_rows * h * p", "bytes", "bytes",
            "ETP all-gather of the received rows (own shard)")
        add("etp_scatter_send_bytes", "expert_gemm_rows * h * p", "bytes", "bytes",
            "ETP reduce-scatter of the expert partial sums (whole input)")
    elif v.dispatcher == "allgather":
        add("ag_gather_send_bytes", "tokens_per_rank * h * p", "bytes", "bytes",
            "AllGather dispatcher: own hidden shard")
        add("ag_gather_recv_bytes", "allgather_dispatch_rows * h * p", "bytes", "bytes",
            "AllGather dispatcher: gathered hidden over tp_ep")
        add("ag_probs_send_bytes", "tokens_per_rank * E * p", "bytes", "bytes", "probs [n, E]")
        add("ag_routing_map_send_bytes", "tokens_per_rank * E", "bytes", "bytes",
            "routing map [n, E], one byte per bool")
    else:
        add("flex_dispatch_send_bytes", "flex_dispatch_send_rows * h * p", "bytes", "bytes",
            "Flex dispatch over tp_ep, before backend de-duplication")
        add("flex_dispatch_remote_bytes", "ceiling(flex_dispatch_send_bytes * (tp_ep_size - 1) / tp_ep_size)",
            "bytes", "bytes", "the part that leaves the rank (rounded up to whole bytes)")
        add("flex_combine_send_bytes", "expert_gemm_rows * h * p", "bytes", "bytes",
            "Flex combine of the expert outputs")


# A table entry's layer_kind -> the stage count of those layers that full recompute re-runs.
RECOMPUTED_LAYERS = {"blocks": "blocks_recomputed", "L_moe": "L_moe_recomputed",
                     "L_dense": "L_dense_recomputed", "L_csa": "L_csa_recomputed",
                     "L_hca": "L_hca_recomputed"}


class Collectives:
    """Adds `step.<collective>.<phase>.*` predictions and their topology split, keeping a list of
    the wire/intra/inter quantities for the totals.

    Given the variant, each forward of an entry with `recomputed_with` that the config's
    recompute re-runs also gets its `recompute` phase: the forward's bytes times the share of its
    layers recomputed (see `recompute_share`)."""

    def __init__(self, book: Book, variant: Variant | None = None) -> None:
        self.book = book
        self.variant = variant
        self.intra: list[str] = []
        self.inter: list[str] = []
        self._shares: set[str] = set()

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

    def zero(self, name: str, phase: str, why: str) -> None:
        collective(name).check(phase)
        base = f"step.{name}.{phase}"
        for part in ("send_bytes", "recv_bytes"):
            self.book.add(f"{base}.{part}", "0", "bytes", "step", why)

    def add(self, name: str, phase: str, group: str, algorithm: str, send: str, recv: str,
            doc: str, *, size: str | None = None, offnode: str | None = None) -> None:
        entry = collective(name)
        entry.check(phase, group, algorithm)
        share = self.recompute_share(entry) if phase == "fwd" else None
        if share is None:
            self._add(name, phase, group, algorithm, send, recv, doc, size, offnode)
            return
        again = (send, recv) if share == "1" else (f"({send}) * {share}", f"({recv}) * {share}")
        if entry.grad_only:  # skipped by the recomputed layers' no-grad first forward
            first = (f"({send}) * (1 - {share})", f"({recv}) * (1 - {share})")
            self._add(name, phase, group, algorithm, *first,
                      f"{doc} (only layers not recomputed: it needs grad)", size, offnode)
        else:
            self._add(name, phase, group, algorithm, send, recv, doc, size, offnode)
        self._add(name, RECOMPUTE, group, algorithm, *again,
                  f"{doc}, run again by recompute in backward", size, offnode)

    def _add(self, name: str, phase: str, group: str, algorithm: str, send: str, recv: str,
             doc: str, size: str | None, offnode: str | None) -> None:
        add, base = self.book.add, f"step.{name}.{phase}"
        g = size or GROUP_SIZE.get(group, "")
        where = f"over {group}, {ALGORITHMS[algorithm]}"
        s = add(f"{base}.send_bytes", send, "bytes", "step", f"{doc}; {where}")
        add(f"{base}.recv_bytes", recv, "bytes", "step", f"{doc}: received (expectation)")
        if algorithm == "alltoall":
            wire = f"ceiling({s} * ({g} - 1) / {g})"
            inter = f"ceiling({s} * ({g} - {group}_on_node) / {g})"
        else:
            wire = {"allgather": f"{s} * ({g} - 1)",
                    "reduce_scatter": f"ceiling({s} * ({g} - 1) / {g})",
                    "allreduce": f"2 * ceiling({s} * ({g} - 1) / {g})", "p2p": s}[algorithm]
        w = add(f"{base}.wire_bytes", wire, "bytes", "topology",
                f"bytes this rank puts on the wire ({where}; {WHOLE_BYTES})")
        if algorithm != "alltoall":
            inter = f"ceiling({w} * {offnode or group + '_ring_offnode'})"
        x = add(f"{base}.inter_node_bytes", inter, "bytes", "topology",
                f"wire bytes that cross nodes (node-major placement; {WHOLE_BYTES})")
        self.inter.append(x)
        self.intra.append(add(f"{base}.intra_node_bytes", f"{w} - {x}", "bytes", "topology",
                              "wire bytes that stay inside the node"))


def add_steps(book: Book, v: Variant) -> Collectives:
    """Per-step predictions under the measured-collective names shared with the runtime report."""
    c = Collectives(book, v)
    calls = "moe_layer_passes"
    one = ONE_RANK
    if v.dispatcher == "alltoall":
        if v.ep:
            for phase, send, recv in (("fwd", "dispatch_send_bytes", "combine_send_bytes"),
                                      ("bwd", "combine_send_bytes", "dispatch_send_bytes")):
                c.add("ep_dispatch_hidden", phase, "ep", "alltoall", f"{send} * {calls}",
                      f"{recv} * {calls}", "EP dispatch hidden" + (" grads" if phase == "bwd" else ""))
                c.add("ep_combine_hidden", phase, "ep", "alltoall", f"{recv} * {calls}",
                      f"{send} * {calls}", "EP combine hidden" + (" grads" if phase == "bwd" else ""))
            c.add("ep_dispatch_probs", "fwd", "ep", "alltoall", f"dispatch_probs_send_bytes * {calls}",
                  f"expected_recv_rows * p * {calls}", "EP dispatch of probs")
            c.add("ep_dispatch_probs", "bwd", "ep", "alltoall", f"expected_recv_rows * p * {calls}",
                  f"dispatch_probs_send_bytes * {calls}", "EP dispatch of prob grads")
        else:
            for name in ("ep_dispatch_hidden", "ep_combine_hidden", "ep_dispatch_probs"):
                for phase in ("fwd", "bwd"):
                    c.zero(name, phase, f"EP = 1: {one}")
        if v.tp_ep and v.capacity != "pad":
            c.add("ep_count_exchange", "fwd", "tp_ep", "allgather",
                  f"count_exchange_send_bytes * {calls}",
                  f"tp_ep_size * count_exchange_send_bytes * {calls}", "per-expert token counts")
        else:
            c.zero("ep_count_exchange", "fwd", "drop-and-pad fixes every split: no count exchange"
                   if v.tp_ep else f"ETP·EP = 1: {one}")
        if v.etp:
            gather, scatter = "etp_gather_send_bytes", "etp_scatter_send_bytes"
            c.add("etp_gather_hidden", "fwd", "expt_tp", "allgather", f"{gather} * {calls}",
                  f"ETP * {gather} * {calls}", "ETP all-gather of received rows")
            c.add("etp_gather_hidden", "bwd", "expt_tp", "reduce_scatter", f"{scatter} * {calls}",
                  f"{gather} * {calls}", "its backward reduce-scatter of row grads")
            c.add("etp_gather_probs", "fwd", "expt_tp", "allgather",
                  f"expected_recv_rows * p * {calls}", f"expert_gemm_rows * p * {calls}",
                  "ETP all-gather of probs")
            c.add("etp_gather_probs", "bwd", "expt_tp", "reduce_scatter",
                  f"expert_gemm_rows * p * {calls}", f"expected_recv_rows * p * {calls}",
                  "its backward reduce-scatter of prob grads")
            c.add("etp_scatter_hidden", "fwd", "expt_tp", "reduce_scatter", f"{scatter} * {calls}",
                  f"{gather} * {calls}", "ETP reduce-scatter of expert partial sums")
            c.add("etp_scatter_hidden", "bwd", "expt_tp", "allgather", f"{gather} * {calls}",
                  f"{scatter} * {calls}", "its backward all-gather of output grads")
        else:
            for name in ("etp_gather_hidden", "etp_gather_probs", "etp_scatter_hidden"):
                for phase in ("fwd", "bwd"):
                    c.zero(name, phase, f"ETP = 1: {one}")
    elif v.dispatcher == "allgather":
        names = (("ag_gather_hidden", ("fwd", "bwd")), ("ag_gather_probs", ("fwd", "bwd")),
                 ("ag_gather_routing_map", ("fwd",)), ("ag_scatter_hidden", ("fwd", "bwd")))
        if v.tp_ep:
            gs, gr = "ag_gather_send_bytes", "ag_gather_recv_bytes"
            c.add("ag_gather_hidden", "fwd", "tp_ep", "allgather", f"{gs} * {calls}",
                  f"{gr} * {calls}", "AllGather dispatcher: hidden")
            c.add("ag_gather_hidden", "bwd", "tp_ep", "reduce_scatter", f"{gr} * {calls}",
                  f"{gs} * {calls}", "its backward reduce-scatter")
            c.add("ag_gather_probs", "fwd", "tp_ep", "allgather", f"ag_probs_send_bytes * {calls}",
                  f"tp_ep_size * ag_probs_send_bytes * {calls}", "AllGather dispatcher: probs")
            c.add("ag_gather_probs", "bwd", "tp_ep", "reduce_scatter",
                  f"tp_ep_size * ag_probs_send_bytes * {calls}", f"ag_probs_send_bytes * {calls}",
                  "its backward reduce-scatter of prob grads")
            c.add("ag_gather_routing_map", "fwd", "tp_ep", "allgather",
                  f"ag_routing_map_send_bytes * {calls}",
                  f"tp_ep_size * ag_routing_map_send_bytes * {calls}", "routing map (no grad)")
            c.add("ag_scatter_hidden", "fwd", "tp_ep", "reduce_scatter", f"{gr} * {calls}",
                  f"{gs} * {calls}", "AllGather dispatcher: reduce-scatter of outputs")
            c.add("ag_scatter_hidden", "bwd", "tp_ep", "allgather", f"{gs} * {calls}",
                  f"{gr} * {calls}", "its backward all-gather")
        else:
            for name, phases in names:
                for phase in phases:
                    c.zero(name, phase, f"ETP·EP = 1: {one}")
    else:
        if v.tp_ep:
            for phase, send, recv in (("fwd", "flex_dispatch_send_bytes", "flex_combine_send_bytes"),
                                      ("bwd", "flex_combine_send_bytes", "flex_dispatch_send_bytes")):
                c.add("ep_dispatch_hidden", phase, "tp_ep", "alltoall", f"{send} * {calls}",
                      f"{recv} * {calls}", "Flex dispatch (no backend de-duplication)")
                c.add("ep_combine_hidden", phase, "tp_ep", "alltoall", f"{recv} * {calls}",
                      f"{send} * {calls}", "Flex combine")
        else:
            for name in ("ep_dispatch_hidden", "ep_combine_hidden"):
                for phase in ("fwd", "bwd"):
                    c.zero(name, phase, f"ETP·EP = 1: {one}")
    _add_grad_steps(c, v)
    if v.expert_bias and v.tp_dp_cp:
        c.add("expert_bias_count_reduce", "fwd", "tp_dp_cp", "allreduce", "bias_routers * E * 8",
              "bias_routers * E * 8",
              "once per step: int64 token counts of every expert-bias router on the stage")
    else:
        c.zero("expert_bias_count_reduce", "fwd", "no expert bias" if not v.expert_bias
               else f"tp_dp_cp = 1: {one}")
    if v.aux_counts:
        counts = "b * E" if v.aux_counts == "seq_aux_loss" else "E"
        c.add("aux_loss_count_reduce", "fwd", "tp_cp", "allreduce", f"{counts} * 4 * {calls}",
              f"{counts} * 4 * {calls}",
              f"{v.aux_counts} token counts (fp32), all-reduced over tp_cp in every router pass")
    else:
        c.zero("aux_loss_count_reduce", "fwd", "no aux loss, or TP·CP = 1: nothing to sum")
    c.add("embd_grad_reduce", "fwd", "embd", "allreduce", "embd_sync * embedding_params * bytes_grad",
          "embd_sync * embedding_params * bytes_grad",
          "embedding-group sync of word-embedding grads (tied output, MTP copies)")
    if v.pp:
        for phase, out, into, off in (("fwd", "pp_send_chunks", "pp_recv_chunks", "pp_next_offnode"),
                                      ("bwd", "pp_recv_chunks", "pp_send_chunks", "pp_prev_offnode")):
            c.add("pp_activation", phase, "pp", "p2p",
                  f"pp_activation_bytes * {out} * microbatches",
                  f"pp_activation_bytes * {into} * microbatches",
                  "pipeline activations" if phase == "fwd" else "pipeline input grads",
                  offnode=off)
    else:
        for phase in ("fwd", "bwd"):
            c.zero("pp_activation", phase, f"PP = 1: {one}")
    if v.cp_kv_gather:
        c.add("cp_kv_gather", "fwd", "cp", "allgather", "cp_kv_bytes * blocks * microbatches",
              "CP * cp_kv_bytes * blocks * microbatches", "CP all-gather of local K and V")
        c.add("cp_kv_gather", "bwd", "cp", "reduce_scatter",
              "CP * cp_kv_bytes * blocks * microbatches", "cp_kv_bytes * blocks * microbatches",
              "its backward reduce-scatter of dK, dV")
    return c


def _add_grad_steps(c: Collectives, v: Variant) -> None:
    """Dense grads over dp_cp, routed-expert grads over expt_dp, once per step (Megatron-LM
    dev@d48bd6be megatron/core/distributed/distributed_data_parallel.py DistributedDataParallel).

    With several distributed-optimizer instances the reduce-scatter runs inside an instance
    (intra_dp_cp / intra_expt_dp) and the shard is all-reduced across instances (inter_dist_opt).
    """
    for kind, group, inner, params, shards in (
            ("dense", "dp_cp", "intra_dp_cp", "dense_params_on_rank", "dense_opt_shards"),
            ("expert", "expt_dp", "intra_expt_dp", "expert_params_on_rank", "expert_opt_shards")):
        name, buffer = f"{kind}_grad_reduce", f"{params} * bytes_grad"
        if not (v.dp_cp if kind == "dense" else v.edp):
            c.zero(name, "fwd", f"{group} = 1: {ONE_RANK}")
            if v.dist_opt:
                c.zero(f"{kind}_param_gather", "fwd", f"{group} = 1: {ONE_RANK}")
            continue
        if not v.dist_opt:
            c.add(name, "fwd", group, "allreduce", buffer, buffer, f"{kind} grad buffer all-reduce")
            continue
        shard_group = inner if v.instances else group
        shard, padded = f"{kind}_shard_params", f"{kind}_buffer_params"
        c.add(name, "fwd", shard_group, "reduce_scatter", f"{padded} * bytes_grad",
              f"{shard} * bytes_grad", f"{kind} grad buffer reduce-scatter (distributed optimizer)",
              size=shards)
        c.add(f"{kind}_param_gather", "fwd", shard_group, "allgather", f"{shard} * p",
              f"{padded} * p", f"{kind} parameter all-gather after the sharded update", size=shards)
        if v.instances:
            c.add(f"{kind}_grad_instance_reduce", "fwd", "inter_dist_opt", "allreduce",
                  f"{shard} * bytes_grad", f"{shard} * bytes_grad",
                  "all-reduce of the grad shard across optimizer instances", size="I_opt")


def add_topology(book: Book, v: Variant, c: Collectives) -> None:
    add = book.add
    add("rank_node", "node", "count", "topology", "node of this rank (rank // gpus_per_node)")
    a2a = "tp_ep" if v.dispatcher == "flex" else "ep"
    size = GROUP_SIZE[a2a]
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


def write(book: Book, v: Variant) -> None:
    add_layer_bytes(book, v)
    add_topology(book, v, add_steps(book, v))

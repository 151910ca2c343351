"""Formulas for the layout, token rows, bytes per collective, per-step predictions, the topology
split and gradient scaling (SPEC §3–§8, §12, §14; megatron-reference §3, §5).

Conventions: rows and bytes are per rank, per MoE layer, per microbatch unless the name starts with
`step.` (one optimizer step: × MoE layers on the stage × microbatches). Routing is uniform, so
received rows and remote shares are expectations; sent rows are exact (n·k, or E·c with drop-and-pad).
Wire bytes assume ring algorithms for all-gather, reduce-scatter and all-reduce, direct sends for
all-to-all and pipeline p2p. A collective over a one-rank group is not issued and predicts 0 bytes.
"""

from __future__ import annotations

from planner.accounting_expr import Book
from planner.accounting_symbols import Variant

ALGORITHMS = {
    "alltoall": "all-to-all, direct sends",
    "allgather": "ring all-gather: (G-1) shards on the wire",
    "reduce_scatter": "ring reduce-scatter: (G-1)/G of the input on the wire",
    "allreduce": "ring all-reduce: 2(G-1)/G of the input on the wire",
    "p2p": "point-to-point send",
}
ONE_RANK = "group of one rank: no collective"
GROUP_SIZE = {"ep": "EP", "expt_tp": "ETP", "tp_ep": "tp_ep_size", "cp": "CP", "tp_cp": "(TP * CP)",
              "dp_cp": "dp_cp_size", "expt_dp": "expert_dp", "tp_dp_cp": "tp_dp_cp_size",
              "embd": "embd_size"}


def add_layout(book: Book, v: Variant) -> None:
    add = book.add
    add("dense_dp", "N / (TP * CP * PP * GTP)", "ranks", "layout",
        "attention data-parallel size D_a (dense weight replicas D_w); EP never enters it")
    add("expert_dp", "N / (ETP * EP * PP * EGTP)", "ranks", "layout",
        "expert data-parallel size D_e; CP never enters the expert grid")
    add("ranks_per_stage", "N / PP", "ranks", "layout", "ranks holding one pipeline stage")
    add("experts_per_rank", "E / EP", "experts", "layout", "routed experts per rank per MoE layer")
    add("dp_cp_size", "dense_dp * CP", "ranks", "layout",
        "dense gradient group dp_cp: CP ranks hold the same parameters, so they reduce together")
    add("tp_ep_size", "ETP * EP", "ranks", "layout", "the dispatcher's expert tp_ep domain")
    add("tp_dp_cp_size", "TP * GTP * dense_dp * CP", "ranks", "layout",
        "tp_dp_cp group (expert-bias token counts, global aux loss)")
    add("weight_replicas", "dense_dp", "ranks", "layout", "D_w: dense weight replicas (GTP axis excluded)")
    add("cp_runtime", "CP * q_s", "ranks", "layout",
        "CP_runtime = C · q_s: GTP sequence shards enlarge the context split (SPEC §12)")
    add("batch_replicas", "weight_replicas * GTP / q_s", "ranks", "layout",
        "D_batch = D_w · R / q_s: ranks that see different samples")
    add("microbatches", "B / (b * batch_replicas)", "count", "layout",
        "m = B / (b · D_batch); CP, EP and ETP add no independent samples")
    add("tokens_per_step", "B * S", "tokens", "layout", "tokens in one global batch")
    add("moe_layers", "L_moe", "count", "layout", "MoE layers on this stage (MTP blocks included)")
    add("moe_layer_passes", "moe_layers * microbatches", "count", "layout",
        "MoE layer forward passes per optimizer step on this rank")


def add_rows(book: Book, v: Variant) -> None:
    add = book.add
    add("tokens_per_rank", "b * S / (cp_runtime * TP_seq)", "rows", "rows",
        "n: local token rows per microbatch (CP and SP already applied)")
    add("assignments_per_rank", "tokens_per_rank * k", "rows", "rows", "n·k routed assignments")
    add("ep_group_tokens", "EP * tokens_per_rank", "rows", "rows", "unique tokens in one EP group")
    add("ep_group_assignments", "ep_group_tokens * k", "rows", "rows", "assignments in one EP group")
    add("expected_rows_per_expert", "ep_group_assignments / E", "rows", "rows",
        "rows routed to one expert from its EP group (uniform routing, before capacity)")
    if v.capacity != "dropless":
        add("capacity", "ceiling(assignments_per_rank / E * cf)", "rows", "rows",
            "c = ceil(n·k/E · factor): slots per expert per source rank")
    local = {"dropless": "expected_rows_per_expert", "pad": "EP * capacity",
             "drop": "Min(expected_rows_per_expert, EP * capacity)"}[v.capacity]
    add("local_expert_rows", local, "rows", "rows",
        "rows one local expert receives over EP (drop-and-pad: EP·c, a c-block per source)")
    send = {"dropless": "assignments_per_rank", "pad": "E * capacity",
            "drop": "Min(assignments_per_rank, E * capacity)"}[v.capacity]
    add("dispatch_send_rows", send, "rows", "rows",
        "rows of the first permute = the dispatch send buffer (exact)")
    add("expected_recv_rows", "experts_per_rank * local_expert_rows", "rows", "rows",
        "rows received by the EP exchange (in expectation)")
    add("expert_gemm_rows", "ETP * expected_recv_rows", "rows", "rows",
        "rows through this rank's grouped GEMM after the ETP all-gather")
    add("allgather_dispatch_rows", "tp_ep_size * tokens_per_rank", "rows", "rows",
        "rows each rank holds after the AllGather dispatcher's gather (ETP·EP·n)")
    add("flex_topk", "ETP * k", "count", "rows",
        "Flex: physical destinations per token (each expert duplicated to its ETP shards)")
    add("flex_num_experts", "ETP * E", "count", "rows", "Flex: physical expert slots")
    if v.dispatcher == "flex":
        add("flex_dispatch_send_rows", "tokens_per_rank * flex_topk", "rows", "rows",
            "Flex: rows sent before any backend de-duplication")
    if v.ncclep:
        add("ncclep_recv_rows", "floor(ceiling(tokens_per_rank / 64) * 64 * flex_topk * rcf)", "rows",
            "rows", "NCCL EP receive capacity per rank, fixed at the first dispatch: local tokens "
            "rounded up to 64, times ETP·k and the rank capacity factor")


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
        add("dispatch_remote_bytes", "dispatch_send_bytes * (EP - 1) / EP", "bytes", "bytes",
            "the part that leaves the rank under uniform routing")
        add("dispatch_probs_send_bytes", "dispatch_send_rows * p", "bytes", "bytes",
            "EP dispatch of the permuted probs")
        add("combine_send_bytes", "expected_recv_rows * h * p", "bytes", "bytes",
            "EP combine hidden (expert outputs go back)")
        add("combine_remote_bytes", "combine_send_bytes * (EP - 1) / EP", "bytes", "bytes",
            "combine bytes that leave the rank")
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
        add("flex_dispatch_remote_bytes", "flex_dispatch_send_bytes * (tp_ep_size - 1) / tp_ep_size",
            "bytes", "bytes", "the part that leaves the rank")
        add("flex_combine_send_bytes", "expert_gemm_rows * h * p", "bytes", "bytes",
            "Flex combine of the expert outputs")


class Collectives:
    """Adds `step.<collective>.<phase>.*` predictions and their topology split, keeping a list of
    the wire/intra/inter quantities for the totals."""

    def __init__(self, book: Book) -> None:
        self.book = book
        self.intra: list[str] = []
        self.inter: list[str] = []

    def zero(self, collective: str, phase: str, why: str) -> None:
        base = f"step.{collective}.{phase}"
        for part in ("send_bytes", "recv_bytes"):
            self.book.add(f"{base}.{part}", "0", "bytes", "step", why)

    def add(self, collective: str, phase: str, group: str, algorithm: str, send: str, recv: str,
            doc: str, *, size: str | None = None, offnode: str | None = None) -> None:
        add, base = self.book.add, f"step.{collective}.{phase}"
        g = size or GROUP_SIZE.get(group, "")
        where = f"over {group}, {ALGORITHMS[algorithm]}"
        s = add(f"{base}.send_bytes", send, "bytes", "step", f"{doc}; {where}")
        add(f"{base}.recv_bytes", recv, "bytes", "step", f"{doc}: received (expectation)")
        if algorithm == "alltoall":
            wire = f"{s} * ({g} - 1) / {g}"
            inter = f"{s} * ({g} - {group}_on_node) / {g}"
        else:
            wire = {"allgather": f"{s} * ({g} - 1)", "reduce_scatter": f"{s} * ({g} - 1) / {g}",
                    "allreduce": f"2 * {s} * ({g} - 1) / {g}", "p2p": s}[algorithm]
        w = add(f"{base}.wire_bytes", wire, "bytes", "topology",
                f"bytes this rank puts on the wire ({where})")
        if algorithm != "alltoall":
            inter = f"{w} * {offnode or group + '_ring_offnode'}"
        x = add(f"{base}.inter_node_bytes", inter, "bytes", "topology",
                "wire bytes that cross nodes (node-major placement)")
        self.inter.append(x)
        self.intra.append(add(f"{base}.intra_node_bytes", f"{w} - {x}", "bytes", "topology",
                              "wire bytes that stay inside the node"))


def add_steps(book: Book, v: Variant) -> Collectives:
    """Per-step predictions under the measured-collective names shared with the runtime report."""
    c = Collectives(book)
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
    """Dense grads over dp_cp, routed-expert grads over expt_dp (SPEC §8), once per step.

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
        shard = f"{kind}_shard_params"
        padded = f"{shard} * {shards}"
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


def add_scaling(book: Book, v: Variant) -> None:
    """Gradient pre-scale factors (megatron-reference §3.2/3.3, PR #7165's R_e/R correction)."""
    add = book.add
    add("gtp_expert_correction", "EGTP / GTP", "ratio", "scaling",
        "R_e/R: expert pre-scale correction when GTP != EGTP")
    if v.per_token_loss:
        add("grad_scale_sum_dense", "1", "ratio", "scaling", "per-token loss: SUM, no pre-scale")
        add("grad_scale_sum_expert", "1", "ratio", "scaling", "per-token loss: SUM, no pre-scale")
        add("grad_scale_per_token", "1 / tokens_per_step", "ratio", "scaling",
            "final scale by the valid tokens of the step (all tokens valid)")
        return
    add("grad_scale_sum_dense", "1 / dp_cp_size", "ratio", "scaling",
        "dense pre-scale before a SUM over dp_cp")
    add("grad_scale_sum_expert", "1 / dp_cp_size * EGTP / GTP", "ratio", "scaling",
        "expert pre-scale before a SUM over expt_dp: the same 1/|DP×CP| (× R_e/R)")
    add("grad_scale_avg_dense", "1", "ratio", "scaling", "dense pre-scale before an AVG over dp_cp")
    add("grad_scale_avg_expert", "expert_dp / dp_cp_size * EGTP / GTP", "ratio", "scaling",
        "expert pre-scale before an AVG over expt_dp (the AVG then divides by |EDP|)")
    add("grad_scale_total_dense", "grad_scale_sum_dense / GTP", "ratio", "scaling",
        "net dense scale after the GTP completion (mean over all data ranks)")
    add("grad_scale_total_expert", "grad_scale_sum_expert / EGTP", "ratio", "scaling",
        "net expert scale after the EGTP completion; equals the dense one")

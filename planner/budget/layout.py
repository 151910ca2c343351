"""Page 1, layout and token rows: the data-parallel sizes, microbatches and the rows one rank
routes, receives and pushes through its grouped GEMM (Megatron-LM dev@d48bd6be
megatron/core/transformer/moe/token_dispatcher.py, megatron/training/arguments.py validate_args).

Rows are per rank, per MoE layer, per microbatch. Routing is uniform, so received rows are
expectations; sent rows are exact (n·k, or E·c with drop-and-pad).
"""

from __future__ import annotations

from planner.budget.expr import Book
from planner.budget.variant import Variant

PAGE = "layout"


def write(book: Book, v: Variant) -> None:
    add_layout(book, v)
    add_rows(book, v)
    add_hot_rank_rows(book, v)
    add_packing(book, v)


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
        "CP_runtime = C · q_s: GTP sequence shards enlarge the context split")
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
    if v.quant_pad:
        add("gemm_rows_padded", "experts_per_rank * ceiling(expert_gemm_rows / (experts_per_rank"
            " * q_align)) * q_align", "rows", "rows",
            "grouped-GEMM rows with each local expert's (expected) rows padded to a multiple of "
            "q_align for fp8/fp4 (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/"
            "experts.py TEGroupedMLP.forward's quantization_padding; HybridEP and NCCL EP pad in "
            "the dispatcher instead, moe_utils.py skip_routed_expert_padding)")
    if v.ncclep:
        budget = "floor(ceiling(tokens_per_rank / 64) * 64 * flex_topk * rcf)"
        if v.quant_pad:
            budget = f"ceiling({budget} / q_align) * q_align"
        add("ncclep_recv_rows", budget, "rows",
            "rows", "NCCL EP receive capacity per rank, fixed at the first dispatch: local tokens "
            "rounded up to 64, times ETP·k and the rank capacity factor"
            + (", rounded up to q_align (fp8/fp4)" if v.quant_pad else ""))


# --- which packed length the budgets take (THD packing of variable lengths).
PACKED_BASIS = {
    "": "fixed length: every microbatch holds b·seq_length tokens (no training.packed_lengths)",
    "max": "the longest packed microbatch of training.packed_lengths (memory-safe: every "
           "per-microbatch figure is its upper bound)",
    "mean": "the mean packed microbatch of training.packed_lengths, rounded up (typical step "
            "time; memory may peak above it)",
}


def add_packing(book: Book, v: Variant) -> None:
    """Say which microbatch length every row, byte, memory and time figure is computed for.
    Attention FLOPs then treat the packed microbatch as one sequence: an upper bound, since
    packed THD attends within each sequence only (Megatron-LM dev@d48bd6be
    megatron/core/datasets/data_schedule.py packs whole sequences with cu_seqlens)."""
    book.add("packed_tokens_per_microbatch", "b * S", "tokens", "layout", PACKED_BASIS[v.packed_basis])


# --- the busiest rank's received rows, not only the uniform expectation.
# Capacity dropping caps them at EP·c per local expert (pad: exactly that).
HOT_CAP = {"dropless": "", "drop": "experts_per_rank * EP * capacity",
           "pad": "experts_per_rank * EP * capacity"}


def add_hot_rank_rows(book: Book, v: Variant) -> None:
    """The hot rank's receive rows: the expectation routing_imbalance states, and a stated quantile
    (efficiency.routing_quantile) of the largest of the EP ranks' counts under uniform top-k
    routing. One token lands on k of E experts without repeats, so the number of a rank's
    L = E/EP experts it picks is hypergeometric (variance k·(L/E)(1 − L/E)(E − k)/(E − 1)); the
    EP group's tokens route independently, so a rank's count has EP·n times that variance
    (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py
    MoEAlltoAllTokenDispatcher.preprocess: output_splits are these counts, known only after the
    count exchange)."""
    add = book.add
    add("recv_rows_var", "ep_group_tokens * k * experts_per_rank / E * (1 - experts_per_rank / E)"
        " * (E - k) / Max(E - 1, 1)", "rows", "rows",
        "variance of one rank's received rows under uniform top-k routing (0 when EP = 1)")
    expect = "ceiling(imbalance_stated * expected_recv_rows)"
    quantile = f"{expect} + ceil_sqrt(recv_z2 * recv_rows_var)"
    cap = HOT_CAP[v.capacity]
    if cap:
        expect, quantile = f"Min({expect}, {cap})", f"Min({quantile}, {cap})"
    add("hot_recv_rows", expect, "rows", "rows",
        "the busiest rank's received rows in expectation: the stated routing_imbalance times the "
        "mean"
        + (" (capped at EP·c per local expert)" if cap else ""))
    add("hot_recv_rows_quantile", quantile, "rows", "rows",
        "the busiest rank's received rows at the stated quantile: the expectation plus z·σ of "
        "uniform routing, z = Φ⁻¹(q^(1/EP))" + (" (capped at EP·c per local expert)" if cap else ""))
    add("hot_gemm_rows", "ETP * hot_recv_rows_quantile", "rows", "rows",
        "the busiest rank's grouped-GEMM rows at the stated quantile (after the ETP all-gather)")

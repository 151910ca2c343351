"""Part of page 3 (comm): tensor- and sequence-parallel traffic and the global aux loss's counts.

Every linear of attention, the shared expert, the dense MLP, MTP's eh_proj and the output layer is
split over TP (Megatron-LM dev@d48bd6be megatron/core/tensor_parallel/layers.py
ColumnParallelLinear, RowParallelLinear; megatron/core/tensor_parallel/mappings.py):

* with sequence parallelism each column-parallel linear all-gathers its [s/TP, b, w] input
  (backward: reduce-scatter of the input grad, and a second all-gather of the stored shard for the
  weight gradient), each row-parallel linear reduce-scatters its output (backward: all-gather);
* without it, the row-parallel output is all-reduced forward and the column-parallel input grad
  backward.

The routed experts are not here: the dispatcher moves their rows over ep / tp_ep / expt_tp. The
vocab-parallel embedding sums its output over TP, the cross entropy all-reduces three [s, b] fp32
vectors per loss, and sequence parallelism leaves the grads of TP-replicated parameters partial
(one all-reduce per step). DeepSeek-V4 attention has no TP implementation (rule V4001), so its
attention contributes nothing. Bytes are per rank; `*_width` quantities are element widths summed
over the stage's linears, per token row.
"""

from __future__ import annotations

from typing import Protocol

from planner.budget.collectives import Exchange
from planner.budget.expr import Book
from planner.budget.variant import Variant


class Collectives(Protocol):
    """What planner/budget/comm.py's `Collectives` offers (imported there, so not importable here)."""

    def exchange(self, *exchanges: Exchange) -> None: ...

    def close(self, *names: str, group: str | None = None, phase: str | None = None) -> None: ...

    def add(self, name: str, phase: str, group: str, algorithm: str, send: str, recv: str,
            doc: str) -> None: ...

# Element widths of attention's column-parallel linear inputs and its row-parallel output. MLA:
# the down projections are duplicated over TP (no collective); the q and kv up projections (or
# the whole q projection without a query LoRA) are column-parallel, and with SP the rotary key
# part is gathered on its own (Megatron-LM dev@d48bd6be
# megatron/core/transformer/multi_latent_attention.py MLASelfAttention.get_query_key_value_tensors).
ATTENTION_IN = {"standard": "h", "mla": "{q} + kv_lora", "dsv4_hybrid": "0"}
ATTENTION_OUT = {"standard": "h", "mla": "h", "dsv4_hybrid": "0"}


def add_tp_bytes(book: Book, v: Variant) -> None:
    """Widths and per-microbatch bytes of the TP collectives on one rank of a stage."""
    if not v.tp:
        return
    add = book.add
    q_in = "q_lora" if v.mla_q_lora else "h"
    add("tp_seq_rows", "b * S / cp_runtime", "rows", "bytes",
        "token rows of one CP-local sequence: what a TP group's linears see whole")
    add("tp_attention_in_width", ATTENTION_IN[v.attention].replace("{q}", q_in), "elements", "bytes",
        f"{v.attention} attention: input widths of its column-parallel linears"
        + (" (V4 attention needs TP = 1)" if v.attention == "dsv4_hybrid" else ""))
    add("tp_attention_out_width", ATTENTION_OUT[v.attention], "elements", "bytes",
        f"{v.attention} attention: output width of its row-parallel projection")
    add("tp_mlp_pairs", "moe_layers * Min(I_s, 1) + L_dense", "count", "bytes",
        "TP-split MLPs on the stage (FC1 column-, FC2 row-parallel): shared experts and dense MLPs")
    add("tp_loss_heads", "has_output + L_mtp", "count", "bytes",
        "output-layer and cross-entropy passes per microbatch (the main loss and each MTP depth)")
    add("tp_column_width", "blocks * tp_attention_in_width + tp_mlp_pairs * h"
        " + L_mtp * (1 + n_hc) * h + tp_loss_heads * h", "elements", "bytes",
        "input widths of every column-parallel linear on the stage (attention, FC1, MTP eh_proj "
        "[embedding, hidden·n_hc], output layer)")
    add("tp_row_width", "blocks * tp_attention_out_width + tp_mlp_pairs * h", "elements", "bytes",
        "output widths of every row-parallel linear on the stage (attention proj, FC2)")
    add("tp_embedding_bytes", "(has_embedding + L_mtp) * tp_seq_rows * h * p", "bytes", "bytes",
        "vocab-parallel embedding outputs [s, b, h] to sum over TP (input embedding, MTP depths)")
    add("tp_mtp_gather_send_bytes", "L_mtp * tp_seq_rows * n_hc * h / TP * p", "bytes", "bytes",
        "MTP eh_proj output shards [s, b, n_hc·h/TP] gathered along the hidden dimension")
    add("tp_xent_bytes", "3 * tp_loss_heads * tp_seq_rows * 4", "bytes", "bytes",
        "cross entropy: logit max, target logit and exp-sum, each [s, b] fp32, per loss")
    if v.qkv_gather:
        add("tp_qkv_gather_send_bytes", "blocks * tp_seq_rows * (heads + 2 * groups) * d / TP * p",
            "bytes", "bytes", "fewer query groups than TP: this rank's QKV projection output of "
            "every attention block, [s, b, (heads + 2·groups)·d / TP], gathered whole over TP")
    if v.sp:
        rope = " + blocks * qk_rope" if v.attention == "mla" else ""
        add("tp_sp_gather_width", f"tp_column_width{rope}", "elements", "bytes",
            "widths all-gathered over the sequence: the column-parallel inputs"
            + (" and MLA's rotary key" if rope else ""))
        wgrad = "tp_column_width - moe_layers * Min(I_s, 1) * h" if v.shared_overlap else "tp_column_width"
        add("tp_sp_wgrad_width", wgrad, "elements", "bytes",
            "column-parallel inputs re-gathered for the weight gradient" + (
                " (the overlapped shared expert keeps its gathered input: not re-gathered)"
                if v.shared_overlap else ""))
        add("tp_sp_gather_send_bytes", "tokens_per_rank * tp_sp_gather_width * p", "bytes", "bytes",
            "SP all-gather: this rank's sequence shard of every gathered input")
        add("tp_sp_wgrad_send_bytes", "tokens_per_rank * tp_sp_wgrad_width * p", "bytes", "bytes",
            "SP backward re-gather for weight grads: this rank's shard")
        add("tp_sp_scatter_recv_bytes", "tokens_per_rank * tp_row_width * p", "bytes", "bytes",
            "SP reduce-scatter: this rank's shard of every row-parallel output")
    else:
        add("tp_allreduce_fwd_bytes", "tokens_per_rank * tp_row_width * p", "bytes", "bytes",
            "TP all-reduce of every row-parallel output [s, b, h]")
        add("tp_allreduce_bwd_bytes", "tokens_per_rank * tp_column_width * p", "bytes", "bytes",
            "TP all-reduce of every column-parallel input grad")


# Every TP collective, in the order the page writes them where TP = 1 issues none.
TP_COLLECTIVES = ("tp_sp_gather", "tp_sp_wgrad_gather", "tp_sp_scatter", "tp_sp_grad_reduce",
                  "tp_linear_allreduce", "tp_embedding_reduce", "tp_mtp_gather", "tp_xent_reduce",
                  "tp_qkv_gather")
M = "microbatches"


def add_tp_steps(c: Collectives, v: Variant) -> None:
    """Per-step TP predictions (× microbatches), the SP grad reduction and global-aux counts."""
    if v.tp and v.sp:
        _sp_steps(c)
    elif v.tp:
        _allreduce_steps(c)
    if v.tp:
        c.add("tp_mtp_gather", "fwd", "tp", "allgather", f"tp_mtp_gather_send_bytes * {M}",
              f"TP * tp_mtp_gather_send_bytes * {M}", "MTP eh_proj output gathered over TP")
        c.add("tp_xent_reduce", "fwd", "tp", "allreduce", f"tp_xent_bytes * {M}",
              f"tp_xent_bytes * {M}", "vocab-parallel cross-entropy all-reduces")
    if v.qkv_gather:  # only with TP > 1 (symbols.variant_of)
        q = "tp_qkv_gather_send_bytes"
        c.exchange(Exchange("tp_qkv_gather", "tp", f"{q} * {M}", f"TP * {q} * {M}",
                            "QKV projection outputs all-gathered over TP (query groups below TP)",
                            "its backward reduce-scatter of the QKV output grads"))
    c.close(*TP_COLLECTIVES, group=None if v.tp else "tp")
    if v.global_aux and v.tp_dp_cp:
        c.add("global_aux_count_reduce", "fwd", "tp_dp_cp", "allreduce", "E * 8 * moe_layer_passes",
              "E * 8 * moe_layer_passes", "global aux loss: int64 token counts in every router pass")
    c.close("global_aux_count_reduce", group="tp_dp_cp" if v.global_aux else None)


def _sp_steps(c: Collectives) -> None:
    """Sequence parallelism: gathers and scatters instead of all-reduces."""
    g, w, s = "tp_sp_gather_send_bytes", "tp_sp_wgrad_send_bytes", "tp_sp_scatter_recv_bytes"
    c.exchange(Exchange("tp_sp_gather", "tp", f"{g} * {M}", f"TP * {g} * {M}",
                        "SP all-gather of column-parallel inputs",
                        "its backward reduce-scatter of the input grads"))
    c.add("tp_sp_wgrad_gather", "bwd", "tp", "allgather", f"{w} * {M}", f"TP * {w} * {M}",
          "SP backward re-gather of stored input shards for weight grads")
    c.exchange(Exchange("tp_sp_scatter", "tp", f"TP * {s} * {M}", f"{s} * {M}",
                        "SP reduce-scatter of row-parallel outputs",
                        "its backward all-gather of the output grads"))
    c.close("tp_linear_allreduce")
    e = "tp_embedding_bytes"
    c.exchange(Exchange("tp_embedding_reduce", "tp", f"{e} * {M}", f"{e} / TP * {M}",
                        "embedding output reduce-scattered to the sequence shard",
                        "its backward all-gather of the embedding grads", algorithm="reduce_scatter"))
    c.add("tp_mtp_gather", "bwd", "tp", "allgather", f"tp_mtp_gather_send_bytes * {M}",
          f"TP * tp_mtp_gather_send_bytes * {M}",
          "backward of the sequence scatter after eh_proj: all-gather of its grad")
    c.add("tp_sp_grad_reduce", "fwd", "tp", "allreduce", "tp_replicated_params_on_rank * bytes_grad",
          "tp_replicated_params_on_rank * bytes_grad",
          "once per step: grads of TP-replicated parameters (finalize_model_grads)")


def _allreduce_steps(c: Collectives) -> None:
    """TP without sequence parallelism: the linears all-reduce; the embedding sums whole."""
    c.close("tp_sp_gather", "tp_sp_wgrad_gather", "tp_sp_scatter", "tp_sp_grad_reduce")
    # two collectives under one name: row-parallel outputs forward, column-parallel input grads
    # backward; neither is the other's transpose
    for phase in ("fwd", "bwd"):
        b = f"tp_allreduce_{phase}_bytes"
        c.add("tp_linear_allreduce", phase, "tp", "allreduce", f"{b} * {M}", f"{b} * {M}",
              "TP all-reduce of row-parallel outputs" if phase == "fwd"
              else "TP all-reduce of column-parallel input grads")
    c.add("tp_embedding_reduce", "fwd", "tp", "allreduce", f"tp_embedding_bytes * {M}",
          f"tp_embedding_bytes * {M}", "embedding output all-reduced over TP")
    c.close("tp_embedding_reduce")
    c.close("tp_mtp_gather", phase="bwd")

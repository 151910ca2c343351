"""Time-page terms of the sparse attention kernels: DeepSeek-V4's CSA/HCA with the lightning indexer
and DeepSeek-V3.2's DSA (MLA whose queries attend the keys an indexer picks).

The flops page counts these layers' FLOPs (V4: planner/budget/flops.py flops_attention_csa/hca/
swa_fwd_per_token; DSA: dense MLA, as Megatron's FLOPs figure does). Here they are split by the
kernel that runs them, so the time page prices each at its own rate instead of at the GEMM rate:

* the indexer's scoring (a q·k product per indexer head and scored key) at the attention rate,
  forward and backward (its KL loss trains it: Megatron-LM dev@d48bd6be
  megatron/core/transformer/experimental_attention_variant/dsa.py compute_dsa_indexer_loss);
* its top-k selection, memory-bound: the fp32 score of every scored key written and read once;
* the sparse attention over the selected (and window) keys, and HCA's attention over all
  compressed keys, at the attention rate times the sparse kernels' share (efficiency.
  attention_sparse);
* the rest of the layer (projections, compressors, the indexer's own projections) stays GEMMs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.budget.expr import Book

if TYPE_CHECKING:
    from planner.budget.variant import Variant


def has_indexer(v: Variant) -> bool:
    """V4 (CSA layers) or V3.2's DSA: a lightning indexer picks the keys each query attends."""
    return v.has("v4_csa") or v.has("dsa")


def write_dsa_kernels(book: Book) -> None:
    """DSA's sparse MLA attention per token: the causal average of min(index_topk, i + 1) keys."""
    add = book.add
    add("time_dsa_keys", "Min(idx_topk, S) * (1 - Min(idx_topk, S) / (2 * S))", "keys", "time",
        "keys a DSA query attends: the indexer's top-k, fewer for the first queries (causal mask)")
    add("time_dsa_core_flops", "heads * (d_qk + qk_rope + d_v) * 2 * time_dsa_keys", "FLOP", "time",
        "one DSA layer's sparse MLA attention per token: QKᵀ and softmax·V over the selected keys "
        "(dense MLA's flops_attention_core_fwd_per_token has S/2 keys)")


def _indexer_layers(v: Variant) -> tuple[str, str, str]:
    """(layers with an indexer, those full recompute re-runs, ranks duplicating its work)."""
    if v.attention == "dsv4_hybrid":
        return "L_csa", "L_csa_recomputed", "1"
    # DSA with its top-k shared across layers: only the computing layers run an indexer
    # (Megatron-LM dev@d48bd6be megatron/core/transformer/experimental_attention_variant/dsa.py
    # DSAttention.forward: a skip layer takes its source layer's top-k indices)
    layers = "L_dsa_topk" if v.has("dsa_share") else "blocks"
    return layers, layers + "_recomputed", "TP"


def write_indexer_counts(book: Book, v: Variant) -> None:
    """What the lightning indexer computes and moves per layer and token."""
    add = book.add
    if v.attention == "dsv4_hybrid":
        keys = "S / 4"
        what = "V4 CSA: the indexer scores ~S/4 compressed keys per query (the flops page's count)"
    else:
        keys = "(S + 1) / 2"
        what = ("V3.2 DSA: the indexer scores the causal (S + 1) / 2 keys per query; its weights "
                "are duplicated over TP, so every TP rank scores its whole sequence")
    add("time_indexer_keys", keys, "keys", "time", f"keys the indexer scores per query ({what})")
    add("time_indexer_score_flops", "2 * idx_heads * idx_dim * time_indexer_keys", "FLOP", "time",
        "one indexer layer's scoring per token: a q·k product per indexer head and scored key")
    add("time_indexer_projection_flops", "0" if v.attention == "dsv4_hybrid" else
        "2 * (q_lora * idx_heads * idx_dim + h * idx_dim + h * idx_heads)", "FLOP", "time",
        "DSA indexer's q, k and weight projections per token (V4's are in the flops page's layer "
        "count, priced with the attention GEMMs)")
    add("time_indexer_topk_bytes", "4 * 2 * time_indexer_keys", "bytes", "time",
        "top-k selection per indexer layer and token: each scored key's fp32 score written and "
        "read once")


def write_indexer_time(book: Book, v: Variant) -> None:
    """The lightning indexer's own time: scoring at the attention rate, top-k through HBM."""
    layers, rc, dup = _indexer_layers(v)
    book.add("time_indexer_s", f"microbatches * time_tokens_per_rank * {dup} * ("
        f"(3 * {layers} + {rc}) * time_indexer_score_flops / time_attention_rate"
        f" + (3 * {layers} + {rc}) * time_indexer_projection_flops / time_gemm_rate"
        f" + ({layers} + {rc}) * time_indexer_topk_bytes / time_hbm_rate)", "s", "time",
        "lightning indexer of the stage per step: scoring (forward, backward of its loss, "
        "recompute) at the attention rate, its projections (DSA) at the GEMM rate, top-k "
        "selection through HBM (forward and recompute)")

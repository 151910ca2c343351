"""Time-page terms of the sparse attention kernels: DeepSeek-V4's CSA/HCA with the lightning indexer
and DeepSeek-V3.2's DSA (MLA whose queries attend the keys an indexer picks).

The flops page counts these layers' FLOPs (V4: planner/budget/flops.py flops_attention_csa/hca/
swa_fwd_per_token; DSA: dense MLA over the causal half, as Megatron's FLOPs figure does). Here they
are split by the kernel that runs them, so the time page prices each at its own rate.

DeepSeek-V4 (fused kernels: an omitted --dsa-kernel-backend is cudnn for dsv4_hybrid):

* the indexer's scoring (a q·k product per indexer head and scored key) at the attention rate,
  forward and backward (its KL loss trains it: Megatron-LM dev@d48bd6be
  megatron/core/transformer/experimental_attention_variant/dsa.py compute_dsa_indexer_loss);
* its top-k selection, memory-bound: the fp32 score of every scored key written and read once;
* the sparse attention over the selected (and window) keys, and HCA's attention over all
  compressed keys, at the attention rate times the sparse kernels' share (efficiency.
  attention_sparse);
* the rest of the layer (projections, compressors, the indexer's own projections) stays GEMMs.

DSA as `emit megatron` runs it: no --dsa-kernel-backend, which Megatron-LM dev@d48bd6be
megatron/training/argument_utils.py _resolve_dsa_kernel_backend_cli_default resolves to `none`
for every variant but dsv4_hybrid, and dsa_indexer_loss_coeff unset (TransformerConfig: None, read
as 0). Then experimental_attention_variant/dsa.py DSAttention.forward runs:

* the lightning indexer under torch.no_grad (no indexer loss: forward only, no backward, its
  weights get no gradient): fused_qk_topk_naive's _compute_index_scores, an fp32 einsum over every
  key of the gathered sequence, ReLU, the weighting and the head sum, the causal mask, then topk;
* the core as _unfused_absorbed_dsa_fn: the absorbed query [heads/TP, kv_lora + qk_rope] times the
  single latent key over all S keys in fp32 (torch.matmul of q.float(), k.float()), the top-k and
  validity mask added, dsa_masking.masked_softmax in fp32 (a chain of whole-tensor elementwise
  passes over every score element), the probabilities cast to the training dtype times the latent
  value [kv_lora]. The mask saves no FLOPs: both products are dense over S keys (neither the
  causal half nor the top-k), only the probabilities are zero outside the picks.

moeplan has no dsa_kernel_backend field: the fused backends (tilelang, cudnn) that would run the
core over the top-k keys only (dsa_kernels.run_fused_absorbed_sparse_attention) and an indexer
loss (dsa_indexer_loss_coeff > 0: its backward) are left for when the schema has those fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.budget.expr import Book

if TYPE_CHECKING:
    from planner.budget.variant import Variant

# Bytes each elementwise kernel of the default DSA core moves per score element through HBM
# (Megatron-LM dev@d48bd6be megatron/core/transformer/experimental_attention_variant/dsa.py
# _unfused_absorbed_dsa_fn, dsa_masking.py masked_softmax), counted from the ATen ops a forward and
# backward of that function dispatch (views, the two matmuls and broadcast reads of the
# [b, S/CP, S] masks left out). fp32 scores: an out-of-place op reads and writes 4 bytes, a
# masked_fill also writes `~valid_mask` (the expanded bool, 1 byte) and reads it, a row reduction
# reads 4. Forward: the softmax scale (8), the index mask's add (8), three masked_fill (3 x 10), the
# validity row check (1), the max (4), the max's subtraction (8), exp (8), the sum (4), the
# division (8): 79, and the cast the value product reads (4 read, p written; none at fp32).
# Backward: the cast's gradient (p read, 4 written; none at fp32), three masked_fill gradients
# (3 x 9), the division's gradients (grad / other, self / other, the negation, their product, its
# division by other, the row sum: 8 + 8 + 8 + 12 + 8 + 4), the numerator's two gradients summed (8),
# exp's gradient (12), the subtraction's negated gradient and its row sum for the max (8 + 4), the
# max's gradient scattered into zeros (4 + 8) and summed with the subtraction's (12), the scale's
# gradient (8): 139.
DSA_CAST_BYTES = "Min(4 - p, 1) * (4 + p)"
DSA_SOFTMAX_FWD_BYTES = f"79 + {DSA_CAST_BYTES}"
DSA_SOFTMAX_BWD_BYTES = f"139 + {DSA_CAST_BYTES}"
# per (query, key) of the rank's [b, S/CP, S] index mask: torch.full writes it (4), the validity add
# reads it and the causal row mask and writes it (12), and two torch.isfinite (the row mask's in
# dsa_masking.prepare_sparse_mask_context, the index mask's), each ATen's composite x == x and
# |x| != inf (abs 8, ne 5, eq 9, their product 3): 4 + 12 + 2 x 25; the top-k scatter writes only
# the picks
DSA_MASK_BYTES = "66"
# the indexer's fp32 [S/CP, b, idx_heads, S] scores (dsa.py _compute_index_scores): ReLU (8), the
# weighting (8), the head sum's read (4); per (query, key): the sum's output (4), the causal mask's
# add (12), topk's read (4)
DSA_INDEXER_HEAD_BYTES = "20"
DSA_INDEXER_KEY_BYTES = "20"


def has_indexer(v: Variant) -> bool:
    """V4 (CSA layers) or V3.2's DSA: a lightning indexer picks the keys each query attends."""
    return v.has("v4_csa") or v.has("dsa")


def write_dsa_kernels(book: Book) -> None:
    """DSA's core as the default backend runs it: dense products over every key, no flash kernel."""
    add = book.add
    add("time_tf32_rate", "peak_bf16 / 2 * eff_gemm_bf16", "FLOP/s", "time",
        "reached rate of an fp32 torch.matmul: TF32 tensor cores (NGC's PyTorch containers set "
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1), half the dense BF16 peak on the A100/H100/B200 and "
        "MI300X datasheets, at the BF16 GEMM share")
    # the score elements are the memory page's dsa_score_elements: [b, heads/TP, S/CP, S], every
    # key of the latent key gathered over TP-SP and CP (the masks only zero the probabilities)
    add("time_dsa_score_flops", "2 * (kv_lora + qk_rope)", "FLOP", "time",
        "per score element (one head, query and key): the absorbed query times the latent key, fp32")
    add("time_dsa_value_flops", "2 * kv_lora", "FLOP", "time",
        "per score element: the probabilities times the latent value, training dtype")
    add("time_dsa_core_flops", "0", "FLOP", "time",
        "DSA's core runs no flash-attention kernel: its dense products and masked softmax are "
        "time_dsa_core_s")


def _indexer_layers(v: Variant) -> tuple[str, str, str]:
    """(layers with an indexer, those recompute re-runs, ranks duplicating its work)."""
    if v.attention == "dsv4_hybrid":
        return "L_csa", "L_csa_recomputed", "1"
    # DSA with its top-k shared across layers: only the computing layers run an indexer
    # (Megatron-LM dev@d48bd6be megatron/core/transformer/experimental_attention_variant/dsa.py
    # DSAttention.forward: a skip layer takes its source layer's top-k indices)
    layers = "L_dsa_topk" if v.has("dsa_share") else "blocks"
    return layers, _dsa_recomputed(v, layers), "TP"


def _dsa_recomputed(v: Variant, layers: str) -> str:
    """DSA layers whose core (indexer included) the backward re-runs: full recompute's, or every
    one under selective core_attn, which checkpoints DSAttention whole (Megatron-LM dev@d48bd6be
    megatron/core/transformer/experimental_attention_variant/absorbed_mla.py
    AbsorbedMLASelfAttention._checkpointed_attention_forward)."""
    if v.recompute == "selective" and "core_attn" in v.recompute_modules:
        return layers
    return layers + "_recomputed"


def write_indexer_counts(book: Book, v: Variant) -> None:
    """What the lightning indexer computes and moves per layer and token."""
    add = book.add
    if v.attention == "dsv4_hybrid":
        add("time_indexer_keys", "S / 4", "keys", "time", "keys the indexer scores per query (V4 "
            "CSA: the indexer scores ~S/4 compressed keys per query (the flops page's count))")
        add("time_indexer_score_flops", "2 * idx_heads * idx_dim * time_indexer_keys", "FLOP",
            "time", "one indexer layer's scoring per token: a q·k product per indexer head and "
            "scored key")
        add("time_indexer_projection_flops", "0", "FLOP", "time",
            "DSA indexer's q, k and weight projections per token (V4's are in the flops page's "
            "layer count, priced with the attention GEMMs)")
        add("time_indexer_topk_bytes", "4 * 2 * time_indexer_keys", "bytes", "time",
            "top-k selection per indexer layer and token: each scored key's fp32 score written and "
            "read once")
        return
    add("time_indexer_keys", "S", "keys", "time",
        "keys the DSA indexer scores per query: every key (dsa.py _compute_index_scores is a dense "
        "einsum; the causal mask is added after); its weights are duplicated over TP, so every TP "
        "rank scores its whole sequence")
    add("time_indexer_score_flops", "2 * idx_heads * idx_dim * time_indexer_keys", "FLOP", "time",
        "one indexer layer's scoring per token: a q·k product per indexer head and key, fp32 "
        "inputs")
    add("time_indexer_projection_flops",
        "2 * (q_lora * idx_heads * idx_dim + h * idx_dim + h * idx_heads)", "FLOP", "time",
        "DSA indexer's q, k and weight projections per token")
    add("time_indexer_topk_bytes", f"({DSA_INDEXER_HEAD_BYTES} * idx_heads"
        f" + {DSA_INDEXER_KEY_BYTES}) * time_indexer_keys", "bytes", "time",
        "the indexer's elementwise work per layer and token: per head and key the fp32 score's ReLU, "
        "weighting and head sum (20 bytes), per key the sum's output, the causal mask's add and "
        "topk's read (20 bytes)")


def write_indexer_time(book: Book, v: Variant) -> None:
    """The lightning indexer's own time: scoring, projections, elementwise work and top-k."""
    layers, rc, dup = _indexer_layers(v)
    if v.attention == "dsv4_hybrid":
        book.add("time_indexer_s", f"microbatches * time_tokens_per_rank * {dup} * ("
                 f"(3 * {layers} + {rc}) * time_indexer_score_flops / time_attention_rate"
                 f" + (3 * {layers} + {rc}) * time_indexer_projection_flops / time_gemm_rate"
                 f" + ({layers} + {rc}) * time_indexer_topk_bytes / time_hbm_rate)", "s", "time",
                 "lightning indexer of the stage per step: scoring (forward, backward of its loss, "
                 "recompute) at the attention rate, its projections (DSA) at the GEMM rate, top-k "
                 "selection through HBM (forward and recompute)")
        return
    book.add("time_indexer_s", f"microbatches * time_tokens_per_rank * {dup} * ({layers} + {rc})"
             " * (time_indexer_score_flops / time_tf32_rate + time_indexer_projection_flops"
             " / time_gemm_rate + time_indexer_topk_bytes / time_hbm_rate)", "s", "time",
             "DSA lightning indexer of the stage per step, forward and recompute only (torch.no_grad "
             "without an indexer loss): fp32 scoring at the TF32 rate, projections at the GEMM "
             "rate, elementwise work and top-k through HBM")


def write_dsa_core_time(book: Book, v: Variant, layers: str) -> None:
    """DSA's core on the default backend (`layers`: the stage's DSA layers, top-k-sharing ones
    included): its two dense products at their GEMM rates, the fp32 masked softmax and the index
    mask through HBM, forward, backward (2x the products) and what recompute re-runs."""
    add = book.add
    add("time_dsa_mask_elements", "dsa_score_elements * TP / heads", "count", "time",
        "per microbatch and DSA layer: the index mask [b, S/CP, S] every TP rank builds")
    add("time_dsa_core_pass_s", "dsa_score_elements * (time_dsa_score_flops / time_tf32_rate"
        " + time_dsa_value_flops / time_bf16_rate)", "s", "time",
        "one microbatch through one DSA layer's dense products (forward; the backward is twice): "
        "the fp32 score product at the TF32 rate, the value product at the BF16 rate")
    add("time_dsa_softmax_fwd_bytes", DSA_SOFTMAX_FWD_BYTES, "bytes", "time",
        "per score element, the forward's elementwise kernels between the products: scale, index "
        "mask, masked_softmax in fp32, the cast (dsa_masking.py masked_softmax)")
    add("time_dsa_softmax_bwd_bytes", DSA_SOFTMAX_BWD_BYTES, "bytes", "time",
        "per score element, their gradients in the backward")
    add("time_dsa_mask_bytes", DSA_MASK_BYTES, "bytes", "time",
        "per index-mask element: torch.full, the validity add and two torch.isfinite")
    rc = _dsa_recomputed(v, layers)
    add("time_dsa_core_s", f"microbatches * ((3 * {layers} + {rc}) * time_dsa_core_pass_s"
        f" + ({layers} * (time_dsa_softmax_fwd_bytes + time_dsa_softmax_bwd_bytes)"
        f" + {rc} * time_dsa_softmax_fwd_bytes) * dsa_score_elements / time_hbm_rate"
        f" + ({layers} + {rc}) * time_dsa_mask_elements * time_dsa_mask_bytes / time_hbm_rate)",
        "s", "time",
        "DSA cores of the stage per step (dsa_kernel_backend none): dense products over all S keys "
        "forward, backward and recompute, the masked softmax's passes over every score element "
        "and the index mask's through HBM")

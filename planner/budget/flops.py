"""Page 3, FLOPs: Megatron's own count of the floating-point operations of a step, per layer kind.

Every formula follows Megatron-LM dev@d48bd6be megatron/training/training.py
num_floating_point_operations (its `transformer_flops` path, and `_dsv4_hybrid_self_attention_flops`
for DeepSeek-V4 attention): a GEMM of m×n by n×k is 2mnk operations, each GEMM runs three times in
a step (forward, data gradient, weight gradient), causal attention counts half of the s² scores,
the logits of the model and of every MTP layer are included, recompute is not. The `*_fwd_per_token`
quantities are one forward over one token (BSHD: every sample seq_length long, so Megatron's
Σ L_i² over the batch is tokens × S); `flops_per_token` is Megatron's figure divided by the
tokens of the batch, the number that converts published TFLOP/s/GPU into tokens/s and back.
The stage rows give what one stage computes, for the time page.
"""

from __future__ import annotations

from planner.budget.expr import Book
from planner.budget.symbols import Variant

PAGE = "flops"

FWD_BWD = 3  # forward + data gradient + weight gradient


def write(book: Book, v: Variant) -> None:
    add = book.add
    fx = v.mlp_matrices  # SwiGLU stacks h -> 2·ffn and ffn -> h
    _attention(book, v)
    routed = (f"{fx} * I * k * h_moe + 2 * h * h_moe" if v.latent else f"{fx} * I * k * h")
    add("flops_moe_mlp_fwd_per_token", f"2 * ({routed} + {fx} * I_s * h)", "FLOP", "flops",
        "one MoE MLP forward per token: k routed experts"
        + (" at moe_latent_size plus the h ↔ latent projections" if v.latent else "")
        + " and the shared expert (router, permutes and activations are not counted)")
    add("flops_dense_mlp_fwd_per_token", f"2 * {fx} * f * h", "FLOP", "flops",
        "one dense MLP forward per token (ffn_hidden_size)")
    add("flops_mtp_extra_fwd_per_token", "2 * (3 * h + 2 * h * h)", "FLOP", "flops",
        "one MTP layer's own parts per token: its e/h norms and final norm (3h) and the "
        "2h → h projection (its transformer block is counted with the blocks)")
    add("flops_logits_fwd_per_token", "2 * h * V_pad", "FLOP", "flops",
        "one output-layer forward per token over the padded vocabulary (the model's, and again "
        "for each MTP layer)")
    attention = _model_attention(v)
    add("flops_fwd_per_token", f"{attention} + L_model_moe * flops_moe_mlp_fwd_per_token"
        " + L_model_dense * flops_dense_mlp_fwd_per_token"
        " + L_model_mtp * flops_mtp_extra_fwd_per_token"
        " + (1 + L_model_mtp) * flops_logits_fwd_per_token", "FLOP", "flops",
        "one forward of the whole model per token")
    add("flops_per_token", f"{FWD_BWD} * flops_fwd_per_token", "FLOP", "flops",
        "Megatron's num_floating_point_operations per token: forward, data gradient and weight "
        "gradient of every GEMM (recompute not counted)"
        + ("; with --quick-geglu the three MLP GEMMs it runs, where Megatron's figure reads "
           "args.swiglu and counts two" if v.quick_geglu else ""))
    add("flops_per_step", "flops_per_token * tokens_per_step", "FLOP", "flops",
        "Megatron's num_floating_point_operations for one global batch")
    _stage(book, v)


def _attention(book: Book, v: Variant) -> None:
    """Per-layer attention FLOPs per token: the projections (token-linear) and the core (∝ S)."""
    add = book.add
    if v.attention == "standard":
        gate = " + 2 * h * d * heads" if v.output_gate else ""
        add("flops_attention_linear_fwd_per_token", "2 * h * d * (2 * heads + 2 * groups)" + gate,
            "FLOP", "flops", "one attention layer's Q, K, V and output projections per token"
            + (" and its output gate (Megatron's gate_projection_size)" if v.output_gate else ""))
        add("flops_attention_core_fwd_per_token", "2 * heads * d * S", "FLOP", "flops",
            "one attention layer's QKᵀ and softmax·V per token: 2 GEMMs over the causal half "
            "of S keys (the /2 cancels the second GEMM)")
        if v.window:
            _window(book)
        if v.chunked:
            _chunked(book)
        if v.linear:
            add("flops_gdn_fwd_per_token", "2 * (h * (2 * la_qk + 2 * la_v + 2 * la_nv) + la_conv"
                " * (2 * la_qk + la_v) + 4 * la_nv * la_dv ** 2 + h * la_v)", "FLOP", "flops",
                "one gated DeltaNet layer per token, as Megatron's num_floating_point_operations "
                "counts it: in_proj, the short convolution, the delta rule (KKᵀ, VKᵀ, the state "
                "update and SQ over one value head each) and out_proj; token-linear, no S term")
        return
    if v.attention == "mla":
        q = ("q_lora * (h + heads * (d_qk + qk_rope) + 1)" if v.mla_q_lora
             else "h * heads * (d_qk + qk_rope)")
        add("flops_attention_linear_fwd_per_token",
            f"2 * ({q} + kv_lora * (h + heads * (d_qk + d_v) + 1) + h * qk_rope + heads * d_v * h)",
            "FLOP", "flops", "one MLA layer's projections per token: q (through q_lora when set), "
            "the kv down/up projections, the shared RoPE key and the output projection")
        add("flops_attention_core_fwd_per_token", "heads * (d_qk + qk_rope + d_v) * S", "FLOP",
            "flops", "one MLA layer's QKᵀ and softmax·V per token over the causal half of S keys")
        return
    # DeepSeek-V4: every layer has the MLA-style projections and window attention; CSA adds
    # top-k compressed keys, its compressor and the lightning indexer; HCA all compressed keys.
    add("flops_v4_projection_fwd_per_token",
        "2 * (q_lora * (h + heads * d_v + 1) + h * d_v + d_v + heads * d_v * o_lora"
        " + o_groups * o_lora * h)", "FLOP", "flops",
        "one V4 attention layer's q (through q_lora), joint KV and grouped low-rank output "
        "projections per token")
    add("flops_v4_window_fwd_per_token", "2 * 2 * heads * csa_window * d_v", "FLOP", "flops",
        "sliding-window attention per token (every V4 layer): QKᵀ and softmax·V over the window")
    add("flops_v4_csa_topk", "Min(idx_topk, floor(S / 4))", "entries", "flops",
        "compressed entries a CSA query attends (index_topk, at most S/4)")
    add("flops_v4_csa_avg_compressed", "flops_v4_csa_topk * (1 - flops_v4_csa_topk * 4 / (2 * S))",
        "entries", "flops", "average compressed entries per query under the causal mask")
    add("flops_attention_csa_fwd_per_token",
        "flops_v4_projection_fwd_per_token + 2 * (2 * heads * (csa_window + flops_v4_csa_avg_compressed)"
        " * d_v + 2 * h * 2 * d_v + 2 * h * 2 * idx_dim + q_lora * idx_heads * idx_dim"
        " + h * idx_heads + idx_heads * idx_dim * S / 4)", "FLOP", "flops",
        "one CSA layer per token: projections, window + top-k compressed attention, the "
        "overlapping compressor (2x width), the indexer's compressor, q and weight projections "
        "and its scoring of ~S/4 compressed keys")
    add("flops_attention_hca_fwd_per_token",
        "flops_v4_projection_fwd_per_token + 2 * (2 * heads * csa_window * d_v + 2 * h * d_v"
        " + heads * d_v * S / 128)", "FLOP", "flops",
        "one HCA layer per token: projections, window attention, the compressor and attention "
        "over all ~S/128 causal compressed keys (Megatron counts ratio 128)")
    add("flops_attention_swa_fwd_per_token",
        "flops_v4_projection_fwd_per_token + flops_v4_window_fwd_per_token", "FLOP", "flops",
        "one window-only V4 layer per token: projections and window attention")


def _window(book: Book) -> None:
    """Sliding-window core attention as it runs. Megatron's num_floating_point_operations has no
    window term: its figure (flops_per_token) counts window layers over the whole causal sequence
    like full ones, so these rows feed only the time page. A causal query at position i reads
    min(i + 1, K) keys, K = window_keys (left window + itself) capped at S; over S queries that
    averages K · (1 − (K − 1) / (2S))."""
    add = book.add
    add("flops_window_keys_avg", "Min(window_keys, S) * (1 - (Min(window_keys, S) - 1) / (2 * S))",
        "keys", "flops", "average keys a sliding-window query reads under the causal mask")
    add("flops_attention_window_core_fwd_per_token", "2 * 2 * heads * d * flops_window_keys_avg",
        "FLOP", "flops", "one sliding-window attention layer's QKᵀ and softmax·V per token as "
        "computed (moeplan's count; Megatron's FLOPs figure counts the layer as full attention)")
    add("flops_window_fwd_per_token", "L_model_window * (flops_attention_window_core_fwd_per_token"
        " - flops_attention_core_fwd_per_token)", "FLOP", "flops",
        "what the model's window layers change in one forward per token against Megatron's "
        "full-attention count (negative: work the window skips)")


def _chunked(book: Book) -> None:
    """Chunked attention as it runs (Llama 4's RoPE layers): a query reads the causal part of its
    own chunk of C = attention_chunk_size tokens, so the core term is Megatron's causal one over
    Min(C, S) keys instead of S (equal to it while S <= C, where chunking changes nothing).
    Megatron has no chunked attention; these rows feed only the time page."""
    add = book.add
    add("flops_attention_chunk_core_fwd_per_token", "2 * heads * d * Min(chunk_keys, S)", "FLOP",
        "flops", "one chunked-attention layer's QKᵀ and softmax·V per token over the causal half "
        "of its chunk (moeplan's count)")
    add("flops_chunk_fwd_per_token", "L_model_chunked * (flops_attention_chunk_core_fwd_per_token"
        " - flops_attention_core_fwd_per_token)", "FLOP", "flops",
        "what the model's chunked layers change in one forward per token against Megatron's "
        "full-attention count (0 while S <= attention_chunk_size)")


def _model_attention(v: Variant) -> str:
    if v.linear:
        return ("(L_model - L_model_linear) * (flops_attention_linear_fwd_per_token"
                " + flops_attention_core_fwd_per_token) + L_model_linear * flops_gdn_fwd_per_token")
    if v.attention == "dsv4_hybrid":
        return ("L_model_csa * flops_attention_csa_fwd_per_token + L_model_hca * "
                "flops_attention_hca_fwd_per_token + (L_model - L_model_csa - L_model_hca) * "
                "flops_attention_swa_fwd_per_token")
    return "L_model * (flops_attention_linear_fwd_per_token + flops_attention_core_fwd_per_token)"


def stage_attention(v: Variant, suffix: str = "") -> str:
    """The stage's attention forward FLOPs per token, over its blocks (or its recomputed ones)."""
    if v.attention == "dsv4_hybrid":
        return (f"L_csa{suffix} * flops_attention_csa_fwd_per_token + L_hca{suffix} * "
                f"flops_attention_hca_fwd_per_token + (blocks{suffix} - L_csa{suffix} - "
                f"L_hca{suffix}) * flops_attention_swa_fwd_per_token")
    blocks = "blocks_recomputed" if suffix else "blocks"
    if v.linear:
        gdn = "L_linear_recomputed" if suffix else "L_linear"
        return (f"({blocks} - {gdn}) * (flops_attention_linear_fwd_per_token"
                f" + flops_attention_core_fwd_per_token) + {gdn} * flops_gdn_fwd_per_token")
    return f"{blocks} * (flops_attention_linear_fwd_per_token + flops_attention_core_fwd_per_token)"


def _stage(book: Book, v: Variant) -> None:
    """What one stage computes per token of a microbatch (forward), by layer kind."""
    add = book.add
    add("stage_attention_fwd_flops_per_token", stage_attention(v), "FLOP", "flops",
        "attention forward of the stage's blocks per token")
    add("stage_moe_fwd_flops_per_token", "L_moe * flops_moe_mlp_fwd_per_token", "FLOP", "flops",
        "MoE MLP forward of the stage's MoE blocks per token (MTP blocks included)")
    add("stage_dense_fwd_flops_per_token", "L_dense * flops_dense_mlp_fwd_per_token", "FLOP",
        "flops", "dense MLP forward of the stage's dense blocks per token")
    add("stage_head_fwd_flops_per_token", "L_mtp * (flops_mtp_extra_fwd_per_token"
        " + flops_logits_fwd_per_token) + has_output * flops_logits_fwd_per_token", "FLOP",
        "flops", "the stage's logits (model output and each MTP layer's) and MTP projections")
    add("stage_fwd_flops_per_token", "stage_attention_fwd_flops_per_token"
        " + stage_moe_fwd_flops_per_token + stage_dense_fwd_flops_per_token"
        " + stage_head_fwd_flops_per_token", "FLOP", "flops",
        "one forward of the stage per token")
    recomputed = stage_attention(v, "_recomputed")
    add("stage_recompute_fwd_flops_per_token", f"{recomputed}"
        " + L_moe_recomputed * flops_moe_mlp_fwd_per_token"
        " + L_dense_recomputed * flops_dense_mlp_fwd_per_token", "FLOP", "flops",
        "forward FLOPs full recompute runs again in backward per token (its recomputed blocks)")

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
from planner.budget.layer_kinds import FLOPS, kinds_of, model_sum, stage_sum
from planner.budget.variant import Variant

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
    attention = model_sum(v, FLOPS)
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
    """Per-layer attention FLOPs per token: the family's projections (token-linear) and core (∝ S),
    then each kind's own rows (planner/budget/layer_kinds.py)."""
    add = book.add
    kinds = kinds_of(v)
    if v.attention == "standard":
        terms = "".join(kind.projection_flops[0] for kind in kinds)
        docs = "".join(kind.projection_flops[1] for kind in kinds)
        add("flops_attention_linear_fwd_per_token", "2 * h * d * (2 * heads + 2 * groups)" + terms,
            "FLOP", "flops", "one attention layer's Q, K, V and output projections per token" + docs)
        add("flops_attention_core_fwd_per_token", "2 * heads * d * S", "FLOP", "flops",
            "one attention layer's QKᵀ and softmax·V per token: 2 GEMMs over the causal half "
            "of S keys (the /2 cancels the second GEMM)")
    elif v.attention == "mla":
        q = ("q_lora * (h + heads * (d_qk + qk_rope) + 1)" if v.mla_q_lora
             else "h * heads * (d_qk + qk_rope)")
        add("flops_attention_linear_fwd_per_token",
            f"2 * ({q} + kv_lora * (h + heads * (d_qk + d_v) + 1) + h * qk_rope + heads * d_v * h)",
            "FLOP", "flops", "one MLA layer's projections per token: q (through q_lora when set), "
            "the kv down/up projections, the shared RoPE key and the output projection")
        add("flops_attention_core_fwd_per_token", "heads * (d_qk + qk_rope + d_v) * S", "FLOP",
            "flops", "one MLA layer's QKᵀ and softmax·V per token over the causal half of S keys")
    for kind in kinds:
        kind.flops(book, v)


def stage_attention(v: Variant, suffix: str = "") -> str:
    """The stage's attention forward FLOPs per token, over its blocks (or its recomputed ones)."""
    return stage_sum(v, FLOPS, suffix)


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

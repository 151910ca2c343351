"""Per-layer attention kinds of the current MoE architectures (gpt-oss's alternating sliding-window
and full attention, Llama 4's chunked attention on its RoPE layers, Qwen3-Next's gated DeltaNet
layers): which layers are windowed, chunked or linear and how many keys their queries read, the
inputs of those terms on the flops and time pages.

Megatron-LM dev@d48bd6be megatron/core/transformer/utils.py is_layer_window_attention decides a
layer's kind from window_size and window_attn_skip_freq (model.is_window_layer follows it);
megatron/training/training.py num_floating_point_operations has no window term (it counts every
layer's core attention over the whole causal sequence), so the window's own count is moeplan's,
stated on the flops page.
"""

from __future__ import annotations

from collections.abc import Iterable

from planner.budget.expr import Number, Symbol
from planner.config.schema import Config, ModelSection

WINDOW_SYMBOLS: tuple[Symbol, ...] = (
    Symbol("window_keys", "keys a causal sliding-window query reads at most: window_size's left "
           "part + itself (the causal mask hides the right part; 0 without a window)"),
    Symbol("L_model_window", "sliding-window attention layers of the whole model (decoder layers; "
           "MTP layers counted full)"),

    Symbol("chunk_keys", "tokens of one attention chunk (attention_chunk_size; 0 without chunking)"),
    Symbol("L_model_chunked", "chunked-attention layers of the whole model (Llama 4's RoPE layers)"),
    Symbol("L_model_linear", "gated DeltaNet (linear attention) layers of the whole model, MTP "
           "layers included, as Megatron's FLOPs formula counts them over num_layers + mtp"),
    Symbol("la_qk", "gated DeltaNet q (and k) width: linear_key_head_dim · linear_num_key_heads"),
    Symbol("la_v", "gated DeltaNet v (and gate z) width: linear_value_head_dim · linear_num_value_heads"),
    Symbol("la_nv", "gated DeltaNet value heads (linear_num_value_heads)"),
    Symbol("la_dv", "gated DeltaNet value head dimension (linear_value_head_dim)"),
    Symbol("la_conv", "gated DeltaNet short-convolution kernel (linear_conv_kernel_dim)"),
    # ---- gated DeltaNet under CP (Megatron's default linear_cp_mode 'chunkwise').
    Symbol("la_dk", "gated DeltaNet key head dimension (linear_key_head_dim)"),
    Symbol("gdn_cp_relayout", "1 when CP's zigzag layout must be converted to the contiguous one "
           "around every gated DeltaNet layer (cp_partition_mode zigzag), else 0"),
)

WINDOW_STAGE_SYMBOLS: tuple[tuple[str, str], ...] = (
    ("L_window", "sliding-window attention layers on the stage (decoder layers)"),
    ("L_window_recomputed", "sliding-window attention layers among blocks_recomputed"),
    ("L_chunked", "chunked-attention layers on the stage (decoder layers)"),
    ("L_chunked_recomputed", "chunked-attention layers among blocks_recomputed"),
    ("L_linear", "gated DeltaNet layers on the stage (decoder and MTP layers)"),
    ("L_linear_recomputed", "gated DeltaNet layers among blocks_recomputed"),
)


def window_layers(model: ModelSection, layers: Iterable[int]) -> int:
    """How many of the 0-based `layers` are sliding-window attention (MTP layers, numbered from
    num_layers, are not)."""
    return sum(1 for layer in layers if layer < model.num_layers and model.is_window_layer(layer))


def chunked_layers(model: ModelSection, layers: Iterable[int]) -> int:
    """How many of the 0-based `layers` run chunked attention (decoder layers only)."""
    return sum(1 for layer in layers if layer < model.num_layers and model.is_chunked_layer(layer))


def linear_layers(model: ModelSection, layers: Iterable[int]) -> int:
    """How many of the 0-based `layers` (MTP layers numbered from num_layers on, as Megatron's FLOPs
    formula numbers them) are gated DeltaNet layers."""
    return sum(1 for layer in layers if model.is_linear_attention_layer(layer))


def window_values(cfg: Config) -> dict[str, Number]:
    m = cfg.model
    return {"window_keys": m.window_size[0] + 1 if m.window_size else 0,
            "L_model_window": window_layers(m, range(m.num_layers)),
            "chunk_keys": m.attention_chunk_size or 0,
            "L_model_chunked": chunked_layers(m, range(m.num_layers)),
            "L_model_linear": linear_layers(m, range(m.num_layers + m.mtp_num_layers)),
            "la_qk": m.linear_key_head_dim * m.linear_num_key_heads,
            "la_v": m.linear_value_head_dim * m.linear_num_value_heads,
            "la_nv": m.linear_num_value_heads, "la_dv": m.linear_value_head_dim,
            "la_conv": m.linear_conv_kernel_dim, "la_dk": m.linear_key_head_dim,
            "gdn_cp_relayout": int(cfg.parallel.cp_partition_mode == "zigzag")}


def standard_blocks(suffix: str = "", linear: bool = False) -> str:
    """The stage's blocks with standard (softmax) attention: all but its gated DeltaNet layers."""
    blocks = "blocks_recomputed" if suffix else "blocks"
    return f"({blocks} - L_linear{suffix})" if linear else blocks


def window_core(suffix: str = "", window: bool = True, chunked: bool = False,
                linear: bool = False) -> str:
    """The time page's core attention FLOPs per token of the stage's blocks (`suffix`
    "_recomputed": its recomputed ones), the window and chunked layers at their own rows, the
    gated DeltaNet layers without any (their work is token-linear)."""
    kinds = [(f"L_window{suffix}", "flops_attention_window_core_fwd_per_token")] if window else []
    kinds += [(f"L_chunked{suffix}", "flops_attention_chunk_core_fwd_per_token")] if chunked else []
    full = " - ".join([standard_blocks(suffix, linear).strip("()"), *(count for count, _ in kinds)])
    return " + ".join([f"({full}) * flops_attention_core_fwd_per_token",
                       *(f"{count} * {row}" for count, row in kinds)])

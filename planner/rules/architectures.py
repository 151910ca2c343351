"""ARC: what Megatron refuses with the mechanisms of the current MoE architectures (gpt-oss,
GLM-4.5, MiniMax-M2, Llama 4): the NoPE pattern, the GLU offset, the L2 q/k norm."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import TRANSFORMER_CONFIG, dev

GPT_LAYER_SPECS = dev("core/models/gpt/gpt_layer_specs.py",
                      "get_gpt_layer_with_transformer_engine_submodules")


@rule(
    "ARC001", "error", "no_rope_freq must fit the layer count",
    source=TRANSFORMER_CONFIG,
    why="""Megatron expands an integer no_rope_freq N into a per-layer pattern repeated
    num_layers / N times and asserts N divides num_layers; a list must name every layer.""",
    bad="model: {no_rope_freq: 3}",
    good="model: {no_rope_freq: 4}",
)
def no_rope_pattern_fits(f: Facts) -> Iterator[Violation]:
    skip, layers = f.model.no_rope_freq, f.model.num_layers
    if isinstance(skip, int) and layers % skip:
        yield Violation("model.no_rope_freq", f"no_rope_freq {skip} does not divide num_layers {layers}",
                        f"pick a divisor of {layers} or give the 0/1 list per layer")
    elif isinstance(skip, list) and len(skip) != layers:
        yield Violation("model.no_rope_freq", f"no_rope_freq lists {len(skip)} layers, the model has "
                        f"{layers}", "give one 1 (no RoPE) or 0 per layer")


@rule(
    "ARC002", "error", "glu_linear_offset needs quick_geglu",
    source=TRANSFORMER_CONFIG,
    why="""With the fused bias-activation kernel (Megatron's default for gated MLPs) a non-zero
    glu_linear_offset is refused unless the activation is quick-GEGLU: only that kernel adds the
    offset to the linear half (gpt-oss's clamped GLU).""",
    bad="model: {glu_linear_offset: 1.0}",
    good="model: {glu_linear_offset: 1.0, quick_geglu: true}",
)
def glu_offset_needs_quick_geglu(f: Facts) -> Iterator[Violation]:
    m = f.model
    if m.glu_linear_offset != 0 and not m.quick_geglu and (m.swiglu or m.add_bias_linear):
        yield Violation("model.glu_linear_offset", f"glu_linear_offset {m.glu_linear_offset} with "
                        f"{'swiglu' if m.swiglu else 'gelu'}", "set model.quick_geglu: true or drop "
                        "the offset")


@rule(
    "ARC003", "error", "qk_l2_norm needs standard attention",
    source=GPT_LAYER_SPECS,
    why="""Megatron's layer specs assert that the L2 q/k norm is not combined with multi-latent
    attention (its MLA q/k norms are the latent RMSNorms).""",
    bad="model: {qk_l2_norm: true, multi_latent_attention: true, kv_lora_rank: 32}",
    good="model: {qk_l2_norm: true}",
)
def qk_l2_norm_standard_attention(f: Facts) -> Iterator[Violation]:
    if f.model.qk_l2_norm and f.model.attention_variant != "standard":
        yield Violation("model.qk_l2_norm", f"qk_l2_norm with attention_variant "
                        f"{f.model.attention_variant}", "drop qk_l2_norm (MLA normalises its latents)")


RULES = (no_rope_pattern_fits, glu_offset_needs_quick_geglu, qk_l2_norm_standard_attention)

"""Which fine-grained activation offload groups moeplan counts for a config, and why it cannot
count the others (OFL001, planner/rules/offload.py); planner/budget/offload.py writes their bytes."""

from __future__ import annotations

from planner.config.schema import Config

ATTENTION_GROUPS = ("attn_norm", "qkv_linear", "core_attn", "attn_proj")
MOE_GROUPS = ("mlp_norm", "expert_fc1", "moe_act")


def unmodelled_offload(cfg: Config) -> str | None:
    """Why moeplan cannot count this config's offloading (OFL001), or None when it can."""
    ov, model = cfg.overlap, cfg.model
    if not ov.fine_grained_activation_offloading:
        return None
    if ov.cuda_graph_impl != "none":
        return (f"with cuda_graph_impl {ov.cuda_graph_impl} (captured groups are delayed and "
                "partly turned off: TransformerLayer._set_offload_modules)")
    if ov.recompute_granularity == "full":
        return "with full recompute (the recomputed blocks' groups run again in backward)"
    attention = sorted(set(ov.offload_modules) & set(ATTENTION_GROUPS))
    if not attention:
        return None
    unusual = [what for what, on in (
        (f"attention_variant {model.attention_variant}", model.attention_variant == "dsv4_hybrid"),
        ("linear attention (gated DeltaNet layers)", model.linear_attention_freq is not None),
        ("attention_output_gate", model.attention_output_gate),
        ("DSA (the indexer's inputs are saved in core_attn)", model.dsa),
        ("qk_layernorm_per_layer", model.qk_layernorm_per_layer),
    ) if on]
    if unusual:
        return f"of {', '.join(attention)} with {unusual[0]}"
    return None


def offload_groups(cfg: Config) -> frozenset[str]:
    """The groups whose tensors leave the GPU, as TransformerLayer._set_offload_modules leaves
    them: standard attention's attn_norm is fused away; the rest as asked."""
    ov = cfg.overlap
    if not ov.fine_grained_activation_offloading or unmodelled_offload(cfg) is not None:
        return frozenset()
    names = set(ov.offload_modules)
    if cfg.model.attention_variant == "standard":
        names.discard("attn_norm")
    return frozenset(names)

"""Model presets with the official DeepSeek-V4 dimensions: the released V4-Pro / V4-Flash configs and
checkpoint tensor shapes, in the argument names of Megatron-LM dev@d48bd6be's DeepSeek-V4 code
(megatron/training/arguments.py, megatron/core/transformer/transformer_config.py).

A preset only fills `model` fields the user did not write; every value can be overridden.
"""

from __future__ import annotations

from typing import Any


def _compress_ratios(head: list[int], pair: list[int], repeats: int) -> list[int]:
    """Per-layer CSA/HCA ratios plus the MTP entry (0), written the way the official config does."""
    return head + pair * repeats + [0]


_V4_COMMON: dict[str, Any] = {
    "attention_variant": "dsv4_hybrid",
    "num_query_groups": 1,
    "kv_channels": 512,
    "qk_pos_emb_head_dim": 64,
    "kv_lora_rank": 448,
    "o_lora_rank": 1024,
    "csa_window_size": 128,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "vocab_size": 129280,
    "moe_router_topk": 6,
    "moe_n_hash_layers": 3,
    "mtp_num_layers": 1,
    "enable_hyper_connections": True,
    "num_residual_streams": 4,
    "mhc_sinkhorn_iterations": 20,
    "moe_router_score_function": "sqrtsoftplus",
    "moe_router_enable_expert_bias": True,
    "moe_router_bias_update_rate": 1e-3,
    "untie_embeddings_and_output_weights": True,
    "swiglu_limit": 10.0,
    "max_position_embeddings": 1048576,
    "position_embedding_type": "rope",
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "qk_layernorm": True,
    # RoPE of the released V4 configs (Pro and Flash alike): rope_theta 10000, compress_rope_theta
    # 160000 for the compressed (CSA/HCA) layers, rope_scaling yarn, factor 16 over an original
    # 65,536 positions, beta_fast 32 / beta_slow 1 (Megatron's fixed MLA defaults, so no field).
    "rope_type": "yarn",
    "rotary_base": 10000,
    "csa_compress_rotary_base": 160000.0,
    "rotary_scaling_factor": 16.0,
    "original_max_position_embeddings": 65536,
}

PRESETS: dict[str, dict[str, Any]] = {
    "deepseek-v4-pro": {
        **_V4_COMMON,
        "num_layers": 61,
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "ffn_hidden_size": 3072,
        "num_experts": 384,
        "moe_ffn_hidden_size": 3072,
        "moe_shared_expert_intermediate_size": 3072,
        "moe_router_topk_scaling_factor": 2.5,
        "q_lora_rank": 1536,
        "o_groups": 16,
        "index_topk": 1024,
        "compress_ratios": _compress_ratios([128, 128, 4], [128, 4], 29),
    },
    "deepseek-v4-flash": {
        **_V4_COMMON,
        "num_layers": 43,
        "hidden_size": 4096,
        "num_attention_heads": 64,
        "ffn_hidden_size": 2048,
        "num_experts": 256,
        "moe_ffn_hidden_size": 2048,
        "moe_shared_expert_intermediate_size": 2048,
        "moe_router_topk_scaling_factor": 1.5,
        "q_lora_rank": 1024,
        "o_groups": 8,
        "index_topk": 512,
        "compress_ratios": _compress_ratios([0, 0, 4], [128, 4], 20),
    },
}

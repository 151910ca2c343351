"""Model presets with the official DeepSeek-V4 dimensions: the released V4-Pro / V4-Flash configs and
checkpoint tensor shapes, in the argument names of Megatron-LM dev@d48bd6be's DeepSeek-V4 code
(megatron/training/arguments.py, megatron/core/transformer/transformer_config.py).

A preset only fills `model` fields the user did not write; every value can be overridden. The two
DeepSeek-V4 presets are also what `moeplan import hf` makes of the official config.json files
(tests/unit/config/test_hf_families.py holds the two equal).
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

# The models below are the published Hugging Face configs, field by field in Megatron's argument
# names (the mapping `moeplan import hf` applies; tests/unit/config/test_presets.py checks each preset equals
# that import of the same config.json). Every one is an RMSNorm + SwiGLU decoder with RoPE, untied
# embeddings, no linear biases and no dropout.
_HF_COMMON: dict[str, Any] = {
    "normalization": "RMSNorm", "swiglu": True, "position_embedding_type": "rope",
    "untie_embeddings_and_output_weights": True, "hidden_dropout": 0.0, "attention_dropout": 0.0,
    "add_bias_linear": False,
}

# Qwen3-MoE: GQA with 4 KV heads, head_dim 128, q/k RMSNorm, 128 experts top-8 with renormalised
# softmax scores, every layer MoE, no shared expert.
_QWEN3_MOE: dict[str, Any] = {
    **_HF_COMMON,
    "max_position_embeddings": 40960, "norm_epsilon": 1e-6, "rotary_base": 1000000,
    "vocab_size": 151936, "kv_channels": 128, "group_query_attention": True,
    "num_query_groups": 4, "qk_layernorm": True, "num_experts": 128, "moe_router_topk": 8,
    "moe_router_score_function": "softmax", "moe_router_pre_softmax": False, "moe_layer_freq": 1,
}

PRESETS.update({
    # deepseek-ai/DeepSeek-V3 config.json (Hugging Face): MLA (q_lora 1536, kv_lora 512, nope 128 +
    # rope 64, v 128), 3 dense layers then 58 MoE layers of 256 experts top-8 + 1 shared expert,
    # sigmoid scores with expert bias (noaux_tc), 8 groups top-4, one MTP layer, YaRN factor 40.
    # Its mscale_all_dim 1.0 has no moeplan field: pass `--mscale-all-dim 1.0` in
    # launch.megatron_extra_args (examples/deepseek-v3-1024.yaml does).
    "deepseek-v3": {
        **_HF_COMMON,
        "num_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "vocab_size": 129280,
        "max_position_embeddings": 163840, "norm_epsilon": 1e-6, "rotary_base": 10000,
        "multi_latent_attention": True, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "qk_layernorm": True,
        "ffn_hidden_size": 18432, "num_experts": 256, "moe_router_topk": 8,
        "moe_ffn_hidden_size": 2048, "moe_shared_expert_intermediate_size": 2048,
        "mtp_num_layers": 1, "moe_router_dtype": "fp32", "moe_layer_freq": [0] * 3 + [1] * 58,
        "moe_router_score_function": "sigmoid", "moe_router_topk_scaling_factor": 2.5,
        "moe_router_enable_expert_bias": True, "moe_router_num_groups": 8,
        "moe_router_group_topk": 4, "rope_type": "yarn", "rotary_scaling_factor": 40.0,
        "original_max_position_embeddings": 4096,
    },
    # Qwen/Qwen3-30B-A3B config.json (Hugging Face): 48 layers, hidden 2048, 32 heads.
    "qwen3-30b-a3b": {
        **_QWEN3_MOE,
        "num_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
        "ffn_hidden_size": 6144, "moe_ffn_hidden_size": 768,
    },
    # Qwen/Qwen3-235B-A22B config.json (Hugging Face): 94 layers, hidden 4096, 64 heads.
    "qwen3-235b-a22b": {
        **_QWEN3_MOE,
        "num_layers": 94, "hidden_size": 4096, "num_attention_heads": 64,
        "ffn_hidden_size": 12288, "moe_ffn_hidden_size": 1536,
    },
    # mistralai/Mixtral-8x7B-v0.1 config.json (Hugging Face): 32 layers, hidden 4096, 32 heads of
    # 128 with 8 KV groups, 8 experts top-2 (each a full 14336-wide MLP), every layer MoE.
    "mixtral-8x7b": {
        **_HF_COMMON,
        "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000,
        "max_position_embeddings": 32768, "norm_epsilon": 1e-5, "rotary_base": 1000000,
        "kv_channels": 128, "group_query_attention": True, "num_query_groups": 8,
        "qk_layernorm": False, "ffn_hidden_size": 14336, "moe_ffn_hidden_size": 14336,
        "num_experts": 8, "moe_router_topk": 2, "moe_layer_freq": 1,
        "moe_router_score_function": "softmax", "moe_router_pre_softmax": False,
    },
})

# ---- Current MoE architectures, from their published Hugging Face config.json (cited per model;
# tests/support/hf_configs.py holds the files and tests/unit/config/test_presets.py checks each
# preset equals `moeplan import hf` of it).
# openai/gpt-oss-20b and openai/gpt-oss-120b config.json: 64 heads of 64 with 8 KV groups, q/k/v/o
# biases and a learnable sink per head, sliding window 128 (HF: the query and 127 keys before it)
# on every other layer from layer 0, every layer MoE (32 / 128 experts top-4, biased router, top-k
# softmax), experts with biases and the clamped GLU (limit 7, linear offset 1), vocabulary 201,088;
# RoPE by YaRN, factor 32 over 4,096 positions (rope_scaling; its `truncate: false` is a launch
# argument, numerics only).
_GPT_OSS: dict[str, Any] = {
    **_HF_COMMON,
    "hidden_size": 2880, "num_attention_heads": 64, "vocab_size": 201088,
    "max_position_embeddings": 131072, "norm_epsilon": 1e-5, "rotary_base": 150000,
    "position_embedding_type": "yarn", "rotary_scaling_factor": 32.0,
    "kv_channels": 64, "group_query_attention": True, "num_query_groups": 8,
    "add_bias_linear": True, "softmax_type": "learnable", "qk_layernorm": False,
    "swiglu": False, "quick_geglu": True, "glu_linear_offset": 1.0, "swiglu_limit": 7.0,
    "ffn_hidden_size": 2880, "moe_ffn_hidden_size": 2880, "moe_router_topk": 4,
    "moe_layer_freq": 1, "moe_router_score_function": "softmax", "moe_router_pre_softmax": False,
    "window_size": [127, 0], "window_attn_skip_freq": 2,
}

PRESETS.update({
    "gpt-oss-20b": {**_GPT_OSS, "num_layers": 24, "num_experts": 32},
    "gpt-oss-120b": {**_GPT_OSS, "num_layers": 36, "num_experts": 128},
})

# zai-org/GLM-4.5 and zai-org/GLM-4.5-Air config.json: GQA (96 heads of 128, 8 KV groups) with
# q/k/v biases, half the head dims rotated (partial_rotary_factor 0.5), rope_theta 1e6, first-k
# dense layers, 160 / 128 experts top-8 plus one shared expert, sigmoid scores with an expert-score
# correction bias (fp32 router), one MTP layer; GLM-4.5 adds per-head q/k RMSNorm.
_GLM45: dict[str, Any] = {
    **_HF_COMMON,
    "num_attention_heads": 96, "vocab_size": 151552, "max_position_embeddings": 131072,
    "norm_epsilon": 1e-5, "rotary_base": 1000000, "kv_channels": 128,
    "group_query_attention": True, "num_query_groups": 8, "add_qkv_bias": True,
    "rotary_percent": 0.5, "moe_router_topk": 8, "mtp_num_layers": 1, "moe_router_dtype": "fp32",
    "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
}

PRESETS.update({
    "glm-4.5": {
        **_GLM45, "num_layers": 92, "hidden_size": 5120, "qk_layernorm": True,
        "ffn_hidden_size": 12288, "num_experts": 160, "moe_ffn_hidden_size": 1536,
        "moe_shared_expert_intermediate_size": 1536, "moe_router_topk_scaling_factor": 2.5,
        "moe_layer_freq": [0] * 3 + [1] * 89,
    },
    "glm-4.5-air": {
        **_GLM45, "num_layers": 46, "hidden_size": 4096, "qk_layernorm": False,
        "ffn_hidden_size": 10944, "num_experts": 128, "moe_ffn_hidden_size": 1408,
        "moe_shared_expert_intermediate_size": 1408, "moe_layer_freq": [0] * 1 + [1] * 45,
    },
})

# MiniMaxAI/MiniMax-M2 config.json: 62 layers of GQA full attention (48 heads of 128, 8 KV groups)
# with q/k RMSNorm over all heads of the layer and 64 of 128 head dims rotated (rope_theta 5e6),
# every layer MoE: 256 experts of 1536 top-8, sigmoid scores with an expert bias, no shared expert.
PRESETS["minimax-m2"] = {
    **_HF_COMMON,
    "num_layers": 62, "hidden_size": 3072, "num_attention_heads": 48, "vocab_size": 200064,
    "max_position_embeddings": 196608, "norm_epsilon": 1e-6, "rotary_base": 5000000,
    "kv_channels": 128, "group_query_attention": True, "num_query_groups": 8,
    "rotary_percent": 0.5, "qk_layernorm": True, "qk_layernorm_per_layer": True,
    "ffn_hidden_size": 1536, "moe_ffn_hidden_size": 1536, "num_experts": 256, "moe_router_topk": 8,
    "moe_layer_freq": 1, "moe_router_score_function": "sigmoid",
    "moe_router_enable_expert_bias": True,
}

# meta-llama/Llama-4-Scout-17B-16E and meta-llama/Llama-4-Maverick-17B-128E config.json, their
# text_config (the vision encoder is no part of a preset): 48 layers of GQA (40 heads of 128, 8 KV
# groups), RoPE (theta 5e5) with chunked attention (8192) except every 4th layer (NoPE, full
# attention), top-1 sigmoid routing plus a shared expert of 8192; Scout: 16 experts in every layer
# and L2 q/k norm; Maverick: 128 experts every other layer (from layer 1), dense layers 16384 wide.
# Llama 4 scales the expert's input by the router score: set moe: {moe_apply_probs_on_input: true}
# beside the preset (the examples do; `model: {hf_config: …}` sets it).
_LLAMA4: dict[str, Any] = {
    **_HF_COMMON,
    "num_layers": 48, "hidden_size": 5120, "num_attention_heads": 40, "vocab_size": 202048,
    "norm_epsilon": 1e-5, "rotary_base": 500000, "kv_channels": 128, "group_query_attention": True,
    "num_query_groups": 8, "qk_layernorm": False, "ffn_hidden_size": 16384,
    "moe_ffn_hidden_size": 8192, "moe_shared_expert_intermediate_size": 8192, "moe_router_topk": 1,
    "moe_router_score_function": "sigmoid", "attention_chunk_size": 8192, "no_rope_freq": 4,
}

PRESETS.update({
    "llama-4-scout": {**_LLAMA4, "max_position_embeddings": 10485760, "qk_l2_norm": True,
                      "num_experts": 16, "moe_layer_freq": 1},
    "llama-4-maverick": {**_LLAMA4, "max_position_embeddings": 1048576, "qk_l2_norm": False,
                         "num_experts": 128, "moe_layer_freq": [0, 1] * 24},
})

# Qwen/Qwen3-Next-80B-A3B-Instruct config.json: 48 layers in groups of four, three gated DeltaNet
# layers (16 key heads and 32 value heads of 128, a 4-tap short convolution) then one gated full
# attention layer (16 heads of 256, 2 KV groups, q/k RMSNorm, a quarter of each head rotated,
# rope_theta 1e7); every layer MoE: 512 experts of 512 top-10 (renormalised softmax) plus a gated
# shared expert of 512.
PRESETS["qwen3-next-80b-a3b"] = {
    **_HF_COMMON,
    "num_layers": 48, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 151936,
    "max_position_embeddings": 262144, "norm_epsilon": 1e-6, "rotary_base": 10000000,
    "kv_channels": 256, "group_query_attention": True, "num_query_groups": 2, "qk_layernorm": True,
    "ffn_hidden_size": 5120, "num_experts": 512, "moe_router_topk": 10, "moe_ffn_hidden_size": 512,
    "moe_router_score_function": "softmax", "moe_router_pre_softmax": False, "moe_layer_freq": 1,
    "moe_shared_expert_intermediate_size": 512, "moe_shared_expert_gate": True,
    "attention_output_gate": True, "rotary_percent": 0.25, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_attention_freq": 4,
}

# deepseek-ai/DeepSeek-V3.2-Exp config.json: DeepSeek-V3 (the "deepseek-v3" preset's dims) plus DSA,
# a lightning indexer of 64 heads of 128 that keeps 2048 keys per query. Like V3's, its
# mscale_all_dim 1.0 passes as `--mscale-all-dim 1.0` in launch.megatron_extra_args.
PRESETS["deepseek-v3.2"] = {**PRESETS["deepseek-v3"], "dsa": True, "index_n_heads": 64,
                            "index_head_dim": 128, "index_topk": 2048}

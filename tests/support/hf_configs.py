"""Hugging Face config.json contents of the models the importer supports, shared by the tests.

Each is written from the published config on Hugging Face, cited by model id (the keys and values
of that repository's config.json; keys the mapping ignores, such as bos_token_id or
quantization_config, are left out).
"""

from __future__ import annotations

from typing import Any

# deepseek-ai/DeepSeek-V3 config.json (Hugging Face model card repository).
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "attention_bias": False, "attention_dropout": 0.0, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid", "tie_word_embeddings": False, "topk_group": 4,
    "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 129280,
}

# moonshotai/Kimi-K2-Instruct config.json: the V3 architecture with 64 heads, 384 experts, one
# dense layer, no expert groups, no MTP layer, a 163,840-token vocabulary and its own YaRN.
KIMI_K2: dict[str, Any] = {
    **DEEPSEEK_V3, "model_type": "kimi_k2", "first_k_dense_replace": 1,
    "max_position_embeddings": 131072, "n_group": 1, "n_routed_experts": 384,
    "num_attention_heads": 64, "num_key_value_heads": 64, "num_nextn_predict_layers": 0,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "topk_group": 1, "vocab_size": 163840,
}

# deepseek-ai/DeepSeek-V2-Lite config.json: no query compression (q_lora_rank null), softmax
# routing without renormalisation, no groups, YaRN mscale 0.707.
DEEPSEEK_V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128,
    "vocab_size": 102400,
}

# Qwen/Qwen3-30B-A3B config.json.
QWEN3_30B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
    "use_sliding_window": False, "vocab_size": 151936,
}

# Qwen/Qwen3-235B-A22B config.json.
QWEN3_235B: dict[str, Any] = {
    **QWEN3_30B, "hidden_size": 4096, "intermediate_size": 12288, "max_window_layers": 94,
    "moe_intermediate_size": 1536, "num_attention_heads": 64, "num_hidden_layers": 94,
}

# Qwen/Qwen1.5-MoE-A2.7B config.json (the Qwen2-MoE architecture): a gated shared expert, q/k/v
# biases, top-k softmax scores without renormalisation.
QWEN2_MOE: dict[str, Any] = {
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "decoder_sparse_step": 1,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632,
    "max_position_embeddings": 8192, "max_window_layers": 21, "model_type": "qwen2_moe",
    "moe_intermediate_size": 1408, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24,
    "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "shared_expert_intermediate_size": 5632, "sliding_window": 32768,
    "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936,
}

# mistralai/Mixtral-8x7B-v0.1 config.json.
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32000,
}

# ---- Current MoE architectures (config.json keys the mapping reads, plus the ones it checks).
# openai/gpt-oss-20b config.json: 24 layers alternating sliding (128) / full attention, 32 experts.
GPT_OSS_20B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
    "attention_dropout": 0.0, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "vocab_size": 201088,
}

# openai/gpt-oss-120b config.json: the same with 36 layers and 128 experts.
GPT_OSS_120B: dict[str, Any] = {
    **GPT_OSS_20B, "layer_types": ["sliding_attention", "full_attention"] * 18,
    "num_hidden_layers": 36, "num_local_experts": 128,
}

# zai-org/GLM-4.5 config.json: 92 layers (3 dense), 160 experts top-8 + 1 shared, q/k norm, MTP 1.
GLM_45: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True,
    "attention_dropout": 0.0, "first_k_dense_replace": 3, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 5120, "intermediate_size": 12288, "max_position_embeddings": 131072,
    "moe_intermediate_size": 1536, "n_group": 1, "n_routed_experts": 160, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8,
    "num_hidden_layers": 92, "num_key_value_heads": 8, "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 1000000, "routed_scaling_factor": 2.5, "tie_word_embeddings": False,
    "topk_group": 1, "use_qk_norm": True, "vocab_size": 151552,
}

# zai-org/GLM-4.5-Air config.json: 46 layers (1 dense), 128 experts top-8 + 1 shared, no q/k norm.
GLM_45_AIR: dict[str, Any] = {
    **GLM_45, "first_k_dense_replace": 1, "hidden_size": 4096, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "n_routed_experts": 128, "num_hidden_layers": 46,
    "routed_scaling_factor": 1.0, "use_qk_norm": False,
}

# MiniMaxAI/MiniMax-M2 config.json: 62 full-attention layers, per-layer q/k norm, rotary_dim 64,
# 256 experts top-8 with sigmoid scores and a routing bias; 3 MTP modules HF does not build.
MINIMAX_M2: dict[str, Any] = {
    "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
    "attention_dropout": 0.0, "attn_type_list": [1] * 62, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 3072, "intermediate_size": 1536, "max_position_embeddings": 196608,
    "mtp_transformer_layers": 1, "num_attention_heads": 48, "num_experts_per_tok": 8,
    "num_hidden_layers": 62, "num_key_value_heads": 8, "num_local_experts": 256,
    "num_mtp_modules": 3, "qk_norm_type": "per_layer", "rms_norm_eps": 1e-06,
    "rope_theta": 5000000, "rotary_dim": 64, "scoring_func": "sigmoid",
    "shared_intermediate_size": 0, "tie_word_embeddings": False, "use_mtp": True,
    "use_qk_norm": True, "use_routing_bias": True, "vocab_size": 200064,
}

# meta-llama/Llama-4-Scout-17B-16E config.json (its text_config; the vision_config is cut to two
# keys, which the mapping only notes): 48 layers, every layer MoE (16 experts top-1 + a shared
# expert), NoPE every 4th layer, chunked attention 8192, L2 q/k norm, Llama-3 RoPE scaling.
LLAMA4_SCOUT: dict[str, Any] = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "tie_word_embeddings": False, "vision_config": {"hidden_size": 1408, "num_hidden_layers": 34},
    "text_config": {
        "attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0,
        "attn_scale": 0.1, "attn_temperature_tuning": 4, "floor_scale": 8192, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 5120, "interleave_moe_layer_step": 1,
        "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "max_position_embeddings": 10485760, "model_type": "llama4_text",
        "moe_layers": list(range(48)), "no_rope_layers": [1, 1, 1, 0] * 12,
        "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48,
        "num_key_value_heads": 8, "num_local_experts": 16, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "tie_word_embeddings": False,
        "use_qk_norm": True, "vocab_size": 202048,
    },
}

# meta-llama/Llama-4-Maverick-17B-128E config.json (text_config): 128 experts on every other layer
# from layer 1 (dense layers 16384 wide between), no q/k norm, no RoPE scaling.
LLAMA4_MAVERICK: dict[str, Any] = {
    **LLAMA4_SCOUT,
    "text_config": {
        **LLAMA4_SCOUT["text_config"], "interleave_moe_layer_step": 2,
        "max_position_embeddings": 1048576, "moe_layers": list(range(1, 48, 2)),
        "num_local_experts": 128, "rope_scaling": None, "use_qk_norm": False,
    },
}

# Qwen/Qwen3-Next-80B-A3B-Instruct config.json: 48 layers, every 4th full (gated) attention, the
# others gated DeltaNet; 512 experts top-10 plus a gated shared expert.
QWEN3_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "attention_bias": False,
    "attention_dropout": 0.0, "decoder_sparse_step": 1, "full_attention_interval": 4,
    "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
    "mlp_only_layers": [], "moe_intermediate_size": 512, "norm_topk_prob": True,
    "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10,
    "num_hidden_layers": 48, "num_key_value_heads": 2, "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936,
}

# deepseek-ai/DeepSeek-V3.2-Exp config.json: DeepSeek-V3's keys plus the DSA lightning indexer.
DEEPSEEK_V32: dict[str, Any] = {
    **DEEPSEEK_V3, "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048,
}

# moonshotai/Kimi-Linear-48B-A3B-Instruct config.json (KimiLinearForCausalLM): its architecture
# keys as public fixtures quote them alike (the Megatron-Bridge fork michal2409/Megatron-Bridge@
# 269a192c's kimi_linear test fixture and two independent loaders' tests; the published file
# itself was not found quoted whole). KDA dims and the 1-based layer lists sit in
# linear_attn_config; the MoE keys are spelt as KimiLinearConfig's attribute_map reads them.
# transformers 5.25 builds 49,122,675,072 parameters from it, 3,484,453,248 activated.
KIMI_LINEAR: dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
    "vocab_size": 163840, "hidden_size": 2304, "head_dim": 72, "intermediate_size": 9216,
    "num_hidden_layers": 27, "num_attention_heads": 32, "num_key_value_heads": 32,
    "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "first_k_dense_replace": 1, "moe_intermediate_size": 1024,
    "moe_layer_freq": 1, "moe_renormalize": True, "moe_router_activation_func": "sigmoid",
    "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1,
    "routed_scaling_factor": 2.446, "use_grouped_topk": True, "num_expert_group": 1,
    "topk_group": 1, "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
    "num_nextn_predict_layers": 0, "model_max_length": 1048576, "use_cache": True,
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128,
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "num_heads": 32, "short_conv_kernel_size": 4},
}

HF_CONFIGS = {"deepseek-v3": DEEPSEEK_V3, "kimi-k2": KIMI_K2, "deepseek-v2-lite": DEEPSEEK_V2_LITE,
              "qwen3-30b-a3b": QWEN3_30B, "qwen3-235b-a22b": QWEN3_235B, "qwen2-moe": QWEN2_MOE,
              "mixtral-8x7b": MIXTRAL_8X7B, "gpt-oss-20b": GPT_OSS_20B, "gpt-oss-120b": GPT_OSS_120B,
              "glm-4.5": GLM_45, "glm-4.5-air": GLM_45_AIR, "minimax-m2": MINIMAX_M2,
              "llama-4-scout": LLAMA4_SCOUT, "llama-4-maverick": LLAMA4_MAVERICK,
              "qwen3-next-80b-a3b": QWEN3_NEXT, "deepseek-v3.2": DEEPSEEK_V32,
              "kimi-linear-48b-a3b": KIMI_LINEAR}

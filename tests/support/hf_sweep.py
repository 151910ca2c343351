"""The MoE decoder families transformers ships, each shrunk from its own config class's defaults
(same layer program, tiny widths), as `import hf` must take them: counted exactly as transformers'
meta-device build (total and activated), or refused naming the module class and layer index.

`shrunk(model_type)` writes the config.json a user of that family would bring, at toy size: the
config class's defaults (transformers 5.25, `AutoConfig.for_model(model_type).to_dict()`), widths,
heads, experts and vocabulary cut down, the layer count cut to at most 8 with every per-layer list
cut with it, and `architectures` named as transformers' auto classes name it. `SWEEP` holds what
moeplan must do with each (tests/integration/transformers/test_family_sweep.py checks the ones a
user is likeliest to bring); `python -m tests.support.hf_sweep [model_type ...]` runs every
model_type transformers lists with an expert key and prints the table.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from typing import Any

LAYERS = 8
_LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layers")
_WIDTHS = {"hidden_size": 64, "d_model": 64, "intermediate_size": 96, "ffn_hidden_size": 96,
           "moe_intermediate_size": 32, "expert_ffn_hidden_size": 32,
           "shared_expert_intermediate_size": 48, "moe_shared_expert_intermediate_size": 48,
           "share_expert_dim": 48, "num_attention_heads": 4, "n_heads": 4, "head_dim": 16,
           "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
           "v_head_dim": 16, "qk_head_dim": 24, "vocab_size": 512, "global_head_dim": 32,
           "router_hidden_size": 32}
_KV_HEADS = ("num_key_value_heads", "kv_n_heads", "num_attention_groups",
             "swa_num_key_value_heads", "num_global_key_value_heads")
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
_TOPK = ("num_experts_per_tok", "moe_k", "moe_topk", "top_k", "num_experts_per_token",
         "moe_router_topk", "top_k_experts")
_TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id")
# keys a config.json never carries (PretrainedConfig's runtime state and labels)
_RUNTIME = ("transformers_version", "_name_or_path", "id2label", "label2id", "architectures",
            "output_hidden_states", "return_dict", "dtype", "chunk_size_feed_forward",
            "is_encoder_decoder", "problem_type", "output_attentions")

# What the defaults leave unset or inconsistent once shrunk (transformers would build no MoE, or
# refuse): the families' own published choices at toy size.
OVERRIDES: dict[str, dict[str, Any]] = {
    "deepseek_v2": {"num_experts_per_tok": 2},  # DeepseekV2Config leaves it None
    "dots1": {"n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
              "first_k_dense_replace": 1},
    "hunyuan_v1_moe": {"head_dim": 16, "num_experts": 8, "moe_topk": 2},
    "lfm2_moe": {"layer_types": ["conv", "conv", "full_attention"] * 2 + ["conv", "conv"]},
    "granitemoehybrid": {"mamba_n_heads": 8, "mamba_d_head": 16},
    # Gemma-4 26B-A4B's shape: the MoE block on, full layers of their own head width and one KV
    # head whose V is its K, every sixth layer full (transformers makes the last one full too)
    "gemma4_text": {"per_layer_config": {}, "enable_moe_block": True, "num_experts": 8,
                    "top_k_experts": 2, "moe_intermediate_size": 32, "global_head_dim": 32,
                    "num_global_key_value_heads": 1, "attention_k_eq_v": True,
                    "layer_types": ["sliding_attention"] * 5 + ["full_attention"]
                    + ["sliding_attention"] * 2, "hidden_size_per_layer_input": 0,
                    "vocab_size_per_layer_input": 512},
}

# Multimodal wrappers whose text stack is an MoE decoder (their *_text config is swept too).
WRAPPERS = ("qwen3_vl_moe", "qwen3_5_moe", "glm4v_moe", "llama4", "kimi_k25", "gemma4",
            "minimax_m3_vl", "step3p7", "ernie4_5_vl_moe", "hy_v4_vl", "hunyuan_vl")

# model_type -> "exact", or the words the refusal must hold (the layer, the module and its class).
SWEEP: dict[str, str] = {
    # a family record maps them
    "deepseek_v3": "exact", "deepseek_v32": "exact", "deepseek_v4": "exact",
    "glm4_moe": "exact", "glm4_moe_lite": "exact", "glm_moe_dsa": "exact",
    "qwen2_moe": "exact", "qwen3_moe": "exact", "qwen3_next": "exact", "qwen3_5_moe": "exact",
    "qwen3_5_moe_text": "exact", "qwen3_vl_moe": "exact", "kimi_k25": "exact", "mixtral": "exact",
    "gpt_oss": "exact", "minimax_m2": "exact", "llama4": "exact", "nemotron_h": "exact",
    "kimi_linear": "exact",
    # the no-record path maps them from transformers' modules
    "glm4v_moe": "exact", "minimax_m3_vl": "exact", "mimo_v2_flash": "exact", "gemma4": "exact",
    "step3p5": "exact", "laguna": "exact", "ernie4_5_moe": "exact", "dots1": "exact",
    "exaone_moe": "exact", "hy_v3": "exact", "solar_open": "exact", "granitemoe": "exact",
    "qwen3_vl_moe_text": "exact",
    # AFMoE (Arcee Trinity): a sigmoid output gate, sandwich norms, the correction bias on the
    # MoE block, RoPE on the sliding-window layers only (no_rope_freq on the full ones)
    "afmoe": "exact",
    # HunYuan-A13B: q/k norms under its own names, run after RoPE (warned), a router holding wg
    "hunyuan_v1_moe": "exact",
    # OLMoE: q/k norms over every head at once (model.qk_layernorm_per_layer, MiniMax-M2's)
    "olmoe": "exact",
    # LongCat-Flash: each layer's two MLA sub-layers as two of moeplan's layers, the shortcut MoE
    # with the first dense MLP as its shared expert, zero-computation experts as router rows
    "longcat_flash": "exact",
    # multi-latent attention read off the projections' shapes
    "mistral4": "exact", "mistral3+mistral4": "exact",
    # refused naming what moeplan has no layer kind for
    # HY-V4: DSA whose MLA carries an output gate and sinks, beside 2N-row hyper-connections
    "hy_v4": "layer 0: model.layers.0.self_attn (HYV4Attention) is multi-latent attention",
    "minimax": "layer 1: model.layers.1.self_attn (MiniMaxLightningAttention)",
    "jamba": "layer 0: model.layers.0.mamba (JambaMambaMixer)",
}


def _shrink(config: Mapping[str, Any]) -> dict[str, Any]:
    data = {key: value for key, value in config.items() if key not in _RUNTIME}
    old = next((data[k] for k in _LAYER_KEYS if isinstance(data.get(k), int)), None)
    new = min(old, LAYERS) if old else None
    for key, value in list(data.items()):
        number = isinstance(value, int) and not isinstance(value, bool)
        if key in _LAYER_KEYS and number:
            data[key] = new
        elif key in _WIDTHS and number and value:
            data[key] = _WIDTHS[key]
        elif key in _KV_HEADS and number and value:
            data[key] = 4 if value >= 32 else min(value, 2)  # MHA stays MHA, GQA/MQA stay so
        elif key in EXPERT_KEYS and number and value > 1:
            data[key] = 8
        elif key in _TOPK and number and value > 0:
            data[key] = min(value, 2)
        elif key in ("n_group", "num_expert_group") and number and value:
            data[key] = min(value, 2)
        elif key == "topk_group" and number and value:
            data[key] = 1
        elif key == "zero_expert_num" and number and value:
            data[key] = 4
        elif key in _TOKENS and value is not None:
            data[key] = [min(v, 3) for v in value] if isinstance(value, list) else min(value, 3)
        elif isinstance(value, list) and old and len(value) == old:
            data[key] = value[:new]
        elif isinstance(value, Mapping) and key.endswith("config") and key != "quantization_config":
            data[key] = _shrink(value)
    return data


def shrunk(model_type: str) -> dict[str, Any]:
    """The config.json of `model_type` at toy size (see the module docstring); "WRAPPER+TEXT" is
    the wrapper with that text stack as its text_config (Mistral-Small-4 ships as mistral3 around
    mistral4)."""
    import transformers

    if "+" in model_type:
        wrapper, text = model_type.split("+")
        data = shrunk(wrapper)
        data["text_config"] = {k: v for k, v in shrunk(text).items() if k != "architectures"}
        return data
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    data = _shrink(transformers.AutoConfig.for_model(model_type).to_dict())
    data.update(OVERRIDES.get(model_type, {}))
    text = data.get("text_config")
    if isinstance(text, dict):
        text.update(OVERRIDES.get(str(text.get("model_type")), {}))
    data["model_type"] = model_type
    head = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) or \
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(model_type)
    if head:
        data["architectures"] = [head]
    loaded: dict[str, Any] = json.loads(json.dumps(data))  # as the file reads back
    return loaded


def transformers_counts(model: Any) -> tuple[int, int]:
    """Total and activated parameters of transformers' build of the text stack: every parameter
    outside the towers (plus the untied output layer a bare text model lacks), less, per routed
    expert block (a module named `experts`, not a shared one), the share of its experts a token
    does not reach (1 - top-k / experts, from the config)."""
    from planner.commands.hf_meta import _missing_head, _tower

    text = model.config.get_text_config()
    total = sum(p.numel() for name, p in model.named_parameters() if not _tower(name))
    total += _missing_head(model)
    experts = next((getattr(text, k) for k in EXPERT_KEYS
                    if isinstance(getattr(text, k, None), int)), None)
    topk = next((getattr(text, k) for k in _TOPK if isinstance(getattr(text, k, None), int)), None)
    routed = sum(sum(p.numel() for p in module.parameters())
                 for name, module in model.named_modules()
                 if name.rsplit(".", 1)[-1] == "experts" and "shared" not in name
                 and not _tower(name))
    if not (experts and topk and routed):
        return int(total), int(total)
    return int(total), int(total - routed * (experts - topk) // experts)


def moeplan_counts(hf: Mapping[str, Any]) -> tuple[str, tuple[int, int] | str]:
    """How `import hf` takes the file: ("record" | "meta", (total, activated)) counted as
    transformers counts (Megatron's vocabulary padding out, the router correction biases
    transformers keeps as parameters in), or ("refused", the findings' words)."""
    from planner.commands.hf_meta import meta_import
    from planner.config.importers.hf_config import HfConfigUnmappable, map_hf_config
    from planner.config.importers.hf_families import family_of
    from planner.config.schema import Config
    from planner.model_size import model_size

    try:
        mapping, path = map_hf_config(hf), "record"
    except HfConfigUnmappable as exc:
        built = None
        if family_of(hf.get("architectures"), hf.get("model_type")) is None:
            built = meta_import(hf, "config.json")
        if built is None or built.mapping is None:
            findings = [*exc.findings, *(built.findings if built else [])]
            return "refused", " | ".join(f"{f.path}: {f.message}" for f in findings)
        mapping, path = built.mapping, "meta"
    cfg = Config.model_validate({"model": mapping.model, "moe": mapping.moe or {},
                                 "parallel": {"world_size": 1}, "training": {"seq_length": 16}})
    size = model_size(cfg)
    assert size is not None
    tables = 2 if cfg.model.untie_embeddings_and_output_weights else 1
    padding = (cfg.padded_vocab_size - cfg.model.vocab_size) * cfg.model.hidden_size * tables
    bias = re.search(r"\+ ([\d,]+) router correction-bias", mapping.notes[0]) \
        if path == "meta" and mapping.notes else None
    extra = int(bias.group(1).replace(",", "")) if bias else 0
    return path, (size.total_params - padding + extra, size.active_params - padding + extra)


def sweep_one(model_type: str) -> tuple[str, str]:
    """(verdict, detail): exact / WRONG / refused / transformers-fails for one model_type."""
    from planner.commands.hf_meta import _build

    hf = shrunk(model_type)
    try:
        built = transformers_counts(_build(hf))
    except Exception as exc:  # the shrunk defaults are not a model transformers builds
        return "transformers-fails", f"{type(exc).__name__}: {str(exc)[:120]}"
    path, counted = moeplan_counts(hf)
    if isinstance(counted, str):
        return path, counted
    if counted == built:
        return "exact", f"{path}: total {built[0]:,}, activated {built[1]:,}"
    return "WRONG", f"{path}: moeplan {counted} vs transformers {built}"


def moe_model_types() -> list[str]:
    """Every model_type whose transformers config class names an expert key, and the wrappers."""
    import inspect

    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    keys = (*EXPERT_KEYS, "moe_intermediate_size", "num_experts_per_tok", "ffn_config")
    found = []
    for model_type, name in CONFIG_MAPPING_NAMES.items():
        try:
            source = inspect.getsource(getattr(transformers, name))
        except Exception:  # a config class transformers cannot import here
            continue
        if any(key in source for key in keys):
            found.append(model_type)
    return found + [w for w in WRAPPERS if w not in found]


if __name__ == "__main__":
    for name in sys.argv[1:] or moe_model_types():
        verdict, detail = sweep_one(name)
        print(f"{name:28} {verdict:18} {detail[-300:]}", flush=True)

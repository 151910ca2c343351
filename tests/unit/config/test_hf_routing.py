"""The router fields `hf_config` writes reproduce each Hugging Face model's routing in Megatron.

Megatron's own router (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_utils.py
topk_routing_with_score_function and group_limited_topk, run from the oracle's source) is called
with the arguments the mapping produced, and its routing probabilities are compared with the HF
gates written out below from the transformers modelling code of each architecture
(Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock, DeepSeek-V2/V3 MoEGate).
"""

from __future__ import annotations

from typing import Any, Optional

import pytest

from planner.config.importers.hf_config import map_hf_config
from tests.support.hf_configs import (
    DEEPSEEK_V2_LITE,
    DEEPSEEK_V3,
    KIMI_K2,
    MIXTRAL_8X7B,
    QWEN2_MOE,
    QWEN3_30B,
)
from tests.support.megatron_source import megatron_functions

torch = pytest.importorskip("torch")
TOKENS = 32


def _megatron_router() -> Any:
    funcs = megatron_functions(
        "core/transformer/moe/moe_utils.py", {"topk_routing_with_score_function", "group_limited_topk"},
        torch=torch, Optional=Optional, Tuple=tuple, HAVE_TE=False,
        fused_topk_with_score_function=None, is_te_min_version=None)
    return funcs["topk_routing_with_score_function"]


def _megatron_probs(model: dict[str, Any], logits: Any, bias: Any) -> Any:
    probs, _ = _megatron_router()(
        logits, model["moe_router_topk"],
        use_pre_softmax=model.get("moe_router_pre_softmax", False),
        num_groups=model.get("moe_router_num_groups"),
        group_topk=model.get("moe_router_group_topk"),
        scaling_factor=model.get("moe_router_topk_scaling_factor"),
        score_function=model["moe_router_score_function"],
        expert_bias=bias if model.get("moe_router_enable_expert_bias") else None)
    return probs


def _dense(weights: Any, indices: Any, experts: int) -> Any:
    return torch.zeros(weights.shape[0], experts).scatter(1, indices, weights)


def _hf_softmax_gate(hf: dict[str, Any], logits: Any) -> Any:
    """Qwen2/Qwen3-MoE and Mixtral: softmax over all experts, top-k, renormalised iff
    norm_topk_prob (Mixtral always renormalises)."""
    scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, indices = torch.topk(scores, hf["num_experts_per_tok"], dim=-1)
    if hf.get("norm_topk_prob", hf["architectures"] == ["MixtralForCausalLM"]):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return _dense(weights, indices, logits.shape[1])


def _hf_deepseek_gate(hf: dict[str, Any], logits: Any, bias: Any) -> Any:
    """DeepSeek MoEGate: V3 noaux_tc (sigmoid, bias-corrected top-2-sum group choice, weights
    from the unbiased scores, renormalised, times routed_scaling_factor); V2 greedy softmax (scaled
    when not renormalised)."""
    experts, topk = logits.shape[1], hf["num_experts_per_tok"]
    if hf["topk_method"] == "noaux_tc":
        scores = logits.sigmoid()
        choice = scores + bias
        groups, keep = hf["n_group"], hf["topk_group"]
        group_scores = choice.view(TOKENS, groups, -1).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=keep, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        mask = mask.unsqueeze(-1).expand(TOKENS, groups, experts // groups).reshape(TOKENS, -1)
        indices = torch.topk(choice.masked_fill(~mask.bool(), 0.0), k=topk, dim=-1)[1]
        weights = scores.gather(1, indices)
        if hf["norm_topk_prob"]:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return _dense(weights * hf["routed_scaling_factor"], indices, experts)
    assert hf["topk_method"] == "greedy"
    scores = logits.softmax(dim=-1, dtype=torch.float32)
    weights, indices = torch.topk(scores, k=topk, dim=-1)
    if hf["norm_topk_prob"]:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    else:
        weights = weights * hf["routed_scaling_factor"]
    return _dense(weights, indices, experts)


@pytest.mark.parametrize("hf", [QWEN3_30B, QWEN2_MOE, MIXTRAL_8X7B, DEEPSEEK_V3, KIMI_K2,
                                DEEPSEEK_V2_LITE],
                         ids=["qwen3-30b-a3b", "qwen2-moe", "mixtral-8x7b", "deepseek-v3", "kimi-k2",
                              "deepseek-v2-lite"])
def test_megatron_routes_like_the_hf_gate(hf: dict[str, Any]):
    model = map_hf_config(hf).model
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(TOKENS, model["num_experts"], generator=generator)
    # A small positive correction keeps every biased score positive, where HF's 0-fill of the
    # dropped groups and Megatron's -inf fill choose alike.
    bias = torch.rand(model["num_experts"], generator=generator) * 0.1
    if "n_routed_experts" in hf:
        expected = _hf_deepseek_gate(hf, logits, bias)
    else:
        expected = _hf_softmax_gate(hf, logits)
    torch.testing.assert_close(_megatron_probs(model, logits, bias), expected, rtol=1e-5, atol=1e-6)


def test_the_opposite_pre_softmax_setting_routes_differently():
    # The comparison above can fail: flipping the mapped pre-softmax flag breaks it for Qwen2-MoE.
    model = {**map_hf_config(QWEN2_MOE).model, "moe_router_pre_softmax": False}
    logits = torch.randn(TOKENS, model["num_experts"], generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(_megatron_probs(model, logits, None), _hf_softmax_gate(QWEN2_MOE, logits))


def _readme_mixtral_args() -> dict[str, Any]:
    """Megatron's own Mixtral-8x7B launch (Megatron-LM dev@d48bd6be
    megatron/core/transformer/moe/README.md, "Runs Mixtral 8x7B model"), flags as field names."""
    from tests.support.oracle import megatron_lm_dir

    root, why = megatron_lm_dir()
    if root is None:
        pytest.skip(why)
    text = (root / "megatron" / "core" / "transformer" / "moe" / "README.md").read_text("utf-8")
    script = text[text.index("# Runs Mixtral 8x7B model"):]
    script = script[:script.index("```")]
    args: dict[str, Any] = {}
    for block in ("MODEL_ARGS=(", "MOE_ARGS=("):
        body = script[script.index(block) + len(block):]
        words = body[:body.index(")")].split()
        for index, word in enumerate(words):
            if word.startswith("--"):
                value = words[index + 1] if index + 1 < len(words) else None
                name = word[2:].replace("-", "_")
                args[name] = True if value is None or value.startswith("--") else value
    return args


def test_mixtral_mapping_matches_megatrons_own_mixtral_launch():
    megatron = _readme_mixtral_args()
    model = map_hf_config(MIXTRAL_8X7B).model
    same = {  # Megatron flag → the mapped field it sets
        "num_layers": "num_layers", "hidden_size": "hidden_size",
        "ffn_hidden_size": "ffn_hidden_size", "num_attention_heads": "num_attention_heads",
        "max_position_embeddings": "max_position_embeddings", "num_query_groups": "num_query_groups",
        "normalization": "normalization", "position_embedding_type": "position_embedding_type",
        "num_experts": "num_experts", "moe_router_topk": "moe_router_topk",
        "attention_dropout": "attention_dropout", "hidden_dropout": "hidden_dropout",
    }
    for flag, field in same.items():
        assert str(model[field]) == str(megatron[flag]) or float(model[field]) == float(megatron[flag]), flag
    for flag in ("swiglu", "untie_embeddings_and_output_weights", "group_query_attention"):
        assert megatron[flag] is True and model[flag] is True, flag
    assert megatron["disable_bias_linear"] is True and model["add_bias_linear"] is False
    assert "moe_router_pre_softmax" not in megatron and model["moe_router_pre_softmax"] is False

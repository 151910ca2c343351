"""The router's forward and backward op counts moeplan prices (planner/budget/hardware.py
router_ops) are Megatron's own: its TopKRouter run on a CPU, every computing ATen op counted
(tests/support/megatron_router_ops.py)."""

from __future__ import annotations

from typing import Any

import pytest

from planner.budget.hardware import router_ops
from planner.config.schema import Config
from tests.support.megatron_judge import require_oracle
from tests.support.megatron_router_ops import count_router_ops

SIGMOID = {"moe_router_score_function": "sigmoid"}
GROUPS = {"moe_router_num_groups": 8, "moe_router_group_topk": 4}
BIAS = {"moe_router_enable_expert_bias": True}
NONE = {"moe_router_load_balancing_type": "none", "moe_aux_loss_coeff": 0.0}
AUX = {"moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 1e-3}
SEQ_AUX = {"moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": 1e-3}
SCALING = {"moe_router_topk_scaling_factor": 2.5}
ROUTERS: dict[str, dict[str, Any]] = {
    "softmax": NONE, "softmax, aux loss": AUX, "softmax, sequence aux loss": SEQ_AUX,
    "softmax, groups": {**NONE, **GROUPS}, "sigmoid": {**SIGMOID, **NONE},
    "sigmoid, scaling": {**SIGMOID, **NONE, **SCALING}, "sigmoid, groups": {**SIGMOID, **NONE, **GROUPS},
    "sigmoid, bias": {**SIGMOID, **NONE, **BIAS}, "sigmoid, aux loss": {**SIGMOID, **AUX},
    "DeepSeek-V3": {**SIGMOID, **GROUPS, **BIAS, **SEQ_AUX, **SCALING},
    "DeepSeek-V3, aux loss": {**SIGMOID, **GROUPS, **BIAS, **AUX, **SCALING},
}
# moeplan's names for the TransformerConfig fields above
MODEL_FIELDS = {"moe_router_score_function", "moe_router_num_groups", "moe_router_group_topk",
                "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor"}


def moeplan_config(fields: dict[str, Any]) -> Config:
    model = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 1, "ffn_hidden_size": 64,
             "vocab_size": 128, "num_experts": 256, "moe_router_topk": 8, "moe_ffn_hidden_size": 64,
             **{k: v for k, v in fields.items() if k in MODEL_FIELDS}}
    moe = {k: v for k, v in fields.items() if k not in MODEL_FIELDS}
    return Config.model_validate({"model": model, "parallel": {"world_size": 1}, "moe": moe,
                                  "training": {"micro_batch_size": 1, "global_batch_size": 1,
                                               "seq_length": 128}}, strict=False)


@pytest.fixture(scope="module")
def counted() -> dict[str, dict[str, dict[str, int]]]:
    megatron = require_oracle()
    fields = [{"num_moe_experts": 256, "moe_router_topk": 8, **one} for one in ROUTERS.values()]
    return dict(zip(ROUTERS, count_router_ops(megatron, fields), strict=True))


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_router_ops_are_megatrons(counted: dict[str, dict[str, dict[str, int]]], name: str) -> None:
    ops = counted[name]
    assert router_ops(moeplan_config(ROUTERS[name])) == (
        sum(ops["forward"].values()), sum(ops["backward"].values())), ops


def test_the_deepseek_v3_router_by_hand() -> None:
    """9 + 3 (sigmoid) + 9 (groups) + 4 (bias) + 14 + 3 + 1 (sequence aux loss on sigmoid scores)
    + 1 (scaling) forward; 6 + 7 + 0 (groups under a bias carry no gradient) + 0 + 6 + 7 + 1 + 1
    backward."""
    assert router_ops(moeplan_config(ROUTERS["DeepSeek-V3"])) == (44, 28)

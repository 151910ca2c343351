"""The runtime's MLP activations against hand formulas, and what it reads from the plan.

Megatron-LM dev@d48bd6be: quick_gelu(y) = y·sigmoid(1.702·y) (megatron/core/fusions/
fused_bias_geglu.py quick_gelu); the gated form clamps the gate from above and the linear half to
±c, then act(gate)·(linear + glu_linear_offset) (megatron/core/transformer/moe/experts.py
TEGroupedMLP.forward, bias_act_func's `glu`); the non-gated default is F.gelu
(TransformerConfig.activation_func).
"""

from __future__ import annotations

import math

import pytest
import torch

from planner.config.loader import load_config
from runtime.activation import MLPActivation, quick_gelu
from runtime.plan_io import attention_mechanism_problems
from tests.support.megatron_lines import megatron_line
from tests.support.paths import EXAMPLES

GATE = torch.tensor([-2.0, -0.5, 0.0, 0.3, 1.5, 9.0], dtype=torch.float64)
LINEAR = torch.tensor([-9.0, -1.0, 0.25, 2.0, 0.5, 7.5], dtype=torch.float64)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_quick_gelu_is_the_sigmoid_form():
    # 1.5·σ(2.553) = 1.5 · 0.927775… = 1.391662…
    assert float(quick_gelu(torch.tensor(1.5, dtype=torch.float64))) == pytest.approx(
        1.5 * _sigmoid(1.702 * 1.5), rel=1e-12)
    assert float(quick_gelu(torch.tensor(1.5, dtype=torch.float64))) == pytest.approx(1.391662,
                                                                                      abs=1e-6)


def test_gpt_oss_clamped_quick_geglu_with_offset():
    act = MLPActivation("quick_geglu", 1.0)
    out = act.glu(GATE, LINEAR, 7.0).tolist()
    # gate 9 → 7 (clamped from above), linear −9 → −7 and 7.5 → 7 (±7); offset 1 on the linear half
    expected = [g * _sigmoid(1.702 * g) * (lin + 1.0) for g, lin in
                zip([-2.0, -0.5, 0.0, 0.3, 1.5, 7.0], [-7.0, -1.0, 0.25, 2.0, 0.5, 7.0], strict=True)]
    assert out == pytest.approx(expected, rel=1e-12)
    # the last entry by hand: 7·σ(11.914)·8 = 55.99962…
    assert out[-1] == pytest.approx(7 * 8 / (1 + math.exp(-11.914)), rel=1e-12)
    assert out[2] == 0.0  # quick_gelu(0) = 0 whatever the linear half


def test_swiglu_clamp_and_gelu():
    swiglu = MLPActivation("swiglu").glu(GATE, LINEAR, 1.0).tolist()
    gates, linears = [-2.0, -0.5, 0.0, 0.3, 1.0, 1.0], [-1.0, -1.0, 0.25, 1.0, 0.5, 1.0]
    assert swiglu == pytest.approx([g * _sigmoid(g) * lin for g, lin in
                                    zip(gates, linears, strict=True)], rel=1e-12)
    gelu = MLPActivation("gelu").plain(GATE).tolist()
    assert gelu == pytest.approx([0.5 * g * (1 + math.erf(g / math.sqrt(2))) for g in GATE.tolist()],
                                 rel=1e-12)
    assert not MLPActivation("gelu").gated


@pytest.mark.parametrize(("path", "line", "text"), [
    ("core/fusions/fused_bias_geglu.py", 187, "return y * torch.sigmoid(1.702 * y)"),
    ("core/transformer/moe/experts.py", 866, "return self.config.activation_func(x_glu) * ("),
    ("core/transformer/moe/experts.py", 867, "x_linear + self.config.glu_linear_offset"),
    ("core/transformer/moe/experts.py", 311, "t + b * p"),
    ("core/transformer/moe/shared_experts.py", 124, "assert config.add_bias_linear == False"),
])
def test_cited_megatron_line(path: str, line: int, text: str):
    assert text in megatron_line(path, line), f"megatron/{path}:{line}"


def test_gpt_oss_plan_fields_pick_the_activation_and_refuse_the_attention_it_lacks():
    model = load_config(EXAMPLES / "architectures" / "gpt-oss-20b-16.yaml").model.model_dump(mode="json")
    assert MLPActivation.from_config(model) == MLPActivation("quick_geglu", 1.0)
    refused = attention_mechanism_problems(model)
    assert [line.split(" = ")[0] for line in refused] == ["model.softmax_type", "model.window_size"]
    assert all("not implemented by the runtime" in line for line in refused)


def test_an_offset_without_quick_geglu_is_refused():
    with pytest.raises(ValueError, match="glu_linear_offset"):
        MLPActivation.from_config({"swiglu": True, "quick_geglu": False, "glu_linear_offset": 1.0})

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
from runtime.model import DecoderSpec, sink_attention
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
    ("core/fusions/fused_softmax.py", 175, "ret = torch.softmax(qk, dim=-1)[..., :-1]"),
    ("core/transformer/utils.py", 482, "return layer_number % window_attn_skip_freq != 0"),
])
def test_cited_megatron_line(path: str, line: int, text: str):
    assert text in megatron_line(path, line), f"megatron/{path}:{line}"


def test_gpt_oss_plan_fields_pick_the_activation_and_the_attention():
    model = load_config(EXAMPLES / "architectures" / "gpt-oss-20b-16.yaml").model.model_dump(mode="json")
    assert MLPActivation.from_config(model) == MLPActivation("quick_geglu", 1.0)
    assert attention_mechanism_problems(model) == []  # sinks and windows run
    spec = DecoderSpec.from_config(model, list(range(24)), [], 201_088)
    assert (spec.softmax_type, spec.window_left, spec.window_skip) == ("learnable", 127, 2)
    # window_attn_skip_freq 2: layer numbers 1, 3, … windowed, 2, 4, … full
    assert [spec.is_window_layer(layer) for layer in range(4)] == [True, False, True, False]
    assert attention_mechanism_problems({**model, "linear_attention_freq": 4})[0].startswith(
        "model.linear_attention_freq = 4: gated DeltaNet")


def test_sink_attention_and_window_by_hand():
    """One head, d 1, three positions, q = k = 1, v = (1, 2, 3), sink logit s: position 2 with a
    window of 1 key back reads keys 1 and 2 (logits 1 each) and the sink:
    out = (2 + 3)·e / (2e + e^s)."""
    q = k = torch.ones(1, 1, 3, 1, dtype=torch.float64)
    v = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64).view(1, 1, 3, 1)
    positions = torch.arange(3)
    allowed = (positions[:, None] >= positions[None, :]) & (positions[:, None] - positions[None, :] <= 1)
    sink = torch.tensor([0.5], dtype=torch.float64)
    out = sink_attention(q, k, v, allowed, sink).flatten().tolist()
    e, es = math.e, math.exp(0.5)
    assert out == pytest.approx([1 * e / (e + es), 3 * e / (2 * e + es), 5 * e / (2 * e + es)],
                                rel=1e-12)
    # off-by-one: a zero logit
    assert sink_attention(q, k, v, allowed, None).flatten().tolist()[0] == pytest.approx(
        e / (e + 1), rel=1e-12)


def test_an_offset_without_quick_geglu_is_refused():
    with pytest.raises(ValueError, match="glu_linear_offset"):
        MLPActivation.from_config({"swiglu": True, "quick_geglu": False, "glu_linear_offset": 1.0})

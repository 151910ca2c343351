"""The runtime's Mamba-2 mixer (runtime/mamba.py) against Megatron's shapes, the plan's parameter
budget, and the state-space recurrence written another way.

The toy: h = 32, Megatron pattern M*EME (block 0 a Mamba mixer alone, block 1 attention + MoE, block
2 Mamba + MoE), mamba_head_dim 16 (unset mamba_num_heads: 2·32 / 16 = 4 heads, d_inner 64), 2 B/C
groups, state 8. By hand, MambaMixer.__init__'s parameters: in_proj 32 × (2·64 + 2·2·8 + 4) = 5248,
conv1d (64 + 2·2·8) × 4 = 384 weights + 96 biases, dt_bias, A_log, D 4 each, the gated norm 64,
out_proj 64 × 32 = 2048: 7852 in all.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.mamba import MambaMixer, MambaSpec, selective_scan
from runtime.model import DecoderLayer, DecoderSpec
from runtime.plan_io import Plan, unsupported_features

HYBRID = {"model": {"num_layers": 3, "hybrid_layer_pattern": "M*EME", "mamba_head_dim": 16,
                    "mamba_num_groups": 2, "mamba_state_dim": 8}, "parallel": {"ep": 2}}


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tests.support.runtime_ranks import compile_case

    path = compile_case("hybrid", HYBRID, tmp_path_factory.mktemp("mamba"))
    return json.loads(Path(path).read_text())


def _budget(plan: dict[str, Any], name: str) -> int:
    return next(int(b["value"]) for b in plan["budgets"] if b["name"] == name and b["stage"] is None)


def test_mixer_parameters_are_megatrons_and_the_plans(plan: dict[str, Any]) -> None:
    spec = MambaSpec.from_config(plan["config"]["model"])
    assert (spec.heads, spec.d_inner, spec.groups, spec.state_dim) == (4, 64, 2, 8)
    mixer = MambaMixer(spec, 0, 7, 0.02, 0.01, torch.float32)
    shapes = {name: tuple(p.shape) for name, p in mixer.named_parameters()}
    assert shapes == {"in_proj": (32, 164), "conv1d_weight": (96, 1, 4), "conv1d_bias": (96,),
                      "dt_bias": (4,), "A_log": (4,), "D": (4,), "norm_weight": (64,),
                      "out_proj": (64, 32)}
    count = sum(p.numel() for p in mixer.parameters())
    assert count == 7852 == _budget(plan, "mamba_params_per_layer")
    # MambaMixer.__init__'s initial ranges: A in [1, 16], softplus(dt_bias) in [1e-3, 0.1], D = 1
    assert bool(((mixer.A_log.exp() >= 1) & (mixer.A_log.exp() <= 16)).all())
    dt = torch.nn.functional.softplus(mixer.dt_bias)
    assert bool(((dt >= 1e-3 - 1e-9) & (dt <= 0.1 + 1e-9)).all())
    assert mixer.D.tolist() == [1.0] * 4


def test_blocks_follow_the_plans_hybrid_pattern(plan: dict[str, Any]) -> None:
    """Mamba blocks hold no attention, the mixer-only block no FFN and no second norm; the
    mixer-only block's FFN output is zero and its residual adds the mixer's output alone."""
    model = plan["config"]["model"]
    spec = DecoderSpec.from_config(model, [1, 2], [], 128)
    assert (spec.mamba_layers, spec.mixer_only_layers) == ((0, 2), (0,))

    def moe(layer: int, hashed: bool) -> torch.nn.Module:
        return torch.nn.Identity()

    layers = [DecoderLayer(spec, layer, 7, torch.float32, None, None, moe)  # type: ignore[arg-type]
              for layer in range(3)]
    assert [layer.mamba is not None for layer in layers] == [True, False, True]
    assert [hasattr(layer, "attention") for layer in layers] == [False, True, False]
    assert [layer.ffn is not None for layer in layers] == [False, True, True]
    assert not hasattr(layers[0], "ffn_norm")
    hidden = torch.randn(16, 1, 32, generator=torch.Generator().manual_seed(0))
    out, ffn_out = layers[0](hidden, None, torch.arange(16), torch.arange(16))
    assert torch.equal(ffn_out, torch.zeros_like(hidden))
    assert torch.allclose(out, hidden + layers[0].mamba(layers[0].input_norm(hidden)))


def test_scan_equals_the_quadratic_form() -> None:
    """y_t = Σ_{s ≤ t} (C_t · B_s) · exp(Σ_{s < r ≤ t} dt_r A) · dt_s · x_s: the recurrence unrolled
    (Mamba-2's state-space duality), computed here by explicit sums."""
    gen = torch.Generator().manual_seed(3)
    s, b, heads, p, n = 5, 2, 3, 4, 2
    x, B, C = (torch.randn(s, b, heads, d, generator=gen, dtype=torch.float64) for d in (p, n, n))
    dt = torch.rand(s, b, heads, generator=gen, dtype=torch.float64)
    A = -torch.rand(heads, generator=gen, dtype=torch.float64) * 4
    y = selective_scan(x, B, C, dt, torch.exp(dt * A))
    for t in range(s):
        expected = torch.zeros(b, heads, p, dtype=torch.float64)
        for k in range(t + 1):
            decay = torch.exp(dt[k + 1:t + 1].sum(dim=0) * A)  # [b, heads]
            weight = (C[t] * B[k]).sum(-1) * decay * dt[k]
            expected += weight[..., None] * x[k]
        assert torch.allclose(y[t], expected, atol=1e-12)


def test_causal_and_gated_norm_by_hand() -> None:
    """A later position never changes an earlier output (the conv and the scan are causal), and
    with in_proj's z and out_proj set by hand the output is the grouped RMSNorm of y·SiLU(z)."""
    spec = MambaSpec(hidden_size=8, heads=2, head_dim=4, groups=2, state_dim=2)
    mixer = MambaMixer(spec, 1, 5, 3.0, 0.3, torch.float64)  # large z, y: mean squares ≫ eps
    x = torch.randn(6, 1, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    changed = x.clone()
    changed[4:] += 1.0
    assert torch.allclose(mixer(x)[:4], mixer(changed)[:4], atol=1e-12)
    assert not torch.allclose(mixer(x)[4:], mixer(changed)[4:])
    out = mixer(x)
    # every group of d_inner / groups channels is normalised on its own (weight 1): mean square
    # ms / (ms + 1e-5), just under 1 in each group (one norm over all of d_inner would not do that)
    normed = out @ torch.linalg.pinv(mixer.out_proj)
    groups = normed.reshape(6, 1, 2, 4)
    squares = groups.pow(2).mean(-1)
    assert bool(((squares <= 1) & (squares > 0.995)).all())
    assert math.isclose(float(mixer.D.detach().sum()), 2.0)


def test_refused_by_name_where_the_mixer_cannot_run(plan: dict[str, Any]) -> None:
    assert unsupported_features(Plan(plan)) == []
    under_cp = copy.deepcopy(plan)
    under_cp["layout"]["cp"] = 2
    assert any(line.startswith("model.mamba_layers (Mamba-2 mixers on layers [0, 2]) with "
                               "layout.cp = 2") for line in unsupported_features(Plan(under_cp)))
    learned = copy.deepcopy(plan)
    learned["config"]["model"]["position_embedding_type"] = "learned_absolute"
    assert any(line.startswith("model.position_embedding_type = 'learned_absolute'")
               for line in unsupported_features(Plan(learned)))

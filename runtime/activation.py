"""The MLP activation the plan's config names: SwiGLU, quick-GEGLU with its linear offset, or GELU.

Megatron-LM dev@d48bd6be picks one `activation_func` for every MLP
(megatron/training/arguments.py core_transformer_config_from_args: `--swiglu` → F.silu gated,
`--quick-geglu` → quick_gelu gated, neither → TransformerConfig's default F.gelu, not gated). A
gated FC1 output is split into the gate half and the linear half and the unfused path computes
`activation_func(clamp(gate, max=c)) * (clamp(linear, -c, c) + glu_linear_offset)`
(megatron/core/transformer/moe/experts.py TEGroupedMLP.forward, bias_act_func's `glu`); the fused
kernels compute the same function (megatron/core/fusions/fused_bias_geglu.py
weighted_bias_quick_geglu_impl clamps first, then quick_geglu adds the offset;
fused_bias_swiglu.py clamped_swiglu). quick_gelu is x·sigmoid(1.702·x)
(fused_bias_geglu.py quick_gelu). The clamp is the config's `swiglu_limit`
(`--activation-func-clamp-value`); the runtime applies it where it always has, on routed experts.

The runtime reads the plan's resolved `swiglu` / `quick_geglu` / `glu_linear_offset` and never
re-derives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from runtime.plan_io import required

ACTIVATION_KINDS = ("swiglu", "quick_geglu", "gelu")
QUICK_GELU_SCALE = 1.702  # fused_bias_geglu.py quick_gelu: y * sigmoid(1.702 * y)


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """x · sigmoid(1.702 · x), the sigmoid approximation of GELU gpt-oss uses."""
    return x * torch.sigmoid(QUICK_GELU_SCALE * x)


def clamp_glu_inputs(gate: torch.Tensor, linear: torch.Tensor, limit: float | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gate clamped from above, the linear half to ±limit (no clamp when limit is None)."""
    if limit is None:
        return gate, linear
    return gate.clamp(max=limit), linear.clamp(min=-limit, max=limit)


@dataclass(frozen=True)
class MLPActivation:
    """Which activation every MLP of the model runs, and the GLU's linear offset."""

    kind: str = "swiglu"
    linear_offset: float = 0.0

    @classmethod
    def from_config(cls, model: dict[str, Any]) -> MLPActivation:
        """From the plan's `config.model` (the compiler dumps every field, defaults included)."""
        def value(key: str) -> Any:
            return required(model, key, "config.model")

        swiglu, quick = bool(value("swiglu")), bool(value("quick_geglu"))
        if swiglu and quick:
            raise ValueError("config.model has both swiglu and quick_geglu: recompile the config")
        squared = bool(model.get("squared_relu", False))  # a plan from before the field: off
        if squared and (swiglu or quick):
            raise ValueError("config.model has squared_relu beside a gated MLP: recompile the config")
        kind = ("swiglu" if swiglu else "quick_geglu" if quick else "squared_relu" if squared
                else "gelu")
        offset = float(value("glu_linear_offset"))
        if offset != 0.0 and kind != "quick_geglu":
            raise ValueError(f"config.model.glu_linear_offset = {offset} without quick_geglu: "
                             "recompile the config")
        return cls(kind, offset)

    @property
    def gated(self) -> bool:
        """FC1 has a gate and a linear half (W1 and W3 here)."""
        return self.kind not in ("gelu", "squared_relu")

    @property
    def is_plain_swiglu(self) -> bool:
        """SiLU(gate) · linear with no offset: the grouped experts' hand-written fast path."""
        return self.kind == "swiglu" and self.linear_offset == 0.0

    def glu(self, gate: torch.Tensor, linear: torch.Tensor, limit: float | None) -> torch.Tensor:
        """act(clamp(gate)) · (clamp(linear) + offset) for the gated kinds."""
        gate, linear = clamp_glu_inputs(gate, linear, limit)
        act = F.silu(gate) if self.kind == "swiglu" else quick_gelu(gate)
        return act * (linear + self.linear_offset) if self.linear_offset else act * linear

    def plain(self, fc1: torch.Tensor) -> torch.Tensor:
        """The non-gated kinds: F.gelu (exact), TransformerConfig's default activation_func, or
        relu(x)² (Megatron-LM dev@d48bd6be megatron/core/activations.py squared_relu)."""
        return F.relu(fc1).pow(2) if self.kind == "squared_relu" else F.gelu(fc1)

"""Megatron's Mamba-2 mixer in plain torch, for the hybrid stacks the runtime runs (CP = 1).

Megatron-LM dev@d48bd6be megatron/core/ssm/mamba_mixer.py MambaMixer: in_proj packs
[z, x, B, C, dt] into one linear layer (no bias); a causal depthwise conv1d (kernel d_conv = 4, with
bias) and SiLU run over [x, B, C]; dt = softplus(dt + dt_bias), A = -exp(A_log); the selective
state-space scan adds D·x (one D per head, D_has_hdim False); the gated RMSNorm (norm_before_gate
False: normalise y·SiLU(z), per group of d_inner / ngroups channels, eps 1e-5) and out_proj close it.
The fused kernels (mamba_split_conv1d_scan_combined's chunked SSD) compute the same recurrence; here
it runs step by step over the (short) sequence, which is exact and needs no extension.
Parameter shapes are Megatron's (in_proj and out_proj transposed, as every runtime weight is stored
[in, out]), so a mixer holds exactly the plan's `mamba_params_per_layer`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from runtime.init import init_tensor
from runtime.plan_io import required
from runtime.precision import widened
from runtime.tensor_parallel import TensorParallel

# MambaMixer.__init__'s defaults, which Megatron's hybrid layer specs keep (they pass none of them):
# the conv kernel, A's and dt's initial ranges, dt's floor, and the gated norm's own eps.
D_CONV = 4
A_INIT_RANGE = (1.0, 16.0)
DT_MIN, DT_MAX, DT_INIT_FLOOR = 0.001, 0.1, 1e-4
GATED_NORM_EPS = 1e-5


@dataclass(frozen=True)
class MambaSpec:
    """A Mamba-2 mixer's dims as the plan's config states them."""

    hidden_size: int
    heads: int
    head_dim: int
    groups: int
    state_dim: int

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """[x, B, C]: the channels the causal conv runs over."""
        return self.d_inner + 2 * self.groups * self.state_dim

    @property
    def in_proj_width(self) -> int:
        """[z, x, B, C, dt]."""
        return 2 * self.d_inner + 2 * self.groups * self.state_dim + self.heads

    @property
    def in_proj_segments(self) -> tuple[int, ...]:
        """in_proj's packed outputs, each split over TP on its own."""
        bc = self.groups * self.state_dim
        return (self.d_inner, self.d_inner, bc, bc, self.heads)

    @property
    def conv_segments(self) -> tuple[int, ...]:
        bc = self.groups * self.state_dim
        return (self.d_inner, bc, bc)

    def split(self, parts: int) -> MambaSpec:
        """One TP rank's dims: heads and groups divided by TP (MambaMixer.__init__)."""
        return replace(self, heads=self.heads // parts, groups=self.groups // parts)

    @classmethod
    def from_config(cls, model: dict[str, Any]) -> MambaSpec:
        """Unset mamba_num_heads means d_inner / head_dim heads with d_inner = 2·hidden_size
        (MambaMixer.__init__'s expand = 2), as the planner's schema reads it."""
        def value(key: str) -> Any:
            return required(model, key, "config.model")

        hidden, head_dim = int(value("hidden_size")), int(value("mamba_head_dim"))
        heads = value("mamba_num_heads")
        return cls(hidden_size=hidden, heads=int(heads) if heads else 2 * hidden // head_dim,
                   head_dim=head_dim, groups=int(value("mamba_num_groups")),
                   state_dim=int(value("mamba_state_dim")))


def _uniform(seed: int, identity: tuple[Any, ...], shape: tuple[int, ...], low: float,
             high: float) -> torch.Tensor:
    """U(low, high) drawn from the identity's normal draw through the normal CDF, so every rank and
    the reference get the same values for the same parameter (runtime/init.py's seeding)."""
    normal = init_tensor(seed, identity, shape, 1.0, torch.float32)
    return low + (high - low) * 0.5 * (1.0 + torch.erf(normal / math.sqrt(2.0)))


class MambaMixer(torch.nn.Module):
    """One Mamba-2 mixer: x [s, b, h] (already normalised by the block) → [s, b, h].

    Under TP (MambaMixer.__init__): d_inner, nheads and ngroups divided by TP; in_proj is
    column-parallel with each of z, x, B, C and dt split (its partition_sizes), the conv and the
    per-head dt_bias, A_log and D follow their channels, the gated norm keeps its groups of
    d_inner / ngroups channels (a rank holds whole groups), out_proj is row-parallel."""

    def __init__(self, spec: MambaSpec, layer_id: int, seed: int, init_std: float,
                 output_std: float, dtype: torch.dtype, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.tp = tp = tp or TensorParallel.none()
        if spec.heads % tp.size or spec.groups % tp.size:
            raise ValueError(f"Mamba heads {spec.heads} and groups {spec.groups} must divide by "
                             f"TP {tp.size}")
        self.spec = spec
        self.local = spec.split(tp.size)
        key = (layer_id, "mamba")

        def param(values: torch.Tensor, dim: int, segments: tuple[int, ...] | None = None
                  ) -> torch.nn.Parameter:
            return torch.nn.Parameter(tp.shard(values, dim, segments).to(dtype))

        self.in_proj = param(init_tensor(seed, (*key, "in_proj"), (spec.hidden_size,
                                         spec.in_proj_width), init_std, torch.float32),
                             1, spec.in_proj_segments)
        # conv1d: kaiming_uniform(a = √5) and its bias uniform, both bound 1/√fan_in, fan_in = d_conv
        bound = 1.0 / math.sqrt(D_CONV)
        self.conv1d_weight = param(_uniform(seed, (*key, "conv1d_weight"),
                                            (spec.conv_channels, 1, D_CONV), -bound, bound),
                                   0, spec.conv_segments)
        self.conv1d_bias = param(_uniform(seed, (*key, "conv1d_bias"), (spec.conv_channels,),
                                          -bound, bound), 0, spec.conv_segments)
        # dt_bias: softplus(dt_bias) log-uniform in [dt_min, dt_max], floored (its inverse softplus)
        unit = _uniform(seed, (*key, "dt_bias"), (spec.heads,), 0.0, 1.0)
        dt = torch.exp(unit * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN))
        dt = dt.clamp(min=DT_INIT_FLOOR)
        self.dt_bias = param(dt + torch.log(-torch.expm1(-dt)), 0)
        self.A_log = param(torch.log(_uniform(seed, (*key, "A_log"), (spec.heads,),
                                              *A_INIT_RANGE)), 0)
        self.D = param(torch.ones(spec.heads), 0)
        self.norm_weight = param(torch.ones(spec.d_inner), 0)
        self.out_proj = param(init_tensor(seed, (*key, "out_proj"), (spec.d_inner,
                                          spec.hidden_size), output_std, torch.float32), 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.local
        (projected,) = self.tp.column_linear(x, self.in_proj)
        s, b, _ = projected.shape
        inner, bc = spec.d_inner, spec.groups * spec.state_dim
        z, xbc, dt = torch.split(projected, [inner, inner + 2 * bc, spec.heads], dim=-1)
        # causal depthwise conv over the sequence: [b, channels, s], left-padded by d_conv − 1
        conv = F.conv1d(xbc.permute(1, 2, 0), self.conv1d_weight, self.conv1d_bias,
                        padding=D_CONV - 1, groups=spec.conv_channels)[..., :s]
        xbc = F.silu(conv).permute(2, 0, 1)  # [s, b, channels]
        xs, B, C = torch.split(xbc, [inner, bc, bc], dim=-1)
        # The scan and the gated norm run in fp32 whatever the weights' dtype, as the fused
        # kernels do (mamba_chunk_scan_combined, RMSNormGated); `widened` keeps fp32 and float64.
        xs = widened(xs.reshape(s, b, spec.heads, spec.head_dim))
        repeat = spec.heads // spec.groups  # head h reads group h // (heads / groups)
        B = widened(B.reshape(s, b, spec.groups, spec.state_dim).repeat_interleave(repeat, dim=2))
        C = widened(C.reshape(s, b, spec.groups, spec.state_dim).repeat_interleave(repeat, dim=2))
        dt = F.softplus(widened(dt) + widened(self.dt_bias))  # [s, b, heads]
        decay = torch.exp(dt * -torch.exp(widened(self.A_log)))
        y = selective_scan(xs, B, C, dt, decay) + widened(self.D)[:, None] * xs
        gated = y.reshape(s, b, inner) * F.silu(widened(z))
        grouped = gated.reshape(s, b, spec.groups, inner // spec.groups)
        normed = grouped * torch.rsqrt(grouped.pow(2).mean(dim=-1, keepdim=True) + GATED_NORM_EPS)
        out = (normed.reshape(s, b, inner) * widened(self.norm_weight)).to(x.dtype)
        return self.tp.row_output(out @ self.out_proj)


def selective_scan(x: torch.Tensor, B: torch.Tensor, C: torch.Tensor, dt: torch.Tensor,
                   decay: torch.Tensor) -> torch.Tensor:
    """The Mamba-2 recurrence, one position at a time: state_t = decay_t·state_{t−1} +
    dt_t·x_t ⊗ B_t, y_t = state_t · C_t. x [s, b, heads, p]; B, C [s, b, heads, n]; dt, decay
    [s, b, heads]; the state [b, heads, p, n] starts at zero for every sequence."""
    s, b, heads, p = x.shape
    state = x.new_zeros(b, heads, p, B.shape[-1])
    outputs = []
    for t in range(s):
        update = (dt[t, :, :, None] * x[t])[..., None] * B[t][:, :, None, :]
        state = decay[t][:, :, None, None] * state + update
        outputs.append((state * C[t][:, :, None, :]).sum(dim=-1))
    return torch.stack(outputs)


def mixer_parameter_count(spec: MambaSpec) -> int:
    """Parameters of one mixer, counted off the module (what the plan's budget must equal)."""
    module = MambaMixer(spec, 0, 0, 1.0, 1.0, torch.float32)
    return sum(p.numel() for p in module.parameters())

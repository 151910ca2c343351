"""Grouped SwiGLU routed experts (one grouped GEMM per matrix) and the dense shared expert.

Math form X·W (SPEC §1): F_e(X) = (SiLU(X W1) ⊙ (X W3)) W2 with W1, W3 ∈ R^{h×I}, W2 ∈ R^{I×h}.
Under ETP = q each rank holds column shards W1[:, I/q], W3[:, I/q] and the row shard W2[I/q, :],
computes a partial FC2 output and the dispatcher's ETP reduce-scatter sums the partials.
The routing weight multiplies the activation after SwiGLU and before FC2 (SPEC §5): FC2 is
linear, so this equals weighting the expert output, and the combine must then only sum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from runtime.init import init_shard, init_tensor
from runtime.router import MoESettings

EXPERT_MATRICES = ("w1", "w3", "w2")


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float | None) -> torch.Tensor:
    """SiLU(gate) ⊙ up, with V4's clamp: gate clamped from above, up clamped to ±limit."""
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    return F.silu(gate) * up


def scale_by_probs(activation: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Weight each row's activation by its routing weight (once — the combine only sums)."""
    return activation * probs.unsqueeze(-1).to(activation.dtype)


def output_init_std(settings: MoESettings) -> float:
    """FC2-style projections start smaller, std / sqrt(2·layers) (Megatron's scaled init)."""
    return settings.init_std / math.sqrt(2.0 * settings.num_layers)


def expert_matrix_shape(settings: MoESettings, matrix: str) -> tuple[int, int]:
    """The full logical shape of one expert's matrix in math form."""
    h, ffn = settings.hidden_size, settings.ffn_hidden_size
    return (ffn, h) if matrix == "w2" else (h, ffn)


def expert_shard_dim(matrix: str) -> int:
    """ETP splits the intermediate dimension: columns of W1/W3, rows of W2 (never h)."""
    return 0 if matrix == "w2" else 1


def expert_matrix_std(settings: MoESettings, matrix: str) -> float:
    return output_init_std(settings) if matrix == "w2" else settings.init_std


def expert_identity(layer_id: int, expert_id: int, matrix: str) -> tuple[int, str, int, str]:
    return (layer_id, "expert", expert_id, matrix)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward hands on a contiguous gradient.

    The grouped GEMM backward rejects stride-0 gradients such as the one `.sum().backward()`
    produces.
    """

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad.contiguous()


class GroupedExperts(torch.nn.Module):
    """This rank's L local experts (global ids first..first+L-1), ETP shard `etp_rank`."""

    def __init__(
        self,
        settings: MoESettings,
        layer_id: int,
        first_expert: int,
        num_local_experts: int,
        etp_rank: int,
        etp_size: int,
        seed: int,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.first_expert = first_expert
        self.num_local_experts = num_local_experts
        self.etp_rank = etp_rank
        self.etp_size = etp_size
        for matrix in EXPERT_MATRICES:
            shards = [
                init_shard(
                    seed,
                    expert_identity(layer_id, first_expert + local, matrix),
                    expert_matrix_shape(settings, matrix),
                    expert_matrix_std(settings, matrix),
                    dtype,
                    dim=expert_shard_dim(matrix),
                    part=etp_rank,
                    parts=etp_size,
                )
                for local in range(num_local_experts)
            ]
            self.register_parameter(matrix, torch.nn.Parameter(torch.stack(shards)))

    def forward(
        self, rows: torch.Tensor, probs: torch.Tensor, tokens_per_expert: Sequence[int]
    ) -> torch.Tensor:
        """rows [M, h] sorted by local expert with tokens_per_expert[l] rows each → [M, h]."""
        if len(tokens_per_expert) != self.num_local_experts or sum(tokens_per_expert) != len(rows):
            raise ValueError(
                f"expert input of {len(rows)} rows does not match counts {list(tokens_per_expert)}"
            )
        offsets = torch.tensor(tokens_per_expert, dtype=torch.int64).cumsum(0)
        offsets = offsets.to(device=rows.device, dtype=torch.int32)
        rows = rows.to(self.w1.dtype)
        gate = torch._grouped_mm(rows, self.w1, offs=offsets)
        up = torch._grouped_mm(rows, self.w3, offs=offsets)
        activation = scale_by_probs(swiglu(gate, up, self.settings.swiglu_limit), probs)
        out = torch._grouped_mm(activation, self.w2, offs=offsets)
        return _ContiguousGrad.apply(out)


def shared_expert_identity(layer_id: int, matrix: str) -> tuple[int, str, str]:
    return (layer_id, "shared_expert", matrix)


class SharedExpert(torch.nn.Module):
    """Always-on SwiGLU expert in the dense layout (TP = 1: replicated, reduced over dp_cp).

    V4 does not clamp the shared expert, so no limit is applied here.
    """

    def __init__(
        self, settings: MoESettings, layer_id: int, seed: int, dtype: torch.dtype
    ) -> None:
        super().__init__()
        h, ffn = settings.hidden_size, settings.shared_ffn_hidden_size
        for matrix, shape, std in (
            ("w1", (h, ffn), settings.init_std),
            ("w3", (h, ffn), settings.init_std),
            ("w2", (ffn, h), output_init_std(settings)),
        ):
            values = init_tensor(seed, shared_expert_identity(layer_id, matrix), shape, std, dtype)
            self.register_parameter(matrix, torch.nn.Parameter(values))

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return swiglu(rows @ self.w1, rows @ self.w3, None) @ self.w2

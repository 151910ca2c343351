"""Grouped routed experts (one grouped GEMM per matrix) and the dense shared expert.

Math form X·W: F_e(X) = (SiLU(X W1) ⊙ (X W3)) W2 with W1, W3 ∈ R^{h×I}, W2 ∈ R^{I×h} for SwiGLU;
the plan's other activations (runtime/activation.py: quick-GEGLU with its offset, or GELU with no
W3) and add_bias_linear's biases b1, b3 ∈ R^I, b2 ∈ R^h run through the same grouped GEMMs.
Under ETP = q each rank holds column shards W1[:, I/q], W3[:, I/q] and the row shard W2[I/q, :],
computes a partial FC2 output and the dispatcher's ETP reduce-scatter sums the partials.
The routing weight multiplies the activation after SwiGLU and before FC2 (as Megatron-LM
dev@d48bd6be megatron/core/transformer/moe/experts.py TEGroupedMLP.forward does): FC2 is
linear, so this equals weighting the expert output, and the combine must then only sum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from runtime.activation import MLPActivation
from runtime.init import init_shard, init_tensor
from runtime.router import MoESettings
from runtime.tensor_parallel import TensorParallel

EXPERT_MATRICES = ("w1", "w3", "w2")
# add_bias_linear's per-expert biases: b1 / b3 on FC1's two halves, b2 on FC2's output.
EXPERT_BIASES = ("b1", "b3", "b2")
EXPERT_TENSORS = EXPERT_MATRICES + EXPERT_BIASES


def expert_tensors(settings: MoESettings) -> tuple[str, ...]:
    """The tensors one expert holds: W3 only when gated, the biases only with add_bias_linear."""
    gated = settings.activation.gated
    names = [m for m in EXPERT_MATRICES if gated or m != "w3"]
    if settings.add_bias_linear:
        names += [b for b in EXPERT_BIASES if gated or b != "b3"]
    return tuple(names)


def scale_by_probs(activation: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Weight each row's activation by its routing weight (once — the combine only sums).

    In place: the activation is a fresh intermediate of the grouped expert MLP, and on CPU a
    large fresh tensor costs as much as the multiply itself.
    """
    return activation.mul_(probs.unsqueeze(-1).to(activation.dtype))


def output_init_std(settings: MoESettings) -> float:
    """FC2-style projections start smaller, std / sqrt(2·layers) (Megatron's scaled init)."""
    return settings.init_std / math.sqrt(2.0 * settings.num_layers)


def expert_matrix_shape(settings: MoESettings, matrix: str) -> tuple[int, ...]:
    """The full logical shape of one expert's matrix in math form (latent MoE: the latent width,
    as Megatron-LM dev@d48bd6be megatron/core/transformer/moe/experts.py TEGroupedMLP sizes FC1's
    input and FC2's output); a bias is one row of its matrix's output."""
    h, ffn = settings.routed_width, settings.ffn_hidden_size
    return {"w2": (ffn, h), "b1": (ffn,), "b3": (ffn,), "b2": (h,)}.get(matrix, (h, ffn))


def expert_shard_dim(matrix: str) -> int | None:
    """ETP splits the intermediate dimension: columns of W1/W3 and their biases, rows of W2 (never
    h, so FC2's bias is whole: None)."""
    return {"w2": 0, "b1": 0, "b3": 0, "b2": None}.get(matrix, 1)


def expert_matrix_std(settings: MoESettings, matrix: str) -> float:
    """Biases start at zero (0.0), as Megatron's linear layers initialise them."""
    if matrix in EXPERT_BIASES:
        return 0.0
    return output_init_std(settings) if matrix == "w2" else settings.init_std


def expert_init(seed: int, layer_id: int, expert: int, settings: MoESettings, matrix: str,
                dtype: torch.dtype, part: int = 0, parts: int = 1) -> torch.Tensor:
    """One expert's tensor (its ETP shard `part` of `parts`), from its global identity."""
    shape = expert_matrix_shape(settings, matrix)
    if matrix in EXPERT_BIASES:
        dim = expert_shard_dim(matrix)
        width = shape[0] // parts if dim is not None else shape[0]
        return torch.zeros(width, dtype=dtype)
    return init_shard(seed, expert_identity(layer_id, expert, matrix), shape,
                      expert_matrix_std(settings, matrix), dtype,
                      dim=expert_shard_dim(matrix) or 0, part=part, parts=parts)


def expert_identity(layer_id: int, expert_id: int, matrix: str) -> tuple[int, str, int, str]:
    return (layer_id, "expert", expert_id, matrix)


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, b, offs=offsets)


class GroupedSwiGLU(torch.autograd.Function):
    """y = ((SiLU(clamp(x W1)) ⊙ clamp(x W3)) · p) W2 per expert group, with a hand-written backward.

    The same operations autograd would record, in the same order (so forward and gradients are
    bit-identical to the plain composition), but every [M, I] intermediate is allocated once and
    reused in place. On CPU that matters: an intermediate of ≥ 32 MiB is a fresh mmap whose
    page faults cost as much as the elementwise pass itself. The backward also takes a
    contiguous gradient, which the grouped GEMM needs (`.sum().backward()` gives stride 0).
    Backward overwrites what forward saved, so the graph can be walked once only.
    """

    @staticmethod
    def forward(ctx, x, w1, w3, w2, probs, offsets, limit):  # type: ignore[override]
        gate = _grouped_mm(x, w1, offsets)
        up = _grouped_mm(x, w3, offsets)
        gate_passes = up_passes = None
        if limit is not None:  # clamp_glu_inputs' clamp, in place
            # clamp's gradient flows where the input lay inside the bounds (ends included).
            gate_passes = gate <= limit
            up_passes = (up >= -limit).logical_and_(up <= limit)
            gate.clamp_(max=limit)
            up.clamp_(min=-limit, max=limit)
        silu_gate = F.silu(gate)
        weighted = scale_by_probs(silu_gate * up, probs)
        out = _grouped_mm(weighted, w2, offsets)
        ctx.save_for_backward(
            x, w1, w3, w2, probs, offsets, gate, up, silu_gate, weighted, gate_passes, up_passes
        )
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):  # type: ignore[override]
        (x, w1, w3, w2, probs, offsets, gate, up, silu_gate, weighted, gate_passes,
         up_passes) = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_w2 = _grouped_mm(weighted.t(), grad_out, offsets)
        grad_weighted = _grouped_mm(grad_out, w2.transpose(-2, -1), offsets)
        # weighted = activation · p: dp = Σ_I dweighted ⊙ activation, dactivation = dweighted · p.
        # The activation is recomputed (bit-identical) into the buffer `weighted` no longer needs.
        activation = torch.mul(silu_gate, up, out=weighted)
        grad_probs = activation.mul_(grad_weighted).sum(dim=-1)
        grad_activation = grad_weighted.mul_(probs.unsqueeze(-1))
        # activation = SiLU(gate) ⊙ up.
        grad_silu = torch.mul(grad_activation, up, out=up)
        grad_up = grad_activation.mul_(silu_gate)
        grad_gate = torch.ops.aten.silu_backward.grad_input(
            grad_silu, gate, grad_input=silu_gate
        )
        if gate_passes is not None:
            zero = grad_gate.new_zeros(())
            torch.where(gate_passes, grad_gate, zero, out=grad_gate)
            torch.where(up_passes, grad_up, zero, out=grad_up)
        grad_x = _grouped_mm(grad_gate, w1.transpose(-2, -1), offsets)
        grad_x += _grouped_mm(grad_up, w3.transpose(-2, -1), offsets)
        grad_w1 = _grouped_mm(x.t(), grad_gate, offsets)
        grad_w3 = _grouped_mm(x.t(), grad_up, offsets)
        return grad_x, grad_w1, grad_w3, grad_w2, grad_probs, None, None


class GroupedExperts(torch.nn.Module):
    """This rank's routed experts (the plan's global ids, in local order), ETP shard `etp_rank`."""

    def __init__(
        self,
        settings: MoESettings,
        layer_id: int,
        expert_ids: Sequence[int],
        etp_rank: int,
        etp_size: int,
        seed: int,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.expert_ids = tuple(int(expert) for expert in expert_ids)
        self.etp_rank = etp_rank
        self.etp_size = etp_size
        for matrix in expert_tensors(settings):
            shards = [expert_init(seed, layer_id, expert, settings, matrix, dtype, etp_rank,
                                  etp_size) for expert in self.expert_ids]
            self.register_parameter(matrix, torch.nn.Parameter(torch.stack(shards)))

    @property
    def num_local_experts(self) -> int:
        return len(self.expert_ids)

    def forward(
        self, rows: torch.Tensor, probs: torch.Tensor, tokens_per_expert: Sequence[int]
    ) -> torch.Tensor:
        """rows [M, h] sorted by local expert with tokens_per_expert[l] rows each → [M, h]."""
        if len(tokens_per_expert) != self.num_local_experts or sum(tokens_per_expert) != len(rows):
            raise ValueError(
                f"expert input of {len(rows)} rows does not match counts {list(tokens_per_expert)}"
            )
        offsets = torch.tensor(
            list(accumulate(tokens_per_expert)), dtype=torch.int32, device=rows.device
        )
        rows = rows.to(self.w1.dtype)
        probs = probs.to(rows.dtype)
        if self.settings.activation.is_plain_swiglu and not self.settings.add_bias_linear:
            return GroupedSwiGLU.apply(
                rows, self.w1, self.w3, self.w2, probs, offsets, self.settings.swiglu_limit
            )
        return self._composed(rows, probs, offsets, tokens_per_expert)

    def _composed(self, rows: torch.Tensor, probs: torch.Tensor, offsets: torch.Tensor,
                  tokens_per_expert: Sequence[int]) -> torch.Tensor:
        """Any activation, with or without biases, as autograd composes it (Megatron-LM
        dev@d48bd6be megatron/core/transformer/moe/experts.py TEGroupedMLP.forward: FC1 adds its
        bias before the activation, the probs weight the activation, and `_apply_bias` adds FC2's
        bias times the row's prob after FC2)."""
        activation: MLPActivation = self.settings.activation
        expert_of_row = torch.repeat_interleave(
            torch.arange(self.num_local_experts, device=rows.device),
            torch.tensor(list(tokens_per_expert), device=rows.device))
        weights = dict(self.named_parameters())

        def fc1(matrix: str, bias: str) -> torch.Tensor:
            out = _grouped_mm(rows, weights[matrix], offsets)
            return out + weights[bias][expert_of_row] if bias in weights else out

        if activation.gated:
            hidden = activation.glu(fc1("w1", "b1"), fc1("w3", "b3"), self.settings.swiglu_limit)
        else:
            hidden = activation.plain(fc1("w1", "b1"))
        weight = probs.unsqueeze(-1)
        out = _ContiguousGrad.apply(_grouped_mm(hidden * weight, self.w2, offsets))
        if "b2" in weights:
            out = out + weights["b2"][expert_of_row] * weight
        return out


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward hands on a contiguous gradient: the grouped GEMM's backward
    refuses the stride-0 gradient `.sum().backward()` produces."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad.contiguous()


def shared_expert_identity(layer_id: int, matrix: str) -> tuple[int, str, str]:
    return (layer_id, "shared_expert", matrix)


class SharedExpert(torch.nn.Module):
    """Always-on expert in the dense layout, with the model's activation (W3 only when gated;
    Megatron's shared experts have no biases). Under TP it is Megatron's SharedExpertMLP, an MLP
    split like the dense one: FC1 (and W3) column-parallel, FC2 row-parallel, its rows gathered
    over the sequence-parallel shares and its output reduce-scattered back
    (megatron/core/transformer/moe/shared_experts.py SharedExpertMLP); at TP 1 it is replicated
    and reduced over dp_cp.

    V4 does not clamp the shared expert, so no limit is applied here.
    """

    def __init__(
        self, settings: MoESettings, layer_id: int, seed: int, dtype: torch.dtype,
        tp: TensorParallel | None = None, overlap: bool = False,
    ) -> None:
        super().__init__()
        self.tp = tp = tp or TensorParallel.none()
        # --moe-shared-expert-overlap gathers the rows itself and keeps them for backward
        # (SharedExpertMLP.pre_forward_comm): no second gather for the weight grads.
        self.overlap = overlap
        h, ffn = settings.hidden_size, settings.shared_ffn_hidden_size
        self.activation = settings.activation
        for matrix, shape, std, dim in (
            ("w1", (h, ffn), settings.init_std, 1),
            ("w3", (h, ffn), settings.init_std, 1),
            ("w2", (ffn, h), output_init_std(settings), 0),
        ):
            if matrix == "w3" and not self.activation.gated:
                continue
            values = init_tensor(seed, shared_expert_identity(layer_id, matrix), shape, std, dtype)
            self.register_parameter(matrix, torch.nn.Parameter(tp.shard(values, dim)))

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [n, h] in [s, b] order (this TP rank's sequence share under SP) → [n, h]."""
        weights = (self.w1, self.w3) if self.activation.gated else (self.w1,)
        if self.overlap:
            rows = self.tp.column_input(rows)
            outputs = tuple(rows @ weight for weight in weights)
        else:
            outputs = self.tp.column_linear(rows, *weights)
        if not self.activation.gated:
            hidden = self.activation.plain(outputs[0])
        else:
            hidden = self.activation.glu(outputs[0], outputs[1], None)
        return self.tp.row_output(hidden @ self.w2)

"""Single-process reference of the MoE block: a plain per-expert loop over full logical weights.

No dispatcher, no grouped GEMM, no collectives: for every expert, take the token rows routed to
it, run its full MLP (the plan's activation, add_bias_linear's biases), weight and add. It is
written independently of the runtime layer (only the initialisation, the capacity definition and
the plan's activation settings are shared) so the equivalence tests compare two implementations,
not one with itself.

Capacity dropping, forced balanced routing and the aux loss are decided per *source rank*
(Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_utils.py get_capacity counts a
rank's own tokens): the caller passes the tokens as the shards the ranks hold, in the layout's order,
and gets one output per shard. Parameter names match `MoELayer`, so
`layer.local_view(name, reference_param)` slices a reference tensor to a rank's shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.experts import (
    expert_identity,
    expert_matrix_shape,
    expert_matrix_std,
    expert_tensors,
    output_init_std,
    shared_expert_identity,
)
from runtime.init import init_tensor
from runtime.moe_layer import latent_projections
from runtime.router import AuxLossAutoScaler, MoESettings, expert_capacity


class _Holder(torch.nn.Module):
    """A bare container so parameter names read like MoELayer's (router.weight, experts.w1)."""


class ReferenceMoE(torch.nn.Module):
    """Full logical weights of one MoE layer, initialised from their global identities."""

    def __init__(self, settings: MoESettings, layer_id: int, seed: int, dtype: torch.dtype):
        super().__init__()
        self.settings = settings
        h, num_experts = settings.hidden_size, settings.num_experts
        self.router = _Holder()
        self.router.weight = torch.nn.Parameter(
            init_tensor(seed, (layer_id, "router", "weight"), (num_experts, h),
                        settings.init_std, dtype)
        )
        self.router.bias = torch.nn.Parameter(
            init_tensor(seed, (layer_id, "router", "bias"), (num_experts,), settings.init_std, dtype)
        ) if settings.add_bias_linear else None
        self.router.register_buffer("expert_bias", torch.zeros(num_experts))
        self.experts = _Holder()
        for matrix in expert_tensors(settings):
            shape, std = expert_matrix_shape(settings, matrix), expert_matrix_std(settings, matrix)
            stacked = torch.stack([
                init_tensor(seed, expert_identity(layer_id, expert, matrix), shape, std, dtype)
                if std else torch.zeros(shape, dtype=dtype)  # biases start at zero
                for expert in range(num_experts)
            ])
            self.experts.register_parameter(matrix, torch.nn.Parameter(stacked))
        self.shared_expert: _Holder | None = None
        if settings.shared_ffn_hidden_size:
            self.shared_expert = _Holder()
            ffn = settings.shared_ffn_hidden_size
            for matrix, shape, std in (
                ("w1", (h, ffn), settings.init_std),
                ("w3", (h, ffn), settings.init_std),
                ("w2", (ffn, h), output_init_std(settings)),
            ):
                if matrix == "w3" and not settings.activation.gated:
                    continue
                values = init_tensor(seed, shared_expert_identity(layer_id, matrix), shape, std,
                                     dtype)
                self.shared_expert.register_parameter(matrix, torch.nn.Parameter(values))
        # Latent MoE: the rows go h → latent before the experts and back after (names as MoELayer).
        for name, values in latent_projections(settings, layer_id, seed, dtype).items():
            self.register_parameter(name, torch.nn.Parameter(values))

    def update_expert_bias(self, global_counts: torch.Tensor, is_hash_layer: bool) -> None:
        """Same rule as the runtime: bias += rate · sign(mean − count), never on hash layers."""
        if self.settings.enable_expert_bias and not is_hash_layer:
            counts = global_counts.float()
            self.router.expert_bias += self.settings.bias_update_rate * torch.sign(
                counts.mean() - counts
            )


@dataclass
class ReferenceOutput:
    outputs: list[torch.Tensor]  # one [s, b, h] per shard
    aux_losses: list[torch.Tensor | None]  # per shard (already injected into the outputs)
    tokens_per_expert: torch.Tensor  # kept assignments per expert over all shards [E]


def _scores(logits: torch.Tensor, score_function: str) -> torch.Tensor:
    if score_function == "softmax":
        return logits.softmax(dim=-1)
    if score_function == "sigmoid":
        return logits.sigmoid()
    return F.softplus(logits).sqrt()


def _choose(
    scores: torch.Tensor,
    bias: torch.Tensor | None,
    ids: list[int] | None,
    tid2eid: torch.Tensor | None,
    force_balanced: bool,
    topk: int,
) -> list[list[int]]:
    num_tokens, num_experts = scores.shape
    if force_balanced:
        return [[(t * topk + i) % num_experts for i in range(topk)] for t in range(num_tokens)]
    if tid2eid is not None:
        if ids is None:
            raise ValueError("hash routing needs token ids")
        return [tid2eid[token].tolist() for token in ids]
    selection = scores if bias is None else scores + bias
    return torch.topk(selection, topk, dim=1).indices.tolist()


def _capacity_drop(
    chosen: list[list[int]], weights: torch.Tensor, num_experts: int, capacity: int
) -> list[list[bool]]:
    """Per expert keep the `capacity` assignments with the largest weight, earlier token first."""
    kept = [[False] * len(row) for row in chosen]
    for expert in range(num_experts):
        candidates = [
            (-float(weights[t, i]), t, i)
            for t, row in enumerate(chosen)
            for i, e in enumerate(row)
            if e == expert
        ]
        for _, t, i in sorted(candidates)[:capacity]:
            kept[t][i] = True
    return kept


def _activation(
    x: torch.Tensor, holder: torch.nn.Module, index: int | None, settings: MoESettings,
    limit: float | None
) -> torch.Tensor:
    """act(x W1 + b1) · (x W3 + b3 + offset), gate capped at +limit and up kept within ±limit;
    GELU(x W1 + b1) when not gated. `index` picks one expert of stacked tensors."""
    def take(name: str) -> torch.Tensor | None:
        tensor = getattr(holder, name, None)
        return tensor if tensor is None or index is None else tensor[index]

    def linear(weight: str, bias: str) -> torch.Tensor:
        out, b = x @ take(weight), take(bias)
        return out if b is None else out + b

    kind, offset = settings.activation.kind, settings.activation.linear_offset
    gate = linear("w1", "b1")
    if kind == "gelu":
        return 0.5 * gate * (1.0 + torch.erf(gate / 2.0**0.5))
    if kind == "squared_relu":
        return torch.clamp(gate, min=0.0) ** 2
    up = linear("w3", "b3")
    if limit is not None:
        cap = torch.tensor(limit, dtype=gate.dtype)
        gate = torch.minimum(gate, cap)
        up = torch.maximum(torch.minimum(up, cap), -cap)
    if kind == "quick_geglu":
        return gate * torch.sigmoid(1.702 * gate) * (up + offset)
    return F.silu(gate) * up


def reference_moe(
    weights: ReferenceMoE,
    shards: Sequence[torch.Tensor],
    input_ids: Sequence[torch.Tensor | None] | None = None,
    *,
    is_hash_layer: bool = False,
    tid2eid: torch.Tensor | None = None,
    force_balanced: bool = False,
    aux_groups: Sequence[Sequence[int]] | None = None,
    aux_loss_backward_scale: float = 1.0,
    training: bool = True,
) -> ReferenceOutput:
    """MoE outputs for every source-rank shard [s, b, h] (ids [b, s] for hash layers).

    `aux_groups` lists the shards that share aux-loss token counts (the tp_cp groups, e.g. the
    CP halves of the same sequences); by default every shard stands alone.
    """
    settings = weights.settings
    num_experts, topk = settings.num_experts, settings.topk
    use_bias = settings.enable_expert_bias and not is_hash_layer
    bias = weights.router.expert_bias if use_bias else None
    table = tid2eid if is_hash_layer else None
    groups = aux_groups if aux_groups is not None else [[j] for j in range(len(shards))]
    group_of = {j: group for group in groups for j in group}

    outputs: list[torch.Tensor] = []
    aux_inputs: list[tuple[torch.Tensor, torch.Tensor]] = []
    total_counts = torch.zeros(num_experts)
    for j, shard in enumerate(shards):
        seq_length, batch, h = shard.shape
        x = shard.reshape(seq_length * batch, h)
        num_tokens = x.shape[0]
        logits = x.float() @ weights.router.weight.float().t()
        if weights.router.bias is not None:
            logits = logits + weights.router.bias.float()
        scores = _scores(logits, settings.score_function)
        ids = None
        if is_hash_layer and input_ids is not None and input_ids[j] is not None:
            # Row r of the flattened [s, b] hidden is position r // b of sequence r % b.
            ids = [int(input_ids[j][r % batch, r // batch]) for r in range(num_tokens)]
        chosen = _choose(scores.detach(), bias, ids, table, force_balanced, topk)
        index = torch.tensor(chosen, dtype=torch.int64).view(num_tokens, topk)
        picked = scores.gather(1, index)
        if topk > 1 or settings.score_function == "softmax":
            picked = picked / (picked.sum(dim=1, keepdim=True) + 1e-20)
        mixing = picked * settings.scaling_factor
        kept = [[True] * topk for _ in range(num_tokens)]
        if settings.capacity_factor is not None:
            capacity = expert_capacity(num_tokens, topk, num_experts, settings.capacity_factor)
            kept = _capacity_drop(chosen, mixing.detach(), num_experts, capacity)

        latent = settings.latent_size is not None
        routed = x @ weights.fc1_latent_proj if latent else x
        y = torch.zeros(num_tokens, routed.shape[1], dtype=shard.dtype)
        for expert in range(num_experts):
            slots = [(t, i) for t in range(num_tokens) for i in range(topk)
                     if chosen[t][i] == expert and kept[t][i]]
            total_counts[expert] += len(slots)
            if not slots:
                continue
            tokens = torch.tensor([t for t, _ in slots])
            columns = torch.tensor([i for _, i in slots])
            activation = _activation(routed[tokens], weights.experts, expert, settings,
                                     settings.swiglu_limit)
            prob = mixing[tokens, columns].unsqueeze(1).to(activation.dtype)
            out = (activation * prob) @ weights.experts.w2[expert]
            if settings.add_bias_linear:  # FC2's bias, weighted by the prob as _apply_bias does
                out = out + weights.experts.b2[expert] * prob
            y = y.index_add(0, tokens, out)
        if latent:
            y = y @ weights.fc2_latent_proj
        if weights.shared_expert is not None:
            shared = weights.shared_expert
            y = y + _activation(x, shared, None, settings, None) @ shared.w2
        outputs.append(y.view(seq_length, batch, h))
        aux_inputs.append((logits, mixing))

    aux_losses: list[torch.Tensor | None] = [None] * len(shards)
    if training and torch.is_grad_enabled() and settings.aux_loss_enabled:
        normalised, routed = [], []
        for logits, _ in aux_inputs:
            s = _scores(logits, settings.score_function)
            if settings.score_function != "softmax":
                s = s / (s.sum(dim=1, keepdim=True) + 1e-20)
            top = torch.topk(s.detach(), topk, dim=1).indices
            normalised.append(s)
            routed.append(torch.zeros_like(s).scatter(1, top, 1.0))
        for j, shard in enumerate(shards):
            seq_length, batch, _ = shard.shape
            members = group_of[j]
            coefficient = num_experts * settings.aux_loss_coeff / topk
            if settings.aux_loss_type == "seq_aux_loss":
                # Rows are [s, b]-major: sum over positions, keep each sequence b apart.
                shape = (seq_length, batch, num_experts)
                counts = sum(routed[m].view(shape).sum(dim=0) for m in members)
                total = seq_length * len(members)
                per_sequence = normalised[j].view(shape).sum(dim=0)
                loss = (per_sequence * counts).sum() * coefficient / total**2 / batch
            else:
                counts = sum(routed[m].sum(dim=0) for m in members)
                total = normalised[j].shape[0] * len(members)
                loss = (normalised[j].sum(dim=0) * counts).sum() * coefficient / total**2
            aux_losses[j] = loss.detach()
            outputs[j] = AuxLossAutoScaler.apply(outputs[j], loss, aux_loss_backward_scale)
    return ReferenceOutput(outputs, aux_losses, total_counts)

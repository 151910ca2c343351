"""The runtime's MoE block: router → dispatcher → grouped experts → combine, plus shared expert.

Follow one token row: hidden [s, b, h] is viewed as n = s·b rows; the router picks k experts and
their weights; the dispatcher ships each (row, expert) assignment to the rank owning that
expert (and its ETP peers); the experts weight their SwiGLU activation by the routing weight
before FC2; the combine brings each output home and sums the k of them; the shared expert adds
its output for every row. Gradients retrace the same path through autograd collectives.

Latent MoE (moe_latent_size = ℓ) follows Megatron-LM dev@d48bd6be
megatron/core/transformer/moe/moe_layer.py MoELayer.preprocess / postprocess: the router and the
shared expert see the full rows [n, h]; the routed rows are projected h → ℓ before the dispatch
(so every EP/ETP exchange moves ℓ-wide rows and the experts run at ℓ) and the combined rows are
projected ℓ → h before the shared expert's output is added. The projections are dense weights,
whole on every rank ("duplicated" in Megatron), reduced over dp_cp.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from runtime.comm import Ledger, MoEGroups
from runtime.dispatcher import ExpertLayout, make_dispatcher
from runtime.experts import (
    EXPERT_TENSORS,
    GroupedExperts,
    SharedExpert,
    expert_shard_dim,
    output_init_std,
)
from runtime.init import init_tensor
from runtime.plan_io import PlanError
from runtime.router import MoEConfigError, MoESettings, Router, check_balanced_routing
from runtime.tensor_parallel import TensorParallel

__all__ = ["MoEConfigError", "MoELayer", "MoESettings", "latent_projections"]

LATENT_DOWN, LATENT_UP = "fc1_latent_proj", "fc2_latent_proj"


def latent_projections(settings: MoESettings, layer_id: int, seed: int,
                       dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The latent MoE projections in math form X·W (none without latent MoE): down [h, ℓ] with
    the input std, up [ℓ, h] with the scaled output std, like Megatron's init methods."""
    if settings.latent_size is None:
        return {}
    h, latent = settings.hidden_size, settings.latent_size
    return {
        name: init_tensor(seed, (layer_id, "latent_proj", name), shape, std, dtype)
        for name, shape, std in ((LATENT_DOWN, (h, latent), settings.init_std),
                                 (LATENT_UP, (latent, h), output_init_std(settings)))
    }


class MoELayer(torch.nn.Module):
    """One MoE block of a rank; parameters are this rank's shards of the logical weights.

    `owned_experts` are the global ids the plan assigns to this rank (plan.json `ranks[r].experts`);
    the layer builds exactly those and refuses them when its dispatcher would route other experts'
    tokens here.
    """

    def __init__(
        self,
        model_cfg: dict[str, Any],
        moe_cfg: dict[str, Any],
        layer_id: int,
        is_hash_layer: bool,
        groups: MoEGroups,
        ledger: Ledger,
        seed: int,
        tid2eid: torch.Tensor | None,
        dtype: torch.dtype,
        owned_experts: Sequence[int],
        tp: TensorParallel | None = None,
        shared_overlap: bool = False,
    ) -> None:
        super().__init__()
        settings = MoESettings.from_config(model_cfg, moe_cfg)
        if settings.ffn_hidden_size % groups.etp_size:
            raise MoEConfigError(
                f"moe_ffn_hidden_size ({settings.ffn_hidden_size}) must be divisible by ETP "
                f"({groups.etp_size})"
            )
        self.settings = settings
        self.layer_id = layer_id
        self.is_hash_layer = is_hash_layer
        self.router = Router(
            settings, layer_id, seed, is_hash_layer, tid2eid, groups.comm("tp_cp"), ledger,
            dtype,
        )
        self.owned_experts = tuple(int(expert) for expert in owned_experts)
        self.layout = ExpertLayout.of(settings.num_experts, groups, self._owned_block(groups))
        self.experts = GroupedExperts(
            settings, layer_id, self.owned_experts, groups.etp_rank, groups.etp_size, seed, dtype,
        )
        self.shared_expert = (
            SharedExpert(settings, layer_id, seed, dtype, tp, shared_overlap)
            if settings.shared_ffn_hidden_size > 0
            else None
        )
        self.dispatcher = make_dispatcher(settings, self.layout, groups, ledger)
        self.force_balanced = settings.force_balanced
        self.latent = settings.latent_size is not None
        for name, values in latent_projections(settings, layer_id, seed, dtype).items():
            self.register_parameter(name, torch.nn.Parameter(values))

    def _owned_block(self, groups: MoEGroups) -> range:
        """The plan's experts as the ascending block the dispatcher's splits index; the layout
        then checks it is this EP rank's equal share."""
        owned = self.owned_experts
        block = range(owned[0], owned[-1] + 1) if owned else range(0)
        if tuple(block) != owned:
            raise PlanError(
                f"layer {self.layer_id}: the plan gives EP rank {groups.ep_rank} of "
                f"{groups.ep_size} experts {list(owned)}, but the {self.settings.dispatcher} "
                "dispatcher routes one ascending contiguous block per EP rank; recompile the config"
            )
        return block

    @property
    def aux_loss_backward_scale(self) -> float:
        """Gradient fed into the aux loss in backward (e.g. 1 / microbatches, as Megatron)."""
        return self.router.aux_loss_backward_scale

    @aux_loss_backward_scale.setter
    def aux_loss_backward_scale(self, value: float) -> None:
        self.router.aux_loss_backward_scale = float(value)

    @property
    def local_tokens_per_expert(self) -> torch.Tensor:
        """Kept assignments per expert since the last bias update (R2 sums over tp_dp_cp)."""
        return self.router.local_tokens_per_expert

    @property
    def last_aux_loss(self) -> torch.Tensor | None:
        return self.router.last_aux_loss

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor | None) -> torch.Tensor:
        """hidden [s_local, b, h] (already CP-split), input_ids [b, s_local] → [s_local, b, h]."""
        seq_length, batch, width = hidden.shape
        rows = hidden.reshape(seq_length * batch, width)
        if self.force_balanced:
            check_balanced_routing(rows.shape[0], self.settings.topk, self.settings.num_experts)
        token_ids = None
        if self.is_hash_layer and input_ids is not None:
            # hidden rows are [s, b]-major but ids are [b, s]: transpose to align them.
            token_ids = input_ids.t().reshape(-1)
        routing = self.router(rows, token_ids, seq_length, batch, self.force_balanced)
        routed = rows @ self.fc1_latent_proj if self.latent else rows
        dispatched = self.dispatcher.dispatch(routed, routing)
        expert_out = self.experts(
            dispatched.rows, dispatched.probs, dispatched.tokens_per_expert
        )
        out = self.dispatcher.combine(expert_out, dispatched.state).to(hidden.dtype)
        if self.latent:
            out = out @ self.fc2_latent_proj
        if self.shared_expert is not None:
            out = out + self.shared_expert(rows)
        return out.view(seq_length, batch, width)

    def expert_parameters(self) -> list[torch.nn.Parameter]:
        """Routed-expert shards: reduced over expt_dp."""
        return list(self.experts.parameters())

    def dense_parameters(self) -> list[torch.nn.Parameter]:
        """Router, shared expert and latent projections: reduced over dp_cp (the shared expert
        TP-split, the rest replicated over TP)."""
        params = list(self.router.parameters())
        if self.shared_expert is not None:
            params += list(self.shared_expert.parameters())
        if self.latent:
            params += [self.fc1_latent_proj, self.fc2_latent_proj]
        return params

    def update_expert_bias(self, global_counts: torch.Tensor) -> None:
        """bias += sign(mean − count) · rate from counts summed over tp_dp_cp; clears counts."""
        self.router.update_expert_bias(global_counts)

    def local_view(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full logical tensor named like this layer's parameters.

        Expert tensors are [E, ...] stacks in math form; the rank keeps its L experts and its
        ETP shard of the intermediate dimension. Dense tensors are returned whole (the shared
        expert's TP shard is cut by the caller, runtime/model.py tensor_parallel_split).
        """
        prefix, _, matrix = name.partition(".")
        if prefix != "experts" or matrix not in EXPERT_TENSORS:
            return full
        local = full[list(self.owned_experts)]
        shard = expert_shard_dim(matrix)
        if shard is None:
            return local
        dim = 1 + shard
        width = full.shape[dim] // self.layout.etp_size
        return local.narrow(dim, self.layout.etp_rank * width, width)

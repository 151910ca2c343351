"""MoE settings and the router: scores, top-k selection, capacity, aux loss, expert-bias counts.

Selection uses the biased score, mixing uses the raw affinity (Megatron-LM dev@d48bd6be
megatron/core/transformer/moe/moe_utils.py topk_routing_with_score_function):
``I_t = TopK(s_t + β, k)``, ``g_{t,e} = α · s_{t,e} / Σ_{j∈I_t} s_{t,j}``. The expert bias β only
decides *which* experts are picked, and is moved by `update_expert_bias`, not by the optimizer.
The aux loss is not returned: it rides on the routing weights through `AuxLossAutoScaler`, which
injects its gradient in backward (Megatron's MoEAuxLossAutoScaler idea).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from runtime.activation import MLPActivation
from runtime.comm import CommGroup, Ledger, all_reduce
from runtime.init import DEFAULT_INIT_STD, init_tensor
from runtime.plan_io import required

SCORE_FUNCTIONS = ("softmax", "sigmoid", "sqrtsoftplus")
DISPATCHERS = ("alltoall", "allgather")
AUX_LOSS_TYPES = ("aux_loss", "seq_aux_loss", "none")
# Megatron adds this to the top-k normaliser so an all-zero row cannot divide by zero.
NORMALISER_EPS = 1e-20


class MoEConfigError(ValueError):
    """A config or layout the runtime's MoE layer cannot run; the message says why."""


@dataclass(frozen=True)
class MoESettings:
    """The MoE part of the plan's config, validated once (the runtime never guesses)."""

    hidden_size: int
    num_experts: int
    topk: int
    ffn_hidden_size: int
    shared_ffn_hidden_size: int
    score_function: str
    scaling_factor: float
    enable_expert_bias: bool
    bias_update_rate: float
    swiglu_limit: float | None
    dispatcher: str
    capacity_factor: float | None
    pad_to_capacity: bool
    aux_loss_type: str
    aux_loss_coeff: float
    force_balanced: bool
    num_layers: int
    init_std: float
    latent_size: int | None = None  # latent MoE: routed rows and experts at this width
    # The MLP activation (model.swiglu / quick_geglu / glu_linear_offset) and add_bias_linear's
    # biases on the router and the routed experts' FC1 / FC2.
    activation: MLPActivation = MLPActivation()
    add_bias_linear: bool = False

    @property
    def routed_width(self) -> int:
        """Width of the rows the dispatcher moves and the routed experts take and return."""
        return self.latent_size or self.hidden_size

    @classmethod
    def from_config(cls, model_cfg: dict[str, Any], moe_cfg: dict[str, Any]) -> MoESettings:
        """Read the plan's resolved `config.model` / `config.moe`: every field is there (the
        compiler dumps defaults too), so a missing one is a PlanError, never a local default.
        None keeps Megatron's meaning: no top-k scaling (1), no clamp, no capacity limit."""

        def model(key: str) -> Any:
            return required(model_cfg, key, "config.model")

        def moe(key: str) -> Any:
            return required(moe_cfg, key, "config.moe")

        try:
            scaling = model("moe_router_topk_scaling_factor")
            limit = model("swiglu_limit")
            capacity = moe("moe_expert_capacity_factor")
            latent = moe("moe_latent_size")
            settings = cls(
                hidden_size=int(model("hidden_size")),
                num_experts=int(model("num_experts")),
                topk=int(model("moe_router_topk")),
                ffn_hidden_size=int(model("moe_ffn_hidden_size")),
                shared_ffn_hidden_size=int(model("moe_shared_expert_intermediate_size")),
                score_function=str(model("moe_router_score_function")),
                scaling_factor=1.0 if scaling is None else float(scaling),
                enable_expert_bias=bool(model("moe_router_enable_expert_bias")),
                bias_update_rate=float(model("moe_router_bias_update_rate")),
                swiglu_limit=None if limit is None else float(limit),
                dispatcher=str(moe("moe_token_dispatcher_type")),
                capacity_factor=None if capacity is None else float(capacity),
                pad_to_capacity=bool(moe("moe_pad_expert_input_to_capacity")),
                aux_loss_type=str(moe("moe_router_load_balancing_type")),
                aux_loss_coeff=float(moe("moe_aux_loss_coeff")),
                force_balanced=bool(moe("moe_router_force_load_balancing")),
                num_layers=int(model("num_layers")),
                # Not a config field (the schema has none): Megatron's init_method_std default.
                init_std=DEFAULT_INIT_STD,
                latent_size=None if latent is None else int(latent),
                activation=MLPActivation.from_config(model_cfg),
                add_bias_linear=bool(model("add_bias_linear")),
            )
        except (TypeError, ValueError) as bad:
            raise MoEConfigError(f"config has a malformed MoE value: {bad}") from None
        settings.validate()
        return settings

    def validate(self) -> None:
        problems = []
        if self.num_experts < 1 or not 1 <= self.topk <= self.num_experts:
            problems.append(f"need 1 <= moe_router_topk ({self.topk}) <= num_experts "
                            f"({self.num_experts})")
        if self.hidden_size < 1 or self.ffn_hidden_size < 1 or self.shared_ffn_hidden_size < 0:
            problems.append("hidden_size and moe_ffn_hidden_size must be positive")
        if self.latent_size is not None and self.latent_size < 1:
            problems.append(f"moe_latent_size must be positive, got {self.latent_size}")
        if self.score_function not in SCORE_FUNCTIONS:
            problems.append(f"moe_router_score_function {self.score_function!r} is not one of "
                            f"{SCORE_FUNCTIONS}")
        if self.dispatcher == "flex":
            problems.append("the flex dispatcher is not implemented by the bundled runtime; "
                            "use moe_token_dispatcher_type alltoall or allgather")
        elif self.dispatcher not in DISPATCHERS:
            problems.append(f"moe_token_dispatcher_type {self.dispatcher!r} is not one of "
                            f"{DISPATCHERS}")
        if self.aux_loss_type not in AUX_LOSS_TYPES:
            problems.append(f"moe_router_load_balancing_type {self.aux_loss_type!r} is not "
                            f"supported by the runtime (supported: {AUX_LOSS_TYPES})")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            problems.append(f"moe_expert_capacity_factor must be > 0, got {self.capacity_factor}")
        if self.pad_to_capacity and self.capacity_factor is None:
            problems.append("moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor")
        if self.pad_to_capacity and self.dispatcher == "allgather":
            problems.append("drop-and-pad is only implemented for the alltoall dispatcher")
        if self.swiglu_limit is not None and self.swiglu_limit <= 0:
            problems.append(f"swiglu_limit must be > 0, got {self.swiglu_limit}")
        if self.add_bias_linear and self.shared_ffn_hidden_size > 0:
            # Megatron-LM dev@d48bd6be megatron/core/transformer/moe/shared_experts.py
            # SharedExpertMLP.__init__ asserts add_bias_linear is False.
            problems.append("add_bias_linear with a shared expert: Megatron's shared experts have "
                            "no biases (set moe_shared_expert_intermediate_size: 0 or "
                            "add_bias_linear: false)")
        if problems:
            raise MoEConfigError("; ".join(problems))

    @property
    def drops_tokens(self) -> bool:
        return self.capacity_factor is not None

    @property
    def aux_loss_enabled(self) -> bool:
        return self.aux_loss_type != "none" and self.aux_loss_coeff > 0


def expert_capacity(num_tokens: int, topk: int, num_experts: int, factor: float) -> int:
    """Per-source-rank capacity c = ceil(n·k/E · factor) (Megatron-LM dev@d48bd6be
    megatron/core/transformer/moe/moe_utils.py get_capacity)."""
    return math.ceil((num_tokens * topk / num_experts) * factor)


def check_balanced_routing(num_tokens: int, topk: int, num_experts: int) -> None:
    """Forced balanced routing needs E | n·k so every expert gets exactly n·k/E assignments."""
    if (num_tokens * topk) % num_experts:
        raise MoEConfigError(
            f"forced balanced routing needs num_experts ({num_experts}) to divide local "
            f"tokens x topk ({num_tokens} x {topk} = {num_tokens * topk})"
        )


def balanced_experts(num_tokens: int, topk: int, num_experts: int, device) -> torch.Tensor:
    """Assignment i of local token t goes to expert (t·k + i) mod E (the shared contract)."""
    check_balanced_routing(num_tokens, topk, num_experts)
    slots = torch.arange(num_tokens * topk, device=device).view(num_tokens, topk)
    return slots % num_experts


def affinity(logits: torch.Tensor, score_function: str) -> torch.Tensor:
    """s = score(logits) in fp32: softmax over experts, sigmoid, or sqrt(softplus)."""
    logits = logits.float()
    if score_function == "softmax":
        return torch.softmax(logits, dim=-1)
    if score_function == "sigmoid":
        return torch.sigmoid(logits)
    return torch.sqrt(F.softplus(logits))


def mixing_weights(
    scores: torch.Tensor, experts: torch.Tensor, settings: MoESettings
) -> torch.Tensor:
    """g = α · s_chosen / Σ s_chosen (no normalising a single sigmoid-style score, as Megatron)."""
    chosen = scores.gather(1, experts)
    if settings.topk > 1 or settings.score_function == "softmax":
        chosen = chosen / (chosen.sum(dim=-1, keepdim=True) + NORMALISER_EPS)
    return chosen * settings.scaling_factor


def capacity_keep_mask(
    experts: torch.Tensor, weights: torch.Tensor, num_experts: int, capacity: int
) -> torch.Tensor:
    """[n, k] bool: per expert keep the `capacity` assignments with the largest weight.

    Ties keep the earlier token. Decided on this rank's tokens only: capacity competition is
    per source rank.
    """
    flat_experts = experts.reshape(-1)
    by_weight = torch.sort(weights.detach().reshape(-1), descending=True, stable=True).indices
    order = by_weight[torch.sort(flat_experts[by_weight], stable=True).indices]
    counts = torch.bincount(flat_experts, minlength=num_experts)
    starts = torch.cumsum(counts, 0) - counts
    place = torch.arange(order.numel(), device=experts.device) - starts[flat_experts[order]]
    keep = torch.zeros_like(flat_experts, dtype=torch.bool)
    keep[order] = place < capacity
    return keep.view_as(experts)


class AuxLossAutoScaler(torch.autograd.Function):
    """Identity on the activation; in backward, feeds d(aux_loss) = scale into the aux loss."""

    @staticmethod
    def forward(ctx, activation, aux_loss, scale):  # type: ignore[override]
        ctx.save_for_backward(aux_loss)
        ctx.scale = scale
        return activation.view_as(activation)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (aux_loss,) = ctx.saved_tensors
        return grad, torch.full_like(aux_loss, ctx.scale), None


def load_balancing_loss(
    scores: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    total_tokens: int,
    settings: MoESettings,
) -> torch.Tensor:
    """Switch-style loss E·coeff/(k·T²) · Σ_e P_e · f_e (Megatron switch_load_balancing_loss)."""
    factor = settings.num_experts * settings.aux_loss_coeff / (
        settings.topk * total_tokens * total_tokens
    )
    return torch.sum(scores.sum(dim=0) * tokens_per_expert) * factor


def aux_loss_inputs(
    logits: torch.Tensor, settings: MoESettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised scores and their unbiased top-k map, used only by the aux loss."""
    scores = affinity(logits, settings.score_function)
    if settings.score_function != "softmax":
        scores = scores / (scores.sum(dim=-1, keepdim=True) + NORMALISER_EPS)
    top = torch.topk(scores.detach(), settings.topk, dim=1).indices
    routed = torch.zeros_like(scores).scatter(1, top, 1.0)
    return scores, routed


@dataclass
class Routing:
    """The router's decision for n local token rows."""

    experts: torch.Tensor  # [n, k] int64 chosen expert ids
    weights: torch.Tensor  # [n, k] fp32 mixing weights, zero where capacity dropped
    kept: torch.Tensor | None  # [n, k] bool, None when nothing can be dropped
    capacity: int | None  # per-expert capacity on this rank when dropping

    def kept_experts(self) -> torch.Tensor:
        return self.experts.reshape(-1) if self.kept is None else self.experts[self.kept]


class Router(torch.nn.Module):
    """Gating linear + top-k / hash / forced-balanced selection + capacity + aux loss."""

    def __init__(
        self,
        settings: MoESettings,
        layer_id: int,
        seed: int,
        is_hash_layer: bool,
        tid2eid: torch.Tensor | None,
        tp_cp: CommGroup,
        ledger: Ledger | None,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.is_hash_layer = is_hash_layer
        self.tp_cp = tp_cp
        self.ledger = ledger
        shape = (settings.num_experts, settings.hidden_size)
        self.weight = torch.nn.Parameter(
            init_tensor(seed, (layer_id, "router", "weight"), shape, settings.init_std, dtype)
        )
        # add_bias_linear: the gating linear's bias [E], drawn like the weight (Megatron-LM
        # dev@d48bd6be megatron/core/transformer/moe/router.py Router.__init__ / reset_parameters).
        self.bias = torch.nn.Parameter(
            init_tensor(seed, (layer_id, "router", "bias"), (settings.num_experts,),
                        settings.init_std, dtype)) if settings.add_bias_linear else None
        # V4's hash layers have no gate bias: the table decides, the bias could not act.
        self.uses_expert_bias = settings.enable_expert_bias and not is_hash_layer
        self.register_buffer("expert_bias", torch.zeros(settings.num_experts))
        self.register_buffer(
            "local_tokens_per_expert", torch.zeros(settings.num_experts), persistent=False
        )
        if is_hash_layer:
            if tid2eid is None:
                raise MoEConfigError(f"hash layer {layer_id} needs a tid2eid table")
            if tid2eid.dim() != 2 or tid2eid.shape[1] != settings.topk:
                raise MoEConfigError(
                    f"tid2eid must be [vocab, topk={settings.topk}], got {tuple(tid2eid.shape)}"
                )
            if int(tid2eid.min()) < 0 or int(tid2eid.max()) >= settings.num_experts:
                raise MoEConfigError("tid2eid holds expert ids outside [0, num_experts)")
            self.register_buffer("tid2eid", tid2eid.to(torch.int64).clone())
        else:
            self.tid2eid = None
        self.aux_loss_backward_scale = 1.0
        self.last_aux_loss: torch.Tensor | None = None

    def forward(
        self,
        rows: torch.Tensor,
        token_ids: torch.Tensor | None,
        seq_length: int,
        batch: int,
        force_balanced: bool,
    ) -> Routing:
        settings = self.settings
        num_tokens = rows.shape[0]
        logits = F.linear(rows.float(), self.weight.float(),
                          None if self.bias is None else self.bias.float())
        scores = affinity(logits, settings.score_function)
        experts = self._select(scores.detach(), token_ids, force_balanced)
        weights = mixing_weights(scores, experts, settings)

        kept: torch.Tensor | None = None
        capacity: int | None = None
        if settings.drops_tokens:
            capacity = expert_capacity(
                num_tokens, settings.topk, settings.num_experts, settings.capacity_factor
            )
            if settings.pad_to_capacity and capacity > num_tokens:
                raise MoEConfigError(
                    f"capacity {capacity} exceeds the {num_tokens} local tokens: lower "
                    "moe_expert_capacity_factor or turn off padding to capacity"
                )
            kept = capacity_keep_mask(experts, weights, settings.num_experts, capacity)
            weights = weights * kept

        if self.training and torch.is_grad_enabled() and settings.aux_loss_enabled:
            aux_loss = self._aux_loss(logits, seq_length, batch)
            self.last_aux_loss = aux_loss.detach()
            weights = AuxLossAutoScaler.apply(weights, aux_loss, self.aux_loss_backward_scale)

        routing = Routing(experts=experts, weights=weights, kept=kept, capacity=capacity)
        if torch.is_grad_enabled():
            with torch.no_grad():
                self.local_tokens_per_expert += torch.bincount(
                    routing.kept_experts(), minlength=settings.num_experts
                ).to(self.local_tokens_per_expert.dtype)
        return routing

    def _select(
        self, scores: torch.Tensor, token_ids: torch.Tensor | None, force_balanced: bool
    ) -> torch.Tensor:
        settings = self.settings
        if force_balanced:
            return balanced_experts(
                scores.shape[0], settings.topk, settings.num_experts, scores.device
            )
        if self.is_hash_layer:
            if token_ids is None:
                raise MoEConfigError("a hash-routed layer needs input_ids")
            return self.tid2eid[token_ids]
        selection = scores + self.expert_bias if self.uses_expert_bias else scores
        return torch.topk(selection, settings.topk, dim=1).indices

    def _aux_loss(self, logits: torch.Tensor, seq_length: int, batch: int) -> torch.Tensor:
        settings = self.settings
        scores, routed = aux_loss_inputs(logits, settings)
        if settings.aux_loss_type == "seq_aux_loss":
            # Rows are [s, b] flattened: view as [s, b·E] to keep each sequence apart.
            scores = scores.reshape(seq_length, batch * settings.num_experts)
            routed = routed.reshape(seq_length, batch * settings.num_experts)
        tokens = routed.sum(dim=0)
        all_reduce(tokens, self.tp_cp, self.ledger, "aux_loss_count_reduce")
        total = scores.shape[0] * self.tp_cp.size
        loss = load_balancing_loss(scores, tokens, total, settings)
        return loss / batch if settings.aux_loss_type == "seq_aux_loss" else loss

    def update_expert_bias(self, global_counts: torch.Tensor) -> None:
        """β += sign(mean(count) − count) · rate, then clear the local counts."""
        if self.uses_expert_bias:
            counts = global_counts.to(self.expert_bias.device, torch.float32)
            step = torch.sign(counts.mean() - counts) * self.settings.bias_update_rate
            self.expert_bias += step
        self.local_tokens_per_expert.zero_()

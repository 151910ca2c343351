"""The whole model in one process over the whole global batch: the runtime's ground truth.

It is the same `Decoder` (same dense weights, same attention math over the full sequence, no
collectives) with each MoE block replaced by `reference_moe`, a per-expert loop over the full
logical expert weights. Weights come from the same global identities, so a rank's parameters are
slices of these (`MoELayer.local_view`). What depends on the layout by definition — capacity
competition per source rank, aux-loss statistics per `tp_cp` group — is reproduced by
cutting each sequence into the plan's CP shards (and each of those into its TP ranks' rows under
sequence parallelism) before the MoE call. Its gradient is the exact
gradient of the global objective: mean token loss over the global batch plus the aux losses with
the coefficient the distributed reduction gives them, 1/(m·|dp_cp|) per (rank, microbatch).
The MTP term is normalised per CP shard, as each rank normalises it by its own count of valid
shifted positions, and enters with the same 1/(m·|dp_cp|) per (shard, microbatch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runtime.comm import CommGroup
from runtime.model import (
    Decoder,
    DecoderSpec,
    MTPTargets,
    TokenSlice,
    cp_slices,
    mtp_loss,
    token_losses,
)
from runtime.plan_io import Plan, required
from runtime.precision import MainGrads, MainParams, Precision, cast_parameters
from runtime.reference_moe import ReferenceMoE, reference_moe
from runtime.router import MoESettings
from runtime.train import batch_layout, build_tid2eid, make_optimizer, named_state


class ReferenceMoEBlock(ReferenceMoE):
    """One MoE layer over whole sequences, routed per CP shard exactly as the ranks route."""

    def __init__(self, settings: MoESettings, layer_id: int, seed: int, is_hash_layer: bool,
                 tid2eid: torch.Tensor | None, slices: list[TokenSlice],
                 aux_loss_backward_scale: float) -> None:
        super().__init__(settings, layer_id, seed, torch.float32)
        self.is_hash_layer = is_hash_layer
        self.tid2eid = tid2eid
        self.shard_index = [s.index() for s in slices]
        self.restore = torch.cat(self.shard_index).argsort()
        self.aux_loss_backward_scale = aux_loss_backward_scale
        self.step_counts = torch.zeros(settings.num_experts)

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """hidden [S, b, h], ids [b, S] → [S, b, h]; shards are the CP ranks' row sets."""
        shards = [hidden.index_select(0, index) for index in self.shard_index]
        ids = [input_ids.index_select(1, index) for index in self.shard_index]
        result = reference_moe(
            self, shards, ids, is_hash_layer=self.is_hash_layer, tid2eid=self.tid2eid,
            force_balanced=self.settings.force_balanced,
            aux_groups=[list(range(len(shards)))],
            aux_loss_backward_scale=self.aux_loss_backward_scale, training=self.training,
        )
        if torch.is_grad_enabled():
            self.step_counts += result.tokens_per_expert
        return torch.cat(result.outputs).index_select(0, self.restore)

    def finish_step(self) -> None:
        """The bias rule on the step's counts over the whole global batch, then clear them."""
        self.update_expert_bias(self.step_counts, self.is_hash_layer)
        self.step_counts.zero_()


@dataclass
class ReferenceStep:
    """One step of the reference, keyed the way ranks look it up."""

    # (dp replica, microbatch) -> per-token loss [b, S] and MoE outputs {layer: [S, b, h]}
    token_losses: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    moe_outputs: dict[tuple[int, int], dict[int, torch.Tensor]] = field(default_factory=dict)
    # (dp replica, microbatch) -> per MTP depth: (masked per-token loss [b, S], mask [b, S])
    mtp_losses: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = field(
        default_factory=dict)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class ReferenceResult:
    steps: list[ReferenceStep]
    final_state: dict[str, torch.Tensor]
    slices: list[TokenSlice]


class ReferenceModel:
    """Builds the single-process model for a plan and trains it on the global batch."""

    def __init__(self, plan: Plan, seed: int, balanced: bool) -> None:
        self.plan = plan
        self.batches = batch_layout(plan, seed)
        cp_size = int(plan.layout["cp"])
        mode = str(required(plan.parallel, "cp_partition_mode", "config.parallel"))
        self.slices = cp_slices(self.batches.seq_length, cp_size, mode)
        # The MoE layers' source ranks: under sequence parallelism each CP shard is cut again
        # into its TP ranks' rows (capacity, balancing and the aux loss count per source rank).
        tp = int(plan.layout["tp"])
        sp = tp > 1 and bool(required(plan.parallel, "sequence_parallel", "config.parallel"))
        moe_shards = [TokenSlice(cp_slice.positions[part * len(cp_slice) // tp:
                                                    (part + 1) * len(cp_slice) // tp])
                      for cp_slice in self.slices for part in range(tp if sp else 1)]
        model_cfg, moe_cfg = dict(plan.model), dict(plan.moe)
        if balanced:
            moe_cfg["moe_router_force_load_balancing"] = True
        settings = MoESettings.from_config(model_cfg, moe_cfg)
        # The distributed aux gradient is 1/m per (rank, microbatch), then 1/|dp_cp| in the
        # gradient reduction.
        dp_cp = int(plan.layout["dp"]) * cp_size
        aux_scale = 1.0 / (self.batches.microbatches * dp_cp)
        spec = DecoderSpec.from_config(plan.model, plan.moe_layers(), plan.hash_layers(),
                                       plan.padded_vocab_size)

        def moe_factory(layer_id: int, is_hash: bool) -> ReferenceMoEBlock:
            tid2eid = (build_tid2eid(seed, layer_id, spec.vocab_size, settings.num_experts,
                                     settings.topk) if is_hash else None)
            return ReferenceMoEBlock(settings, layer_id, seed, is_hash, tid2eid, moe_shards,
                                     aux_scale)

        self.model = Decoder(spec, seed, torch.float32, CommGroup("cp", None), None, moe_factory)
        self.model.record_moe_outputs = True
        # the ranks' precision: bf16 weights and compute, main grads and fp32 main params
        precision = Precision.of(plan)
        cast_parameters(self.model, precision.params)
        self.main_grads = MainGrads(self.model.parameters(), precision.grads)
        self.mains = MainParams(list(self.model.parameters()), self.main_grads)
        self.optimizer = make_optimizer(self.mains, plan.training)
        self.positions = torch.arange(self.batches.seq_length)

    def step(self, step: int, optimizer_grads: dict[str, torch.Tensor] | None = None
             ) -> ReferenceStep:
        """One step over the global batch. `optimizer_grads`, when given, replace the reference's
        own gradients for the AdamW update only (after they were recorded for comparison)."""
        record = ReferenceStep()
        self.optimizer.zero_grad()
        self.model.zero_grad(set_to_none=False)
        self.main_grads.zero()
        m, dp = self.batches.microbatches, self.batches.dp_size
        for microbatch in range(m):
            for dp_rank in range(dp):
                ids, labels = self.batches.tokens(step, microbatch, dp_rank)
                depths = self.model.spec.mtp_num_layers
                targets = MTPTargets.of(ids, labels, depths) if depths else None
                logits, mtp_logits = self.model(ids, self.positions, self.positions,
                                                targets.ids if targets is not None else None)
                losses = token_losses(logits, labels)
                objective = losses.mean()
                if targets is not None:
                    objective = objective + self._mtp_objective(mtp_logits, targets)
                    record.mtp_losses[dp_rank, microbatch] = [
                        ((token_losses(depth_logits, depth_labels) * mask).detach(), mask)
                        for depth_logits, depth_labels, mask
                        in zip(mtp_logits, targets.labels, targets.masks, strict=True)]
                (objective / (m * dp)).backward()
                record.token_losses[dp_rank, microbatch] = losses.detach()
                record.moe_outputs[dp_rank, microbatch] = dict(self.model.moe_outputs)
        # main_grads.grad: a zero grad where none arrived, as the ranks' reduction leaves it, so
        # AdamW treats both alike
        record.grads = {name: self.main_grads.grad(p).detach().clone()
                        for name, p in self.model.named_parameters()}
        if optimizer_grads is not None:
            for name, p in self.model.named_parameters():
                self.main_grads.grad(p).copy_(optimizer_grads[name])
        for layer in self.model.decoder_layers():
            if layer.is_moe:
                layer.ffn.finish_step()
        self.mains.load_grads()
        self.optimizer.step()
        self.mains.store()
        return record

    def _mtp_objective(self, logits: list[torch.Tensor], targets: MTPTargets) -> torch.Tensor:
        """The mean over CP shards of each shard's MTP term (its own normalisation)."""
        terms = []
        for shard in self.slices:
            index = shard.index()
            term, _ = mtp_loss([depth.index_select(0, index) for depth in logits],
                               targets.select(index), self.model.spec.mtp_loss_scale,
                               per_token=False)
            terms.append(term)
        return torch.stack(terms).mean()

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(p.shape) for name, p in self.model.named_parameters()}

    def run(self, steps: int, optimizer_grads: list[dict[str, torch.Tensor]] | None = None
            ) -> ReferenceResult:
        records = [self.step(step, None if optimizer_grads is None else optimizer_grads[step])
                   for step in range(steps)]
        return ReferenceResult(records, named_state(self.model), self.slices)

"""Pipeline parallelism: this rank's stage of the decoder, run by torch.distributed.pipelining.

The plan splits layers into stages and virtual chunks (`stages[s].chunks`); nothing is
re-derived here. A rank builds:

* one `StageModel` holding every parameter of its chunks under the *reference's* names
  (`embedding`, `layers.<id>.…`, `final_norm.weight`, `head`), so the gradient reduction, the
  optimizer and the reference check see one module, exactly as with PP = 1. With tied embeddings
  the last stage holds its own copy named `embedding` (Megatron's output-layer copy): both copies
  start equal (same identity) and stay equal because their gradients are summed over the plan's
  `embd` group before the optimizer step (finalize_model_grads' embedding all-reduce). A stage
  holding MTP depths (`mtp.<d>.…`, run after the loss chunk's final norm) holds such a copy as
  well, for the embedding of the shifted ids, synced over `embd` the same way;
* one `StageChunk` per virtual chunk, wrapped in a `PipelineStage` with stage index
  `virtual · PP + stage`, and a `Schedule1F1B` (VPP = 1) or `ScheduleInterleaved1F1B` schedule.

Loss scaling: the schedule's `scale_grads` is off. The loss function itself returns the local
mean token loss / m (or the token-loss sum with per-token loss), exactly what the PP = 1 loop
backpropagates, so the aux-loss gradient (scaled inside the MoE block) is not divided twice.

Every point-to-point activation the schedule sends or receives goes through the stage's
`get_{fwd,bwd}_{send,recv}_ops`; those are wrapped to record the tensors' bytes in the ledger as
`pp_activation.fwd` (activations) and `pp_activation.bwd` (their gradients).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from runtime.comm import Ledger
from runtime.failure import maybe_inject_failure
from runtime.heartbeat import note_microbatch
from runtime.init import init_tensor
from runtime.model import (
    DecoderLayer,
    DecoderSpec,
    MTPLayer,
    MTPTargets,
    RMSNorm,
    run_mtp,
)
from runtime.recompute import NO_RECOMPUTE, run_blocks
from runtime.tensor_parallel import TensorParallel, vocab_parallel_embedding

if TYPE_CHECKING:
    from torch.distributed.pipelining import PipelineStage

# Builds one decoder layer by id (the trainer's MoE factory and groups are already bound).
LayerFactory = Callable[[int], DecoderLayer]
# (logits, labels) -> (what to backpropagate, the mean token loss for the record).
LossOf = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# (MTP logits per depth, targets) -> (MTP term to backpropagate, each depth's mean loss).
MTPLossOf = Callable[[list[torch.Tensor], MTPTargets], tuple[torch.Tensor, list[float]]]


class _CarryLoss(torch.autograd.Function):
    """Identity on the logits whose backward also starts `loss`'s backward with gradient 1: the
    MTP term rides on the main output into the schedule's loss backward (Megatron's
    MTPLossAutoScaler, with the scale already applied to the term)."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        ctx.loss_shape = loss.shape
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, torch.ones(ctx.loss_shape, dtype=grad.dtype, device=grad.device)


class StageModel(torch.nn.Module):
    """Every parameter of one pipeline rank, named as in the single-process `Decoder`."""

    def __init__(self, spec: DecoderSpec, chunks: list[dict[str, Any]], seed: int,
                 dtype: torch.dtype, make_layer: LayerFactory,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.tp = tp = tp or TensorParallel.none()
        has_loss = any(chunk["loss"] for chunk in chunks)
        has_embedding = any(chunk["embedding"] for chunk in chunks)
        depths = [int(depth) for chunk in chunks for depth in chunk.get("mtp_layers", [])]
        needs_word_embedding = (has_embedding or (has_loss and not spec.untied_head)
                                or bool(depths))
        # vocab-parallel under TP: this rank's rows of the table and of the output layer
        self.embedding = (
            torch.nn.Parameter(tp.shard(init_tensor(seed, ("embedding", "word"), (
                spec.vocab_size, spec.hidden_size), spec.init_std, dtype), 0))
            if needs_word_embedding else None)
        self.layers = torch.nn.ModuleDict(
            {str(layer): make_layer(layer) for chunk in chunks for layer in chunk["layers"]})
        self.final_norm = (RMSNorm(spec.hidden_size, spec.norm_epsilon, dtype) if has_loss
                           else None)
        self.head = (
            torch.nn.Parameter(tp.shard(init_tensor(seed, ("output_head",), (
                spec.vocab_size, spec.hidden_size), spec.init_std, dtype), 0))
            if has_loss and spec.untied_head else None)
        self.mtp = torch.nn.ModuleDict(
            {str(depth): MTPLayer(spec, depth, seed, dtype, make_layer(spec.num_layers + depth),
                                  tp)
             for depth in depths})
        self.recompute = NO_RECOMPUTE  # the trainer sets the plan's (runtime/recompute.py)

    def layer(self, layer_id: int) -> DecoderLayer:
        """A decoder layer, or the block of MTP depth layer_id − L."""
        if layer_id >= self.spec.num_layers:
            return self.mtp[str(layer_id - self.spec.num_layers)].block  # type: ignore[return-value]
        return self.layers[str(layer_id)]  # type: ignore[return-value]

    def mtp_layers(self) -> list[MTPLayer]:
        return [self.mtp[key] for key in sorted(self.mtp, key=int)]  # type: ignore[misc]

    def decoder_layers(self) -> list[DecoderLayer]:
        """Every transformer block of the stage, MTP blocks last."""
        return ([self.layer(layer) for layer in sorted(int(key) for key in self.layers)]
                + [mtp.block for mtp in self.mtp_layers()])  # type: ignore[misc]

    def output_weight(self) -> torch.Tensor:
        weight = self.head if self.head is not None else self.embedding
        assert weight is not None  # noqa: S101 - only the loss chunk asks
        return weight


@dataclass
class StepState:
    """What the chunks of one step share: the step index, per-microbatch MoE outputs, losses."""

    step: int
    record: bool
    moe_outputs: list[dict[int, torch.Tensor]]
    losses: list[float]
    mtp_losses: list[list[float]]  # per microbatch, per depth (the MTP chunk's stage only)


class StageChunk(torch.nn.Module):
    """One virtual chunk: [embedding] → its layers → [final norm → logits].

    The chunk's forward calls arrive in microbatch order (both schedules keep it), so a counter
    tells which microbatch is running; chunks away from the embedding read the token ids they
    need for hash routing from the data themselves instead of shipping them down the pipeline.
    """

    def __init__(self, owner: StageModel, chunk: dict[str, Any], runner: PipelineRunner) -> None:
        super().__init__()
        self.index = int(chunk["index"])
        self.first = bool(chunk["embedding"])
        self.last = bool(chunk["loss"])
        self.layer_ids = [int(layer) for layer in chunk["layers"]]
        self.owner = owner
        self.blocks = torch.nn.ModuleList(owner.layer(layer) for layer in self.layer_ids)
        self.mtp_depths = [int(depth) for depth in chunk.get("mtp_layers", [])]
        self.mtp = torch.nn.ModuleList(owner.mtp[str(depth)] for depth in self.mtp_depths)
        self.runner = runner
        self.calls = 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        runner, microbatch = self.runner, self.calls
        self.calls += 1
        note_microbatch(runner.state.step, microbatch)
        maybe_inject_failure(runner.rank, runner.state.step, microbatch)
        with runner.meter.forward():  # one chunk's microbatch: what it saves for backward
            return self._forward(inputs, microbatch)

    def _forward(self, inputs: torch.Tensor, microbatch: int) -> torch.Tensor:
        runner, state = self.runner, self.runner.state
        tp = self.owner.tp
        if self.first:
            ids = inputs
            assert self.owner.embedding is not None  # noqa: S101
            hidden = vocab_parallel_embedding(ids, self.owner.embedding, tp)
        else:
            hidden = inputs
            ids = runner.token_ids(state.step, microbatch) if self._needs_ids() else None
        if ids is not None:  # the MoE blocks see this TP rank's rows under SP
            ids = ids[:, tp.sequence_rows(ids.shape[1])]
        hidden, ffn_outs = run_blocks(list(self.blocks), hidden, ids, runner.local_positions,
                                      runner.gathered_positions, self.owner.recompute)
        for block, ffn_out in zip(self.blocks, ffn_outs, strict=True):
            if state.record and block.is_moe:
                state.moe_outputs[microbatch][block.layer_id] = ffn_out.detach().cpu().clone()
        if not self.last:
            return hidden
        assert self.owner.final_norm is not None  # noqa: S101
        hidden = self.owner.final_norm(hidden)
        (logits,) = tp.column_linear(hidden, self.owner.output_weight().t())
        if not self.mtp_depths:
            return logits
        return _CarryLoss.apply(logits, self._mtp_term(hidden, microbatch))

    def _mtp_term(self, hidden: torch.Tensor, microbatch: int) -> torch.Tensor:
        """Every MTP depth on the main model's normalised output → the scaled MTP loss term."""
        runner, state = self.runner, self.runner.state
        targets = runner.mtp_targets(state.step, microbatch)
        assert self.owner.embedding is not None  # noqa: S101
        outputs: dict[int, torch.Tensor] | None = {} if state.record else None
        logits = run_mtp(list(self.mtp), hidden, self.owner.embedding,  # type: ignore[arg-type]
                         self.owner.output_weight(), targets.ids, runner.local_positions,
                         runner.gathered_positions, outputs, self.owner.tp)
        for layer, output in (outputs or {}).items():
            state.moe_outputs[microbatch][layer] = output.cpu()
        term, means = runner.mtp_loss_of(logits, targets)
        state.mtp_losses[microbatch] = means
        return term

    def _needs_ids(self) -> bool:
        return any(getattr(block.ffn, "is_hash_layer", False) for block in self.blocks)


class PipelineRunner:
    """This rank's chunks, their PipelineStages and the schedule that drives them."""

    def __init__(self, *, rank: int, stage: int, pp: int, chunks: list[dict[str, Any]],
                 owner: StageModel, pp_group: dist.ProcessGroup, device: torch.device,
                 microbatches: int, rows: int, micro_batch_size: int, hidden_size: int,
                 vocab_size: int, loss_of: LossOf,
                 token_ids: Callable[[int, int], torch.Tensor], local_positions: torch.Tensor,
                 gathered_positions: torch.Tensor, ledger: Ledger, meter: Any,
                 mtp_targets: Callable[[int, int], MTPTargets], mtp_loss_of: MTPLossOf,
                 tp: TensorParallel | None = None, dtype: torch.dtype = torch.float32) -> None:
        # torch.distributed.pipelining pulls in torch.export, dynamo and DTensor: about 2.5 CPU
        # seconds that every rank of a PP = 1 job would pay at start for nothing.
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleInterleaved1F1B,
        )

        tp = tp or TensorParallel.none()
        self.rank, self.stage, self.pp = rank, stage, pp
        self.microbatches = microbatches
        self.token_ids = token_ids
        self.mtp_targets, self.mtp_loss_of = mtp_targets, mtp_loss_of
        self.local_positions, self.gathered_positions = local_positions, gathered_positions
        self.ledger, self.meter = ledger, meter
        self.state = StepState(0, False, [], [], [])
        self.chunks = [StageChunk(owner, chunk, self) for chunk in chunks]
        total = pp * len(chunks)
        self.stages: list[PipelineStage] = []
        for chunk_module, chunk in zip(self.chunks, chunks, strict=True):
            index = int(chunk["virtual"]) * pp + stage
            if index != int(chunk["index"]):
                raise ValueError(f"chunk {chunk['index']} of stage {stage} would be pipeline "
                                 f"stage {index} in torch's interleaved order")
            # Static shapes (no inference pass); activations carry requires_grad so that the
            # receiving stage's buffers join autograd and the gradients travel back. Under TP a
            # message is this rank's sequence share (SP) and the logits its vocabulary columns.
            hidden = torch.zeros(rows // (tp.size if tp.sp else 1), micro_batch_size,
                                 hidden_size, device=device, dtype=dtype, requires_grad=True)
            inputs = (torch.zeros(micro_batch_size, rows, dtype=torch.long, device=device)
                      if chunk_module.first else hidden)
            outputs = (torch.zeros(rows, micro_batch_size, vocab_size // tp.size, device=device,
                                   dtype=dtype, requires_grad=True)
                       if chunk_module.last else hidden)
            pipeline_stage = PipelineStage(chunk_module, index, total, device,
                                           input_args=inputs, output_args=outputs,
                                           group=pp_group)
            self._meter_p2p(pipeline_stage)
            self.stages.append(pipeline_stage)
        self.holds_first = any(chunk.first for chunk in self.chunks)
        self.holds_last = any(chunk.last for chunk in self.chunks)

        def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            loss, mean = loss_of(logits, labels)
            self.state.losses.append(float(mean))
            return loss

        if len(self.stages) == 1:
            self.schedule: Any = Schedule1F1B(self.stages[0], microbatches, loss_fn=loss_fn,
                                              scale_grads=False)
        else:
            self.schedule = ScheduleInterleaved1F1B(self.stages, microbatches, loss_fn=loss_fn,
                                                    scale_grads=False)

    def _meter_p2p(self, stage: PipelineStage) -> None:
        """Record the bytes of every activation (fwd) and activation gradient (bwd) op."""
        ledger = self.ledger
        for method, phase, sending in (("get_fwd_send_ops", "fwd", True),
                                       ("get_fwd_recv_ops", "fwd", False),
                                       ("get_bwd_send_ops", "bwd", True),
                                       ("get_bwd_recv_ops", "bwd", False)):
            original = getattr(stage, method)

            def metered(chunk_id: int, _original: Any = original, _phase: str = phase,
                        _sending: bool = sending) -> list[dist.P2POp]:
                ops = _original(chunk_id)
                nbytes = sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
                if ops:
                    send = nbytes if _sending else 0
                    ledger.record("pp_activation", _phase, "pp", send, send,
                                  0 if _sending else nbytes)
                return ops

            setattr(stage, method, metered)

    def run_step(self, step: int, record: bool, ids: torch.Tensor | None,
                 labels: torch.Tensor | None) -> StepState:
        """One optimizer step's forward and backward of all microbatches (no reduction)."""
        self.state = StepState(step, record, [{} for _ in range(self.microbatches)], [],
                               [[] for _ in range(self.microbatches)])
        for chunk in self.chunks:
            chunk.calls = 0
        args = (ids,) if self.holds_first else ()
        target = labels if self.holds_last else None
        self.schedule.step(*args, target=target, return_outputs=False)
        return self.state

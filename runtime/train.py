"""One rank's training loop: microbatches → gradient reduction → expert-bias update → AdamW.

Loss scaling is chosen so that the reduced gradient *is* the gradient of the global objective
(mean token loss over the whole global batch), whatever the layout. The pre-scale factors are the
plan's (`budgets`: grad_scale_sum_* / grad_scale_avg_* / grad_scale_per_token, read through
`Plan.grad_scales`); this module applies them and never recomputes them. Why they are right:

* each rank backpropagates its local mean token loss times the plan's loss_scale_microbatch
  (1/m; 1 with per-token loss) and the MTP term times loss_scale_mtp;
* with EP 1, ETP = TP and EGTP = GTP the plan's expert_grad_buffers is 0: the routed experts join
  the dense grads in one dp_cp reduction (expt_dp is the same ranks, the factors are equal);
* dense grads are pre-scaled by 1/|dp_cp| and summed over `dp_cp` (Megatron-LM dev@d48bd6be
  megatron/core/distributed/distributed_data_parallel.py DistributedDataParallel.__init__).
  The CP ranks of one sequence hold equal shares of its tokens, so Σ_c mean_c / CP is the
  sequence mean: no extra CP factor is needed once the CP ranks take part in the reduction;
* routed-expert grads get the same 1/|dp_cp| and are summed over `expt_dp` only: an expert's
  local grad already holds every token routed to it from its whole EP group;
* with `average_in_collective` the dense factor is 1 and the expert factor |edp|/|dp_cp|, then
  both average inside their collective (the net factor is again 1/|dp_cp|);
* the aux loss rides on the routing weights with backward scale 1/m, so after the reduction its
  coefficient is 1/(m·|dp_cp|) per (rank, microbatch) — the reference applies exactly that;
* with `calculate_per_token_loss` each rank backpropagates its token-loss *sum*, both classes
  are summed with factor 1, and every grad is then multiplied by 1/N for the step's token count
  N (Megatron all-reduces that count; every token here is valid, so N = B·S is known). The aux
  loss is scaled up by the rank's n tokens, which gives it the same 1/(m·|dp_cp|) coefficient.
* MTP adds `mtp_loss`'s term to what each rank backpropagates, scaled like the main loss (1/m,
  or 1 with per-token loss), as Megatron's MTPLossAutoScaler does with its backward scale;
* the TP ranks of a replica all compute and backpropagate the same loss (vocab-parallel), so TP
  adds no factor: a TP-split weight's grad is whole on its rank, and under sequence parallelism
  a weight every TP rank holds saw only its rows and is summed over TP;
* with the distributed optimizer the same pre-scaled buffers are reduce-scattered instead of
  all-reduced (runtime/dist_opt.py);
* under bf16 every reduction above moves the main grads (runtime/precision.py), in the plan's
  gradient dtype, and the optimizer steps fp32 main params.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from runtime.adamw import AdamW
from runtime.comm import CommGroup, Ledger, MoEGroups, all_reduce
from runtime.dist_opt import ShardedBuffer, adamw, sharded_optimizer
from runtime.failure import maybe_inject_failure
from runtime.groups import RankGroups, compute_device
from runtime.heartbeat import note_microbatch
from runtime.init import identity_seed
from runtime.model import (
    Decoder,
    DecoderLayer,
    DecoderSpec,
    MTPLayer,
    MTPTargets,
    TokenSlice,
    cp_slices,
    mtp_loss,
    tensor_parallel_split,
    token_losses,
)
from runtime.moe_layer import MoELayer
from runtime.pipeline import PipelineRunner, StageModel
from runtime.plan_io import GradScales, Plan, required
from runtime.precision import MainGrads, MainParams, Precision, cast_parameters
from runtime.recompute import RecomputePolicy, checkpoint_forwards
from runtime.tensor_parallel import TensorParallel, vocab_parallel_token_losses


@dataclass(frozen=True)
class RunOptions:
    steps: int = 1
    balanced: bool = False
    seed: int | None = None  # None: the plan's training.seed
    capture: bool = False  # keep what the reference check compares
    progress: bool = False


@dataclass(frozen=True)
class BatchLayout:
    """Which global samples a (step, microbatch, DP replica) consumes: B = b·m·D_a."""

    micro_batch_size: int
    microbatches: int
    dp_size: int
    seq_length: int
    vocab_size: int
    seed: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.microbatches * self.dp_size

    def sample_ids(self, step: int, microbatch: int, dp_rank: int) -> list[int]:
        """Megatron's sampler order: microbatch j of all replicas, replica d's b samples."""
        b = self.micro_batch_size
        start = step * self.global_batch + (microbatch * self.dp_size + dp_rank) * b
        return list(range(start, start + b))

    def tokens(self, step: int, microbatch: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole sequences (input ids, next-token labels), each [b, S], from the sample ids."""
        rows = [synthetic_sample(self.seed, sample, self.seq_length, self.vocab_size)
                for sample in self.sample_ids(step, microbatch, dp_rank)]
        stacked = torch.stack(rows)
        return stacked[:, :-1], stacked[:, 1:]


def synthetic_sample(seed: int, sample: int, seq_length: int, vocab_size: int) -> torch.Tensor:
    """S+1 token ids that depend only on (seed, global sample index), never on the layout."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(identity_seed(seed, ("data", sample)))
    return torch.randint(0, vocab_size, (seq_length + 1,), generator=generator)


def batch_layout(plan: Plan, seed: int) -> BatchLayout:
    training, layout = plan.training, plan.layout
    return BatchLayout(
        micro_batch_size=int(training["micro_batch_size"]),
        microbatches=plan.microbatches,
        dp_size=int(layout["dp"]),
        seq_length=int(training["seq_length"]),
        vocab_size=int(plan.model["vocab_size"]),
        seed=seed,
    )


def build_tid2eid(seed: int, layer_id: int, vocab_size: int, num_experts: int,
                  topk: int) -> torch.Tensor:
    """A seeded hash-routing table [vocab, k] of k distinct experts per token id.

    V4 loads tid2eid from its checkpoint; training from scratch needs an explicit rule, and a
    seeded random table (unlike a round-robin placeholder) spreads frequent ids over experts.
    """
    generator = torch.Generator(device="cpu")
    generator.manual_seed(identity_seed(seed, (layer_id, "tid2eid")))
    keys = torch.rand((vocab_size, num_experts), generator=generator)
    return keys.argsort(dim=1)[:, :topk].contiguous()


def make_optimizer(mains: MainParams, training: dict[str, Any]) -> AdamW:
    """AdamW with the plan's hyper-parameters over the whole (main) parameters (`adamw`)."""
    return adamw(mains.leaves(), training)


def moe_blocks(model: Any) -> list[Any]:
    """The MoE blocks of a whole `Decoder` or of one pipeline rank's `StageModel`."""
    return [layer.ffn for layer in model.decoder_layers() if layer.is_moe]


def named_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter plus each router's expert bias: the state that must match the reference."""
    state = {name: p.detach().clone() for name, p in model.named_parameters()}
    for name, buffer in model.named_buffers():
        if name.endswith("expert_bias"):
            state[name] = buffer.detach().clone()
    return state


class ActivationMeter:
    """Peak bytes autograd keeps for backward (saved tensors that are not parameters)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._seen: set[int] = set()
        self._current = 0
        self.peak = 0

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in self._params and pointer not in self._seen:
            self._seen.add(pointer)
            self._current += storage.nbytes()
            self.peak = max(self.peak, self._current)
        return tensor

    @contextmanager
    def forward(self) -> Iterator[None]:
        """Meter one microbatch's forward; its saved tensors are freed by its backward."""
        self._seen.clear()
        self._current = 0
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor):
            yield


def tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


@dataclass
class StepCapture:
    """What one optimizer step produced on this rank, kept for the reference comparison."""

    losses: list[float] = field(default_factory=list)  # local mean token loss per microbatch
    mtp_losses: list[list[float]] = field(default_factory=list)  # per microbatch, per depth
    moe_outputs: list[dict[int, torch.Tensor]] = field(default_factory=list)  # per microbatch
    grads: dict[str, torch.Tensor] = field(default_factory=dict)  # after reduction


@dataclass
class RankResult:
    rank: int
    stage: int
    dp_rank: int
    cp_rank: int
    collectives: dict[str, dict[str, Any]]
    memory: dict[str, int]
    step_losses: list[float]
    captures: list[StepCapture]
    final_state: dict[str, torch.Tensor]


def comm_group(groups: RankGroups, name: str) -> CommGroup:
    size = groups.size(name)
    return CommGroup(name, groups[name] if size > 1 else None, groups.index(name), size)


def moe_groups(groups: RankGroups, plan: Plan) -> MoEGroups:
    """The MoE layer's groups, with the plan's EP/ETP coordinates checked against torch's."""
    info = plan.rank_info(groups.rank)

    def handle(name: str) -> dist.ProcessGroup | None:
        return groups[name] if groups.size(name) > 1 else None

    return MoEGroups(
        ep=handle("ep"), expt_tp=handle("expt_tp"), tp_ep=handle("tp_ep"),
        ep_rank=int(info["ep_rank"]), ep_size=groups.size("ep"),
        etp_rank=int(info["etp_rank"]), etp_size=groups.size("expt_tp"),
        tp_ep_size=groups.size("tp_ep"), tp_cp=handle("tp_cp"), tp_cp_size=groups.size("tp_cp"),
    )


class RankTrainer:
    """Builds this rank's model from the plan and runs optimizer steps on it."""

    def __init__(self, plan: Plan, groups: RankGroups, options: RunOptions) -> None:
        self.plan, self.groups, self.options = plan, groups, options
        self.rank = groups.rank
        self.start_step = 0  # optimizer steps already done (a loaded checkpoint's position)
        info = plan.rank_info(self.rank)
        self.stage = int(info["stage"])
        self.dp_rank, self.cp_rank = int(info["dp_rank"]), int(info["cp_rank"])
        self.seed = int(options.seed if options.seed is not None else plan.training["seed"])
        self.device = compute_device()
        self.precision = Precision.of(plan)
        self.batches = batch_layout(plan, self.seed)
        self.ledger = Ledger()
        self.cp = comm_group(groups, "cp")
        self.dp_cp = comm_group(groups, "dp_cp")
        self.expt_dp = comm_group(groups, "expt_dp")
        self.tp_dp_cp = comm_group(groups, "tp_dp_cp")
        sequence_parallel = bool(required(plan.parallel, "sequence_parallel", "config.parallel"))
        self.tp = TensorParallel(comm_group(groups, "tp"), sequence_parallel, self.ledger)
        seq, cp_size = self.batches.seq_length, self.cp.size
        mode = str(required(plan.parallel, "cp_partition_mode", "config.parallel"))
        slices = cp_slices(seq, cp_size, mode)
        self.slice: TokenSlice = slices[self.cp_rank]
        self.local_positions = self.slice.index(self.device)
        self.gathered_positions = torch.cat([s.index(self.device) for s in slices])

        spec = DecoderSpec.from_config(plan.model, plan.moe_layers(), plan.hash_layers(),
                                       plan.padded_vocab_size)
        model_cfg = dict(plan.model)
        moe_cfg = dict(plan.moe)
        if options.balanced:
            moe_cfg["moe_router_force_load_balancing"] = True
        layer_groups = moe_groups(groups, plan)
        shared_overlap = bool(required(plan.raw["config"]["overlap"], "moe_shared_expert_overlap",
                                       "config.overlap"))
        owned_experts = plan.expert_ownership(self.rank).ids

        def moe_factory(layer_id: int, is_hash: bool) -> MoELayer:
            tid2eid = (build_tid2eid(self.seed, layer_id, spec.vocab_size,
                                     int(model_cfg["num_experts"]),
                                     int(model_cfg["moe_router_topk"])) if is_hash else None)
            return MoELayer(model_cfg, moe_cfg, layer_id, is_hash, layer_groups, self.ledger,
                            self.seed, tid2eid, torch.float32, owned_experts, self.tp,
                            shared_overlap)

        # Weights are generated on the CPU from their identities, then moved to the device.
        self.pipeline: PipelineRunner | None = None
        self.embd = comm_group(groups, "embd") if "embd" in groups.handles else None
        if plan.pp == 1:
            self.model: Any = Decoder(spec, self.seed, torch.float32, self.cp, self.ledger,
                                      moe_factory, self.tp).to(self.device)
        else:
            def make_layer(layer_id: int) -> DecoderLayer:
                return DecoderLayer(spec, layer_id, self.seed, torch.float32, self.cp,
                                    self.ledger, moe_factory, self.tp)

            self.model = StageModel(spec, plan.chunks(self.stage), self.seed, torch.float32,
                                    make_layer, self.tp).to(self.device)
        # drawn in fp32 from their identities (as the reference draws them), then cast
        cast_parameters(self.model, self.precision.params)
        self.main_grads = MainGrads(self.model.parameters(), self.precision.grads)
        self.spec = spec
        recompute = RecomputePolicy.from_overlap(plan.raw["config"]["overlap"])
        self.model.recompute = recompute
        checkpoint_forwards([m for m in self.model.modules() if isinstance(m, MTPLayer)]
                            if recompute.recomputes_mtp else [])
        checkpoint_forwards(moe_blocks(self.model) if recompute.recomputes_moe else [])
        self.grad_scales: GradScales = plan.grad_scales
        self.per_token_loss = self.grad_scales.per_token is not None
        local_tokens = self.batches.micro_batch_size * len(self.slice)
        for block in moe_blocks(self.model):
            block.aux_loss_backward_scale = (float(local_tokens) if self.per_token_loss
                                             else 1.0 / self.batches.microbatches)
        self.expert_params = [p for block in moe_blocks(self.model)
                              for p in block.expert_parameters()]
        expert_ids = {id(p) for p in self.expert_params}
        self.dense_params = [p for p in self.model.parameters() if id(p) not in expert_ids]
        # Under sequence parallelism each TP rank's copy of a TP-replicated weight (norms, row-
        # parallel biases, router, latent projections) saw only its share of the
        # tokens: its grad is summed over TP (Megatron-LM dev@d48bd6be megatron/core/distributed/
        # finalize_model_grads.py _allreduce_non_tensor_model_parallel_grads).
        self.sp_params = [p for name, p in self.model.named_parameters()
                          if self.tp.sp and id(p) not in expert_ids
                          and tensor_parallel_split(spec, name) is None]
        self.buffers = self._sharded_buffers() if bool(required(
            plan.training, "use_distributed_optimizer", "config.training")) else []
        self.mains = None if self.buffers else MainParams(list(self.model.parameters()),
                                                          self.main_grads)
        self.optimizer = (make_optimizer(self.mains, plan.training) if self.mains is not None
                          else sharded_optimizer(self.buffers, plan.training))
        self.meter = ActivationMeter(self.model)
        if plan.pp > 1:
            self.pipeline = self._pipeline_runner(spec)

    def _sharded_buffers(self) -> list[ShardedBuffer]:
        """The distributed optimizer's buffers: dense over dp_cp (with the routed experts when
        the plan keeps one buffer), routed experts over expt_dp."""
        grads, dtype = self.main_grads, self.precision.grads
        if not self.grad_scales.expert_buffer:
            return [ShardedBuffer(self.dense_params + self.expert_params, self.dp_cp, self.ledger,
                                  "dense_grad_reduce", "dense_param_gather", grads, dtype)]
        return [ShardedBuffer(self.dense_params, self.dp_cp, self.ledger, "dense_grad_reduce",
                              "dense_param_gather", grads, dtype),
                ShardedBuffer(self.expert_params, self.expt_dp, self.ledger, "expert_grad_reduce",
                              "expert_param_gather", grads, dtype)]

    def _pipeline_runner(self, spec: DecoderSpec) -> PipelineRunner:
        m = self.batches.microbatches

        def loss_of(logits: torch.Tensor, labels: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
            losses = self.token_losses(logits, labels)
            return self.scaled_loss(losses), losses.detach().mean()

        return PipelineRunner(
            rank=self.rank, stage=self.stage, pp=self.plan.pp, mtp_loss_of=self.mtp_loss_of,
            mtp_targets=self.mtp_microbatch,
            chunks=self.plan.chunks(self.stage), owner=self.model,
            pp_group=self.groups["pp"], device=self.device, microbatches=m,
            rows=len(self.slice), micro_batch_size=self.batches.micro_batch_size,
            hidden_size=spec.hidden_size, vocab_size=spec.vocab_size, loss_of=loss_of,
            tp=self.tp, dtype=self.precision.params,
            token_ids=lambda step, microbatch: self.microbatch(step, microbatch)[0],
            local_positions=self.local_positions, gathered_positions=self.gathered_positions,
            ledger=self.ledger, meter=self.meter)

    def microbatch(self, step: int, microbatch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's ids and labels [b, s_local]: its DP replica's samples, its CP positions."""
        ids, labels = self.batches.tokens(step, microbatch, self.dp_rank)
        index = self.slice.index()
        return ids[:, index].to(self.device), labels[:, index].to(self.device)

    def mtp_microbatch(self, step: int, microbatch: int) -> MTPTargets:
        """This rank's MTP inputs: shifted on whole sequences, then cut to its CP positions."""
        ids, labels = self.batches.tokens(step, microbatch, self.dp_rank)
        targets = MTPTargets.of(ids, labels, self.spec.mtp_num_layers)
        return targets.select(self.slice.index(), self.device)

    def token_losses(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-token losses [b, s]; under TP from this rank's vocabulary columns (the same values
        on every TP rank, each of which backpropagates them)."""
        if self.tp.active:
            return vocab_parallel_token_losses(logits, labels, self.tp)
        return token_losses(logits, labels)

    def scaled_loss(self, losses: torch.Tensor) -> torch.Tensor:
        """What one microbatch backpropagates: its token-loss sum (per-token loss) or mean, times
        the plan's loss_scale_microbatch (1/m, or 1 with per-token loss)."""
        return (losses.sum() if self.per_token_loss else losses.mean()) * self.grad_scales.loss

    def mtp_loss_of(self, logits: list[torch.Tensor], targets: MTPTargets
                    ) -> tuple[torch.Tensor, list[float]]:
        """(the MTP term to backpropagate with the main loss, each depth's masked mean loss)."""
        term, means = mtp_loss(logits, targets, self.spec.mtp_loss_scale, self.per_token_loss,
                               self.token_losses)
        return term * self.grad_scales.mtp_loss, means

    def step(self, step: int) -> StepCapture:
        """One optimizer step over m microbatches; returns what the reference check compares."""
        capture = StepCapture()
        self.ledger.reset()
        self.optimizer.zero_grad()
        if self.buffers or self.precision.mixed:  # the optimizer holds shards or main params
            self.model.zero_grad(set_to_none=False)
            self.main_grads.zero()
        self.model.record_moe_outputs = self.options.capture
        m = self.batches.microbatches
        if self.pipeline is not None:
            self._pipeline_step(step, capture)
        for microbatch in range(m if self.pipeline is None else 0):
            note_microbatch(step, microbatch)
            maybe_inject_failure(self.rank, step, microbatch)
            ids, labels = self.microbatch(step, microbatch)
            targets = self.mtp_microbatch(step, microbatch) if self.spec.mtp_num_layers else None
            with self.meter.forward():
                logits, mtp_logits = self.model(ids, self.local_positions,
                                                self.gathered_positions,
                                                targets.ids if targets is not None else None)
                losses = self.token_losses(logits, labels)
                backprop = self.scaled_loss(losses)
                if targets is not None:
                    term, means = self.mtp_loss_of(mtp_logits, targets)
                    backprop = backprop + term
                    capture.mtp_losses.append(means)
            backprop.backward()
            capture.losses.append(float(losses.detach().mean()))
            if self.options.capture:
                capture.moe_outputs.append({k: v.cpu() for k, v in self.model.moe_outputs.items()})
        shards = self.reduce_gradients()
        if self.options.capture:
            for buffer, shard in zip(self.buffers, shards, strict=True):
                buffer.gathered_grads(shard)
            capture.grads = {name: self.main_grads.grad(p).detach().cpu().clone()
                             for name, p in self.model.named_parameters()}
        self.update_expert_bias()
        if self.mains is not None:
            self.mains.load_grads()
        self.optimizer.step()
        if self.mains is not None:
            self.mains.store()
        for buffer in self.buffers:
            buffer.gather_params()
        return capture

    def _pipeline_step(self, step: int, capture: StepCapture) -> None:
        """All microbatches through the pipeline schedule; the loss only on the last stage."""
        m = self.batches.microbatches
        rows = [self.microbatch(step, microbatch) for microbatch in range(m)]
        ids = torch.cat([ids for ids, _ in rows])
        labels = torch.cat([labels for _, labels in rows])
        assert self.pipeline is not None  # noqa: S101
        state = self.pipeline.run_step(step, self.options.capture, ids, labels)
        capture.losses.extend(state.losses)
        capture.mtp_losses.extend(means for means in state.mtp_losses if means)
        if self.options.capture:
            capture.moe_outputs.extend(state.moe_outputs)

    def sync_embedding_grads(self) -> None:
        """Tied embeddings or MTP under PP: sum the word-embedding grads of the first stage's
        input copy and the copies of the last stage (output head) and the MTP stages over the
        plan's `embd` group, so every copy takes the same optimizer step (only a shared weight is
        synced, as Megatron-LM dev@d48bd6be megatron/core/distributed/finalize_model_grads.py
        _allreduce_word_embedding_grads does)."""
        weight = getattr(self.model, "embedding", None)
        spec = self.model.spec
        shared = not spec.untied_head or spec.mtp_num_layers > 0
        if self.embd is None or not self.embd.active or weight is None or not shared:
            return
        all_reduce(self.main_grads.grad(weight), self.embd, self.ledger, "embd_grad_reduce")

    def reduce_gradients(self) -> list[torch.Tensor]:
        """Dense over dp_cp, routed experts over expt_dp, each pre-scaled by the plan's factor:
        all-reduced, or reduce-scattered under the distributed optimizer (then the reduced shard
        of each buffer is returned)."""
        scales = self.grad_scales
        if self.buffers:
            return self._reduce_scatter_gradients(scales)
        op = dist.ReduceOp.AVG if scales.average else dist.ReduceOp.SUM
        held = self.main_grads.holders
        if not scales.expert_buffer:  # one buffer: expt_dp is dp_cp, the scales are equal
            _reduce_grads(held(self.dense_params + self.expert_params), scales.dense, self.dp_cp,
                          op, self.ledger, "dense_grad_reduce")
        else:
            _reduce_grads(held(self.dense_params), scales.dense, self.dp_cp, op, self.ledger,
                          "dense_grad_reduce")
            _reduce_grads(held(self.expert_params), scales.expert, self.expt_dp, op, self.ledger,
                          "expert_grad_reduce")
        _reduce_grads(held(self.sp_params), 1.0, self.tp.group, dist.ReduceOp.SUM, self.ledger,
                      "tp_sp_grad_reduce")
        self.sync_embedding_grads()
        if scales.per_token is not None:
            for p in self.model.parameters():
                self.main_grads.grad(p).mul_(scales.per_token)
        return []

    def _reduce_scatter_gradients(self, scales: GradScales) -> list[torch.Tensor]:
        """The distributed optimizer's order (finalize_model_grads): the whole-buffer sums over
        TP and `embd` first, then each buffer reduce-scattered to its optimizer shard."""
        _reduce_grads(self.main_grads.holders(self.sp_params), 1.0, self.tp.group,
                      dist.ReduceOp.SUM, self.ledger, "tp_sp_grad_reduce")
        self.sync_embedding_grads()
        factors = [scales.dense] if len(self.buffers) == 1 else [scales.dense, scales.expert]
        shards = [buffer.reduce_scatter(factor, scales.average)
                  for buffer, factor in zip(self.buffers, factors, strict=True)]
        if scales.per_token is not None:
            for buffer in self.buffers:
                buffer.scale_grads(scales.per_token)
            shards = [shard * scales.per_token for shard in shards]
        return shards

    def update_expert_bias(self) -> None:
        """Sum the token counts of every expert-bias router over tp_dp_cp in one int64 call
        (counts are whole numbers), move those biases, and clear every router's counts."""
        blocks = moe_blocks(self.model)
        biased = [block for block in blocks if block.router.uses_expert_bias]
        if biased:
            counts = torch.stack([block.local_tokens_per_expert for block in biased])
            counts = counts.round().to(torch.int64)
            all_reduce(counts, self.tp_dp_cp, self.ledger, "expert_bias_count_reduce")
            for block, global_counts in zip(biased, counts, strict=True):
                block.update_expert_bias(global_counts)
        for block in blocks:
            block.local_tokens_per_expert.zero_()

    def memory(self) -> dict[str, int]:
        params = list(self.model.parameters())
        optimizer_state = [t for state in self.optimizer.state.values() for t in state.values()]
        # the fp32 main params a bf16 run steps count with the optimizer, as Megatron's do
        mains = ([m for m, p in zip(self.mains.mains, params, strict=True) if m is not p]
                 if self.mains is not None else
                 [leaf for buffer in self.buffers for leaf in buffer.shards]
                 if self.precision.mixed else [])
        return {
            "weights_bytes": tensor_bytes(params),
            "grads_bytes": tensor_bytes(self.main_grads.grad(p) for p in params),
            "optimizer_bytes": tensor_bytes(optimizer_state) + tensor_bytes(mains),
            "activations_peak_bytes": self.meter.peak,
        }

    def run(self) -> RankResult:
        captures, losses = [], []
        started = time.monotonic()
        for step in range(self.start_step, self.start_step + self.options.steps):
            capture = self.step(step)
            if capture.losses:  # PP: only the last stage computes the loss
                losses.append(sum(capture.losses) / len(capture.losses))
            if self.options.capture:
                captures.append(capture)
            if self.options.progress and self.rank == 0:
                elapsed = time.monotonic() - started
                shown = f"  rank-0 loss {losses[-1]:.5f}" if capture.losses else ""
                done = step + 1 - self.start_step
                print(f"step {done}/{self.options.steps}{shown}  {elapsed:.1f} s",
                      file=sys.stderr, flush=True)
        return RankResult(
            rank=self.rank, stage=self.stage, dp_rank=self.dp_rank, cp_rank=self.cp_rank,
            collectives=self.ledger.snapshot(), memory=self.memory(), step_losses=losses,
            captures=captures,
            final_state={k: v.cpu() for k, v in named_state(self.model).items()},
        )


def _reduce_grads(params: list[torch.Tensor], factor: float, group: CommGroup,
                  op: dist.ReduceOp.RedOpType, ledger: Ledger, name: str) -> None:
    """Pre-scale, then one flat all-reduce per parameter class (one bucket, as in DDP); `params`
    are the main-grad holders (runtime/precision.py)."""
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    flat = _flatten_dense_tensors(grads).mul_(factor)
    all_reduce(flat, group, ledger, name, op=op)
    for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(reduced)

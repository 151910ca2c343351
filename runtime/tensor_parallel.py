"""Megatron's tensor parallelism for the runtime's dense path: which weights a TP rank holds and the
collectives around them.

A column-parallel linear (attention QKV, dense FC1, Mamba-2's in_proj, the output layer) holds
1/TP of its output columns; a row-parallel linear (attention proj, dense FC2, Mamba-2's out_proj)
1/TP of its input rows, and its partial outputs are summed over TP (Megatron-LM dev@d48bd6be
megatron/core/tensor_parallel/layers.py ColumnParallelLinear, RowParallelLinear). With sequence
parallelism the residual stream is [s/TP, b, h]: a column-parallel input is all-gathered along the
sequence and a row-parallel output reduce-scattered back to it (mappings.py
gather_from_sequence_parallel_region, reduce_scatter_to_sequence_parallel_region); without it every
rank holds the whole sequence, the input is copied (its grad all-reduced, copy_to_tensor_model_
parallel_region) and the output all-reduced (reduce_from_tensor_model_parallel_region). The
embedding and the output layer are vocab-parallel (layers.py VocabParallelEmbedding, cross_entropy.py
VocabParallelCrossEntropy). Every shard is a slice of the full logical tensor, so the single-process
reference's weights and gradients slice to a rank's by the same rule (`tp_view`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from runtime.comm import (
    CommGroup,
    Ledger,
    _all_gather_raw,
    _record,
    _reduce_scatter_raw,
    all_gather_v,
    reduce_scatter_v,
)


def _bytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def _all_reduce_recorded(x: torch.Tensor, group: CommGroup, ledger: Ledger | None, name: str,
                         phase: str, op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
    x = x.contiguous()
    dist.all_reduce(x, op=op, group=group.pg)
    _record(ledger, name, phase, group, _bytes(x), _bytes(x), _bytes(x))
    return x


class _ReduceForward(torch.autograd.Function):
    """Sum over TP in forward, identity in backward (reduce_from_tensor_model_parallel_region)."""

    @staticmethod
    def forward(ctx, x, group, ledger, name):  # type: ignore[override]
        return _all_reduce_recorded(x.clone(), group, ledger, name, "fwd")

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad, None, None, None


class _ReduceBackward(torch.autograd.Function):
    """Identity in forward, sum of the grads over TP in backward
    (copy_to_tensor_model_parallel_region)."""

    @staticmethod
    def forward(ctx, x, group, ledger, name):  # type: ignore[override]
        ctx.meta = (group, ledger, name)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        group, ledger, name = ctx.meta
        return _all_reduce_recorded(grad.clone(), group, ledger, name, "bwd"), None, None, None


class _SequenceParallelColumns(torch.autograd.Function):
    """x [s/TP, ..., h] → x_full @ w for each weight, x_full the input all-gathered over the
    sequence. Like Megatron's LinearWithGradAccumulationAndAsyncCommunication it keeps only the
    local rows for backward and all-gathers them again there for the weight gradients, then
    reduce-scatters the input gradient back to the sequence shard."""

    @staticmethod
    def forward(ctx, x, tp, *weights):  # type: ignore[override]
        sizes = [x.shape[0]] * tp.size
        full = _all_gather_raw(x, tp.group, sizes)
        _record(tp.ledger, "tp_sp_gather", "fwd", tp.group, _bytes(x), _bytes(x), _bytes(full))
        ctx.tp = tp
        ctx.save_for_backward(x, *weights)
        return tuple(full @ weight for weight in weights)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        tp = ctx.tp
        x, *weights = ctx.saved_tensors
        sizes = [x.shape[0]] * tp.size
        full = _all_gather_raw(x, tp.group, sizes)
        _record(tp.ledger, "tp_sp_wgrad_gather", "bwd", tp.group, _bytes(x), _bytes(x),
                _bytes(full))
        rows = full.reshape(-1, full.shape[-1])
        grad_full = sum(grad @ weight.t() for grad, weight in zip(grads, weights, strict=True))
        grad_x = _reduce_scatter_raw(grad_full, tp.group, sizes)
        _record(tp.ledger, "tp_sp_gather", "bwd", tp.group, _bytes(grad_full), _bytes(grad_full),
                _bytes(grad_x))
        grad_weights = [rows.t() @ grad.reshape(-1, grad.shape[-1]) for grad in grads]
        return (grad_x, None, *grad_weights)


class _GatherHidden(torch.autograd.Function):
    """[s, b, w/TP] → [s, b, w] gathered along the last dim; backward keeps this rank's columns
    (gather_from_tensor_model_parallel_region)."""

    @staticmethod
    def forward(ctx, y, tp):  # type: ignore[override]
        ctx.tp, ctx.width = tp, y.shape[-1]
        moved = y.movedim(-1, 0).contiguous()
        full = _all_gather_raw(moved, tp.group, [moved.shape[0]] * tp.size)
        _record(tp.ledger, "tp_mtp_gather", "fwd", tp.group, _bytes(y), _bytes(y), _bytes(full))
        return full.movedim(0, -1).contiguous()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        start = ctx.tp.rank * ctx.width
        return grad[..., start:start + ctx.width].contiguous(), None


class _ScatterSequence(torch.autograd.Function):
    """[s, ...] → this rank's s/TP rows; backward all-gathers the grad along the sequence
    (scatter_to_sequence_parallel_region)."""

    @staticmethod
    def forward(ctx, y, tp, name):  # type: ignore[override]
        ctx.tp, ctx.name = tp, name
        return y[tp.sequence_rows(y.shape[0])].contiguous()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        tp = ctx.tp
        full = _all_gather_raw(grad.contiguous(), tp.group, [grad.shape[0]] * tp.size)
        _record(tp.ledger, ctx.name, "bwd", tp.group, _bytes(grad), _bytes(grad), _bytes(full))
        return full, None, None


def _segment_index(length: int, segments: Sequence[int] | None, part: int, parts: int
                   ) -> torch.Tensor:
    """Positions along a dim that rank `part` of `parts` holds: its 1/parts of every segment."""
    sizes = list(segments) if segments else [length]
    if sum(sizes) != length or any(size % parts for size in sizes):
        raise ValueError(f"segments {sizes} of a dim of {length} do not split into {parts}")
    pieces, start = [], 0
    for size in sizes:
        width = size // parts
        pieces.append(torch.arange(start + part * width, start + (part + 1) * width))
        start += size
    return torch.cat(pieces)


def shard_of(full: torch.Tensor, dim: int, part: int, parts: int,
             segments: Sequence[int] | None = None) -> torch.Tensor:
    """Rank `part`'s slice of a full logical tensor: 1/parts of each segment along `dim` (one
    segment, the whole dim, unless the tensor packs several, as Mamba-2's in_proj does)."""
    if parts == 1:
        return full
    return full.index_select(dim, _segment_index(full.shape[dim], segments, part, parts))


@dataclass(frozen=True)
class TensorParallel:
    """This rank's TP group, whether sequence parallelism is on, and the ledger it records into."""

    group: CommGroup
    sequence_parallel: bool = False
    ledger: Ledger | None = None

    @classmethod
    def none(cls) -> TensorParallel:
        return cls(CommGroup("tp", None))

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def active(self) -> bool:
        return self.group.active

    @property
    def sp(self) -> bool:
        """Sequence parallelism in effect (Megatron switches it off at TP 1)."""
        return self.sequence_parallel and self.active

    def shard(self, full: torch.Tensor, dim: int, segments: Sequence[int] | None = None
              ) -> torch.Tensor:
        return shard_of(full, dim, self.rank, self.size, segments)

    def column_linear(self, x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x @ w for each column-parallel weight w (one fused linear, as Megatron's QKV is one):
        over the whole sequence of this CP rank; under SP its input is gathered again in
        backward rather than kept (`_SequenceParallelColumns`)."""
        if self.sp:
            return _SequenceParallelColumns.apply(x, self, *weights)
        x = self.column_input(x)
        return tuple(x @ weight for weight in weights)

    def column_input(self, x: torch.Tensor) -> torch.Tensor:
        """A column-parallel linear's input: the whole sequence of this CP rank."""
        if not self.active:
            return x
        if self.sp:
            return all_gather_v(x, self.group, [x.shape[0]] * self.size, self.ledger,
                                "tp_sp_gather")
        return _ReduceBackward.apply(x, self.group, self.ledger, "tp_linear_allreduce")

    def row_output(self, y: torch.Tensor) -> torch.Tensor:
        """A row-parallel linear's partial output summed over TP (back to [s/TP] rows with SP)."""
        return self._summed(y, "tp_sp_scatter", "tp_linear_allreduce")

    def embedding_output(self, y: torch.Tensor) -> torch.Tensor:
        """The vocab-parallel lookups summed over TP: reduce-scattered to the sequence shard with
        SP, else all-reduced (VocabParallelEmbedding.forward)."""
        return self._summed(y, "tp_embedding_reduce", "tp_embedding_reduce")

    def _summed(self, y: torch.Tensor, scatter: str, reduce: str) -> torch.Tensor:
        """Partial sums over TP made whole: reduce-scattered along the sequence with SP, else
        all-reduced; `scatter`/`reduce` name the exchange in the ledger."""
        if not self.active:
            return y
        if self.sp:
            return reduce_scatter_v(y, self.group, [y.shape[0] // self.size] * self.size,
                                    self.ledger, scatter)
        return _ReduceForward.apply(y, self.group, self.ledger, reduce)

    def mtp_projection_output(self, y: torch.Tensor) -> torch.Tensor:
        """MTP's column-parallel eh_proj output [s, b, h/TP] made whole along the hidden dim,
        then cut back to this rank's rows under SP (Megatron-LM dev@d48bd6be
        megatron/core/transformer/multi_token_prediction.py
        MultiTokenPredictionLayer._concat_embeddings)."""
        if not self.active:
            return y
        full = _GatherHidden.apply(y, self)
        return _ScatterSequence.apply(full, self, "tp_mtp_gather") if self.sp else full

    def sequence_rows(self, length: int) -> slice:
        """The rows of a CP rank's sequence that this TP rank's residual stream holds."""
        if not self.sp:
            return slice(0, length)
        rows = length // self.size
        return slice(self.rank * rows, (self.rank + 1) * rows)


def vocab_parallel_embedding(ids: torch.Tensor, weight: torch.Tensor, tp: TensorParallel
                             ) -> torch.Tensor:
    """ids [b, s] → [s, b, h] (or [s/TP, b, h] with SP) from this rank's rows of the table: ids
    outside them look up zeros, and the sum over TP completes every row."""
    if not tp.active:
        return torch.nn.functional.embedding(ids, weight).transpose(0, 1)
    rows = weight.shape[0]
    start = tp.rank * rows
    outside = (ids < start) | (ids >= start + rows)
    local = torch.nn.functional.embedding((ids - start).masked_fill(outside, 0), weight)
    local = local.masked_fill(outside[..., None], 0.0).transpose(0, 1).contiguous()
    return tp.embedding_output(local)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split along the vocabulary: the max, the target logit and the
    sum of exponentials are all-reduced over TP (three [s, b] all-reduces); the backward is local:
    softmax minus the one-hot of the target where this rank holds it."""

    @staticmethod
    def forward(ctx, logits, labels, tp):  # type: ignore[override]
        vocab = logits.shape[-1]
        start = tp.rank * vocab
        logits = logits.float()
        peak = _all_reduce_recorded(logits.max(dim=-1).values, tp.group, tp.ledger,
                                    "tp_xent_reduce", "fwd", dist.ReduceOp.MAX)
        shifted = logits - peak[..., None]
        outside = (labels < start) | (labels >= start + vocab)
        local = (labels - start).masked_fill(outside, 0)
        target = shifted.gather(-1, local[..., None]).squeeze(-1).masked_fill(outside, 0.0)
        target = _all_reduce_recorded(target, tp.group, tp.ledger, "tp_xent_reduce", "fwd")
        exp = shifted.exp()
        total = _all_reduce_recorded(exp.sum(dim=-1), tp.group, tp.ledger, "tp_xent_reduce", "fwd")
        ctx.save_for_backward(exp / total[..., None], local, outside)
        return total.log() - target

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        softmax, local, outside = ctx.saved_tensors
        grad_logits = softmax.clone()
        grad_logits.scatter_add_(-1, local[..., None], -(~outside).to(softmax.dtype)[..., None])
        return grad_logits * grad[..., None], None, None


def vocab_parallel_token_losses(logits: torch.Tensor, labels: torch.Tensor, tp: TensorParallel
                                ) -> torch.Tensor:
    """Per-token cross-entropy [b, s] from this rank's vocabulary columns of the logits
    [s, b, vocab/TP] and labels [b, s]; the same values on every TP rank."""
    return _VocabParallelCrossEntropy.apply(logits, labels.t(), tp).t()

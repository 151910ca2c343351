"""Megatron's distributed optimizer for the runtime: grads reduce-scattered, optimizer state
sharded, parameters all-gathered.

Each parameter class (the dense buffer over dp_cp, the routed experts' over expt_dp) is one flat
buffer whose end is padded to a multiple of lcm(shards, 128) elements so every shard is whole
(Megatron-LM dev@d48bd6be megatron/core/optimizer/distrib_optimizer.py
DistributedOptimizer._compute_per_buffer_param_layout, param_layout.py bucket_end_divisor). After
the microbatches the buffer is reduce-scattered: rank i of the group gets the reduced i-th shard.
AdamW keeps state for that shard only (`ShardedBuffer.shards`: one leaf tensor per piece of a
parameter that falls in the shard, in the parameter's weight-decay group) and steps it; the
updated shards are all-gathered back into every replica's parameters. AdamW is elementwise, so
this is the whole-tensor update on every element, which the reference check proves.

Under bf16 (runtime/precision.py) the buffer holds the main grads in the plan's gradient dtype
and is reduce-scattered in it; the shard's leaves are the fp32 main params, and the updated shard
is cast to bf16 before the all-gather, which moves the weights' bytes (DistributedOptimizer's
model_param_buffer gather).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from runtime.adamw import AdamW
from runtime.comm import CommGroup, Ledger, _all_gather_raw, _record, _reduce_scatter_raw
from runtime.precision import MainGrads

BUCKET_ALIGN = 128  # elements (param_layout.py)


@dataclass(frozen=True)
class Piece:
    """Elements [start, stop) of `param` (flattened) sit at `offset` of this rank's shard."""

    param: torch.nn.Parameter
    start: int
    stop: int
    offset: int


class ShardedBuffer:
    """One parameter class's flat grad/param buffer and this rank's shard of it."""

    def __init__(self, params: list[torch.nn.Parameter], group: CommGroup, ledger: Ledger,
                 grad_name: str, gather_name: str, grads: MainGrads,
                 grad_dtype: torch.dtype = torch.float32) -> None:
        self.params, self.group, self.ledger = params, group, ledger
        self.grads, self.grad_dtype = grads, grad_dtype
        self.param_dtype = params[0].dtype if params else torch.float32
        self.grad_name, self.gather_name = grad_name, gather_name
        self.numel = sum(p.numel() for p in params)
        pad = math.lcm(group.size, BUCKET_ALIGN)
        self.padded = -(-self.numel // pad) * pad
        self.shard = self.padded // group.size
        first = group.rank * self.shard
        self.pieces: list[Piece] = []
        offset = 0
        for p in params:
            low, high = max(offset, first), min(offset + p.numel(), first + self.shard)
            if low < high:
                self.pieces.append(Piece(p, low - offset, high - offset, low - first))
            offset += p.numel()
        self.shards = [torch.nn.Parameter(piece.param.detach().reshape(-1)[piece.start:piece.stop]
                                          .float().clone()) for piece in self.pieces]

    def flat_grads(self) -> torch.Tensor:
        flat = torch.zeros(self.padded, dtype=self.grad_dtype, device=self._device())
        offset = 0
        for p in self.params:
            flat[offset:offset + p.numel()] = self.grads.grad(p).reshape(-1)
            offset += p.numel()
        return flat

    def _device(self) -> torch.device:
        return self.params[0].device if self.params else torch.device("cpu")

    def reduce_scatter(self, factor: float, average: bool) -> torch.Tensor:
        """Pre-scale, reduce-scatter the buffer (the collective's AVG: a sum over the group then
        1/size), hand each shard piece its reduced grad; returns the reduced shard."""
        flat = self.flat_grads().mul_(factor)
        if self.group.active:
            shard = _reduce_scatter_raw(flat, self.group, [self.shard] * self.group.size)
            width = flat.element_size()
            _record(self.ledger, self.grad_name, "fwd", self.group, flat.numel() * width,
                    flat.numel() * width, shard.numel() * width)
            if average:
                shard = shard / self.group.size
        else:
            shard = flat
        for piece, leaf in zip(self.pieces, self.shards, strict=True):
            leaf.grad = shard[piece.offset:piece.offset + piece.stop - piece.start].to(
                torch.float32, copy=True)
        return shard

    def scale_grads(self, factor: float) -> None:
        for leaf in self.shards:
            if leaf.grad is not None:
                leaf.grad.mul_(factor)

    def gathered_grads(self, shard: torch.Tensor) -> None:
        """The reduced grads whole on every replica (the reference check compares them; not a
        step of Megatron's, so not in the ledger)."""
        full = (_all_gather_raw(shard, self.group, [self.shard] * self.group.size)
                if self.group.active else shard)
        self._scatter_into(full, grads=True)

    def gather_params(self) -> None:
        """All-gather the updated shards into every replica's parameters."""
        shard = torch.zeros(self.shard, dtype=self.param_dtype, device=self._device())
        for piece, leaf in zip(self.pieces, self.shards, strict=True):
            shard[piece.offset:piece.offset + piece.stop - piece.start] = leaf.detach()
        if self.group.active:
            full = _all_gather_raw(shard, self.group, [self.shard] * self.group.size)
            width = shard.element_size()
            _record(self.ledger, self.gather_name, "fwd", self.group, shard.numel() * width,
                    shard.numel() * width, full.numel() * width)
        else:
            full = shard
        self._scatter_into(full, grads=False)

    def _scatter_into(self, full: torch.Tensor, grads: bool) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.params:
                values = full[offset:offset + p.numel()].view_as(p)
                if grads:
                    self.grads.of(p).grad = values.clone()
                else:
                    p.copy_(values)
                offset += p.numel()


def adamw(leaves: list[tuple[torch.Tensor, int]], training: dict[str, Any]) -> AdamW:
    """AdamW with the plan's hyper-parameters over (tensor, the ndim of the parameter it holds):
    like Megatron, no weight decay on 1-D parameters. The one optimizer both the whole-parameter
    and the sharded path build."""
    decayed = [leaf for leaf, ndim in leaves if ndim > 1]
    plain = [leaf for leaf, ndim in leaves if ndim <= 1]
    return AdamW([(decayed, float(training["weight_decay"])), (plain, 0.0)],
                 lr=float(training["lr"]),
                 betas=(float(training["adam_beta1"]), float(training["adam_beta2"])),
                 eps=float(training["adam_eps"]))


def sharded_optimizer(buffers: list[ShardedBuffer], training: dict[str, Any]) -> AdamW:
    """AdamW over the shards, each piece in its parameter's group (`adamw`)."""
    return adamw([(leaf, piece.param.ndim) for buffer in buffers
                  for piece, leaf in zip(buffer.pieces, buffer.shards, strict=True)], training)


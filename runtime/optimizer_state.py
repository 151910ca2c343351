"""AdamW's state as whole (TP-local) parameters, whatever holds it: what a checkpoint saves.

The whole-parameter optimizer keeps one fp32 main param per parameter (the parameter itself under
fp32, runtime/precision.py MainParams) with its moments. The distributed optimizer keeps only this
rank's shard of each flat buffer (runtime/dist_opt.py): here each buffer's main params and moments
are all-gathered over the buffer's group and cut back into parameters, and a loaded state is cut
into the shard again. So a checkpoint holds the same logical tensors with or without the
distributed optimizer, at either precision, and moves between the two (Megatron's distributed
optimizer saves its reshardable form the same way: megatron/core/optimizer/distrib_optimizer.py
DistributedOptimizer.sharded_state_dict).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from runtime.adamw import AdamW
from runtime.dist_opt import ShardedBuffer

if TYPE_CHECKING:
    from runtime.train import RankTrainer

KINDS = ("main", "exp_avg", "exp_avg_sq")  # per element; `step` is one count


class NotStepped(Exception):
    """The optimizer holds no state yet (every rank alike: none has stepped)."""


def whole_state(trainer: RankTrainer) -> dict[str, dict[str, torch.Tensor]]:
    """Collective over each distributed-optimizer buffer's group: parameter name → {main,
    exp_avg, exp_avg_sq (fp32, the parameter's shape), step}."""
    names = {id(p): name for name, p in trainer.model.named_parameters()}
    optimizer = trainer.optimizer
    if trainer.mains is not None:
        whole = {}
        for name, param in trainer.model.named_parameters():
            main = trainer.mains.main_of(param)
            state = optimizer.state.get(main) or {}
            if not state:
                raise NotStepped
            whole[name] = {"main": main.detach(), "exp_avg": state["exp_avg"].detach(),
                           "exp_avg_sq": state["exp_avg_sq"].detach(),
                           "step": torch.as_tensor(state["step"]).detach()}
        return whole
    steps = [optimizer.state[leaf]["step"] for buffer in trainer.buffers
             for leaf in buffer.shards if optimizer.state.get(leaf)]
    if not steps:
        raise NotStepped
    step = torch.as_tensor(steps[0]).detach()
    whole = {}
    for buffer in trainer.buffers:
        gathered = {kind: _gathered(buffer, kind, optimizer) for kind in KINDS}
        offset = 0
        for param in buffer.params:
            whole[names[id(param)]] = {
                **{kind: flat[offset:offset + param.numel()].view_as(param)
                   for kind, flat in gathered.items()}, "step": step}
            offset += param.numel()
    return whole


def _gathered(buffer: ShardedBuffer, kind: str, optimizer: AdamW) -> torch.Tensor:
    """One kind of this rank's shard, all-gathered over the buffer's group (fp32, padded)."""
    shard = torch.zeros(buffer.shard, dtype=torch.float32, device=buffer.shards[0].device
                        if buffer.shards else torch.device("cpu"))
    for piece, leaf in zip(buffer.pieces, buffer.shards, strict=True):
        value = leaf.detach() if kind == "main" else optimizer.state[leaf][kind]
        shard[piece.offset:piece.offset + piece.stop - piece.start] = value
    if not buffer.group.active:
        return shard
    parts = [torch.empty_like(shard) for _ in range(buffer.group.size)]
    dist.all_gather(parts, shard, group=buffer.group.pg)
    return torch.cat(parts)


def load_whole_state(trainer: RankTrainer, whole: dict[str, dict[str, torch.Tensor]]) -> None:
    """The inverse of `whole_state` (no collective): main params, moments and step counts into
    the optimizer's own tensors, and the main params cast into the weights."""
    optimizer = trainer.optimizer

    def state(values: dict[str, torch.Tensor], cut: slice | None = None) -> dict[str, torch.Tensor]:
        def part(tensor: torch.Tensor) -> torch.Tensor:
            return (tensor if cut is None else tensor.reshape(-1)[cut]).clone()
        return {"step": values["step"].clone(), "exp_avg": part(values["exp_avg"]),
                "exp_avg_sq": part(values["exp_avg_sq"])}

    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            param.copy_(whole[name]["main"])
        if trainer.mains is not None:
            for name, param in trainer.model.named_parameters():
                main = trainer.mains.main_of(param)
                main.copy_(whole[name]["main"])
                optimizer.state[main] = state(whole[name])
            return
        names = {id(p): name for name, p in trainer.model.named_parameters()}
        for buffer in trainer.buffers:
            for piece, leaf in zip(buffer.pieces, buffer.shards, strict=True):
                values = whole[names[id(piece.param)]]
                cut = slice(piece.start, piece.stop)
                leaf.copy_(values["main"].reshape(-1)[cut])
                optimizer.state[leaf] = state(values, cut)

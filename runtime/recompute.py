"""Full activation recompute of decoder blocks, run the way Megatron runs it.

Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_block.py
TransformerBlock._checkpointed_forward checkpoints a chunk's layers in groups of
`recompute_num_layers` (method `uniform`: every layer) or only each of its first
`recompute_num_layers` layers (method `block`); megatron/core/transformer/multi_token_prediction.py
recomputes each MTP layer under `uniform` only. Its checkpoint (megatron/core/tensor_parallel/
random.py CheckpointFunction) runs the first forward without grad, keeps the inputs, and in backward
runs the forward again with grad before backpropagating through it. torch.utils.checkpoint with
use_reentrant=True does exactly that, so work Megatron gates on grad (the router's aux loss with its
tp_cp count all-reduce, the expert-bias token counts) runs once, in the re-run forward, here too.
Selective recompute of the `moe` module checkpoints each whole MoE layer the same way; the other
selective modules move no bytes here and only change memory, which the runtime does not model.

The re-run forward is wrapped in `runtime.comm.recomputing`, so every forward collective it issues
(dispatch, combine, count exchange, ETP gathers, CP K/V gather, aux-loss counts) is recorded under
the `recompute` phase, which `moeplan verify` compares with `step.<collective>.recompute.*`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from runtime.comm import recomputing
from runtime.plan_io import required

Span = tuple[int, int, bool]  # (first layer, end, recomputed) within one chunk's layer list


@dataclass(frozen=True)
class RecomputePolicy:
    """The plan's `overlap.recompute_*` settings, as far as the runtime acts on them."""

    granularity: str | None = None
    method: str = "uniform"
    num_layers: int = 1
    modules: frozenset[str] = frozenset()  # selective recompute's modules

    @classmethod
    def from_overlap(cls, overlap: dict[str, Any]) -> RecomputePolicy:
        """Read the plan's `config.overlap` (every key present; None keeps Megatron's meaning)."""
        def value(key: str) -> Any:
            return required(overlap, key, "config.overlap")

        granularity = value("recompute_granularity")
        # Megatron's --recompute-modules defaults to core_attn (megatron/training/arguments.py)
        modules = value("recompute_modules") or ["core_attn"]
        return cls(granularity=granularity,
                   method=str(value("recompute_method") or "uniform"),
                   num_layers=1 if value("recompute_num_layers") is None
                   else int(value("recompute_num_layers")),
                   modules=frozenset(modules) if granularity == "selective" else frozenset())

    @property
    def full(self) -> bool:
        return self.granularity == "full"

    @property
    def recomputes_mtp(self) -> bool:
        """Megatron recomputes MTP layers under the uniform method only (block: skipped)."""
        return self.full and self.method == "uniform"

    @property
    def recomputes_moe(self) -> bool:
        """Selective `moe`: the whole MoE layer (router to combine) is checkpointed
        (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_layer.py MoELayer.forward)."""
        return "moe" in self.modules

    def spans(self, count: int) -> list[Span]:
        """How one chunk's `count` layers run: checkpointed groups and plain single layers."""
        if not self.full:
            return [(i, i + 1, False) for i in range(count)]
        if self.method == "uniform":
            return [(i, min(i + self.num_layers, count), True)
                    for i in range(0, count, self.num_layers)]
        return [(i, i + 1, i < self.num_layers) for i in range(count)]


NO_RECOMPUTE = RecomputePolicy()


def checkpointed(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` under a reentrant checkpoint; its re-run in backward records its forward
    collectives as `recompute` (the first call is the no-grad forward, the second the re-run)."""
    calls = 0

    def run(*inputs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            return function(*inputs)
        with recomputing():
            return function(*inputs)

    return checkpoint(run, *args, use_reentrant=True)


def run_blocks(blocks: Sequence[torch.nn.Module], hidden: torch.Tensor,
               input_ids: torch.Tensor | None, local: torch.Tensor, gathered: torch.Tensor,
               policy: RecomputePolicy) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One chunk's decoder layers in order → (its output, each layer's FFN/MoE output)."""
    outputs: list[torch.Tensor] = []
    for start, end, recomputed in policy.spans(len(blocks)):
        group = list(blocks[start:end])

        def run(x: torch.Tensor, ids: torch.Tensor | None, loc: torch.Tensor, gat: torch.Tensor,
                _group: list[torch.nn.Module] = group) -> tuple[torch.Tensor, ...]:
            ffn_outs = []
            for block in _group:
                x, ffn_out = block(x, ids, loc, gat)
                ffn_outs.append(ffn_out)
            return (x, *ffn_outs)

        hidden, *ffn = (checkpointed(run, hidden, input_ids, local, gathered) if recomputed
                        else run(hidden, input_ids, local, gathered))
        outputs += ffn
    return hidden, outputs


def checkpoint_forwards(modules: Sequence[torch.nn.Module]) -> None:
    """Run each module's forward under `checkpointed`: what Megatron checkpoints as one piece
    (an MTP layer under full recompute, an MoE layer under selective `moe`)."""
    for module in modules:
        original = module.forward

        def forward(*args: Any, _original: Callable[..., Any] = original) -> Any:
            return checkpointed(_original, *args)

        module.forward = forward  # type: ignore[method-assign]

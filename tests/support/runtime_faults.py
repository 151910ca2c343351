"""Deliberately wrong runtimes, patched into a spawned test rank so the equivalence tests can prove
their comparison catches each one. The runtime itself carries no fault switch: every fault here
replaces one method of `runtime.train.RankTrainer` (or of the MoE layer it drives) for the length
of a `with runtime_fault(name):` block."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch

from runtime.moe_layer import MoELayer
from runtime.train import RankTrainer, moe_blocks


def _apply_probs_twice(block: MoELayer) -> None:
    """Weight the expert output by the routing weight again in the combine."""
    experts = block.experts
    original = experts.forward

    def forward(rows: torch.Tensor, probs: torch.Tensor, tokens_per_expert: Any) -> torch.Tensor:
        return original(rows, probs, tokens_per_expert) * probs.unsqueeze(-1)

    experts.forward = forward  # type: ignore[method-assign]


def _probs_applied_twice() -> mock._patch[Any]:
    original = RankTrainer.__init__

    def init(self: RankTrainer, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        for block in moe_blocks(self.model):
            _apply_probs_twice(block)

    return mock.patch.object(RankTrainer, "__init__", init)


def _expert_grads_over_dp_cp() -> mock._patch[Any]:
    """Reduce the routed experts' grads over dp_cp (the dense group) instead of expt_dp."""
    original = RankTrainer.reduce_gradients

    def reduce_gradients(self: RankTrainer) -> list[torch.Tensor]:
        expt_dp, self.expt_dp = self.expt_dp, self.dp_cp
        try:
            return original(self)
        finally:
            self.expt_dp = expt_dp

    return mock.patch.object(RankTrainer, "reduce_gradients", reduce_gradients)


def _expert_bias_frozen() -> mock._patch[Any]:
    """Never move the expert biases (the counts are still summed and cleared)."""
    return mock.patch.object(MoELayer, "update_expert_bias", lambda self, global_counts: None)


def _embedding_grads_unsynced() -> mock._patch[Any]:
    """Let each copy of a shared embedding step on its own gradient."""
    return mock.patch.object(RankTrainer, "sync_embedding_grads", lambda self: None)


def _sp_grads_unreduced() -> mock._patch[Any]:
    """Leave the TP-replicated weights' grads (norms, router, row-parallel biases) unsummed over
    TP under sequence parallelism: each TP rank steps on its share of the tokens only."""
    original = RankTrainer.__init__

    def init(self: RankTrainer, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.sp_params = []

    return mock.patch.object(RankTrainer, "__init__", init)


FAULTS: dict[str, Callable[[], mock._patch[Any]]] = {
    "probs_applied_twice": _probs_applied_twice,
    "expert_grads_over_dp_cp": _expert_grads_over_dp_cp,
    "expert_bias_frozen": _expert_bias_frozen,
    "embedding_grads_unsynced": _embedding_grads_unsynced,
    "sp_grads_unreduced": _sp_grads_unreduced,
}


@contextmanager
def runtime_fault(name: str | None) -> Iterator[None]:
    """Run the body with the named fault patched in (None: the runtime as shipped)."""
    if name is None:
        yield
        return
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    with FAULTS[name]():
        yield

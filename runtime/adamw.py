"""AdamW for the runtime: torch's own update, over state this module keeps.

Megatron falls back to `torch.optim.AdamW` where neither Transformer Engine nor Apex provides a
fused Adam (megatron/core/optimizer/__init__.py). The runtime runs that update bit for bit: each
step calls the functional `torch.optim.AdamW.step` itself calls (`torch.optim.adamw.adamw`, the
single-tensor path) with the same arguments — per group its weight decay, decoupled; one step
count per parameter as a scalar tensor of torch's scalar dtype; moments created as zeros like the
parameter at its first step. tests/unit/runtime/test_adamw.py holds the two to the same bits.

Why not the class: torch 2.13 imports its compiler front end (torch._dynamo, and sympy with it)
the first time an `Optimizer` adds a parameter group, for a marker that only matters under
torch.compile, which the runtime never uses. That import is about 2.5 s of CPU in every rank
process, as much again as the rest of its torch import.
"""

from __future__ import annotations

import torch
from torch.optim.adamw import adamw

State = dict[str, torch.Tensor]


def _scalar_dtype() -> torch.dtype:
    """The dtype of a step count: torch's (float64 only when that is the default dtype)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class AdamW:
    """AdamW over parameter groups, each `(tensors, weight_decay)`, with shared lr, betas and eps.
    `state[tensor]` holds `step`, `exp_avg` and `exp_avg_sq`, as `torch.optim.AdamW.state` does:
    empty until the tensor's first step, and set directly when a checkpoint is loaded."""

    def __init__(self, groups: list[tuple[list[torch.Tensor], float]], *, lr: float,
                 betas: tuple[float, float], eps: float) -> None:
        self.groups = [(list(tensors), float(weight_decay)) for tensors, weight_decay in groups]
        self.lr, self.betas, self.eps = float(lr), betas, float(eps)
        self.state: dict[torch.Tensor, State] = {}

    def tensors(self) -> list[torch.Tensor]:
        return [t for tensors, _ in self.groups for t in tensors]

    @torch.no_grad()
    def step(self) -> None:
        """One update of every tensor that has a gradient (a tensor without one is skipped and its
        step count stays, as in torch)."""
        beta1, beta2 = self.betas
        for tensors, weight_decay in self.groups:
            stepped = [t for t in tensors if t.grad is not None]
            for t in stepped:
                if not self.state.get(t):
                    self.state[t] = {
                        "step": torch.tensor(0.0, dtype=_scalar_dtype()),
                        "exp_avg": torch.zeros_like(t, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(t, memory_format=torch.preserve_format)}
            states = [self.state[t] for t in stepped]
            adamw(stepped, [t.grad for t in stepped], [s["exp_avg"] for s in states],
                  [s["exp_avg_sq"] for s in states], [], [s["step"] for s in states],
                  foreach=False, amsgrad=False, beta1=beta1, beta2=beta2, lr=self.lr,
                  weight_decay=weight_decay, eps=self.eps, maximize=False)

    def zero_grad(self) -> None:
        """Every gradient zeroed in place (torch's `zero_grad(set_to_none=False)`): the buffers
        the backward accumulates into stay where the runtime's views point."""
        for t in self.tensors():
            if t.grad is not None:
                if t.grad.grad_fn is not None:
                    t.grad.detach_()
                else:
                    t.grad.requires_grad_(False)
                t.grad.zero_()

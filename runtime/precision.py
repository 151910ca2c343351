"""Mixed precision as Megatron trains bf16: bf16 weights and compute, fp32 main grads and main
params, an fp32 loss.

* The model's parameters take the plan's `training.precision` (Megatron-LM dev@d48bd6be
  megatron/core/transformer/module.py Float16Module: every floating parameter cast to bf16); the
  router's expert bias and its token counts stay fp32 buffers (megatron/core/transformer/moe/
  router.py TopKRouter._maintain_float32_expert_bias). Norms, the Mamba-2 scan, the router's logits
  and the cross entropy compute in fp32 inside and hand back the activation dtype.
* Each microbatch's backward leaves a gradient in the parameter's dtype; a post-accumulate hook
  adds it into the parameter's *main grad*, a buffer in the plan's gradient dtype (its `bytes_grad`
  budget: 4 under accumulate_allreduce_grads_in_fp32, Megatron's bf16 default, else 2), and frees
  it (megatron/core/distributed/distributed_data_parallel.py
  DistributedDataParallel._make_backward_post_hook). The gradient reductions move the main grads,
  so their bytes are the plan's.
* The optimizer steps fp32 main params: a whole copy per parameter (megatron/core/optimizer/
  optimizer.py Float16OptimizerWithFloat16Params: _copy_model_grads_to_main_grads,
  _copy_main_params_to_model_params), or the distributed optimizer's shard (runtime/dist_opt.py),
  and the result is cast back into the bf16 weights.

Under fp32 every one of these is the identity: the main grad is the parameter's own `.grad` and
the optimizer steps the parameter itself, bit for bit the fp32 runtime.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from runtime.plan_io import Plan, PlanError, required

PARAM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
GRAD_DTYPES = {4: torch.float32, 2: torch.bfloat16}  # the plan's bytes_grad


@dataclass(frozen=True)
class Precision:
    """The weights' dtype and the main grads' dtype, as the plan states them."""

    params: torch.dtype = torch.float32
    grads: torch.dtype = torch.float32

    @property
    def mixed(self) -> bool:
        return self.params != torch.float32

    @property
    def name(self) -> str:
        return next(key for key, value in PARAM_DTYPES.items() if value == self.params)

    @classmethod
    def of(cls, plan: Plan) -> Precision:
        precision = required(plan.training, "precision", "config.training")
        if precision not in PARAM_DTYPES:
            raise PlanError(f"training.precision = {precision!r}: the runtime trains in "
                            f"{' or '.join(PARAM_DTYPES)}")
        width = plan.budget("bytes_grad")
        if width not in GRAD_DTYPES:
            raise PlanError(f"the plan's bytes_grad = {width}: the runtime keeps main grads in "
                            "fp32 (4) or bf16 (2); recompile the config")
        return cls(PARAM_DTYPES[precision], GRAD_DTYPES[int(width)])


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in at least fp32 (a bf16 value cast up; fp32 and float64 as they are): what the
    fused kernels compute norms and the scan in."""
    return tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.float()


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Float16Module's cast of every floating parameter (buffers keep their dtype)."""
    if dtype == torch.float32:
        return
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point():
                param.data = param.data.to(dtype)


class MainGrads:
    """Each parameter's main grad: the tensor whose `.grad` holds its gradient summed over the
    step's microbatches in the plan's gradient dtype. A parameter already in that dtype is its
    own holder (autograd accumulates into `.grad`, as the fp32 runtime always did)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], dtype: torch.dtype) -> None:
        self._holders: dict[int, torch.Tensor] = {}
        self._hooks: list[Any] = []
        for param in params:
            if param.dtype == dtype:
                self._holders[id(param)] = param
                continue
            holder = torch.zeros_like(param, dtype=dtype)
            holder.grad = torch.zeros_like(holder)
            self._holders[id(param)] = holder
            self._hooks.append(param.register_post_accumulate_grad_hook(_accumulate(holder)))

    def of(self, param: torch.nn.Parameter) -> torch.Tensor:
        return self._holders[id(param)]

    def holders(self, params: Iterable[torch.nn.Parameter]) -> list[torch.Tensor]:
        return [self._holders[id(param)] for param in params]

    def grad(self, param: torch.nn.Parameter) -> torch.Tensor:
        """The main grad of `param` (a zero tensor for one no microbatch reached)."""
        holder = self.of(param)
        if holder.grad is None:
            holder.grad = torch.zeros_like(holder)
        return holder.grad

    def zero(self) -> None:
        for holder in self._holders.values():
            if holder.grad is not None:
                holder.grad.zero_()


def _accumulate(holder: torch.Tensor) -> Any:
    def hook(param: torch.Tensor) -> None:
        assert param.grad is not None and holder.grad is not None  # noqa: S101 - autograd's call
        holder.grad.add_(param.grad)
        param.grad = None
    return hook


class MainParams:
    """The whole-parameter optimizer's fp32 main params: the parameter itself under fp32, an fp32
    copy of a bf16 parameter otherwise; `step` hands the main grads over, steps, casts back."""

    def __init__(self, params: list[torch.nn.Parameter], grads: MainGrads) -> None:
        self.params, self.grads = params, grads
        self.mains = [p if p.dtype == torch.float32 else
                      torch.nn.Parameter(p.detach().float().clone()) for p in params]
        self._by_param = {id(p): main for p, main in zip(params, self.mains, strict=True)}

    def main_of(self, param: torch.nn.Parameter) -> torch.Tensor:
        return self._by_param[id(param)]

    def leaves(self) -> list[tuple[torch.Tensor, int]]:
        """(main param, the ndim of the parameter it holds), for `dist_opt.adamw`."""
        return [(main, param.ndim) for main, param in zip(self.mains, self.params, strict=True)]

    def load_grads(self) -> None:
        """_copy_model_grads_to_main_grads: the main grad, as fp32, on each main param."""
        for main, param in zip(self.mains, self.params, strict=True):
            if main is not param:
                main.grad = self.grads.grad(param).float()

    def store(self) -> None:
        """_copy_main_params_to_model_params: the stepped main params cast into the weights."""
        with torch.no_grad():
            for main, param in zip(self.mains, self.params, strict=True):
                if main is not param:
                    param.copy_(main)

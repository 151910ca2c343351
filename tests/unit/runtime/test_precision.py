"""Mixed precision (runtime/precision.py) in one process: what the bf16 runtime rests on.

* each microbatch's bf16 gradient lands in an fp32 main grad, summed there in fp32, and the
  parameter's own `.grad` is freed (Megatron's backward post-hook);
* the optimizer steps fp32 main params and casts them into the bf16 weights, so updates smaller
  than half a bf16 ulp accumulate instead of vanishing;
* under fp32 every holder is the parameter itself: the fp32 runtime, unchanged;
* the dtypes come from the plan: its precision and its bytes_grad budget.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
import torch

from runtime.plan_io import Plan, PlanError
from runtime.precision import MainGrads, MainParams, Precision, cast_parameters, widened


def _plan(precision: str, bytes_grad: int) -> Plan:
    document: dict[str, Any] = {"config": {"training": {"precision": precision}},
                                "budgets": [{"name": "bytes_grad", "stage": None,
                                             "value": str(Fraction(bytes_grad))}]}
    return Plan(document)


def test_the_plan_names_both_dtypes() -> None:
    assert Precision.of(_plan("bf16", 4)) == Precision(torch.bfloat16, torch.float32)
    assert Precision.of(_plan("bf16", 2)) == Precision(torch.bfloat16, torch.bfloat16)
    assert Precision.of(_plan("fp32", 4)) == Precision()
    with pytest.raises(PlanError, match="training.precision = 'fp16'"):
        Precision.of(_plan("fp16", 4))


def test_bf16_grads_accumulate_in_fp32_main_grads() -> None:
    """1 + 2^-9 is not a bf16 number: two microbatches whose bf16 grads are 1 and 2^-9 sum to it
    exactly in the fp32 main grad (a bf16 accumulation would round it back to 1)."""
    module = torch.nn.Linear(1, 1, bias=False)
    cast_parameters(module, torch.bfloat16)
    weight = module.weight
    assert weight.dtype == torch.bfloat16
    grads = MainGrads(module.parameters(), torch.float32)
    holder = grads.of(weight)
    assert holder is not weight and holder.dtype == torch.float32
    for scale in (1.0, 2.0 ** -9):
        (module(torch.ones(1, 1, dtype=torch.bfloat16)) * scale).sum().backward()
        assert weight.grad is None  # freed by the hook, as Megatron's is
    assert grads.grad(weight).item() == 1.0 + 2.0 ** -9
    grads.zero()
    assert grads.grad(weight).item() == 0.0


def test_fp32_parameters_are_their_own_main_grads_and_params() -> None:
    module = torch.nn.Linear(2, 2)
    grads = MainGrads(module.parameters(), torch.float32)
    mains = MainParams(list(module.parameters()), grads)
    assert all(grads.of(p) is p for p in module.parameters())
    assert all(main is p for main, p in zip(mains.mains, module.parameters(), strict=True))


def test_small_updates_accumulate_in_the_fp32_main_params() -> None:
    """A weight of 1 in bf16 (ulp 2^-7): 8 steps of -2^-10 each are lost one by one on the bf16
    weight, but reach 1 - 2^-7 in the main param, which the cast then shows."""
    weight = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    grads = MainGrads([weight], torch.float32)
    mains = MainParams([weight], grads)
    optimizer = torch.optim.SGD([main for main, _ in mains.leaves()], lr=2.0 ** -10)
    for _ in range(8):
        grads.zero()
        (weight * 1.0).sum().backward()
        mains.load_grads()
        optimizer.step()
        mains.store()
    assert mains.mains[0].item() == 1.0 - 2.0 ** -7
    assert weight.item() == 1.0 - 2.0 ** -7
    assert (torch.ones(1, dtype=torch.bfloat16) - 2.0 ** -10).item() == 1.0  # lost in bf16


def test_widened_keeps_float64() -> None:
    assert widened(torch.ones(1, dtype=torch.float64)).dtype == torch.float64
    assert widened(torch.ones(1, dtype=torch.bfloat16)).dtype == torch.float32

"""MI355X's GEMM shape curve is the least-squares fit of hipBLASLt's measured square GEMMs, and the
shape term it feeds prices DeepSeek-V2's small experts as the measurement brackets them."""

from __future__ import annotations

import math

from planner.config.gpus import (
    GPUS,
    MI355X_BF16_GEMM_TFLOPS,
    MI355X_FP8_GEMM_TFLOPS,
    MI355X_GEMM_HALF_DIM,
    MI355X_HIPBLASLT_BF16_TFLOPS,
    MI355X_HIPBLASLT_FP8_TFLOPS,
)
from planner.config.schema import EfficiencySection

KERNEL_US = EfficiencySection().gpu_us_per_kernel  # priced per kernel apart from the shape curve


def _rates_less_kernel(points: dict[int, float]) -> dict[int, float]:
    """Each cube's rate once the fixed per-kernel GPU time is taken out of its measured time."""
    out = {}
    for d, tflops in points.items():
        seconds = 2 * d**3 / (tflops * 1e12) - KERNEL_US * 1e-6
        out[d] = 2 * d**3 / seconds / 1e12
    return out


def _fit() -> tuple[float, float, float]:
    """(half-dimension, BF16 rate, FP8 rate) minimising the squared log error of
    rate x (d / (d + half))^3 over both precisions' points, half on a grid of 4."""
    bf16 = _rates_less_kernel(dict(MI355X_HIPBLASLT_BF16_TFLOPS))
    fp8 = _rates_less_kernel(dict(MI355X_HIPBLASLT_FP8_TFLOPS))
    best = (math.inf, 0.0, 0.0, 0.0)
    for half in range(0, 4001, 4):
        logs = [[math.log(r) - 3 * math.log(d / (d + half)) for d, r in pts.items()]
                for pts in (bf16, fp8)]
        means = [sum(x) / len(x) for x in logs]
        err = sum((x - m) ** 2 for xs, m in zip(logs, means, strict=True) for x in xs)
        if err < best[0]:
            best = (err, float(half), math.exp(means[0]), math.exp(means[1]))
    return best[1], best[2], best[3]


def test_constants_are_the_fit_of_the_measured_points() -> None:
    half, bf16, fp8 = _fit()
    assert half == MI355X_GEMM_HALF_DIM
    assert abs(bf16 - MI355X_BF16_GEMM_TFLOPS) < 1.0
    assert abs(fp8 - MI355X_FP8_GEMM_TFLOPS) < 1.0


def test_card_takes_the_curve() -> None:
    card = GPUS["MI355X"]
    assert card.gemm_half_dim == MI355X_GEMM_HALF_DIM
    assert card.gemm_bf16_eff == MI355X_BF16_GEMM_TFLOPS / card.bf16_tflops
    assert card.gemm_fp8_eff == MI355X_FP8_GEMM_TFLOPS / card.fp8_tflops


def test_expert_gemm_between_the_measured_cubes() -> None:
    """A DeepSeek-V2 routed expert's fc1 at EP 8 (about 1,229 rows, 1,536 out, 5,120 in) is a
    19 GFLOP GEMM, a little more than the 2,048 cube (17 GFLOP): the curve prices it between the
    measured 2,048 and 4,096 cubes, far below the 8,192 rate the catalog used alone."""
    def rate(m: float, n: float, k: float) -> float:
        share = 1.0
        for d in (m, n, k):
            share *= d / (d + MI355X_GEMM_HALF_DIM)
        return MI355X_BF16_GEMM_TFLOPS * share

    expert = rate(1228.8, 1536, 5120)
    assert MI355X_HIPBLASLT_BF16_TFLOPS[2048] < expert < MI355X_HIPBLASLT_BF16_TFLOPS[4096]
    assert expert < 0.6 * MI355X_HIPBLASLT_BF16_TFLOPS[8192]

"""Derive how much of the measured bare-op slowdown an unbound Grace rank pays per launch.

Megatron-LM's GB200 write-up measured binding each rank to its GPU's NUMA node (its section 2.4,
bindpcie) on one configuration: 691.49 → 762.12 TFLOP/s/GPU (NVIDIA/Megatron-LM
docs/discussions/deepseek-v3-gb200-optimization/deepseek-v3-gb200-optimization.md @1d9edcf8, the
roadmap table's "Tune DeepEP" and "CPU-side optimization" rows: DeepSeek-V3, 256 GB200, MXFP8,
TP1 PP8 VPP4 EP32, DeepEP, recompute mlp + moe_act, Transformer Engine CUDA graphs on attn,
moe_router, moe_preprocess). NVIDIA/TransformerEngine #2053 measured one bare PyTorch op on Grace
at 37.08 µs against the Xeon's 13.48; the bound Grace scale is fitted (bench/heldout.py
host_launch_scale@grace). An unbound rank pays, per bare op, share x (37.08 - bound x 13.48) µs
beyond a bound one (planner/budget/hardware.py unbound_launch_s): the share of the bare op's
measured extra that Megatron's launches pay when the process is not bound. This script finds the
share for which moeplan's step time, unbound over bound, equals the write-up's measured gain, on
that configuration (the bench's dsv3-gb200-256-mxfp8-mcore-cuda-graphs row: the DeepEP tuning
between the two rows changes no Megatron flag), capped at 1 when even the bare op's whole
extra gives less (it prints the gain at share 1 to show it). The two published rows are not
bench figures.

    OMP_NUM_THREADS=1 .venv/bin/python bench/grace_binding.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.heldout import load_figures, merged  # noqa: E402
from planner.config.gpus import HOSTS  # noqa: E402
from planner.config.loader import parse_config  # noqa: E402
from planner.estimate import estimate  # noqa: E402

UNBOUND_TFLOPS, BOUND_TFLOPS = 691.49, 762.12  # the write-up's rows before and after bindpcie
CONFIG_ROW = "dsv3-gb200-256-mxfp8-mcore-cuda-graphs"


def step(data: dict, scale: float) -> float:
    """The step time of a bound rank with every host op at `scale` times the reference host's."""
    over = {"cluster": {"host_numa_binding": True, "efficiency": {"host_launch_scale": scale}}}
    return estimate(parse_config(merged(data, over)), exact=False).step_time_s


def main() -> int:
    data = next(f.data for f in load_figures() if f.id == CONFIG_ROW)
    grace, x86 = HOSTS["grace"], HOSTS["x86"]
    cfg = parse_config(data)
    bound, t_launch = grace.launch_scale, cfg.cluster.efficiency.host_us_per_launch
    extra = grace.linear_forward_us - bound * x86.linear_forward_us  # µs per bare op, unbound

    def scale(share: float) -> float:  # the unbound extra as a scale on the calibrated figure
        return bound + share * extra / t_launch

    target = BOUND_TFLOPS / UNBOUND_TFLOPS
    base = step(data, bound)
    low, high = 0.0, 1.0
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (mid, high) if step(data, scale(mid)) / base < target else (low, mid)
    share = (low + high) / 2
    print(f"measured gain {target:.4f}; bound scale {bound}, bare op {grace.linear_forward_us} µs "
          f"on Grace against {x86.linear_forward_us} on the Xeon: {extra:.2f} µs more per op "
          f"unbound (host_us_per_launch {t_launch}); share {share:.3f}; gain at share 1: "
          f"{step(data, scale(1.0)) / base:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

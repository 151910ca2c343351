"""One model measured at 16 and at 128 GPUs by a user (Megatron-LM issue #1258): does moeplan's
step ratio follow?

Source: https://github.com/NVIDIA/Megatron-LM/issues/1258 ("MoE pre-training does not scale
beyond DP dim > 16", opened 2024-10-25). The user ran a Mixtral-style 8x3B MoE on 8xH100 DGX nodes,
EP 8 fixed, growing data parallelism, global batch 2048 held fixed, and logged (iterations 4 and 6
of each run):

    2 nodes (16 GPUs, expert DP 2):    33450.2 ms, 33031.0 ms per iteration
    16 nodes (128 GPUs, expert DP 16): 18489.0 ms, 18519.2 ms, 18453.2 ms per iteration

From the issue's script: 36 layers, hidden 2304, FFN 7680 (SwiGLU), 36 heads, seq 2048, RMSNorm,
RoPE, no biases, untied embeddings, 8 experts top-2 with FFN 7680, grouped GEMM, alltoall
dispatcher, aux-loss routing (1e-2; z-loss 1e-3, not modelled), EP 8, TP 1, PP 1, CUDA_DEVICE_MAX_
CONNECTIONS=1, torchrun 8 processes per node. The excerpt of the script this bench was written from
breaks off before the training arguments, so two readings of the rest are estimated:
`megatron-defaults` (what Megatron does when the flags are absent: micro-batch 1, no distributed
optimizer, no overlap) and `moe-readme` (the flags the Megatron MoE README the user followed
recommends: distributed optimizer, overlap of the gradient reduce and the parameter gather). The
vocabulary (32000) and the network (the H100 catalog's 8 x 400 Gb/s per DGX node, one NIC per GPU)
are not stated; the user says "8xH100 DGX nodes".

This figure judges; nothing is fitted to it. Printed: both steps, their ratio against the
measured 0.556 (the means of the logged iterations; 0.553 from the first of each), the exposed
terms that grow with the job, and, as a reading only, the scale-out bandwidth per GPU at which
the model's ratio would meet the measured one.

    OMP_NUM_THREADS=1 .venv/bin/python bench/scaling_1258.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.config.loader import parse_config  # noqa: E402
from planner.estimate import estimate  # noqa: E402

MEASURED_MS = {16: (33450.2, 33031.0), 128: (18489.0, 18519.2, 18453.2)}
MEASURED_RATIO = (sum(MEASURED_MS[128]) / 3) / (sum(MEASURED_MS[16]) / 2)

MODEL = {"num_layers": 36, "hidden_size": 2304, "ffn_hidden_size": 7680, "num_attention_heads": 36,
         "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 7680, "vocab_size": 32000,
         "swiglu": True, "normalization": "RMSNorm", "untie_embeddings_and_output_weights": True,
         "add_bias_linear": False}
READINGS: dict[str, dict[str, Any]] = {
    "megatron-defaults": {},
    "moe-readme": {"training": {"use_distributed_optimizer": True},
                   "overlap": {"overlap_grad_reduce": True, "overlap_param_gather": True}},
}


def config(gpus: int, reading: str, scale_out: float | None = None) -> dict[str, Any]:
    extra = READINGS[reading]
    cluster: dict[str, Any] = {"gpu": "H100", "nodes": gpus // 8}
    if scale_out is not None:
        cluster["inter_node_bandwidth_gb_s"] = scale_out
    return {"model": dict(MODEL), "parallel": {"world_size": gpus, "ep": 8},
            "training": {"seq_length": 2048, "micro_batch_size": 1, "global_batch_size": 2048,
                         "precision": "bf16", **extra.get("training", {})},
            "moe": {"moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True,
                    "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 1.0e-2},
            "overlap": dict(extra.get("overlap", {})), "cluster": cluster}


def step(gpus: int, reading: str, scale_out: float | None = None) -> tuple[float, dict[str, float]]:
    """The predicted step and its exposed collectives of 10 ms or more (seconds)."""
    est = estimate(parse_config(config(gpus, reading, scale_out)), exact=False)
    parts = est.stages[est.slowest_stage]["exposed_comm_parts_s"]
    return est.step_time_s, {k: float(v) for k, v in parts.items() if float(v) >= 0.01}


def ratio(reading: str, scale_out: float | None = None) -> tuple[float, float, float]:
    small, _ = step(16, reading, scale_out)
    large, _ = step(128, reading, scale_out)
    return small, large, large / small


def bandwidth_for_measured(reading: str) -> float | None:
    """A reading, not a fit: the scale-out GB/s per GPU at which the ratio meets the measured."""
    low, high = 0.05, 50.0
    if ratio(reading, high)[2] > MEASURED_RATIO or ratio(reading, low)[2] < MEASURED_RATIO:
        return None
    for _ in range(30):
        mid = (low * high) ** 0.5
        if ratio(reading, mid)[2] > MEASURED_RATIO:
            low = mid
        else:
            high = mid
    return (low * high) ** 0.5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-bandwidth", action="store_true",
                        help="skip the scale-out bandwidth reading (about 60 estimates)")
    args = parser.parse_args(argv)
    print(f"measured (Megatron-LM #1258): 16 GPUs {sum(MEASURED_MS[16]) / 2 / 1e3:.2f} s, "
          f"128 GPUs {sum(MEASURED_MS[128]) / 3 / 1e3:.2f} s, ratio {MEASURED_RATIO:.3f}")
    for reading in READINGS:
        small, large, r = ratio(reading)
        print(f"{reading:18} 16 GPUs {small:7.2f} s   128 GPUs {large:6.2f} s   ratio {r:.3f}   "
              f"error {r / MEASURED_RATIO - 1:+.0%}")
        for gpus in (16, 128):
            parts = step(gpus, reading)[1]
            print(f"{'':18} exposed at {gpus:3} GPUs: " + (", ".join(
                f"{k} {v:.2f} s" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])) or "none"))
        if not args.no_bandwidth:
            bw = bandwidth_for_measured(reading)
            print(f"{'':18} scale-out per GPU that would give the measured ratio: "
                  + (f"{bw:.2f} GB/s (catalog H100: 50 GB/s)" if bw else "none in 0.05-50 GB/s"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

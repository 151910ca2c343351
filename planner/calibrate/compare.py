"""`moeplan estimate --measured LOG`: one run's measured step beside the predicted breakdown, and
for each term of the slowest stage how far it alone would have to move to explain the gap."""

from __future__ import annotations

from typing import Any

from planner.calibrate.megatron_log import LogError, MeasuredLog
from planner.estimate import Estimate

# Step terms of a stage row and the efficiency factor that prices each.
TERMS = {"attention_gemm": "gemm_bf16 / gemm_fp8", "attention_core": "attention",
         "moe_gemm": "gemm_bf16 / gemm_fp8", "dense_gemm": "gemm_bf16 / gemm_fp8",
         "head_gemm": "gemm_bf16", "non_gemm": "hbm, non_gemm_passes", "dsa_core": "gemm_bf16, hbm",
         "fixed": "host_us_per_expert, host_us_per_microbatch", "exposed_comm":
         "intra_node, inter_node, collective_latency_us", "bubble": "(the other stages)",
         "optimizer": "hbm, step_fixed_ms"}


def compare_log(est: Estimate, log: MeasuredLog, path: str) -> dict[str, Any]:
    """The measured step of a log already read (parse_log keeps only positive, finite elapsed
    times; one pass serves the step and the memory lines) beside the estimate; LogError when the
    estimate itself is not a positive, finite time, since no ratio or scale means anything then."""
    if not 0 < est.step_time_s < float("inf"):
        raise LogError(f"the predicted step time is {est.step_time_s!r} s: no comparison with "
                       f"{path} (check the efficiency factors the estimate printed)")
    env = est.envs[est.slowest_stage]
    row = est.stages[est.slowest_stage]
    seconds = {**row["compute_parts_s"], "fixed": float(env["time_fixed_s"]),
               "exposed_comm": row["exposed_comm_s"], "bubble": row["bubble_s"],
               "optimizer": row["optimizer_s"]}
    gap = log.step_s - est.step_time_s
    terms = [{"term": name, "seconds": s, "scale": 1 + gap / s, "factor": TERMS[name]}
             for name, s in seconds.items() if s > 0 and 1 + gap / s > 0]
    terms.sort(key=lambda t: abs(t["scale"] - 1))
    return {"log": path, "measured_step_s": log.step_s, "predicted_step_s": est.step_time_s,
            "ratio": est.step_time_s / log.step_s, "terms": terms[:5], "notes": log.notes}


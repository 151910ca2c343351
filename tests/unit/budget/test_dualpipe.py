"""DualPipe priced as the DeepSeek-V3 report's Table 2 states it (arXiv 2412.19437 section 3.2.1:
bubble (PP/2 − 1)(F&B + B − 3W) against 1F1B's (PP − 1)(F + B)), an estimate only: Megatron-LM
has no DualPipe schedule, so check refuses it (V4030) and emit writes nothing."""

from __future__ import annotations

from typing import Any

from planner.config.schema import Config
from planner.estimate import estimate
from planner.rules import run_rules

# The model of Megatron-LM issue #1258 (bench/scaling_1258.py), EP 8, here over 4 stages.
MODEL = {"num_layers": 36, "hidden_size": 2304, "ffn_hidden_size": 7680, "num_attention_heads": 36,
         "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 7680, "vocab_size": 32000,
         "swiglu": True, "normalization": "RMSNorm", "untie_embeddings_and_output_weights": True,
         "add_bias_linear": False}


def cfg(schedule: str, pp: int = 4) -> Config:
    return Config.model_validate({
        "model": MODEL, "parallel": {"world_size": 32, "ep": 8, "pp": pp},
        "training": {"seq_length": 2048, "micro_batch_size": 1, "global_batch_size": 64},
        "overlap": {"pipeline_schedule": schedule}, "cluster": {"gpu": "H100", "nodes": 4}})


def stage_env(schedule: str, stage: int, pp: int = 4) -> dict[str, Any]:
    return estimate(cfg(schedule, pp)).envs[stage]


def test_hand_derived_dualpipe_bubble() -> None:
    e = stage_env("dualpipe", 1)
    m, busy, compute = e["microbatches"], e["time_busy_s"], e["time_compute_s"]
    w = e["stack_factor"] * sum(e[f"time_{k}_gemm_wgrad_pass_s"]
                                for k in ("attention", "routed", "shared", "dense", "head"))
    f_and_b, b = compute / m, 2 * busy / (3 * m)
    assert e["dualpipe_w_s"] == w and 0 < w < b
    assert e["time_bubble_s"] == (4 // 2 - 1) * max(f_and_b + b - 3 * w, 0)
    assert e["time_stage_step_s"] == busy + e["time_bubble_s"] + e["time_optimizer_s"]


def test_dualpipe_bubble_is_below_1f1b_on_every_stage_and_the_work_is_the_same() -> None:
    one, dual = estimate(cfg("1f1b")), estimate(cfg("dualpipe"))
    for a, b in zip(one.envs, dual.envs, strict=True):
        assert b["time_busy_s"] == a["time_busy_s"]
        assert 0 < b["time_bubble_s"] < a["time_bubble_s"]
    assert dual.step_time_s < one.step_time_s


def test_two_stages_leave_dualpipe_no_bubble() -> None:
    assert stage_env("dualpipe", 0, pp=2)["time_bubble_s"] == 0
    assert stage_env("1f1b", 0, pp=2)["time_bubble_s"] > 0


def test_check_refuses_what_megatron_cannot_run() -> None:
    found = {f.code: f.severity for f in run_rules(cfg("dualpipe"))}
    assert found.get("V4030") == "error"
    assert "V4030" not in {f.code for f in run_rules(cfg("1f1b"))}


def test_dualpipe_holds_two_stages_of_parameters_and_pp_plus_one_microbatches() -> None:
    """Table 2's memory columns: parameters 2x (their grads and optimizer states with them),
    activations PP + 1 microbatches of the stage against 1F1B's replayed peak (PP - s)."""
    one, dual = stage_env("1f1b", 1), stage_env("dualpipe", 1)
    for name in ("weight_bytes", "grad_bytes", "optimizer_bytes"):
        assert dual[name] == 2 * one[name]
    assert dual["in_flight_microbatches"] == 4 + 1 and one["in_flight_microbatches"] == 4 - 1
    assert dual["activation_bytes"] - dual["recompute_working_bytes"] == 5 * dual["act_per_microbatch"]
    assert dual["act_per_microbatch"] == one["act_per_microbatch"]

"""MEM001/MEM002's fix names the stage's largest memory part and the levers for that part (and the
next largest), not always full recompute."""

from __future__ import annotations

from typing import Any

from planner.config.loader import parse_config
from planner.rules.example_base import example_config_data, merge
from planner.rules.memory import memory_findings


def fixes(overlay: dict[str, Any]) -> list[str]:
    return [f.fix for f in memory_findings(parse_config(merge(example_config_data("{}"), overlay)))]


def test_optimizer_bound_stage_gets_optimizer_levers():
    """Short sequences, no distributed optimizer: Adam's fp32 master and moments dominate."""
    [fix] = fixes({"training": {"seq_length": 8}, "cluster": {"gpu_memory_gib": 0.002}})
    assert fix.startswith("the largest part is optimizer"), fix
    assert "use_distributed_optimizer: true" in fix and "recompute" not in fix


def test_activation_bound_stage_gets_recompute():
    [fix] = fixes({"training": {"seq_length": 8192, "micro_batch_size": 2, "global_batch_size": 32},
                   "cluster": {"gpu_memory_gib": 0.1}})
    assert fix.startswith("the largest part is activations"), fix
    assert "recompute_granularity: selective" in fix and "a micro_batch_size below 2" in fix


def test_sharded_optimizer_gets_16_bit_states_and_offload():
    [fix] = fixes({"model": {"num_experts": 64, "moe_ffn_hidden_size": 256},
                   "training": {"seq_length": 8, "use_distributed_optimizer": True},
                   "cluster": {"gpu_memory_gib": 0.02}})
    assert "exp_avg_dtype and exp_avg_sq_dtype bf16" in fix and "optimizer_cpu_offload" in fix, fix

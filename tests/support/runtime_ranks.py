"""Real ranks for the runtime's equivalence tests: compile a small case, spawn gloo ranks that
run cases against the single-process reference, collect each case's verdict.

Shared by the equivalence, pipeline and recompute tests (every rank, forked from
tests/support/spawn.py's server, imports this module to unpickle `run_cases`, so it needs only the
runtime at import time).
"""

from __future__ import annotations

import copy
import json
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.support.ports import free_port
from tests.support.runtime_faults import runtime_fault

__all__ = ["BASE", "FAULT_STEPS", "STEPS", "TOLERANCE", "compile_case", "free_port", "merged",
           "run_cases"]

TOLERANCE = 1e-5
# Two steps: the second runs on weights, AdamW moments and expert biases the first step left, so
# every update rule is exercised once and checked by a later forward and backward.
STEPS = 2
# A deliberately wrong runtime shows in its first step (every fault in runtime_faults.py corrupts
# that step's gradients or the state it leaves): one step each, not STEPS.
FAULT_STEPS = 1

BASE: dict[str, Any] = {
    "model": {
        "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_query_groups": 2,
        "kv_channels": 8, "ffn_hidden_size": 64, "vocab_size": 128, "num_experts": 8,
        "moe_router_topk": 2, "moe_ffn_hidden_size": 16, "moe_shared_expert_intermediate_size": 16,
        "moe_router_score_function": "sqrtsoftplus", "moe_router_topk_scaling_factor": 2.5,
        "moe_router_enable_expert_bias": True, "moe_router_bias_update_rate": 1e-2,
        "swiglu_limit": 10.0, "untie_embeddings_and_output_weights": True,
    },
    "parallel": {"world_size": 4, "tp": 1, "pp": 1},
    "training": {"seq_length": 16, "micro_batch_size": 1, "precision": "fp32", "lr": 1e-3,
                 "seed": 7},
    "moe": {"moe_token_dispatcher_type": "alltoall",
            "moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": 1e-2},
    "cluster": {"gpus_per_node": 8},
}


def merged(overrides: dict[str, Any]) -> dict[str, Any]:
    config = copy.deepcopy(BASE)
    for section, values in overrides.items():
        if isinstance(values, dict):
            config.setdefault(section, {}).update(values)
        else:  # a list section: `ignore`
            config[section] = values
    return config


def compile_case(name: str, overrides: dict[str, Any], folder: Path) -> Path:
    """YAML config → validated Config → compiled plan.json (two microbatches per step).

    The planner is imported here, not at module level: spawned ranks import this module and
    need only the runtime (the planner's rules and schema cost each rank about a CPU second)."""
    from tests.support.launch import compile_config

    config = merged(overrides)
    par = config["parallel"]
    dp = par["world_size"] // (par.get("cp", 1) * par.get("tp", 1) * par.get("pp", 1))
    config["training"]["global_batch_size"] = 2 * dp * config["training"]["micro_batch_size"]
    return compile_config(config, folder, name)


def run_cases(rank: int, world: int, port: int, cases: list[tuple[Any, ...]], out: str) -> None:
    """One spawned rank: run every case (name, plan, fault[, balanced routing]) on one gloo world,
    each fault patched in by tests/support/runtime_faults.py; rank 0 writes each case's verdict."""
    import torch
    import torch.distributed as dist

    from runtime.__main__ import execute
    from runtime.plan_io import load_plan
    from runtime.train import RunOptions

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=90))
    verdicts: dict[str, Any] = {}
    try:
        for name, plan_path, fault, *balanced in cases:
            try:
                plan = load_plan(plan_path)
                options = RunOptions(steps=STEPS if fault is None else FAULT_STEPS, capture=True,
                                     balanced=any(balanced))
                with runtime_fault(fault):
                    outcome = execute(plan, options, True, None)
                if outcome.report is not None:
                    verdicts[name] = {"code": outcome.code, **outcome.report}
            except Exception:  # noqa: BLE001 - report the failing case, keep the others
                verdicts[name] = {"error": traceback.format_exc()}
                raise
    finally:
        if rank == 0:
            Path(out).write_text(json.dumps(verdicts))
        dist.destroy_process_group()

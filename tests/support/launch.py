"""How the runtime tests launch things: compile a small config, run `python -m runtime` alone or
under torchrun, run the `moeplan` CLI, edit a compiled plan — each a real subprocess, as users run it."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from planner.config.loader import load_config
from planner.plan import compile_plan
from planner.plan_format import plan_digest, write_plan
from planner.rules import run_rules
from tests.support.paths import EXAMPLES, ROOT

EXAMPLE = EXAMPLES / "tiny-cpu-8.yaml"
PYTHON = sys.executable
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MOEPLAN_GROUP_TIMEOUT_S": "90",
       "PYTHONPATH": str(ROOT)}

SMALL: dict[str, Any] = {
    "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "kv_channels": 8,
              "ffn_hidden_size": 64, "vocab_size": 64, "num_experts": 4, "moe_router_topk": 2,
              "moe_ffn_hidden_size": 16, "moe_shared_expert_intermediate_size": 16,
              "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True},
    "parallel": {"world_size": 2, "ep": 2},
    "training": {"seq_length": 16, "micro_batch_size": 1, "global_batch_size": 4,
                 "precision": "fp32", "lr": 1e-3, "seed": 3},
    "moe": {"moe_token_dispatcher_type": "alltoall", "moe_router_load_balancing_type": "aux_loss",
            "moe_aux_loss_coeff": 1e-2},
    "cluster": {"gpus_per_node": 8},
}


# Latent MoE (moe_latent_size ℓ = 8) on SMALL: tests/integration/runtime/test_latent_moe.py derives
# its bytes by hand; its 4-rank runs (DP4 dense, ETP2·EP2 expert, B = 8) join the shared launch of
# tests/integration/runtime/test_runtime_equivalence.py.
LATENT = 8


def latent_small(**sections: dict[str, Any]) -> dict[str, Any]:
    config = copy.deepcopy(SMALL)
    config["moe"]["moe_latent_size"] = LATENT
    config["cluster"]["nodes"] = 1
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


def latent_run(moe: dict[str, Any]) -> dict[str, Any]:
    return latent_small(parallel={"world_size": 4, "ep": 2, "etp": 2},
                        training={"global_batch_size": 8}, moe=moe)


NANO = EXAMPLES / "architectures" / "nemotron-3-nano-30b-a3b-64.yaml"
# Nano's widths shrunk to a CPU run, every ratio the TP split needs kept (heads, query groups,
# Mamba heads and groups divide by TP 2); its first seven pattern symbols hold each layer kind.
NANO_TINY_MODEL: dict[str, Any] = {
    "hybrid_layer_pattern": "MEMEM*E", "hidden_size": 32, "num_attention_heads": 4,
    "num_query_groups": 2, "kv_channels": 8, "ffn_hidden_size": 64, "mamba_num_heads": 4,
    "mamba_head_dim": 16, "mamba_state_dim": 8, "mamba_num_groups": 2, "vocab_size": 128,
    "max_position_embeddings": 64, "num_experts": 8, "moe_ffn_hidden_size": 16,
    "moe_shared_expert_intermediate_size": 32}


def nano_at_tiny_dims(precision: str | None = None) -> dict[str, Any]:
    """Nemotron-3-Nano's example as the runtime runs it on 4 CPU ranks: the file's own layer
    kinds, router, experts, losses, layout axes (TP 2 with sequence parallelism, ETP 1),
    distributed optimizer and precision (bf16, unless `precision` names another), at tiny widths,
    EP 2 of its 8 (world 4)."""
    config = yaml.safe_load(NANO.read_text())
    config["model"].update(NANO_TINY_MODEL)
    config["parallel"].update(world_size=4, ep=2)
    config["training"].update(seq_length=16, global_batch_size=4, lr=1e-3, seed=7)
    if precision is not None:
        config["training"]["precision"] = precision
    config["cluster"].update(nodes=1, gpus_per_node=4)
    return config


def compile_config(config: dict[str, Any], folder: Path, name: str) -> Path:
    source = folder / f"{name}.yaml"
    source.write_text(yaml.safe_dump(config))
    cfg = load_config(source)
    plan = compile_plan(cfg, run_rules(cfg))
    target = folder / f"{name}.plan.json"
    write_plan(plan, target)
    return target


def small(folder: Path, name: str = "small", **sections: dict[str, Any]) -> Path:
    config = copy.deepcopy(SMALL)
    for section, values in sections.items():
        config[section].update(values)
    return compile_config(config, folder, name)


def torchrun(nproc: int, *args: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    command = [PYTHON, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "-m", "runtime", *args]
    return subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def runtime(*args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "runtime", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def moeplan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "planner.cli", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120)


def edited(plan: Path, edit: Any, *, redigest: bool) -> Path:
    """A copy of PLAN with EDIT applied (re-digested on request), beside it."""
    document = json.loads(plan.read_text())
    edit(document)
    if redigest:
        document["digest"] = plan_digest(document)
    target = plan.with_name("edited.plan.json")
    target.write_text(json.dumps(document))
    return target

"""The whole runtime (plan → groups → decoder → steps) equals the single-process reference.

Real ranks: torch.multiprocessing spawn, gloo, fp32. Each case is a small YAML config compiled by
the planner (`compile_plan`), so groups and expert ownership come from the plan as in production.
On every case the runtime trains 3 optimizer steps of m = 2 microbatches and compares, within
1e-5 relative: every microbatch loss, every MoE layer output, every parameter gradient after the
dp_cp / expt_dp reduction at every step, and every weight and expert bias after the last step.
All cases of one world size share one launch (a launch costs seconds, a case well under one).
The reference's AdamW steps on the ranks' verified gradients (see runtime/equivalence.py), so
the default eps = 1e-8 cannot amplify fp32 rounding into drift; a mismatch means a bug.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch.multiprocessing as mp

from tests.support.runtime_ranks import STEPS, TOLERANCE, compile_case, free_port, merged, run_cases

# name -> (overrides, fault). Every layout the issue names, plus the capacity variants.
CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "ep4_softmax": ({"parallel": {"ep": 4}, "model": {"moe_router_score_function": "softmax",
                                                      "moe_router_enable_expert_bias": False}},
                    None),
    "ep2_etp2": ({"parallel": {"ep": 2, "etp": 2}}, None),
    "cp2_ep2_folding": ({"parallel": {"cp": 2, "ep": 2, "cp_partition_mode": "contiguous"},
                         "training": {"average_in_collective": True}}, None),
    "dp2_cp2_edp4_tied": ({"parallel": {"cp": 2, "ep": 1},
                           "model": {"untie_embeddings_and_output_weights": False}}, None),
    "allgather_ep2_etp2": ({"parallel": {"ep": 2, "etp": 2},
                            "moe": {"moe_token_dispatcher_type": "allgather"}}, None),
    "hash_layers_cp2_ep2": ({"model": {"num_layers": 3, "moe_n_hash_layers": 2},
                             "parallel": {"cp": 2, "ep": 2},
                             "moe": {"moe_tid2eid_source": "seeded"}}, None),
    "drop_and_pad_ep2_etp2": ({"parallel": {"ep": 2, "etp": 2},
                               "moe": {"moe_expert_capacity_factor": 1.0,
                                       "moe_pad_expert_input_to_capacity": True}}, None),
    "capacity_drop_ep4_dense_layer": ({"parallel": {"ep": 4},
                                       "model": {"num_layers": 3, "moe_layer_freq": [1, 0, 1]},
                                       "moe": {"moe_expert_capacity_factor": 1.0}}, None),
    "per_token_loss_cp2_ep2": ({"parallel": {"cp": 2, "ep": 2},
                                "training": {"calculate_per_token_loss": True}}, None),
    # 8 ranks (CP2·DP4 dense, ETP2·EP2·EDP2 expert) run against the same reference in
    # test_emit_run.py, through the emitted launcher (`--check-reference`): no second 8-rank spawn here
    # MTP depth 0 after the 2 decoder layers (MoE layer 2) under zigzag CP: the shifted ids and
    # labels are cut from whole sequences, the rank holding the sequence end masks its last row
    "mtp_cp2_ep2": ({"parallel": {"cp": 2, "ep": 2}, "model": {"mtp_num_layers": 1}}, None),
    # gpt-oss's layer: learnable sinks, a 3-key-back sliding window on every other layer (across
    # the CP gather), quick-GEGLU with linear offset 1 and the clamp acting at 0.1 on these
    # inputs, add_bias_linear (QKV, output projection, router, expert and dense FC1/FC2 biases),
    # softmax top-4 and a dense layer; and the non-gated GELU MLP (no W3).
    "gpt_oss_layer_cp2_ep2": ({"parallel": {"cp": 2, "ep": 2}, "model": {
        "softmax_type": "learnable", "window_size": [3, 0], "window_attn_skip_freq": 2,
        "quick_geglu": True, "glu_linear_offset": 1.0, "swiglu_limit": 0.1,
        "add_bias_linear": True, "moe_shared_expert_intermediate_size": 0, "num_layers": 3,
        "moe_layer_freq": [1, 0, 1], "moe_router_score_function": "softmax",
        "moe_router_topk": 4, "moe_router_topk_scaling_factor": None,
        "moe_router_enable_expert_bias": False}}, None),
    "gelu_ep2_dense_layer": ({"parallel": {"ep": 2}, "model": {
        "swiglu": False, "swiglu_limit": None, "num_layers": 3, "moe_layer_freq": [1, 0, 1]}}, None),
    # Deliberately wrong runtimes: the comparison must catch each.
    "fault_expert_grads_over_dp_cp": ({"parallel": {"cp": 2, "ep": 2}},
                                      "expert_grads_over_dp_cp"),
    "fault_probs_applied_twice": ({"parallel": {"ep": 2, "etp": 2}}, "probs_applied_twice"),
    "fault_expert_bias_frozen": ({"parallel": {"ep": 4}}, "expert_bias_frozen"),
}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("equivalence")
    by_world: dict[int, list[tuple[str, str, str | None]]] = {}
    for name, (overrides, fault) in CASES.items():
        world = merged(overrides)["parallel"]["world_size"]
        by_world.setdefault(world, []).append((name, str(compile_case(name, overrides, folder)),
                                               fault))
    results: dict[str, Any] = {}
    for world, cases in sorted(by_world.items()):
        out = folder / f"verdicts-{world}.json"
        try:
            mp.spawn(run_cases, args=(world, free_port(), cases, str(out)), nprocs=world, join=True)
        except mp.ProcessRaisedException:
            pass  # the failing case is named in the verdicts file
        if out.exists():
            results.update(json.loads(out.read_text()))
    return results


def _verdict(verdicts: dict[str, Any], name: str) -> dict[str, Any]:
    assert name in verdicts, f"case {name} did not run"
    verdict = verdicts[name]
    assert "error" not in verdict, verdict.get("error")
    return verdict


@pytest.mark.parametrize("name", [name for name, (_, fault) in CASES.items() if fault is None])
def test_runtime_matches_reference(verdicts: dict[str, Any], name: str) -> None:
    verdict = _verdict(verdicts, name)
    reference = verdict["reference"]
    assert reference["checked"]
    assert reference["mismatches"] == []
    assert reference["ok"] and verdict["code"] == 0
    assert reference["max_rel_error"] <= TOLERANCE
    # losses, MoE outputs, gradients and final state, for every rank: hundreds of tensors
    assert reference["tensors_checked"] >= 100 * verdict["world_size"]


def test_wrong_expert_grad_group_is_caught(verdicts: dict[str, Any]) -> None:
    """Reducing expert grads over dp_cp mixes different experts: every expert grad is off,
    while losses, outputs and dense grads of the first step are still right."""
    verdict = _verdict(verdicts, "fault_expert_grads_over_dp_cp")
    reference = verdict["reference"]
    assert not reference["ok"] and verdict["code"] == 1
    first_step = {m["tensor"] for m in reference["mismatches"] if m["tensor"].startswith("step 0")}
    assert {f"step 0 gradient layers.{layer}.ffn.experts.{matrix}" for layer in (0, 1)
            for matrix in ("w1", "w2", "w3")} <= first_step
    assert all(".ffn.experts." in tensor for tensor in first_step)
    assert {m["rank"] for m in reference["mismatches"]} == set(range(4))


def test_probs_applied_twice_is_caught(verdicts: dict[str, Any]) -> None:
    verdict = _verdict(verdicts, "fault_probs_applied_twice")
    reference = verdict["reference"]
    assert not reference["ok"] and verdict["code"] == 1
    tensors = {m["tensor"] for m in reference["mismatches"]}
    assert "step 0 microbatch 0 layer 0 MoE output" in tensors
    assert reference["max_rel_error"] > 1e-2


def test_frozen_expert_bias_is_caught_by_the_state_after_the_steps(
        verdicts: dict[str, Any]) -> None:
    """The first step is right (the bias acts only from the second step on); the biases after
    the last step are not, on every rank."""
    verdict = _verdict(verdicts, "fault_expert_bias_frozen")
    reference = verdict["reference"]
    assert not reference["ok"] and verdict["code"] == 1
    tensors = {m["tensor"] for m in reference["mismatches"]}
    assert not any(tensor.startswith("step 0") for tensor in tensors)
    assert {f"after step {STEPS - 1} weight layers.{layer}.ffn.router.expert_bias"
            for layer in (0, 1)} <= tensors
    assert {m["rank"] for m in reference["mismatches"]} == set(range(4))


def test_report_counts_the_collectives_of_one_step(verdicts: dict[str, Any]) -> None:
    """EP2×ETP2 on 4 ranks, 2 MoE layers × 2 microbatches: each MoE collective 4 times per step,
    the gradient reductions once; dp_cp = 4 ranks, expt_dp = 1 rank (no expert reduction)."""
    verdict = _verdict(verdicts, "ep2_etp2")
    for share in verdict["ranks"]:
        collectives = share["collectives"]
        for name in ("ep_dispatch_hidden.fwd", "ep_dispatch_hidden.bwd", "ep_combine_hidden.fwd",
                     "etp_gather_hidden.fwd", "etp_scatter_hidden.fwd", "ep_count_exchange.fwd"):
            assert collectives[name]["calls"] == 4, name
        assert collectives["dense_grad_reduce.fwd"]["calls"] == 1
        assert "expert_grad_reduce.fwd" not in collectives
        # n·k = 16 tokens × 2 rows of h = 32 fp32 leave each rank per dispatch, 4 dispatches
        assert collectives["ep_dispatch_hidden.fwd"]["send_bytes"] == 4 * 16 * 2 * 32 * 4
        memory = share["memory"]
        assert memory["grads_bytes"] == memory["weights_bytes"] > 0
        assert memory["optimizer_bytes"] >= 2 * memory["weights_bytes"]
        assert memory["activations_peak_bytes"] > 0

"""Recompute in the runtime: ranks really re-run the forward in backward, the ledger records the
re-run collectives under `recompute`, `moeplan verify` finds them equal to the plan's
`step.<collective>.recompute.*`, and the model still equals the single-process reference.

All cases share one 4-rank gloo launch (tests/test_runtime_equivalence's worker: 3 steps each,
m = 2 microbatches, the report holds the last step; tiny dims from
tests/test_runtime_equivalence: S = 16, b = 1, h = 32, k = 2, E = 8, fp32, seq_aux_loss).
Hand-derived figures:

* cp2_ep2_block: CP 2 → n = 16/2 = 8 rows, one dispatch 8·2·32·4 = 2048 bytes; 3 MoE layers,
  block method N_r = 2 re-runs layers 0 and 1 only → recompute 2048·2·2 = 8192, forward
  2048·3·2 = 12288. The CP K/V all-gather per block: b·S/CP · 2·groups·d · 4 = 8·2·2·8·4 = 1024
  bytes → recompute 1024·2·2 = 4096. seq_aux_loss counts b·E·4 = 32 bytes per router pass:
  the recomputed layers' first forward runs without grad and skips them → forward 32·1·2 = 64,
  recompute 32·2·2 = 128.
* pp2_vpp2_ep2_mtp_uniform: n = 16 rows, one dispatch 16·2·32·4 = 4096 bytes; layout
  Et|t|t|tmL: stage 0 holds layers 0, 2; stage 1 holds layers 1, 3 and the MTP block, which the
  uniform method recomputes too → recompute 4096·2·2 = 16384 (stage 0), 4096·3·2 = 24576 (stage 1).
* pp2_vpp2_ep2_mtp_block: the same layout, block method N_r = 1: each chunk's one decoder layer is
  recomputed, the MTP block is not → stage 1 re-runs 2 of its 3 MoE blocks: 4096·2·2 = 16384
  against a forward of 24576; stage 0 re-runs both: 16384.
* ep4_selective_moe: learned routing, selective `moe` recompute of every MoE layer; the sends a
  dropless dispatch fixes (n·k rows) are checked exactly, in the re-run as in the forward.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

from planner.verify import EXACT, EXPECTATION, verify
from tests.support.runtime_ranks import compile_case, free_port, run_cases

WORLD = 4
CASES: dict[str, tuple[dict[str, Any], bool]] = {  # name -> (overrides, balanced routing)
    "cp2_ep2_block": ({"model": {"num_layers": 3}, "parallel": {"cp": 2, "ep": 2},
                       "overlap": {"recompute_granularity": "full", "recompute_method": "block",
                                   "recompute_num_layers": 2}}, True),
    "pp2_vpp2_ep2_mtp_uniform": ({"model": {"num_layers": 4, "mtp_num_layers": 1},
                                  "parallel": {"pp": 2, "vpp": 2, "ep": 2,
                                               "pipeline_model_parallel_layout": "Et|t|t|tmL"},
                                  "overlap": {"recompute_granularity": "full",
                                              "recompute_method": "uniform",
                                              "recompute_num_layers": 1}}, True),
    "pp2_vpp2_ep2_mtp_block": ({"model": {"num_layers": 4, "mtp_num_layers": 1},
                                "parallel": {"pp": 2, "vpp": 2, "ep": 2,
                                             "pipeline_model_parallel_layout": "Et|t|t|tmL"},
                                "overlap": {"recompute_granularity": "full",
                                            "recompute_method": "block",
                                            "recompute_num_layers": 1}}, True),
    "ep4_selective_moe": ({"parallel": {"ep": 4},
                           "overlap": {"recompute_granularity": "selective",
                                       "recompute_modules": ["moe"]}}, False),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("recompute")
    cases = [(name, str(compile_case(name, overrides, folder)), None, balanced)
             for name, (overrides, balanced) in CASES.items()]
    out = folder / "reports.json"
    try:
        mp.spawn(run_cases, args=(WORLD, free_port(), cases, str(out)), nprocs=WORLD, join=True)
    except mp.ProcessRaisedException:
        pass  # the failing case is named in the reports file
    reports = json.loads(out.read_text()) if out.exists() else {}
    return {name: (json.loads(Path(path).read_text()), reports.get(name))
            for name, path, _, _ in cases}


def _run(runs: dict[str, Any], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    plan, report = runs[name]
    assert report is not None, f"case {name} did not run"
    assert "error" not in report, report["error"]
    assert report["reference"]["checked"] and report["reference"]["ok"], report["reference"]
    return plan, report


def _sent(report: dict[str, Any], rank: int, key: str) -> int:
    return int(report["ranks"][rank]["collectives"][key]["send_bytes"])


@pytest.mark.parametrize("name", list(CASES))
def test_recompute_keeps_the_reference_and_is_verified(runs: dict[str, Any], name: str) -> None:
    plan, report = _run(runs, name)
    result = verify(plan, report)
    assert result.ok, [f for f in result.mismatches]
    recomputed = [f for f in result.figures if f.phase == "recompute"]
    assert {f.rank for f in recomputed} == set(range(WORLD))
    if CASES[name][1]:  # balanced routing: every figure exact
        assert {f.status for f in result.figures} == {EXACT}
    else:
        statuses = {(f.collective, f.direction): f.status for f in recomputed}
        assert statuses["ep_dispatch_hidden", "send_bytes"] == EXACT
        assert statuses["ep_combine_hidden", "recv_bytes"] == EXACT
        assert statuses["ep_dispatch_hidden", "recv_bytes"] == EXPECTATION


def test_block_method_reruns_the_first_blocks_only(runs: dict[str, Any]) -> None:
    _, report = _run(runs, "cp2_ep2_block")
    for rank in range(WORLD):
        assert _sent(report, rank, "ep_dispatch_hidden.fwd") == 12288
        assert _sent(report, rank, "ep_dispatch_hidden.recompute") == 8192
        assert _sent(report, rank, "ep_combine_hidden.recompute") == 8192
        assert _sent(report, rank, "cp_kv_gather.recompute") == 4096
        assert _sent(report, rank, "aux_loss_count_reduce.fwd") == 64
        assert _sent(report, rank, "aux_loss_count_reduce.recompute") == 128
        collectives = report["ranks"][rank]["collectives"]
        assert collectives["ep_dispatch_hidden.recompute"]["calls"] == 2 * 2
        # gradient reductions and the bias counts run once per step, never re-run
        assert not {"dense_grad_reduce.recompute", "expert_bias_count_reduce.recompute"} & set(
            collectives)


@pytest.mark.parametrize(("method", "rerun"), [("uniform", {0: 16384, 1: 24576}),
                                               ("block", {0: 16384, 1: 16384})])
def test_pipeline_chunks_rerun_per_method(runs: dict[str, Any], method: str,
                                          rerun: dict[int, int]) -> None:
    _, report = _run(runs, f"pp2_vpp2_ep2_mtp_{method}")
    for share in report["ranks"]:
        collectives = share["collectives"]
        assert collectives["ep_dispatch_hidden.recompute"]["send_bytes"] == rerun[share["stage"]]
        assert collectives["ep_dispatch_hidden.fwd"]["send_bytes"] == {0: 16384,
                                                                       1: 24576}[share["stage"]]
        assert "pp_activation.recompute" not in collectives


def test_selective_core_attention_with_cp_is_refused(tmp_path: Path) -> None:
    """Re-running only core attention (with its CP K/V gather) is not implemented: refused
    before any group forms, naming the field."""
    from runtime.plan_io import PlanError, load_plan

    plan = compile_case("core_attn_cp2", {"parallel": {"cp": 2, "ep": 2},
                                          "overlap": {"recompute_granularity": "selective"}},
                        tmp_path)
    with pytest.raises(PlanError, match="overlap.recompute_modules with core_attn and cp > 1"):
        load_plan(plan)
    load_plan(compile_case("core_attn_cp1", {"parallel": {"ep": 2}, "overlap": {
        "recompute_granularity": "selective", "recompute_modules": ["core_attn", "moe_act"]}},
        tmp_path))

"""Pipeline parallelism in the runtime: PP and PP×VPP layouts equal the single-process reference,
tied embeddings are synced over the `embd` group, and the measured pipeline bytes are the plan's.

All PP and recompute cases share one 4-rank launch (tests/support/runtime_ranks.py's worker: 3
steps of m = 2 microbatches, every loss, MoE output, reduced gradient and final weight compared
within 1e-5).
The byte figures below are derived by hand: one pipeline message is an activation [S/CP, b, h]
in fp32, S = 16, b = 1, h = 32 → 16·32·4 = 2048 bytes (1024 with CP = 2); a stage sends one per
microbatch from each chunk that is not the model's last and receives one into each chunk that
is not the model's first. The tied word embedding is V·h·4 = 128·32·4 = 16384 bytes.

Recompute runs in the same launch: ranks really re-run the forward in backward, the ledger records
the re-run collectives under `recompute`, `moeplan verify` finds them equal to the plan's
`step.<collective>.recompute.*`, and the model still equals the single-process reference (the
report holds the last of the 3 steps; tiny dims S = 16, b = 1, h = 32, k = 2, E = 8, fp32,
seq_aux_loss).
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
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp
import yaml

from planner.verify import EXACT, EXPECTATION, MISMATCH, verify
from tests.support.launch import ENV, EXAMPLE, PYTHON, moeplan
from tests.support.paths import ROOT
from tests.support.runtime_ranks import STEPS, TOLERANCE, compile_case, free_port, merged, run_cases

TIED = {"untie_embeddings_and_output_weights": False}
CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "pp2_ep2_tied": ({"model": {"num_layers": 4, **TIED}, "parallel": {"pp": 2, "ep": 2}}, None),
    "pp2_vpp2_ep2_tied_hash": ({"model": {"num_layers": 4, "moe_n_hash_layers": 1, **TIED},
                                "parallel": {"pp": 2, "vpp": 2, "ep": 2,
                                             "pipeline_model_parallel_layout": "Et|t|t|tL"},
                                "moe": {"moe_tid2eid_source": "seeded"}}, None),
    "pp2_vpp2_cp2_untied_per_token": ({"model": {"num_layers": 4},
                                       "parallel": {"pp": 2, "vpp": 2, "cp": 2, "ep": 2},
                                       "training": {"calculate_per_token_loss": True}}, None),
    # Expert tensor parallelism under PP: ETP2 (EP1) on each stage's two ranks.
    "pp2_etp2": ({"model": {"num_layers": 2}, "parallel": {"pp": 2, "ep": 1, "etp": 2}}, None),
    # Two MTP depths (MoE layers 4, 5) on the last stage, untied: that stage's copy of the input
    # embedding (for the shifted ids) is what the embd group syncs.
    "pp2_ep2_mtp2_untied": ({"model": {"num_layers": 4, "mtp_num_layers": 2},
                             "parallel": {"pp": 2, "ep": 2}}, None),
    # Deliberately wrong: the two copies of the tied embedding step on their own gradients.
    "fault_pp2_embedding_unsynced": ({"model": {"num_layers": 2, **TIED},
                                      "parallel": {"pp": 2, "ep": 2}}, "embedding_grads_unsynced"),
    # ... and the MTP stage's copy of an untied input embedding.
    "fault_pp2_mtp_embedding_unsynced": ({"model": {"num_layers": 2, "mtp_num_layers": 1},
                                          "parallel": {"pp": 2, "ep": 2}},
                                         "embedding_grads_unsynced"),
}
WORLD = 4
RECOMPUTE_CASES: dict[str, tuple[dict[str, Any], bool]] = {  # name -> (overrides, balanced)
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

MESSAGE = 16 * 32 * 4
EMBEDDING = 128 * 32 * 4


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, str]]:
    """One 4-rank launch of every PP and recompute case: the verdicts and each case's plan file."""
    folder = tmp_path_factory.mktemp("pipeline")
    cases = [(name, str(compile_case(name, overrides, folder)), fault)
             for name, (overrides, fault) in CASES.items()]
    cases += [(name, str(compile_case(name, overrides, folder)), None, balanced)
              for name, (overrides, balanced) in RECOMPUTE_CASES.items()]
    out = folder / "verdicts.json"
    try:
        mp.spawn(run_cases, args=(WORLD, free_port(), cases, str(out)), nprocs=WORLD, join=True)
    except mp.ProcessRaisedException:
        pass  # the failing case is named in the verdicts file
    verdicts = json.loads(out.read_text()) if out.exists() else {}
    return verdicts, {name: path for name, path, *_ in cases}


@pytest.fixture(scope="module")
def pipeline_verdicts(launch: tuple[dict[str, Any], dict[str, str]]) -> dict[str, Any]:
    verdicts, plans = launch
    for name in CASES:
        if name in verdicts:
            verdicts[name]["plan"] = json.loads(Path(plans[name]).read_text())
    return verdicts


@pytest.fixture(scope="module")
def runs(launch: tuple[dict[str, Any], dict[str, str]]) -> dict[str, Any]:
    """name -> (plan, report) of every recompute case."""
    verdicts, plans = launch
    return {name: (json.loads(Path(plans[name]).read_text()), verdicts.get(name))
            for name in RECOMPUTE_CASES}


def _verdict(verdicts: dict[str, Any], name: str) -> dict[str, Any]:
    assert name in verdicts, f"case {name} did not run"
    assert "error" not in verdicts[name], verdicts[name].get("error")
    return verdicts[name]


@pytest.mark.parametrize("name", [name for name, (_, fault) in CASES.items() if fault is None])
def test_pipelined_runtime_matches_reference(pipeline_verdicts: dict[str, Any], name: str) -> None:
    verdict = _verdict(pipeline_verdicts, name)
    reference = verdict["reference"]
    assert reference["mismatches"] == []
    assert reference["ok"] and verdict["code"] == 0
    assert reference["max_rel_error"] <= TOLERANCE
    # every rank compared its stage's MoE outputs, gradients and weights, the last stage its
    # losses: STEPS x 2 microbatches of losses on each last-stage rank
    assert reference["tensors_checked"] >= 40 * verdict["world_size"]
    last_stage = [share for share in verdict["ranks"] if share["stage"] == 1]
    assert all(len(share["step_losses"]) == STEPS for share in last_stage)
    assert all(share["step_losses"] == [] for share in verdict["ranks"] if share["stage"] == 0)


@pytest.mark.parametrize(
    ("name", "cp", "chunks", "synced"),
    [("pp2_ep2_tied", 1, 1, True), ("pp2_vpp2_ep2_tied_hash", 1, 2, True), ("pp2_etp2", 1, 1, False),
     ("pp2_vpp2_cp2_untied_per_token", 2, 2, False), ("pp2_ep2_mtp2_untied", 1, 1, True)],
)
def test_pipeline_bytes_are_the_plans_prediction(pipeline_verdicts: dict[str, Any], name: str,
                                                 cp: int, chunks: int, synced: bool) -> None:
    """`synced`: a word embedding shared between stages (tied head, or an MTP stage's copy)."""
    verdict = _verdict(pipeline_verdicts, name)
    message, m = MESSAGE // cp, 2
    for share in verdict["ranks"]:
        measured = share["collectives"]
        first = share["stage"] == 0
        sends, receives = (chunks, chunks - 1) if first else (chunks - 1, chunks)
        fwd, bwd = measured["pp_activation.fwd"], measured["pp_activation.bwd"]
        assert fwd["send_bytes"] == bwd["recv_bytes"] == sends * m * message
        assert fwd["recv_bytes"] == bwd["send_bytes"] == receives * m * message
        embedding = measured.get("embd_grad_reduce.fwd")
        if synced:
            assert embedding is not None and embedding["group"] == "embd"
            assert embedding["send_bytes"] == embedding["recv_bytes"] == EMBEDDING
        else:
            assert embedding is None
    figures = verify(verdict["plan"], verdict).figures
    assert not [f for f in figures if f.status == MISMATCH]
    pp_figures = [f for f in figures if f.collective in ("pp_activation", "embd_grad_reduce")]
    assert pp_figures and all(f.status == EXACT for f in pp_figures)


@pytest.mark.parametrize("name", ["fault_pp2_embedding_unsynced",
                                  "fault_pp2_mtp_embedding_unsynced"])
def test_unsynced_embedding_copy_is_caught(pipeline_verdicts: dict[str, Any], name: str) -> None:
    """Without the embd all-reduce each stage's copy gets only its own use's gradient: the
    reference check names the embedding gradient on the ranks of both stages."""
    verdict = _verdict(pipeline_verdicts, name)
    reference = verdict["reference"]
    assert not reference["ok"] and verdict["code"] == 1
    tensors = {m["tensor"] for m in reference["mismatches"]}
    assert "step 0 gradient embedding" in tensors
    ranks = {m["rank"] for m in reference["mismatches"] if m["tensor"] == "step 0 gradient embedding"}
    assert ranks == {0, 1, 2, 3}


def test_tiny_cpu_8_with_pp2_runs_verified(tmp_path: Path) -> None:
    """The example changed to world_size 4, cp 2, pp 2, ep 2 (etp 1, B = 4): torchrun with
    --check-reference, --balanced and --report, then `moeplan verify` finds every figure exact.
    (Four ranks, not eight: ETP under PP is the spawned case pp2_etp2 above.)"""
    config = yaml.safe_load(EXAMPLE.read_text())
    config["parallel"].update(world_size=4, cp=2, pp=2, ep=2, etp=1,
                              pipeline_model_parallel_layout="Et|tL")
    config["training"]["global_batch_size"] = 4
    source = tmp_path / "tiny-pp2.yaml"
    source.write_text(yaml.safe_dump(config))
    plan, report = tmp_path / "plan.json", tmp_path / "report.json"
    compiled = moeplan("compile", str(source), "-o", str(plan))
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    run = subprocess.run(
        [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m",
         "runtime", "--plan", str(plan), "--steps", "2", "--check-reference", "--balanced",
         "--report", str(report)],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "reference check: ok" in run.stdout
    checked = moeplan("verify", str(plan), str(report))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    figures = verify(json.loads(plan.read_text()), json.loads(report.read_text())).figures
    assert not [f for f in figures if f.status == MISMATCH]
    predicted = [f for f in figures if f.predicted is not None]
    assert predicted and all(f.status == EXACT for f in predicted)  # balanced: all exact
    pp_sends = [f for f in figures if f.collective == "pp_activation" and f.phase == "fwd"
                and f.direction == "send_bytes" and f.stage == 0]
    # S/CP = 16 rows of h = 64 fp32, 4 microbatches (B = 4 over DP 1)
    assert pp_sends and all(f.measured == 16 * 64 * 4 * 4 for f in pp_sends)


def _plan(tmp_path: Path, name: str, overrides: dict[str, Any]) -> Path:
    return compile_case(name, overrides, tmp_path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"parallel": {"pp": 2, "vpp": 2, "microbatch_group_size_per_vp_stage": 4},
          "model": {"num_layers": 4}, "training": {"global_batch_size": 8}},
         "microbatch_group_size_per_vp_stage"),
        # MTP runs after the main model's final norm: it must share the loss chunk
        ({"model": {"mtp_num_layers": 1, "num_layers": 2},
          "parallel": {"pp": 2, "pipeline_model_parallel_layout": "Etm|tL"}}, "without the loss"),
        # one microbatch for two stages: Megatron runs it (planner warning BAT004), torch's
        # Schedule1F1B would raise mid-launch, so the runtime refuses it up front
        ({"parallel": {"pp": 2}, "training": {"global_batch_size": 2}}, "1F1B schedule needs"),
    ],
)
def test_what_the_schedules_cannot_run_is_refused_before_any_group(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: dict[str, Any],
        message: str) -> None:
    import torch.distributed as dist

    from runtime.__main__ import main

    config = merged({"parallel": {"ep": 2}, **overrides})
    par = config["parallel"]
    dp = par["world_size"] // (par.get("cp", 1) * par.get("pp", 1))
    wanted = config["training"].get("global_batch_size") or 2 * dp
    source = tmp_path / "refused.yaml"
    config["training"]["global_batch_size"] = wanted
    source.write_text(yaml.safe_dump(config))
    plan = tmp_path / "refused.plan.json"
    compiled = moeplan("compile", str(source), "-o", str(plan))
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    assert main(["--plan", str(plan)]) == 2
    assert message in capsys.readouterr().err
    assert not dist.is_initialized()


# ----------------------------------------------------------------------------- recompute


def _run(runs: dict[str, Any], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    plan, report = runs[name]
    assert report is not None, f"case {name} did not run"
    assert "error" not in report, report["error"]
    assert report["reference"]["checked"] and report["reference"]["ok"], report["reference"]
    return plan, report


def _sent(report: dict[str, Any], rank: int, key: str) -> int:
    return int(report["ranks"][rank]["collectives"][key]["send_bytes"])


@pytest.mark.parametrize("name", list(RECOMPUTE_CASES))
def test_recompute_keeps_the_reference_and_is_verified(runs: dict[str, Any], name: str) -> None:
    plan, report = _run(runs, name)
    result = verify(plan, report)
    assert result.ok, [f for f in result.mismatches]
    recomputed = [f for f in result.figures if f.phase == "recompute"]
    assert {f.rank for f in recomputed} == set(range(WORLD))
    if RECOMPUTE_CASES[name][1]:  # balanced routing: every figure exact
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

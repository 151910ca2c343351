"""`python -m runtime` as users run it: torchrun launches, exit codes, refusals, then `moeplan verify`.

The headline check (examples/tiny-cpu-8.yaml on 8 gloo ranks, balanced routing, every EP/ETP byte
exact) runs through the emitted launcher in test_emit_run.py; this file covers the rest.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.launch import edited, moeplan, runtime, small, torchrun


def test_learned_routing_checks_sends_and_shows_receives(tmp_path: Path) -> None:
    plan = small(tmp_path)
    report = tmp_path / "report.json"
    run = torchrun(2, "--plan", str(plan), "--steps", "3", "--check-reference", "--report",
                   str(report), "--seed", "11")
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    assert "step 3/3" in run.stderr  # rank 0's progress display
    measured = json.loads(report.read_text())
    assert measured["seed"] == 11 and not measured["balanced"]
    verify = moeplan("verify", str(plan), str(report), "--json")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    status = {(f["rank"], f["collective"], f["phase"], f["direction"]): f["status"]
              for f in json.loads(verify.stdout)["figures"]}
    for rank in (0, 1):
        assert status[rank, "ep_dispatch_hidden", "fwd", "send_bytes"] == "exact"
        assert status[rank, "ep_combine_hidden", "bwd", "send_bytes"] == "exact"
        assert status[rank, "ep_dispatch_hidden", "fwd", "recv_bytes"] == "expectation"
        assert status[rank, "ep_combine_hidden", "fwd", "send_bytes"] == "expectation"
        assert status[rank, "dense_grad_reduce", "fwd", "send_bytes"] == "exact"


def test_one_rank_plan_runs_without_torchrun(tmp_path: Path) -> None:
    plan = small(tmp_path, parallel={"world_size": 1, "ep": 1},
                 training={"global_batch_size": 2})
    report = tmp_path / "report.json"
    run = runtime("--plan", str(plan), "--steps", "2", "--check-reference", "--report",
                  str(report))
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(report.read_text())["reference"]["ok"]


@pytest.mark.parametrize(
    ("edit", "redigest", "message"),
    [
        (lambda d: d["layout"].update(ep=4), False, "digest mismatch"),
        (lambda d: d.update(version=2), True, "version 2"),
        (lambda d: d.update(format="something-else"), True, "not a moeplan plan"),
        (lambda d: d["config"]["moe"].update(moe_token_dispatcher_type="flex"), True,
         "'alltoall' and 'allgather'"),
        (lambda d: d["layout"].update(vpp=2), True, "virtual pipeline stages need PP > 1"),
        (lambda d: d["layout"].update(pp=2), True, "no stage 1 in 'stages'"),
        (lambda d: d["layout"].update(tp=2), True, "MoE layers and parallel.sequence_parallel "
         "false"),
        (lambda d: d["config"]["training"].update(precision="fp16"), True, "dynamic loss scaler"),
        (lambda d: d["config"]["model"].update(mtp_num_layers=1), True, "MTP"),
        (lambda d: d["groups"].pop("expt_dp"), True, "'expt_dp'"),
        (lambda d: d["config"]["moe"].update(moe_tid2eid_source="ckpt/tid2eid.pt"), True,
         "tid2eid"),
        (lambda d: d["config"]["training"].pop("seq_length"), True,
         "no config.training.seq_length"),
        (lambda d: d["config"]["moe"].pop("moe_router_force_load_balancing"), True,
         "no config.moe.moe_router_force_load_balancing"),
        (lambda d: d["config"]["model"].pop("moe_router_score_function"), True,
         "no config.model.moe_router_score_function"),
        (lambda d: d.update(budgets=[b for b in d["budgets"]
                                     if b["name"] != "grad_scale_sum_dense"]), True,
         "no budget 'grad_scale_sum_dense'"),
    ],
)
def test_unrunnable_plans_are_refused_before_any_group_forms(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, redigest: bool,
        message: str) -> None:
    """In-process `main`: the refusal comes back as exit code 2 before torch.distributed starts."""
    import torch.distributed as dist

    from runtime.__main__ import main

    plan = edited(small(tmp_path, model={"moe_n_hash_layers": 1}), edit, redigest=redigest)
    assert main(["--plan", str(plan)]) == 2
    assert message in capsys.readouterr().err
    assert not dist.is_initialized()


def test_a_plan_edited_and_digested_again_is_refused_naming_the_figure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m runtime` launched by hand (no launcher's digest check): the digest proves the
    file intact, so rank 0 re-derives the plan from its own config (runtime/rederive.py, `moeplan
    verify PLAN` in a child) before any process group forms. Before, a doubled dense gradient
    scale, re-digested, trained."""
    import torch.distributed as dist

    from runtime.__main__ import main

    plan = small(tmp_path, parallel={"world_size": 1, "ep": 1}, training={"global_batch_size": 2})

    def double(document: dict[str, Any]) -> None:
        entry = next(b for b in document["budgets"]
                     if b["name"] == "grad_scale_sum_dense" and b["stage"] is None)
        assert entry["value"] == 1  # one rank: the summed gradient is the step's own
        entry["value"] = 2

    assert main(["--plan", str(edited(plan, double, redigest=True))]) == 2
    err = capsys.readouterr().err
    assert re.search(r"^moeplan runtime: the plan is not what its own config compiles to "
                     r"\(budgets\[\d+ grad_scale_sum_dense\]\.value is 2 in the plan, 1 when its "
                     r"config is compiled\)", err), err
    assert not dist.is_initialized()


def test_launch_problems_are_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch.distributed as dist

    from runtime.__main__ import main

    plan = small(tmp_path)
    alone = runtime("--plan", str(plan))
    assert alone.returncode == 2 and "--nproc-per-node=2" in alone.stderr
    missing = runtime("--plan", str(tmp_path / "missing.json"))
    assert missing.returncode == 2 and "no such plan file" in missing.stderr
    for run in (alone, missing):
        assert "Traceback" not in run.stderr
    # in-process (no traceback: an exception would fail the test): the balanced-routing refusal
    balanced = small(tmp_path, "odd", model={"num_experts": 6, "moe_router_topk": 1},
                     parallel={"world_size": 2, "ep": 2}, training={"seq_length": 10})
    capsys.readouterr()
    assert main(["--plan", str(balanced), "--balanced"]) == 2
    assert "divide" in capsys.readouterr().err and not dist.is_initialized()
    # a bf16 reference check with learned routing: a rounding can flip a near-tied top-k choice
    bf16 = small(tmp_path, "bf16", training={"precision": "bf16"})
    assert main(["--plan", str(bf16), "--check-reference"]) == 2
    said = capsys.readouterr().err
    assert "training.precision = 'bf16'" in said and "add --balanced" in said
    assert not dist.is_initialized()
    usage = runtime("--plan", str(plan), "--steps", "0")
    assert usage.returncode == 2 and "--steps" in usage.stderr

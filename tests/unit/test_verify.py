"""`moeplan verify`: which figures are checked, which are expectations, and the exit codes.

Reports here are written by hand from the plan of examples/tiny-cpu-8.yaml (8 ranks; dense
CP2·DP4, expert ETP2·EP2·EDP2; 2 MoE layers, m = 2 microbatches, n = 32/2 = 16 rows per rank,
k = 2, h = 64, fp32), so no torch is needed; test_runtime_cli.py verifies real runtime reports.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.cli import app
from planner.config.loader import load_config
from planner.plan import compile_plan
from planner.rules import run_rules
from planner.verify import (
    EXACT,
    EXPECTATION,
    MISMATCH,
    UNPREDICTED,
    VerifyInputError,
    predictions,
    routing_free,
    verify,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-cpu-8.yaml"
PASSES = 2 * 2  # MoE layers x microbatches per optimizer step
ROWS = 16 * 2  # n·k rows a rank dispatches per MoE layer pass
HIDDEN_ROW = 64 * 4  # bytes of one fp32 hidden row


@pytest.fixture(scope="module")
def plan() -> dict[str, Any]:
    cfg = load_config(EXAMPLE)
    return compile_plan(cfg, run_rules(cfg))


def measured_as_predicted(plan: dict[str, Any], *, balanced: bool = True) -> dict[str, Any]:
    """A report whose every rank moved exactly the predicted bytes (what balanced routing gives)."""
    table = predictions(plan)
    collectives: dict[str, dict[str, Any]] = {}
    for (_, collective, phase, direction), value in table.items():
        if value == 0:
            continue  # a one-rank group: the runtime issues nothing and records nothing
        entry = collectives.setdefault(f"{collective}.{phase}",
                                       {"group": "g", "calls": PASSES, "send_bytes": 0,
                                        "remote_send_bytes": 0, "recv_bytes": 0})
        entry[direction] = int(value)
    return {
        "format": "moeplan-report", "version": 1, "plan_digest": plan["digest"], "world_size": 8,
        "steps": 2, "balanced": balanced, "seed": 0,
        "reference": {"checked": True, "ok": True, "tolerance": 1e-5, "max_rel_error": 1e-7,
                      "mismatches": []},
        "ranks": [{"rank": r, "stage": 0, "collectives": copy.deepcopy(collectives),
                   "memory": {}} for r in range(8)],
    }


def status_of(result: Any, rank: int, name: str, direction: str) -> str:
    collective, phase = name.split(".")
    return next(f.status for f in result.figures if f.rank == rank and f.collective == collective
                and f.phase == phase and f.direction == direction)


def test_predictions_are_the_hand_derived_step_bytes(plan: dict[str, Any]) -> None:
    table = predictions(plan)
    assert table[0, "ep_dispatch_hidden", "fwd", "send_bytes"] == ROWS * HIDDEN_ROW * PASSES
    # ETP2: the reduce-scatter input holds both ETP ranks' rows
    assert table[0, "etp_scatter_hidden", "fwd", "send_bytes"] == 2 * ROWS * HIDDEN_ROW * PASSES
    # counts: an int64 vector of E = 8 per pass, gathered over tp_ep = 4 ranks
    assert table[0, "ep_count_exchange", "fwd", "send_bytes"] == 8 * 8 * PASSES
    assert table[0, "ep_count_exchange", "fwd", "recv_bytes"] == 4 * 8 * 8 * PASSES


def test_balanced_report_matching_the_budgets_is_verified(plan: dict[str, Any]) -> None:
    result = verify(plan, measured_as_predicted(plan))
    assert result.ok and result.balanced
    assert result.mismatches == []
    assert {f.status for f in result.figures} == {EXACT}
    assert {f.rank for f in result.figures} == set(range(8))
    figure = next(f for f in result.figures if f.collective == "ep_dispatch_hidden")
    assert figure.ratio == 1


def test_one_byte_off_is_a_mismatch_on_that_rank_only(plan: dict[str, Any]) -> None:
    report = measured_as_predicted(plan)
    report["ranks"][5]["collectives"]["etp_gather_hidden.fwd"]["recv_bytes"] += 4
    result = verify(plan, report)
    assert not result.ok
    [wrong] = result.mismatches
    assert (wrong.rank, wrong.collective, wrong.phase, wrong.direction) == (
        5, "etp_gather_hidden", "fwd", "recv_bytes")
    assert wrong.ratio == Fraction(wrong.measured, int(wrong.predicted))


def test_a_predicted_collective_that_never_ran_is_a_mismatch(plan: dict[str, Any]) -> None:
    report = measured_as_predicted(plan)
    del report["ranks"][2]["collectives"]["ep_dispatch_hidden.fwd"]
    result = verify(plan, report)
    assert {(f.rank, f.collective, f.measured) for f in result.mismatches} == {
        (2, "ep_dispatch_hidden", 0)}


def test_learned_routing_checks_routing_free_figures_only(plan: dict[str, Any]) -> None:
    report = measured_as_predicted(plan, balanced=False)
    shares = report["ranks"][0]["collectives"]
    shares["ep_dispatch_hidden.fwd"]["recv_bytes"] += 7 * HIDDEN_ROW  # a hot expert
    shares["ep_combine_hidden.fwd"]["send_bytes"] += 7 * HIDDEN_ROW
    shares["etp_gather_hidden.fwd"]["send_bytes"] += 7 * HIDDEN_ROW
    result = verify(plan, report)
    assert result.ok
    assert status_of(result, 0, "ep_dispatch_hidden.fwd", "recv_bytes") == EXPECTATION
    assert status_of(result, 0, "ep_dispatch_hidden.fwd", "send_bytes") == EXACT
    assert status_of(result, 0, "ep_combine_hidden.bwd", "send_bytes") == EXACT
    assert status_of(result, 0, "dense_grad_reduce.fwd", "send_bytes") == EXACT
    shares["ep_dispatch_hidden.fwd"]["send_bytes"] += HIDDEN_ROW  # n·k rows can never change
    assert [f.collective for f in verify(plan, report).mismatches] == ["ep_dispatch_hidden"]


@pytest.mark.parametrize(
    ("moe", "figure", "exact"),
    [
        ({}, ("ep_dispatch_hidden", "fwd", "send_bytes"), True),
        ({}, ("ep_dispatch_probs", "bwd", "recv_bytes"), True),
        ({}, ("ep_dispatch_hidden", "bwd", "send_bytes"), False),
        ({}, ("etp_scatter_hidden", "fwd", "send_bytes"), False),
        ({}, ("ep_count_exchange", "fwd", "recv_bytes"), True),
        ({}, ("cp_kv_gather", "bwd", "send_bytes"), True),
        ({"moe_token_dispatcher_type": "allgather"}, ("ag_gather_hidden", "fwd", "recv_bytes"),
         True),
        ({"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True},
         ("etp_gather_hidden", "fwd", "recv_bytes"), True),
        ({"moe_expert_capacity_factor": 1.0}, ("ep_dispatch_hidden", "fwd", "send_bytes"), False),
    ],
)
def test_which_figures_routing_cannot_change(moe: dict[str, Any], figure: tuple[str, str, str],
                                             exact: bool) -> None:
    plan = {"config": {"moe": {"moe_token_dispatcher_type": "alltoall",
                               "moe_expert_capacity_factor": None,
                               "moe_pad_expert_input_to_capacity": False, **moe}}}
    assert routing_free(plan, *figure) is exact


def test_measured_without_prediction_is_shown_not_failed(plan: dict[str, Any]) -> None:
    report = measured_as_predicted(plan)
    plan = {**plan, "budgets": [b for b in plan["budgets"]
                                if not b["name"].startswith("step.aux_loss_count_reduce.")]}
    report["ranks"][1]["collectives"]["aux_loss_count_reduce.fwd"] = {
        "group": "tp_cp", "calls": 4, "send_bytes": 128, "remote_send_bytes": 128,
        "recv_bytes": 128}
    result = verify(plan, report)
    assert result.ok
    assert status_of(result, 1, "aux_loss_count_reduce.fwd", "send_bytes") == UNPREDICTED


def test_a_failed_reference_check_fails_verification(plan: dict[str, Any]) -> None:
    report = measured_as_predicted(plan)
    report["reference"].update(ok=False, mismatches=[{"tensor": "x", "rank": 0, "rel_error": 1}])
    assert not verify(plan, report).ok


def test_a_report_of_another_plan_is_refused(plan: dict[str, Any]) -> None:
    report = measured_as_predicted(plan)
    report["plan_digest"] = "sha256:" + "0" * 64
    with pytest.raises(VerifyInputError, match="another plan"):
        verify(plan, report)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 200), st.integers(1, 1 << 20)),
                max_size=6, unique_by=lambda t: (t[0], t[1])))
def test_balanced_mismatches_are_exactly_the_perturbed_figures(
        plan: dict[str, Any], edits: list[tuple[int, int, int]]) -> None:
    report = measured_as_predicted(plan)
    keys = sorted(report["ranks"][0]["collectives"])
    perturbed = set()
    for rank, index, delta in edits:
        name = keys[index % len(keys)]
        direction = "send_bytes" if index % 2 else "recv_bytes"
        if (rank, name, direction) in perturbed:
            continue
        perturbed.add((rank, name, direction))
        report["ranks"][rank]["collectives"][name][direction] += delta
    found = {(f.rank, f"{f.collective}.{f.phase}", f.direction)
             for f in verify(plan, report).mismatches}
    assert found == perturbed


def _write(folder: Path, plan: dict[str, Any], report: dict[str, Any]) -> tuple[str, str]:
    plan_path, report_path = folder / "plan.json", folder / "report.json"
    plan_path.write_text(json.dumps(plan))
    report_path.write_text(json.dumps(report))
    return str(plan_path), str(report_path)


def test_cli_exit_codes_and_table(plan: dict[str, Any], tmp_path: Path) -> None:
    runner = CliRunner()
    report = measured_as_predicted(plan)
    paths = _write(tmp_path, plan, report)
    ok = runner.invoke(app, ["verify", *paths, "--rank", "0"])
    assert ok.exit_code == 0, ok.output
    assert "ep_dispatch_hidden.fwd" in ok.output and "verified" in ok.output
    assert "32,768" in ok.output  # 16·2 rows × 64 × 4 B × 4 passes, not truncated by width

    report["ranks"][3]["collectives"]["ep_combine_hidden.bwd"]["send_bytes"] -= 1
    paths = _write(tmp_path, plan, report)
    bad = runner.invoke(app, ["verify", *paths, "--mismatches"])
    assert bad.exit_code == 1
    assert "MISMATCH" in bad.output and "NOT verified" in bad.output
    payload = json.loads(runner.invoke(app, ["verify", *paths, "--json"]).output)
    assert not payload["ok"]
    assert [(f["rank"], f["collective"]) for f in payload["figures"]
            if f["status"] == MISMATCH] == [(3, "ep_combine_hidden")]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p, r: r.update(plan_digest="sha256:00"), "another plan"),
        (lambda p, r: r.update(format="other"), "not a moeplan runtime report"),
        (lambda p, r: r.update(version=9), "runtime report format version 9"),
        (lambda p, r: p["layout"].update(ep=1), "digest mismatch"),
    ],
)
def test_cli_refuses_unusable_inputs(plan: dict[str, Any], tmp_path: Path, edit: Any,
                                     message: str) -> None:
    plan, report = copy.deepcopy(plan), measured_as_predicted(plan)
    edit(plan, report)
    result = CliRunner().invoke(app, ["verify", *_write(tmp_path, plan, report)])
    assert result.exit_code == 2
    assert message in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_verify_never_imports_torch() -> None:
    probe = ("import sys, planner.verify, planner.commands.verify; "
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_a_plan_edited_and_digested_again_is_refused(plan: dict[str, Any], tmp_path: Path) -> None:
    """The digest proves the file intact, not that its figures follow from its config: before,
    a doubled dense gradient scale (re-digested) was called verified."""
    from planner.plan_format import plan_digest
    from planner.verify import check_rederived

    check_rederived(plan)  # the plan as compiled passes
    edited = json.loads(json.dumps(plan))
    index, entry = next((i, b) for i, b in enumerate(edited["budgets"])
                        if b["name"] == "step.dense_grad_reduce.fwd.send_bytes")
    entry["value"] *= 2
    edited["digest"] = plan_digest(edited)
    stage = "" if entry.get("stage") is None else f", stage {entry['stage']}"
    figure = rf"budgets\[{index} step\.dense_grad_reduce\.fwd\.send_bytes{stage}\]\.value"
    with pytest.raises(VerifyInputError, match=rf"{figure} is {entry['value']} in the plan, "
                                               rf"{entry['value'] // 2} when its config is compiled"):
        check_rederived(edited)
    # `moeplan verify PLAN` alone asks exactly this (the runtime's rank 0 runs it before any
    # process group forms, runtime/rederive.py): exit 0 for the plan as compiled, 2 naming the
    # figure for the edit
    for document, code, said in ((plan, 0, "are what its config compiles to"),
                                 (edited, 2, "step.dense_grad_reduce.fwd.send_bytes")):
        path = tmp_path / f"plan-{code}.json"
        path.write_text(json.dumps(document))
        result = CliRunner().invoke(app, ["verify", str(path)])
        assert result.exit_code == code and said in result.output, result.output

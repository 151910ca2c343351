"""Pipeline parallelism under torchrun, and the layouts torch's schedules cannot run.

The PP and PP×VPP layouts' equivalence with the single-process reference, their embedding sync and
pipeline bytes, and recompute, run in test_runtime_equivalence.py's shared launch.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from planner.verify import EXACT, MISMATCH, verify
from tests.support.launch import ENV, EXAMPLE, PYTHON, moeplan
from tests.support.paths import ROOT
from tests.support.runtime_ranks import compile_case, merged


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

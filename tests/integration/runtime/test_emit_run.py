"""The emitted torchrun launcher, run for real: `moeplan launch` does compile → emit → run → verify
in one command, and its 8 CPU ranks of the bundled runtime on the tiny example must finish with the
reference check passing and every byte `moeplan verify` reads exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from planner.cli import app
from tests.support.paths import EXAMPLES, ROOT
from tests.support.ports import free_port

runner = CliRunner()
RUN_TIMEOUT = 300


def clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("MASTER_", "NNODES", "NPROC", "NODE_RANK", "RDZV", "MOEPLAN_"))}
    env.update(PYTHON=sys.executable, MASTER_PORT=str(free_port()), **extra)
    return env


def balanced_tiny_cpu_8(folder: Path) -> Path:
    """The issue's example as shipped, with balanced routing so every byte is exact, and a job name
    a folder cannot carry as it is."""
    data = yaml.safe_load((EXAMPLES / "tiny-cpu-8.yaml").read_text())
    data["moe"]["moe_router_force_load_balancing"] = True
    data["launch"]["job_name"] = "tiny eight/ranks"
    path = folder / "tiny-cpu-8-balanced.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_moeplan_launch_runs_the_emitted_script_on_tiny_cpu_8_and_every_byte_is_verified_exactly(
        tmp_path: Path):
    """`moeplan launch` (compile → emit → run → verify) of 8 ranks (CP2·DP4 dense, ETP2·EP2·EDP2
    expert) through the emitted torchrun script, as users launch them; balanced routing
    (`--balanced`, which the script passes) makes every dispatch figure exact. One job serves both
    the launcher's and the script's claims: launch runs the script with NNODES=1 and
    NPROC_PER_NODE=8, which are the script's own defaults for this plan (checked below)."""
    runs = tmp_path / "runs"
    launched = subprocess.run(
        [sys.executable, "-m", "planner.cli", "launch", str(balanced_tiny_cpu_8(tmp_path)),
         "--runs-dir", str(runs)],
        env=clean_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=RUN_TIMEOUT,
        cwd=tmp_path)
    output = launched.stdout + launched.stderr
    assert launched.returncode == 0, output[-4000:]
    [out] = runs.iterdir()
    assert out.name.startswith("tiny_eight_ranks-")  # job name made safe for a folder name
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "report.json", "torchrun.sh"]
    assert f"run folder {out}: 8 rank(s) on this machine" in output
    assert f"moeplan verify {out / 'plan.json'} {out / 'report.json'}" in output
    assert "reference check: ok" in launched.stdout
    assert f"{out / 'report.json'}: verified" in output
    script = (out / "torchrun.sh").read_text()
    assert "--balanced" in script
    assert "NNODES=${NNODES:-1}" in script and "NPROC_PER_NODE=${NPROC_PER_NODE:-8}" in script

    plan = json.loads((out / "plan.json").read_text())
    measured = json.loads((out / "report.json").read_text())
    assert measured["balanced"] and measured["steps"] == 2 and measured["world_size"] == 8
    assert measured["reference"] == {**measured["reference"], "checked": True, "ok": True}
    assert measured["plan_digest"] == plan["digest"]
    assert [share["rank"] for share in measured["ranks"]] == list(range(8))

    verify = runner.invoke(app, ["verify", str(out / "plan.json"), str(out / "report.json"), "--json"])
    assert verify.exit_code == 0, verify.output
    figures = json.loads(verify.output)["figures"]
    dispatch = [f for f in figures if f["collective"].startswith(("ep_", "etp_"))]
    # 6 EP and 6 ETP collective phases plus the count exchange, send and recv, on 8 ranks
    assert len(dispatch) == 8 * 2 * 13
    assert all(f["status"] == "exact" and f["measured"] == f["predicted"] for f in dispatch)
    # hand-derived: n = 32/2 = 16 rows, k = 2, h = 64, fp32, 2 MoE layers x 2 microbatches
    send = {(f["rank"], f["collective"], f["phase"]): f["measured"] for f in figures
            if f["direction"] == "send_bytes"}
    assert send[0, "ep_dispatch_hidden", "fwd"] == 16 * 2 * 64 * 4 * 2 * 2
    assert send[5, "etp_scatter_hidden", "fwd"] == 2 * 16 * 2 * 64 * 4 * 2 * 2
    assert send[3, "ep_count_exchange", "fwd"] == 8 * 8 * 2 * 2

    table = runner.invoke(app, ["verify", str(out / "plan.json"), str(out / "report.json"), "--rank", "3"])
    assert table.exit_code == 0, table.output
    assert "ep_dispatch_hidden.fwd" in table.output and "verified" in table.output
    assert "NOT verified" not in table.output


def test_launch_refuses_a_config_with_errors_before_creating_a_run_folder(tmp_path: Path):
    data = yaml.safe_load((EXAMPLES / "tiny-cpu-8.yaml").read_text())
    data["parallel"]["ep"] = 3
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["launch", str(config), "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 1
    assert not (tmp_path / "runs").exists()


def test_launch_refuses_more_ranks_than_this_machine_should_start(tmp_path: Path):
    runs = tmp_path / "runs"
    result = runner.invoke(app, ["launch", str(EXAMPLES / "deepseek-v4-pro-1024.yaml"), "--runs-dir",
                                 str(runs)])
    assert result.exit_code == 2
    assert "1024 ranks" in result.output and "moeplan emit slurm" in result.output
    assert not runs.exists()


def test_run_folders_are_fresh_and_named_after_the_job(tmp_path: Path, monkeypatch):
    from planner.commands import launch

    monkeypatch.setattr(launch.time, "strftime", lambda fmt, when: "20260101-000000")
    first = launch.run_folder(tmp_path / "runs", "a/b c")
    second = launch.run_folder(tmp_path / "runs", "a/b c")
    assert (first.name, second.name) == ("a_b_c-20260101-000000", "a_b_c-20260101-000000-2")
    assert first.is_dir() and second.is_dir()
    assert launch.run_folder(tmp_path / "runs", "../..").name == "run-20260101-000000"

"""The emitted torchrun launcher, run for real: 8 CPU ranks of the bundled runtime on the tiny example
must finish with the reference check passing and `moeplan verify` content; `moeplan launch` does
compile → emit → run → verify in one command on a 2-rank plan.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from planner.cli import app
from tests.support.paths import EXAMPLES, ROOT

runner = CliRunner()
RUN_TIMEOUT = 300


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("MASTER_", "NNODES", "NPROC", "NODE_RANK", "RDZV", "MOEPLAN_"))}
    env.update(PYTHON=sys.executable, MASTER_PORT=str(free_port()), **extra)
    return env


def test_emitted_torchrun_script_runs_tiny_cpu_8_with_the_reference_check_passing(tmp_path: Path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["emit", "torchrun", str(EXAMPLES / "tiny-cpu-8.yaml"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    run = subprocess.run(["bash", str(out / "torchrun.sh")], env=clean_env(), capture_output=True,
                         text=True, timeout=RUN_TIMEOUT, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "reference check: ok" in run.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["world_size"] == 8 and report["steps"] == 2
    assert report["reference"] == {**report["reference"], "checked": True, "ok": True}
    verify = runner.invoke(app, ["verify", str(out / "plan.json"), str(out / "report.json")])
    assert verify.exit_code == 0, verify.output
    assert "verified" in verify.output and "NOT verified" not in verify.output


def two_rank_config(folder: Path) -> Path:
    """tiny-cpu-8 on 2 ranks: TP1 CP1 DP2 | ETP1 EP2 EDP1, one step."""
    data = yaml.safe_load((EXAMPLES / "tiny-cpu-8.yaml").read_text())
    data["parallel"].update(world_size=2, cp=1, ep=2, etp=1)
    data["cluster"].update(nodes=1, gpus_per_node=2)
    data["training"]["global_batch_size"] = 2
    data["launch"] = {"job_name": "tiny two/ranks", "steps": 1}
    path = folder / "tiny2.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_moeplan_launch_compiles_emits_runs_and_verifies(tmp_path: Path):
    config = two_rank_config(tmp_path)
    runs = tmp_path / "runs"
    launched = subprocess.run(
        [sys.executable, "-m", "planner.cli", "launch", str(config), "--runs-dir", str(runs)],
        env=clean_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=RUN_TIMEOUT,
        cwd=tmp_path)
    output = launched.stdout + launched.stderr
    assert launched.returncode == 0, output[-4000:]
    [folder] = runs.iterdir()
    assert folder.name.startswith("tiny_two_ranks-")  # job name made safe for a folder name
    assert sorted(p.name for p in folder.iterdir()) == ["plan.json", "report.json", "torchrun.sh"]
    assert f"run folder {folder}: 2 rank(s) on this machine" in output
    assert f"moeplan verify {folder / 'plan.json'} {folder / 'report.json'}" in output
    assert "reference check: ok" in output
    assert f"{folder / 'report.json'}: verified" in output


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

"""The emitted Slurm batch script on a real single-host Slurm (slurmctld, two slurmd "nodes" and
munge, started by the fixture): 4-rank runs of the bundled runtime through `sbatch --wait` on one
node and over two nodes (two torchrun agents joined by the c10d rendezvous), a failing job's exit
code, and a hostile job name as Slurm itself records it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app
from tests.support.paths import EXAMPLES
from tests.support.slurm_cluster import LocalSlurm, SlurmUnavailable, free_port, local_slurm

runner = CliRunner()
JOB_TIMEOUT = 150


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    try:
        with local_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
            yield cluster
    except SlurmUnavailable as exc:
        pytest.skip(f"no local Slurm: {exc}")


def four_rank_config(folder: Path, nodes: int = 1, **launch: Any) -> Path:
    """tiny-cpu-8 shrunk to 4 ranks (TP1 CP2 DP2 | ETP1 EP2 EDP2) on `nodes` nodes, one CPU per rank."""
    per_node = 4 // nodes
    data = yaml.safe_load((EXAMPLES / "tiny-cpu-8.yaml").read_text())
    data["parallel"].update(world_size=4, cp=2, ep=2, etp=1)
    data["cluster"].update(nodes=nodes, gpus_per_node=per_node)
    data["training"]["global_batch_size"] = 2
    data["launch"] = {"job_name": "moeplan-slurm", "steps": 1, "cpus_per_task": per_node, **launch}
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def emit_slurm(folder: Path, nodes: int = 1, **launch: Any) -> Path:
    out = folder / "run"
    config = four_rank_config(folder, nodes, **launch)
    result = runner.invoke(app, ["emit", "slurm", str(config), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def submit(slurm: LocalSlurm, run_dir: Path, *options: str) -> subprocess.CompletedProcess:
    env = {"PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    try:
        return slurm.run("sbatch", *options, "job.sbatch", cwd=run_dir, env=env, check=False,
                         timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        slurm.run("scancel", "--user=root", check=False)
        raise


def test_emitted_batch_script_runs_the_plan_under_sbatch_wait(slurm: LocalSlurm, tmp_path: Path):
    """Two nodes: everything a one-node job runs (the template has no branch on the node count; the
    one-node script runs in the failing-job test below) plus the rendezvous across nodes."""
    nodes = 2
    run_dir = emit_slurm(tmp_path, nodes)
    result = submit(slurm, run_dir, "--wait", "--parsable")
    job_id = result.stdout.strip().split(";")[0]
    log = run_dir / "logs" / f"moeplan-slurm-{job_id}.out"
    errors = run_dir / "logs" / f"moeplan-slurm-{job_id}.err"
    details = "\n".join(p.read_text(errors="replace")[-3000:] for p in (log, errors) if p.exists())
    assert result.returncode == 0, result.stderr + details
    # n1 and n2 do not resolve: the rendezvous must use the head node's NodeAddr from scontrol.
    assert f"{nodes} node(s), rendezvous 127.0.0.1:" in log.read_text()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["world_size"] == 4
    assert report["plan_digest"] == json.loads((run_dir / "plan.json").read_text())["digest"]
    assert report["reference"]["checked"] and report["reference"]["ok"], details
    verify = runner.invoke(app, ["verify", str(run_dir / "plan.json"), str(run_dir / "report.json")])
    assert verify.exit_code == 0, verify.output


def test_a_failing_job_returns_its_exit_code_through_sbatch_wait(slurm: LocalSlurm, tmp_path: Path):
    run_dir = emit_slurm(tmp_path)
    plan = json.loads((run_dir / "plan.json").read_text())
    plan["digest"] = "sha256:" + "0" * 64  # not the plan the script was emitted for
    (run_dir / "plan.json").write_text(json.dumps(plan))
    result = submit(slurm, run_dir, "--wait")
    assert result.returncode != 0
    [log] = (run_dir / "logs").glob("moeplan-slurm-*.err")
    assert "re-run moeplan emit" in log.read_text()


def test_slurm_records_a_hostile_job_name_verbatim(slurm: LocalSlurm, tmp_path: Path):
    name = 'x"; rm -rf ~; echo "'
    run_dir = emit_slurm(tmp_path, job_name=name)
    result = submit(slurm, run_dir, "--parsable", "--hold")
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip().split(";")[0]
    try:
        listed = slurm.run("squeue", "--noheader", "--format=%j", f"--jobs={job_id}").stdout
        assert listed.rstrip("\n") == name
    finally:
        slurm.run("scancel", job_id, check=False)

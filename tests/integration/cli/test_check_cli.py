"""`moeplan check` as a user runs it: a real process, exit codes, JSON, the layout summary.

The per-example verdicts (every invalid example's rule, every warning example's warning) run the
same command in-process (typer's CliRunner): what they assert is the verdict, not the process
boundary, which the real-process tests here cover (exit codes 0, 1 and 2, JSON and text output).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from planner.cli import app
from tests.support.paths import EXAMPLES

MOEPLAN = [sys.executable, "-m", "planner.cli"]
INVALID = sorted((EXAMPLES / "invalid").glob("*.yaml"))
WARNINGS = sorted((EXAMPLES / "warnings").glob("*.yaml"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(MOEPLAN + list(args), capture_output=True, text=True, timeout=60)


def run_here(*args: str) -> tuple[int, str]:
    """The command in this process: its exit code and stdout; any exception but the CLI's own
    exit fails the test (a real process would have printed a traceback)."""
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout


def test_v4_pro_example_summary():
    result = run("check", str(EXAMPLES / "deepseek-v4-pro-1024.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.split("│")[1].strip(): line.split("│")[2].strip()
             for line in result.stdout.splitlines() if line.count("│") == 3}
    assert lines["DP (attention data parallel)"] == "64"
    assert lines["EDP (expert data parallel)"] == "2"
    assert lines["ranks per stage"] == "128"
    assert lines["experts per rank (per MoE layer)"] == "6"
    assert lines["microbatches per step"] == "64"


def test_v4_pro_example_json_layout():
    result = run("check", "--json", str(EXAMPLES / "deepseek-v4-pro-1024.yaml"))
    payload = json.loads(result.stdout)
    assert payload["ok"] is True and result.returncode == 0
    layout = payload["layout"]
    assert (layout["dp"], layout["edp"], layout["ranks_per_stage"], layout["experts_per_rank"],
            layout["microbatches"]) == (64, 2, 128, 6, 64)
    assert (layout["world_size"], layout["tp"], layout["cp"], layout["pp"], layout["ep"],
            layout["etp"]) == (1024, 1, 2, 8, 64, 1)


@pytest.mark.parametrize("name", ["deepseek-v4-flash-128", "tiny-cpu-8"])
def test_other_examples_are_valid(name):
    result = run("check", "--json", str(EXAMPLES / f"{name}.yaml"))
    assert result.returncode == 0, result.stdout
    assert json.loads(result.stdout)["ok"] is True


def test_there_are_invalid_examples():
    assert len(INVALID) >= 10


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_each_invalid_example_fails_with_its_rule(path):
    code = path.stem.split("-")[0].upper()
    exit_code, stdout = run_here("check", "--json", str(path))
    assert exit_code == 1
    payload = json.loads(stdout)
    errors = [f["code"] for f in payload["findings"] if f["severity"] == "error"]
    assert errors[0] == code
    finding = payload["findings"][0]
    assert set(finding) == {"code", "severity", "path", "message", "fix", "source"}
    exit_code, text = run_here("check", str(path))
    assert exit_code == 1 and f"{code} error" in text


@pytest.mark.parametrize("path", WARNINGS, ids=[p.stem for p in WARNINGS])
def test_each_warning_example_passes_with_only_its_warning(path):
    # Configs Megatron dev accepts but a rule warns about (the write-up or Megatron main disagree).
    code = path.stem.split("-")[0].upper()
    exit_code, stdout = run_here("check", "--json", str(path))
    assert exit_code == 0, stdout
    payload = json.loads(stdout)
    assert payload["ok"] is True
    # information (MOE033: capacity drops follow the slicing) is neither a warning nor an error
    assert {(f["code"], f["severity"]) for f in payload["findings"]
            if f["severity"] != "info"} == {(code, "warning")}


def test_there_are_warning_examples():
    assert {p.stem.split("-")[0] for p in WARNINGS} >= {"v4007", "moe003"}


def test_usage_errors_exit_2(tmp_path):
    assert run("check", str(tmp_path / "missing.yaml")).returncode == 2
    assert run("check", str(tmp_path)).returncode == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {preset: deepseek-v4-pro\n")
    result = run("check", str(bad))
    assert result.returncode == 2 and "line" in result.stderr and "Traceback" not in result.stderr
    assert run("check").returncode == 2


def test_config_errors_are_listed_all_at_once(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {preset: deepseek-v4-pro}\nparallel: {world_size: 1024, tp: 0, epp: 4}\n"
                    "training: {seq_length: x}\n")
    result = run("check", "--json", str(path))
    assert result.returncode == 1
    paths = {f["path"] for f in json.loads(result.stdout)["findings"]}
    assert paths == {"parallel.tp", "parallel.epp", "training.seq_length"}


def test_ignore_silences_a_rule(tmp_path):
    source = (EXAMPLES / "invalid" / "moe001-pad-without-capacity.yaml").read_text()
    path = tmp_path / "c.yaml"
    path.write_text(source + "ignore: [MOE001]\n")
    assert run("check", str(path)).returncode == 0


def test_planner_does_not_import_torch():
    probe = ("import sys, planner.cli, planner.layout.grid, planner.plan, planner.accounting\n"
             "assert 'torch' not in sys.modules, 'planner imported torch'\n")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def test_check_does_not_load_the_launch_templates():
    """`moeplan check` starts fast: the rules never pull in the emitters' jinja2 rendering."""
    probe = ("import sys\nfrom planner.cli_common import collect_findings\n"
             "from planner.config.loader import load_config\n"
             f"collect_findings(load_config({str(EXAMPLES / 'deepseek-v4-pro-1024.yaml')!r}))\n"
             "assert 'jinja2' not in sys.modules, 'check imported jinja2'\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

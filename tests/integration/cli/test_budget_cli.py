"""`moeplan budget` as a user runs it: a real process, JSON, --explain, --rank/--stage, exit codes."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from planner.cli_common import collect_findings
from planner.config.loader import load_config
from planner.findings import has_errors
from tests.support.paths import EXAMPLES, ROOT

MOEPLAN = [sys.executable, "-m", "planner.cli", "budget"]
V4_PRO = str(EXAMPLES / "deepseek-v4-pro-1024.yaml")
TINY = str(EXAMPLES / "tiny-cpu-8.yaml")


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400"}  # wide tables: long formulas stay on one line
    result = subprocess.run(MOEPLAN + list(args), capture_output=True, text=True, timeout=120,
                            cwd=ROOT, env=env)
    assert "Traceback" not in result.stdout + result.stderr
    return result


def expected_exit(path: str) -> int:
    return 1 if has_errors(collect_findings(load_config(path))) else 0


def write(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_json_gives_the_worked_example_exactly():
    result = run(V4_PRO, "--json")
    assert result.returncode == expected_exit(V4_PRO), result.stderr
    rows = json.loads(result.stdout)
    assert all(set(r) == {"name", "value", "unit", "formula", "scope", "stage"} for r in rows)
    shared = {r["name"]: r["value"] for r in rows if r["stage"] is None}
    stage1 = {r["name"]: r["value"] for r in rows if r["stage"] == 1}
    assert {k: shared[k] for k in ("dense_dp", "expert_dp", "ranks_per_stage", "experts_per_rank",
                                   "tokens_per_rank", "microbatches")} == {
        "dense_dp": 64, "expert_dp": 2, "ranks_per_stage": 128, "experts_per_rank": 6,
        "tokens_per_rank": 4096, "microbatches": 64}
    assert (shared["ep_group_tokens"], shared["ep_group_assignments"]) == (262144, 1572864)
    assert (shared["expected_rows_per_expert"], shared["dispatch_send_rows"],
            shared["expected_recv_rows"]) == (4096, 24576, 24576)
    assert (shared["dispatch_send_bytes"], shared["dispatch_remote_bytes"]) == (352321536, 346816512)
    assert (shared["ep_fwd_remote_bytes"], shared["ep_fwd_bwd_remote_bytes"]) == (
        693633024, 1387266048)
    assert shared["routed_weight_bytes_per_layer"] == 792723456
    assert stage1["routed_weight_bytes_per_stage"] == 6341787648
    assert (shared["grad_scale_sum_dense"], shared["grad_scale_sum_expert"],
            shared["grad_scale_avg_expert"]) == ("1/128", "1/128", "1/64")
    assert shared["allgather_dispatch_rows"] == 262144
    scopes = {r["scope"] for r in rows if r["name"] == "step.ep_dispatch_hidden.fwd.send_bytes"}
    assert scopes == {f"stage {s} (rank {128 * s})" for s in range(8)}


def test_explain_shows_formula_then_substitution():
    result = run(V4_PRO, "--stage", "0", "--explain")
    assert result.returncode == expected_exit(V4_PRO)
    assert "ceiling(dispatch_send_bytes · (EP - 1) / EP)" in result.stdout
    assert "= ceiling(352321536 · (64 - 1) / 64)" in result.stdout
    assert "346816512 B (330.75 MiB)" in result.stdout
    rows = json.loads(run(V4_PRO, "--stage", "0", "--explain", "--json").stdout)
    [row] = [r for r in rows if r["name"] == "dispatch_remote_bytes"]
    assert row["substitution"] == "ceiling(352321536 · (64 - 1) / 64)"
    assert row["formula"] == "ceiling(dispatch_send_bytes * (EP - 1) / EP)"


def test_rank_option_picks_the_rank_and_its_stage():
    rows = json.loads(run(V4_PRO, "--rank", "130", "--json").stdout)
    staged = [r for r in rows if r["stage"] is not None]
    assert staged and {r["scope"] for r in staged} == {"stage 1 (rank 130)"}
    by_name = {r["name"]: r["value"] for r in staged}
    assert by_name["rank_node"] == 16 and by_name["ep_offnode_share"] == "7/8"


def test_all_output_has_a_table_per_category():
    result = run(TINY, "--all")
    assert result.returncode == expected_exit(TINY)
    for title in ("layout", "token rows per rank", "bytes per rank", "collectives per optimizer step",
                  "topology split", "memory per rank", "gradient scaling"):
        assert title in result.stdout
    assert "stage 0 (rank 0)" in result.stdout


def test_usage_errors_exit_2():
    assert run(V4_PRO, "--rank", "1024").returncode == 2
    assert run(V4_PRO, "--stage", "8").returncode == 2
    assert run(V4_PRO, "--rank", "1", "--stage", "0").returncode == 2
    assert run(str(EXAMPLES / "no-such-file.yaml")).returncode == 2


def test_layouts_without_a_grid_exit_1_with_a_reason(tmp_path):
    data = load_config(V4_PRO).model_dump(mode="json", exclude_none=True)
    broken = copy.deepcopy(data)
    broken["parallel"]["world_size"] = 1000
    broken["cluster"]["nodes"] = 125
    result = run(write(tmp_path, broken), "--json")
    assert result.returncode == 1 and result.stdout == ""
    assert "no budgets" in result.stderr

"""bench/megatron_ci.py and its data: Megatron-LM's own MoE functional-test arguments, vendored with
their source, read through `moeplan import megatron`'s reader and estimated. No accuracy bound is
asserted (the figures judge the model, they never gate it); that every case is sourced and reaches
an estimate is."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import megatron_ci  # noqa: E402

MEASURED = yaml.safe_load((megatron_ci.DATA / "measured.yaml").read_text(encoding="utf-8"))["cases"]


def test_every_case_is_vendored_with_its_source_and_a_measured_step() -> None:
    assert len(MEASURED) >= 30
    for name, row in MEASURED.items():
        head = (megatron_ci.DATA / f"{name}.yaml").read_text(encoding="utf-8").splitlines()[0]
        assert head.startswith("# NVIDIA/Megatron-LM@") and f"moe/{name}/model_config.yaml" in head
        assert row["step_time_s"] > 0 and row["values"] >= 5


def test_a_scoped_graph_case_reads_its_modules_and_is_estimated() -> None:
    case = megatron_ci.judge("gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph",
                             MEASURED["gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph"]["step_time_s"])
    assert case.predicted_s is not None and case.ratio is not None and case.ratio > 0
    assert "cuda-graph-modules" not in case.why  # read into overlap.cuda_graph_scope, not unpriced


def test_the_parts_make_the_step() -> None:
    """--parts splits the slowest stage's step into host, GPU, exposed communication (offload
    copies included), bubble and optimizer: together they are the step."""
    name = "gpt3_mcore_tp2_pp2_ep2_te_4experts2parallel"
    case = megatron_ci.judge(name, MEASURED[name]["step_time_s"])
    assert [label for label, _ in case.parts] == ["host", "gpu", "comm", "bubble", "optimizer"]
    assert abs(sum(value for _, value in case.parts) - case.predicted_s) < 1e-9 * case.predicted_s

"""Megatron-LM itself judges what moeplan emits: every valid example and a small config per preset run
through Megatron-LM dev@d48bd6be's `parse_args` → `validate_args` → `set_global_variables` →
`core_transformer_config_from_args` → `hybrid_config_from_args` / `gpt_config_from_args` (the
`--check-with` pre-flight) and must pass unchanged, with the plan's data-parallel size, microbatches,
virtual stages and per-stage decoder / MoE / MTP layers.

All judged configs share one probe subprocess (Megatron's import is most of its cost: about 10 s,
then about 1 s per config); the CLI tests add one subprocess each.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from planner.cli_common import collect_findings
from planner.emit.megatron_check import (
    CheckRequest,
    CheckResult,
    CheckRun,
    CheckUnusable,
    expected_values,
    judge,
    mismatches,
    request_for,
    run_probe,
)
from planner.findings import has_errors
from planner.loader import load_config, parse_config
from planner.plan import compile_plan
from planner.presets import PRESETS
from planner.schema import Config
from tests.conftest import EXAMPLES, ROOT
from tests.oracle import megatron_lm_dir


def require_oracle() -> Path:
    """The Megatron-LM checkout, or skip with the reason (it is absent outside this repository's CI)."""
    folder, why_missing = megatron_lm_dir()
    if folder is None:
        pytest.skip(why_missing)
    return folder

V4_TRAINING = {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 64,
               "use_distributed_optimizer": True}
V4_MOE = {"moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": 1.0e-4,
          "moe_tid2eid_source": "checkpoint"}
FULL_RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}

# One small config per preset, on layouts the examples do not cover (memory is not judged here).
PRESET_CONFIGS: dict[str, dict[str, Any]] = {
    # PP4 with an explicit uneven layout: 15/15/16/15 blocks, the MTP block on the last stage
    "deepseek-v4-pro": {
        "model": {"preset": "deepseek-v4-pro"},
        "parallel": {"world_size": 64, "tp": 1, "cp": 1, "pp": 4, "ep": 16, "etp": 1,
                     "pipeline_model_parallel_layout": "Et*15|t*15|t*16|t*15mL"},
        "training": V4_TRAINING, "moe": V4_MOE, "overlap": FULL_RECOMPUTE, "ignore": ["MEM001"],
    },
    # CP2 (contiguous, packed THD) and PP2 x VPP2 from a four-segment layout
    "deepseek-v4-flash": {
        "model": {"preset": "deepseek-v4-flash"},
        "parallel": {"world_size": 32, "tp": 1, "cp": 2, "pp": 2, "ep": 8, "etp": 1,
                     "cp_partition_mode": "contiguous",
                     "pipeline_model_parallel_layout": "Et*11|t*11|t*11|t*10mL"},
        "training": {**V4_TRAINING, "qkv_format": "thd", "sequence_packing_scheduler": "dp_balanced"},
        "moe": V4_MOE, "overlap": FULL_RECOMPUTE, "ignore": ["MEM001"],
    },
}
assert set(PRESET_CONFIGS) == set(PRESETS), "every preset needs a config judged by Megatron"

# The GPT entry with TP2 + SP, PP2 x VPP2 and dense layers among the MoE ones.
GPT_PP_VPP: dict[str, Any] = {
    "model": {"num_layers": 8, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2,
              "vocab_size": 256, "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 32,
              "moe_layer_freq": [0, 1, 1, 1, 0, 1, 1, 1]},
    "parallel": {"world_size": 16, "tp": 2, "pp": 2, "vpp": 2, "ep": 4, "etp": 1,
                 "sequence_parallel": True},
    "training": {"seq_length": 64, "micro_batch_size": 1, "global_batch_size": 16,
                 "use_distributed_optimizer": True},
}


def tiny() -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / "tiny-cpu-8.yaml").read_text())


def tiny_with(**model: Any) -> dict[str, Any]:
    data = tiny()
    data["model"].update(model)
    return data


def ep_overlap_full_recompute(dropout: float) -> dict[str, Any]:
    """EP A2A overlap with full recompute: Megatron replays it only without dropout."""
    data = tiny_with(moe_n_hash_layers=0, hidden_dropout=dropout, attention_dropout=dropout)
    data["overlap"] = {"overlap_moe_expert_parallel_comm": True, **FULL_RECOMPUTE}
    data["training"]["precision"] = "bf16"  # the overlap needs bf16 (rule OVL007)
    return data


def example_configs() -> dict[str, Config]:
    return {path.name: load_config(path) for path in sorted(EXAMPLES.glob("*.yaml"))}


def judged_configs() -> dict[str, Config]:
    configs = example_configs()
    configs.update({f"preset {name}": parse_config(copy.deepcopy(data))
                    for name, data in PRESET_CONFIGS.items()})
    configs["gpt pp2 vpp2"] = parse_config(copy.deepcopy(GPT_PP_VPP))
    layout = tiny_with(num_layers=4, mtp_num_layers=1)  # a GPT layout string with the MTP block
    layout["parallel"].update(pp=2, cp=1, pipeline_model_parallel_layout="Et*2|t*2mL")
    configs["gpt pp2 layout + mtp"] = parse_config(layout)
    configs["ep overlap, full recompute, dropout 0"] = parse_config(ep_overlap_full_recompute(0.0))
    return configs


# Configs moeplan accepts and Megatron refuses, with the Megatron source line that refuses them.
REJECTED: dict[str, tuple[dict[str, Any], str, str]] = {
    "MTP with a learned position table": (
        tiny_with(mtp_num_layers=1, position_embedding_type="learned_absolute"),
        "megatron/training/arguments.py:919 validate_args",
        "Multi-Token Prediction (MTP) is not supported with learned_absolute"),
    "EP overlap, full recompute, dropout 0.1": (
        ep_overlap_full_recompute(0.1),
        "megatron/core/transformer/transformer_config.py:3422 __post_init__",
        "requires attention_dropout==0 and hidden_dropout==0"),
    # GTP flags exist on Megatron-LM main only: dev's parser does not know them.
    "GTP on the dev branch": (
        {**tiny_with(moe_n_hash_layers=0),
         "parallel": {"world_size": 8, "tp": 1, "cp": 1, "ep": 2, "etp": 1, "gtp": 2}},
        "megatron/training/arguments.py:150 parse_args",
        "unrecognized arguments: --tensor-parallel-num-weight-shards 2"),
}


def without(request: CheckRequest, flag: str) -> CheckRequest:
    """The request less one emitted flag and its value (what moeplan used to emit)."""
    at = request.argv.index(flag)
    return CheckRequest(request.name, request.entry, request.argv[:at] + request.argv[at + 2:],
                        request.env, request.world_size)


# What moeplan emitted before it followed Megatron here: the tiny example without each fix.
OLD_TINY: dict[str, tuple[Any, str, str]] = {
    "tiny without CUDA_DEVICE_MAX_CONNECTIONS": (
        lambda r: CheckRequest(r.name, r.entry, r.argv, {}, r.world_size),
        "megatron/training/arguments.py:1643 validate_args",
        "require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"),
    "tiny without --max-position-embeddings": (
        lambda r: without(r, "--max-position-embeddings"),
        "megatron/training/arguments.py:2207 _check_arg_is_not_none",
        "max_position_embeddings argument is None"),
}


def plan_of(cfg: Config) -> dict[str, Any]:
    findings = collect_findings(cfg)
    assert not has_errors(findings), [f.as_dict() for f in findings if f.severity == "error"]
    return compile_plan(cfg, findings)


@pytest.fixture(scope="module")
def oracle_run() -> CheckRun:
    """Megatron's verdict on every judged config, one probe subprocess for all of them."""
    megatron = require_oracle()
    configs = judged_configs()
    rejected = {name: parse_config(data) for name, (data, _, _) in REJECTED.items()}
    requests, expected = [], []
    for name, cfg in {**configs, **rejected}.items():
        requests.append(request_for(cfg, name))
        expected.append(expected_values(cfg, plan_of(cfg)))
    tiny_plan = expected_values(configs["tiny-cpu-8.yaml"], plan_of(configs["tiny-cpu-8.yaml"]))
    for name, (change, _, _) in OLD_TINY.items():
        requests.append(change(request_for(configs["tiny-cpu-8.yaml"], name)))
        expected.append(tiny_plan)
    # The same tiny plan once more, with moeplan's data-parallel size off by one: the comparison must
    # catch it and name both values.
    tiny_cfg = configs["tiny-cpu-8.yaml"]
    off = expected_values(tiny_cfg, plan_of(tiny_cfg))
    requests.append(request_for(tiny_cfg, "tiny, wrong DP"))
    expected.append({**off, "data_parallel_size": off["data_parallel_size"] + 1})
    return judge(requests, expected, megatron, sys.executable)


@pytest.fixture(scope="module")
def verdicts(oracle_run: CheckRun) -> dict[str, CheckResult]:
    return {result.name: result for result in oracle_run.results}


@pytest.mark.parametrize("name", sorted(judged_configs()))
def test_megatron_builds_the_plan(name: str, verdicts: dict[str, CheckResult]):
    result = verdicts[name]
    assert result.verdict == "pass", (result.message, result.location, result.mismatches)
    assert result.derived["data_parallel_size"] == result.expected["data_parallel_size"]
    assert result.derived["num_microbatches"] == result.expected["num_microbatches"]


def test_every_valid_example_is_judged():
    valid = {path.name for path in EXAMPLES.glob("*.yaml")}
    assert valid == {"tiny-cpu-8.yaml", "deepseek-v4-flash-128.yaml", "deepseek-v4-pro-1024.yaml"}
    assert valid <= set(judged_configs())


def test_the_v4_examples_hand_derived_values(verdicts: dict[str, CheckResult]):
    """V4-Pro on 1,024 GPUs: DP = 1024 / (TP1 · CP2 · PP8) = 64, 4096 / (1 · 64) = 64 microbatches;
    V4-Flash on 128: DP 128, 1024 / 128 = 8; per-stage blocks 6, 8 x 6, 7 + MTP; 43 + MTP."""
    pro, flash = verdicts["deepseek-v4-pro-1024.yaml"].derived, verdicts["deepseek-v4-flash-128.yaml"].derived
    assert (pro["data_parallel_size"], pro["num_microbatches"]) == (64, 64)
    assert [(c["layers"], c["moe_layers"], c["mtp_layers"]) for c in pro["chunks"]] == (
        [(6, 6, 0)] + [(8, 8, 0)] * 6 + [(7, 7, 1)])
    assert (flash["data_parallel_size"], flash["num_microbatches"]) == (128, 8)
    assert [(c["layers"], c["moe_layers"], c["mtp_layers"]) for c in flash["chunks"]] == [(43, 43, 1)]


def test_gpt_layout_puts_mtp_where_the_layout_says(verdicts: dict[str, CheckResult]):
    chunks = verdicts["gpt pp2 layout + mtp"].derived["chunks"]
    assert [(c["stage"], c["layers"], c["mtp_layers"]) for c in chunks] == [(0, 2, 0), (1, 2, 1)]


def test_gpt_vpp_chunks_follow_megatron(verdicts: dict[str, CheckResult]):
    """PP2 x VPP2 over 8 layers: chunk (stage p, virtual v) holds layers 4v + 2p, 4v + 2p + 1
    (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_layer.py
    get_transformer_layer_offset); layers 0 and 4 are dense."""
    chunks = verdicts["gpt pp2 vpp2"].derived["chunks"]
    assert [(c["stage"], c["virtual"], c["layers"], c["moe_layers"]) for c in chunks] == [
        (0, 0, 2, 1), (0, 1, 2, 1), (1, 0, 2, 2), (1, 1, 2, 2)]


@pytest.mark.parametrize("name", sorted(REJECTED) + sorted(OLD_TINY))
def test_megatron_refusals_come_back_with_file_and_line(name: str, verdicts: dict[str, CheckResult]):
    _, location, message = REJECTED[name] if name in REJECTED else OLD_TINY[name]
    result = verdicts[name]
    assert result.verdict == "rejected"
    assert result.location == location
    assert message in result.message


def test_a_different_derived_value_is_a_failure_naming_both(verdicts: dict[str, CheckResult]):
    result = verdicts["tiny, wrong DP"]
    assert result.verdict == "mismatch"
    assert result.mismatches == ["data-parallel size: Megatron 4, moeplan 5"]


def test_stand_ins_are_listed_and_only_those(oracle_run: CheckRun):
    named = [s.split(":")[0] for s in oracle_run.stand_ins]
    assert set(named) <= {"typing.override", "CUDA device capability", "Transformer Engine version gate",
                          "Transformer Engine fused RoPE kernel", "cuDNN DSA kernel presence check"}
    assert "CUDA device capability" in named  # this CI has no GPU


# --- the command line -------------------------------------------------------------------------

def moeplan(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def test_emit_check_with_refuses_and_writes_nothing(tmp_path: Path):
    megatron = require_oracle()
    config = tmp_path / "mtp-learned.yaml"
    config.write_text(yaml.safe_dump(REJECTED["MTP with a learned position table"][0]))
    out = tmp_path / "run"
    done = moeplan("emit", "all", str(config), "-o", str(out), "--check-with", str(megatron), cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert "Multi-Token Prediction (MTP) is not supported with learned_absolute" in done.stdout
    assert "at megatron/training/arguments.py:919 validate_args" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert not out.exists()


def test_emit_check_with_passes_and_writes(tmp_path: Path):
    megatron = require_oracle()
    out = tmp_path / "run"
    done = moeplan("emit", "megatron", str(EXAMPLES / "tiny-cpu-8.yaml"), "-o", str(out),
                   "--check-with", str(megatron), cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Megatron-LM check: pass" in done.stdout
    assert "data-parallel size 4, 2 microbatch(es)" in done.stdout
    assert "stand-in: CUDA device capability: sm_90" in done.stdout
    assert (out / "megatron_args.sh").is_file()


# --- unusable folders and interpreters: exit 2, no oracle needed --------------------------------

def test_a_folder_without_megatron_is_a_usage_error(tmp_path: Path):
    out = tmp_path / "run"
    done = moeplan("emit", "megatron", str(EXAMPLES / "tiny-cpu-8.yaml"), "-o", str(out),
                   "--check-with", str(tmp_path), cwd=ROOT)
    assert done.returncode == 2
    assert "is not a Megatron-LM folder" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def test_a_missing_python_is_a_usage_error(tmp_path: Path):
    fake = tmp_path / "megatron-lm"
    (fake / "megatron" / "training").mkdir(parents=True)
    (fake / "megatron" / "training" / "arguments.py").write_text("")
    out = tmp_path / "run"
    done = moeplan("launch", str(EXAMPLES / "tiny-cpu-8.yaml"), "--runs-dir", str(out),
                   "--check-with", str(fake), "--check-python", str(tmp_path / "no-python"), cwd=ROOT)
    assert done.returncode == 2
    assert "no such program" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def test_a_python_without_megatron_deps_is_a_usage_error(tmp_path: Path):
    """A folder that looks like Megatron but cannot be imported: exit 2, Megatron's import error."""
    fake = tmp_path / "megatron-lm"
    (fake / "megatron" / "training").mkdir(parents=True)
    (fake / "megatron" / "training" / "arguments.py").write_text("import no_such_megatron_dependency\n")
    cfg = parse_config(tiny())
    with pytest.raises(CheckUnusable, match="cannot import Megatron-LM"):
        run_probe([request_for(cfg)], fake, sys.executable)


def test_mismatches_name_every_differing_chunk():
    ours = {"data_parallel_size": 4, "num_microbatches": 2, "virtual_pipeline_model_parallel_size": 1,
            "expert_data_parallel_size": 2,
            "chunks": [{"stage": 0, "virtual": 0, "layers": 2, "moe_layers": 2, "mtp_layers": 0,
                        "mtp_moe_layers": 0}]}
    theirs = {"data_parallel_size": 4, "num_microbatches": 4, "virtual_pipeline_model_parallel_size": 1,
              "chunks": [{"stage": 0, "virtual": 0, "layers": 2, "moe_layers": 1, "mtp_layers": 0},
                         {"stage": 1, "virtual": 0, "layers": 1, "moe_layers": 1, "mtp_layers": 0}]}
    assert mismatches(ours, theirs) == [
        "number of microbatches: Megatron 4, moeplan 2",
        "pipeline stage 0 MoE layers: Megatron 1, moeplan 2",
        "pipeline stage 1: built by Megatron only",
    ]


def test_the_request_adds_only_data_and_tokenizer_arguments():
    cfg = parse_config(tiny())
    request: CheckRequest = request_for(cfg)
    assert request.argv[-3:] == ["--mock-data", "--tokenizer-type", "NullTokenizer"]
    assert request.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # CP2 on Hopper


def test_the_check_never_imports_torch_into_moeplan():
    probe = ("import sys, planner.emit.megatron_check, planner.commands.emit, planner.commands.launch\n"
             "assert 'torch' not in sys.modules, 'the pre-flight imported torch'\n")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, cwd=ROOT).returncode == 0

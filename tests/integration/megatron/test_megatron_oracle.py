"""Megatron-LM itself judges what moeplan emits: every valid example and a small config per preset run
through Megatron-LM dev@d48bd6be's `parse_args` → `validate_args` → `set_global_variables` →
`core_transformer_config_from_args` → `hybrid_config_from_args` / `gpt_config_from_args` (the
`--check-with` pre-flight) and must pass unchanged, with the plan's data-parallel size, microbatches,
virtual stages, per-stage decoder / MoE / MTP layers, hash-routed MoE blocks and rotary settings.

All fixed configs of the oracle tests share one probe subprocess (tests/support/megatron_judge.py); the CLI
tests add one subprocess each.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from planner.cli_common import collect_findings
from planner.config.loader import load_config, parse_config
from planner.config.presets import PRESETS
from planner.config.schema import Config
from planner.emit.megatron_check import (
    CheckRequest,
    CheckUnusable,
    expected_values,
    mismatches,
    request_for,
    run_probe,
)
from planner.emit.safety import EmitError
from tests.support.megatron_judge import (
    case_of,
    plan_of,
    register,
    require_oracle,
    shared_stand_ins,
    verdict,
)
from tests.support.megatron_snippet import snippet_json
from tests.support.paths import EXAMPLES, ROOT

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
    # The GPT-form presets (pretrain_gpt.py). MLA with TP2, PP4 from a layout, the MTP block last
    "deepseek-v3": {
        "model": {"preset": "deepseek-v3"},
        "parallel": {"world_size": 128, "tp": 2, "cp": 1, "pp": 4, "ep": 16, "etp": 1,
                     "sequence_parallel": True,
                     "pipeline_model_parallel_layout": "Et*15|t*15|t*16|t*15mL"},
        "training": V4_TRAINING, "ignore": ["MEM001"],
    },
    # GQA + qk_layernorm, TP2 with SP and PP2
    "qwen3-30b-a3b": {
        "model": {"preset": "qwen3-30b-a3b"},
        "parallel": {"world_size": 32, "tp": 2, "cp": 1, "pp": 2, "ep": 8, "etp": 1,
                     "sequence_parallel": True},
        "training": V4_TRAINING, "ignore": ["MEM001"],
    },
    # CP2 and TP4 = ETP4 (Megatron's default ETP), 94 layers over PP2
    "qwen3-235b-a22b": {
        "model": {"preset": "qwen3-235b-a22b"},
        "parallel": {"world_size": 128, "tp": 4, "cp": 2, "pp": 2, "ep": 8,
                     "sequence_parallel": True},
        "training": V4_TRAINING, "ignore": ["MEM001"],
    },
    # PP2 x VPP2, 8 experts over EP4
    "mixtral-8x7b": {
        "model": {"preset": "mixtral-8x7b"},
        "parallel": {"world_size": 16, "tp": 1, "cp": 1, "pp": 2, "vpp": 2, "ep": 4, "etp": 1},
        "training": V4_TRAINING, "ignore": ["MEM001"],
    },
    # The current architectures: gpt-oss (sinks, window, quick-GEGLU, biases) with TP2 + SP,
    # GLM-4.5 (q/k/v bias, partial rotary, MTP) over PP4, Llama 4 (NoPE, L2 q/k norm, top-1 on
    # the input, MoE every other layer) with TP2 + SP and PP2
    "gpt-oss-20b": {
        "model": {"preset": "gpt-oss-20b"},
        "parallel": {"world_size": 16, "tp": 2, "cp": 1, "pp": 1, "ep": 8, "etp": 1,
                     "sequence_parallel": True},
        "training": V4_TRAINING, "ignore": ["MEM001"],
    },
    "gpt-oss-120b": {
        "model": {"preset": "gpt-oss-120b"},
        "parallel": {"world_size": 64, "tp": 1, "cp": 1, "pp": 4, "ep": 16, "etp": 1},
        "training": V4_TRAINING, "ignore": ["MEM001"],
    },
    "glm-4.5": {
        "model": {"preset": "glm-4.5"},
        "parallel": {"world_size": 256, "tp": 2, "cp": 1, "pp": 4, "ep": 32, "etp": 1,
                     "sequence_parallel": True},
        "training": V4_TRAINING, "ignore": ["MEM001"],
    },
    "glm-4.5-air": {
        "model": {"preset": "glm-4.5-air"},
        "parallel": {"world_size": 64, "tp": 1, "cp": 1, "pp": 2, "ep": 16, "etp": 1},
        "training": V4_TRAINING, "ignore": ["MEM001"],
    },
    "llama-4-scout": {
        "model": {"preset": "llama-4-scout"},
        "parallel": {"world_size": 64, "tp": 2, "cp": 1, "pp": 2, "ep": 16, "etp": 1,
                     "sequence_parallel": True},
        "training": V4_TRAINING, "moe": {"moe_apply_probs_on_input": True}, "ignore": ["MEM001"],
    },
    "llama-4-maverick": {
        "model": {"preset": "llama-4-maverick"},
        "parallel": {"world_size": 256, "tp": 2, "cp": 1, "pp": 4, "ep": 64, "etp": 1,
                     "sequence_parallel": True},
        "training": V4_TRAINING, "moe": {"moe_apply_probs_on_input": True}, "ignore": ["MEM001"],
    },
    "qwen3-next-80b-a3b": {
        "model": {"preset": "qwen3-next-80b-a3b"},
        "parallel": {"world_size": 32, "tp": 2, "cp": 1, "pp": 2, "ep": 8, "etp": 1,
                     "sequence_parallel": True},
        "training": V4_TRAINING, "ignore": ["MEM001"],
    },
    # DSA over the V3 layout (TP2, PP4 from a layout, the MTP block last)
    "deepseek-v3.2": {
        "model": {"preset": "deepseek-v3.2"},
        "parallel": {"world_size": 128, "tp": 2, "cp": 1, "pp": 4, "ep": 16, "etp": 1,
                     "sequence_parallel": True,
                     "pipeline_model_parallel_layout": "Et*15|t*15|t*16|t*15mL"},
        "training": V4_TRAINING, "ignore": ["MEM001"],
    },
}
# MiniMax-M2's per-layer q/k norm is nothing Megatron dev can train: `emit megatron` refuses it
# (EMT010, tests/unit/emit/test_emit_current_architectures.py).
MEGATRON_CANNOT_TRAIN = {"minimax-m2"}
assert set(PRESET_CONFIGS) | MEGATRON_CANNOT_TRAIN == set(PRESETS), \
    "every preset needs a config judged by Megatron"

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


# The V4-Flash preset cut to 4 layers + MTP: its 44 compress ratios are more than the model has.
SHORT_FLASH = "preset deepseek-v4-flash, 4 layers"
SHORT_FLASH_DATA: dict[str, Any] = {
    "model": {"preset": "deepseek-v4-flash", "num_layers": 4, "mtp_num_layers": 1},
    "parallel": {"world_size": 1}, "training": {"seq_length": 128}, "ignore": ["MEM001"]}


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


def valid_example_paths() -> list[Path]:
    """Every bundled config moeplan accepts: the examples and the warned ones (where the
    DeepSeek-V4 write-up and Megatron dev disagree, Megatron must accept them)."""
    return sorted(EXAMPLES.glob("*.yaml")) + sorted((EXAMPLES / "warnings").glob("*.yaml"))


def example_configs() -> dict[str, Config]:
    return {str(path.relative_to(EXAMPLES)): load_config(path) for path in valid_example_paths()}


def judged_configs() -> dict[str, Config]:
    configs = example_configs()
    configs.update({f"preset {name}": parse_config(copy.deepcopy(data))
                    for name, data in PRESET_CONFIGS.items()})
    configs["gpt pp2 vpp2"] = parse_config(copy.deepcopy(GPT_PP_VPP))
    layout = tiny_with(num_layers=4, mtp_num_layers=1)  # a GPT layout string with the MTP block
    layout["parallel"].update(pp=2, cp=1, pipeline_model_parallel_layout="Et*2|t*2mL")
    configs["gpt pp2 layout + mtp"] = parse_config(layout)
    configs["ep overlap, full recompute, dropout 0"] = parse_config(ep_overlap_full_recompute(0.0))
    configs[SHORT_FLASH] = parse_config(copy.deepcopy(SHORT_FLASH_DATA))
    # the Mamba stack on the hybrid entry: Nemotron-3-Nano's 52-layer pattern (TP2 + SP, EP8)
    configs[NANO] = load_config(EXAMPLES / NANO)
    # ... and with a hybrid MTP depth (`/*E`) on the last of two pipeline segments
    nano = load_config(EXAMPLES / NANO).model_dump(mode="json", exclude_unset=True)
    nano["model"]["hybrid_layer_pattern"] += "/*E"
    nano["model"]["mtp_num_layers"] = 1
    nano["parallel"].update(pp=2, pipeline_model_parallel_layout="Et*15|t*14mL")
    configs[NANO_MTP] = parse_config(nano)
    # imported families: GLM-5.2 (MLA + DSA with its top-k shared every 4 layers, MTP, a layout
    # string over PP8 whose stages start on computing layers), Qwen3.5 (gated DeltaNet + gated
    # attention) and Nemotron-3-Super's latent MoE (--moe-latent-size) on the hybrid entry; about
    # one CPU-second each, so the other imported examples (GLM-5.1, its DSA on every layer;
    # GLM-4.7-Flash, Qwen3-VL-30B-A3B, Qwen3-VL-235B-A22B over PP4, Kimi-K2.5 over PP8 VPP4 with
    # its YaRN: all pass) are judged by hand (`emit megatron --check-with`), not every run
    for name in (GLM_5_2, QWEN_3_5, SUPER):
        configs[name] = load_config(EXAMPLES / name)
    return configs


NANO = "architectures/nemotron-3-nano-30b-a3b-64.yaml"
NANO_MTP = "nemotron-3-nano, hybrid MTP over PP2"
GLM_5_2 = "architectures/glm-5.2-512.yaml"
QWEN_3_5 = "architectures/qwen3.5-35b-a3b-16.yaml"
SUPER = "architectures/nemotron-3-super-120b-a12b-256.yaml"


def glm_5_2_over(layout: str) -> dict[str, Any]:
    """The GLM-5.2 example over another pipeline layout."""
    data = load_config(EXAMPLES / GLM_5_2).model_dump(mode="json", exclude_unset=True)
    data["parallel"]["pipeline_model_parallel_layout"] = layout
    return data


# Configs Megatron refuses, with the Megatron source line that refuses them and the moeplan rule that
# now refuses them first (None: moeplan targets another Megatron-LM branch there).
REJECTED: dict[str, tuple[dict[str, Any], str, str, str | None]] = {
    # GLM-5.1's split for GLM-5.2: stages start on layers 9, 19, ..., which reuse a top-k computed
    # on the stage before (the probe runs the check Megatron runs when it builds the DSA block)
    "GLM-5.2 over GLM-5.1's pipeline split": (
        glm_5_2_over("Et*9|(t*10|)*6t*9mL"),
        "megatron/core/models/gpt/experimental_attention_variant_module_specs.py:445 "
        "_validate_dsa_index_share_pipeline_split",
        "DSA index-share pipeline split is invalid", "ARC012"),
    "MTP with a learned position table": (
        tiny_with(mtp_num_layers=1, position_embedding_type="learned_absolute"),
        "megatron/training/arguments.py:919 validate_args",
        "Multi-Token Prediction (MTP) is not supported with learned_absolute", "PIP005"),
    "PP2 x VPP2 without the p2p overlap": (
        {**GPT_PP_VPP, "overlap": {"overlap_p2p_comm": False}},
        "megatron/training/arguments.py:1050 validate_args",
        "p2p communication overlap is disabled, pipeline-model-parallel size should be greater "
        "than 2", "PIP006"),
    "EP overlap, full recompute, dropout 0.1": (
        ep_overlap_full_recompute(0.1),
        "megatron/core/transformer/transformer_config.py:3422 __post_init__",
        "requires attention_dropout==0 and hidden_dropout==0", "OVL013"),
    # GTP flags exist on Megatron-LM main only: dev's parser does not know them.
    "GTP on the dev branch": (
        {**tiny_with(moe_n_hash_layers=0),
         "parallel": {"world_size": 8, "tp": 1, "cp": 1, "ep": 2, "etp": 1, "gtp": 2}},
        "megatron/training/arguments.py:150 parse_args",
        "unrecognized arguments: --tensor-parallel-num-weight-shards 2", None),
}


def without(request: CheckRequest, *flags: str) -> CheckRequest:
    """The request less emitted flags and their values (what moeplan used to emit)."""
    argv = list(request.argv)
    for flag in flags:
        at = argv.index(flag)
        del argv[at:at + 2]
    return CheckRequest(request.name, request.entry, argv, request.env, request.world_size)


def with_value(request: CheckRequest, flag: str, value: str) -> CheckRequest:
    """The request with one emitted flag's value replaced."""
    argv = list(request.argv)
    argv[argv.index(flag) + 1] = value
    return CheckRequest(request.name, request.entry, argv, request.env, request.world_size)


# What moeplan emitted before it followed Megatron here: the tiny example without each fix.
OLD_TINY: dict[str, tuple[Callable[[CheckRequest], CheckRequest], str, str]] = {
    "tiny without CUDA_DEVICE_MAX_CONNECTIONS": (
        lambda r: CheckRequest(r.name, r.entry, r.argv, {}, r.world_size),
        "megatron/training/arguments.py:1643 validate_args",
        "require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"),
    "tiny without --max-position-embeddings": (
        lambda r: without(r, "--max-position-embeddings"),
        "megatron/training/arguments.py:2207 _check_arg_is_not_none",
        "max_position_embeddings argument is None"),
}

def full_preset_ratios(request: CheckRequest) -> CheckRequest:
    """What moeplan emitted before: the preset's whole compress-ratio list, whatever the layer count."""
    ratios = parse_config(copy.deepcopy(SHORT_FLASH_DATA)).model.compress_ratios or []
    return with_value(request, "--csa-compress-ratios", "[" + ",".join(map(str, ratios)) + "]")


# Megatron takes one ratio per attention symbol of the pattern (or one per symbol), nothing else.
OLD_RATIOS = ("short flash with the preset's 44 compress ratios",
              "megatron/training/argument_utils.py:362 _normalize_dsv4_hybrid_csa_compress_ratios",
              "csa_compress_ratios length (44) must equal either the number of W/C/H attention symbols (5)")


# The emitted arguments tampered with, against the plan: Megatron accepts them but builds something
# else, and the comparison must say what, naming both values.
FLASH = "deepseek-v4-flash-128.yaml"
TAMPERED: dict[str, tuple[str, Callable[[CheckRequest], CheckRequest], list[str]]] = {
    # The hybrid stack numbers every pattern symbol (Megatron-LM dev@d48bd6be
    # megatron/core/models/hybrid/hybrid_block.py HybridStack.__init__), and the router hashes layer
    # numbers <= moe_n_hash_layers (megatron/core/transformer/moe/router.py TopKRouter.__init__):
    # with 3 over "WEWECE…" only symbol 2, MoE block 0, is hashed, not blocks 0-2.
    "flash, hash count 3 (MoE blocks, not pattern symbols)": (
        FLASH, lambda r: with_value(r, "--moe-n-hash-layers", "3"),
        ["pipeline stage 0 hash-routed MoE blocks: Megatron [0] (its layer numbers [2]), "
         "moeplan [0, 1, 2]"]),
    # Tiny: two MoE layers, block 0 hashed; 2 hashes both (GPT numbers decoder layers 1, 2).
    "tiny, hash count 2": (
        "tiny-cpu-8.yaml", lambda r: with_value(r, "--moe-n-hash-layers", "2"),
        ["pipeline stage 0 hash-routed MoE blocks: Megatron [0, 1] (its layer numbers [1, 2]), "
         "moeplan [0]"]),
    # What moeplan emitted before the V4 RoPE settings: Megatron's defaults (megatron/training/
    # arguments.py _add_mla_args --rotary-scaling-factor 1.0; megatron/core/transformer/
    # transformer_config.py TransformerConfig.csa_compress_rotary_base 40000).
    "flash, YaRN factor and compressed base left at Megatron's defaults": (
        FLASH, lambda r: without(r, "--rotary-scaling-factor", "--csa-compress-rotary-base"),
        ["model.rotary_scaling_factor: Megatron 1.0, moeplan 16.0",
         "model.csa_compress_rotary_base: Megatron 40000.0, moeplan 160000.0"]),
}


def rejected_case(name: str, data: dict[str, Any]) -> Callable[[], tuple[CheckRequest, dict[str, Any]]]:
    return lambda: (request_for(parse_config(copy.deepcopy(data)), name), {})  # refused: no plan needed


def changed_case(name: str, example: str, change: Callable[[CheckRequest], CheckRequest],
                 plan: Callable[[dict[str, Any]], dict[str, Any]] = lambda want: want,
                 ) -> Callable[[], tuple[CheckRequest, dict[str, Any]]]:
    def case() -> tuple[CheckRequest, dict[str, Any]]:
        cfg = load_config(EXAMPLES / example)
        return change(request_for(cfg, name)), plan(expected_values(cfg, plan_of(cfg)))

    return case


# Invalid examples Megatron's argument and config stage accepts, and where Megatron refuses them
# instead (the groups one is what tests/integration/megatron/test_megatron_core_groups.py checks
# against megatron-core).
REFUSED_LATER = {
    "dop002-instances-do-not-divide-edp.yaml":
        "megatron/core/parallel_state.py initialize_model_parallel (expert optimizer instance groups)",
    "par010-pp-dp-order-with-dp-not-edp.yaml":
        "megatron/core/parallel_state.py initialize_model_parallel (RankGenerator order check)",
    "moe018-ncclep-without-rank-capacity.yaml":
        "megatron/core/transformer/moe/token_dispatcher.py _NCCLEPManager.__init__ (model build)",
}
# Invalid examples moeplan cannot turn into a Megatron command line at all.
NOT_EMITTED = {"pip001-layers-do-not-split.yaml"}
INVALID = sorted(path.name for path in (EXAMPLES / "invalid").glob("*.yaml"))


def invalid_case(name: str) -> Callable[[], tuple[CheckRequest, dict[str, Any]]]:
    return lambda: (request_for(load_config(EXAMPLES / "invalid" / name), f"invalid/{name}"), {})


for _name, _cfg in judged_configs().items():
    register(_name, case_of(_cfg, _name))
for _name in INVALID:
    if _name not in NOT_EMITTED:
        register(f"invalid/{_name}", invalid_case(_name))
for _name, (_data, *_) in REJECTED.items():
    register(_name, rejected_case(_name, _data))
for _name, (_change, *_) in OLD_TINY.items():
    register(_name, changed_case(_name, "tiny-cpu-8.yaml", _change))
for _name, (_example, _change, _) in TAMPERED.items():
    register(_name, changed_case(_name, _example, _change))
register(OLD_RATIOS[0], lambda: (full_preset_ratios(request_for(parse_config(copy.deepcopy(
    SHORT_FLASH_DATA)), OLD_RATIOS[0])), {}))
# The tiny plan with moeplan's data-parallel size off by one: the comparison must name both values.
register("tiny, wrong DP", changed_case("tiny, wrong DP", "tiny-cpu-8.yaml", lambda r: r,
                                        lambda want: {**want, "data_parallel_size": 5}))


@pytest.mark.parametrize("name", sorted(judged_configs()))
def test_megatron_builds_the_plan(name: str):
    result = verdict(name)
    assert result.verdict == "pass", (result.message, result.location, result.mismatches)
    assert result.derived["data_parallel_size"] == result.expected["data_parallel_size"]
    assert result.derived["num_microbatches"] == result.expected["num_microbatches"]


def test_every_valid_example_is_judged():
    valid = {str(path.relative_to(EXAMPLES)) for path in valid_example_paths()}
    assert valid >= {"tiny-cpu-8.yaml", "deepseek-v4-flash-128.yaml", "deepseek-v4-pro-1024.yaml",
                     "warnings/moe003-ncclep-drop-and-pad.yaml", "warnings/v4007-mhc-pp-overlap.yaml"}
    assert valid <= set(judged_configs())


def test_the_v4_examples_hand_derived_values():
    """V4-Pro on 1,024 GPUs: DP = 1024 / (TP1 · CP2 · PP8) = 64, 4096 / (1 · 64) = 64 microbatches;
    V4-Flash on 128: DP 128, 1024 / 128 = 8; per-stage blocks 6, 8 x 6, 7 + MTP; 43 + MTP."""
    pro, flash = verdict("deepseek-v4-pro-1024.yaml").derived, verdict(FLASH).derived
    assert (pro["data_parallel_size"], pro["num_microbatches"]) == (64, 64)
    assert [(c["layers"], c["moe_layers"], c["mtp_layers"]) for c in pro["chunks"]] == (
        [(6, 6, 0)] + [(8, 8, 0)] * 6 + [(7, 7, 1)])
    assert (flash["data_parallel_size"], flash["num_microbatches"]) == (128, 8)
    assert [(c["layers"], c["moe_layers"], c["mtp_layers"]) for c in flash["chunks"]] == [(43, 43, 1)]


def test_gpt_layout_puts_mtp_where_the_layout_says():
    chunks = verdict("gpt pp2 layout + mtp").derived["chunks"]
    assert [(c["stage"], c["layers"], c["mtp_layers"]) for c in chunks] == [(0, 2, 0), (1, 2, 1)]


def test_gpt_vpp_chunks_follow_megatron():
    """PP2 x VPP2 over 8 layers: chunk (stage p, virtual v) holds layers 4v + 2p, 4v + 2p + 1
    (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_layer.py
    get_transformer_layer_offset); layers 0 and 4 are dense."""
    chunks = verdict("gpt pp2 vpp2").derived["chunks"]
    assert [(c["stage"], c["virtual"], c["layers"], c["moe_layers"]) for c in chunks] == [
        (0, 0, 2, 1), (0, 1, 2, 1), (1, 0, 2, 2), (1, 1, 2, 2)]


@pytest.mark.parametrize("name", sorted(REJECTED) + sorted(OLD_TINY))
def test_megatron_refusals_come_back_with_file_and_line(name: str):
    _, location, message, *_ = REJECTED[name] if name in REJECTED else OLD_TINY[name]
    result = verdict(name)
    assert result.verdict == "rejected"
    assert result.location == location
    assert message in result.message


@pytest.mark.parametrize("name", [n for n in INVALID if n not in NOT_EMITTED])
def test_megatron_refuses_every_invalid_example(name: str):
    """Each examples/invalid file breaks one rule; Megatron's own argument/config stage refuses it,
    or the file is listed with the later Megatron step that does."""
    result = verdict(f"invalid/{name}")
    if name in REFUSED_LATER:
        assert result.verdict == "accepted", f"{name} is now refused early: drop it from REFUSED_LATER"
    else:
        assert result.verdict == "rejected", (name, result.verdict)
        assert result.location and result.location.startswith("megatron/"), result.location


def test_the_invalid_examples_moeplan_cannot_emit_are_refused_at_emit():
    for name in NOT_EMITTED:
        with pytest.raises(EmitError):
            request_for(load_config(EXAMPLES / "invalid" / name), name)


def test_a_model_shorter_than_its_preset_gets_one_compress_ratio_per_layer():
    assert verdict(SHORT_FLASH).verdict == "pass"
    old = verdict(OLD_RATIOS[0])
    assert (old.verdict, old.location) == ("rejected", OLD_RATIOS[1])
    assert OLD_RATIOS[2] in old.message


@pytest.mark.parametrize("name", [name for name, case in REJECTED.items() if case[3]])
def test_moeplan_refuses_what_megatron_refuses_first(name: str):
    data, location, _, code = REJECTED[name]
    findings = collect_findings(parse_config(copy.deepcopy(data)))
    assert code in {f.code for f in findings if f.severity == "error"}, location


def test_a_different_derived_value_is_a_failure_naming_both():
    result = verdict("tiny, wrong DP")
    assert result.verdict == "mismatch"
    assert result.mismatches == ["data-parallel size: Megatron 4, moeplan 5"]


@pytest.mark.parametrize("name", sorted(TAMPERED))
def test_tampered_hash_count_and_rope_are_mismatches_naming_both(name: str):
    result = verdict(name)
    assert result.verdict == "mismatch", (result.message, result.location)
    assert result.mismatches == TAMPERED[name][2]


def test_stand_ins_are_listed_and_only_those():
    verdict("tiny-cpu-8.yaml")
    named = [s.split(":")[0] for s in shared_stand_ins()]
    assert set(named) <= {"typing.override", "CUDA device capability", "CUDA current device",
                          "Transformer Engine version gate", "Transformer Engine fused RoPE kernel",
                          "cuDNN DSA kernel presence check", "hash-routing stacks",
                          "flash-linear-attention kernel presence check (gated DeltaNet)"}
    assert {"CUDA device capability", "CUDA current device"} <= set(named)  # this CI has no GPU
    assert "hash-routing stacks" in named  # the examples hash-route


def test_megatron_is_imported_without_torchs_compiler_front_end():
    """The probe builds Megatron's modules and never runs a kernel, so `torch.compile` hands the
    functions Megatron compiles back as they are (planner/emit/megatron_probe.py `_uncompiled`):
    importing the router (`@torch.compile` on the inference router's top-k), the hyper
    connections and the GPT model never imports torch._dynamo, ~2.7 s of Megatron's import on a
    CPU."""
    body = ("from megatron.core.transformer.moe import router\n"
            "from megatron.core.transformer import hyper_connection\n"
            "from megatron.core.models.gpt import gpt_model\n"
            "routing = router.InferenceTopKRouter.__dict__['_compiled_topk_routing'].__func__\n"
            "print(json.dumps({'dynamo': 'torch._dynamo' in sys.modules,\n"
            "                  'wrapped': hasattr(routing, '__wrapped__')}))\n")
    assert snippet_json(body, require_oracle()) == {"dynamo": False, "wrapped": False}


# --- the command line -------------------------------------------------------------------------

def moeplan(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def test_emit_check_with_refuses_and_writes_nothing(tmp_path: Path):
    megatron = require_oracle()
    config = tmp_path / "gtp.yaml"  # moeplan accepts it (for Megatron-LM main); dev's parser does not
    config.write_text(yaml.safe_dump(REJECTED["GTP on the dev branch"][0]))
    out = tmp_path / "run"
    done = moeplan("emit", "all", str(config), "-o", str(out), "--check-with", str(megatron), cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert "unrecognized arguments: --tensor-parallel-num-weight-shards 2" in done.stdout
    assert "at megatron/training/arguments.py:150 parse_args" in done.stdout
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
    assert "stage 0: 2 decoder layer(s), 2 MoE, 0 MTP, hash-routed MoE blocks [0]" in done.stdout
    assert "rotary: position_embedding_type rope, rotary_base 10000" in done.stdout
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


def test_hash_and_rope_mismatches_name_both_values():
    """Routers map to the chunk's MoE blocks in build order; a chunk Megatron built without a hash
    count hashes nothing; a hash-routed MTP layer is always wrong; numbers compare as numbers."""
    ours = {"chunks": [
        {"stage": 0, "virtual": 0, "moe_blocks": [1, 2, 3], "hashed_blocks": [1, 2]},
        {"stage": 1, "virtual": 0, "moe_blocks": [4], "hashed_blocks": []}],
        "rope": {"position_embedding_type": "rope", "rotary_base": 10000, "rotary_scaling_factor": 16.0}}
    theirs = {"hash_routing_built": True, "chunks": [
        {"stage": 0, "virtual": 0, "routers": [[3, True], [4, False], [5, False]]},
        {"stage": 1, "virtual": 0, "routers": [[6, False]], "mtp_routers": [[1, True]]}],
        "rope": {"position_embedding_type": "rope", "rotary_base": 10000.0, "rotary_scaling_factor": 40}}
    assert mismatches(ours, theirs) == [
        "pipeline stage 0 hash-routed MoE blocks: Megatron [1] (its layer numbers [3]), moeplan [1, 2]",
        "pipeline stage 1 hash-routed MTP layers: Megatron layer numbers [1], moeplan none",
        "model.rotary_scaling_factor: Megatron 40, moeplan 16.0",
    ]
    unbuilt = {"hash_routing_built": False, "chunks": [
        {"stage": 0, "virtual": 0}, {"stage": 1, "virtual": 0}]}
    assert mismatches(ours, unbuilt) == [
        "pipeline stage 0 hash-routed MoE blocks: Megatron none (its layer numbers none), moeplan [1, 2]"]


def test_the_request_adds_only_data_and_tokenizer_arguments():
    cfg = parse_config(tiny())
    request: CheckRequest = request_for(cfg)
    assert request.argv[-3:] == ["--mock-data", "--tokenizer-type", "NullTokenizer"]
    assert request.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # CP2 on Hopper


def test_the_check_never_imports_torch_into_moeplan():
    probe = ("import sys, planner.emit.megatron_check, planner.commands.emit, planner.commands.launch\n"
             "assert 'torch' not in sys.modules, 'the pre-flight imported torch'\n")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, cwd=ROOT).returncode == 0

"""`model: {hf_config: PATH}` and `moeplan import hf`: Hugging Face config.json → Megatron-named fields.

The config.json files (tests/support/hf_configs.py) are written from the published configs on
Hugging Face, cited by model id. Expected fields are derived by hand next to each case. Tests that
load a mapped model through the schema skip, naming the field, while the schema lacks a field the
mapping writes (multi_latent_attention, qk_head_dim, normalization, … arrive with the model-fields
work), so they turn on once it lands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.cli import app
from planner.commands.import_ import config_yaml
from planner.commands.import_hf import hf_config_data
from planner.config.importers.hf_config import (
    ARCHITECTURES,
    HfConfigUnmappable,
    HfConfigUnreadable,
    apply_hf_config,
    map_hf_config,
    read_hf_json,
)
from planner.config.importers.hf_families import BY_ARCHITECTURE
from planner.config.loader import InvalidConfig, UnreadableConfig, load_config
from planner.config.schema import LaunchSection, ModelSection
from tests.support.hf_configs import (
    DEEPSEEK_V2_LITE,
    DEEPSEEK_V3,
    HF_CONFIGS,
    KIMI_K2,
    MIXTRAL_8X7B,
    QWEN2_MOE,
    QWEN3_30B,
    QWEN3_235B,
)

# Every supported architecture shares these: RMSNorm + SwiGLU decoder, RoPE, no dropout (HF models
# train none), no MLP biases, untied embeddings (tie_word_embeddings false in every HF config).
COMMON = {
    "normalization": "RMSNorm", "swiglu": True, "position_embedding_type": "rope",
    "untie_embeddings_and_output_weights": True, "hidden_dropout": 0.0, "attention_dropout": 0.0,
    "add_bias_linear": False,
}


def _schema_lacks(mapping_model: dict[str, Any], extra_args: bool) -> list[str]:
    """Fields the mapping writes that today's schema does not have yet."""
    missing = [f"model.{name}" for name in sorted(set(mapping_model) - set(ModelSection.model_fields))]
    if extra_args and "megatron_extra_args" not in LaunchSection.model_fields:
        missing.append("launch.megatron_extra_args")
    return missing


def _skip_unless_schema_has(mapping_model: dict[str, Any], extra_args: bool = False) -> None:
    missing = _schema_lacks(mapping_model, extra_args)
    if missing:
        pytest.skip(f"the schema lacks {', '.join(missing)} (added by the model-fields work)")


def _write(folder: Path, name: str, content: Any) -> Path:
    path = folder / name
    path.write_text(json.dumps(content) if not isinstance(content, str) else content, "utf-8")
    return path


# ------------------------------------------------------------------------ field-by-field mappings


def test_deepseek_v3_maps_to_megatron_arguments():
    mapping = map_hf_config(DEEPSEEK_V3)
    assert mapping.architecture == "DeepseekV3ForCausalLM"
    assert mapping.model == {
        **COMMON,
        "num_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "vocab_size": 129280,
        "max_position_embeddings": 163840, "norm_epsilon": 1e-6, "rotary_base": 10000,
        "multi_latent_attention": True, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_head_dim": 128,           # qk_nope_head_dim
        "qk_pos_emb_head_dim": 64,    # qk_rope_head_dim
        "v_head_dim": 128, "qk_layernorm": True,  # q_a_layernorm / kv_a_layernorm
        "ffn_hidden_size": 18432,     # the 3 dense layers' intermediate_size
        "num_experts": 256, "moe_router_topk": 8, "moe_ffn_hidden_size": 2048,
        "moe_shared_expert_intermediate_size": 2048,  # n_shared_experts 1 x 2048
        "mtp_num_layers": 1, "moe_router_dtype": "fp32",
        "moe_layer_freq": [0] * 3 + [1] * 58,  # first_k_dense_replace 3 of 61 layers
        "moe_router_score_function": "sigmoid", "moe_router_topk_scaling_factor": 2.5,
        "moe_router_enable_expert_bias": True,  # topk_method noaux_tc
        "moe_router_num_groups": 8, "moe_router_group_topk": 4,
        "rope_type": "yarn", "rotary_scaling_factor": 40.0,
        "original_max_position_embeddings": 4096,
    }
    # mscale_all_dim 1.0 differs from MLATransformerConfig's 0.0; mscale 1.0 is the default.
    assert mapping.megatron_extra_args == ("--mscale-all-dim", "1.0")
    assert mapping.notes == ()


def test_kimi_k2_is_the_v3_architecture_with_its_own_dims():
    mapping = map_hf_config(KIMI_K2)
    v3 = map_hf_config(DEEPSEEK_V3).model
    changed = {k: v for k, v in mapping.model.items() if v3.get(k) != v}
    assert changed == {
        "num_attention_heads": 64, "num_experts": 384, "vocab_size": 163840,
        "max_position_embeddings": 131072, "mtp_num_layers": 0, "rotary_base": 50000,
        "moe_layer_freq": [0] + [1] * 60,  # first_k_dense_replace 1
        "moe_router_topk_scaling_factor": 2.827, "rotary_scaling_factor": 32.0,
    }
    # n_group 1 / topk_group 1: no group-limited routing, so neither group field is written.
    assert "moe_router_num_groups" not in mapping.model
    assert "moe_router_group_topk" not in mapping.model
    assert [n for n in mapping.notes if "beta_fast" in n]  # YaRN beta_fast 1 has no argument


def test_deepseek_v2_lite_softmax_without_renormalisation_is_pre_softmax():
    model = map_hf_config(DEEPSEEK_V2_LITE).model
    assert "q_lora_rank" not in model  # null: queries are not compressed
    assert model["moe_router_score_function"] == "softmax"
    assert model["moe_router_pre_softmax"] is True  # norm_topk_prob false
    assert "moe_router_topk_scaling_factor" not in model  # routed_scaling_factor 1.0
    assert model["moe_shared_expert_intermediate_size"] == 2 * 1408
    assert model["moe_layer_freq"] == [0] + [1] * 26
    assert "moe_router_enable_expert_bias" not in model  # topk_method greedy
    assert map_hf_config(DEEPSEEK_V2_LITE).megatron_extra_args == (
        "--mscale", "0.707", "--mscale-all-dim", "0.707")


def test_qwen3_30b_a3b_maps_to_megatron_arguments():
    mapping = map_hf_config(QWEN3_30B)
    assert mapping.model == {
        **COMMON,
        "num_layers": 48, "hidden_size": 2048, "num_attention_heads": 32, "vocab_size": 151936,
        "max_position_embeddings": 40960, "norm_epsilon": 1e-6,
        "rotary_base": 1000000,  # rope_theta 1000000.0, an integer --rotary-base
        "kv_channels": 128,  # head_dim: 32 heads x 128 = 4096 != hidden 2048, so it must be given
        "group_query_attention": True, "num_query_groups": 4,  # num_key_value_heads 4 < 32
        "qk_layernorm": True,  # Qwen3's q_norm / k_norm
        "ffn_hidden_size": 6144, "num_experts": 128, "moe_router_topk": 8,
        "moe_ffn_hidden_size": 768, "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": False,  # norm_topk_prob: top-k renormalised = post-softmax
        "moe_layer_freq": 1,  # decoder_sparse_step 1, mlp_only_layers []: every layer MoE
    }
    assert mapping.megatron_extra_args == () and mapping.notes == ()


def test_qwen3_235b_a22b_dims():
    model = map_hf_config(QWEN3_235B).model
    assert {k: model[k] for k in ("num_layers", "hidden_size", "num_attention_heads",
                                  "num_query_groups", "kv_channels", "ffn_hidden_size",
                                  "moe_ffn_hidden_size", "num_experts", "moe_router_topk")} == {
        "num_layers": 94, "hidden_size": 4096, "num_attention_heads": 64, "num_query_groups": 4,
        "kv_channels": 128, "ffn_hidden_size": 12288, "moe_ffn_hidden_size": 1536,
        "num_experts": 128, "moe_router_topk": 8}


def test_qwen2_moe_has_a_gated_shared_expert_and_qkv_bias():
    mapping = map_hf_config(QWEN2_MOE)
    model = mapping.model
    assert model["moe_shared_expert_intermediate_size"] == 5632
    assert model["moe_shared_expert_gate"] is True
    assert model["moe_router_pre_softmax"] is True  # norm_topk_prob false
    assert model["qk_layernorm"] is False
    assert model["kv_channels"] == 2048 // 16  # no head_dim key: hidden / heads
    assert "group_query_attention" not in model  # 16 KV heads = 16 heads
    assert model["add_qkv_bias"] is True and mapping.megatron_extra_args == ()


def test_mixtral_8x7b_maps_to_megatron_arguments():
    mapping = map_hf_config(MIXTRAL_8X7B)
    assert mapping.model == {
        **COMMON,
        "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000,
        "max_position_embeddings": 32768, "norm_epsilon": 1e-5, "rotary_base": 1000000,
        "kv_channels": 128,  # 4096 / 32
        "group_query_attention": True, "num_query_groups": 8, "qk_layernorm": False,
        "ffn_hidden_size": 14336, "moe_ffn_hidden_size": 14336,  # every expert is a full MLP
        "num_experts": 8, "moe_router_topk": 2, "moe_layer_freq": 1,
        "moe_router_score_function": "softmax", "moe_router_pre_softmax": False,
    }


@given(layers=st.integers(1, 200), step=st.integers(1, 8),
       dense=st.lists(st.integers(0, 199), max_size=10))
def test_qwen_moe_layer_pattern_counts_sparse_layers(layers: int, step: int, dense: list[int]):
    # HF Qwen-MoE: layer i is sparse iff i is not in mlp_only_layers and (i + 1) % step == 0.
    hf = {**QWEN3_30B, "num_hidden_layers": layers, "decoder_sparse_step": step,
          "mlp_only_layers": dense}
    freq = map_hf_config(hf).model["moe_layer_freq"]
    sparse = [i for i in range(layers) if (i + 1) % step == 0 and i not in dense]
    pattern = [1] * layers if freq == 1 else freq
    assert len(pattern) == layers and [i for i, f in enumerate(pattern) if f] == sparse


@given(layers=st.integers(1, 100), first_dense=st.integers(0, 100))
def test_deepseek_first_k_dense_pattern(layers: int, first_dense: int):
    hf = {**DEEPSEEK_V3, "num_hidden_layers": layers, "first_k_dense_replace": first_dense}
    freq = map_hf_config(hf).model["moe_layer_freq"]
    expected = [0] * min(first_dense, layers) + [1] * max(0, layers - first_dense)
    assert freq == (1 if all(expected) else expected)


# ----------------------------------------------------------------------------- the loader hook


def test_yaml_fields_win_over_the_config_json(tmp_path: Path):
    data = {"model": {"hf_config": "config.json", "num_layers": 4, "moe_layer_freq": 1},
            "parallel": {"world_size": 8}, "training": {"seq_length": 128}}
    _write(tmp_path, "config.json", QWEN3_30B)
    resolved, findings = apply_hf_config(data, tmp_path)
    assert findings == []
    assert resolved["model"] == {**map_hf_config(QWEN3_30B).model, "num_layers": 4,
                                 "moe_layer_freq": 1}
    assert "hf_config" not in resolved["model"]


def test_a_key_is_not_needed_when_the_yaml_writes_its_field():
    hf = {k: v for k, v in MIXTRAL_8X7B.items() if k != "num_local_experts"}
    with pytest.raises(HfConfigUnmappable) as missing:
        map_hf_config(hf)
    [finding] = missing.value.findings
    assert finding.code == "CFG007" and finding.path == "model.hf_config.num_local_experts"
    assert "MixtralForCausalLM needs 'num_local_experts'" in finding.message
    assert "model.num_experts" in finding.fix
    assert map_hf_config(hf, provided={"num_experts": 8}).model["num_experts"] == 8


def test_every_missing_key_is_one_finding():
    hf = {k: v for k, v in DEEPSEEK_V3.items() if k not in {"hidden_size", "kv_lora_rank"}}
    with pytest.raises(HfConfigUnmappable) as missing:
        map_hf_config(hf)
    assert sorted(f.path for f in missing.value.findings) == [
        "model.hf_config.hidden_size", "model.hf_config.kv_lora_rank"]


def test_unknown_architecture_lists_the_supported_ones():
    with pytest.raises(HfConfigUnmappable) as unknown:
        map_hf_config({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096})
    [finding] = unknown.value.findings
    assert finding.code == "CFG007" and "LlamaForCausalLM" in finding.message
    assert all(name in finding.fix for name in ARCHITECTURES)
    with pytest.raises(HfConfigUnmappable) as v4:  # mapped, but no layer program in the file
        map_hf_config({"architectures": ["DeepseekV4ForCausalLM"]})
    assert [f.path for f in v4.value.findings] == ["model.hf_config.compress_ratios"]


def test_unmodelled_features_are_findings():
    with pytest.raises(HfConfigUnmappable) as window:
        map_hf_config({**MIXTRAL_8X7B, "sliding_window": 4096})
    assert "sliding-window attention is not modelled" in window.value.findings[0].message
    with pytest.raises(HfConfigUnmappable) as act:
        map_hf_config({**QWEN3_30B, "hidden_act": "gelu"})
    assert act.value.findings[0].path == "model.hf_config.hidden_act"
    with pytest.raises(HfConfigUnmappable) as typed:
        map_hf_config({**QWEN3_30B, "hidden_size": "2048"})
    assert "must be a non-negative 64-bit integer" in typed.value.findings[0].message
    with pytest.raises(HfConfigUnmappable) as huge:
        map_hf_config({**QWEN3_30B, "num_experts": 10**30, "rms_norm_eps": float("nan")})
    assert sorted(f.path for f in huge.value.findings) == [
        "model.hf_config.num_experts", "model.hf_config.rms_norm_eps"]


def test_check_reports_cfg007_with_exit_1(tmp_path: Path):
    _write(tmp_path, "config.json", {"architectures": ["GPT2LMHeadModel"]})
    job = tmp_path / "job.yaml"
    job.write_text("model: {hf_config: config.json}\nparallel: {world_size: 8}\n"
                   "training: {seq_length: 128}\n", "utf-8")
    with pytest.raises(InvalidConfig) as bad:
        load_config(job)
    assert [f.code for f in bad.value.findings] == ["CFG007"]
    result = CliRunner().invoke(app, ["check", str(job)])
    assert result.exit_code == 1 and "CFG007" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "\"text\""])
def test_bad_json_is_a_usage_error(tmp_path: Path, content: str):
    _write(tmp_path, "config.json", content)
    with pytest.raises(HfConfigUnreadable):
        read_hf_json(tmp_path / "config.json")
    job = tmp_path / "job.yaml"
    job.write_text("model: {hf_config: config.json}\nparallel: {world_size: 8}\n"
                   "training: {seq_length: 128}\n", "utf-8")
    with pytest.raises(UnreadableConfig):
        load_config(job)
    assert CliRunner().invoke(app, ["check", str(job)]).exit_code == 2
    assert CliRunner().invoke(app, ["import", "hf", str(tmp_path / "config.json")]).exit_code == 2


def test_missing_config_json_is_a_usage_error(tmp_path: Path):
    job = tmp_path / "job.yaml"
    job.write_text("model: {hf_config: nowhere.json}\nparallel: {world_size: 8}\n"
                   "training: {seq_length: 128}\n", "utf-8")
    result = CliRunner().invoke(app, ["check", str(job)])
    assert result.exit_code == 2 and "nowhere.json" in result.output


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_the_mapped_model_loads_through_the_schema(tmp_path: Path, name: str,
                                                  monkeypatch: pytest.MonkeyPatch):
    mapping = map_hf_config(HF_CONFIGS[name])
    _skip_unless_schema_has(mapping.model, bool(mapping.megatron_extra_args))
    (tmp_path / "models").mkdir()
    _write(tmp_path / "models", "config.json", HF_CONFIGS[name])
    job = tmp_path / "job.yaml"
    job.write_text("model: {hf_config: models/config.json, num_layers: 4}\n"
                   "parallel: {world_size: 8}\ntraining: {seq_length: 128}\n", "utf-8")
    monkeypatch.chdir(tmp_path / "models")  # the path is relative to the YAML, not the cwd
    cfg = load_config(job)
    assert cfg.model.num_layers == 4  # the YAML wins
    assert cfg.model.hidden_size == mapping.model["hidden_size"]
    assert cfg.model.num_experts == mapping.model["num_experts"]


# ----------------------------------------------------------------------------- moeplan import hf


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_written_yaml_holds_the_mapping(name: str):
    mapping = map_hf_config(HF_CONFIGS[name])
    sections = {"parallel": {"world_size": 8}, "training": {"seq_length": 4096}}
    text = config_yaml(hf_config_data(mapping, sections), ["header"])
    data = yaml.safe_load(text)
    assert text.startswith("# header\n")
    assert data["model"] == mapping.model
    assert data["parallel"] == {"world_size": 8} and data["training"] == {"seq_length": 4096}
    assert data.get("launch", {}).get("megatron_extra_args", []) == list(mapping.megatron_extra_args)


def test_import_hf_writes_a_loadable_yaml(tmp_path: Path):
    from planner.cli_common import collect_findings
    from planner.findings import has_errors

    mapping = map_hf_config(MIXTRAL_8X7B)
    _skip_unless_schema_has(mapping.model)
    source = _write(tmp_path, "config.json", MIXTRAL_8X7B)
    out = tmp_path / "job.yaml"
    args = ["import", "hf", str(source), "-o", str(out), "--world-size", "16", "--ep", "8"]
    result = CliRunner().invoke(app, args)
    cfg = load_config(out)
    assert cfg.parallel.world_size == 16 and cfg.parallel.ep == 8
    assert cfg.model.num_experts == 8 and cfg.model.num_query_groups == 8
    # Like `import megatron`: the YAML is written, the exit code says whether it is valid.
    assert result.exit_code == (1 if has_errors(collect_findings(cfg)) else 0), result.output
    report = CliRunner().invoke(app, [*args, "--json", "--force"])  # -o exists: overwrite it
    assert json.loads(report.stdout)["architecture"] == "MixtralForCausalLM"


def test_import_hf_unknown_architecture_writes_nothing(tmp_path: Path):
    source = _write(tmp_path, "config.json", {"architectures": ["GPT2LMHeadModel"]})
    out = tmp_path / "job.yaml"
    result = CliRunner().invoke(app, ["import", "hf", str(source), "-o", str(out)])
    assert result.exit_code == 1 and "CFG007" in result.output
    assert "Qwen3MoeForCausalLM" in result.output and not out.exists()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


@given(name=st.sampled_from(sorted(HF_CONFIGS)), key=st.text(max_size=30), value=_JSON,
       drop=st.booleans(), provided=st.dictionaries(
           st.sampled_from(["num_layers", "hidden_size", "num_attention_heads", "num_experts"]),
           _JSON, max_size=2))
def test_any_json_value_maps_or_is_a_finding(name: str, key: str, value: Any, drop: bool,
                                             provided: dict[str, Any]):
    # Replace (or drop) one key of a real config, sometimes a real key: never a traceback.
    hf = dict(HF_CONFIGS[name])
    key = sorted(hf)[len(key) % len(hf)] if key[:1] != "_" else key
    if drop:
        hf.pop(key, None)
    else:
        hf[key] = value
    try:
        mapping = map_hf_config(hf, provided=provided)
    except HfConfigUnmappable as exc:
        assert exc.findings and all(f.code == "CFG007" for f in exc.findings)
    else:
        assert mapping.architecture in BY_ARCHITECTURE  # by its architectures or model_type


# Total parameters without MTP, from the model cards (cited by model id) and the independent
# count: deepseek-ai/DeepSeek-V3 671.0B, Qwen/Qwen3-30B-A3B 30.53B, Qwen/Qwen3-235B-A22B 235.09B,
# mistralai/Mixtral-8x7B-v0.1 46.70B (0.1 %); deepseek-ai/DeepSeek-V2-Lite 15.7B and
# Qwen/Qwen1.5-MoE-A2.7B 14.3B are given to 0.1B on their cards (0.5 %).
CARD_TOTALS = {"deepseek-v3": (671.0e9, 0.001), "qwen3-30b-a3b": (30.53e9, 0.001),
               "qwen3-235b-a22b": (235.09e9, 0.001), "mixtral-8x7b": (46.70e9, 0.001),
               "deepseek-v2-lite": (15.7e9, 0.005), "qwen2-moe": (14.3e9, 0.005)}


@pytest.mark.parametrize("name", sorted(CARD_TOTALS))
def test_hf_config_totals_match_the_model_cards(name: str):
    from planner.accounting import budgets
    from planner.config.loader import parse_config

    mapping = map_hf_config(HF_CONFIGS[name])
    _skip_unless_schema_has(mapping.model, bool(mapping.megatron_extra_args))
    data = {"model": {"hf_config": HF_CONFIGS[name], "mtp_num_layers": 0},
            "parallel": {"world_size": 1}, "training": {"seq_length": 16}}
    rows = {b.name: b.value for b in budgets(parse_config(data)) if b.stage in (None, 0)}
    card, tolerance = CARD_TOTALS[name]
    assert abs(rows["params_on_rank"] / card - 1) < tolerance  # one rank holds every parameter


@pytest.mark.parametrize("key", ["num_experts_per_tok", "moe_intermediate_size", "kv_lora_rank"])
def test_a_required_key_stated_null_is_refused_by_name(key: str):
    # null is no value: the experts a token reaches (or a width) cannot default to Megatron's
    # own, which would plan another model than the file's
    with pytest.raises(HfConfigUnmappable) as refused:
        map_hf_config({**DEEPSEEK_V3, key: None})
    [finding] = refused.value.findings
    assert finding.path == f"model.hf_config.{key}" and "lacks" in finding.message

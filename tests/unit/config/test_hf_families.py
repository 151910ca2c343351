"""Verbatim config.json files of current MoE families (tests/support/hf_config_files/) through
`moeplan import hf`: each maps to the model transformers builds from it, counted exactly, or is
refused naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.config.importers.hf_config import HfConfigUnmappable, map_hf_config, read_hf_json
from planner.config.importers.hf_families import FAMILIES, UNRECORDED_BRIDGES, unrecorded_bridge_line
from planner.config.presets import PRESETS
from planner.config.schema import Config, ModelSection
from planner.model_size import model_size
from tests.support.hf_configs import KIMI_K2, KIMI_LINEAR
from tests.support.hf_corpus import (
    HELD_OUT,
    NO_RECORD_COUNTS,
    TRANSFORMERS_COUNTS,
    corpus_config,
    corpus_path,
)


def _size(model: dict[str, object], moe: dict[str, object] | None = None) -> tuple[int, int, int]:
    cfg = Config.model_validate({"model": model, "moe": moe or {}, "parallel": {"world_size": 1},
                                 "training": {"seq_length": 16}})
    size = model_size(cfg)
    assert size is not None
    return size.total_params, size.active_params, size.mtp_params


@pytest.mark.parametrize("name", ["deepseek-v4-pro", "deepseek-v4-flash"])
def test_deepseek_v4_config_json_is_the_preset_model(name: str):
    # The official file maps to the preset field for field once Megatron's defaults resolve:
    # hash layers, compress ratios (MTP's 0 included), indexer, mHC and YaRN read from the file.
    mapping = map_hf_config(read_hf_json(corpus_path(name)))
    assert mapping.architecture == "DeepseekV4ForCausalLM" and not mapping.megatron_extra_args
    assert ModelSection.model_validate(mapping.model) == ModelSection.model_validate(PRESETS[name])
    assert mapping.model["moe_n_hash_layers"] == 3 and mapping.model["num_residual_streams"] == 4
    assert mapping.model["kv_lora_rank"] == 512 - 64  # Megatron's latent: the non-rotary part


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_COUNTS))
def test_the_count_is_what_transformers_builds(name: str):
    mapping = map_hf_config(corpus_config(name))
    total, _, _ = _size(mapping.model, mapping.moe)
    assert total == TRANSFORMERS_COUNTS[name]


def test_deepseek_v4_layer_types_spelling_equals_compress_ratios():
    # transformers' own spelling (layer_types + mlp_layer_types) maps to the same model as the
    # released files' legacy keys (compress_ratios + num_hash_layers).
    hf = corpus_config("deepseek-v4-flash")
    names = {0: "sliding_attention", 4: "compressed_sparse_attention",
             128: "heavily_compressed_attention"}
    spelled = {key: value for key, value in hf.items() if key not in ("compress_ratios",
                                                                      "num_hash_layers")}
    spelled["layer_types"] = [names[r] for r in hf["compress_ratios"][:43]]
    spelled["mlp_layer_types"] = ["hash_moe"] * 3 + ["moe"] * 40
    mapped = map_hf_config(spelled)
    assert mapped.model == map_hf_config(hf).model
    assert any("MTP layer(s) are given ratio 0" in note for note in mapped.notes)


@pytest.mark.parametrize(("change", "key", "says"), [
    ({"compress_ratios": [0, 8] * 22}, "compress_ratios", "0 (window only), 4 (CSA) or 128"),
    ({"compress_ratios": None}, "compress_ratios", "names each layer's compression"),
    ({"compress_ratios": [0, 4]}, "compress_ratios", "num_hidden_layers is 43"),
    ({"num_key_value_heads": 8}, "num_key_value_heads", "one K/V head"),
    ({"scoring_func": "relu"}, "scoring_func", "softmax, sigmoid or sqrtsoftplus"),
    ({"mlp_layer_types": ["moe", "hash_moe"] + ["moe"] * 41}, "mlp_layer_types",
     "first moe_n_hash_layers layers only"),
    ({"layer_types": ["sliding_attention", "linear_attention"], "compress_ratios": None},
     "layer_types", "DeepSeek-V4 layers are"),
])
def test_deepseek_v4_what_megatron_cannot_build_is_refused_by_key(change: dict[str, object],
                                                                  key: str, says: str):
    hf = {**corpus_config("deepseek-v4-flash"), **change}
    hf = {k: v for k, v in hf.items() if v is not None}
    with pytest.raises(HfConfigUnmappable) as refused:
        map_hf_config(hf)
    [finding] = refused.value.findings
    assert finding.code == "CFG007" and finding.path == f"model.hf_config.{key}"
    assert says in finding.message


def test_infinity_reads_as_python_does_and_is_refused_only_where_mapped(tmp_path: Path):
    # Nemotron-3-Super's "time_step_limit": [0.0, Infinity] is real config.json that Python's json
    # and transformers read: the reader takes it; a mapped key that is not finite is a finding.
    hf = corpus_config("deepseek-v4-flash")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**hf, "time_step_limit": [0.0, float("inf")]}), "utf-8")
    assert "Infinity" in path.read_text("utf-8")
    assert read_hf_json(path)["time_step_limit"] == [0.0, float("inf")]
    assert map_hf_config(read_hf_json(path)).model == map_hf_config(hf).model
    path.write_text(json.dumps({**hf, "swiglu_limit": float("nan")}), "utf-8")
    with pytest.raises(HfConfigUnmappable) as nan:
        map_hf_config(read_hf_json(path))
    assert [f.path for f in nan.value.findings] == ["model.hf_config.swiglu_limit"]


def test_glm_4_7_flash_is_the_deepseek_v3_stack_with_its_mtp_layer():
    # GLM-4.7-Flash's MTP layer: the checkpoint's layer 47 less its repeated embedding and head
    # (2 x 154,880 x 2,048) and its expert-bias buffer (64): 31,221,488,576 - 29,943,390,976
    # - 634,388,480 - 47 x 64 (the 46 MoE layers' and the MTP layer's e_score_correction_bias).
    mapping = map_hf_config(corpus_config("glm-4.7-flash"))
    assert mapping.model["moe_layer_freq"] == [0] + [1] * 46
    assert (mapping.model["q_lora_rank"], mapping.model["qk_head_dim"],
            mapping.model["v_head_dim"]) == (768, 192, 256)
    total, active, mtp = _size(mapping.model)
    assert mtp == 31_221_488_576 - 29_943_390_976 - 2 * 154_880 * 2_048 - 47 * 64
    routed = 46 * 64 * 3 * 2_048 * 1_536
    assert active == total - routed * (64 - 4) // 64
    assert "GLM47FlashBridge" in mapping.bridge


def test_glm_5_is_dsa_on_every_layer_and_its_mtp_layer_is_the_checkpoints():
    # rope_theta only inside rope_parameters (transformers 5's spelling); the MTP layer is the
    # checkpoint's layer 78 (753,864,139,008 in all) less the 76 expert-bias buffers of 256.
    mapping = map_hf_config(corpus_config("glm-5.1"))
    model = mapping.model
    assert model["dsa"] and (model["index_n_heads"], model["index_head_dim"],
                             model["index_topk"]) == (32, 128, 2048)
    assert model["rotary_base"] == 1_000_000 and model["moe_layer_freq"] == [0] * 3 + [1] * 75
    _, _, mtp = _size(model)
    assert mtp == 753_864_139_008 - TRANSFORMERS_COUNTS["glm-5.1"] - 76 * 256
    assert "GLM5Bridge" in mapping.bridge
    # indexers that reuse another layer's picks on a pattern Megatron's (freq, offset) cannot
    # give: layer 0 reusing (Megatron's layer 1 always computes), or an irregular spacing
    for kinds in (["shared"] + ["full"] * 77, ["full"] * 3 + ["shared", "full", "shared", "shared"]
                  + ["full"] * 71):
        with pytest.raises(HfConfigUnmappable) as shared:
            map_hf_config({**corpus_config("glm-5.1"), "indexer_types": kinds})
        [finding] = shared.value.findings
        assert finding.path == "model.hf_config.indexer_types"
        assert "--dsa-indexer-topk-freq" in finding.message


def test_a_multimodal_wrapper_resolves_to_its_text_stack_and_names_its_tower():
    # Kimi-K2.5 wraps the DeepSeek-V3 text stack (transformers Kimi_K25Config: text_config of
    # model_type deepseek_v3, kimi_k2 renamed) beside a vision tower moeplan leaves out.
    wrapped = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
               "text_config": {**KIMI_K2, "model_type": "kimi_k2"},
               "vision_config": {"model_type": "kimi_k25_vision", "hidden_size": 1152}}
    mapping = map_hf_config(wrapped)
    assert mapping.model == map_hf_config(KIMI_K2).model
    assert mapping.family == "kimi_k25" and "KimiK25VLBridge" in mapping.bridge
    assert any(note.startswith("vision_config: this tower is left out") for note in mapping.notes)
    with pytest.raises(HfConfigUnmappable) as bare:  # no text stack: its keys are missing, by name
        map_hf_config({**wrapped, "text_config": None})
    assert all(f.path.startswith("model.hf_config.text_config.") for f in bare.value.findings)


def test_qwen3_vl_is_the_qwen3_moe_stack_untied_by_its_wrapper():
    # The top-level tie_word_embeddings false unties the output layer (the checkpoint holds
    # lm_head); the text stack equals Qwen3-30B-A3B's but for its RoPE base and context.
    mapping = map_hf_config(corpus_config("qwen3-vl-30b-a3b"))
    assert mapping.model["untie_embeddings_and_output_weights"] is True
    preset = {**PRESETS["qwen3-30b-a3b"], "rotary_base": 5_000_000,
              "max_position_embeddings": 262_144}
    assert ModelSection.model_validate(mapping.model) == ModelSection.model_validate(preset)
    assert any("mrope" in note for note in mapping.notes)
    assert any(note.startswith("vision_config:") for note in mapping.notes)


def test_qwen3_5_moe_is_the_qwen3_next_stack_in_a_vision_wrapper():
    # RoPE base and rotary share only inside rope_parameters / text_config; one full-attention
    # layer in four, the rest gated DeltaNet; a gated shared expert; the MTP layer is a note.
    mapping = map_hf_config(corpus_config("qwen3.5-35b-a3b"))
    model = mapping.model
    assert (model["rotary_base"], model["rotary_percent"], model["linear_attention_freq"]) == (
        10_000_000, 0.25, 4)
    assert model["moe_shared_expert_gate"] and model["attention_output_gate"]
    assert any(note.startswith("mtp_num_hidden_layers 1") for note in mapping.notes)
    assert "Qwen35VLMoEBridge" in mapping.bridge


def test_import_hf_names_the_megatron_bridge(tmp_path: Path):
    from typer.testing import CliRunner

    from planner.cli import app

    out = tmp_path / "job.yaml"
    result = CliRunner().invoke(app, ["import", "hf", str(corpus_path("deepseek-v4-flash")),
                                      "-o", str(out)])
    assert result.exit_code in (0, 1), result.output
    assert ("# bridge: Megatron-Bridge trains it with DeepSeekV4Bridge "
            "(src/megatron/bridge/models/deepseek/deepseek_v4_bridge.py") in out.read_text("utf-8")


_VALUES = st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats() | st.text(max_size=6) | \
    st.lists(st.sampled_from(["full", "moe", "hash_moe", 0, 4, 128, None]), max_size=4)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(set(TRANSFORMERS_COUNTS) - set(HELD_OUT))),
       pick=st.integers(0, 10**6),
       value=_VALUES, drop=st.booleans())
def test_any_value_of_a_corpus_key_maps_or_is_a_finding(name: str, pick: int, value: object,
                                                        drop: bool):
    # One key of a real file replaced (Infinity and NaN included) or dropped: a mapping or
    # CFG007 findings, never a traceback.
    hf = corpus_config(name)
    target = hf.get("text_config") if isinstance(hf.get("text_config"), dict) and pick % 2 else hf
    key = sorted(target)[pick % len(target)]
    if drop:
        del target[key]
    else:
        target[key] = value
    try:
        map_hf_config(hf)
    except HfConfigUnmappable as exc:
        assert exc.findings and all(f.code == "CFG007" for f in exc.findings)


def test_nemotron_3_nano_is_megatrons_hybrid_stack_as_its_example():
    """The verbatim NemotronH config.json (tests/support/hf_config_files/SOURCES.md): its
    hybrid_override_pattern becomes --hybrid-layer-pattern as written (23 M, 6 *, 23 E; no MTP
    depth), the Mamba-2 sizes from ssm_state_size / n_groups / mamba_num_heads x mamba_head_dim,
    squared ReLU, no position embedding. The count is transformers 5.25's meta build of this file
    (NemotronHForCausalLM: 31,577,937,344) and equals the example under examples/architectures/."""
    from planner.config.loader import load_config

    mapping = map_hf_config(corpus_config("nvidia-nemotron-3-nano-30b-a3b"))
    model = mapping.model
    assert mapping.architecture == "NemotronHForCausalLM"
    assert model["hybrid_layer_pattern"] == "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
    assert (model["mamba_num_heads"], model["mamba_head_dim"], model["mamba_state_dim"],
            model["mamba_num_groups"]) == (64, 64, 128, 8)
    assert model["squared_relu"] and model["position_embedding_type"] == "none"
    assert _size(model) == (31_577_937_344, 3_580_073_408, 0)
    example = load_config(Path(__file__).parents[3] / "examples" / "architectures"
                          / "nemotron-3-nano-30b-a3b-64.yaml").model
    assert ModelSection.model_validate(model) == example


def test_nemotron_3_super_latent_moe_is_its_example():
    """Super's config.json (the latent MoE: 512 experts of 2688 at moe_latent_size 1024, one MTP
    depth) maps to the example's model section and its moe.moe_latent_size; the count is
    transformers 5.25's NemotronHForCausalLM (fc1/fc2_latent_proj included) and the MTP depth is
    the release's 2,942,324,736 (one attention and one latent-MoE layer with their norms)."""
    from planner.config.loader import load_config

    mapping = map_hf_config(corpus_config("nvidia-nemotron-3-super-120b-a12b"))
    assert mapping.moe == {"moe_latent_size": 1024}
    assert mapping.model["hybrid_layer_pattern"].endswith("EMEMEME/*E")
    total, _, mtp = _size(mapping.model, mapping.moe)
    assert (total, mtp) == (120_668_687_360, 2_942_324_736)
    example = load_config(Path(__file__).parents[3] / "examples" / "architectures"
                          / "nemotron-3-super-120b-a12b-256.yaml")
    assert ModelSection.model_validate(mapping.model) == example.model
    assert example.moe.moe_latent_size == mapping.moe["moe_latent_size"]


@pytest.mark.parametrize(("change", "key"), [({"conv_kernel": 3}, "conv_kernel"),
                                             ({"mlp_hidden_act": "silu"}, "mlp_hidden_act"),
                                             ({"hybrid_override_pattern": "MGE"}, "hybrid_override_pattern"),
                                             ({"moe_latent_size": 0.5}, "moe_latent_size")])
def test_nemotron_h_what_megatron_cannot_build_is_refused_by_key(change: dict[str, object], key: str):
    hf = corpus_config("nvidia-nemotron-3-nano-30b-a3b") | change
    with pytest.raises(HfConfigUnmappable) as refused:
        map_hf_config(hf)
    assert any(f.path.endswith(f".{key}") for f in refused.value.findings), refused.value.findings


@pytest.mark.parametrize(("name", "example", "counts"), [
    ("glm-5.1", "glm-5.1-512", (743_911_199_232, 41_784_709_632, 9_952_920_320)),
    ("glm-5.2", "glm-5.2-512", (743_377_000_704, 41_250_511_104, 9_952_920_320)),
    ("qwen3.5-35b-a3b", "qwen3.5-35b-a3b-16", (34_660_610_688, 3_454_988_928, 0)),
    ("kimi-k2.5", "kimi-k2.5-1024", (1_026_408_209_408, 32_861_477_888, 0)),
    ("qwen3-vl-235b-a22b", "qwen3-vl-235b-a22b-256", (235_093_634_560, 22_190_763_520, 0)),
])
def test_an_imported_family_example_is_its_config_json(name: str, example: str,
                                                        counts: tuple[int, int, int]):
    """The examples' model sections are `import hf` of the verbatim file, field for field; the total
    is transformers 5.25's meta build (hf_corpus.py), activated and MTP counts moeplan's own."""
    from planner.config.loader import load_config

    mapping = map_hf_config(corpus_config(name))
    config = load_config(Path(__file__).parents[3] / "examples" / "architectures" / f"{example}.yaml")
    assert ModelSection.model_validate(mapping.model) == config.model
    assert _size(mapping.model, mapping.moe) == counts
    assert counts[0] == TRANSFORMERS_COUNTS[name]


def test_a_re_saved_files_yarn_in_rope_parameters_is_mapped():
    """transformers 5 re-saves a config with its RoPE scaling inside rope_parameters and no
    rope_scaling (Kimi-K2.5's file): its YaRN (factor 64 over 4,096 positions, mscale_all_dim 1.0)
    reaches MLATransformerConfig, not plain RoPE; a rope_parameters of rope_type "default" (GLM-5.1)
    stays unscaled."""
    mapping = map_hf_config(corpus_config("kimi-k2.5"))
    assert (mapping.model["rope_type"], mapping.model["rotary_scaling_factor"],
            mapping.model["original_max_position_embeddings"]) == ("yarn", 64.0, 4096)
    assert mapping.megatron_extra_args == ("--mscale-all-dim", "1.0")
    assert map_hf_config(corpus_config("glm-5.1")).model["rope_type"] == "rope"
    qwen = map_hf_config(corpus_config("qwen3-vl-235b-a22b"))
    assert any(note.startswith("rope_parameters mrope_section [24, 20, 20]") for note in qwen.notes)


def test_a_model_type_without_a_record_names_its_bridge_or_that_none_is_known():
    """The no-record path of `import hf` names the Megatron-Bridge bridge of Step-3.7, MiMo-V2-Flash,
    Gemma-4 or ERNIE-4.5 with its file and commit; Laguna has none there."""
    line = unrecorded_bridge_line("step3p7")
    assert line.startswith("model_type step3p7 has no moeplan family record; Megatron-Bridge trains "
                           "it with Step37Bridge (src/megatron/bridge/models/stepfun/step37_bridge.py, "
                           "NVIDIA-NeMo/Megatron-Bridge@a1d4d4bf)")
    assert "has no bridge for it known here" in unrecorded_bridge_line("laguna")
    assert not set(UNRECORDED_BRIDGES) & {family.model_type for family in FAMILIES}


def test_the_laguna_example_is_counted_as_transformers_builds_it():
    """examples/architectures/laguna-xs.2-16.yaml: transformers 5.25's LagunaForCausalLM from its
    LagunaConfig defaults with 64 query heads on the 30 sliding-window layers and 48 on the 10 full
    ones builds 33,442,617,088 parameters (`import hf`'s meta build, rebuilt small in
    tests/integration/transformers/); moeplan counts them but the 39 x 256 router correction biases,
    a buffer in Megatron."""
    from planner.config.loader import load_config

    cfg = load_config(Path(__file__).parents[3] / "examples" / "architectures" / "laguna-xs.2-16.yaml")
    assert cfg.model.window_num_attention_heads == 64 and cfg.model.num_attention_heads == 48
    assert cfg.model.layer_mixers.count("window") == 30
    size = model_size(cfg)
    assert size is not None and size.total_params == 33_442_617_088 - 39 * 256


def test_the_mimo_v2_flash_example_is_counted_as_transformers_builds_it():
    """examples/architectures/mimo-v2-flash-256.yaml: transformers 5.25's MiMoV2FlashForCausalLM
    from MiMo-V2-Flash's config.json (the corpus's stored copy) builds 308,778,768,832 parameters
    (`import hf`'s meta build, rebuilt small in tests/integration/transformers/): 39 sliding-window
    layers with 8 KV heads and sinks, 9 full ones with 4, values of 128 beside q/k heads of 192."""
    from planner.config.loader import load_config

    cfg = load_config(Path(__file__).parents[3] / "examples" / "architectures" / "mimo-v2-flash-256.yaml")
    m = cfg.model
    assert (m.num_query_groups, m.window_num_query_groups, m.kv_channels, m.v_head_dim) == (4, 8, 192, 128)
    assert m.layer_mixers.count("window") == 39 and m.full_attention_softmax_type == "vanilla"
    size = model_size(cfg)
    assert size is not None and size.total_params == 308_778_768_832
    assert (size.active_params, size.mtp_params) == (15_445_924_288, 0)
    # the verbatim file (tests/support/hf_corpus.py) builds the same count in transformers
    assert size.total_params == NO_RECORD_COUNTS["mimo-v2-flash"]


def test_qwen3_5_397b_a17b_is_counted_as_transformers_builds_it():
    """Qwen3.5-397B-A17B: no verbatim file at hand, so the 35B-A3B file with the published sizes
    (hidden 4096, 60 layers of which every 4th full attention, 32 heads, 2 KV heads, 64 DeltaNet
    value heads, 512 experts of 1024 top-10, a shared expert of 1024, vision out 4096);
    transformers 5.25's Qwen3_5MoeForConditionalGeneration built on the meta device from it holds
    396,346,350,336 parameters in its language model and lm_head (vision tower 456,010,480 more)."""
    hf = corpus_config("qwen3.5-35b-a3b")
    hf["text_config"].update(
        hidden_size=4096, num_hidden_layers=60, num_attention_heads=32, num_key_value_heads=2,
        linear_num_value_heads=64, num_experts=512, num_experts_per_tok=10,
        moe_intermediate_size=1024, shared_expert_intermediate_size=1024,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 15)
    hf["vision_config"]["out_hidden_size"] = 4096
    mapping = map_hf_config(hf)
    assert _size(mapping.model, mapping.moe) == (396_346_350_336, 17_349_040_896, 0)


def test_the_step_3_5_flash_example_is_counted_as_transformers_builds_it():
    """examples/architectures/step-3.5-flash-96.yaml: transformers 5.25's Step3p7TextModel (it has
    no causal-LM class for step3p5) with its untied output layer, from a file of Step-3.5-Flash's
    published dimensions, holds 196,956,118,272 parameters (rebuilt small in
    tests/integration/transformers/): 33 sliding-window layers of 96 query heads, 12 full of 64."""
    from planner.config.loader import load_config

    cfg = load_config(Path(__file__).parents[3] / "examples" / "architectures" / "step-3.5-flash-96.yaml")
    assert (cfg.model.num_attention_heads, cfg.model.window_num_attention_heads) == (64, 96)
    assert cfg.model.layer_mixers.count("window") == 33
    size = model_size(cfg)
    assert size is not None and size.total_params == 196_956_118_272


def test_the_gemma_4_example_is_counted_as_transformers_builds_it():
    """examples/architectures/gemma-4-26b-a4b-32.yaml: transformers 5.25's
    Gemma4ForConditionalGeneration from Gemma-4 26B-A4B's config.json (the corpus's stored copy)
    holds 25,233,141,760 parameters in its text stack (rebuilt small in
    tests/integration/transformers/): 25 sliding-window layers of head width 256 with 8 KV heads,
    5 full ones of 512 with 2 whose V is their K, a dense MLP beside 128 experts on every layer."""
    from planner.config.loader import load_config

    cfg = load_config(Path(__file__).parents[3] / "examples" / "architectures" / "gemma-4-26b-a4b-32.yaml")
    m = cfg.model
    assert (m.kv_channels, m.window_kv_channels, m.num_query_groups, m.window_num_query_groups) == (
        512, 256, 2, 8)
    assert m.attention_k_eq_v and m.post_sublayer_norms and m.moe_branch_norms
    assert m.layer_mixers.count("window") == 25
    size = model_size(cfg)
    assert size is not None and (size.total_params, size.active_params) == (25_233_141_760, 3_822_530_560)
    assert size.total_params == NO_RECORD_COUNTS["gemma-4-26b-a4b"]  # the verbatim file's build


def test_the_minimax_m3_example_is_its_verbatim_file_counted_as_transformers_builds_it():
    """examples/architectures/minimax-m3-256.yaml is `import hf` of the verbatim MiniMax-M3 file
    (tests/support/hf_corpus.py NO_RECORD_COUNTS): its 57 block-sparse layers' indexers included,
    moeplan counts transformers 5.25's text stack to the parameter."""
    from planner.config.loader import load_config

    cfg = load_config(Path(__file__).parents[3] / "examples" / "architectures" / "minimax-m3-256.yaml")
    assert cfg.model.layer_mixers.count("block_sparse") == 57
    assert (cfg.model.index_n_heads, cfg.model.index_head_dim, cfg.model.index_topk_blocks) == (
        4, 128, 16)
    size = model_size(cfg)
    assert size is not None and size.total_params == NO_RECORD_COUNTS["minimax-m3"]


def test_qwen3_5_397b_is_counted_as_transformers_builds_it():
    # The 397B file (a stored copy: tests/support/hf_config_files/SOURCES.txt): 60 layers, one
    # full-attention layer in four, 512 experts of 1024, top-10, a gated shared expert of 1024.
    # Activated = total less 60 layers x 502 unreached experts x 3 x 4096 x 1024 (transformers'
    # Qwen3_5MoeExperts: gate_up_proj 2 x 1024 x 4096 and down_proj 4096 x 1024 per expert).
    mapping = map_hf_config(corpus_config("qwen3.5-397b-a17b"))
    total, active, _ = _size(mapping.model)
    assert total == TRANSFORMERS_COUNTS["qwen3.5-397b-a17b"]
    assert active == total - 60 * 502 * 3 * 4096 * 1024
    assert mapping.model["linear_num_value_heads"] == 64 and mapping.model["num_experts"] == 512


def test_the_held_out_recent_files_are_counted_as_transformers_builds_them():
    """Sixteen recent config.json files added after the records were written, no code changed for
    them (tests/support/hf_corpus.py HELD_OUT): the ones a record maps count exactly as
    transformers 5.25's meta build, total and activated; the no-record ones (MiMo-V2-Flash,
    Gemma-4) go to the meta path (tests/integration/transformers/ rebuilds them); GLM-5.2's
    shared indexers map to Megatron's top-k sharing. 16 of 16 are counted exactly."""
    from tests.support.hf_corpus import HELD_OUT_ACTIVATED, REFUSED

    exact = 0
    for name in HELD_OUT:
        hf = corpus_config(name)
        if name in REFUSED:
            with pytest.raises(HfConfigUnmappable) as refused:
                map_hf_config(hf)
            assert [f.path for f in refused.value.findings] == [
                f"model.hf_config.{REFUSED[name][1]}"]
            continue
        if name in NO_RECORD_COUNTS:  # no record: the meta build maps it
            assert hf["model_type"] not in {family.model_type for family in FAMILIES}
            exact += 1
            continue
        mapping = map_hf_config(hf)
        total, active, _ = _size(mapping.model, mapping.moe)
        assert (total, active) == (TRANSFORMERS_COUNTS[name], HELD_OUT_ACTIVATED[name]), name
        exact += 1
    assert len(HELD_OUT) == 16 and exact == 16 and not REFUSED


def test_glm_5_2s_shared_indexers_are_megatrons_top_k_sharing():
    """GLM-5.2's indexer_types: layers 0-2 'full', then one 'full' in four (6, 10, ..., 74), the
    rest 'shared': Megatron's dsa_indexer_topk_freq 4 with dsa_indexer_skip_topk_offset 3 (the
    file's own index_topk_freq / index_skip_topk_offset) computes on 1-based layers 1-3 and
    7, 11, ..., 75 (max(n - 3, 0) % 4 == 0). 21 indexers instead of 78: transformers' 743,377,000,704
    are GLM-5.1's 743,911,199,232 less 57 indexers of 32·128·2048 + 6144·128 + 2·128 + 6144·32
    (9,371,904 each). The MTP layer is Megatron's layer 79, a computing one: GLM-5.1's MTP count."""
    mapping = map_hf_config(corpus_config("glm-5.2"))
    model = mapping.model
    assert (model["dsa_indexer_topk_freq"], model["dsa_indexer_skip_topk_offset"]) == (4, 3)
    cfg = Config.model_validate({"model": model, "parallel": {"world_size": 1},
                                 "training": {"seq_length": 16}})
    computing = [i for i in range(78) if cfg.model.dsa_computes_topk(i)]
    assert computing == [0, 1, 2, *range(6, 78, 4)] and len(computing) == 21
    assert cfg.model.dsa_computes_topk(78)  # the MTP layer
    indexer = 32 * 128 * 2048 + 6144 * 128 + 2 * 128 + 6144 * 32
    total, active, mtp = _size(model, mapping.moe)
    assert total == TRANSFORMERS_COUNTS["glm-5.1"] - 57 * indexer == TRANSFORMERS_COUNTS["glm-5.2"]
    assert active == 41_250_511_104 and mtp == 9_952_920_320
    # without the file's own pair, the pattern alone gives the same one
    bare = {k: v for k, v in corpus_config("glm-5.2").items()
            if k not in ("index_topk_freq", "index_skip_topk_offset")}
    assert map_hf_config(bare).model["dsa_indexer_topk_freq"] == 4
    # and a file with only index_topk_freq (no indexer_types) takes transformers' default offset 2
    freq_only = {**bare, "index_topk_freq": 2}
    del freq_only["indexer_types"]
    shared = map_hf_config(freq_only).model
    assert (shared["dsa_indexer_topk_freq"], shared["dsa_indexer_skip_topk_offset"]) == (2, 2)


def test_kimi_linear_is_kda_among_mla_layers_as_transformers_builds_it():
    """Kimi-Linear-48B-A3B's config.json (tests/support/hf_configs.py KIMI_LINEAR): KDA on the
    layers linear_attn_config lists (1-based), MLA on 4, 8, ..., 24 and 27, one dense layer, and
    the total and activated counts of transformers 5.25's meta build (measured as
    tests/support/hf_sweep.py transformers_counts does; the sweep rebuilds a shrunk kimi_linear in
    tests/integration/transformers/test_family_sweep.py); the example is this import."""
    from planner.config.loader import load_config

    mapping = map_hf_config(KIMI_LINEAR)
    full = KIMI_LINEAR["linear_attn_config"]["full_attn_layers"]
    assert mapping.model["kda_layers"] == [int(i + 1 not in full) for i in range(27)]
    assert mapping.model["moe_layer_freq"] == [0] + [1] * 26
    assert (mapping.model["kda_num_heads"], mapping.model["kda_head_dim"],
            mapping.model["linear_conv_kernel_dim"]) == (32, 128, 4)
    assert _size(mapping.model, mapping.moe) == (49_122_675_072, 3_484_453_248, 0)
    assert "michal2409/Megatron-Bridge@269a192c" in mapping.notes[-1]
    example = Path(__file__).parents[3] / "examples" / "architectures" / "kimi-linear-48b-a3b-32.yaml"
    assert ModelSection.model_validate(mapping.model) == load_config(example).model


@pytest.mark.parametrize(("change", "key"), [
    ({"mla_use_output_gate": True}, "mla_use_output_gate"),
    ({"routed_expert_hidden_size": 3584}, "routed_expert_hidden_size"),
    ({"linear_attn_config": {**KIMI_LINEAR["linear_attn_config"], "use_full_rank_gate": True}},
     "linear_attn_config.use_full_rank_gate"),
    ({"linear_attn_config": {**KIMI_LINEAR["linear_attn_config"], "full_attn_layers": [0, 28]}},
     "linear_attn_config.full_attn_layers"),
])
def test_kimi_linear_keys_transformers_would_not_build_are_refused_by_key(change: dict[str, object],
                                                                          key: str):
    """A kimi_linear file of a later stack (Kimi-K3's keys) is another network than the one
    transformers 5.25 builds from it: refused naming the key, never counted as Kimi-Linear."""
    with pytest.raises(HfConfigUnmappable) as refused:
        map_hf_config({**KIMI_LINEAR, **change})
    assert any(f.path.endswith(f".{key}") for f in refused.value.findings), refused.value.findings

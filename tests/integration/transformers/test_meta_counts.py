"""transformers builds each verbatim config.json on the meta device (no memory, no weights) and
its parameter count is the one tests/support/hf_corpus.py records, which the unit tests hold
moeplan's count to. Skipped where transformers is not installed (it is pinned in the `test` extra).

Only DeepSeek-V4-Flash is rebuilt here (the article's model; about 5 CPU-seconds, most of it
importing torch and transformers): every build costs 0.5-4 s more, over the suite's time budget.
The other recorded counts were measured the same way; name a file in REBUILT to re-check it.
The no-record path of `import hf` (planner/commands/hf_meta.py) maps ERNIE-4.5-21B-A3B from its
modules, OLMoE-1B-7B's whole-width q/k norms as moeplan's per-layer q/k norm, and refuses Jamba's
Mamba-1 mixer by module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from tests.support.hf_corpus import NO_RECORD_COUNTS, TRANSFORMERS_COUNTS, corpus_path
from tests.support.paths import EXAMPLES

REBUILT = ("deepseek-v4-flash",)


@pytest.mark.parametrize("name", REBUILT)
def test_transformers_meta_build_has_the_recorded_count(name: str):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    data = json.loads(corpus_path(name).read_text("utf-8"))
    data.pop("quantization_config", None)  # the released weights' format, not the network
    config = transformers.AutoConfig.for_model(**data)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == TRANSFORMERS_COUNTS[name]


# baidu/ERNIE-4.5-21B-A3B-PT config.json (Hugging Face model repository): the keys transformers'
# Ernie4_5_MoeConfig reads (one dense layer, then 27 MoE layers of 64 experts of 1536, top-6, two
# shared experts, GQA 20/4 heads of 128, tied embeddings).
ERNIE_4_5_21B_A3B = {
    "architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe",
    "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 12288,
    "max_position_embeddings": 131072, "moe_intermediate_size": 1536, "moe_k": 6,
    "moe_layer_end_index": 27, "moe_layer_interval": 1, "moe_layer_start_index": 1,
    "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_norm_min": 1e-12,
    "num_attention_heads": 20, "num_hidden_layers": 28, "num_key_value_heads": 4, "head_dim": 128,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True, "use_bias": False,
    "vocab_size": 103424,
}


def _import(tmp_path: Path, hf: dict[str, object]) -> dict[str, object]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf), "utf-8")
    result = CliRunner().invoke(app, ["import", "hf", str(path), "--json", "--world-size", "64",
                                      "--ep", "8", "--tp", "2"])
    assert result.exit_code in (0, 1), result.output
    payload: dict[str, object] = json.loads(result.output)
    return payload


def test_a_model_type_without_a_record_is_mapped_from_transformers_modules(tmp_path: Path):
    # ERNIE-4.5-MoE has no moeplan record: import hf builds it on the meta device, maps every
    # layer by class and shape (GQA attention, one dense SwiGLU layer, MoE with two shared experts)
    # and counts it as transformers does, naming the router's correction bias (a parameter there,
    # a buffer in Megatron) and the routing Megatron cannot reproduce (bias on softmax scores).
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    payload = _import(tmp_path, ERNIE_4_5_21B_A3B)
    model = payload["config"]["model"]  # type: ignore[index]
    assert model["num_query_groups"] == 4 and model["kv_channels"] == 128
    assert model["moe_layer_freq"] == [0] + [1] * 27 and model["num_experts"] == 64
    assert model["moe_shared_expert_intermediate_size"] == 2 * 1536
    assert model["moe_router_topk"] == 6 and model["moe_router_score_function"] == "softmax"
    assert "moe_router_enable_expert_bias" not in model
    census, *rest = payload["notes"]  # type: ignore[misc]
    # transformers' own sum over the built model, then moeplan's count of the mapped section
    assert "Ernie4_5_MoeForCausalLM with 21,825,437,888 parameters" in census
    assert "moeplan counts 21,825,436,160 + 1,728 router correction-bias parameters" in census
    # no moeplan record, but Megatron-Bridge has a bridge for it: named with its source
    assert str(payload["bridge"]).startswith("model_type ernie4_5_moe has no moeplan family record; "
                                             "Megatron-Bridge trains it with Ernie45Bridge (")
    assert any("Megatron's expert bias takes sigmoid or sqrtsoftplus" in note for note in rest)
    # the one numeric key no module shape says and moeplan does not carry is named, not dropped
    assert any(note.endswith("does not read (numerics moeplan does not carry into the launch; "
                             "check them against Megatron's arguments): moe_norm_min=1e-12")
               for note in rest)


# allenai/OLMoE-1B-7B-0924's dimensions (transformers 5.25 OlmoeConfig's defaults but its 1,024-wide
# experts): 16 layers of 16 heads at 2,048, 64 experts of top-8, vocabulary 50,304, untied.
OLMOE_1B_7B = {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 2048,
               "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
               "num_key_value_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
               "vocab_size": 50304, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def test_whole_width_qk_norms_map_to_the_per_layer_norm_and_are_warned(tmp_path: Path):
    # OLMoE normalises q (hidden_size wide) and k (KV heads x head_dim) over every head at once, as
    # MiniMax-M2 does: model.qk_layernorm_per_layer, counted exactly; Megatron's qk_layernorm is
    # per head, so it is warned, and Megatron-Bridge's own OLMoE attention is named.
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(OLMOE_1B_7B), "utf-8")
    result = CliRunner().invoke(app, ["import", "hf", str(path), "--json"])
    assert result.exit_code in (0, 1), result.output
    payload = json.loads(result.output)
    census, *rest = payload["notes"]
    # 2 x 50,304 x 2,048 + 16 x (4 x 2,048^2 + 2 x 2,048 q/k norms + 2 x 2,048 pre-norms
    # + 64 x 2,048 router + 64 x 3 x 2,048 x 1,024 experts) + 2,048 = 6,919,161,856
    assert "OlmoeForCausalLM with 6,919,161,856 parameters" in census
    assert census.endswith("moeplan counts 6,919,161,856, as transformers does"), census
    model = payload["config"]["model"]
    assert model["qk_layernorm"] is model["qk_layernorm_per_layer"] is True
    assert any("Megatron's qk_layernorm normalises each head" in note for note in rest)
    assert "OlMoEBridge (src/megatron/bridge/models/olmoe/olmoe_bridge.py" in str(payload["bridge"])


def test_a_module_without_a_layer_kind_is_refused_by_class_and_layer(tmp_path: Path):
    # Jamba's Mamba-1 mixer is no moeplan layer kind: refused naming the module, its class and
    # its layer.
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    hf = {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 64,
          "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256,
          "attn_layer_offset": 1, "attn_layer_period": 2, "expert_layer_offset": 1,
          "expert_layer_period": 2, "use_mamba_kernels": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf), "utf-8")
    result = CliRunner().invoke(app, ["import", "hf", str(path), "--json"])
    assert result.exit_code == 1
    messages = [f["message"] for f in json.loads(result.output)["findings"]]
    [census] = [m for m in messages if "transformers" in m]
    assert "JambaForCausalLM with" in census and "(2 decoder layers)" in census
    assert "layer 0: model.layers.0.mamba (JambaMambaMixer)" in census


def test_every_part_megatron_does_not_build_is_named_in_one_refusal():
    # HY-V4 (transformers 5.25 HYV4Config's layer program at toy widths): DeepSeek-V3.2's DSA whose
    # MLA also carries an output gate and per-head sinks, in a layer with hyper-connections of 2N
    # mixes (Megatron's mHC has N² + 2N): each named with what it is, in one finding.
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from planner.commands.hf_meta import meta_import
    from tests.support.hf_sweep import shrunk

    built = meta_import(shrunk("hy_v4"), "config.json")
    assert built is not None and built.mapping is None
    [finding] = built.findings
    assert "layer 0: model.layers.0.self_attn (HYV4Attention) is multi-latent attention (4 heads, " \
        "q latent 32, kv latent 16, q/k head 16 + RoPE 8, value head 16)" in finding.message
    for part in ("gate_proj (Linear): an output gate, one per value channel (4 x 16)",
                 "indexer (HYV4Indexer): a DeepSeek-V3.2 DSA lightning indexer",
                 "sinks: one learnable sink logit per head",
                 "attn_hc and ffn_hc (HYV4HyperConnection): hyper-connections of 4 residual "
                 "streams with pre and post mixes only", "maps 4·hidden to 24"):
        assert part in finding.message, part


def test_longcat_flash_is_counted_exactly_with_its_dynamic_activation_named(tmp_path: Path):
    # LongcatFlashConfig's defaults are LongCat-Flash-Chat's dimensions (transformers 5.25): 28
    # layers of two MLA sub-layers and two dense MLPs of 12,288 with one shortcut MoE of 512 experts
    # of 2,048 and 256 zero-computation experts, top-12, vocabulary 131,072 untied.
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    payload = _import(tmp_path, {"architectures": ["LongcatFlashForCausalLM"],
                                 "model_type": "longcat_flash"})
    census, *rest = payload["notes"]  # type: ignore[misc]
    # per pair: 2 MLA (q 6,144 x 1,536 + 1,536 + 1,536 x 64 x 192, kv 6,144 x 576 + 512
    # + 512 x 64 x 256, o 8,192 x 6,144) + 2 dense MLPs (3 x 6,144 x 12,288) + 4 norms of 6,144
    # + router (512 + 256) x 6,144 + 512 x 3 x 6,144 x 2,048; 28 pairs, 2 x 131,072 x 6,144, a
    # final norm: 560,664,958,976
    assert "LongcatFlashForCausalLM with 560,664,958,976 parameters" in census
    assert census.endswith("moeplan counts 560,664,958,976, as transformers does"), census
    model = payload["config"]["model"]  # type: ignore[index]
    assert model["num_layers"] == 56 and model["moe_layer_freq"] == [1, 0] * 28
    assert model["moe_zero_experts"] == 256 and model["moe_shortcut"] is True
    assert model["moe_shared_expert_intermediate_size"] == model["ffn_hidden_size"] == 12288
    [dynamic] = [note for note in rest if "zero-computation experts" in note]
    assert "moeplan prices the static upper bound, every pick a computing expert" in dynamic
    assert "is not priced" in dynamic
    assert any("shortcut MoE" in note for note in rest)
    assert "no bridge for it known here" in str(payload["bridge"])


# The no-record corpus files (tests/support/hf_corpus.py NO_RECORD_COUNTS) rebuilt here: the held-out
# MiMo-V2-Flash and Gemma-4 files (under a CPU-second together once torch is loaded), not MiniMax-M3,
# whose first build costs ~5 CPU-seconds (loading its modeling code) and ~7 for the whole file;
# name one to re-check that it maps and counts as transformers builds it.
NO_RECORD_REBUILT: tuple[str, ...] = ("mimo-v2-flash", "gemma-4-26b-a4b")
NO_RECORD_EXAMPLES = {"mimo-v2-flash": "mimo-v2-flash-256", "gemma-4-26b-a4b": "gemma-4-26b-a4b-32"}


@pytest.mark.parametrize("name", NO_RECORD_REBUILT)
def test_a_verbatim_file_without_a_record_is_mapped_and_counted_exactly(name: str):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    result = CliRunner().invoke(app, ["import", "hf", str(corpus_path(name)), "--json"])
    assert result.exit_code in (0, 1), result.output
    payload = json.loads(result.output)
    census = payload["notes"][0]
    assert f"with {NO_RECORD_COUNTS[name]:,} parameters in its text stack" in census
    assert census.endswith(f"moeplan counts {NO_RECORD_COUNTS[name]:,}, as transformers does"), census
    if name in NO_RECORD_EXAMPLES:  # the family's example is this file's import, field for field
        from planner.config.loader import load_config
        from planner.config.schema import ModelSection

        example = load_config(EXAMPLES / "architectures" / f"{NO_RECORD_EXAMPLES[name]}.yaml")
        assert ModelSection.model_validate(payload["config"]["model"]) == example.model


def test_window_layers_with_their_own_query_heads_are_counted_as_transformers_builds_them(
        tmp_path: Path):
    # Laguna-XS.2's layer-wise attention budgeting, shrunk: 8 query heads on the sliding-window
    # layers, 4 on the full ones, 2 KV heads of 16 throughout, a per-head gate; transformers' own
    # meta build is the count moeplan must reach (its window_num_attention_heads layer kind)
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    hf = {"architectures": ["LagunaForCausalLM"], "model_type": "laguna", "hidden_size": 64,
          "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "layer_types": types, "sliding_window": 8,
          "num_attention_heads_per_layer": [4, 8, 8, 4], "num_experts": 4,
          "num_experts_per_tok": 2, "moe_intermediate_size": 32,
          "shared_expert_intermediate_size": 32, "vocab_size": 256}
    payload = _import(tmp_path, hf)
    model = payload["config"]["model"]  # type: ignore[index]
    assert (model["num_attention_heads"], model["window_num_attention_heads"]) == (4, 8)
    assert model["window_attn_skip_freq"] == [0, 1, 1, 0] and model["window_size"] == [7, 0]
    census = payload["notes"][0]  # type: ignore[index]
    assert "every layer maps to moeplan's layer kinds by class and shape" in census, census
    assert census.endswith("as transformers does")


def test_mimo_v2_flash_attention_is_counted_as_transformers_builds_it(tmp_path: Path):
    # MiMo-V2-Flash, shrunk, in the hub's spelling: values of 8 beside q/k heads of 16, twice the
    # KV heads and the only sinks on the sliding-window layers, one dense layer then MoE;
    # transformers' own meta build is the count moeplan must reach (layer kinds value_dim,
    # window_kv, window_sinks)
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    hf = {"architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash",
          "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6,
          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "v_head_dim": 8,
          "swa_num_key_value_heads": 2, "hybrid_layer_pattern": [0, 1, 1, 1, 1, 0],
          "add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False,
          "sliding_window_size": 8, "n_routed_experts": 4, "num_experts_per_tok": 2,
          "moe_intermediate_size": 32, "scoring_func": "sigmoid", "vocab_size": 256,
          # the hub file's nulls (Megatron-Bridge's MiMo-V2-Flash test config spells them so):
          # transformers 5.25 fails on a null rope_scaling, which means no scaling
          "rope_scaling": None, "n_shared_experts": None, "routed_scaling_factor": None}
    payload = _import(tmp_path, hf)
    model = payload["config"]["model"]  # type: ignore[index]
    assert (model["kv_channels"], model["v_head_dim"]) == (16, 8)
    assert (model["num_query_groups"], model["window_num_query_groups"]) == (1, 2)
    assert (model["softmax_type"], model["full_attention_softmax_type"]) == ("learnable", "vanilla")
    assert model["window_attn_skip_freq"] == [0, 1, 1, 1, 1, 0] and model["window_size"] == [8, 0]
    census = payload["notes"][0]  # type: ignore[index]
    assert "every layer maps to moeplan's layer kinds by class and shape" in census, census
    assert census.endswith("as transformers does")


def test_a_text_config_without_a_head_class_is_built_bare_and_counted_with_its_output_layer(
        tmp_path: Path):
    # Step-3.5-Flash's own file (model_type step3p5), shrunk, in the hub's spelling: transformers
    # 5.25 maps it to Step3p7TextConfig and registers no causal LM for it, so import hf builds
    # Step3p7TextModel and adds the untied output layer (vocab x hidden) every causal LM of it has;
    # 6 query heads on the sliding-window layers, 4 on the full ones, a per-head gate
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    hf = {"architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5", "hidden_size": 64,
          "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_attention_groups": 2, "head_dim": 16, "vocab_size": 256, "layer_types": types,
          "sliding_window": 8, "moe_layers_enum": "1,2,3", "moe_num_experts": 4, "moe_top_k": 2,
          "moe_intermediate_size": 32, "share_expert_dim": 32, "use_head_wise_attn_gate": True,
          "attention_other_setting": {"attention_type": "sliding_attention",
                                      "num_attention_heads": 6, "num_attention_groups": 2,
                                      "head_dim": 16}}
    payload = _import(tmp_path, hf)
    model = payload["config"]["model"]  # type: ignore[index]
    assert (model["num_attention_heads"], model["window_num_attention_heads"]) == (4, 6)
    assert model["moe_layer_freq"] == [0, 1, 1, 1] and model["head_wise_attn_gate"]
    census = payload["notes"][0]  # type: ignore[index]
    assert "builds Step3p7TextModel with" in census and "untied output layer of 16,384" in census
    assert census.endswith("as transformers does"), census


def test_gemma4_moe_is_counted_as_transformers_builds_it(tmp_path: Path):
    # Gemma-4 26B-A4B's layer shapes, shrunk: full-attention layers of head width 32 with 1 KV
    # head and no v_proj (attention_k_eq_v), sliding-window layers of 16 with 2 KV heads, q/k norms
    # and a weightless v norm, sandwich norms, and on every layer a dense GELU MLP beside a
    # router (input and per-expert scales) and experts with norms of their own; transformers' own
    # meta build is the count moeplan must reach
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    text = {"model_type": "gemma4_text", "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_global_key_value_heads": 1, "head_dim": 16, "global_head_dim": 32,
            "attention_k_eq_v": True, "enable_moe_block": True, "num_experts": 4,
            "top_k_experts": 2, "moe_intermediate_size": 32, "sliding_window": 8,
            "vocab_size": 256, "vocab_size_per_layer_input": 256, "hidden_size_per_layer_input": 0,
            "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh"}
    hf = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", **text}
    payload = _import(tmp_path, hf)
    model = payload["config"]["model"]  # type: ignore[index]
    assert (model["kv_channels"], model["window_kv_channels"]) == (32, 16)
    assert (model["num_query_groups"], model["window_num_query_groups"]) == (1, 2)
    assert model["attention_k_eq_v"] and model["post_sublayer_norms"] and model["moe_branch_norms"]
    assert model["moe_shared_expert_intermediate_size"] == 96 and model["moe_layer_freq"] == 1
    census = payload["notes"][0]  # type: ignore[index]
    assert "every layer maps to moeplan's layer kinds by class and shape" in census, census
    assert census.endswith("as transformers does")


def test_a_wrappers_text_keys_written_at_its_top_level_are_refused_by_name():
    # A flat summary of Step-3.7-Flash's text stack under the wrapper's model_type step3p7
    # (tests/support/hf_config_files/SOURCES.txt): Step3p7Config reads its text stack from
    # text_config only, so transformers builds its defaults (every layer full attention, another
    # vocabulary); import hf refuses, naming the keys the wrapper ignores, never that other model.
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    result = CliRunner().invoke(app, ["import", "hf", str(corpus_path("step-3.7-flash-summary")),
                                      "--json"])
    assert result.exit_code == 1, result.output
    messages = [f["message"] for f in json.loads(result.output)["findings"]]
    [stray] = [m for m in messages if "at its top level" in m]
    assert "the file states vocab_size, max_position_embeddings, sliding_window, layer_types" in stray
    assert "where Step3p7Config does not read them" in stray


@pytest.mark.parametrize(("layers", "change"), [
    (11, {"index_topk_freq": 4, "index_skip_topk_offset": 3}),  # GLM-5.2's pair, no list given
    (6, {"indexer_types": ["full", "shared"] * 3}),  # a list alone: Megatron's freq 2, offset 1
])
def test_shared_dsa_indexers_are_counted_as_transformers_builds_them(layers: int,
                                                                     change: dict[str, object]):
    """GLM-5.2 at toy widths (tests/support/hf_sweep.py's shrink): transformers' GlmMoeDsaConfig
    resolves the indexer program from the list or from the pair (its default offset 2), builds an
    indexer on the 'full' layers only, and moeplan's count of the mapped Megatron pair is its
    count, total and activated."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.support.hf_corpus import corpus_config
    from tests.support.hf_sweep import _shrink, moeplan_counts, transformers_counts

    hf = {k: v for k, v in _shrink(corpus_config("glm-5.2")).items()
          if k not in ("indexer_types", "mlp_layer_types")}
    hf.update(num_hidden_layers=layers, **change)
    config = transformers.AutoConfig.for_model(**{k: v for k, v in hf.items() if k != "architectures"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert "shared" in config.indexer_types
    assert moeplan_counts(hf) == ("record", transformers_counts(model))

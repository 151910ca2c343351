"""The no-record path's attention reader (planner/config/importers/hf_modules.py) on duck-typed
modules, without torch: projection shapes Megatron's SelfAttention cannot build are refused with
what the widths say instead (a head count of the layer's own, a value head dim apart from the q/k
one), naming the layer and the module's class."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from planner.config.importers.hf_modules import (
    Attention,
    Layer,
    ModelRead,
    Moe,
    Unpriced,
    _attention,
    model_section,
)


class _Tensor:
    def __init__(self, *shape: int) -> None:
        self.shape = shape


class _Module:
    def __init__(self, params: dict[str, _Tensor] | None = None, **children: _Module) -> None:
        self._params, self._children = params or {}, children

    def named_parameters(self, recurse: bool = True) -> Iterator[tuple[str, _Tensor]]:
        yield from self._params.items()
        if recurse:
            for child in self._children.values():
                yield from child.named_parameters()

    def parameters(self) -> Iterator[_Tensor]:
        return (p for _, p in self.named_parameters())

    def named_children(self) -> Iterator[tuple[str, Any]]:
        yield from self._children.items()


class LagunaAttention(_Module):
    pass


class MiMoV2FlashAttention(_Module):
    pass


def _linear(inp: int, out: int) -> _Module:
    return _Module({"weight": _Tensor(out, inp)})


def _layer(cls: type[_Module], hidden: int, q: int, k: int, v: int, o: int) -> _Module:
    return cls(q_proj=_linear(hidden, q), k_proj=_linear(hidden, k), v_proj=_linear(hidden, v),
               o_proj=_linear(o, hidden))


def test_a_layer_with_its_own_query_head_count_is_read_with_it():
    # Laguna-XS.2's layer-wise attention budgeting: 64 query heads of 128 on a sliding-window
    # layer, 48 in the config (its full-attention layers), the same 8 KV heads
    module = _layer(LagunaAttention, 2048, 64 * 128, 8 * 128, 8 * 128, 64 * 128)
    attention = _attention(module, 2048, 48, 128, 1, "model.layers.1.self_attn")
    assert (attention.heads, attention.groups, attention.head_dim) == (64, 8, 128)


def _read(heads: list[int]) -> ModelRead:
    layers = [Layer(Attention(h, 2, 16, False, True, "head"), None, Moe(4, 32, 0, False, False, "softmax"))
              for h in heads]
    return ModelRead(256, 64, False, layers, 0)


def _text(types: list[str]) -> SimpleNamespace:
    return SimpleNamespace(layer_types=types, sliding_window=8, num_experts_per_tok=2)


def test_sliding_window_layers_of_their_own_head_count_map_to_window_num_attention_heads():
    types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    model, _, _ = model_section(_read([4, 8, 8, 4]), _text(types))
    assert (model["num_attention_heads"], model["window_num_attention_heads"]) == (4, 8)
    assert model["window_attn_skip_freq"] == [0, 1, 1, 0]
    # a full-attention layer with another count is no window layer: refused, naming it
    with pytest.raises(ValueError, match="layer 3's attention .* differs from layer 0's .* "
                                         "\\(8 query heads where the other layers have 4"):
        model_section(_read([4, 8, 8, 8]), _text(types))


def test_a_value_head_dim_apart_from_the_q_k_one_is_read_with_it():
    # MiMo-V2-Flash's full-attention layer: 64 q/k heads of 192, 4 KV heads, values of 128
    # (model.v_head_dim beside kv_channels, Megatron-Bridge's MiMoV2FlashSelfAttention)
    module = _layer(MiMoV2FlashAttention, 4096, 64 * 192, 4 * 192, 4 * 128, 64 * 128)
    attention = _attention(module, 4096, 64, 192, 0, "model.layers.0.self_attn")
    assert (attention.heads, attention.groups, attention.head_dim, attention.v_dim) == \
        (64, 4, 192, 128)
    # an o_proj that reads another width than the values' is still refused, naming the widths
    with pytest.raises(Unpriced, match="has q 12288, k 768, v 512, o 12288"):
        _attention(_layer(MiMoV2FlashAttention, 4096, 64 * 192, 4 * 192, 4 * 128, 64 * 192), 4096,
                   64, 192, 0, "model.layers.0.self_attn")


def test_window_layers_of_their_own_kv_groups_and_sinks_map_to_their_fields():
    # MiMo-V2-Flash: its sliding-window layers have twice the full layers' KV heads and the only
    # sinks; a full layer with them is refused, naming it
    def read(groups: list[int], sinks: list[bool]) -> ModelRead:
        return ModelRead(256, 64, False, [
            Layer(Attention(4, g, 16, False, False, "", s, 8), None,
                  Moe(4, 32, 0, False, False, "softmax")) for g, s in zip(groups, sinks, strict=True)], 0)
    types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    model, _, _ = model_section(read([1, 2, 2, 1], [False, True, True, False]), _text(types))
    assert (model["num_query_groups"], model["window_num_query_groups"]) == (1, 2)
    assert (model["softmax_type"], model["full_attention_softmax_type"]) == ("learnable", "vanilla")
    assert (model["kv_channels"], model["v_head_dim"]) == (16, 8)
    with pytest.raises(ValueError, match="layer 3's attention .* differs from layer 0's"):
        model_section(read([1, 2, 2, 2], [False, True, True, True]), _text(types))


def test_the_shape_megatron_builds_is_read():
    attention = _attention(_layer(_Module, 64, 4 * 16, 2 * 16, 2 * 16, 4 * 16), 64, 4, 16, 0, "a")
    assert (attention.heads, attention.groups, attention.head_dim) == (4, 2, 16)


class Mistral4Attention(_Module):
    pass


class _RMSNorm(_Module):
    pass


def _mla_module(hidden: int, heads: int, q_rank: int, kv_rank: int, nope: int, rope: int,
                v: int, **extra: _Module) -> _Module:
    query = ({"q_a_proj": _linear(hidden, q_rank), "q_b_proj": _linear(q_rank, heads * (nope + rope)),
              "q_a_layernorm": _RMSNorm({"weight": _Tensor(q_rank)})} if q_rank else
             {"q_proj": _linear(hidden, heads * (nope + rope))})
    return Mistral4Attention(**query, kv_a_proj_with_mqa=_linear(hidden, kv_rank + rope),
                             kv_a_layernorm=_RMSNorm({"weight": _Tensor(kv_rank)}),
                             kv_b_proj=_linear(kv_rank, heads * (nope + v)),
                             o_proj=_linear(heads * v, hidden), **extra)


def test_multi_latent_attention_is_read_off_its_projection_shapes():
    # Mistral-Small-4's MLA at its published widths (32 heads, q latent 1024, kv latent 256,
    # q/k head 64 + 64 RoPE, values 128): every width from the shapes, none from the config
    attention = _attention(_mla_module(4096, 32, 1024, 256, 64, 64, 128), 4096, 32, None, 0,
                           "model.layers.0.self_attn")
    assert attention.mla == (1024, 256, 64, 64, 128) and attention.qk_norm
    # no query latent (DeepSeek-V2-Lite's shape): q_proj straight from the hidden state
    assert _attention(_mla_module(2048, 16, 0, 512, 128, 64, 128), 2048, 16, None, 0, "a").mla \
        == (0, 512, 128, 64, 128)
    # a part Megatron's MLASelfAttention does not have is refused by name
    with pytest.raises(Unpriced, match=r"layer 3: a \(Mistral4Attention\) is multi-latent attention "
                                       r"\(4 heads.*\) with parts Megatron's MLA does not build: "
                                       r"gate_proj \(_Module\): an output gate, one per head \(4\)"):
        _attention(_mla_module(64, 4, 32, 16, 16, 8, 16, gate_proj=_linear(64, 4)), 64, 4, None,
                   3, "a")


def test_multi_latent_attention_maps_to_megatrons_mla_fields():
    att = Attention(4, 4, 24, False, True, mla=(32, 16, 16, 8, 16))
    read = ModelRead(256, 64, False, [Layer(att, None, Moe(4, 32, 0, False, False, "softmax"))] * 2)
    model, _, _ = model_section(read, _text(["full_attention"] * 2))
    assert (model["multi_latent_attention"], model["q_lora_rank"], model["kv_lora_rank"],
            model["qk_head_dim"], model["qk_pos_emb_head_dim"], model["v_head_dim"],
            model["rope_type"]) == (True, 32, 16, 16, 8, 16, "rope")
    assert "kv_channels" not in model and "num_query_groups" not in model


@pytest.mark.parametrize(("score", "normalise", "pre_softmax", "note"), [
    ("softmax", False, True, None),  # OLMoE: softmax over all experts, top-k kept as is
    ("softmax", True, None, None),  # renormalised top-k of a softmax = Megatron's default
    ("sigmoid", False, None, "Megatron always renormalises"),
    ("softmax", None, None, "names no norm_topk_prob"),
])
def test_top_k_normalisation_maps_to_megatrons_router(score, normalise, pre_softmax, note):
    """moe_utils.py topk_routing_with_score_function: pre-softmax keeps the full softmax's top-k
    weights; the default softmaxes the top-k logits; sigmoid top-k is renormalised always."""
    att = Attention(4, 4, 16, False, True)
    read = ModelRead(256, 64, False, [Layer(att, None, Moe(4, 32, 0, False, False, score))] * 2)
    text = SimpleNamespace(layer_types=["full_attention"] * 2, num_experts_per_tok=2,
                           scoring_func=score, norm_topk_prob=normalise)
    model, notes, _ = model_section(read, text)
    assert model.get("moe_router_pre_softmax") is pre_softmax
    assert any(note in n for n in notes) if note else not any("norm_topk_prob" in n for n in notes)


def test_a_query_latent_without_its_norm_is_refused_by_name():
    module = _mla_module(64, 4, 32, 16, 16, 8, 16)
    del module._children["q_a_layernorm"]
    with pytest.raises(Unpriced, match=r"layer 1: a \(Mistral4Attention\) is not multi-latent"):
        _attention(module, 64, 4, None, 1, "a")


class _Counted:
    def __init__(self, n: int) -> None:
        self._n = n

    def numel(self) -> int:
        return self._n


class _Block:
    """A decoder layer as hf_meta._mispriced sees it: its parameters' sizes and its modules."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self._sizes = sizes

    def parameters(self) -> Iterator[_Counted]:
        return (_Counted(n) for n in self._sizes.values())

    def named_children(self) -> Iterator[tuple[str, Any]]:
        return ((name, _Block({name: n})) for name, n in self._sizes.items())


def test_a_count_that_differs_is_refused_naming_the_layer_and_its_modules():
    # Two MoE layers of hidden 64: attention 4 heads of 16 (4 x 64 x 64 = 16,384), a router of
    # 4 x 64 = 256, 4 SwiGLU experts of 32 (4 x 3 x 64 x 32 = 24,576), two norms (128): 41,344 a
    # layer (hand-derived); a tied vocabulary of 256 (no padding rows) and the final norm:
    # 16,448 outside. transformers' layer 1 holds 8 more: the refusal names layer 1, its path,
    # class and modules.
    from planner.commands.hf_meta import _mispriced

    section = {"num_layers": 2, "hidden_size": 64, "vocab_size": 256, "num_attention_heads": 4,
               "kv_channels": 16, "normalization": "RMSNorm", "swiglu": True,
               "ffn_hidden_size": 32, "add_bias_linear": False, "num_experts": 4,
               "moe_ffn_hidden_size": 32, "moe_router_topk": 2, "moe_layer_freq": [1, 1],
               "untie_embeddings_and_output_weights": False}
    layer = {"self_attn": 16_384, "mlp": 24_832, "input_layernorm": 64,
             "post_attention_layernorm": 64}
    layers = [("model.layers.0", _Block(layer)),
              ("model.layers.1", _Block({**layer, "mlp": 24_840}))]
    assert _mispriced(section, layers[:1] * 2, [0, 0], 16_448 + 2 * 41_344) is None
    assert _mispriced(section, layers, [0, 0], 16_448 + 41_344 + 41_352) == (
        "layer 1: model.layers.1 (_Block: self_attn (_Block), mlp (_Block), input_layernorm "
        "(_Block), post_attention_layernorm (_Block)) holds 41,352 parameters in transformers' "
        "build, moeplan prices 41,344 for it")
    # a correction bias transformers counts in the layer (a buffer in Megatron) is no difference
    assert _mispriced(section, layers, [0, 8], 16_448 + 41_344 + 41_352) is None


def test_rope_under_a_sliding_window_condition_is_read_off_the_forward():
    # AFMoE's attention rotates q/k only on its sliding-window layers: its full layers take no
    # position embedding (Megatron's no_rope_freq); an unconditional call is RoPE everywhere
    from planner.config.importers.hf_modules import _rope_window_only

    conditional = """    def forward(self, hidden_states, position_embeddings):
        if self.is_local_attention:
            cos, sin = position_embeddings
            query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        return query_states
"""
    assert _rope_window_only(conditional)
    assert not _rope_window_only(conditional.replace("if self.is_local_attention:", "if True:"))
    everywhere = """    def forward(self, hidden_states, position_embeddings):
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
"""
    assert not _rope_window_only(everywhere)


def test_window_only_rope_maps_to_no_rope_on_the_full_layers():
    att = Attention(4, 2, 16, False, True, "element", rope_window_only=True)
    read = ModelRead(256, 64, False, [Layer(att, None, Moe(4, 32, 0, False, False, "sigmoid"))] * 4)
    types = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]
    model, _, _ = model_section(read, _text(types))
    assert model["window_attn_skip_freq"] == [1, 1, 1, 0] and model["no_rope_freq"] == [0, 0, 0, 1]
    assert model["attention_output_gate"]
    with pytest.raises(ValueError, match="rotates q/k on sliding-window layers only"):
        model_section(read, _text(["full_attention"] * 4))


def test_mla_yarn_is_carried_with_the_mscale_megatron_does_not_default_to():
    # Mistral-Small-4's rope_parameters: YaRN of 128 from 8,192 positions, mscale_all_dim 1.0
    # (Megatron's MLA default is 0.0: passed on as --mscale-all-dim), mscale 1.0 (the default)
    from planner.config.importers.hf_modules import rope_arguments

    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
            "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": 1.0, "mscale_all_dim": 1.0}
    att = Attention(4, 4, 24, False, True, mla=(32, 16, 16, 8, 16))
    read = ModelRead(256, 64, False, [Layer(att, None, Moe(4, 32, 0, False, False, "softmax"))] * 2)
    text = SimpleNamespace(layer_types=None, sliding_window=None, num_experts_per_tok=2,
                           rope_parameters=rope)
    model, _, _ = model_section(read, text)
    assert (model["rope_type"], model["rotary_scaling_factor"],
            model["original_max_position_embeddings"]) == ("yarn", 128.0, 8192)
    assert rope_arguments(model, text) == ["--mscale-all-dim", "1.0"]
    assert rope_arguments({**model, "rope_type": "rope"}, text) == []


def test_standard_attention_yarn_is_carried_as_megatrons_yarn():
    """A no-record model's YaRN on standard attention maps as the family records map it
    (hf_config.standard_yarn): the factor a field, the other settings Megatron arguments where
    they differ from its defaults; an unreadable value refuses the mapping by name."""
    from planner.config.importers.hf_modules import rope_arguments

    rope = {"rope_type": "yarn", "rope_theta": 150000, "factor": 32.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False}
    att = Attention(4, 4, 16, False, True)
    read = ModelRead(256, 64, False, [Layer(att, None, Moe(4, 32, 0, False, False, "softmax"))] * 2)
    text = SimpleNamespace(layer_types=["full_attention"] * 2, num_experts_per_tok=2,
                           rope_parameters=rope)
    model, notes, _ = model_section(read, text)
    assert (model["position_embedding_type"], model["rotary_scaling_factor"]) == ("yarn", 32.0)
    assert not any("not carried over" in note for note in notes)
    assert rope_arguments(model, text) == ["--no-yarn-correction-range-round-to-int"]
    text.rope_parameters = {**rope, "factor": "32"}
    with pytest.raises(ValueError, match="YaRN factor = '32': expected a number"):
        model_section(read, text)


class HunYuanAttention(_Module):
    def forward(self, hidden_states: Any, cos: Any, sin: Any) -> Any:  # the order, not the math
        query_states, key_states = apply_rotary_pos_emb(hidden_states, hidden_states, cos, sin)
        return self.query_layernorm(query_states), self.key_layernorm(key_states)


def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    return q, k


def test_q_k_norms_after_rope_are_read_with_their_order():
    # HunYuan's query_layernorm / key_layernorm (per head, as Megatron's qk_layernorm) run after
    # RoPE in its forward: the same parameters, read as q/k norms, the order kept for a warning
    norm = _Module({"weight": _Tensor(16)})
    norm.__class__ = type("HunYuanRMSNorm", (_Module,), {})
    module = HunYuanAttention(q_proj=_linear(64, 64), k_proj=_linear(64, 32),
                              v_proj=_linear(64, 32), o_proj=_linear(64, 64),
                              query_layernorm=norm, key_layernorm=norm)
    attention = _attention(module, 64, 4, 16, 0, "model.layers.0.self_attn")
    assert attention.qk_norm and attention.norm_after_rope
    read = ModelRead(256, 64, False, [Layer(attention, None, Moe(4, 32, 0, False, False,
                                                                 "softmax"))] * 2)
    _, _, warnings = model_section(read, _text(["full_attention"] * 2))
    assert any(w.startswith("the q/k norms run after RoPE") for w in warnings)


def test_text_keys_a_wrapper_does_not_read_are_named_only_where_they_change_the_model():
    """A wrapper's config class reads its text stack from text_config only (transformers'
    Step3p7Config): a key its text config class reads, written at the file's top level with another
    value than the built text stack holds, is named; one equal to it, a token id, one the wrapper
    reads itself and the weights' quantisation are not. A config that is its own text config (a
    causal LM's) names nothing."""
    from dataclasses import dataclass, field

    from planner.commands.hf_meta import _stray_text_keys

    @dataclass
    class Text:
        vocab_size: int = 128_815
        layer_types: list[str] = field(default_factory=lambda: ["full_attention"] * 2)
        hidden_size: int = 4096
        eos_token_id: int = 1

    @dataclass
    class Wrapper:
        text_config: Text = field(default_factory=Text)
        tie_word_embeddings: bool = False

        def get_text_config(self) -> Text:
            return self.text_config

    hf = {"model_type": "step3p7", "vocab_size": 128_896, "hidden_size": 4096, "eos_token_id": 7,
          "layer_types": ["full_attention", "sliding_attention"], "tie_word_embeddings": True,
          "quantization_config": {"quant_method": "fp8"}}
    assert _stray_text_keys(hf, Wrapper()) == ["vocab_size", "layer_types"]
    text = Text()
    text.get_text_config = lambda: text  # type: ignore[attr-defined]
    assert _stray_text_keys(hf, text) == []

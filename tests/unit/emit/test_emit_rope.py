"""RoPE / YaRN settings: the DeepSeek-V4 values reach Megatron's config, the emitter says only what
each attention kind reads, and the runtime rotates by the plan's rotary_base.

DSv4 attention (Megatron-LM dev@d48bd6be megatron/core/transformer/experimental_attention_variant/
deepseek_v4_hybrid_attention.py) rotates window-only layers by `rotary_base` and CSA/HCA layers by
`csa_compress_rotary_base` with YaRN (`rotary_scaling_factor`, `original_max_position_embeddings`,
MLATransformerConfig's beta_fast 32 / beta_slow 1). Left at argparse defaults, the compressed
layers would use base 40000 and no context extension instead of V4's 160000 and factor 16.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from planner.config.loader import load_config, parse_config
from planner.config.schema import Config
from planner.emit import EmitError
from planner.emit.megatron import megatron_arguments
from planner.plan import compile_plan
from planner.rules import run_rules
from runtime.model import DecoderSpec, rotary
from runtime.plan_io import PlanError, check_plan
from tests.support.megatron_judge import case_of, register, verdict
from tests.support.paths import EXAMPLES

V4_EXAMPLES = ("deepseek-v4-pro-1024.yaml", "deepseek-v4-flash-128.yaml")
V4_ROPE = {"rope_type": "yarn", "rotary_base": 10000, "csa_compress_rotary_base": 160000.0,
           "rotary_scaling_factor": 16.0, "original_max_position_embeddings": 65536}
V4_FLAGS = {"--rope-type": ("yarn",), "--rotary-base": ("10000",), "--rotary-scaling-factor": ("16.0",),
            "--original-max-position-embeddings": ("65536",), "--csa-compress-rotary-base": ("160000.0",)}
ROPE_FLAGS = tuple(V4_FLAGS)


def small(**model: Any) -> Config:
    data = {"model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 64,
                      "num_experts": 4, **model},
            "parallel": {"world_size": 1}, "training": {"seq_length": 16, "precision": "fp32"}}
    return parse_config(data)


def rope_flags(cfg: Config) -> dict[str, tuple[str, ...]]:
    return {flag: values for flag, values in megatron_arguments(cfg).as_dict().items() if flag in ROPE_FLAGS}


def test_v4_presets_carry_the_released_rope_settings():
    for name in ("deepseek-v4-pro-1024.yaml", "deepseek-v4-flash-128.yaml"):
        cfg = load_config(EXAMPLES / name)
        assert {key: getattr(cfg.model, key) for key in V4_ROPE} == V4_ROPE
        assert rope_flags(cfg) == V4_FLAGS


def test_standard_attention_gets_only_the_rope_base():
    assert rope_flags(small()) == {"--rotary-base": ("10000",)}
    assert rope_flags(small(rotary_base=500000, rope_type="rope")) == {
        "--rope-type": ("rope",), "--rotary-base": ("500000",)}


def test_mla_gets_yarn_settings_but_no_compressed_base():
    flags = rope_flags(small(attention_variant="mla", kv_lora_rank=16, rotary_scaling_factor=40.0))
    assert flags["--rotary-scaling-factor"] == ("40.0",)
    assert flags["--original-max-position-embeddings"] == ("4096",)  # Megatron's argparse default
    assert "--csa-compress-rotary-base" not in flags and "--rope-type" not in flags


def test_yarn_on_standard_attention_is_an_emit_error():
    # Megatron-LM dev@d48bd6be megatron/training/arguments.py core_transformer_config_from_args
    # asserts rope_type 'rope' unless multi-latent attention is on.
    with pytest.raises(EmitError) as caught:
        megatron_arguments(small(rope_type="yarn"))
    assert caught.value.path == "model.rope_type" and "'rope'" in caught.value.message


def test_runtime_rotates_by_the_plan_rotary_base():
    # d = 4: frequencies 1 and base^(-1/2); at position 100 the second pair turns by 100/sqrt(base).
    x = torch.tensor([1.0, 1.0, 0.0, 0.0]).view(1, 1, 1, 4)
    position = torch.tensor([100])
    for base, angle in ((10000.0, 1.0), (40000.0, 0.5)):
        out = rotary(x, position, base).flatten().tolist()
        expected = [math.cos(100), math.cos(angle), math.sin(100), math.sin(angle)]
        assert out == pytest.approx(expected, abs=1e-5)
    cfg = small(rotary_base=500000)
    plan = check_plan(compile_plan(cfg, run_rules(cfg)))
    spec = DecoderSpec.from_config(plan.model, plan.moe_layers(), plan.hash_layers(),
                                   plan.padded_vocab_size)
    assert spec.rotary_base == 500000.0


def test_runtime_refuses_yarn():
    cfg = small(rope_type="yarn")
    with pytest.raises(PlanError, match=r"model\.rope_type = 'yarn': YaRN is not implemented"):
        check_plan(compile_plan(cfg, run_rules(cfg)))


# ------------------------------------------------------------------ Megatron as the judge

for _name in V4_EXAMPLES:
    register(_name, case_of(load_config(EXAMPLES / _name), _name))


def test_megatron_builds_the_v4_rope_from_the_emitted_arguments():
    for name in V4_EXAMPLES:
        result = verdict(name)
        assert result.verdict == "pass", (result.message, result.location, result.mismatches)
        built = result.derived["rope"]
        assert {key: built[key] for key in V4_ROPE} == V4_ROPE
        assert built["position_embedding_type"] == "rope"
        assert (built["beta_fast"], built["beta_slow"]) == (32, 1)  # V4's rope_scaling betas


register("rope: standard attention, base 500000", case_of(
    small(rotary_base=500000, rope_type="rope"), "rope: standard attention, base 500000"))
register("rope: MLA, YaRN x40", case_of(
    small(attention_variant="mla", rotary_scaling_factor=40.0, rope_type="yarn", q_lora_rank=16,
          kv_lora_rank=16, kv_channels=16, qk_pos_emb_head_dim=8), "rope: MLA, YaRN x40"))


def test_megatron_rope_follows_each_attention_kind():
    """Standard attention keeps its base on the GPT model config (Megatron-LM dev@d48bd6be
    megatron/training/argument_utils.py gpt_config_from_args); MLA's YaRN settings land on
    MLATransformerConfig. The pre-flight compares only the fields each kind reads."""
    standard, mla = verdict("rope: standard attention, base 500000"), verdict("rope: MLA, YaRN x40")
    for result in (standard, mla):
        assert result.verdict == "pass", (result.message, result.location, result.mismatches)
    assert mla.expected["rope"] == {"position_embedding_type": "rope", "rope_type": "yarn",
                                       "rotary_base": 10000, "rotary_scaling_factor": 40.0,
                                       "original_max_position_embeddings": 4096}
    assert "rope_type" not in standard.derived["rope"]  # only MLATransformerConfig has the field
    assert standard.derived["rope"]["rotary_base"] == 500000
    assert (mla.derived["rope"]["rope_type"], mla.derived["rope"]["rotary_scaling_factor"]) == ("yarn", 40.0)

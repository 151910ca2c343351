"""`moeplan emit bridge`: the plan as Megatron-Bridge ConfigContainer overrides.

Every path must exist in Megatron-Bridge's container (tests/support/bridge_container.json, read from
Bridge's source) on top of Megatron-LM's config dataclasses (the committed table, itself checked
against Megatron-LM's source below); the values are judged by Megatron's own container in the shared
oracle run (tests/support/megatron_judge.py case_of asks for them for every example)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app
from planner.config.loader import load_config, parse_config
from planner.config.megatron_config_fields import DATA_FILE, config_fields
from planner.config.schema import Config
from planner.emit import EmitError
from planner.emit.bridge import (
    BRIDGE_FILE,
    COMM_OVERLAP_FIELDS,
    PRECISION_RECIPES,
    bridge_file_text,
    bridge_overrides,
    full_compress_ratios,
    hydra_value,
    precision_recipe,
)
from tests.support.bridge_container import FACTS_FILE
from tests.support.megatron_config_fields import section_fields
from tests.support.oracle import megatron_lm_dir
from tests.support.paths import EXAMPLES

FACTS = json.loads(FACTS_FILE.read_text())
TINY = EXAMPLES / "tiny-cpu-8.yaml"
VALID = sorted(EXAMPLES.glob("*.yaml"))


def tiny(**training: object) -> Config:
    data = yaml.safe_load(TINY.read_text())
    data["training"].update(training)
    return parse_config(data)


def bridge_fields(section: str) -> set[str]:
    """What a Bridge override may name in `section`: Megatron's class fields plus Bridge's own."""
    if section == "model":
        return set(config_fields()["model"]).union(config_fields()["model_mla"],
                                                    *FACTS["provider_own_fields"].values())
    return set(config_fields().get(section, ())) | set(FACTS["section_own_fields"].get(section, ()))


def test_the_tiny_example_by_hand():
    """tiny-cpu-8: TP1 CP2 EP2 ETP2, 8 experts, vocabulary 256 (padded to 128 x TP1: 256), fp32."""
    lines = {path: value for path, value, _ in bridge_overrides(load_config(TINY)).lines}
    assert lines["mixed_precision"] is None  # fp32: no recipe
    assert lines["model.context_parallel_size"] == 2
    assert lines["model.expert_model_parallel_size"] == 2
    assert lines["model.expert_tensor_parallel_size"] == 2
    assert lines["model.num_moe_experts"] == 8  # --num-experts, renamed by core_transformer_config_from_args
    assert lines["model.share_embeddings_and_output_weights"] is False  # --untie-... inverted
    assert lines["model.vocab_size"] == 256 and lines["model.should_pad_vocab"] is False
    assert lines["tokenizer.vocab_size"] == 256
    assert lines["model.moe_router_load_balancing_type"] == "seq_aux_loss"  # one-entry list collapsed
    assert lines["model.activation_func_clamp_value"] == 10.0
    assert lines["dataset.seq_length"] == 32 and "model.seq_length" not in lines
    assert lines["train.micro_batch_size"] == 1 and lines["train.global_batch_size"] == 8
    assert lines["optimizer.lr"] == 1.0e-3 and lines["rng.seed"] == 1234
    assert not any(path.startswith(("model.bf16", "model.fp16", "optimizer.bf16")) for path in lines)


@pytest.mark.parametrize("config", VALID, ids=lambda p: p.stem)
def test_every_override_lands_in_bridges_container(config):
    out = bridge_overrides(load_config(config))
    for path, value, source in out.lines:
        if path == "mixed_precision":
            assert value is None or value in FACTS["mixed_precision_recipes"], value
            continue
        section, name = path.split(".", 1)
        assert section in FACTS["container_sections"], path
        assert name in bridge_fields(section), f"{path} (from {source}) is no field of Bridge's {section}"
    for path, _ in out.comm_overlap:
        assert path.split(".", 1)[1] in FACTS["comm_overlap_fields"], path


def test_the_precision_recipes_and_overlap_fields_are_bridges():
    assert {r.name for r in PRECISION_RECIPES.values()} <= set(FACTS["mixed_precision_recipes"])
    assert set(COMM_OVERLAP_FIELDS) <= set(FACTS["comm_overlap_fields"])


@pytest.mark.parametrize(("training", "name"), [
    ({"precision": "bf16"}, "bf16_mixed"),
    ({"precision": "bf16", "fp8_format": "hybrid", "fp8_recipe": "delayed"},
     "bf16_with_fp8_delayed_scaling_mixed"),
    ({"precision": "bf16", "fp8_format": "e4m3", "fp8_recipe": "mxfp8"}, "bf16_with_mxfp8_mixed"),
    ({"precision": "bf16", "fp8_format": "hybrid", "fp8_recipe": "blockwise"},
     "bf16_with_fp8_subchannel_scaling_mixed"),
])
def test_precision_is_a_bridge_recipe(training, name):
    assert precision_recipe(tiny(**training)).name == name


def test_a_recipe_setting_that_differs_from_the_plan_is_named():
    cfg = tiny(precision="bf16", fp8_format="e4m3", fp8_recipe="delayed")
    said = " ".join(bridge_overrides(cfg).not_carried)
    assert "training.fp8_format 'e4m3': the recipe bf16_with_fp8_delayed_scaling_mixed sets 'hybrid'" in said


def test_no_bridge_recipe_is_an_emit_error():
    cfg = tiny(precision="fp16", fp4=True)
    with pytest.raises(EmitError, match="registers no mixed-precision recipe"):
        precision_recipe(cfg)


def test_compress_ratios_are_padded_per_pattern_symbol():
    # H E C E | W E / C E  ->  ratios only on the attention symbols, 0 on the MoE ones
    assert full_compress_ratios([128, 4, 0, 4], "HECE|WE/CE") == [128, 0, 4, 0, 0, 0, 4, 0]


@pytest.mark.parametrize(("value", "text"), [
    (True, "true"), (None, "null"), (8, "8"), (1e-05, "1e-05"), ("alltoall", "alltoall"),
    ("tp-cp-ep-dp-pp", "tp-cp-ep-dp-pp"), ("HE|CE/WE", "'HE|CE/WE'"), ("it's", "'it\\'s'"),
    ("true", "'true'"), ([128, 0], "[128,0]"), (["a", "b c"], "[a,'b c']"),
])
def test_hydra_values(value, text):
    assert hydra_value(value) == text


def test_the_file_says_what_it_does_not_carry():
    text = bridge_file_text(load_config(EXAMPLES / "deepseek-v4-pro-1024.yaml"), "sha256:x", "v4.yaml")
    assert "--spec (hybrid DSv4 layer specs): a Bridge recipe's model provider chooses" in text
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert "mixed_precision=bf16_mixed" in body
    assert all("=" in line for line in body)


def test_emit_bridge_writes_the_file(tmp_path):
    result = CliRunner().invoke(app, ["emit", "bridge", str(TINY), "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [BRIDGE_FILE, "plan.json"]
    assert "model.expert_tensor_parallel_size=2" in (tmp_path / "run" / BRIDGE_FILE).read_text()


def test_the_field_table_is_megatrons():
    folder, why = megatron_lm_dir()
    if folder is None:
        pytest.skip(why)
    assert {s: set(f) for s, f in section_fields(folder).items()} == \
        {s: set(f) for s, f in config_fields().items()}, f"regenerate {DATA_FILE}"


def test_the_bridge_facts_name_their_commit():
    assert FACTS["source"].startswith("NVIDIA-NeMo/Megatron-Bridge@")
    assert len(FACTS["source"].split("@")[1]) == 40
    assert Path(FACTS_FILE).is_file()

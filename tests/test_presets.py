"""The GPT-form presets are the published Hugging Face configs: each preset equals `moeplan import hf`
of the same config.json (tests/test_hf_config.py writes them from the model repositories), so a
preset and an imported config build the same model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.importers.hf_config import map_hf_config
from planner.loader import load_config
from planner.presets import PRESETS
from planner.schema import ModelSection
from tests.test_hf_config import HF_CONFIGS

HF_PRESETS = ("deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b")


def test_every_preset_is_a_schema_choice():
    annotation = ModelSection.model_fields["preset"].annotation
    assert set(PRESETS) == set(annotation.__args__[0].__args__)


@pytest.mark.parametrize("name", HF_PRESETS)
def test_preset_equals_the_hf_import_of_its_config_json(name: str):
    # No field added or changed: the preset is exactly the mapped config.json.
    assert PRESETS[name] == map_hf_config(HF_CONFIGS[name]).model


@pytest.mark.parametrize("name", HF_PRESETS)
def test_preset_and_hf_config_resolve_to_the_same_model(tmp_path: Path, name: str):
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIGS[name]), "utf-8")
    rest = "parallel: {world_size: 8}\ntraining: {seq_length: 128}\nignore: [MEM001]\n"
    (tmp_path / "preset.yaml").write_text(f"model: {{preset: {name}}}\n{rest}", "utf-8")
    (tmp_path / "hf.yaml").write_text(f"model: {{hf_config: config.json}}\n{rest}", "utf-8")
    preset = load_config(tmp_path / "preset.yaml").model.model_dump(exclude={"preset"})
    assert preset == load_config(tmp_path / "hf.yaml").model.model_dump(exclude={"preset"})


def test_v3_yarn_mscale_is_the_one_extra_argument():
    # mscale_all_dim 1.0 has no moeplan field: the V3 example passes it verbatim.
    assert map_hf_config(HF_CONFIGS["deepseek-v3"]).megatron_extra_args == ("--mscale-all-dim", "1.0")
    example = load_config(Path(__file__).parents[1] / "examples" / "deepseek-v3-1024.yaml")
    assert example.launch.megatron_extra_args == ["--mscale-all-dim", "1.0"]

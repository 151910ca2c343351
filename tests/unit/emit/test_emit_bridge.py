"""`moeplan emit bridge`: the plan as Megatron-Bridge ConfigContainer overrides. Every key is a field
of the ConfigContainer section it names — planner/config/data/bridge_fields.tsv, checked here against
the dataclasses of the Megatron-LM checkout where one is present (Bridge's model, train, optimizer, ddp
and checkpoint sections subclass them) — and the values are the example's, written out by hand."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.config.loader import load_config
from planner.emit import EmitError
from planner.emit.bridge import bridge_fields, bridge_overrides
from tests.support.oracle import megatron_lm_dir
from tests.support.paths import EXAMPLES

# the Megatron-LM dataclass each Bridge section derives from (Bridge's own added fields aside)
MEGATRON_CLASSES = {
    "model": [("megatron/core/model_parallel_config.py", "ModelParallelConfig"),
              ("megatron/core/transformer/transformer_config.py", "TransformerConfig")],
    "train": [("megatron/training/config/training_config.py", "TrainingConfig")],
    "optimizer": [("megatron/core/optimizer/optimizer_config.py", "OptimizerConfig")],
    "ddp": [("megatron/core/distributed/distributed_data_parallel_config.py",
             "DistributedDataParallelConfig")],
    "checkpoint": [("megatron/training/config/training_config.py", "CheckpointConfig")],
    "rng": [("megatron/training/config/common_config.py", "RNGConfig")],
}


def _fields(source: Path, cls: str) -> set[str]:
    tree = ast.parse(source.read_text(encoding="utf-8"))
    [node] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
    return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def test_deepseek_v3_overrides() -> None:
    lines = [o.line for o in bridge_overrides(load_config(EXAMPLES / "deepseek-v3-1024.yaml"))]
    for expected in ("mixed_precision=bf16_mixed", "model.tensor_model_parallel_size=2",
                     "model.pipeline_model_parallel_size=8", "model.expert_model_parallel_size=64",
                     "model.expert_tensor_parallel_size=1", "model.sequence_parallel=true",
                     "model.pipeline_model_parallel_layout='Et|(tt|)*30mL'", "model.seq_length=4096",
                     "dataset.seq_length=4096", "train.micro_batch_size=1", "train.global_batch_size=8192",
                     "optimizer.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=true",
                     "model.recompute_granularity=selective",
                     "model.recompute_modules=[mla_up_proj,moe_act,layernorm]"):
        assert expected in lines, expected
    assert not [line for line in lines if line.startswith(("model.num_layers=", "model.hidden_size="))]


@pytest.mark.parametrize("example", ["deepseek-v3-1024.yaml", "qwen3-235b-a22b-256.yaml"])
def test_every_key_is_a_configcontainer_field(example: str) -> None:
    table = bridge_fields()
    overrides = bridge_overrides(load_config(EXAMPLES / example))
    folder, _ = megatron_lm_dir()
    megatron = {section: set().union(*(_fields(folder / path, cls) for path, cls in classes))
                for section, classes in MEGATRON_CLASSES.items()} if folder is not None else {}
    for override in overrides:
        section, _, name = override.key.partition(".")
        if not name:
            assert section == "mixed_precision"
            continue
        assert section in table.get(name, ()), override
        if section in megatron and name not in {"seq_length"}:
            assert name in megatron[section], override


def test_a_hybrid_stage_split_is_refused_not_dropped(tmp_path: Path) -> None:
    with pytest.raises(EmitError) as caught:
        bridge_overrides(load_config(EXAMPLES / "deepseek-v4-pro-1024.yaml"))
    assert "--hybrid-layer-pattern" in caught.value.message
    ran = CliRunner().invoke(app, ["emit", "bridge", str(EXAMPLES / "qwen3-235b-a22b-256.yaml"),
                                   "-o", str(tmp_path)])
    assert ran.exit_code == 0, ran.output
    text = (tmp_path / "bridge_overrides.txt").read_text()
    assert "model.pipeline_model_parallel_layout='E(t*12|)*6t*11|t*11L'" in text.splitlines()


def test_a_bridge_container_yaml_imports_back_to_the_plan() -> None:
    """The overrides folded into a ConfigContainer YAML (as a recipe run saves it) over the model
    fields of Bridge's Qwen3 MoE provider import back to the example's layout, batch and optimizer."""
    import yaml

    from planner.config.importers.sources import import_text
    from planner.config.loader import parse_config

    cfg = load_config(EXAMPLES / "qwen3-235b-a22b-256.yaml")
    data: dict = {"model": {"_target_": "megatron.bridge.models.Qwen3MoEModelProvider", "num_layers": 94,
                            "hidden_size": 4096, "num_attention_heads": 64, "num_moe_experts": 128,
                            "moe_router_topk": 8, "ffn_hidden_size": 12288, "moe_ffn_hidden_size": 1536,
                            "vocab_size": 151936, "num_query_groups": 4, "kv_channels": 128,
                            "normalization": "RMSNorm", "gated_linear_unit": True, "qk_layernorm": True,
                            "share_embeddings_and_output_weights": False, "add_bias_linear": False,
                            "position_embedding_type": "rope", "rotary_base": 1000000}}
    for override in bridge_overrides(cfg):
        section, _, name = override.key.partition(".")
        if name:
            data.setdefault(section, {})[name] = yaml.safe_load(override.value)
        else:
            data[section] = override.value
    result, front = import_text(yaml.safe_dump(data), world_size=cfg.parallel.world_size)
    assert front.form == "Megatron-Bridge ConfigContainer YAML"
    back = parse_config(result.data)
    assert (back.parallel, back.moe, back.overlap) == (cfg.parallel, cfg.moe, cfg.overlap)
    assert back.training.model_dump() == cfg.training.model_dump()

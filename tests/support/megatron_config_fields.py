"""The fields of Megatron-LM's config dataclasses, per section of its `PretrainConfigContainer`
(megatron/training/argument_utils.py pretrain_cfg_container_from_args fills each from the arguments of
the same name), read from a checkout's source without importing it, and written to the committed
table `planner/config/data/megatron_config_fields.txt` that `moeplan emit bridge` reads.

Megatron-Bridge's ConfigContainer extends these classes section by section (its model providers
subclass TransformerConfig flat, where Megatron's GPTModelConfig nests it under `transformer`), so
the model section here is TransformerConfig with its bases, and `model_mla` MLATransformerConfig's
own fields (the model's when the arguments pick multi-latent attention): the classes
core_transformer_config_from_args fills by name. The GPT/hybrid model configs' own fields are set
one by one (gpt_config_from_args), which planner/emit/bridge.py spells out.

    python -m tests.support.megatron_config_fields --update DEV_DIR   (the folder holding `megatron`)
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from planner.config.megatron_config_fields import DATA_FILE

# section -> (source file under the checkout, class) pairs whose fields (bases included) it holds.
SECTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "model": (("megatron/core/transformer/transformer_config.py", "TransformerConfig"),),
    # MLATransformerConfig's own fields: the model's only when --multi-latent-attention picks it
    # (core_transformer_config_from_args), written as the `model_mla` line
    "model_mla": (("megatron/core/transformer/transformer_config.py", "MLATransformerConfig"),),
    "train": (("megatron/training/config/training_config.py", "TrainingConfig"),),
    "validation": (("megatron/training/config/training_config.py", "ValidationConfig"),),
    "optimizer": (("megatron/core/optimizer/optimizer_config.py", "OptimizerConfig"),),
    "scheduler": (("megatron/training/config/training_config.py", "SchedulerConfig"),),
    "ddp": (("megatron/core/distributed/distributed_data_parallel_config.py",
             "DistributedDataParallelConfig"),),
    "dist": (("megatron/training/config/common_config.py", "DistributedInitConfig"),),
    "rng": (("megatron/training/config/common_config.py", "RNGConfig"),),
    "logger": (("megatron/training/config/training_config.py", "LoggerConfig"),),
    "checkpoint": (("megatron/training/config/training_config.py", "CheckpointConfig"),),
    "tokenizer": (("megatron/training/config/training_config.py", "TokenizerConfig"),),
    "profiling": (("megatron/training/config/common_config.py", "ProfilingConfig"),),
    "rerun_state_machine": (("megatron/training/config/resilience_config.py", "RerunStateMachineConfig"),),
}
# Where a base class named in a model class lives (followed when its fields are collected).
BASES = {
    "TransformerConfig": "megatron/core/transformer/transformer_config.py",
    "ModelParallelConfig": "megatron/core/model_parallel_config.py",
}


def class_fields(checkout: Path, path: str, name: str) -> list[str]:
    """A dataclass's annotated fields in definition order, its bases' first (ClassVar skipped)."""
    tree = ast.parse((checkout / path).read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    found: list[str] = []
    for base in node.bases:
        base_name = base.id if isinstance(base, ast.Name) else None
        if base_name in BASES:
            found += class_fields(checkout, BASES[base_name], base_name)
        elif base_name is not None and any(isinstance(n, ast.ClassDef) and n.name == base_name
                                           for n in tree.body):
            found += class_fields(checkout, path, base_name)
    for item in node.body:
        if (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                and "ClassVar" not in ast.unparse(item.annotation)):
            found.append(item.target.id)
    return found


def section_fields(checkout: Path) -> dict[str, list[str]]:
    """Every section's field names, sorted."""
    table = {}
    for section, classes in SECTIONS.items():
        names = {f for path, cls in classes for f in class_fields(checkout, path, cls)}
        table[section] = sorted(names)
    table["model_mla"] = sorted(set(table["model_mla"]) - set(table["model"]))
    return table


def write_table(checkout: Path) -> Path:
    """Rewrite the committed table from `checkout`, keeping its header."""
    header = [line for line in DATA_FILE.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    rows = [f"{section}: {' '.join(names)}" for section, names in section_fields(checkout).items()]
    DATA_FILE.write_text("\n".join([*header, *rows]) + "\n", encoding="utf-8")
    return DATA_FILE


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", type=Path, required=True, metavar="DEV_DIR")
    print(f"wrote {write_table(parser.parse_args(argv).update)}")


if __name__ == "__main__":
    main()

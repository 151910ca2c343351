"""Facts of Megatron-Bridge's ConfigContainer read from a checkout's source (never imported): the
container's sections, the fields each section's Bridge class adds to the Megatron-LM config class it
extends, the model providers' own fields, the registered mixed-precision recipes and CommOverlapConfig's
fields. Written to tests/support/bridge_container.json, which tests/unit/emit/test_emit_bridge.py
judges `moeplan emit bridge` against (Megatron's own fields come from the committed table
planner/config/data/megatron_config_fields.txt, itself checked against Megatron-LM's source).

    python -m tests.support.bridge_container --update BRIDGE_DIR [--commit SHA]   (a checkout or export)
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
from pathlib import Path

FACTS_FILE = Path(__file__).with_name("bridge_container.json")
CONFIG = "src/megatron/bridge/training/config.py"
# section -> (file, Bridge class) whose own fields the section adds to Megatron's
SECTION_CLASSES = {
    "train": (CONFIG, "TrainingConfig"), "optimizer": (CONFIG, "OptimizerConfig"),
    "ddp": (CONFIG, "DistributedDataParallelConfig"), "scheduler": (CONFIG, "SchedulerConfig"),
    "dist": (CONFIG, "DistributedInitConfig"), "checkpoint": (CONFIG, "CheckpointConfig"),
    "logger": (CONFIG, "LoggerConfig"), "profiling": (CONFIG, "ProfilingConfig"),
    "rerun_state_machine": (CONFIG, "RerunStateMachineConfig"), "dataset": (CONFIG, "GPTDatasetConfig"),
    "tokenizer": ("src/megatron/bridge/training/tokenizers/config.py", "TokenizerConfig"),
}
PROVIDERS = {"GPTModelProvider": "src/megatron/bridge/models/gpt_provider.py",
             "HybridModelProvider": "src/megatron/bridge/models/hybrid/hybrid_provider.py"}


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def own_fields(checkout: Path, path: str, name: str) -> list[str]:
    tree = ast.parse((checkout / path).read_text(encoding="utf-8"))
    return [item.target.id for item in _class(tree, name).body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)]


def registered_recipes(checkout: Path) -> list[str]:
    tree = ast.parse((checkout / "src/megatron/bridge/training/mixed_precision.py").read_text())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
            and any(isinstance(d, ast.Name) and d.id == "register" for d in n.decorator_list)]


def facts(checkout: Path, commit: str | None = None) -> dict[str, object]:
    commit = commit or subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"],
                                      capture_output=True, text=True, check=True).stdout.strip()
    return {
        "source": f"NVIDIA-NeMo/Megatron-Bridge@{commit}",
        "container_sections": own_fields(checkout, CONFIG, "ConfigContainer"),
        "section_own_fields": {s: own_fields(checkout, p, c) for s, (p, c) in SECTION_CLASSES.items()},
        "provider_own_fields": {c: own_fields(checkout, p, c) for c, p in PROVIDERS.items()},
        "mixed_precision_recipes": registered_recipes(checkout),
        "comm_overlap_fields": own_fields(checkout, "src/megatron/bridge/training/comm_overlap.py",
                                          "CommOverlapConfig"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", type=Path, required=True, metavar="BRIDGE_DIR")
    parser.add_argument("--commit", help="the checkout's commit, when BRIDGE_DIR is an export")
    args = parser.parse_args(argv)
    FACTS_FILE.write_text(json.dumps(facts(args.update, args.commit), indent=1) + "\n")
    print(f"wrote {FACTS_FILE}")


if __name__ == "__main__":
    main()

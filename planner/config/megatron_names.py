"""Megatron-LM's argument names (the command-line flags without `--`, dashes as underscores).

moeplan's fields carry Megatron's names, so a key moeplan does not know may still be a real Megatron
argument: the loader then says it is not modelled and points at `launch.megatron_extra_args`
instead of guessing a field of another meaning. The list is extracted once from the parser
Megatron-LM dev@d48bd6be builds (megatron/training/arguments.py add_megatron_arguments, including
the flags its ArgumentGroupFactory derives from TransformerConfig) into
planner/config/data/megatron_arguments.txt; tests/unit/config/test_model_fields.py checks it against
the oracle.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from planner.config.argument_classes import modelled_field
from planner.config.schema import Config

if TYPE_CHECKING:
    import argparse  # only test support builds parsers; the loader never needs argparse

DATA_FILE = Path(__file__).parent / "data" / "megatron_arguments.txt"
# Megatron-LM main@d98e8a64's parser, the same way (tests/support/megatron_argument_lists.py writes
# both): the classes table marks the arguments only one of the two parsers defines.
MAIN_DATA_FILE = Path(__file__).parent / "data" / "megatron_arguments_main.txt"

# Megatron's names for two things moeplan writes and reads back in a launch line: the layer spec
# `pretrain_hybrid.py` builds DeepSeek-V4 from (`--spec`, Megatron-LM dev@d48bd6be
# megatron/core/models/hybrid/hybrid_layer_specs.py hybrid_dsv4_stack_spec) and the rank order
# `--use-tp-pp-dp-mapping` selects (megatron/training/initialize.py _initialize_distributed).
HYBRID_DSV4_SPEC = ("megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_dsv4_stack_spec")
PP_DP_ORDER = "tp-cp-ep-pp-dp"


# Megatron arguments moeplan models under another name (planner/emit/megatron.py writes them from
# these fields): the hint names the field instead of the passthrough.
MODELLED_AS: dict[str, str] = {
    "bf16": "training.precision", "fp16": "training.precision", "fp8_format": "training.fp8",
    "fp4_format": "training.fp4", "activation_func_clamp_value": "model.swiglu_limit",
    "experimental_attention_variant": "model.attention_variant",
    "dsa_indexer_n_heads": "model.index_n_heads", "dsa_indexer_head_dim": "model.index_head_dim",
    "dsa_indexer_topk": "model.index_topk", "csa_compress_ratios": "model.compress_ratios",
    "disable_bias_linear": "model.add_bias_linear", "hybrid_layer_pattern": "model.compress_ratios",
    "tensor_parallel_num_weight_shards": "parallel.gtp",
    "expert_tensor_parallel_num_weight_shards": "parallel.egtp",
    "use_tp_pp_dp_mapping": "parallel.order",
    "microbatch_group_size_per_virtual_pipeline_stage": "parallel.microbatch_group_size_per_vp_stage",
    "ddp_average_in_collective": "training.average_in_collective",
}


def _names(path: Path) -> frozenset[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


@cache
def megatron_arguments() -> frozenset[str]:
    """Every argument name of Megatron-LM dev's parser (the one `emit` targets), as moeplan would
    spell it as a field."""
    return _names(DATA_FILE)


@cache
def main_arguments() -> frozenset[str]:
    """Every argument name of Megatron-LM main@d98e8a64's parser."""
    return _names(MAIN_DATA_FILE)


def section_fields(model: type[BaseModel]) -> list[str]:
    """A section's keys: its field names and their accepted aliases."""
    names = []
    for name, info in model.model_fields.items():
        names.append(name)
        alias = info.validation_alias
        if alias is not None and hasattr(alias, "choices"):
            names.extend(str(c) for c in alias.choices)
    return sorted(set(names))


def sections() -> dict[str, type[BaseModel]]:
    """The config's sections by name (model, parallel, training ...)."""
    return {name: info.annotation for name, info in Config.model_fields.items()
            if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)}


def moeplan_field(name: str) -> str | None:
    """The moeplan field that models Megatron argument `name` (`section.field`), if any."""
    for section, model in sections().items():
        if name in section_fields(model):
            return f"{section}.{name}"
    # The classes table (planner/config/argument_classes.py) names the field of every other
    # modelled argument, so flipping an argument to modelled is one line of data.
    return MODELLED_AS.get(name) or modelled_field(name)


def flag_of(name: str) -> str:
    """The Megatron flag for an argument name: `qk_head_dim` → `--qk-head-dim`."""
    return "--" + name.replace("_", "-")


def names_of_parser(parser: argparse.ArgumentParser) -> list[str]:
    """The long option names of an argparse parser, sorted, in field spelling."""
    return sorted({option[2:].replace("-", "_") for action in parser._actions
                   for option in action.option_strings if option.startswith("--")} - {"help"})

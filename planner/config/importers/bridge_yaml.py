"""Megatron-Bridge ConfigContainer YAMLs (a recipe's saved run_config.yaml, or an override file of
the same shape: `model:`, `train:`, `optimizer:`, `ddp:` … sections of dataclass fields), read as the
Megatron arguments that set those fields.

The sections are Megatron's own dataclasses (NVIDIA-NeMo/Megatron-Bridge@067f987d
src/megatron/bridge/training/config.py ConfigContainer: the model a GPTModelProvider over
TransformerConfig, train / optimizer / ddp / checkpoint / rng Megatron's configs), so a field is the
dest of the Megatron argument that sets it (planner/config/data/megatron_dests.tsv), but for the
fields TransformerConfig names otherwise than the argument (Megatron-LM dev@d48bd6be
megatron/training/arguments.py core_transformer_config_from_args). `mixed_precision` names one of
Bridge's recipes (src/megatron/bridge/training/mixed_precision.py). Values equal to Megatron's
defaults add no argument; fields no Megatron argument sets are named.
"""

from __future__ import annotations

from typing import Any

import yaml

from planner.config.importers.assemble import FrontEnd
from planner.config.importers.megatron_args import Unmapped
from planner.config.importers.primus import megatron_words

SECTIONS = ("model", "train", "optimizer", "ddp", "dataset", "checkpoint", "rng")
# TransformerConfig field → the argument dest that sets it
FIELD_DESTS = {"num_moe_experts": "num_experts",
               "num_layers_in_first_pipeline_stage": "decoder_first_pipeline_num_layers",
               "num_layers_in_last_pipeline_stage": "decoder_last_pipeline_num_layers"}
# fields the model provider derives or the recipe's code sets: no argument, no plan effect
DERIVED = {"_target_", "params_dtype", "pipeline_dtype", "autocast_dtype", "init_method",
           "output_layer_init_method", "activation_func", "bias_activation_fusion", "timers",
           "finalize_model_grads_func", "grad_scale_func", "no_sync_func", "grad_sync_func",
           "param_sync_func", "transformer_layer_spec"}
_GATHER = ["--fp8-param-gather"]
# Bridge's mixed-precision recipes as Megatron's arguments (mixed_precision.py: the FP8 format, recipe
# and parameter gather each sets)
MIXED = {"bf16_mixed": ["--bf16"], "fp16_mixed": ["--fp16"],
         "bf16_with_fp8_delayed_scaling_mixed": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe",
                                                 "delayed", *_GATHER],
         "bf16_with_fp8_current_scaling_mixed": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe",
                                                 "tensorwise", *_GATHER],
         "bf16_with_fp8_subchannel_scaling_mixed": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe",
                                                    "blockwise"],
         "bf16_with_mxfp8_mixed": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8", *_GATHER,
                                   "--reuse-grad-buf-for-mxfp8-param-ag"]}


def is_bridge_container(data: dict) -> bool:
    return isinstance(data.get("model"), dict) and "parallel" not in data and any(
        isinstance(data.get(s), dict) for s in ("train", "optimizer", "ddp"))


def bridge_front_end(text: str) -> FrontEnd:
    data = yaml.safe_load(text)
    argv: list[str] = []
    unread: list[str] = []
    seq: Any = None
    for section in SECTIONS:
        fields = data.get(section)
        if not isinstance(fields, dict):
            continue
        for name, value in fields.items():
            if name in DERIVED or isinstance(value, dict):
                continue
            if name == "seq_length":
                seq = value if seq is None or section == "dataset" else seq  # the dataset owns it
                continue
            if name == "gated_linear_unit":
                argv += ["--swiglu"] if value else []
                continue
            if name == "share_embeddings_and_output_weights":
                argv += [] if value else ["--untie-embeddings-and-output-weights"]
                continue
            words = megatron_words(FIELD_DESTS.get(name, name), value)
            if words is None:
                unread.append(f"{section}.{name}")
            else:
                argv += words
    if seq is not None:
        argv += ["--seq-length", str(seq)]
    if isinstance(data.get("model"), dict) and data["model"].get("num_query_groups"):
        argv.append("--group-query-attention")
    mixed = data.get("mixed_precision")
    front = FrontEnd("Megatron-Bridge ConfigContainer YAML", argv, "pretrain_gpt.py")
    if isinstance(mixed, str):
        if mixed in MIXED:
            front.argv += MIXED[mixed]
        else:
            front.notes.append(Unmapped("mixed_precision", mixed, "not one of Bridge's recipes moeplan "
                                        f"reads ({', '.join(MIXED)}); fix: set training.precision",
                                        error=True))
    if unread:
        front.notes.append(Unmapped("(Bridge fields)", " ".join(unread), "ConfigContainer fields no "
                                    "Megatron argument sets (Bridge's own settings): not read"))
    return front

"""emit megatron -> import megatron: every field of planner/config/megatron_arguments.py's table,
and every field its SPECIAL arguments write (precision, FP8/FP4, GTP weight shards, rank order,
attention kind), is moved off Megatron's default in some config, and the import gives each back.

One config cannot hold them all, because Megatron builds one attention per model: the standard
attention's fields, MLA's (with DeepSeek-V3.2's DSA indexer) and DeepSeek-V4's hybrid attention
(its own entry, pretrain_hybrid.py) exclude each other, and a Mamba stack goes through that entry
too. So there are four architectures, each the
smallest MoE model plus the switches that let the fields under them be written (FP8 for the recipe,
the precision-aware optimizer for its dtypes, activation offloading for its settings, the flex
dispatcher for its backend). Each field is moved in the first architecture where some value keeps
the config valid and is emitted; a field already moved in an earlier one is left at its default in
the later ones, so Megatron's either-or pairs (swiglu or quick_geglu, decoder_first/last layers or
account_for_*, adam's betas or sgd, main-only NCCL EP zero-copy or dev-only features, the three
spellings of virtual stages) land in different configs; the third, a pipeline layout, is set on
the DeepSeek-V4 config, whose hybrid pattern carries it. The configs are built from the table, so a
new argument is covered without editing this test, and one the test cannot move fails it.
"""

from __future__ import annotations

import copy
import shlex
import typing
from collections.abc import Callable
from typing import Any

from planner.config.importers.megatron_args import import_arguments
from planner.config.layout_strings import parse_layout
from planner.config.loader import InvalidConfig, parse_config
from planner.config.megatron_arguments import (
    NOT_EMITTED,
    _unwrap,
    argument_table,
    megatron_default,
    section_model,
)
from planner.config.megatron_names import PP_DP_ORDER
from planner.config.schema import Config
from planner.emit import EmitError
from planner.emit.megatron import megatron_arguments, planned_hash_blocks
from planner.layout.pipeline import stage_split
from planner.rules.overlap import GRAPH_MODULES

Data = dict[str, dict[str, Any]]

BASE: Data = {
    "model": {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128,
              "num_experts": 4, "moe_router_topk": 2},
    "parallel": {"world_size": 8, "ep": 2},
    "training": {"seq_length": 64},
}
# Each architecture's settings over BASE, in the order fields are moved.
ARCHITECTURES: dict[str, Data] = {
    "standard attention": {
        "training": {"fp8_format": "hybrid", "optimizer": "adam", "use_distributed_optimizer": True,
                     "use_precision_aware_optimizer": True, "optimizer_cpu_offload": True},
        "overlap": {"fine_grained_activation_offloading": True, "offload_modules": ["attn_norm"]},
        "moe": {"moe_token_dispatcher_type": "flex"},
    },
    "MLA with DSA": {
        # the account-for flags (the standard config holds decoder_first/last) split a pipeline
        "parallel": {"pp": 2, "account_for_embedding_in_pipeline_split": True,
                     "account_for_loss_in_pipeline_split": True},
        "model": {"attention_variant": "mla", "multi_latent_attention": True, "kv_lora_rank": 16,
                  "dsa": True, "index_n_heads": 2, "index_head_dim": 8, "index_topk": 16},
    },
    "DeepSeek-V4 hybrid": {
        # the layout becomes the hybrid pattern's `|` segments and comes back from them
        "parallel": {"pp": 2, "pipeline_model_parallel_layout": "Ett|ttL"},
        "model": {"attention_variant": "dsv4_hybrid", "compress_ratios": [0, 4, 128, 4],
                  "q_lora_rank": 16, "o_groups": 2, "o_lora_rank": 8, "csa_window_size": 8,
                  "index_n_heads": 2, "index_head_dim": 8, "index_topk": 16},
    },
    "Mamba stack": {
        # Mamba-2 mixers on the hybrid entry (block 1 is attention alone: a mixer-only block); the
        # layout becomes the pattern's `|` segments as for DeepSeek-V4
        "parallel": {"pp": 2, "pipeline_model_parallel_layout": "Ett|ttL"},
        "model": {"mamba_layers": [1, 0, 1, 1], "mixer_only_layers": [0, 1, 0, 0],
                  "mamba_num_heads": 4, "mamba_head_dim": 16,
                  "mamba_num_groups": 2, "mamba_state_dim": 16},
    },
}
# Table fields no config can move, each with its reason: empty, so a new table field the test cannot
# move fails it until it is covered (or named here with why Megatron never reads it back).
LEFT_AT_DEFAULT: dict[str, str] = {}
# Values for fields whose schema type names none: Megatron's own (Megatron-LM dev@d48bd6be
# megatron/core/transformer/transformer_config.py TransformerConfig.recompute_modules' allowed
# modules; megatron/core/transformer/enums.py CudaGraphModule via planner/rules/overlap.py; the one
# rank order besides the default its command line takes, --use-tp-pp-dp-mapping).
VALUES: dict[str, list[Any]] = {
    "overlap.recompute_modules": [["core_attn"], ["moe_act"]],
    "overlap.cuda_graph_scope": [[m] for m in GRAPH_MODULES],
    "parallel.order": [PP_DP_ORDER],
    # resolved when unset (on, or off where Megatron has no fused RoPE): off is what moves it
    "training.apply_rope_fusion": [False],
}
# Fields Megatron reads through an argument of another name or meaning (planner/config/
# megatron_arguments.py SPECIAL, read by the importer's _apply_special), with those arguments.
SPECIAL_FIELDS: dict[tuple[str, str], set[str]] = {
    ("training.precision", "str"): {"--bf16", "--fp16"},
    ("training.fp8", "flag"): {"--fp8-format"},
    ("training.fp4", "flag"): {"--fp4-format"},
    ("parallel.gtp", "int"): {"--tensor-parallel-num-weight-shards"},
    ("parallel.egtp", "int"): {"--expert-tensor-parallel-num-weight-shards"},
    ("parallel.order", "str"): {"--use-tp-pp-dp-mapping"},
    ("model.dsa", "flag"): {"--experimental-attention-variant"},
    ("model.attention_variant", "str"): {"--multi-latent-attention", "--experimental-attention-variant"},
}


# Fields Megatron reads in another spelling than moeplan's: compared by what they mean.
SAME_MEANING: dict[str, Callable[[Config], Any]] = {
    # --moe-n-hash-layers counts Megatron's layers up to the last hashed MoE block, not moeplan's
    # "first N layers" (planner/emit/megatron.py megatron_hash_layer_count): the same blocks hash.
    "model.moe_n_hash_layers": lambda cfg: planned_hash_blocks(stage_split(cfg)),
    # the import writes its own spelling of a layout (`t*2` for `tt`): the same stages.
    "parallel.pipeline_model_parallel_layout":
        lambda cfg: parse_layout(cfg.parallel.pipeline_model_parallel_layout or ""),
}


def _candidates(dotted: str, kind: str) -> list[Any]:
    """Non-default values to try, in order, for a field of this kind."""
    default = megatron_default(dotted)
    section, name = dotted.split(".", 1)
    model = section_model(section)
    assert model is not None
    base = _unwrap(model.model_fields[name].annotation)
    if typing.get_origin(base) is typing.Literal:
        return [v for v in typing.get_args(base) if v != default]
    if dotted in VALUES:
        return VALUES[dotted]
    if typing.get_origin(base) is list:
        item = _unwrap(typing.get_args(base)[0])
        if typing.get_origin(item) is typing.Literal:
            return [[v] for v in typing.get_args(item)]
    # 256: a padded vocabulary (a multiple of TP, at least the vocabulary of 128)
    numbers = {"flag": [not default], "int": [2, 4, 1, 8, 256], "float": [0.5, 2.0, 0.25],
               "ints": [[2, 2]], "moe_freq": [2, [1, 0, 1, 0]], "int_tuple": [[8, 0]],
               "bracket_ints": [[0, 4, 4, 4]]}
    return [v for v in numbers.get(kind, []) if v != default]


def table_fields() -> dict[tuple[str, str], set[str]]:
    """(field, kind) of every table argument the emitter passes, and of every field a SPECIAL
    argument writes, with the flags that write it."""
    fields: dict[tuple[str, str], set[str]] = dict(SPECIAL_FIELDS)
    for flag, (dotted, kind) in argument_table().items():
        if dotted not in NOT_EMITTED:
            fields.setdefault((dotted, kind), set()).add(flag)
    return fields


def _emitted(data: Data) -> set[str]:
    """The flags emitted for a config; empty when it is invalid or cannot be emitted."""
    try:
        return {f.flag for f in megatron_arguments(parse_config(data)).flags}
    except (ValueError, EmitError, InvalidConfig):
        return set()


def _value(data: Data, dotted: str) -> Any:
    section, name = dotted.split(".", 1)
    return data.get(section, {}).get(name, megatron_default(dotted))


def _moved(data: Data, dotted: str) -> bool:
    value = _value(data, dotted)
    return value is not None and value != megatron_default(dotted)


def _move_all(data: Data, done: set[str]) -> Data:
    """Move every field not in `done`, pass after pass until none moves: a field written only under
    another (the window skip frequency under a window) moves in the pass after its parent."""
    changed = True
    while changed:
        changed = False
        for (dotted, kind), flags in table_fields().items():
            if dotted in done or _moved(data, dotted):
                continue
            section, field = dotted.split(".", 1)
            for value in _candidates(dotted, kind):
                trial = copy.deepcopy(data)
                trial.setdefault(section, {})[field] = value
                if _emitted(trial) & flags:  # valid, and written where Megatron reads it
                    data, changed = trial, True
                    break
    return data


def architectures() -> tuple[dict[str, Data], dict[str, set[str]], list[str]]:
    """Each architecture's config, the fields it moves, and the table fields none could move."""
    configs: dict[str, Data] = {}
    moved: dict[str, set[str]] = {}
    done: set[str] = set()
    for name, settings in ARCHITECTURES.items():
        data = copy.deepcopy(BASE)
        for section, values in settings.items():
            data.setdefault(section, {}).update(values)
        assert _emitted(data), name
        data = _move_all(data, done)
        configs[name] = data
        moved[name] = {d for d, _ in table_fields() if _moved(data, d)}
        done |= moved[name]
    stuck = [d for d, _ in table_fields() if d not in done]
    return configs, moved, stuck


def _round_trip(data: Data) -> tuple[Config, Config]:
    cfg = parse_config(data)
    args = megatron_arguments(cfg)
    words = [args.entry, *(w for f in args.flags for w in (f.flag, *f.values))]
    imported = import_arguments(shlex.join(words), world_size=cfg.parallel.world_size)
    assert not [u for u in imported.unmapped if u.error], imported.unmapped
    return cfg, parse_config(imported.data)


def _meaning(cfg: Config, dotted: str) -> Any:
    if dotted in SAME_MEANING:
        return SAME_MEANING[dotted](cfg)
    section, field = dotted.split(".", 1)
    return getattr(getattr(cfg, section), field)


def test_every_table_field_survives_emit_then_import() -> None:
    configs, moved, stuck = architectures()
    assert sorted(stuck) == sorted(LEFT_AT_DEFAULT), "table fields no architecture moved off default"
    for name, data in configs.items():
        cfg, back = _round_trip(data)
        for dotted in sorted(moved[name]):
            assert _meaning(back, dotted) == _meaning(cfg, dotted), (name, dotted)
    covered = set().union(*moved.values())
    assert len(covered) == len(table_fields()) - len(LEFT_AT_DEFAULT)
    print({name: len(fields) for name, fields in moved.items()}, f"{len(covered)} fields in all")

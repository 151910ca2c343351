"""emit megatron -> import megatron over one config whose every plain table field (each argument of
planner/config/megatron_arguments.py that `emit` writes from a field) differs from Megatron's
default: the import gives back each of those fields. The config is built from the table, so a new
plain argument is covered without editing this test."""

from __future__ import annotations

import shlex
import typing
from typing import Any

from planner.config.importers.megatron_args import import_arguments
from planner.config.loader import InvalidConfig, parse_config
from planner.config.megatron_arguments import (
    Emit,
    _unwrap,
    argument_table,
    emit_steps,
    megatron_default,
    section_model,
)
from planner.emit import EmitError
from planner.emit.megatron import megatron_arguments

BASE: dict[str, dict[str, Any]] = {
    "model": {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128,
              "num_experts": 4, "moe_router_topk": 2},
    "parallel": {"world_size": 8, "ep": 2},
    "training": {"seq_length": 64},
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
    numbers = {"flag": [not default], "int": [2, 4, 1, 8], "float": [0.5, 2.0, 0.25],
               "str": [], "ints": [[2, 2]], "strs": [], "moe_freq": [2, [1, 0, 1, 0]],
               "int_tuple": [[8, 0]], "bracket_ints": [[0, 4, 4, 4]]}
    return [v for v in numbers.get(kind, []) if v != default]


def _plain_fields() -> dict[tuple[str, str], set[str]]:
    """(field, kind) of every plain step, with the flags that write it."""
    table = argument_table()
    fields: dict[tuple[str, str], set[str]] = {}
    for step in emit_steps():
        if isinstance(step, Emit):
            fields.setdefault(table[step.flag], set()).add(step.flag)
    return fields


def _emitted(data: dict[str, Any]) -> set[str]:
    """The flags emitted for a config; empty when it is invalid or cannot be emitted."""
    try:
        return {f.flag for f in megatron_arguments(parse_config(data)).flags}
    except (ValueError, EmitError, InvalidConfig):
        return set()


def everything_changed() -> tuple[dict[str, Any], list[str]]:
    """The base config with every plain field moved off Megatron's default where some candidate
    value keeps the config valid and emittable; the fields none could move."""
    data = {k: dict(v) for k, v in BASE.items()}
    stuck = []
    for (dotted, kind), flags in _plain_fields().items():
        section, name = dotted.split(".", 1)
        current = data.get(section, {}).get(name, megatron_default(dotted))
        if current is not None and current != megatron_default(dotted):
            continue
        for value in _candidates(dotted, kind):
            trial = {k: dict(v) for k, v in data.items()}
            trial.setdefault(section, {})[name] = value
            if _emitted(trial) & flags:  # valid, and read where Megatron reads it
                data = trial
                break
        else:
            stuck.append(dotted)
    return data, stuck


def test_every_plain_field_survives_emit_then_import() -> None:
    data, stuck = everything_changed()
    cfg = parse_config(data)
    args = megatron_arguments(cfg)
    words = [args.entry, *(w for f in args.flags for w in (f.flag, *f.values))]
    imported = import_arguments(shlex.join(words), world_size=cfg.parallel.world_size)
    assert not [u for u in imported.unmapped if u.error], imported.unmapped
    back = parse_config(imported.data)
    compared = 0
    for dotted, _ in _plain_fields():
        if dotted in stuck:
            continue
        section, name = dotted.split(".", 1)
        ours, theirs = getattr(getattr(cfg, section), name), getattr(getattr(back, section), name)
        assert theirs == ours, dotted
        compared += 1
    assert compared >= 60, (compared, stuck)  # not a vacuous pass
    print(f"{compared} fields moved off Megatron's default; stuck: {stuck}")

"""Seeded config mutations for the no-traceback fuzz: start from a real config, break it.

Every base is a config a user could start from (each bundled example, valid or not, each preset,
the rule catalog's example base); each case applies a few mutations drawn from the schema itself:
values of the right type, extremes (zero, negative, huge, non-finite, tiny), wrong types,
deletions of fields and sections, nested garbage, unknown keys and `ignore:` lists made of real
rule codes. A plain `random.Random(seed)` drives it, so a case is reproduced by its seed alone.
"""

from __future__ import annotations

import copy
import random
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from planner.config.presets import PRESETS
from planner.config.schema import Config
from planner.rules import CODES
from planner.rules.example_base import EXAMPLE_BASE_YAML

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SECTIONS: dict[str, type[BaseModel]] = {
    name: info.annotation for name, info in Config.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
}


def _preset_doc(preset: str) -> dict[str, Any]:
    world = 1024 if preset == "deepseek-v4-pro" else 128
    return {"model": {"preset": preset}, "parallel": {"world_size": world, "ep": 64},
            "training": {"seq_length": 4096, "global_batch_size": 2 * world}}


def base_docs() -> dict[str, dict[str, Any]]:
    """Every starting point, by name: examples (valid and invalid), presets, the rule base."""
    docs = {"rules-example-base": yaml.safe_load(EXAMPLE_BASE_YAML)}
    docs.update({f"preset {name}": _preset_doc(name) for name in sorted(PRESETS)})
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        docs[str(path.relative_to(EXAMPLES))] = yaml.safe_load(path.read_text())
    return docs


# ----------------------------------------------------------------------------- value pools

SMALL_INTS = (0, 1, 2, 3, 4, 6, 7, 8, 16, 32, 61, 64, 128, 256, 384, 1024)
HUGE_INTS = (-1, -64, -(2**31), 2**31, 2**53 + 1, 2**63, 10**20, 10**400)
FLOATS = (0.0, -0.0, 1.0, 0.5, 1.5, 1e-3, 2.5, 1e6)
EXTREME_FLOATS = (float("inf"), float("-inf"), float("nan"), 1e308, 1.7976931348623157e308,
                  5e-324, 2.2250738585072014e-308, -1.0, 1e-300, 1e300, 4.9e-300)
STRINGS = ("", " ", "tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-pp-cp-ep-dp", "pp-dp", "tp-dp",
           "tp-cp-ep-dp-pp-tp", "TP-CP-EP-DP-PP", "Et*2|t*2L", "Ett|ttL", "E|tttt|L", "Et|tL",
           "E(t|)*4L", "E|t*1000000|L", "E|m|L", "(((", "*", "[/x]", "$(reboot)", "a'b\"c",
           "line\nbreak", "\x00", "é", "x" * 300, "01:00:00", "moe", "attn", "core_attn", "full",
           "logs", "/abs/logs", "../up")
JUNK_LEAVES: tuple[Any, ...] = (None, True, False, 0, -1, 1.5, float("nan"), "", "x", 2**70,
                                [], {}, [None], {"a": 1})


def _garbage(rng: random.Random, depth: int = 0) -> Any:
    """Nested junk: lists and dicts of junk, a few levels deep."""
    roll = rng.random()
    if depth >= 3 or roll < 0.5:
        return rng.choice(JUNK_LEAVES)
    if roll < 0.75:
        return [_garbage(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(("a", "tp", "model", "1", "")): _garbage(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def typed_value(rng: random.Random, annotation: Any, *, extreme: bool) -> Any:
    """A value of the field's own type: everyday values, or extremes when asked."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return typed_value(rng, args[0], extreme=extreme)
    if annotation is bool:
        return rng.random() < 0.5
    if annotation is int:
        return rng.choice(HUGE_INTS if extreme else SMALL_INTS)
    if annotation is float:
        return rng.choice(EXTREME_FLOATS if extreme else FLOATS)
    if annotation is str:
        return rng.choice(STRINGS)
    if origin is Literal:
        return rng.choice(args)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if rng.random() < 0.15:
            return None
        return typed_value(rng, rng.choice(members), extreme=extreme)
    if origin is list:
        item = args[0] if args else str
        return [typed_value(rng, item, extreme=extreme and rng.random() < 0.5)
                for _ in range(rng.choice((0, 1, 2, 3, 4, 8, 61, 62)))]
    if origin is dict:
        return {rng.choice(STRINGS): rng.choice(STRINGS) for _ in range(rng.randint(0, 3))}
    return _garbage(rng)


def wrong_type(rng: random.Random) -> Any:
    return rng.choice(("64", "yes", "1e3", [1], {"x": 1}, None, True, 1.0, 2.5, "", [[[]]],
                       _garbage(rng)))


# ----------------------------------------------------------------------------- mutations

Mutation = Callable[[random.Random, dict[str, Any]], str]


def _section(rng: random.Random, doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name = rng.choice(sorted(SECTIONS))
    target = doc.get(name)
    if not isinstance(target, dict):
        target = doc[name] = {}
    return name, target


def _field(rng: random.Random, name: str) -> tuple[str, Any]:
    fields = SECTIONS[name].model_fields
    field = rng.choice(sorted(fields))
    return field, fields[field].annotation


def _set_field(rng: random.Random, doc: dict[str, Any], value: Callable[[Any], Any]) -> str:
    """One field of one section gets `value(its annotation)`."""
    name, target = _section(rng, doc)
    field, annotation = _field(rng, name)
    target[field] = value(annotation)
    return f"{name}.{field} = {target[field]!r:.60}"


def typed(rng: random.Random, doc: dict[str, Any]) -> str:
    return _set_field(rng, doc, lambda annotation: typed_value(rng, annotation, extreme=False))


def extreme(rng: random.Random, doc: dict[str, Any]) -> str:
    return _set_field(rng, doc, lambda annotation: typed_value(rng, annotation, extreme=True))


def wrongly_typed(rng: random.Random, doc: dict[str, Any]) -> str:
    return _set_field(rng, doc, lambda annotation: wrong_type(rng))


def garbage_field(rng: random.Random, doc: dict[str, Any]) -> str:
    return _set_field(rng, doc, lambda annotation: _garbage(rng))


def delete_field(rng: random.Random, doc: dict[str, Any]) -> str:
    name, target = _section(rng, doc)
    if not target:
        return "delete nothing"
    field = rng.choice(sorted(target, key=str))
    del target[field]
    return f"del {name}.{field}"


def delete_section(rng: random.Random, doc: dict[str, Any]) -> str:
    name = rng.choice(sorted(doc, key=str)) if doc else "model"
    doc.pop(name, None)
    return f"del {name}"


def garbage_section(rng: random.Random, doc: dict[str, Any]) -> str:
    name = rng.choice([*SECTIONS, "ignore"])
    doc[name] = _garbage(rng)
    return f"{name} = {doc[name]!r:.60}"


def unknown_key(rng: random.Random, doc: dict[str, Any]) -> str:
    if rng.random() < 0.3:
        key = rng.choice(("extra", "Model", "", "ignore_all", "1"))
        doc[key] = _garbage(rng)
        return f"top-level {key!r}"
    name, target = _section(rng, doc)
    key = rng.choice(("tensor_parallel", "tp ", "hiden_size", "[/x]", "", "1"))
    target[key] = _garbage(rng)
    return f"{name}.{key!r}"


def ignore_codes(rng: random.Random, doc: dict[str, Any]) -> str:
    """`ignore:` with real codes (often every one), mixed case, or junk entries."""
    roll = rng.random()
    if roll < 0.35:
        codes = list(CODES)
    elif roll < 0.85:
        codes = rng.sample(CODES, rng.randint(1, 8))
    else:
        codes = [rng.choice(("PAR999", "", " par001 ", "ign001", "x" * 100))]
    doc["ignore"] = [c.lower() if rng.random() < 0.1 else c for c in codes]
    return f"ignore {len(codes)} code(s)"


def coherent_degrees(rng: random.Random, doc: dict[str, Any]) -> str:
    """Degrees that divide the world size, to get past the grid rules into budgets and emit."""
    parallel = doc.get("parallel")
    if not isinstance(parallel, dict):
        parallel = doc["parallel"] = {}
    world = parallel.get("world_size")
    world = world if isinstance(world, int) and 0 < world <= 4096 else rng.choice((8, 16, 64, 128))
    parallel["world_size"] = world
    divisors = [d for d in (1, 2, 4, 8, 16, 32, 64) if world % d == 0]
    for axis in rng.sample(("tp", "cp", "pp", "ep", "etp", "vpp", "gtp", "egtp"), rng.randint(1, 4)):
        parallel[axis] = rng.choice(divisors)
    return f"degrees {parallel}"


MUTATIONS: tuple[tuple[Mutation, int], ...] = (
    (typed, 12), (extreme, 5), (wrongly_typed, 3), (delete_field, 3), (delete_section, 1),
    (garbage_section, 1), (garbage_field, 2), (unknown_key, 1), (ignore_codes, 3),
    (coherent_degrees, 4),
)


def mutated_config(seed: int, bases: dict[str, dict[str, Any]]) -> tuple[str, Any, list[str]]:
    """Case `seed`: one base, 1-4 mutations; returns the base's name, the YAML data and what was
    done to it."""
    rng = random.Random(seed)
    name = rng.choice(sorted(bases))
    doc = copy.deepcopy(bases[name])
    steps = [f"base {name}"]
    functions, weights = zip(*MUTATIONS, strict=True)
    for mutate in rng.choices(functions, weights, k=rng.choice((1, 1, 2, 2, 3, 4))):
        steps.append(mutate(rng, doc))
    return name, doc, steps

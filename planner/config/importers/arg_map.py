"""YAML argument maps: `--flag: value` mappings, on their own or under `MODEL_ARGS:` with the job's
environment under `ENV_VARS:` — the form of Megatron-LM's functional tests
(tests/functional_tests/test_cases/*/*/model_config.yaml) and of Megatron-MoE-ModelZoo's
model_configs/benchmarking/*.yaml; and Megatron-LM's MoE recipes (examples/moe_recipes/*/*/*.yaml),
whose `ARGS:` names each argument by its underscore name.

Both harnesses turn the map into a command line alike (Megatron-MoE-ModelZoo
sbatch_benchmarking.sh, its yq query): a `true` value is the bare flag, a `false` value leaves the
flag out, anything else is the flag and the value; `${VAR}` in a value is filled from the
environment (envsubst) — here from `--set VAR=VALUE`, or named as unresolved. They differ in how a
value becomes words. Megatron-LM's runner (d98e8a64 tests/functional_tests/shell_test_utils/
_run_training.sh) strips a value wrapped in `[ ]` and lets `eval` split it into words
(`"[moe_act layernorm]"` is two), and quotes a value wrapped in `( )` or holding spaces into one
word; ModelZoo's command line is expanded unquoted, so bash splits every value at its spaces.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

import yaml

from planner.config.importers.shell_script import ScriptTooComplex, Unresolved, expand_value
from planner.config.loader import _too_many_nodes, structure_problem

_FORMS = {
    "TEST_TYPE": "YAML argument map (MODEL_ARGS of a Megatron-LM functional test)",
    "": "YAML argument map (MODEL_ARGS, as Megatron-MoE-ModelZoo model configs write it)",
    "ARGS": "YAML argument map (ARGS of a Megatron-LM MoE recipe)",
}


def _recipe_arguments(data: dict) -> dict | None:
    """A Megatron-LM MoE recipe (dev@d48bd6be examples/moe_recipes/*/*/*.yaml, its README: `ARGS`
    holds Megatron-LM's training arguments by their underscore names beside `ENV_VARS` and
    `DEPENDENCIES`) as a `--flag: value` map: each name is its flag with dashes, a list its words."""
    arguments = data.get("ARGS")
    if not isinstance(arguments, dict) or "MODEL_ARGS" in data:
        return None
    if not all(isinstance(k, str) and re.fullmatch(r"[a-z][a-z0-9_]*", k) for k in arguments):
        return None
    return {"--" + key.replace("_", "-"): value for key, value in arguments.items()}


_BRACKETED = re.compile(r"\[[^]]+\]")  # the runner's grep -E '^\[[^]]+\]$'


def runner_words(value: str) -> list[str]:
    """The words Megatron-LM's functional-test runner passes for one map value (xargs trims it)."""
    value = value.strip()
    if _BRACKETED.fullmatch(value):
        try:
            return shlex.split(value[1:-1])
        except ValueError:
            return value[1:-1].split()
    return [value]


def _one_word(value: str) -> list[str]:
    return [value]


@dataclass
class ArgumentMap:
    form: str
    argv: list[str]
    env: dict[str, str]
    unresolved: dict[str, Unresolved] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)  # keys that are no `--flag`


_BASE_LOADER = yaml.CBaseLoader if yaml.__with_libyaml__ else yaml.BaseLoader


def load_map(text: str) -> dict | None:
    """The YAML mapping of `text` with every scalar a string (as the harnesses' yq reads it), or
    None when the text is not a YAML mapping. Composed once and measured before it is built, with
    a config's caps (planner/config/loader.py structure_problem: aliases, their depth, the nodes
    they add), so a few hundred bytes of aliases cannot expand into millions of arguments;
    ScriptTooComplex when it is too big."""
    loader = _BASE_LOADER(text)
    try:
        problem = _too_many_nodes(text)
        node = None if problem else loader.get_single_node()
        problem = problem or (structure_problem(node) if node is not None else None)
        if problem:
            raise ScriptTooComplex("the YAML argument map", f"too big to read: {problem}")
        data = loader.construct_document(node) if node is not None else None
    except (yaml.YAMLError, RecursionError, ValueError):
        return None
    finally:
        loader.dispose()
    return data if isinstance(data, dict) else None


def is_argument_map(data: dict) -> bool:
    arguments = _recipe_arguments(data) or data.get("MODEL_ARGS", data)
    if not isinstance(arguments, dict) or not arguments:
        return False
    flags = [key for key in arguments if isinstance(key, str) and key.startswith("--")]
    return len(flags) * 2 > len(arguments)


def read_map(data: dict, sets: dict[str, str]) -> ArgumentMap:
    recipe = _recipe_arguments(data)
    if recipe is not None:
        data = {"MODEL_ARGS": recipe, "ENV_VARS": data.get("ENV_VARS"), "ARGS": True}
    nested = isinstance(data.get("MODEL_ARGS"), dict)
    arguments: dict = data["MODEL_ARGS"] if nested else data
    form = (_FORMS["ARGS"] if recipe is not None else _FORMS["TEST_TYPE"] if "TEST_TYPE" in data
            else _FORMS[""]) if nested else "YAML argument map"
    env_section = data.get("ENV_VARS") if nested else None
    env = {str(k): str(v) for k, v in env_section.items()} if isinstance(env_section, dict) else {}
    found = ArgumentMap(form, [], env)
    split = (runner_words if "TEST_TYPE" in data else str.split) if nested else _one_word
    for key, value in arguments.items():
        if not isinstance(key, str) or not key.startswith("--"):
            found.ignored.append(str(key))
            continue
        values = value if isinstance(value, list) else [value]
        if any(isinstance(item, list | dict) for item in values):
            raise ScriptTooComplex(f"the YAML argument map's {key[:80]}", "a value nested in a list "
                                   "or mapping (an argument takes a word or a list of words)")
        words: list[str] = []
        for item in values:
            expanded, unresolved = expand_value(str(item) if item is not None else "", {**env, **sets},
                                                f"the YAML argument map's {key[:80]}")
            found.unresolved.update(unresolved)
            words += split(expanded) if isinstance(value, str) else [expanded]
        if words == ["false"]:
            continue
        found.argv += [key] if words in (["true"], [""], []) else [key, *words]
    return found

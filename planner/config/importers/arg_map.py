"""YAML argument maps: `--flag: value` mappings, on their own or under `MODEL_ARGS:` with the job's
environment under `ENV_VARS:` — the form of Megatron-LM's functional tests
(tests/functional_tests/test_cases/*/*/model_config.yaml) and of Megatron-MoE-ModelZoo's
model_configs/benchmarking/*.yaml.

Both harnesses turn the map into a command line the same way (Megatron-MoE-ModelZoo
sbatch_benchmarking.sh, its yq query): a `true` value is the bare flag, a `false` value leaves the
flag out, anything else is the flag and the value; `${VAR}` in a value is filled from the
environment (envsubst) — here from `--set VAR=VALUE`, or named as unresolved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from planner.config.importers.shell_script import ScriptTooComplex, Unresolved, expand_value
from planner.config.loader import _too_many_nodes, structure_problem

_FORMS = {
    "TEST_TYPE": "YAML argument map (MODEL_ARGS of a Megatron-LM functional test)",
    "": "YAML argument map (MODEL_ARGS, as Megatron-MoE-ModelZoo model configs write it)",
}


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
    arguments = data.get("MODEL_ARGS", data)
    if not isinstance(arguments, dict) or not arguments:
        return False
    flags = [key for key in arguments if isinstance(key, str) and key.startswith("--")]
    return len(flags) * 2 > len(arguments)


def read_map(data: dict, sets: dict[str, str]) -> ArgumentMap:
    nested = isinstance(data.get("MODEL_ARGS"), dict)
    arguments: dict = data["MODEL_ARGS"] if nested else data
    form = (_FORMS["TEST_TYPE"] if "TEST_TYPE" in data else _FORMS[""]) if nested else "YAML argument map"
    env_section = data.get("ENV_VARS") if nested else None
    env = {str(k): str(v) for k, v in env_section.items()} if isinstance(env_section, dict) else {}
    found = ArgumentMap(form, [], env)
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
            words.append(expanded)
        if words == ["false"]:
            continue
        found.argv += [key] if words in (["true"], [""]) else [key, *words]
    return found

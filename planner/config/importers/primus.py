"""AMD Primus experiment YAMLs (`modules: {pre_trainer: {framework: megatron, config: …, model: …,
overrides: …}}`), merged as Primus merges them, read statically.

Primus (AMD-AGI/Primus@fd1eeabb primus/core/launcher/parser.py PrimusParser.parse_trainer_module)
loads the module preset primus/configs/modules/megatron/<config> and the model preset
primus/configs/models/megatron/<model>, each with its `extends:` chain deep-merged in order, the
file's own keys last (primus/core/config/yaml_loader.py _apply_extends); adds the model's keys the
module does not already hold (yaml_utils.merge_namespace without override), then the experiment's
`overrides`. `${VAR:default}` is the environment's VAR or the default, read back as a bool or number
(yaml_loader.py _resolve_env_in_string). The merged keys are Megatron's argument names; a value
equal to Megatron's default adds no word, so the argument list is what differs from Megatron's
defaults (planner/config/data/megatron_dests.tsv). Primus's own keys (its Turbo kernels, logging,
experiment bookkeeping) are named, not carried.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from planner.config.importers.assemble import FrontEnd
from planner.config.importers.megatron_args import Unmapped
from planner.config.importers.megatron_log import argument_destination
from planner.config.importers.shell_script import Unresolved
from planner.config.importers.vocabulary import json_file
from planner.config.megatron_releases import resolve_version

PRESETS = Path("primus") / "configs"
_ENV = re.compile(r"\$\{([^:{}]+)(?::([^}]*))?\}")
_FLOAT = re.compile(r"^-?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)$")
MAX_DEPTH = 12


class PrimusUnreadable(ValueError):
    """The experiment names a preset that is not found (exit 2, with the path tried)."""


def is_primus(data: dict) -> bool:
    modules = data.get("modules")
    return isinstance(modules, dict) and any(
        isinstance(m, dict) and m.get("framework") == "megatron" for m in modules.values())


def _scalar(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


def _resolve(value: Any, sets: dict[str, str], unresolved: dict[str, Unresolved]) -> Any:
    if isinstance(value, dict):
        return {k: _resolve(v, sets, unresolved) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, sets, unresolved) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value

    def one(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in sets:
            return sets[name]
        if default is None:
            unresolved[name] = Unresolved(name, "required by the experiment (no default) and not set")
            return match.group(0)
        return default

    replaced = _ENV.sub(one, value)
    return _scalar(replaced) if replaced != value and "${" not in replaced else replaced


def _merge(base: dict, over: dict) -> dict:
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(
            merged.get(key), dict) else value
    return merged


def _load(path: Path, sets: dict[str, str], unresolved: dict[str, Unresolved], read: list[Path],
          depth: int = 0) -> dict:
    if depth > MAX_DEPTH or not path.is_file():
        raise PrimusUnreadable(f"Primus preset not found: {path}")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise PrimusUnreadable(f"{path} is not a YAML mapping")
    read.append(path)
    data = _resolve(data, sets, unresolved)
    bases = data.pop("extends", None)
    merged: dict = {}
    for base in [bases] if isinstance(bases, str) else bases or []:
        target = Path(os.path.normpath(path.parent / base))
        merged = _merge(merged, _load(target, sets, unresolved, read, depth + 1))
    return _merge(merged, data)


def presets_root(origin: Path | None) -> Path | None:
    """The Primus checkout's primus/configs above the experiment file."""
    for folder in ([origin, *origin.parents] if origin else []):
        if (folder / PRESETS / "modules" / "megatron").is_dir():
            return folder / PRESETS
    return None


def megatron_words(key: str, value: Any) -> list[str] | None:
    """Megatron's words for one merged key: none where the value is Megatron's default; None for a
    key no Megatron argument has (Primus's own)."""
    row = argument_destination(key)
    if row is None:
        return None
    if value is None:
        return []
    if row.kind in ("true", "false"):
        on = bool(value)
        return [row.flag] if on == (row.kind == "true") and str(on) != row.default else []
    if str(value) == row.default or value == []:  # Megatron prints its defaults with str()
        return []
    values = value if isinstance(value, list) else [value]
    text = [str(v) for v in values]
    if " ".join(text) == row.default or (len(text) == 1 and _same(text[0], row.default)):
        return []
    return [row.flag, *text]


def _same(given: str, default: str) -> bool:
    try:
        return float(given) == float(default)
    except ValueError:
        return given == default


def primus_front_end(text: str, sets: dict[str, str], origin: Path | None) -> FrontEnd:
    unresolved: dict[str, Unresolved] = {}
    experiment = _resolve(yaml.safe_load(text), sets, unresolved)
    name, module = next((n, m) for n, m in experiment["modules"].items()
                        if isinstance(m, dict) and m.get("framework") == "megatron")
    root = presets_root(origin)
    if root is None:
        raise PrimusUnreadable("the experiment's presets live in a Primus checkout (primus/configs/"
                               "modules/megatron, primus/configs/models/megatron); import the file "
                               "from inside the checkout")
    read: list[Path] = []
    merged = _load(root / "modules" / "megatron" / str(module["config"]), sets, unresolved, read)
    model = _load(root / "models" / "megatron" / str(module["model"]), sets, unresolved, read)
    merged.update({k: v for k, v in model.items() if k not in merged})
    merged = _merge(merged, module.get("overrides") or {})
    argv: list[str] = []
    own: list[str] = []
    for key, value in merged.items():
        words = megatron_words(key, value)
        if words is None:
            own.append(key)
        else:
            argv += words
    front = FrontEnd(f"Primus experiment ({name}: {module['config']} + {module['model']})", argv,
                     "pretrain_gpt.py", unresolved=unresolved, origins=[origin] if origin else [])
    front.notes.append(Unmapped("(Primus presets)", " ".join(str(p.relative_to(root)) for p in read),
                                "merged as Primus merges them (extends chains, module over model, then "
                                "the experiment's overrides); values equal to Megatron's defaults add no "
                                "argument"))
    _pinned_megatron(front, root.parent / "_thirdparty.lock")
    changing = [k for k in own if merged.get(k) not in (None, False, 0, "", "default")]
    if changing:
        front.notes.append(Unmapped("(Primus's own)", " ".join(f"{k}={merged[k]}" for k in changing),
                                    "Primus's keys (its Turbo kernels, DeepEP, sync-free MoE, logging): "
                                    "no Megatron-LM argument; moeplan's figures are Megatron's kernels"))
    return front


def _pinned_megatron(front: FrontEnd, lock: Path) -> None:
    """megatron.version from the Megatron-LM commit the Primus checkout pins (primus/_thirdparty.lock:
    its third_party entry named Megatron-LM, which Primus checks out and runs). A commit moeplan
    cannot place is written as read, so rule VER001 names it."""
    data = json_file(lock)
    entries = data.get("third_party") if data is not None else None
    commit = next((e.get("commit") for e in entries or []
                   if isinstance(e, dict) and e.get("name") == "Megatron-LM"), None)
    if not isinstance(commit, str) or not commit:
        return
    known = resolve_version(commit)
    front.fields["megatron.version"] = known.name if known is not None else commit
    front.notes.append(Unmapped("(Primus's Megatron-LM)", commit, f"the commit {lock.name} pins: "
                                + (f"megatron.version {known.name}" if known is not None else
                                   "not one moeplan can place (VER001 names it)")))

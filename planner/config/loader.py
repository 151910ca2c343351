"""Read a YAML config safely and turn every way it can be wrong into findings or a usage error.

Unreadable input (missing file, a directory, binary junk, YAML syntax) is a usage error (exit 2);
a readable file that does not describe a valid config yields findings (exit 1). Never a traceback.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from planner.config.importers.hf_config import HfConfigUnreadable, apply_hf_config
from planner.config.megatron_names import flag_of, megatron_arguments, moeplan_field, section_fields
from planner.config.schema import Config
from planner.findings import Finding

SCHEMA_SOURCE = "planner/config/schema.py"
Position = tuple[int, int]


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 numbers: `1e-4` is a float (as every Megatron user writes it) and
    `04:00:00` stays a string (YAML 1.1 would read a base-60 integer)."""


_NUMBER_TAGS = {"tag:yaml.org,2002:float", "tag:yaml.org,2002:int"}
_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _NUMBER_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0o?[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def loads_as_string(value: str) -> bool:
    """Whether `value`, written as a plain YAML scalar, reads back as this string under this loader
    (`1e-6` does not: it is a float here), so a writer knows when to quote it."""
    try:
        return yaml.load(yaml.safe_dump(value), Loader=_ConfigLoader) == value  # noqa: S506
    except yaml.YAMLError:
        return False


class UnreadableConfig(Exception):
    """The input cannot be read as YAML at all (exit code 2)."""


class InvalidConfig(Exception):
    """The YAML was read but is not a valid config (exit code 1)."""

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__("; ".join(f.line() for f in findings))
        self.findings = findings


def read_text(path: str | Path) -> str:
    target = Path(path)
    if not target.exists():
        raise UnreadableConfig(f"{path}: no such file")
    if target.is_dir():
        raise UnreadableConfig(f"{path}: is a directory, expected a YAML file")
    try:
        raw = target.read_bytes()
    except OSError as exc:
        raise UnreadableConfig(f"{path}: cannot read ({exc.strerror})") from None
    if b"\x00" in raw:
        raise UnreadableConfig(f"{path}: binary data, expected a YAML text file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableConfig(f"{path}: not UTF-8 text (byte {exc.start})") from None


def _positions(node: yaml.Node, path: tuple = (), out: dict | None = None,
               duplicates: list | None = None) -> tuple[dict[tuple, Position], list]:
    """Map each key path to its 1-based (line, column), and collect duplicate keys on the way."""
    out = {} if out is None else out
    duplicates = [] if duplicates is None else duplicates
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            here = path + (key,)
            if key in seen:
                duplicates.append((here, (key_node.start_mark.line + 1, key_node.start_mark.column + 1)))
            seen.add(key)
            out[here] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _positions(value_node, here, out, duplicates)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            out[path + (index,)] = (item.start_mark.line + 1, item.start_mark.column + 1)
            _positions(item, path + (index,), out, duplicates)
    return out, duplicates


def parse_yaml(text: str, name: str = "<config>") -> tuple[Any, dict[tuple, Position], list]:
    try:
        data = yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 — a SafeLoader subclass
        node = yaml.compose(text, Loader=_ConfigLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise UnreadableConfig(f"{name}: YAML syntax error at {where}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise UnreadableConfig(f"{name}: YAML error: {exc}") from None
    except (RecursionError, ValueError, OverflowError) as exc:
        raise UnreadableConfig(f"{name}: cannot parse YAML ({type(exc).__name__})") from None
    positions, duplicates = _positions(node) if node is not None else ({}, [])
    return data, positions, duplicates


def _finding(code: str, path: str, message: str, fix: str) -> Finding:
    return Finding(code, "error", path or "<root>", message, fix, SCHEMA_SOURCE)


_known_keys = section_fields


def unknown_key_hint(path: tuple) -> tuple[str, str]:
    """The CFG001 message and fix for an unknown key. A Megatron argument is never "did you mean"
    another field: it is named as belonging to another section, as modelled under another field, or
    as not modelled (to pass through launch.megatron_extra_args); only a key that is no Megatron
    argument gets the closest known key of its section."""
    key = str(path[-1])
    message = f"unknown key '{key}'"
    home = moeplan_field(key)
    if home is not None and home.endswith("." + key):
        section = home.split(".")[0]
        return message, f"'{key}' is a field of the {section} section; move it to {home}"
    if home is not None:
        return message, f"'{key}' is a Megatron argument moeplan models as {home}; set that"
    if key in megatron_arguments():
        return (f"{message}: {key} is a Megatron argument moeplan does not model",
                f"pass it through launch.megatron_extra_args: ['{flag_of(key)}', '<value>'] "
                "(or the flag alone for a switch)")
    section = _section_model(path[:-1])
    known = _known_keys(section) if section else []
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"did you mean '{close[0]}'?" if close else (
        f"remove it; known keys here: {', '.join(known)}" if known else "remove it")
    return message, hint


def _section_model(keys: tuple) -> type[BaseModel] | None:
    model: Any = Config
    for key in keys:
        field = getattr(model, "model_fields", {}).get(key)
        if field is None:
            return None
        model = field.annotation
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _data_path(loc: tuple, data: Any) -> tuple:
    """Keep the loc parts that walk the input data; drop pydantic's union-member tags."""
    path, node = [], data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and not _is_union_tag(part):
            path.append(part)  # a missing key: still part of the path
            break
        else:
            continue
        path.append(part)
    return tuple(path)


def _is_union_tag(part: str) -> bool:
    return "[" in part or part in {"int", "str", "float", "bool", "list", "dict", "none"}


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# Whole-section model errors (planner/config/schema.py ModelSection): the field to blame and the fix.
MODEL_CONFLICTS: dict[str, tuple[str, str]] = {
    "attention_conflict": ("multi_latent_attention", "drop one of the two, or make them agree "
                           "(multi_latent_attention true is attention_variant mla)"),
    "mla_kv_lora_missing": ("kv_lora_rank", "add model.kv_lora_rank (DeepSeek-V3: 512)"),
    "gqa_conflict": ("group_query_attention", "set group_query_attention true, or drop "
                     "num_query_groups"),
}


def _error_to_finding(err: dict, data: Any, positions: dict[tuple, Position]) -> Finding:
    kind, loc = err["type"], err["loc"]
    path = _data_path(loc, data)
    dotted = ".".join(str(p) for p in path)
    where = positions.get(path)
    at = f" (line {where[0]}, column {where[1]})" if where else ""
    if kind == "extra_forbidden":
        message, hint = unknown_key_hint(path)
        return _finding("CFG001", dotted, f"{message}{at}", hint)
    if kind == "missing":
        return _finding("CFG003", dotted, f"required field '{dotted}' is missing",
                        f"add {dotted}: <value> (or a model.preset that provides it)")
    if kind == "world_size_missing":
        return _finding("CFG003", "parallel.world_size", err["msg"],
                        "add parallel.world_size: <ranks>")
    if kind == "world_size_too_large":
        return _finding("CFG004", "cluster.nodes", err["msg"],
                        "give parallel.world_size, or fewer nodes or GPUs per node")
    if kind in MODEL_CONFLICTS:
        field, fix = MODEL_CONFLICTS[kind]
        return _finding("CFG002", f"model.{field}", err["msg"], fix)
    value = _describe(err.get("input"))
    if kind == "finite_number":
        return _finding("CFG004", dotted, f"must be a finite number, got {value}{at}",
                        f"give {dotted} a finite value (.inf and .nan are not numbers moeplan "
                        "can budget with)")
    if kind in {"greater_than_equal", "greater_than", "less_than_equal", "less_than"}:
        return _finding("CFG004", dotted, f"{err['msg'].lower()}, got {value}{at}",
                        f"give {dotted} a value in range")
    return _finding("CFG002", dotted, f"{err['msg']}, got {value}{at}",
                    f"fix the type/value of {dotted}")


INT_LIMIT = 2**63 - 1  # Megatron's sizes end up in 64-bit tensors and CUDA arguments


def _oversized_integers(data: Any) -> list[tuple[tuple, int]]:
    """Every integer beyond 64 bits, anywhere in the data (walked without recursion)."""
    found, stack = [], [((), data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            stack.extend((path + (key,), value) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((path + (index,), value) for index, value in enumerate(node))
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > INT_LIMIT:
            found.append((path, node))
    return sorted(found, key=lambda item: [str(part) for part in item[0]])


def _oversized_finding(path: tuple, value: int, positions: dict[tuple, Position]) -> Finding:
    dotted = ".".join(map(str, path))
    where = positions.get(path)
    at = f" (line {where[0]}, column {where[1]})" if where else ""
    digits = len(str(abs(value))) if value.bit_length() < 10_000 else "thousands of"
    return _finding("CFG004", dotted, f"{digits}-digit integer is beyond the 64-bit range{at}",
                    f"give {dotted} a realistic value (at most {INT_LIMIT})")


def parse_config(data: Any, positions: dict[tuple, Position] | None = None,
                 duplicates: list | None = None, base_dir: Path | None = None) -> Config:
    """Validate already-parsed YAML data; InvalidConfig carries one finding per problem.
    base_dir: where a model.hf_config path starts (the YAML file's folder)."""
    positions = positions or {}
    findings = [
        _finding("CFG006", ".".join(map(str, p)), f"key '{p[-1]}' appears twice (line {pos[0]})",
                 "keep one; YAML silently takes the last")
        for p, pos in (duplicates or [])
    ]
    findings += [_oversized_finding(p, v, positions) for p, v in _oversized_integers(data)]
    if data is None:
        raise InvalidConfig([_finding("CFG005", "", "the config is empty",
                                      "write the model, parallel and training sections")])
    if not isinstance(data, dict):
        raise InvalidConfig([_finding("CFG005", "", f"the config must be a mapping of sections, "
                                      f"got {type(data).__name__}", "write `model:`, `parallel:`, "
                                      "`training:` … at the top level")])
    try:
        data, hf_findings = apply_hf_config(data, base_dir)  # beside presets: the YAML wins
    except HfConfigUnreadable as exc:
        raise UnreadableConfig(str(exc)) from None
    if hf_findings:
        raise InvalidConfig(findings + hf_findings)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        seen = {f.path for f in findings}
        for err in exc.errors():
            finding = _error_to_finding(err, data, positions)
            if finding.path not in seen:
                seen.add(finding.path)
                findings.append(finding)
        raise InvalidConfig(findings) from None
    except (RecursionError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidConfig([_finding("CFG002", "", f"cannot interpret the config: {exc}",
                                      "check the value types")]) from None
    if findings:
        raise InvalidConfig(findings)
    return config


def load_config(path: str | Path) -> Config:
    text = read_text(path)
    data, positions, duplicates = parse_yaml(text, str(path))
    return parse_config(data, positions, duplicates, Path(path).parent)

"""Read a YAML config safely and turn every way it can be wrong into findings or a usage error.

Unreadable input (missing file, a directory, binary junk, YAML syntax) is a usage error (exit 2);
a readable file that does not describe a valid config yields findings (exit 1). Never a traceback.
"""

from __future__ import annotations

import difflib
import gc
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from planner.config import yaml_events
from planner.config.megatron_names import flag_of, megatron_arguments, moeplan_field, section_fields
from planner.config.schema import Config
from planner.files import reading
from planner.findings import Finding

SCHEMA_SOURCE = "planner/config/schema.py"
Position = yaml_events.Position


class _ConfigLoader(yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader (libyaml's when installed: it parses ten times faster and caps nesting at 1,000
    levels) with YAML 1.2 numbers: `1e-4` is a float (as every Megatron user writes it) and
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


def read_text(path: str | Path, kind: str = "config") -> str:
    """The bounded reader (planner/files/reading.py: size cap per kind, regular files only, `-`
    for stdin) with its refusals as UnreadableConfig, so config-room callers catch one exception."""
    try:
        return reading.read_text(path, kind)
    except reading.UnreadableInput as exc:
        raise UnreadableConfig(str(exc)) from None


def read_lines(path: str | Path, kind: str = "log") -> Iterator[str]:
    """Stream a log (or any text) line by line in bounded memory (planner/files/reading.py
    read_lines); refusals, at the call or while streaming, are UnreadableConfig."""
    try:
        lines = reading.read_lines(path, kind)
    except reading.UnreadableInput as exc:
        raise UnreadableConfig(str(exc)) from None
    return _reraised(lines)


def _reraised(lines: Iterator[str]) -> Iterator[str]:
    try:
        yield from lines
    except reading.UnreadableInput as exc:
        raise UnreadableConfig(str(exc)) from None


# How big a YAML document may grow once its aliases are expanded. The text's own size is capped
# by the reader (planner/files/reading.py); aliases multiply it (a "billion laughs" file of 1 KiB
# expands to 10^9 nodes), so the composed node graph is measured before anything walks or builds
# the tree. A real config has a few hundred nodes, a million-entry ignore list a million, a section
# of a million unknown keys two million: both are still judged.
MAX_NODES = 2_500_000
MAX_ALIASES = 1_000
MAX_ALIAS_DEPTH = 4  # an alias of an anchor that holds aliases of anchors …, four deep
MAX_ALIAS_NODES = 100_000  # nodes that exist only because an alias repeats an anchor


def max_nodes() -> int:
    raw = os.environ.get("MOEPLAN_YAML_MAX_NODES", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else MAX_NODES


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def structure_problem(root: yaml.Node) -> str | None:
    """Why the composed document is too big to build (None: it is not). Walks each distinct node
    once, without recursion: the first time a node is reached it is its anchor's copy, each later
    time an alias; sizes and alias depths are kept per node, so the expanded tree is never built."""
    limit = max_nodes()
    size: dict[int, int] = {}  # expanded size of each finished collection
    depth: dict[int, int] = {}  # alias nesting inside each finished collection
    seen, open_nodes = {id(root)}, set()
    aliases = 0
    stack: list[tuple[yaml.Node, list[yaml.Node] | None]] = [(root, None)]
    while stack:
        node, kids = stack.pop()
        key = id(node)
        if kids is not None:  # every child is finished: sum them up
            open_nodes.discard(key)
            total, deepest = 1, 0
            for kid, alias in kids:
                kid_key = id(kid)
                total += size.get(kid_key, 1)
                deepest = max(deepest, depth.get(kid_key, 0) + alias)
            size[key], depth[key] = total, deepest
            continue
        open_nodes.add(key)
        marked = []
        todo = []
        for kid in _children(node):
            kid_key = id(kid)
            if kid_key in seen:
                if kid_key in open_nodes:
                    return "an alias refers to the node that contains it (a recursive structure)"
                aliases += 1
                if aliases > MAX_ALIASES:
                    return f"more than {MAX_ALIASES:,} aliases; write the values out"
                marked.append((kid, 1))
                continue
            seen.add(kid_key)
            marked.append((kid, 0))
            if not isinstance(kid, yaml.ScalarNode):
                todo.append(kid)
        if len(seen) > limit:
            return f"more than {limit:,} nodes; if the config is real, raise MOEPLAN_YAML_MAX_NODES=<nodes>"
        stack.append((node, marked))
        stack.extend((kid, None) for kid in reversed(todo))
    total, distinct = size.get(id(root), 1), len(seen)
    if depth.get(id(root), 0) > MAX_ALIAS_DEPTH:
        return (f"aliases nested {depth[id(root)]} deep (an alias of an anchor that holds aliases "
                f"…); at most {MAX_ALIAS_DEPTH} are read: write the values out")
    if total - distinct > MAX_ALIAS_NODES:
        return (f"its aliases expand {distinct:,} nodes into {total:,}; at most {MAX_ALIAS_NODES:,} "
                "may come from aliases: write the values out")
    if total > limit:
        return (f"{total:,} nodes once aliases are expanded, over {limit:,}; if the config is real, "
                "raise MOEPLAN_YAML_MAX_NODES=<nodes>")
    return None


def _too_many_nodes(text: str) -> str | None:
    """Composing costs ~0.5 KiB per node, so a file that may hold more nodes than max_nodes() is
    counted first on libyaml's event stream (constant memory), never composed. Every node but the
    first follows one of `, : [ {` or a line break, so twice their count bounds the nodes."""
    limit = max_nodes()
    if 2 * sum(text.count(mark) for mark in ",:\n[{") + 2 <= limit:
        return None
    nodes = 0
    for event in yaml.parse(text, Loader=_ConfigLoader):
        if isinstance(event, yaml.ScalarEvent | yaml.SequenceStartEvent | yaml.MappingStartEvent):
            nodes += 1
            if nodes > limit:
                return (f"more than {limit:,} nodes; if the config is real, raise "
                        "MOEPLAN_YAML_MAX_NODES=<nodes>")
    return None


def _key_positions(root: yaml.Node) -> dict[tuple, Position]:
    """Each key path's 1-based (line, column), walked without recursion (structure_problem or
    the node estimate has bounded the expanded size)."""
    out: dict[tuple, Position] = {}
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                here = path + (key_node.value,)
                out[here] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                stack.append((value_node, here))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                here = path + (index,)
                out[here] = (item.start_mark.line + 1, item.start_mark.column + 1)
                stack.append((item, here))
    return out


class NodePositions(Mapping[tuple, Position]):
    """Key path → (line, column), found when asked for: a lookup walks down its own path only
    (indexing each mapping it passes once), so a config with a million entries and a few findings
    pays for the few. Iterating builds the whole table."""

    def __init__(self, root: yaml.Node | None) -> None:
        self._root = root
        self._table: dict[tuple, Position] | None = None
        self._index: dict[int, dict[Any, tuple[yaml.Node, yaml.Node]]] = {}

    def _step(self, node: yaml.Node, part: Any) -> tuple[yaml.Node, yaml.Node] | None:
        """(the node that marks `part`'s position, its value) under `node`, or None."""
        if isinstance(node, yaml.SequenceNode):
            ok = isinstance(part, int) and 0 <= part < len(node.value)
            return (node.value[part], node.value[part]) if ok else None
        if not isinstance(node, yaml.MappingNode):
            return None
        index = self._index.get(id(node))
        if index is None:  # a repeated key is found at its last occurrence, as YAML keeps it
            index = self._index[id(node)] = {key.value: (key, value) for key, value in node.value}
        return index.get(part)

    def __getitem__(self, path: tuple) -> Position:
        node, marker = self._root, None
        for part in path:
            found = self._step(node, part) if node is not None else None
            if found is None:
                raise KeyError(path)
            marker, node = found
        if marker is None:
            raise KeyError(path)
        return marker.start_mark.line + 1, marker.start_mark.column + 1

    def _positions(self) -> dict[tuple, Position]:
        if self._table is None:
            self._table = _key_positions(self._root) if self._root is not None else {}
        return self._table

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._positions())

    def __len__(self) -> int:
        return len(self._positions())


def _duplicate_keys(root: yaml.Node) -> list[tuple[tuple, Position]]:
    """(key path, position) of every key a mapping repeats, in file order."""
    duplicates: list[tuple[tuple, Position]] = []
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in node.value:
                key = key_node.value
                if key in seen:
                    duplicates.append((path + (key,), (key_node.start_mark.line + 1,
                                                       key_node.start_mark.column + 1)))
                seen.add(key)
                if not isinstance(value_node, yaml.ScalarNode):
                    stack.append((value_node, path + (key,)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, path + (index,)) for index, item in enumerate(node.value)
                         if not isinstance(item, yaml.ScalarNode))
    duplicates.sort(key=lambda item: item[1])
    return duplicates


def _too_big(problem: str) -> InvalidConfig:
    return InvalidConfig([_finding("CFG008", "", f"the YAML is too big to read: {problem}",
                                   "shrink the file; a config needs a few hundred values")])


def parse_yaml(text: str, name: str = "<config>") -> tuple[Any, Mapping[tuple, Position], list]:
    """Build the data from libyaml's events when the text has no anchors (planner/config/
    yaml_events.py: counted as it is built, never composed); otherwise, or for whatever that path
    leaves to it, compose once, measure the node graph (a CFG008 finding when it is too big to
    build), then build the data from the same nodes. The cycle collector is paused meanwhile: the
    values built hold no cycles, and it would walk the growing tree again and again."""
    loader = _ConfigLoader(text)
    collecting = gc.isenabled()
    gc.disable()
    try:
        if "&" not in text:  # aliases need anchors
            try:
                return yaml_events.build(loader, max_nodes())
            except yaml_events.TooManyNodes:
                raise _too_big(f"more than {max_nodes():,} nodes; if the config is real, raise "
                               "MOEPLAN_YAML_MAX_NODES=<nodes>") from None
            except yaml_events.NeedsComposer:
                loader.dispose()
                loader = _ConfigLoader(text)
        too_many = _too_many_nodes(text)
        if too_many:
            raise _too_big(too_many)
        node = loader.get_single_node()
        problem = structure_problem(node) if node is not None and "&" in text else None
        if problem:
            raise _too_big(problem)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise UnreadableConfig(f"{name}: YAML syntax error at {where}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise UnreadableConfig(f"{name}: YAML error: {exc}") from None
    except (RecursionError, ValueError, OverflowError) as exc:
        why = ("a number of more than 4,300 digits" if "integer string conversion" in str(exc)
               else type(exc).__name__)
        raise UnreadableConfig(f"{name}: cannot parse YAML ({why})") from None
    except (AttributeError, TypeError, KeyError, IndexError) as exc:  # PyYAML's constructors on
        # a malformed tagged value: `!!bool maybe`, `!!int ""`, `!!timestamp bad`
        raise UnreadableConfig(f"{name}: a tagged value cannot be read as its tag "
                               f"({type(exc).__name__}); drop the tag (such as !!bool or "
                               "!!timestamp) or fix the value") from None
    finally:
        loader.dispose()
        if collecting:
            gc.enable()
    return data, NodePositions(node), _duplicate_keys(node) if node is not None else []


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


def _error_to_finding(err: dict, data: Any, positions: Mapping[tuple, Position]) -> Finding:
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


SHOWN_PER_KIND = 50  # schema errors of one kind shown in full; the rest are counted in one finding


def _schema_findings(exc: ValidationError, data: Any, positions: Mapping[tuple, Position],
                     earlier: list[Finding]) -> list[Finding]:
    """One finding per schema error and path; past SHOWN_PER_KIND of a kind (a section of a million
    unknown keys) the rest are only counted, so the hints (difflib) cost stays bounded."""
    seen = {f.path for f in earlier}
    shown: dict[str, int] = {}
    hidden: dict[str, list] = {}
    out: list[Finding] = []
    for err in exc.errors(include_url=False):
        kind = err["type"]
        if shown.get(kind, 0) >= SHOWN_PER_KIND:
            hidden.setdefault(kind, []).append(err)
            continue
        finding = _error_to_finding(err, data, positions)
        if finding.path not in seen:
            seen.add(finding.path)
            out.append(finding)
            shown[kind] = shown.get(kind, 0) + 1
    for kind, errors in hidden.items():
        first = _error_to_finding(errors[0], data, positions)
        out.append(_finding(first.code, first.path, f"and {len(errors):,} more error(s) like the "
                            f"{SHOWN_PER_KIND} above ({kind}) from here on",
                            "fix the ones shown first, then rerun"))
    return out


INT_LIMIT = 2**63 - 1  # Megatron's sizes end up in 64-bit tensors and CUDA arguments


def _oversized_integers(data: Any) -> list[tuple[tuple, int]]:
    """Every integer beyond 64 bits, anywhere in the data (walked without recursion; a path is
    made only for a collection or a find, so a million-entry list costs a million type checks)."""
    found: list[tuple[tuple, int]] = []
    stack: list[tuple[tuple, Any]] = [((), data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict | list):
            for key, value in node.items() if isinstance(node, dict) else enumerate(node):
                if isinstance(value, dict | list):
                    stack.append((path + (key,), value))
                elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_LIMIT:
                    found.append((path + (key,), value))
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > INT_LIMIT:
            found.append((path, node))
    return sorted(found, key=lambda item: [str(part) for part in item[0]])


def _oversized_finding(path: tuple, value: int, positions: Mapping[tuple, Position]) -> Finding:
    dotted = ".".join(map(str, path))
    where = positions.get(path)
    at = f" (line {where[0]}, column {where[1]})" if where else ""
    digits = len(str(abs(value))) if value.bit_length() < 10_000 else "thousands of"
    return _finding("CFG004", dotted, f"{digits}-digit integer is beyond the 64-bit range{at}",
                    f"give {dotted} a realistic value (at most {INT_LIMIT})")


def parse_config(data: Any, positions: Mapping[tuple, Position] | None = None,
                 duplicates: list | None = None, base_dir: Path | None = None) -> Config:
    """Validate already-parsed YAML data; InvalidConfig carries one finding per problem.
    base_dir: where a model.hf_config path starts (the YAML file's folder)."""
    positions = {} if positions is None else positions
    duplicates = duplicates or []
    findings = [
        _finding("CFG006", ".".join(map(str, p)), f"key '{p[-1]}' appears twice (line {pos[0]})",
                 "keep one; YAML silently takes the last")
        for p, pos in duplicates[:SHOWN_PER_KIND]
    ]
    if len(duplicates) > SHOWN_PER_KIND:
        path, pos = duplicates[SHOWN_PER_KIND]
        findings.append(_finding("CFG006", ".".join(map(str, path)),
                                 f"and {len(duplicates) - SHOWN_PER_KIND:,} more duplicate keys from "
                                 f"line {pos[0]} on", "keep one of each; YAML silently takes the last"))
    findings += [_oversized_finding(p, v, positions) for p, v in _oversized_integers(data)]
    if data is None:
        raise InvalidConfig([_finding("CFG005", "", "the config is empty",
                                      "write the model, parallel and training sections")])
    if not isinstance(data, dict):
        raise InvalidConfig([_finding("CFG005", "", f"the config must be a mapping of sections, "
                                      f"got {type(data).__name__}", "write `model:`, `parallel:`, "
                                      "`training:` … at the top level")])
    if isinstance(data.get("model"), dict) and "hf_config" in data["model"]:
        # Imported here: the HF mapping is a sixth of the source `moeplan check` compiles.
        from planner.config.importers.hf_config import HfConfigUnreadable, apply_hf_config

        try:
            data, hf_findings = apply_hf_config(data, base_dir)  # beside presets: the YAML wins
        except HfConfigUnreadable as exc:
            raise UnreadableConfig(str(exc)) from None
        if hf_findings:
            raise InvalidConfig(findings + hf_findings)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise InvalidConfig(findings + _schema_findings(exc, data, positions, findings)) from None
    except (RecursionError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidConfig([_finding("CFG002", "", f"cannot interpret the config: {exc}",
                                      "check the value types")]) from None
    if findings:
        raise InvalidConfig(findings)
    return config


def load_config(path: str | Path, text: str | None = None) -> Config:
    """The validated config of the file at `path`; `text`: its contents when the caller has read
    them already (so what it keyed or hashed is what gets validated, read once)."""
    if text is None:
        text = read_text(path)
    data, positions, duplicates = parse_yaml(text, str(path))
    return parse_config(data, positions, duplicates, Path(path).parent)


def may_read_other_files(text: str) -> bool:
    """Whether loading this config text can read a file besides it: `model.hf_config` (the one
    key parse_config follows to another file). Conservative — any mention counts — so a result
    keyed by the config's bytes alone is never kept for a config another file shapes."""
    return "hf_config" in text

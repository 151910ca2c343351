"""Build a config's data straight from libyaml's event stream, without composing YAML nodes.

Composing costs a Python node, two marks and a resolver call per value, and a million-entry
`ignore:` list or unknown section spends seconds there (most of it in the cycle collector, which
walks the growing node graph again and again). A config without anchors needs none of it: each
event becomes its value at once, the key marks are kept for the findings that cite a line, and
duplicate keys and the node count are noted on the way. Anything unusual — an anchor or alias,
a merge key, a tagged collection, a complex key, a second document, a tag without a constructor
— is left to the composing path (planner/config/loader.py parse_yaml), which measures aliases
and reports every error as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import yaml

Position = tuple[int, int]
# Marks of one collection: per key (mapping, by the key's text) or per index (sequence), and the
# same for each child collection.
Marks = tuple[dict[Any, Any] | list[Any], dict[Any, "Marks"]]

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_MAP_TAGS = {None, "!", "tag:yaml.org,2002:map"}
_SEQ_TAGS = {None, "!", "tag:yaml.org,2002:seq"}


class NeedsComposer(Exception):
    """The document uses a feature only the composing path reads (or refuses) faithfully."""


class TooManyNodes(Exception):
    """More nodes than the cap: counted while building, so the excess is never built."""


class MarkPositions(Mapping[tuple, Position]):
    """Key path → 1-based (line, column): a lookup walks its own path in the kept marks; iterating
    builds the whole table (as planner/config/loader.py NodePositions does for composed nodes)."""

    def __init__(self, marks: Marks | None) -> None:
        self._marks = marks
        self._table: dict[tuple, Position] | None = None

    def __getitem__(self, path: tuple) -> Position:
        marks, mark = self._marks, None
        for part in path:
            if marks is None:
                raise KeyError(path)
            here, kids = marks
            if isinstance(here, list):
                if not (isinstance(part, int) and 0 <= part < len(here)):
                    raise KeyError(path)
            elif part not in here:
                raise KeyError(path)
            mark, marks = here[part], kids.get(part)
        if mark is None:
            raise KeyError(path)
        return mark.line + 1, mark.column + 1

    def _positions(self) -> dict[tuple, Position]:
        if self._table is None:
            table: dict[tuple, Position] = {}
            stack: list[tuple[tuple, Marks]] = [((), self._marks)] if self._marks else []
            while stack:
                path, (here, kids) = stack.pop()
                for part, mark in (enumerate(here) if isinstance(here, list) else here.items()):
                    table[path + (part,)] = (mark.line + 1, mark.column + 1)
                stack.extend((path + (part,), kid) for part, kid in kids.items())
            self._table = table
        return self._table

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._positions())

    def __len__(self) -> int:
        return len(self._positions())


_NO_KEY = object()


def build(loader: yaml.CSafeLoader, limit: int) -> tuple[Any, MarkPositions, list[tuple[tuple, Position]]]:
    """(data, positions, duplicate keys) of the single document `loader` reads, or NeedsComposer /
    TooManyNodes. `loader` is a fresh CParser-based loader (planner/config/loader.py _ConfigLoader).
    One loop over the events, the open collection held in locals (a million entries pass here)."""
    get, resolve = loader.get_event, loader.resolve
    resolvers = loader.yaml_implicit_resolvers
    if resolvers.get(None):  # a resolver for every first character: nothing is known plain
        raise NeedsComposer
    # A plain decimal without a leading zero is an int under this loader's YAML 1.2 resolvers
    # (planner/config/loader.py _ConfigLoader: no timestamp, float or bool reads bare digits).
    digits_are_int = resolve(yaml.ScalarNode, "19", (True, False)) == _INT
    scalar_event, document_end = yaml.ScalarEvent, yaml.DocumentEndEvent
    mapping_start, sequence_start = yaml.MappingStartEvent, yaml.SequenceStartEvent
    mapping_end, sequence_end = yaml.MappingEndEvent, yaml.SequenceEndEvent
    duplicates: list[tuple[tuple, Position]] = []
    nodes, depth = 0, 0
    root: Any = None
    root_marks: Marks | None = None
    # The open collection: its value, key marks (by key text) or item marks, the marks of its
    # child collections, its key path, its kind, and (a mapping) the key read but not yet set.
    value: Any = None
    marks: Any = None
    kids: dict[Any, Marks] = {}
    path: tuple = ()
    is_map = False
    key: Any = _NO_KEY
    raw_key: Any = None
    stack: list[tuple] = []

    get()  # StreamStart
    if isinstance(get(), yaml.StreamEndEvent):  # else DocumentStart
        return None, MarkPositions(None), []
    while True:
        event = get()
        cls = type(event)
        if cls is scalar_event:
            nodes += 1
            if nodes > limit:
                raise TooManyNodes
            if event.anchor is not None:
                raise NeedsComposer
            tag, raw = event.tag, event.value
            if tag is None and (not event.implicit[0] or raw[:1] not in resolvers):
                item: Any = raw  # quoted, or no implicit type starts with this character
            elif tag is None and digits_are_int and raw.isdigit() and raw.isascii() and raw[0] != "0":
                item = int(raw)
            else:
                if tag is None or tag == "!":
                    tag = resolve(yaml.ScalarNode, raw, event.implicit)
                item = _constructed(loader, tag, raw, event)
            if not depth:  # a document that is one scalar
                root = item
            elif not is_map:
                marks.append(event.start_mark)
                value.append(item)
            elif key is _NO_KEY:
                if raw in marks:  # YAML keeps the last: so do the data and the marks
                    mark = event.start_mark
                    duplicates.append((path + (raw,), (mark.line + 1, mark.column + 1)))
                    kids.pop(raw, None)
                marks[raw] = event.start_mark
                key, raw_key = item, raw
            else:
                value[key] = item
                key = _NO_KEY
        elif cls is mapping_end or cls is sequence_end:
            done = value, (marks, kids)
            value, marks, kids, path, is_map, key, raw_key = stack.pop()
            depth -= 1
            if not depth:
                root, root_marks = done
            elif is_map:
                value[key], kids[raw_key] = done
                key = _NO_KEY
            else:
                kids[len(value)] = done[1]
                value.append(done[0])
        elif cls is mapping_start or cls is sequence_start:
            nodes += 1
            if nodes > limit:
                raise TooManyNodes
            opens_map = cls is mapping_start
            if event.anchor is not None or event.tag not in (_MAP_TAGS if opens_map else _SEQ_TAGS):
                raise NeedsComposer
            inner: tuple = ()
            if depth:
                if is_map and key is _NO_KEY:
                    raise NeedsComposer  # a collection as a key
                inner = path + ((raw_key,) if is_map else (len(value),))
                if not is_map:
                    marks.append(event.start_mark)
            stack.append((value, marks, kids, path, is_map, key, raw_key))
            value, marks, kids = ({}, {}, {}) if opens_map else ([], [], {})
            path, is_map, key, depth = inner, opens_map, _NO_KEY, depth + 1
        elif cls is document_end:
            break
        else:
            raise NeedsComposer  # an alias
    if not isinstance(get(), yaml.StreamEndEvent):
        raise NeedsComposer  # a second document: the composer names it
    return root, MarkPositions(root_marks), duplicates


def _constructed(loader: yaml.CSafeLoader, tag: str, raw: str, event: yaml.ScalarEvent) -> Any:
    """A resolved scalar's value, by the loader's own constructor for its tag."""
    if tag == _STR:
        return raw
    construct = loader.yaml_constructors.get(tag)
    if construct is None:  # a merge key, a tag nothing constructs: the composer's call
        raise NeedsComposer
    try:
        return construct(loader, yaml.ScalarNode(tag, raw, event.start_mark, event.end_mark, event.style))
    except Exception:  # noqa: BLE001 - whatever a constructor raises, the composer path reports
        # The composer reads the whole document before it constructs: a syntax error or the node
        # cap further on is reported first, so the refusal of a doubly broken file stays its own.
        raise NeedsComposer from None

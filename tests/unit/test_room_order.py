"""The rooms of docs/growing.md, in the order data flows through them: a module imports only its own
room, earlier rooms and the named leaves; the runtime imports of the planner only the named leaves,
and the planner never imports the runtime. The list below is the table of docs/growing.md, row for
row (a test holds the two equal), so a new module needs a room before it can land, and an import
that runs back up the house fails here with its two ends named."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import cache

from tests.support.import_graph import imports_of
from tests.support.paths import ROOT

# Each room is the top-level units of planner/ it holds (a package or a module: `planner.config`
# holds every module under planner/config/), earliest first.
ROOMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("files", ("planner.files",)),
    ("ground", ("planner", "planner.findings", "planner.units", "planner.memo")),
    ("degrees", ("planner.degrees",)),
    ("config", ("planner.config",)),
    ("layout", ("planner.layout", "planner.drops")),
    ("book", ("planner.budget", "planner.accounting")),
    ("estimate", ("planner.estimate", "planner.model_size")),
    ("rules", ("planner.rules",)),
    ("search", ("planner.search",)),
    ("summary", ("planner.summary", "planner.report")),
    ("calibrate", ("planner.calibrate",)),
    ("plan", ("planner.plan_format", "planner.plan", "planner.verify", "planner.reshard")),
    ("emit", ("planner.emit",)),
    ("docs", ("planner.docs",)),
    ("commands", ("planner.commands", "planner.cli", "planner.cli_common")),
)
# The room apart: the bundled runtime stands on the named leaves alone.
RUNTIME = "runtime"
# Leaves any room (and the runtime) may import: each imports nothing of moeplan but other leaves.
# The bounded reader and writer, the plan file's format, and the collectives table (which
# tests/unit/test_import_cycles.py further limits to planner/verify.py and the runtime).
LEAVES: tuple[str, ...] = ("planner.files", "planner.plan_format", "planner.budget.collectives")
# Imports known to run back up, each with the change that removes it. An entry here that the code
# no longer has fails test_known_exceptions_still_exist, so it goes when its change lands.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


def room_of(module: str, rooms: tuple[tuple[str, tuple[str, ...]], ...] = ROOMS) -> int | None:
    """The room's place in the order; None for a module of no room (the runtime's included)."""
    return next((i for i, (_, units) in enumerate(rooms) if unit(module) in units), None)


def is_leaf(module: str) -> bool:
    return any(module == leaf or module.startswith(leaf + ".") for leaf in LEAVES)


def in_runtime(module: str) -> bool:
    return module.split(".")[0] == RUNTIME


def allowed(importer: str, target: str,
            rooms: tuple[tuple[str, tuple[str, ...]], ...] = ROOMS) -> bool:
    if is_leaf(importer):
        return is_leaf(target)
    if is_leaf(target):
        return True
    if in_runtime(importer) or in_runtime(target):
        return in_runtime(importer) and in_runtime(target)
    here, there = room_of(importer, rooms), room_of(target, rooms)
    return here is not None and there is not None and there <= here


def order_breaches(graph: Mapping[str, Iterable[str]],
                   rooms: tuple[tuple[str, tuple[str, ...]], ...] = ROOMS,
                   known: dict[tuple[str, str], str] = KNOWN_UPWARD) -> list[str]:
    """`importer (room) imports target (room)` for every import the room order forbids."""
    def name(module: str) -> str:
        place = room_of(module, rooms)
        return rooms[place][0] if place is not None else RUNTIME if in_runtime(module) else "no room"

    return [f"{importer} ({name(importer)}) imports {target} ({name(target)})"
            for importer, imported in sorted(graph.items()) for target in sorted(imported)
            if (importer, target) not in known and not allowed(importer, target, rooms)]


@cache
def house() -> dict[str, frozenset[str]]:
    """Every import of planner/ and runtime/, each package seeing the other's modules (read once:
    the tests below only look at it)."""
    graph = imports_of(ROOT / "planner", ROOT / "runtime") | imports_of(ROOT / "runtime",
                                                                         ROOT / "planner")
    return {name: frozenset(targets) for name, targets in graph.items()}


def test_every_planner_module_has_a_room() -> None:
    assert sorted(m for m in imports_of(ROOT / "planner") if room_of(m) is None) == []


def test_the_house_keeps_the_room_order() -> None:
    assert order_breaches(house()) == []


def test_the_named_leaves_are_leaves() -> None:
    graph = house()
    leaves = [m for m in graph if is_leaf(m)]
    assert {"planner.files.reading", "planner.plan_format", "planner.budget.collectives"} <= set(
        leaves)
    assert {m: sorted(t for t in graph[m] if not is_leaf(t)) for m in leaves} == dict.fromkeys(
        leaves, [])


def test_known_exceptions_still_exist() -> None:
    graph = house()
    assert [pair for pair in KNOWN_UPWARD if pair[1] not in graph.get(pair[0], ())] == []


def test_a_planted_wrong_import_fails() -> None:
    """Not vacuous: the real graph, plus one import of each forbidden kind."""
    planted = {("planner.config.schema", "planner.estimate"),  # up the house
               ("planner.files.reading", "planner.config.schema"),  # a leaf that stops being one
               ("runtime.train", "planner.config.schema"),  # the runtime past the leaves
               ("planner.budget.book", "runtime.comm")}  # the planner into the runtime
    graph: dict[str, set[str]] = {name: set(targets) for name, targets in house().items()}
    for importer, target in planted:
        graph[importer].add(target)
    assert order_breaches(graph) == [
        "planner.budget.book (book) imports runtime.comm (runtime)",
        "planner.config.schema (config) imports planner.estimate (estimate)",
        "planner.files.reading (files) imports planner.config.schema (config)",
        "runtime.train (runtime) imports planner.config.schema (config)"]


def test_a_module_of_no_room_fails() -> None:
    graph = {"planner.config.schema": {"planner.newcomer"}, "planner.newcomer": set()}
    assert order_breaches(graph) == [
        "planner.config.schema (config) imports planner.newcomer (no room)"]


def _growing_rooms() -> list[tuple[str, ...]]:
    """The first cell of each row of docs/growing.md's rooms table, as units of planner/."""
    text = (ROOT / "docs" / "growing.md").read_text(encoding="utf-8")
    table = text.split("## The rooms", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in table.splitlines():
        first = line.split("|")[1] if line.startswith("| `") else ""
        paths = re.findall(r"`([a-z_/]+(?:\.py|/))`", first)
        if paths and all(p.startswith("planner/") for p in paths):
            rows.append(tuple(p.removesuffix("/").removesuffix(".py").replace("/", ".")
                              for p in paths))
    return rows


def test_growing_md_lists_the_rooms_in_this_order() -> None:
    assert _growing_rooms() == [tuple(u for u in units if u != "planner") for _, units in ROOMS]

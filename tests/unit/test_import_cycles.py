"""planner/ has no import cycle, counting imports inside functions too (a lazy import that closes a
cycle is still a cycle: it only hides the order problem until someone moves it)."""

from __future__ import annotations

from tests.support.import_graph import cycles, imports_of
from tests.support.paths import ROOT


def test_planner_has_no_import_cycle() -> None:
    assert cycles(imports_of(ROOT / "planner")) == []


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_graph_sees_function_level_imports() -> None:
    graph = imports_of(ROOT / "planner")
    # planner/rules/facts.py imports the accounting entry inside a cached property
    assert "planner.accounting" in graph["planner.rules.facts"]
    assert "planner.budget.comm" in graph["planner.budget.book"]

"""No test module imports another test module (or conftest): what tests share lives in
tests/support/, so moving or deleting one test file never breaks another."""

from __future__ import annotations

from tests.support.import_graph import imports_of
from tests.support.paths import ROOT


def _is_test_module(name: str) -> bool:
    leaf = name.rpartition(".")[2]
    return leaf.startswith("test_") or leaf == "conftest"


def test_no_test_module_imports_another() -> None:
    graph = imports_of(ROOT / "tests")
    crossing = sorted(f"{importer} imports {imported}" for importer, targets in graph.items()
                      for imported in targets if _is_test_module(imported))
    assert crossing == [], "move what is shared into tests/support/:\n" + "\n".join(crossing)


def test_the_graph_sees_the_test_modules() -> None:
    """The check above is not vacuous: it finds this file and the support modules it imports."""
    graph = imports_of(ROOT / "tests")
    here = "tests.unit.test_test_modules_stand_alone"
    assert {"tests.support.import_graph", "tests.support.paths"} <= graph[here]

"""The import graph of planner/: no cycle, counting imports inside functions too (a lazy import that
closes a cycle is still a cycle: it only hides the order problem until someone moves it); only the
entry, planner/accounting.py, opens the formula book (docs/growing.md); nothing imports the Megatron
prober; imports inside functions only where a listed reason needs them; the runtime's byte ledger
loads no pydantic."""

from __future__ import annotations

import subprocess
import sys

from tests.support.import_graph import cycles, function_level_imports, imports_of
from tests.support.paths import ROOT

PROBER = "planner.emit.megatron_probe"

# The imports inside a function body outside planner/commands/ (whose commands import what they
# need when run: planner/cli.py loads every command module at start, so `moeplan check` pays for
# whatever they import at module level), each with the reason it is not a module import.
# planner/cli.py's command loading is an importlib call, not an import statement: it keeps its own
# reason (planner/cli.py).
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    # The rule catalog loads when a command first judges a config, not at every command's start.
    ("planner.cli_common", "planner.rules"): "every command imports cli_common at start",
    ("planner.cli_common", "planner.calibrate.profile"): "only a command given a calibration "
    "profile reads one; groups and check never do",
    # `groups --rank R` answers a config it validated before from the result cache
    # (planner/files/result_cache.py): neither the config reader (the schema) nor the pipeline
    # split, which reads the schema, loads then.
    ("planner.cli_common", "planner.config.loader"): "a cached groups answer never reads a config",
    ("planner.layout.spec", "planner.layout.pipeline"): "only a spec made from a Config splits stages",
    # The formula book loads when a rule judges one of its figures (the per-stage memory, NCCL
    # EP's receive rows), so `moeplan groups`, which runs the catalog without those rules, never
    # loads it.
    ("planner.rules.facts", "planner.accounting"): "only the rules in READS_BUDGET",
    # The Hugging Face config.json mapping (the largest module `check` would compile) loads only
    # for a config that names model.hf_config.
    ("planner.config.loader", "planner.config.importers.hf_config"): "model.hf_config only",
    # matplotlib draws the report's charts: it loads when the page is assembled, not when the
    # report command is registered at every CLI start.
    ("planner.report.page", "planner.report.charts"): "matplotlib, when charts are drawn",
}


def test_planner_has_no_import_cycle() -> None:
    assert cycles(imports_of(ROOT / "planner")) == []


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_graph_sees_function_level_imports() -> None:
    graph = imports_of(ROOT / "planner")
    # planner/config/loader.py imports the Hugging Face mapping inside the function that needs it
    assert "planner.config.importers.hf_config" in graph["planner.config.loader"]
    assert ("planner.config.loader", "planner.config.importers.hf_config") in function_level_imports(
        ROOT / "planner")
    assert "planner.budget.comm" in graph["planner.budget.book"]


def test_nothing_in_planner_imports_the_prober() -> None:
    """planner/emit/megatron_check.py runs the prober in a subprocess by its path: importing it
    would put Megatron's torch world into the planner."""
    graph = imports_of(ROOT / "planner")
    assert PROBER in graph  # the prober is where this test looks for it
    assert sorted(name for name, targets in graph.items() if PROBER in targets) == []


def test_function_level_imports_are_only_the_listed_lazy_paths() -> None:
    found = {pair for pair in function_level_imports(ROOT / "planner")
             if not pair[0].startswith("planner.commands.")}
    assert sorted(found - LAZY_IMPORTS.keys()) == [], "import these at module level, or list why not"
    assert sorted(LAZY_IMPORTS.keys() - found) == [], "no longer lazy: drop them from LAZY_IMPORTS"


def _loaded_by(module: str) -> list[str]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    return [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:")]


def test_the_runtime_ledger_loads_no_pydantic() -> None:
    """runtime/comm.py checks collective names in the leaf table (planner/budget/collectives.py),
    not through the accounting entry, which loads pydantic, the schema and the formula book."""
    loaded = _loaded_by("runtime.comm")
    assert "runtime.comm" in loaded and "planner.budget.collectives" in loaded
    assert [name for name in loaded if name.split(".")[0] in ("pydantic", "pydantic_core")] == []


def test_the_runtime_plan_reader_loads_only_the_plan_format() -> None:
    """runtime/plan_io.py reads plans through the leaf planner/plan_format.py: of the planner it
    loads that file and the bounded reader (planner/files/), not the schema, grid or book."""
    loaded = _loaded_by("runtime.plan_io")
    assert sorted(name for name in loaded if name.startswith("planner")) == [
        "planner", "planner.files", "planner.files.json_input", "planner.files.reading",
        "planner.files.writing", "planner.plan_format"]
    assert [name for name in loaded if name.split(".")[0] in ("pydantic", "pydantic_core")] == []

# --- the formula book's one entry ----------------------------------------------------------------

BOOK = "planner.budget"
ENTRY = "planner.accounting"
# Leaves of the book, each with the modules outside it that may import it directly. The
# collectives table imports nothing of the book: `moeplan verify` and the runtime's ledger check
# collective names against it without loading the pages (or pydantic and the schema).
LEAVES: dict[str, tuple[str, ...]] = {"planner.budget.collectives": ("planner.verify", "runtime.")}


def in_book(module: str) -> bool:
    return module == BOOK or module.startswith(BOOK + ".")


def is_book_page(module: str) -> bool:
    """Every module of planner/budget/ (its package included) but the leaves: the pages, the
    engine, the symbols and the evaluator, which only the entry and the book itself import."""
    return in_book(module) and module not in LEAVES


def entry_rule_breaches(graph: dict[str, set[str]]) -> list[str]:
    """`importer imports module` for every module outside the book and the entry that imports a
    book page, or a leaf it is not named for."""
    found = []
    for importer, imported in sorted(graph.items()):
        if in_book(importer) or importer == ENTRY:
            continue
        for target in sorted(m for m in imported if in_book(m)):
            if is_book_page(target) or not importer.startswith(LEAVES[target]):
                found.append(f"{importer} imports {target}")
    return found


def test_only_the_entry_imports_the_book() -> None:
    assert entry_rule_breaches(imports_of(ROOT / "planner")) == []


def test_the_runtime_imports_no_book_page() -> None:
    graph = imports_of(ROOT / "runtime", ROOT / "planner")
    assert entry_rule_breaches(graph) == []


def test_the_collectives_table_is_a_leaf() -> None:
    graph = imports_of(ROOT / "planner")
    for leaf in LEAVES:
        assert {m for m in graph[leaf] if m.startswith("planner.")} == set(), leaf


def test_the_entry_rule_check_finds_a_breach() -> None:
    """Not vacuous: a module outside the book importing a page, or the table without leave."""
    graph = {"planner.accounting": {"planner.budget.book"}, "planner.budget.book": set(),
             "planner.budget.collectives": set(), "planner.summary": {"planner.budget.book"},
             "planner.verify": {"planner.budget.collectives"},
             "planner.report.page": {"planner.budget.collectives"}}
    assert entry_rule_breaches(graph) == ["planner.report.page imports planner.budget.collectives",
                                          "planner.summary imports planner.budget.book"]

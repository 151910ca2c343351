"""The docs ship with the code: generated pages are current, links resolve, the worked example is
true, and no shipped file points at anything a user who installs moeplan does not have."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from planner.docs import GENERATED_PAGES, stale_pages, write_pages
from planner.docs.__main__ import main as docs_main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SHIPPED = ("planner", "runtime", "templates", "tests", "docs", "examples", "bench",
           "README.md", "pyproject.toml")
# The one file allowed to name the oracle checkout beside the repository.
ORACLE_LOCATOR = ROOT / "tests" / "support" / "oracle.py"
# Written in pieces so that this file does not contain what it forbids.
FORBIDDEN = ("SPEC" + " §", "SPEC" + ".md", "shared" + "/design", "megatron" + "-reference",
             "perf" + "-anchors", ".." + "/shared")
TEXT_SUFFIXES = {".py", ".md", ".j2", ".yaml", ".yml", ".toml", ".txt", ".sh", ".json", ".cfg", ""}


def _shipped_files() -> list[Path]:
    files: list[Path] = []
    for name in SHIPPED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                      and p.suffix in TEXT_SUFFIXES]
    return sorted(files)


def test_no_shipped_file_refers_outside_the_repository() -> None:
    hits = []
    for path in _shipped_files():
        if path == ORACLE_LOCATOR:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for needle in FORBIDDEN:
                if needle in line:
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {needle!r}: {line.strip()[:100]}")
    assert not hits, ("shipped files cite material a user does not have; cite Megatron-LM by "
                      "branch@commit, path and function instead:\n" + "\n".join(hits))


def test_the_scan_sees_the_files_it_must_guard() -> None:
    names = {str(p.relative_to(ROOT)) for p in _shipped_files()}
    for expected in ("README.md", "docs/index.md", "planner/rules/v4.py", "runtime/train.py",
                     "templates/megatron_args.sh.j2", "examples/deepseek-v4-pro-1024.yaml"):
        assert expected in names


@pytest.mark.parametrize("name", sorted(GENERATED_PAGES))
def test_generated_page_is_current(name: str) -> None:
    committed = (DOCS / name).read_text(encoding="utf-8")
    assert committed == GENERATED_PAGES[name](), (
        f"docs/{name} is stale: run `python -m planner.docs` and commit the result")


def test_check_mode_reports_stale_pages_and_write_fixes_them(tmp_path: Path) -> None:
    assert stale_pages(tmp_path) == list(GENERATED_PAGES)
    assert docs_main(["--check", "--out", str(tmp_path)]) == 1
    write_pages(tmp_path)
    assert stale_pages(tmp_path) == []
    assert docs_main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "rules.md").write_text("edited by hand\n", encoding="utf-8")
    assert docs_main(["--check", "--out", str(tmp_path)]) == 1


def test_rules_page_documents_every_rule_once() -> None:
    from planner.rules import CATALOG

    page = (DOCS / "rules.md").read_text(encoding="utf-8")
    headings = re.findall(r"^### (\S+)$", page, flags=re.MULTILINE)
    assert headings == [entry.code for entry in CATALOG]


def test_formula_page_lists_every_quantity_of_every_variation() -> None:
    from planner.accounting import formula_book
    from planner.docs.formulas_page import VARIATIONS, baseline_variant

    page = (DOCS / "formulas.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([^`]+)` \|", page, flags=re.MULTILINE))
    base = baseline_variant()
    for _, changes in ((None, {}), *VARIATIONS):
        book = formula_book(dataclasses.replace(base, **changes))
        missing = [q.name for q in book.quantities if q.name not in listed]
        assert not missing, f"{changes}: {missing}"


def test_variations_cover_every_variant_field() -> None:
    """A new structural choice in the budgets must show up on the formula page."""
    from planner.accounting import Variant
    from planner.docs.formulas_page import VARIATIONS

    varied = {key for _, changes in VARIATIONS for key in changes}
    fields = {f.name for f in dataclasses.fields(Variant)}
    assert fields - varied == set(), "add a VARIATIONS entry in planner/docs/formulas_page.py"
    assert varied <= fields


def test_worked_example_table_matches_the_grid() -> None:
    from planner.config.loader import load_config
    from planner.layout.grid import Grid
    from planner.layout.spec import grid_spec_from_config

    page = (DOCS / "parallelism.md").read_text(encoding="utf-8")
    section = page.split("## Worked example: `examples/tiny-cpu-8.yaml`", 1)[1].split("\n## ", 1)[0]
    table = dict(re.findall(r"^\| `(\w+)` \| `(\[\[.*\]\])` \|$", section, flags=re.MULTILINE))
    grid = Grid(grid_spec_from_config(load_config(ROOT / "examples" / "tiny-cpu-8.yaml")))
    expected = {kind: grid.groups(kind) for kind in grid.kinds}
    rows = "\n".join(f"| `{kind}` | `{groups}` |" for kind, groups in expected.items())
    assert {kind: ast.literal_eval(text) for kind, text in table.items()} == expected, (
        "docs/parallelism.md's worked example no longer matches `moeplan groups`; the table "
        "should read:\n" + rows)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}


def test_links_between_pages_resolve() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_readme_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in sorted(DOCS.glob("*.md")):
        assert f"docs/{page.name}" in readme, f"README.md does not link docs/{page.name}"


def test_megatron_citations_name_a_pinned_commit() -> None:
    """Where the docs cite Megatron-LM code, they name the branch and commit it was read at."""
    pinned = ("dev@d48bd6be", "main@d98e8a64")
    for page in sorted(DOCS.glob("*.md")):
        if page.name in GENERATED_PAGES:
            continue
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"Megatron-LM (\w+@\w+)", text):
            assert match.group(1) in pinned, f"{page.name}: {match.group(0)}"


def test_generating_the_docs_never_imports_torch() -> None:
    import subprocess
    import sys

    probe = ("import sys\nfrom planner.docs import GENERATED_PAGES\n"
             "[render() for render in GENERATED_PAGES.values()]\n"
             "assert 'torch' not in sys.modules, 'planner.docs imported torch'\n")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, cwd=ROOT).returncode == 0

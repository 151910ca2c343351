"""The generated pages of docs/: written from the code so they can never drift from it.

`python -m planner.docs` rewrites them; `python -m planner.docs --check` (and tests/unit/test_docs.py)
fails when a committed page differs from what the code generates today.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from planner.docs.formulas_page import formulas_page
from planner.docs.rules_page import rules_page
from planner.files.writing import write_atomic

GENERATED_PAGES: dict[str, Callable[[], str]] = {
    "rules.md": rules_page,
    "formulas.md": formulas_page,
}


def stale_pages(folder: Path) -> list[str]:
    """Names of the generated pages in `folder` that are missing or differ from the code."""
    stale = []
    for name, render in GENERATED_PAGES.items():
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8") != render():
            stale.append(name)
    return stale


def write_pages(folder: Path) -> list[str]:
    """Write every generated page into `folder` (atomically); returns the names written."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, render in GENERATED_PAGES.items():
        write_atomic(folder / name, render())
    return list(GENERATED_PAGES)

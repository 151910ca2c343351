"""The compiled formula functions kept on disk (planner/budget/code_cache.py): a stored entry is
read back instead of compiled, gives the same numbers, and a damaged entry or an unwritable folder
is a miss, never an error nor code run."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import pytest

from planner.budget import code_cache

SOURCE = "def _evaluate(env):\n    a = float(env['a'])\n    b = (a / 3 + 0.1)\n    return {'b': b}\n"


def _run(code: Any) -> dict[str, float]:
    scope: dict[str, Any] = {"float": float}
    exec(code, scope)  # noqa: S102 - the test's own source
    result: dict[str, float] = scope["_evaluate"]({"a": 2})
    return result


def _entries(folder: Path) -> list[Path]:
    return sorted((folder / code_cache.KIND).glob("*.code"))


def test_a_stored_entry_is_read_back_instead_of_compiled(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEPLAN_CACHE_DIR", str(tmp_path))
    first = code_cache.compiled(SOURCE, "<budget formulas>")
    assert len(_entries(tmp_path)) == 1

    def no_compile(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("compiled again although the entry is stored")

    monkeypatch.setattr(builtins, "compile", no_compile)
    again = code_cache.compiled(SOURCE, "<budget formulas>")
    assert again == first
    assert _run(again) == _run(first) == {"b": 2 / 3 + 0.1}


def test_another_source_or_filename_is_another_entry(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEPLAN_CACHE_DIR", str(tmp_path))
    code_cache.compiled(SOURCE, "<budget formulas>")
    code_cache.compiled(SOURCE.replace("0.1", "0.2"), "<budget formulas>")
    code_cache.compiled(SOURCE, "<other>")
    assert len(_entries(tmp_path)) == 3


def test_a_damaged_entry_is_compiled_again_and_replaced(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEPLAN_CACHE_DIR", str(tmp_path))
    code_cache.compiled(SOURCE, "<budget formulas>")
    [entry] = _entries(tmp_path)
    good = entry.read_bytes()
    entry.write_bytes(good[:-7] + b"garbage")  # payload no longer matches its digest
    assert _run(code_cache.compiled(SOURCE, "<budget formulas>")) == {"b": 2 / 3 + 0.1}
    assert entry.read_bytes() == good
    entry.write_bytes(b"not an entry at all")
    assert _run(code_cache.compiled(SOURCE, "<budget formulas>")) == {"b": 2 / 3 + 0.1}


def test_no_folder_or_an_unwritable_one_still_compiles(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEPLAN_CACHE_DIR", "")
    assert _run(code_cache.compiled(SOURCE, "<budget formulas>")) == {"b": 2 / 3 + 0.1}
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder would be")
    monkeypatch.setenv("MOEPLAN_CACHE_DIR", str(blocker))
    assert _run(code_cache.compiled(SOURCE, "<budget formulas>")) == {"b": 2 / 3 + 0.1}

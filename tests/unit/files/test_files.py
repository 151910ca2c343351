"""The bounded reader, the JSON limits, the shape check and the atomic writer (planner/files/)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from planner.config.loader import UnreadableConfig, read_lines
from planner.files import reading
from planner.files.json_input import parse_json
from planner.files.json_shape import ShapeError, check_shape
from planner.files.reading import CAPS, UnreadableInput, cap_variable, read_text
from planner.files.writing import WriteFailed, check_target, write_atomic
from tests.support.paths import ROOT


def test_docs_list_every_kind_with_its_cap_and_variable() -> None:
    page = (ROOT / "docs" / "limits.md").read_text()
    for kind, cap in CAPS.items():
        size = f"{cap >> 30} GiB" if cap >= 1 << 30 else f"{cap >> 20} MiB"
        assert re.search(rf"^\| {kind} \|.*\| {size} \| `{cap_variable(kind)}` \|$", page, re.M), kind


def test_a_cap_is_raised_by_its_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "c.yaml"
    target.write_text("x" * 100)
    monkeypatch.setenv(cap_variable("config"), "50")
    with pytest.raises(UnreadableInput, match=r"100 bytes is over the config limit of 50 bytes.*"
                                              r"MOEPLAN_MAX_BYTES_CONFIG=<bytes> \[FILE002\]"):
        read_text(target)
    monkeypatch.setenv(cap_variable("config"), "100")
    assert read_text(target) == "x" * 100


def test_read_lines_streams_and_refuses_a_line_without_end(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"one\r\ntwo \xff\n\nlast")
    assert list(read_lines(log)) == ["one", "two \ufffd", "", "last"]
    monkeypatch.setattr(reading, "LINE_CAP", 10)
    log.write_bytes(b"ok\n" + b"z" * (3 << 20))
    lines = read_lines(log)
    assert next(lines) == "ok"
    with pytest.raises(UnreadableConfig, match=r"a line longer than 10 bytes"):
        list(lines)
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    with pytest.raises(UnreadableConfig, match=r"is a FIFO \(named pipe\)"):  # at the call
        read_lines(fifo)


@pytest.mark.parametrize(("text", "says"), [
    ("[" * 70 + "]" * 70, "nested deeper than 64"),
    ("[" * 5000 + "]" * 5000, "nested deeper than 64"),
    ('{"a": ' + "7" * 41 + "}", "41-digit integer"),
    ('{"a": NaN}', "NaN is not JSON"),
    ('{"a": 1e999}', "beyond a 64-bit float"),
    ('{"a": }', "invalid JSON at line 1"),
])
def test_hostile_json_is_a_message(text: str, says: str) -> None:
    with pytest.raises(UnreadableInput, match=re.escape(says)):
        parse_json(text, "x.json")


def test_shapes_name_the_json_path() -> None:
    shape = {"ranks": [{"rank": "int", "group?": ("str", "null")}], "*": "any"}
    check_shape({"ranks": [{"rank": 1}, {"rank": 2, "group": None}], "extra": 1}, shape)
    for data, where in (({"ranks": [{"rank": True}]}, r"\$\.ranks\[0\]\.rank: expected an integer"),
                        ({}, r"\$\.ranks: expected an array \(a required key\)"),
                        ({"ranks": [{"rank": 1, "group": 3}]}, r"group: expected a string or null")):
        with pytest.raises(ShapeError, match=where):
            check_shape(data, shape)


def test_the_writer_refuses_what_it_must_not_replace(tmp_path: Path) -> None:
    existing = tmp_path / "plan.json"
    existing.write_text("old")
    with pytest.raises(WriteFailed, match="exists; pass --force"):
        check_target(existing, force=False)
    with pytest.raises(WriteFailed, match="is a directory"):
        check_target(tmp_path, force=True)
    fifo = tmp_path / "fifo"  # a node of the test's own: never a system device
    os.mkfifo(fifo)
    with pytest.raises(WriteFailed, match="not a regular file"):
        write_atomic(fifo, "x")
    fifo.unlink()
    write_atomic(existing, "new")
    assert existing.read_text() == "new"
    with pytest.raises(WriteFailed, match="cannot write"):
        write_atomic(tmp_path / "missing" / "x.json", "x", parents=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]

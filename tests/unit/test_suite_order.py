"""The order tests/conftest.py hands the files to the xdist workers: heaviest first, each file whole."""

from __future__ import annotations

from tests.support.paths import ROOT
from tests.support.suite_order import HEAVY_FILES, file_of, heaviest_first


def test_every_heavy_file_is_a_test_file() -> None:
    # a renamed or deleted file would silently drop out of the order
    assert [name for name in HEAVY_FILES if not (ROOT / name).is_file()] == []
    assert len(set(HEAVY_FILES)) == len(HEAVY_FILES)


def test_heavy_files_first_then_by_test_count_each_file_whole_and_in_order() -> None:
    light, many, heavy, heavier = "tests/a.py", "tests/b.py", HEAVY_FILES[1], HEAVY_FILES[0]
    nodeids = [f"{light}::t1", f"{many}::t1", f"{heavy}::t1", f"{many}::t2", f"{heavier}::t1",
               f"{heavy}::t2", f"{many}::t3", f"{light}::t2[x]"]
    ordered = heaviest_first(nodeids, nodeids)
    assert ordered == [f"{heavier}::t1", f"{heavy}::t1", f"{heavy}::t2", f"{many}::t1", f"{many}::t2",
                       f"{many}::t3", f"{light}::t1", f"{light}::t2[x]"]
    assert [file_of(one) for one in ordered][-2:] == [light, light]

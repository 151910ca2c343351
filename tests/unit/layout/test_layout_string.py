"""The one writer of Megatron layout strings (planner/config/layout_strings.py): each spelling its
callers print, derived by hand, and every spelling read back by the parser as the same chunks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from planner.config.layout_strings import FOLDED, IMPORTED, PER_CHUNK, ChunkHolds, layout_string, write_layout
from planner.layout.pipeline import expand_layout


def test_each_spelling_by_hand() -> None:
    counts = [2, 8, 8, 8, 1]
    assert layout_string(counts, 1, FOLDED) == "Ett|(t*8|)*3tmL"
    assert layout_string(counts, 1, IMPORTED) == "Et*2|(t*8|)*3tmL"
    assert layout_string(counts, 1, PER_CHUNK) == "Et*2|t*8|t*8|t*8|tmL"
    assert layout_string([4], 2, FOLDED) == "Et*4mmL"  # one chunk holds everything
    assert write_layout([ChunkHolds(0, embedding=True), ChunkHolds(3, mtp=2, loss=True)],
                        PER_CHUNK) == "E|t*3m*2L"


@given(counts=st.lists(st.integers(0, 5), min_size=1, max_size=7), mtp=st.integers(0, 2))
def test_every_spelling_parses_to_the_same_chunks(counts: list[int], mtp: int) -> None:
    last = len(counts) - 1
    expected = [["E"] * (i == 0) + ["t"] * n + ["m"] * (mtp if i == last else 0) + ["L"] * (i == last)
                for i, n in enumerate(counts)]
    for spelling in (FOLDED, IMPORTED, PER_CHUNK):
        assert expand_layout(layout_string(counts, mtp, spelling)) == expected

"""The one bounded memo (planner/memo.py): one size policy (at most maxsize entries, the oldest
dropped first), one way to clear (`clear_memos`), keys that are values (never `id()`)."""

from __future__ import annotations

import pytest

from planner import memo
from planner.config.loader import load_config
from planner.layout.pipeline import stage_split
from tests.support.paths import EXAMPLES

# The caches moeplan remembers work in, by memo name, with their bounds.
EXPECTED = {"stage splits": 4096, "model layer counts": 256, "stage holdings": 4096,
            "read-items pickers": 4096, "rank placements": 65536, "budget grids": 1024,
            "layer mixers": 256}


def test_a_memo_never_holds_more_than_maxsize_and_drops_the_oldest() -> None:
    m: memo.Memo[int, int] = memo.Memo("test: size policy", 3)
    made = []
    for key in (1, 2, 3, 4, 2, 5):
        m.get(key, lambda k=key: made.append(k) or k * 10)
        assert len(m) <= 3
    assert made == [1, 2, 3, 4, 5]  # 2 was still held when asked again
    assert [m.get(k, lambda: -1) for k in (3, 4, 5)] == [30, 40, 50]
    assert m.get(1, lambda: -1) == -1  # the oldest went first


def test_clear_memos_empties_every_memo() -> None:
    cfg = load_config(EXAMPLES / "deepseek-v3-1024.yaml")
    from planner.accounting import budgets

    budgets(cfg)
    names = {m.name: m for m in memo.memos()}
    assert {name: names[name].maxsize for name in EXPECTED} == EXPECTED
    assert all(len(names[name]) for name in EXPECTED)
    memo.clear_memos()
    assert all(len(m) == 0 for m in memo.memos())


def test_a_memo_holds_at_least_one_entry() -> None:
    with pytest.raises(ValueError):
        memo.Memo("test: empty", 0)


def test_keys_are_values_not_identities() -> None:
    """Two configs read from the same file are equal values: they share one entry (no id() kept
    alive), and a changed model field is a different key."""
    path = EXAMPLES / "deepseek-v4-pro-1024.yaml"
    a, b = load_config(path), load_config(path)
    assert a.model is not b.model
    assert memo.section_key(a.model) == memo.section_key(b.model)
    hash(memo.section_key(a.model))  # list fields (compress_ratios) as tuples
    assert stage_split(a) is stage_split(b)
    changed = a.model.model_copy(update={"mtp_num_layers": 0})
    assert memo.section_key(changed) != memo.section_key(a.model)
    assert memo.section_key(a.model) == memo.section_key(changed.model_copy(update={"mtp_num_layers":
                                                                                   a.model.mtp_num_layers}))
    with pytest.raises(TypeError):
        memo.Memo("test: unhashable", 1).get([1], lambda: 0)  # type: ignore[arg-type]

"""DSA top-k shared across layers (planner/config/dsa_share.py) against Megatron-LM dev@d48bd6be
megatron/core/transformer/experimental_attention_variant/dsa.py is_dsa_skip_topk_layer."""

from __future__ import annotations

import itertools

import pytest

from planner.config.dsa_share import computes_topk, share_of, source_layer
from planner.config.loader import InvalidConfig, parse_config
from planner.rules.example_base import example_config_data


def megatron_skips(layer_number: int, skip_topk_offset: int, topk_freq: int) -> bool:
    """is_dsa_skip_topk_layer as Megatron writes it, on the 1-based layer number."""
    skip_topk_offset = max(skip_topk_offset, 1)
    return (max(layer_number - skip_topk_offset, 0) % topk_freq) != 0


def test_computing_layers_are_megatrons() -> None:
    for freq, offset, layer in itertools.product(range(1, 6), range(0, 6), range(12)):
        assert computes_topk(layer, freq, offset) is not megatron_skips(layer + 1, offset, freq)
    # GLM-5.2: freq 4, offset 3 -> 0-based 0, 1, 2, then 6, 10, ...; layer 9 reuses layer 6's
    assert [i for i in range(12) if computes_topk(i, 4, 3)] == [0, 1, 2, 6, 10]
    assert source_layer(9, 4, 3) == 6 and source_layer(10, 4, 3) == 10


def test_every_pattern_maps_back_exactly_or_to_none() -> None:
    """Up to 8 layers, every per-layer pattern: share_of gives a pair that reproduces it exactly
    when some (freq, offset) does, else None (what `import hf` refuses)."""
    for n in range(1, 9):
        expressible = {tuple(computes_topk(i, f, o) for i in range(n))
                       for f in range(1, n + 2) for o in range(n + 2)}
        for pattern in itertools.product((False, True), repeat=n):
            pair = share_of(pattern)
            assert (pair is not None) == (pattern in expressible), pattern
            if pair is not None:
                assert tuple(computes_topk(i, *pair) for i in range(n)) == pattern
    assert share_of([True, False] * 2, prefer=(2, 0)) == (2, 0)  # the file's own spelling kept


def test_sharing_needs_dsa() -> None:
    data = example_config_data("model: {dsa_indexer_topk_freq: 2}")
    with pytest.raises(InvalidConfig) as refused:
        parse_config(data)
    assert "dsa_indexer_topk_freq" in str(refused.value)

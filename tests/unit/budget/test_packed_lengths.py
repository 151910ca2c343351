"""Article §22: variable-length THD packing budgeted at a stated packed length, the max (default)
or the mean of training.packed_lengths, instead of a fixed S. Megatron-LM dev@d48bd6be
megatron/core/datasets/data_schedule.py:175 DpBalancedScheduler.get_groups_and_subsamples packs
whole sequences while their sum stays within the microbatch's capacity; BAT030 refuses lengths
above it. Hand-derived on the rule examples' base (seq_length 256, b 1, EP 4, k 2, h 64)."""

from __future__ import annotations

from typing import Any

from planner.accounting import budgets
from planner.config.loader import parse_config
from planner.rules import run_rules
from planner.rules.example_base import example_config_data, merge
from tests.support.megatron_lines import megatron_line


def _rank0(training: dict[str, Any]) -> dict[str, Any]:
    cfg = parse_config(merge(example_config_data(""), {"training": training}))
    return {b.name: b for b in budgets(cfg) if b.stage in (0, None)}


def test_fixed_length_says_so():
    got = _rank0({})
    assert got["packed_tokens_per_microbatch"].value == 256
    assert got["packed_tokens_per_microbatch"].doc.startswith("fixed length")


def test_max_and_mean_bases():
    lengths = [100, 200, 250]  # mean 550/3 = 183.3 → 184
    top = _rank0({"packed_lengths": lengths})
    mean = _rank0({"packed_lengths": lengths, "packed_length_basis": "mean"})
    assert top["packed_tokens_per_microbatch"].value == 250
    assert mean["packed_tokens_per_microbatch"].value == 184
    assert "longest" in top["packed_tokens_per_microbatch"].doc
    # rows and bytes follow: n = 250 local tokens, n·k = 500 dispatch rows of 64 bf16 values
    assert top["tokens_per_rank"].value == 250
    assert top["dispatch_send_bytes"].value == 500 * 64 * 2
    assert mean["dispatch_send_bytes"].value == 368 * 64 * 2


def test_lengths_above_the_capacity_are_an_error():
    cfg = parse_config(merge(example_config_data(""), {"training": {"packed_lengths": [200, 300]}}))
    found = [f for f in run_rules(cfg) if f.code == "BAT030"]
    assert found and "largest 300" in found[0].message


def test_cited_line():
    assert "if sum_seqlen + sample_id_seqlens[i][1] <= self.max_seq_len_all_ranks" in megatron_line(
        "core/datasets/data_schedule.py", 175)

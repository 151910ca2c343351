"""Article §14: routing imbalance reaches the busiest rank's received rows, bytes and memory, as
an expectation (efficiency.routing_imbalance) and a stated quantile (efficiency.routing_quantile).
Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py:602
MoEAlltoAllTokenDispatcher.preprocess: a rank's receive counts (output_splits) are known only after
the count exchange, so its receive buffers are what routing sends it, not n·k."""

from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist
from typing import Any

from planner.accounting import budgets
from planner.config.loader import load_config, parse_config
from planner.rules.example_base import example_config_data, merge
from tests.support.megatron_lines import megatron_line
from tests.support.paths import EXAMPLES


def _values(data: dict[str, Any], stage: int = 0) -> dict[str, Any]:
    return {b.name: b.value for b in budgets(parse_config(data)) if b.stage in (stage, None)}


def _margin(var: Fraction, quantile: float, ep: int) -> int:
    """ceil(z·σ), z = Φ⁻¹(q^(1/EP)) — the definition, with z² rounded to 6 decimals as the budget does."""
    z2 = Fraction(repr(round(NormalDist().inv_cdf(quantile ** (1 / ep)) ** 2, 6)))
    return math.ceil(math.sqrt(z2 * var) - 1e-9)


def test_example_base_by_hand():
    # 256 tokens a rank, EP 4 → 1024 tokens in the group; E 8, k 2, L = 2 experts a rank.
    # Expected rows: 1024·2·2/8 = 512. Per-token variance of the local hits (hypergeometric):
    # 2·(2/8)(6/8)·(8-2)/(8-1) = 9/28; times 1024 tokens: 2304/7.
    got = _values(merge(example_config_data(""), {"cluster": {"efficiency": {"routing_imbalance": 1.25}}}))
    assert got["expected_recv_rows"] == 512
    assert got["recv_rows_var"] == Fraction(2304, 7)
    assert got["hot_recv_rows"] == 640  # 1.25 · 512
    margin = _margin(Fraction(2304, 7), 0.999, 4)
    assert margin == 64  # z ≈ 3.48, σ ≈ 18.1
    assert got["hot_recv_rows_quantile"] == 640 + 64
    assert got["hot_dispatch_recv_bytes"] == 704 * 64 * 2  # h 64, bf16
    # ETP 1: the GEMM rows are the received rows; every stored MoE layer grows by its extra rows
    assert got["hot_gemm_rows"] == 704
    extra = (704 - 512) * got["act_routed_bytes_per_row"]
    assert got["hot_act_extra_per_layer"] == extra
    held = got["hot_moe_layers_stored"] * extra
    assert got["hot_rank_memory_peak_bytes"] == got["peak_memory_bytes"] + held


def test_uniform_and_ep1_have_no_spread():
    got = _values(merge(example_config_data(""), {"parallel": {"ep": 1}}))
    assert got["recv_rows_var"] == 0
    assert got["hot_recv_rows_quantile"] == got["expected_recv_rows"] == 256 * 2
    assert got["hot_rank_extra_bytes"] == 0


def test_capacity_caps_the_hot_rank():
    # factor 1: c = ceil(256·2/8 · 1) = 64 slots an expert and source; 2 local experts · EP 4 · 64 = 512
    got = _values(merge(example_config_data(""), {
        "moe": {"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True},
        "cluster": {"efficiency": {"routing_imbalance": 2.0}}}))
    assert got["hot_recv_rows"] == got["hot_recv_rows_quantile"] == 512


def test_v4_pro_stage1():
    # 64·4096 = 262,144 tokens, E 384, k 6, L 6: variance 262144·6·(1/64)(63/64)·378/383
    data = load_config(EXAMPLES / "deepseek-v4-pro-1024.yaml").model_dump(mode="json", exclude_none=True)
    got = _values(data, stage=1)
    var = Fraction(262144 * 6 * 63 * 378, 64 * 64 * 383)
    assert got["recv_rows_var"] == var == Fraction(9144576, 383)
    assert got["hot_recv_rows_quantile"] == 24576 + _margin(var, 0.999, 64) == 25220
    # 644 more rows of FC1 in/out, FC2 in, probs: (7168 + 3·3072 + 1)·2 = 32,770 bytes a row, one
    # MoE layer held under uniform full recompute (one layer at a time)
    assert got["act_routed_bytes_per_row"] == 32770
    assert got["hot_rank_extra_bytes"] == 644 * 32770 == 21103880


def test_cited_line():
    assert "self.output_splits = num_global_tokens_per_rank[self.tp_rank]" in megatron_line(
        "core/transformer/moe/token_dispatcher.py", 602)

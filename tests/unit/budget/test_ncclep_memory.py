"""The NCCL EP receive buffers in the memory estimate: Megatron dev sizes them once from the rank
capacity factor (megatron/core/transformer/moe/token_dispatcher.py:1760,
_NCCLEPManager._ensure_bootstrap: int(ceil64(local tokens) · ETP·k · factor) rows of hidden)."""

from __future__ import annotations

from typing import Any

from planner.accounting import memory_by_stage
from planner.config.loader import load_config, parse_config
from planner.rules.example_base import example_config_data, merge
from tests.support.paths import EXAMPLES


def _stage(data: dict[str, Any], stage: int = 0) -> dict[str, Any]:
    return memory_by_stage(parse_config(data))[stage]


def _ncclep(factor: float) -> dict[str, Any]:
    return {"moe": {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "ncclep",
                    "moe_expert_rank_capacity_factor": factor}}


def test_receive_rows_round_tokens_up_to_64_and_truncate():
    # 100 local tokens → 128; ETP·k = 1·2; 128 · 2 · 1.3 = 332.8 → 332 rows.
    data = merge(example_config_data(""), merge(_ncclep(1.3), {"training": {"seq_length": 100}}))
    stage = _stage(data)
    assert stage["ncclep_recv_rows"] == 332
    h, p = 64, 2  # example base: hidden 64, bf16
    assert stage["comm_buffer_bytes"] == 2 * 332 * h * p + 2 * stage["pp_activation_bytes"]


def test_v4_pro_with_ncclep_comm_buffers():
    # 8192 tokens / CP 2 = 4096 local tokens (a multiple of 64); ETP·k = 6; factor 1.5.
    data = load_config(EXAMPLES / "deepseek-v4-pro-1024.yaml").model_dump(mode="json", exclude_none=True)
    stage = _stage(merge(data, _ncclep(1.5)), stage=1)
    assert stage["ncclep_recv_rows"] == 4096 * 6 * 3 // 2 == 36864
    # receive + combine buffers of 36864 · 7168 bf16 values, plus the two pipeline messages
    # [4096, 7168] bf16 (234881024 B each).
    assert stage["comm_buffer_bytes"] == 2 * 36864 * 7168 * 2 + 2 * 234881024 == 1526726656


def test_the_factor_scales_only_the_ncclep_buffers():
    base = example_config_data("")
    small, large = _stage(merge(base, _ncclep(1.0))), _stage(merge(base, _ncclep(2.0)))
    assert large["comm_buffer_bytes"] - small["comm_buffer_bytes"] == 2 * 256 * 2 * 64 * 2
    deepep = merge(base, {"moe": {"moe_token_dispatcher_type": "flex",
                                  "moe_flex_dispatcher_backend": "deepep"}})
    assert "ncclep_recv_rows" not in _stage(deepep)

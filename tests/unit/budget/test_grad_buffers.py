"""Article §18-19: routed experts get a grad buffer of their own only when the expert grid differs
from the dense one (EP > 1, ETP != TP or EGTP != GTP). Megatron-LM main@d98e8a64
megatron/core/extensions/transformer_engine.py:1236 TELinear.__init__ `use_expert_pgs`;
dev@d48bd6be :862/:923 tests EP > 1 alone (`allreduce = not self.expert_parallel`), and
megatron/core/distributed/param_and_grad_buffer.py:977 group_params_for_buffers keys the buffers by
`not param.allreduce`. Numbers are hand-derived from the rule examples' base config (8 ranks, PP 2,
stage 0 with 2 MoE layers of 8 experts, h 64, moe_ffn 64: 3·64·64 = 12,288 parameters an expert)."""

from __future__ import annotations

from typing import Any

import pytest

from planner.accounting import budgets
from planner.config.loader import parse_config
from planner.degrees import Degrees
from planner.rules.example_base import example_config_data, merge
from tests.support.megatron_lines import megatron_line, megatron_main_line

EXPERT = 3 * 64 * 64  # 12,288


def _stage0(overlay: dict[str, Any]) -> dict[str, Any]:
    cfg = parse_config(merge(example_config_data(""), overlay))
    return {b.name: b.value for b in budgets(cfg) if b.stage in (0, None)}


def test_ep1_puts_the_experts_in_the_dense_buffer_and_drops_the_expert_reduce():
    got = _stage0({"parallel": {"ep": 1}})
    dense = got["dense_params_on_rank"]
    assert got["expert_params_on_rank"] == 2 * 8 * EXPERT == 196608
    assert got["dense_grad_params"] == dense + 196608 == 279808
    assert got["expert_grad_params"] == got["expert_buffer_params"] == 0
    assert got["expert_grad_buffers"] == 0
    # DP 4, no distributed optimizer: one fp32 all-reduce of the whole dense buffer
    assert got["step.dense_grad_reduce.fwd.send_bytes"] == 279808 * 4 == 1119232
    assert got["step.expert_grad_reduce.fwd.send_bytes"] == 0


def test_ep4_keeps_two_buffers():
    got = _stage0({})
    assert got["dense_grad_params"] == got["dense_params_on_rank"]
    assert got["expert_grad_params"] == 2 * 2 * EXPERT == 49152  # E/EP = 2 experts a layer
    assert got["expert_grad_buffers"] == 1


@pytest.mark.parametrize(("degrees", "own"), [
    (dict(ep=1, tp=1, etp=1), False),
    (dict(ep=2, tp=1, etp=1), True),
    (dict(ep=1, tp=2, etp=1), True),   # ETP != TP
    (dict(ep=1, tp=1, etp=1, gtp=2, egtp=1), True),  # EGTP != GTP
    (dict(ep=1, tp=2, etp=2), False),
])
def test_the_condition_is_megatrons_use_expert_pgs(degrees, own):
    assert Degrees(world_size=16, **degrees).expert_grad_buffer is own


def test_etp_differing_from_tp_keeps_the_expert_buffer_with_ep1():
    got = _stage0({"parallel": {"ep": 1, "tp": 2, "etp": 1, "sequence_parallel": True}})
    assert got["expert_grad_buffers"] == 1 and got["expert_grad_params"] > 0


def test_cited_lines():
    te = "core/extensions/transformer_engine.py"
    assert "self.expert_parallel = self.config.expert_model_parallel_size > 1" in megatron_line(te, 862)
    assert 'setattr(param, "allreduce", not self.expert_parallel)' in megatron_line(te, 923)
    assert "is_expert_parallel = not getattr(param, 'allreduce', True)" in megatron_line(
        "core/distributed/param_and_grad_buffer.py", 977)


def test_cited_main_lines():
    te = "core/extensions/transformer_engine.py"
    assert "use_expert_pgs = is_expert and (" in megatron_main_line(te, 1236)
    assert "expert_tensor_parallel_size != self.config.tensor_model_parallel_size" in \
        megatron_main_line(te, 1238)
    assert "expert_gtp_weight_remat_size != self.config.gtp_weight_remat_size" in \
        megatron_main_line(te, 1239)

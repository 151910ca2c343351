"""Article §16: the flex dispatcher's fourth backend and NCCL EP's zero-copy claim, against the
Megatron lines that decide them. Dev@d48bd6be has four backends (megatron/core/transformer/
transformer_config.py:941 Literal['deepep', 'deepepv2', 'hybridep', 'ncclep']; DeepEP v2 asserts
TP×EP > 1 at token_dispatcher.py:1896 and casts non-fp32 probs at :1589) and bootstraps NCCL EP
with zero_copy=False (:1776); main@d98e8a64 has no deepepv2 (transformer_config.py:898) and adds
moe_ncclep_zero_copy (token_dispatcher.py:1540), refused without a rank capacity factor (:1559)."""

from __future__ import annotations

from typing import Any

from planner.accounting import memory_by_stage
from planner.config.loader import parse_config
from planner.config.megatron_branch import megatron_branch
from planner.emit.megatron import megatron_arguments
from planner.rules import run_rules
from planner.rules.example_base import example_config_data, merge
from tests.support.megatron_lines import megatron_line, megatron_main_line

V2 = {"moe": {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepepv2"}}
ZC = {"moe": {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "ncclep",
              "moe_ncclep_zero_copy": True, "moe_expert_rank_capacity_factor": 1.3}}


def _codes(overlay: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in run_rules(parse_config(merge(example_config_data(""), overlay)))]


def test_deepepv2_is_a_dev_backend_with_deepeps_limits():
    cfg = parse_config(merge(example_config_data(""), V2))
    assert megatron_branch(cfg) == "dev"
    assert megatron_arguments(cfg).as_dict()["--moe-flex-dispatcher-backend"] == ("deepepv2",)
    assert _codes(V2) == [("MOE030", "model.moe_router_dtype")]
    assert _codes(merge(V2, {"model": {"moe_router_dtype": "fp32"}})) == []
    assert ("MOE008", "parallel.ep") in _codes(merge(V2, {"parallel": {"ep": 1}}))
    padded = merge(V2, {"moe": {"moe_expert_capacity_factor": 1.0,
                                "moe_pad_expert_input_to_capacity": True}})
    assert ("MOE013", "moe.moe_pad_expert_input_to_capacity") in _codes(padded)


def test_deepepv2_buffers_are_deepeps():
    v2 = memory_by_stage(parse_config(merge(example_config_data(""), V2)))[0]
    v1 = memory_by_stage(parse_config(merge(example_config_data(""), {"moe": {
        "moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep"}})))[0]
    assert v2["comm_buffer_bytes"] == v1["comm_buffer_bytes"] > 0


def test_zero_copy_is_main_only_and_needs_the_static_budget():
    cfg = parse_config(merge(example_config_data(""), ZC))
    assert megatron_branch(cfg) == "main"
    assert "--moe-ncclep-zero-copy" in megatron_arguments(cfg).as_dict()
    assert _codes(ZC) == []
    eager = merge(ZC, {"moe": {"moe_expert_rank_capacity_factor": None}})
    assert ("MOE031", "moe.moe_expert_rank_capacity_factor") in _codes(eager)
    other = {"moe": {"moe_token_dispatcher_type": "alltoall", "moe_ncclep_zero_copy": True}}
    assert _codes(other) == [("MOE031", "moe.moe_ncclep_zero_copy")]
    overlap = merge(ZC, {"parallel": {"pp": 1}, "overlap": {"overlap_moe_expert_parallel_comm": True}})
    assert ("MOE032", "overlap.overlap_moe_expert_parallel_comm") in _codes(overlap)


def test_zero_copy_buffers_are_bf16_whatever_the_training_dtype():
    # 256 local tokens (a multiple of 64) · ETP·k = 2 · factor 1.3 = 665.6 → 665 receive rows;
    # h 64; fp32 training: the staged path keeps two fp32 buffers, zero-copy two bf16 ones.
    fp32 = {"training": {"precision": "fp32"}}
    staged = memory_by_stage(parse_config(merge(example_config_data(""), merge(merge(ZC, fp32), {
        "moe": {"moe_ncclep_zero_copy": False}}))))[0]
    zero = memory_by_stage(parse_config(merge(example_config_data(""), merge(ZC, fp32))))[0]
    assert zero["ncclep_recv_rows"] == 665
    pp = 2 * staged["pp_activation_bytes"]
    assert staged["comm_buffer_bytes"] == 2 * 665 * 64 * 4 + pp
    assert zero["comm_buffer_bytes"] == 2 * 665 * 64 * 2 + pp


def test_cited_dev_lines():
    cfg, td = "core/transformer/transformer_config.py", "core/transformer/moe/token_dispatcher.py"
    assert "Literal['deepep', 'deepepv2', 'hybridep', 'ncclep']" in megatron_line(cfg, 941)
    assert '"DeepEP v2 dispatcher requires TPxEP > 1"' in megatron_line(td, 1896)
    assert "if self.token_probs.dtype != torch.float32:" in megatron_line(td, 1589)
    assert "zero_copy=False," in megatron_line(td, 1776)


def test_cited_main_lines():
    cfg, td = "core/transformer/transformer_config.py", "core/transformer/moe/token_dispatcher.py"
    assert "Literal['deepep', 'hybridep', 'ncclep']" in megatron_main_line(cfg, 898)
    assert "self.zero_copy = config.moe_ncclep_zero_copy" in megatron_main_line(td, 1540)
    assert "moe_ncclep_zero_copy requires moe_expert_rank_capacity_factor" in megatron_main_line(td, 1561)
    assert "moe_ncclep_zero_copy + overlap_moe_expert_parallel_comm" in megatron_main_line(td, 1671)


def test_ncclep_capacity_against_the_busiest_rank():
    # 256 local tokens (a multiple of 64) · ETP·k = 2 · factor: 1.0 → 512 rows, 1.1 → 563, 1.5 → 768.
    # The busiest rank at q = 0.999: 512 expected + ceil(z·σ) = 64 (tests/unit/budget/test_hot_rank.py)
    # = 576 rows, so 1.0 and 1.1 overflow, 1.5 holds it.
    def codes(factor: float) -> list[tuple[str, str]]:
        return _codes({"moe": {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "ncclep",
                               "moe_expert_rank_capacity_factor": factor}})
    assert codes(1.0) == codes(1.1) == [("MOE034", "moe.moe_expert_rank_capacity_factor")]
    assert codes(1.5) == []
    [finding] = run_rules(parse_config(merge(example_config_data(""), {"moe": {
        "moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "ncclep",
        "moe_expert_rank_capacity_factor": 1.1}})))
    assert "receive capacity 563 rows < the busiest rank's 576" in finding.message

"""Bytes and memory of the flex backends, virtual experts and fp8/fp4 row padding, each against
an expectation derived by hand below (the small example base: hidden 64, moe_ffn_hidden_size 64,
bf16, sequence 256, micro-batch 1, global batch 16).

Flex backends de-duplicate: a token crosses to each destination node once and reaches each
destination rank once (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/fused_a2a.py
FusedDispatch.forward, HybridEPDispatch.forward). Under uniform routing the k experts of a token
are k distinct draws from E, so a set of m experts is missed with probability C(E − m, k)/C(E, k).
"""

from __future__ import annotations

from fractions import Fraction
from math import comb
from typing import Any

import pytest

from planner.accounting import budgets
from planner.budget.symbols import miss_probability
from planner.config.loader import parse_config
from planner.rules.example_base import example_config_data, merge

H, FFN, P = 64, 64, 2  # example base: hidden, expert FFN width, bf16 bytes


def values(overlay: dict[str, Any], rank: int = 0) -> dict[str, Any]:
    """name -> value for one rank (first stage's rank 0 unless told)."""
    cfg = parse_config(merge(example_config_data(""), overlay))
    return {b.name: b.value for b in budgets(cfg, rank=rank)}


def _flex(backend: str, gpus_per_node: int, **moe: Any) -> dict[str, Any]:
    # 8 ranks, PP 1, EP 8: one tp_ep group of 8 ranks; 16 experts, top-4 (2 experts per rank).
    return {"parallel": {"pp": 1, "ep": 8}, "model": {"num_experts": 16, "moe_router_topk": 4},
            "cluster": {"gpus_per_node": gpus_per_node},
            "moe": {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": backend,
                    **moe}}


def test_miss_probability_is_the_binomial_ratio():
    assert miss_probability(16, 4, 2) == Fraction(comb(14, 4), comb(16, 4)) == Fraction(11, 20)
    assert miss_probability(16, 4, 8) == Fraction(70, 1820) == Fraction(1, 26)
    assert miss_probability(8, 2, 0) == 1  # nothing held: never reached
    assert miss_probability(8, 2, 7) == 0  # two picks cannot avoid 7 of 8 experts


def test_hybridep_on_two_nodes_splits_rdma_and_nvlink_rows():
    # 4 GPUs per node: the tp_ep group spans G = 2 nodes of 4 ranks, 8 experts each.
    v = values(_flex("hybridep", 4))
    n = 256  # local tokens
    # miss one EP rank (2 experts): C(14,4)/C(16,4) = 1001/1820 = 11/20
    # → destination ranks 8·(1 − 11/20) = 18/5 per token (4 before de-duplication)
    assert v["flex_dest_ranks"] == Fraction(18, 5)
    assert v["flex_dedup_rows"] == n * Fraction(18, 5) == Fraction(4608, 5)
    # miss one node (8 experts): C(8,4)/C(16,4) = 70/1820 = 1/26 → 2·25/26 = 25/13 nodes
    assert v["flex_dest_nodes"] == Fraction(25, 13)
    # RDMA: one row per token and remote destination node: 256·(2 − 1)·25/26 = 3200/13
    assert v["flex_rdma_rows"] == Fraction(3200, 13)
    # bytes: ceil(3200/13 · 64 · 2) = ceil(31507.69…) = 31508
    assert v["flex_rdma_bytes"] == 31508
    # NVLink: every destination rank but itself and the remote landing peer:
    # 256·(8 − 2)·9/20 = 3456/5 rows → ceil(3456/5 · 128) = ceil(88473.6) = 88474 bytes
    assert v["flex_nvlink_rows"] == Fraction(3456, 5)
    assert v["flex_nvlink_bytes"] == 88474
    # per step: 4 MoE layers × 2 microbatches (16 / (1 · DP 8)) = 8 passes
    assert v["moe_layer_passes"] == 8
    for name in ("ep_dispatch_hidden", "ep_combine_hidden"):
        for phase in ("fwd", "bwd"):
            step = f"step.{name}.{phase}"
            # rounded once per step: ceil(4608/5 · 128 · 8) = ceil(943718.4) = 943719
            assert v[f"{step}.send_bytes"] == 943719
            # ceil(3200/13 · 128 · 8) = ceil(252061.54) = 252062
            assert v[f"{step}.inter_node_bytes"] == 252062
            # ceil(3456/5 · 128 · 8) = ceil(707788.8) = 707789
            assert v[f"{step}.intra_node_bytes"] == 707789
    # a plain all-to-all would put n·k·(8 − 4)/8 rows across nodes: 256·4·4/8·128 = 65536 B
    assert v["flex_rdma_bytes"] < 256 * 4 * 4 // 8 * H * P


def test_deepep_inside_one_node_has_no_rdma_bytes():
    v = values(_flex("deepep", 8))
    assert v["flex_rdma_rows"] == 0 and v["step.ep_dispatch_hidden.fwd.inter_node_bytes"] == 0
    # 256·(8 − 1)·9/20 = 4032/5 rows over NVLink → ceil(4032/5 · 128) = ceil(103219.2) = 103220
    assert v["flex_nvlink_rows"] == Fraction(4032, 5)
    # per step: ceil(4032/5 · 128 · 8) = ceil(825753.6) = 825754
    assert v["step.ep_dispatch_hidden.fwd.wire_bytes"] == 825754
    # DeepEP's transient buffers: the de-duplicated received rows and the per-rank sums combine
    # sends back, 2 · ceil(4608/5 · 64 · 2) = 2 · 117965 (PP = 1: no pipeline buffers)
    assert v["comm_buffer_bytes"] == 2 * 117965


def test_hybridep_buffers_are_the_expert_outputs_and_the_combined_tokens():
    v = values(_flex("hybridep", 4))
    # expert rows n·k = 1024 (uniform), combined tokens 256: (1024 + 256) · 64 · 2
    assert v["comm_buffer_bytes"] == (1024 + 256) * H * P == 163840


def test_backends_share_the_wire_bytes():
    keys = ("flex_rdma_bytes", "flex_nvlink_bytes")
    hybrid = values(_flex("hybridep", 4))
    nccl = values(_flex("ncclep", 4, moe_expert_rank_capacity_factor=1.5))
    assert [hybrid[k] for k in keys] == [nccl[k] for k in keys]


def test_ncclep_buffers_round_to_the_fp8_alignment():
    overlay = {"training": {"seq_length": 100, "fp8": True},
               "moe": {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "ncclep",
                       "moe_expert_rank_capacity_factor": 1.3}}
    v = values(overlay)
    # 100 tokens → 128 (HT chunks of 64); ·ETP·k = 2 → 256; ·1.3 = 332.8 → 332; up to 16 → 336
    assert v["ncclep_recv_rows"] == 336
    # receive + re-expanded expert outputs (no zero-copy in dev), plus two pipeline messages of
    # [100, 64] bf16 = 12800 B each
    assert v["comm_buffer_bytes"] == 2 * 336 * H * P + 2 * 12800 == 111616


@pytest.mark.parametrize(("precision", "align", "padded"), [("fp8", 16, 208), ("fp4", 128, 256)])
def test_fp8_and_fp4_pad_each_experts_rows(precision: str, align: int, padded: int):
    v = values({"training": {"seq_length": 200, precision: True}})
    # EP 4, 8 experts (2 per rank), top-2: 4 · 200 · 2 / 8 = 200 rows per expert → padded to
    # ceil(200/align)·align = 208 (fp8) or 256 (fp4); two experts per rank
    assert v["local_expert_rows"] == 200 and v["gemm_rows_padded"] == 2 * padded
    # stored: rows · (h + 3·I + 1) · p + the int64 map of 200·2 assignments
    assert v["act_routed_per_layer"] == 2 * padded * (H + 3 * FFN + 1) * P + 400 * 8


def test_bf16_rows_are_not_padded():
    assert "gemm_rows_padded" not in values({"training": {"seq_length": 200}})


def test_virtual_experts_price_weights_slots_and_gradients():
    v = values({"moe": {"moe_virtual_experts": True}})
    expert = 3 * H * FFN * P  # W1, W3, W2 of one expert in bf16 = 24576 B
    assert v["vex_expert_weight_bytes"] == expert == 24576
    # stage 0: 2 MoE layers × 4 microbatches (16 / DP 4) = 8 passes, one slot per layer
    assert v["step.vex_weight_transfer.fwd.send_bytes"] == expert * 8 == 196608
    # EP 4 on one node: 3/4 of it on the wire, none across nodes
    assert v["step.vex_weight_transfer.fwd.wire_bytes"] == 147456
    assert v["step.vex_weight_transfer.fwd.inter_node_bytes"] == 0
    # the replica's fp32 gradient back: 3·64·64·4 · 8 = 393216
    assert v["step.vex_grad_return.bwd.send_bytes"] == 3 * H * FFN * 4 * 8 == 393216
    # slots held for 2 in-flight microbatches (1F1B, PP 2, stage 0) × 2 layers, plus one fp32
    # replica gradient: 2·2·24576 + 49152 = 147456
    assert v["in_flight_microbatches"] == 2
    assert v["vex_slot_bytes"] == 147456
    assert "vex_slot_bytes" not in values({})


@pytest.mark.parametrize(("overlay", "message"), [
    ({"moe": {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}},
     "moe_token_dispatcher_type = 'flex'"),
    ({"moe": {"moe_virtual_experts": True, "moe_token_dispatcher_type": "flex",  # VEX006/VEX007
              "moe_flex_dispatcher_backend": "hybridep"}}, "moe_virtual_experts is not implemented"),
    ({"training": {"fp8": True}}, "training.fp8/fp4"),
])
def test_the_runtime_refuses_what_is_predicted_only(overlay: dict[str, Any], message: str):
    from planner.plan import compile_plan
    from planner.rules import run_rules
    from runtime.plan_io import PlanError, check_plan

    cfg = parse_config(merge(example_config_data(""), overlay))
    with pytest.raises(PlanError, match=message.replace(".", r"\.")):
        check_plan(compile_plan(cfg, run_rules(cfg)))


def _simulated_hit_rates(experts: int, topk: int, groups: int, group_topk: int, block: int,
                         tokens: int = 100_000) -> float:
    """Megatron's group-limited top-k on forced-balance logits (normal noise through a sigmoid;
    Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_utils.py RandomSTE and
    group_limited_topk): the chance a token reaches expert block 0 of `block` experts."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(tokens, experts, generator=generator).sigmoid()
    group_scores = scores.view(tokens, groups, -1).topk(topk // group_topk, dim=-1)[0].sum(-1)
    picked = torch.zeros(tokens, groups, dtype=torch.bool).scatter_(
        1, group_scores.topk(group_topk, dim=-1)[1], True)
    masked = scores.masked_fill(~picked.repeat_interleave(experts // groups, dim=1), -1.0)
    chosen = masked.topk(topk, dim=-1)[1]
    return float((chosen < block).any(dim=-1).float().mean())


@pytest.mark.parametrize(("block", "hand"), [
    # a node holding one whole group (DeepSeek-V3, EP64 over 8 nodes, 8 groups, 4 picked): it is
    # reached exactly when its group is picked, 1 − C(7, 4)/C(8, 4) = 1/2; plain top-8 says
    # 1 − C(224, 8)/C(256, 8) ≈ 0.662
    (32, Fraction(1, 2)),
    # an EP rank's 4 experts inside one group: picked with chance 1/2, then 2 picks of the
    # group's 32 miss the 4 with C(28, 2)/C(32, 2) = 378/496: 1 − (1/2 + 1/2 · 378/496)
    (4, 1 - (Fraction(1, 2) + Fraction(1, 2) * Fraction(378, 496))),
])
def test_group_limited_routing_reaches_fewer_blocks(block: int, hand: Fraction) -> None:
    reach = 1 - miss_probability(256, 8, block, (8, 4))
    assert reach == hand
    assert reach == pytest.approx(_simulated_hit_rates(256, 8, 8, 4, block), rel=0.03)
    assert reach < 1 - miss_probability(256, 8, block)  # plain top-k reaches more blocks

"""Budgets (planner/accounting.py): the V4-Pro worked numbers, hand-derived layouts, properties.

Every expected number here is derived by hand from the layout and Megatron's rules, never read
back from the product.
"""

from __future__ import annotations

import copy
import itertools
import math
import subprocess
import sys
from fractions import Fraction
from typing import Any

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.accounting import (
    ALL_SYMBOLS,
    Accounting,
    BudgetError,
    Variant,
    budgets,
    formula_book,
    memory_by_stage,
    plan_budgets,
)
from planner.config.loader import load_config, parse_config
from planner.config.schema import Config
from planner.rules.memory import memory_findings
from tests.support.base_configs import MINIMAL_V4
from tests.support.paths import EXAMPLES, ROOT

V4_PRO = EXAMPLES / "deepseek-v4-pro-1024.yaml"


def values(items: list, stage: int | None = None) -> dict[str, Any]:
    """name -> value for the global budgets plus those of one stage."""
    return {b.name: b.value for b in items if b.stage is None or b.stage == stage}


def config(data: dict[str, Any], **overlay: dict[str, Any]) -> Config:
    merged = copy.deepcopy(data)
    for section, fields in overlay.items():
        merged.setdefault(section, {}).update(fields)
    return parse_config(merged)


def v4_data() -> dict[str, Any]:
    """The V4-Pro example as plain data, to vary one field at a time."""
    return load_config(V4_PRO).model_dump(mode="json", exclude_none=True)


@pytest.fixture(scope="module")
def v4() -> list:
    return budgets(load_config(V4_PRO))


# ----------------------------------------------------------------- the V4-Pro worked example


def test_v4_pro_worked_example_values(v4):
    got = values(v4, stage=1)
    expected = {
        "dense_dp": 64, "expert_dp": 2, "ranks_per_stage": 128, "experts_per_rank": 6,
        "tokens_per_rank": 4096, "ep_group_tokens": 262_144, "ep_group_assignments": 1_572_864,
        "expected_rows_per_expert": 4096, "dispatch_send_rows": 24_576,
        "expected_recv_rows": 24_576,
        "dispatch_send_bytes": 336 * 2**20,  # 24,576 · 7168 · 2 B
        "dispatch_remote_bytes": 346_816_512,  # 330.75 MiB = 336 MiB · 63/64
        "ep_fwd_remote_bytes": 693_633_024,  # 661.5 MiB
        "ep_fwd_bwd_remote_bytes": 1323 * 2**20,
        "routed_weight_bytes_per_layer": 756 * 2**20,  # 6 · 66,060,288 · 2 B
        "routed_weight_bytes_per_stage": 6_341_787_648,  # 8 MoE layers: 5.90625 GiB
        "microbatches": 64, "allgather_dispatch_rows": 262_144,
    }
    assert {name: got[name] for name in expected} == expected
    assert got["routed_weight_bytes_per_stage"] == Fraction(590625, 100000) * 2**30
    # Uniform full recompute, N_r 1: Megatron trains V4 on the HybridStack, whose
    # checkpointed_forward (megatron/core/recompute.py) keeps one input per pattern symbol, an
    # attention symbol and a MoE symbol per block: 8 blocks, 16 inputs of 4096 tokens · 4 mHC
    # streams · 7168 · 2 B = 224 MiB; recompute re-runs one symbol, the average of 16.
    recompute = {"layer_input_bytes": 224 * 2**20,
                 "act_stored_layers": 16 * 224 * 2**20, "act_live_peak": 7 * 16 * 224 * 2**20}
    assert {name: got[name] for name in recompute} == recompute
    assert got["recompute_working_bytes"] == got["act_layers_per_microbatch"] / 16
    # The last stage: 7 blocks (14 symbols) and the MTP depth, which
    # MultiTokenPredictionLayer._checkpointed_forward checkpoints whole (one input).
    assert values(v4, stage=7)["act_stored_layers"] == 15 * 224 * 2**20
    assert got["grad_scale_sum_dense"] == sympy.Rational(1, 128)
    assert got["grad_scale_sum_expert"] == sympy.Rational(1, 128)
    assert got["grad_scale_avg_expert"] == sympy.Rational(2, 128)


def test_v4_pro_block_recompute_counts_pattern_symbols():
    """The block method over Megatron's HybridStack (megatron/core/recompute.py
    checkpointed_forward) recomputes the first N_r pattern symbols of each chunk: N_r 3 on stage 1
    (8 blocks, 16 symbols) keeps 3 inputs of 224 MiB and 13 average symbols whole."""
    cfg = config(v4_data(), overlap={"recompute_granularity": "full", "recompute_method": "block",
                                     "recompute_num_layers": 3})
    got = values(budgets(cfg, stage=1), stage=1)
    symbol = Fraction(got["act_layers_per_microbatch"]) / 16
    assert got["act_stored_layers"] == math.ceil(13 * symbol) + 3 * 224 * 2**20
    assert got["recompute_working_bytes"] == math.ceil(symbol)


def test_v4_pro_per_stage_moe_layers(v4):
    # Layout Et*6|(t*8|)*6t*7mL: 6 MoE blocks on stage 0, 8 on stages 1-6, 7 + MTP on stage 7.
    per_stage = {b.stage: b.value for b in v4 if b.name == "routed_weight_bytes_per_stage"}
    assert per_stage == {0: 6 * 756 * 2**20, **{s: 6_341_787_648 for s in range(1, 8)}}
    assert {b.scope for b in v4 if b.name == "moe_layers"} == {
        f"stage {s} (rank {128 * s})" for s in range(8)}


def test_explanation_of_dispatch_remote_bytes(v4):
    [budget] = [b for b in v4 if b.name == "dispatch_remote_bytes"]
    assert budget.formula == "ceiling(dispatch_send_bytes * (EP - 1) / EP)"
    assert budget.substitution == "ceiling(352321536 · (64 - 1) / 64)"
    assert budget.expression == sympy.ceiling(sympy.Symbol("dispatch_send_bytes") * (
        sympy.Symbol("EP") - 1) / sympy.Symbol("EP"))


def test_v4_pro_with_etp_2_doubles_flex_destinations():
    cfg = config(v4_data(), parallel={"etp": 2})
    got = values(budgets(cfg, stage=0), stage=0)
    assert (got["flex_topk"], got["flex_num_experts"]) == (12, 768)
    # Half the expert matrix per rank: 6 experts · 3 · 7168 · 3072/2 · 2 B.
    assert got["routed_weight_bytes_per_layer"] == 378 * 2**20


def test_topology_of_the_v4_pro_example(v4):
    stage0 = values(v4, stage=0)
    # EP64 = ranks 0..63 = 8 nodes of 8: 56 of every 64 dispatched rows leave the node.
    assert stage0["ep_group_nodes"] == 8
    assert stage0["ep_offnode_share"] == Fraction(56, 64)
    assert stage0["ep_rows_leaving_node"] == 24_576 * 56 // 64
    # CP pairs (0, 1) share a node; EDP pairs (0, 64) sit on nodes 0 and 8.
    assert stage0["cp_group_nodes"] == 1 and stage0["expt_dp_group_nodes"] == 2
    per_layer = 336 * 2**20 * 64 * 6  # dispatch bytes × microbatches × MoE layers on stage 0
    assert stage0["step.ep_dispatch_hidden.fwd.send_bytes"] == per_layer
    assert stage0["step.ep_dispatch_hidden.fwd.inter_node_bytes"] == per_layer * 56 // 64
    assert stage0["step.ep_dispatch_hidden.fwd.intra_node_bytes"] == per_layer * 7 // 64
    # Expert grads reduce over the EDP pair on two nodes: every ring byte crosses nodes.
    wire = stage0["step.expert_grad_reduce.fwd.wire_bytes"]
    assert wire > 0 and stage0["step.expert_grad_reduce.fwd.inter_node_bytes"] == wire


# ----------------------------------------------------------------- GTP example


GTP_EXAMPLE = {
    "model": {"preset": "deepseek-v4-pro"},
    "parallel": {"world_size": 128, "tp": 1, "cp": 2, "pp": 1, "ep": 64, "gtp": 64,
                 "gtp_remat_num_sequence_shards": 64},
    "training": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 64},
}


def test_gtp_sequence_sharding_example():
    got = values(budgets(parse_config(copy.deepcopy(GTP_EXAMPLE)), stage=0), stage=0)
    assert (got["cp_runtime"], got["weight_replicas"], got["batch_replicas"]) == (128, 1, 1)
    assert got["expert_dp"] == 2 and got["dense_dp"] == 1
    assert got["tokens_per_rank"] == 8192 // 128
    assert got["microbatches"] == 64  # B / (b · D_batch) = 64 / (1 · 1)
    # R_e / R = 1/64: the expert SUM pre-scale carries the PR #7165 correction.
    assert got["gtp_expert_correction"] == Fraction(1, 64)
    assert got["grad_scale_sum_expert"] == Fraction(1, 2) * Fraction(1, 64)
    assert got["grad_scale_total_dense"] == got["grad_scale_total_expert"] == Fraction(1, 128)


# ----------------------------------------------------------------- hand-derived layout A

# 16 ranks, TP2 with SP, EP4, ETP2, 8 experts top-2, drop-and-pad with capacity factor 1.5.
LAYOUT_A = {
    "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "kv_channels": 16,
              "ffn_hidden_size": 128, "vocab_size": 256, "num_experts": 8, "moe_router_topk": 2,
              "moe_ffn_hidden_size": 32},
    "parallel": {"world_size": 16, "tp": 2, "ep": 4, "etp": 2, "sequence_parallel": True},
    "training": {"seq_length": 64, "micro_batch_size": 2, "global_batch_size": 32,
                 "precision": "bf16"},
    "moe": {"moe_expert_capacity_factor": 1.5, "moe_pad_expert_input_to_capacity": True},
    "cluster": {"gpus_per_node": 4},
}


def test_layout_a_etp_with_drop_and_pad():
    got = values(budgets(parse_config(copy.deepcopy(LAYOUT_A)), stage=0), stage=0)
    # DP = 16/2 = 8, EDP = 16/(2·4) = 2, m = 32/(2·8) = 2.
    assert (got["dense_dp"], got["expert_dp"], got["microbatches"]) == (8, 2, 2)
    # n = b·S/(CP·TP) = 2·64/2 = 64 rows; c = ceil(64·2/8 · 1.5) = 24.
    assert (got["tokens_per_rank"], got["capacity"]) == (64, 24)
    assert got["dispatch_send_rows"] == 8 * 24  # E·c
    assert got["local_expert_rows"] == 4 * 24  # a c-block from each of the EP sources
    assert got["expected_recv_rows"] == 2 * 96  # 2 local experts
    assert got["expert_gemm_rows"] == 2 * 192  # after the ETP all-gather
    assert got["dispatch_send_bytes"] == 192 * 64 * 2
    assert got["dispatch_remote_bytes"] == 192 * 64 * 2 * 3 // 4
    assert got["routed_weight_bytes_per_layer"] == 2 * 3 * 64 * 32 // 2 * 2
    assert (got["flex_topk"], got["flex_num_experts"], got["allgather_dispatch_rows"]) == (4, 16, 512)
    passes = 2 * 2  # MoE layers × microbatches
    assert got["step.ep_dispatch_hidden.fwd.send_bytes"] == 24_576 * passes
    assert got["step.etp_gather_hidden.fwd.send_bytes"] == 24_576 * passes
    assert got["step.etp_gather_hidden.fwd.recv_bytes"] == 2 * 24_576 * passes
    assert got["step.etp_scatter_hidden.fwd.send_bytes"] == 2 * 24_576 * passes
    assert got["step.etp_gather_probs.fwd.send_bytes"] == 192 * 2 * passes
    # Drop-and-pad fixes every split: no count exchange.
    assert got["step.ep_count_exchange.fwd.send_bytes"] == 0
    # EP group of rank 0 is [0, 2, 4, 6] on nodes 0, 0, 1, 1: half the rows leave the node.
    assert got["ep_offnode_share"] == Fraction(1, 2)
    sent = 24_576 * passes
    assert got["step.ep_dispatch_hidden.fwd.inter_node_bytes"] == sent // 2
    assert got["step.ep_dispatch_hidden.fwd.intra_node_bytes"] == sent // 4
    # expt_tp [0, 1] shares a node.
    assert got["step.etp_gather_hidden.fwd.inter_node_bytes"] == 0


def test_layout_a_vocabulary_and_logits():
    # Megatron-LM dev@d48bd6be megatron/core/tokenizers/utils/build_tokenizer.py:124
    # vocab_size_with_padding: 200 tokens grow to a multiple of 128 · TP = 256.
    data = copy.deepcopy(LAYOUT_A)
    data["model"]["vocab_size"] = 200
    got = values(budgets(parse_config(data), stage=0), stage=0)
    assert got["embedding_params"] == 256 * 64 // 2
    # Sequence parallel: 64 local rows (2·64/2) of bf16 input; the fp32 logits cover the whole
    # 128 rows, each with 256/2 vocabulary columns.
    assert got["act_output"] == 64 * 64 * 2 + 128 * 128 * 4
    data["parallel"]["sequence_parallel"] = False
    got = values(budgets(parse_config(data), stage=0), stage=0)
    assert got["act_output"] == 128 * 64 * 2 + 128 * 128 * 4


def test_layout_a_dropping_without_padding_exchanges_counts():
    data = copy.deepcopy(LAYOUT_A)
    data["moe"] = {"moe_expert_capacity_factor": 0.5}
    got = values(budgets(parse_config(data), stage=0), stage=0)
    # c = ceil(16 · 0.5) = 8 < n·k/E = 16: every expert keeps 8 rows per source.
    assert got["capacity"] == 8 and got["dispatch_send_rows"] == 64
    assert got["step.ep_count_exchange.fwd.send_bytes"] == 8 * 8 * 4  # E int64 per pass
    assert got["step.ep_count_exchange.fwd.recv_bytes"] == 8 * 8 * 4 * 8  # from ETP·EP ranks


# ----------------------------------------------------------------- hand-derived layout B

# 8 ranks, CP1, PP2 with VPP2, EP4, 8 MoE layers, fp32, dropless; 2 GPUs per node.
LAYOUT_B = {
    "model": {"num_layers": 8, "hidden_size": 32, "num_attention_heads": 4, "kv_channels": 8,
              "ffn_hidden_size": 64, "vocab_size": 128, "num_experts": 8, "moe_router_topk": 2,
              "moe_ffn_hidden_size": 16},
    "parallel": {"world_size": 8, "pp": 2, "vpp": 2, "ep": 4},
    "training": {"seq_length": 32, "micro_batch_size": 1, "global_batch_size": 16,
                 "precision": "fp32"},
    "cluster": {"gpus_per_node": 2},
}


def test_layout_b_pipeline_with_virtual_stages():
    items = budgets(parse_config(copy.deepcopy(LAYOUT_B)))
    s0, s1 = values(items, 0), values(items, 1)
    # DP = 8/2 = 4, EDP = 8/(4·2) = 1, m = 16/4 = 4; 2 layers per chunk, 4 per stage.
    assert (s0["dense_dp"], s0["expert_dp"], s0["microbatches"]) == (4, 1, 4)
    assert s0["moe_layers"] == s1["moe_layers"] == 4
    assert s0["tokens_per_rank"] == 32 and s0["expected_recv_rows"] == 64
    assert s0["dispatch_send_bytes"] == 64 * 32 * 4
    assert s0["step.ep_dispatch_hidden.fwd.send_bytes"] == 8192 * 4 * 4
    # One pipeline message is [32, 32] fp32 = 4 KiB. Stage 0 sends from both chunks forward
    # (chunk 0 → stage 1, chunk 2 → stage 1) and receives into chunk 2 only.
    assert s0["pp_activation_bytes"] == 4096
    assert s0["step.pp_activation.fwd.send_bytes"] == 4096 * 2 * 4
    assert s0["step.pp_activation.fwd.recv_bytes"] == 4096 * 1 * 4
    assert s1["step.pp_activation.fwd.send_bytes"] == 4096 * 1 * 4
    assert s1["step.pp_activation.bwd.send_bytes"] == 4096 * 2 * 4
    # Interleaved 1F1B warm-up: 2·(PP−s−1) + (VPP−1)·PP + 1 chunks in flight, over VPP.
    assert s0["in_flight_microbatches"] == Fraction(5, 2)
    assert s1["in_flight_microbatches"] == Fraction(3, 2)
    # EDP = 1: expert grads are never reduced; dense grads all-reduce over dp_cp (4 ranks).
    assert s0["step.expert_grad_reduce.fwd.send_bytes"] == 0
    assert s0["step.dense_grad_reduce.fwd.send_bytes"] == s0["dense_params_on_rank"] * 4
    # pp group [0, 4]: ranks 0 and 4 live on nodes 0 and 2.
    assert s0["step.pp_activation.fwd.inter_node_bytes"] == s0["step.pp_activation.fwd.send_bytes"]


# ----------------------------------------------------------------- properties

small_layouts = st.fixed_dictionaries({
    "ep": st.sampled_from([1, 2, 4, 8]),
    "etp": st.sampled_from([1, 2]),
    "cp": st.sampled_from([1, 2]),
    "pp": st.sampled_from([1, 2]),
    "seq": st.sampled_from([64, 128, 256]),
    "topk": st.sampled_from([1, 2, 4]),
    "dispatcher": st.sampled_from(["alltoall", "allgather", "flex"]),
    "dist_opt": st.booleans(),
})


def small(p: dict[str, Any], **changes: Any) -> Config:
    p = {**p, **changes}
    return parse_config({
        "model": {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "kv_channels": 16,
                  "ffn_hidden_size": 128, "vocab_size": 256, "num_experts": 16,
                  "moe_router_topk": p["topk"], "moe_ffn_hidden_size": 32,
                  "moe_shared_expert_intermediate_size": 32},
        "parallel": {"world_size": 32, "cp": p["cp"], "pp": p["pp"], "ep": p["ep"],
                     "etp": p["etp"]},
        "training": {"seq_length": p["seq"], "global_batch_size": 64,
                     "use_distributed_optimizer": p["dist_opt"]},
        "moe": {"moe_token_dispatcher_type": p["dispatcher"]},
    })


@settings(max_examples=25, deadline=None)
@given(small_layouts)
def test_bytes_scale_linearly_with_sequence_length(p):
    rows = budgets(small(p), stage=0)
    one, two = values(rows, 0), values(budgets(small(p, seq=2 * p["seq"]), stage=0), 0)
    # an expectation rounded up to whole bytes (flex de-duplication) may sit a byte or two off
    rounded = {b.name.rsplit(".", 1)[0] for b in rows if "ceiling" in b.formula}
    for name, value in one.items():
        per_token = name.startswith("step.") and not any(
            word in name for word in ("grad", "param", "bias", "embd", "count_exchange"))
        if per_token:  # weights and length-E counts do not grow with the sequence
            slack = 2 if name.rsplit(".", 1)[0] in rounded else 0
            assert abs(two[name] - 2 * value) <= slack, name
    for name in ("tokens_per_rank", "expert_gemm_rows", "act_routed_per_layer"):
        assert two[name] == 2 * one[name]


@settings(max_examples=20, deadline=None)
@given(small_layouts)
def test_remote_bytes_vanish_at_ep_1(p):
    got = values(budgets(small(p, ep=1, etp=1), stage=0), 0)
    assert all(got[n] == 0 for n in got if n.startswith(("step.ep_", "step.etp_", "step.ag_")))
    if p["dispatcher"] == "alltoall":
        assert got["dispatch_remote_bytes"] == got["combine_remote_bytes"] == 0
        assert got["dispatch_send_bytes"] > 0  # the rank still permutes its own rows


@settings(max_examples=20, deadline=None)
@given(small_layouts)
def test_memory_falls_with_ep_while_expert_activations_do_not(p):
    # (The AllGather dispatcher's gathered buffer grows with EP, and so do the Flex backends'
    # de-duplicated buffers: over more EP ranks a token reaches more distinct destinations.)
    p = {**p, "dispatcher": "alltoall"}
    by_ep = {ep: memory_by_stage(small(p, ep=ep))[0] for ep in (1, 2, 4, 8)}
    acts = {ep: values(budgets(small(p, ep=ep), stage=0), 0)["act_routed_per_layer"]
            for ep in (1, 8)}
    routed = [by_ep[ep]["peak_memory_bytes"] for ep in (1, 2, 4, 8)]
    assert routed == sorted(routed, reverse=True) and routed[0] > routed[-1]
    assert acts[1] == acts[8]  # expert inputs are n·k·ETP rows whatever EP is


@settings(max_examples=20, deadline=None)
@given(small_layouts)
def test_gradient_scaling_invariants(p):
    got = values(budgets(small(p), stage=0), 0)
    # SUM: both pre-scale by 1/|DP×CP|; AVG: expert pre-scale |EDP|/|DP×CP|, then ÷|EDP|.
    assert got["grad_scale_sum_dense"] == got["grad_scale_sum_expert"] == Fraction(
        1, got["dense_dp"] * p["cp"])
    assert got["grad_scale_avg_expert"] / got["expert_dp"] == got["grad_scale_sum_dense"]
    assert got["microbatches"] * 1 * got["batch_replicas"] == 64  # B = b · m · D_batch


def test_sympy_expressions_agree_with_the_fast_path():
    """The formula strings parsed by sympy give the same exact values as the compiled path."""
    acc = Accounting(parse_config(copy.deepcopy(LAYOUT_A)))
    env = acc.stage_env(0)
    for q in acc.book.at("global") + acc.book.at("stage"):
        expr = q.expression.xreplace({sympy.Symbol(k): sympy.Rational(v) for k, v in env.items()
                                      if isinstance(v, (int, Fraction))})
        assert expr == sympy.Rational(env[q.ident]), q.name


def test_per_layer_bytes_are_degree_one_in_sequence_length():
    """Symbolically: substitute the DAG into dispatch_send_bytes, it is linear in S."""
    book = formula_book(next(iter(_variants(limit=1))))
    by_ident = {q.ident: q.expression for q in book.quantities}
    expr = by_ident["dispatch_send_bytes"]
    for _ in range(10):
        expr = expr.xreplace({sympy.Symbol(k): v for k, v in by_ident.items()})
    assert sympy.degree(sympy.expand(expr), sympy.Symbol("S")) == 1
    assert sympy.Symbol("EP") not in expr.free_symbols  # n·k·h·p rows leave whatever EP is


def _variants(limit: int | None = None):
    base = dict(ep=True, etp=True, tp_ep=True, dp_cp=True, edp=True, tp_dp_cp=True, pp=True,
                instances=False, mhc=False, per_token_loss=False, expert_bias=True,
                optimizer="adam", master_copy=True, recompute_method=None, cp=True,
                mla_q_lora=True, aux_counts="seq_aux_loss")
    combos = itertools.product(("alltoall", "allgather", "flex"), ("dropless", "drop", "pad"),
                               (False, True), (frozenset({"softmax"}), frozenset({"mla"}),
                                               frozenset({"v4_csa", "v4_hca", "v4_window"})),
                               (None, "full", "selective"))
    for n, (dispatcher, capacity, dist_opt, kinds, recompute) in enumerate(combos):
        if limit is not None and n >= limit:
            return
        modules = frozenset({"moe_act", "layernorm", "mla_up_proj"}) if recompute == "selective" \
            else frozenset()
        yield Variant(dispatcher=dispatcher, capacity=capacity, dist_opt=dist_opt,
                      kinds=kinds, recompute=recompute, recompute_modules=modules,
                      **{**base, "recompute_method": "uniform" if recompute == "full" else None})


@pytest.mark.parametrize("flags", [
    {}, {"ep": False, "etp": False, "tp_ep": False}, {"instances": True}, {"mhc": True},
    {"per_token_loss": True}, {"optimizer": "sgd", "master_copy": False},
    {"recompute": "full", "recompute_method": "block"}, {"pp": False, "dp_cp": False, "edp": False},
])
def test_every_variant_builds_a_consistent_book(flags):
    names = {s.name for s in ALL_SYMBOLS}
    for variant in _variants():
        book = formula_book(Variant(**{**variant.__dict__, **flags}))
        idents = [q.ident for q in book.quantities]
        assert len(idents) == len(set(idents)) and not names & set(idents)
        assert {"peak_memory_bytes", "memory_utilization", "microbatches"} <= set(idents)


# ----------------------------------------------------------------- plan budgets and findings


def test_plan_budgets_follow_the_contract():
    rows = plan_budgets(load_config(EXAMPLES / "tiny-cpu-8.yaml"))
    assert all(set(r) == {"name", "value", "unit", "formula", "scope", "stage"} for r in rows)
    by_name = {(r["name"], r["stage"]): r for r in rows}
    # Tiny: 8 ranks, CP2 → n = 16, k = 2, EP2/ETP2, fp32, 2 MoE layers, m = 8/(1·4) = 2.
    send = by_name[("step.ep_dispatch_hidden.fwd.send_bytes", 0)]
    assert send["value"] == 16 * 2 * 64 * 4 * 2 * 2 and send["scope"] == "stage 0 (rank 0)"
    count = by_name[("step.ep_count_exchange.fwd.send_bytes", 0)]
    assert count["value"] == 8 * 8 * 2 * 2  # int64 length-E counts per pass
    assert by_name[("grad_scale_sum_dense", None)]["value"] == "1/8"
    names = {r["name"] for r in rows}
    for collective in ("ep_dispatch_hidden", "ep_dispatch_probs", "ep_combine_hidden",
                       "etp_gather_hidden", "etp_gather_probs", "etp_scatter_hidden"):
        for phase in ("fwd", "bwd"):
            assert f"step.{collective}.{phase}.send_bytes" in names
            assert f"step.{collective}.{phase}.recv_bytes" in names
    for collective in ("ep_count_exchange", "dense_grad_reduce", "expert_grad_reduce",
                       "expert_bias_count_reduce", "embd_grad_reduce", "cp_kv_gather"):
        assert f"step.{collective}.fwd.send_bytes" in names


def _peak(cfg: Config) -> Fraction:
    return max(Fraction(s["peak_memory_bytes"]) for s in memory_by_stage(cfg))


def test_memory_findings_thresholds():
    base = v4_data()
    base["overlap"] = {"recompute_granularity": "full"}
    base["training"]["use_distributed_optimizer"] = True
    peak_gib = _peak(parse_config(copy.deepcopy(base))) / 2**30
    codes = {}
    for label, gib in (("roomy", peak_gib * 2), ("tight", peak_gib / Fraction(9, 10)),
                       ("over", peak_gib / 2)):
        base["cluster"] = {"gpu_memory_gib": float(gib)}
        codes[label] = [(f.code, f.severity) for f in memory_findings(parse_config(copy.deepcopy(
            base)))]
    assert codes == {"roomy": [], "tight": [("MEM002", "warning")], "over": [("MEM001", "error")]}


def test_memory_findings_name_the_worst_stage_and_its_parts():
    base = v4_data()
    base["cluster"] = {"gpu_memory_gib": 1}
    [finding] = memory_findings(parse_config(base))
    assert finding.code == "MEM001" and finding.path == "cluster.gpu_memory_gib"
    # Stage 1 keeps 7 microbatches in flight of 16 checkpointed pattern-layer inputs (two per V4
    # block, 224 MiB each: 24.5 GiB), more than the last stage's output head and MTP weights add.
    assert "stage 1 needs" in finding.message and "of 1 GiB" in finding.message
    assert "8 of 8 stages above 100 %" in finding.message
    assert "weights" in finding.message and "activations" in finding.message


def test_recompute_and_the_distributed_optimizer_shrink_the_peak():
    base = v4_data()
    base["training"]["use_distributed_optimizer"] = False
    base["overlap"] = {}
    plain = _peak(parse_config(copy.deepcopy(base)))
    base["training"]["use_distributed_optimizer"] = True
    sharded = _peak(parse_config(copy.deepcopy(base)))
    base["overlap"] = {"recompute_granularity": "full"}
    recomputed = _peak(parse_config(copy.deepcopy(base)))
    assert plain > sharded > recomputed


def test_uncomputable_layouts_raise_budget_error_not_crash():
    with pytest.raises(BudgetError):
        budgets(config(MINIMAL_V4, parallel={"world_size": 1000}))
    with pytest.raises(BudgetError):
        budgets(config(MINIMAL_V4, parallel={"pipeline_model_parallel_layout": "Et|tL"}))
    assert memory_findings(config(MINIMAL_V4, parallel={"world_size": 1000})) == []


@settings(max_examples=40, deadline=None)
@given(st.fixed_dictionaries({
    "world_size": st.integers(1, 64), "tp": st.integers(1, 4), "cp": st.integers(1, 4),
    "pp": st.integers(1, 4), "ep": st.integers(1, 8), "etp": st.integers(1, 4),
    "vpp": st.none() | st.integers(1, 3),
}), st.integers(1, 6), st.integers(1, 9), st.sampled_from([None, 0.5, 1.0, 1.3]))
def test_any_layout_budgets_or_refuses_cleanly(par, layers, experts, factor):
    data = copy.deepcopy(LAYOUT_B)
    data["parallel"] = {k: v for k, v in par.items() if v is not None}
    data["model"]["num_layers"], data["model"]["num_experts"] = layers, experts
    data["model"]["moe_router_topk"] = 1
    data["moe"] = {"moe_expert_capacity_factor": factor}
    cfg = parse_config(data)
    try:
        items = budgets(cfg)
    except BudgetError:
        return
    assert all(isinstance(b.value, (int, Fraction)) for b in items)
    assert {f.code for f in memory_findings(cfg)} <= {"MEM001", "MEM002"}


def test_memory_findings_never_import_sympy_or_torch():
    code = ("import sys; from planner.config.loader import load_config; "
            "from planner.accounting import budgets; from planner.rules.memory import memory_findings; "
            f"memory_findings(load_config({str(V4_PRO)!r})); budgets(load_config({str(V4_PRO)!r}));"
            "print('sympy' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    assert out.stdout.split() == ["False", "False"]

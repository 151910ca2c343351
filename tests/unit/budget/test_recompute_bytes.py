"""Recompute re-runs communication: the `step.<collective>.recompute.*` predictions.

Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_block.py
TransformerBlock._checkpointed_forward runs a recomputed layer's forward again in backward, with
every collective inside it (dispatch, combine, count exchange, ETP gathers, CP K/V gather, the
router's aux-loss counts); `uniform` recomputes every layer of a chunk (groups of N_r), `block`
only the first N_r layers of each chunk, and MTP layers only under `uniform`
(megatron/core/transformer/multi_token_prediction.py). Selective `moe` checkpoints the whole MoE
layer (megatron/core/transformer/moe/moe_layer.py MoELayer.forward), `core_attn` the core
attention with its CP exchange. Gradient reductions and pipeline sends are never recomputed.
Every expected number below is derived by hand.
"""

from __future__ import annotations

import copy
from fractions import Fraction
from typing import Any

import pytest

from planner.accounting import COLLECTIVES, RECOMPUTE, Accounting, budgets
from planner.budget.comm import RECOMPUTED_LAYERS
from planner.config.loader import load_config, parse_config
from tests.support.paths import EXAMPLES

V4_PRO = EXAMPLES / "deepseek-v4-pro-1024.yaml"

# 7 layers, layer 0 dense (moe_layer_freq), 1 MTP depth (an MoE block); PP 2 × VPP 2 by layout:
#   chunk 0 (stage 0): E, layers 0, 1     chunk 1 (stage 1): layers 2, 3
#   chunk 2 (stage 0): layer 4            chunk 3 (stage 1): layers 5, 6, MTP 0, loss
# Stage 0: blocks 0, 1, 4 (MoE: 1, 4); stage 1: blocks 2, 3, 5, 6, MTP (all five MoE).
# n = b·S/CP = 64/2 = 32 rows, k = 2, h = 64, bf16 → one dispatch 32·2·64·2 = 8192 bytes;
# DP = 8/(CP·PP) = 2 → m = B/(b·DP) = 8/2 = 4 microbatches.
# CP K/V per block per microbatch: b·S/CP · 2·groups·d · p = 32 · 2·4·16 · 2 = 8192 bytes.
# aux_loss counts: E fp32 = 8·4 = 32 bytes per router pass, all-reduced over tp_cp (CP = 2).
SMALL: dict[str, Any] = {
    "model": {"num_layers": 7, "hidden_size": 64, "num_attention_heads": 4, "kv_channels": 16,
              "ffn_hidden_size": 128, "vocab_size": 256, "num_experts": 8, "moe_router_topk": 2,
              "moe_ffn_hidden_size": 32, "moe_layer_freq": [0, 1, 1, 1, 1, 1, 1],
              "mtp_num_layers": 1},
    "parallel": {"world_size": 8, "pp": 2, "ep": 2, "cp": 2,
                 "pipeline_model_parallel_layout": "Et*2|t*2|t|t*2mL"},
    "training": {"seq_length": 64, "micro_batch_size": 1, "global_batch_size": 8,
                 "precision": "bf16"},
    "moe": {"moe_token_dispatcher_type": "alltoall", "moe_router_load_balancing_type": "aux_loss",
            "moe_aux_loss_coeff": 0.01},
    "cluster": {"gpus_per_node": 4},
}
DISPATCH, KV, AUX, M = 8192, 8192, 32, 4
MOE_LAYERS = {0: 2, 1: 5}
BLOCKS = {0: 3, 1: 5}


def small(overlap: dict[str, Any] | None, **sections: dict[str, Any]) -> dict[int, dict[str, Any]]:
    data = copy.deepcopy(SMALL)
    if overlap is not None:
        data["overlap"] = overlap
    for section, values in sections.items():
        data[section].update(values)
    cfg = parse_config(data)
    items, accounting = budgets(cfg), Accounting(cfg)
    # the stage's inputs (blocks_recomputed, ...) and the budgets of its first rank
    return {stage: {**accounting.stage_env(stage),
                    **{b.name: b.value for b in items if b.stage in (None, stage)}}
            for stage in (0, 1)}


def full(method: str, layers: int) -> dict[str, Any]:
    return {"recompute_granularity": "full", "recompute_method": method,
            "recompute_num_layers": layers}


def recompute_names(values: dict[str, Any]) -> set[str]:
    return {name.split(".")[1] for name in values
            if name.startswith("step.") and name.split(".")[2] == RECOMPUTE}


def test_no_recompute_gives_no_recompute_phase() -> None:
    for values in small(None).values():
        assert recompute_names(values) == set()
        assert not any(name.startswith("recompute_share") for name in values)
        assert values["blocks_recomputed"] == 0


def test_block_method_recomputes_the_first_n_r_blocks_of_each_chunk() -> None:
    stages = small(full("block", 1))
    # N_r = 1: stage 0 re-runs layer 0 (chunk 0, dense) and layer 4 (chunk 2, MoE): 2 of 3
    # blocks, 1 of its 2 MoE layers; stage 1 re-runs layers 2 and 5 (MTP is never recomputed
    # under `block`): 2 of 5 blocks, 2 of 5 MoE layers.
    recomputed_moe = {0: 1, 1: 2}
    recomputed_blocks = {0: 2, 1: 2}
    assert stages[0]["recompute_share_L_moe"] == Fraction(1, 2)
    assert stages[1]["recompute_share_L_moe"] == Fraction(2, 5)
    assert stages[0]["recompute_share_blocks"] == Fraction(2, 3)
    for stage, v in stages.items():
        assert v["L_moe_recomputed"] == recomputed_moe[stage]
        assert v["blocks_recomputed"] == v["recomputed_blocks"] == recomputed_blocks[stage]
        # the forward runs once per MoE layer and microbatch; the re-run only for recomputed ones
        assert v["step.ep_dispatch_hidden.fwd.send_bytes"] == DISPATCH * MOE_LAYERS[stage] * M
        assert v["step.ep_dispatch_hidden.recompute.send_bytes"] == \
            DISPATCH * recomputed_moe[stage] * M  # stage 0: 32768, stage 1: 65536
        assert v["step.ep_combine_hidden.recompute.recv_bytes"] == \
            DISPATCH * recomputed_moe[stage] * M
        # CP K/V all-gather: per block, so the block share applies
        assert v["step.cp_kv_gather.fwd.send_bytes"] == KV * BLOCKS[stage] * M
        assert v["step.cp_kv_gather.recompute.send_bytes"] == KV * recomputed_blocks[stage] * M
        assert v["step.cp_kv_gather.recompute.recv_bytes"] == 2 * KV * recomputed_blocks[stage] * M
        # aux-loss counts need grad: the recomputed layers' no-grad first forward skips them
        assert v["step.aux_loss_count_reduce.fwd.send_bytes"] == \
            AUX * (MOE_LAYERS[stage] - recomputed_moe[stage]) * M
        assert v["step.aux_loss_count_reduce.recompute.send_bytes"] == \
            AUX * recomputed_moe[stage] * M
    # block N_r = 2: every chunk's first two layers; stage 0 chunk 2 has one → all 3 blocks
    stages = small(full("block", 2))
    assert (stages[0]["blocks_recomputed"], stages[0]["L_moe_recomputed"]) == (3, 2)
    assert (stages[1]["blocks_recomputed"], stages[1]["L_moe_recomputed"]) == (4, 4)


def test_block_method_with_zero_layers_recomputes_nothing() -> None:
    """`block` with recompute_num_layers 0 is legal and re-runs no block (Megatron-LM dev@d48bd6be
    megatron/core/transformer/transformer_block.py TransformerBlock._checkpointed_forward: the
    checkpointed range is layer_idx < 0 + skipped); a real DeepSeek-V4 launch sets it."""
    plain = small(None)
    for stage, v in small(full("block", 0)).items():
        assert v["blocks_recomputed"] == v["recomputed_blocks"] == v["L_moe_recomputed"] == 0
        assert all(value == 0 for name, value in v.items()
                   if name.startswith("step.") and name.split(".")[2] == RECOMPUTE)
        assert v["recompute_working_bytes"] == 0
        assert v["step.ep_dispatch_hidden.fwd.send_bytes"] == \
            plain[stage]["step.ep_dispatch_hidden.fwd.send_bytes"]


def test_uniform_method_recomputes_every_block_mtp_included() -> None:
    for n_r in (1, 3):
        for stage, v in small(full("uniform", n_r)).items():
            assert v["recompute_share_L_moe"] == v["recompute_share_blocks"] == 1
            assert v["L_moe_recomputed"] == MOE_LAYERS[stage]
            assert v["step.ep_dispatch_hidden.recompute.send_bytes"] == \
                v["step.ep_dispatch_hidden.fwd.send_bytes"] == DISPATCH * MOE_LAYERS[stage] * M
            assert v["step.cp_kv_gather.recompute.send_bytes"] == KV * BLOCKS[stage] * M
            assert v["step.aux_loss_count_reduce.fwd.send_bytes"] == 0
            assert v["step.aux_loss_count_reduce.recompute.send_bytes"] == \
                AUX * MOE_LAYERS[stage] * M


@pytest.mark.parametrize(("gpus_per_node", "leaving_node"), [(4, 0), (1, 32768)])
def test_recompute_wire_bytes_split_like_the_forward(gpus_per_node: int, leaving_node: int) -> None:
    """EP 2 over ranks 0, 1 (the expert order tp-cp-ep-…: CP is not an expert axis, so EP is the
    fastest): one node with 4 GPUs per node, two nodes with one. Stage 0's re-run all-to-all
    sends 2 MoE layers · 4 microbatches · 8192 = 65536 bytes, half of them to the other rank."""
    v = small(full("uniform", 1), cluster={"gpus_per_node": gpus_per_node})[0]
    for part in ("wire_bytes", "intra_node_bytes", "inter_node_bytes"):
        assert v[f"step.ep_dispatch_hidden.recompute.{part}"] == \
            v[f"step.ep_dispatch_hidden.fwd.{part}"]
    assert v["step.ep_dispatch_hidden.recompute.wire_bytes"] == 32768
    assert v["step.ep_dispatch_hidden.recompute.inter_node_bytes"] == leaving_node
    assert v["step.ep_dispatch_hidden.recompute.intra_node_bytes"] == 32768 - leaving_node


@pytest.mark.parametrize(("module", "expected"), [
    ("moe", {"ep_dispatch_hidden", "ep_combine_hidden", "ep_dispatch_probs", "ep_count_exchange",
             "aux_loss_count_reduce"}),
    ("core_attn", {"cp_kv_gather"}),
    ("moe_act", set()), ("layernorm", set()), ("shared_experts", set()), ("mlp", set()),
])
def test_selective_modules_rerun_only_their_collectives(module: str, expected: set[str]) -> None:
    stages = small({"recompute_granularity": "selective", "recompute_modules": [module]})
    for stage, v in stages.items():
        assert recompute_names(v) == expected
        if module == "moe":  # the whole MoE layer, in every MoE layer
            assert v["step.ep_dispatch_hidden.recompute.send_bytes"] == \
                DISPATCH * MOE_LAYERS[stage] * M
            assert v["step.aux_loss_count_reduce.fwd.send_bytes"] == 0


def test_v4_pro_full_uniform_recompute_adds_a_third_of_the_ep_bytes() -> None:
    """examples/deepseek-v4-pro-1024.yaml, stage 1 (8 MoE layers): n = 8192/2 = 4096 rows,
    k = 6, h = 7168, bf16 → one dispatch 4096·6·7168·2 = 352,321,536 bytes; m = 4096/64 = 64
    microbatches → 8·64 = 512 passes → 180,388,626,432 bytes per exchange per step.
    Before: dispatch + combine, forward + backward = 4 exchanges = 721,554,505,728 bytes sent;
    after: the recompute re-runs both forwards, 6 exchanges = 1,082,331,758,592 bytes: the
    re-run is a third of the step's EP hidden traffic."""
    items = budgets(load_config(V4_PRO))
    v = {b.name: b.value for b in items if b.stage in (None, 1)}
    exchange = 4096 * 6 * 7168 * 2 * 8 * 64
    assert exchange == 180_388_626_432
    hidden = ("ep_dispatch_hidden", "ep_combine_hidden")
    before = sum(v[f"step.{c}.{p}.send_bytes"] for c in hidden for p in ("fwd", "bwd"))
    rerun = sum(v[f"step.{c}.recompute.send_bytes"] for c in hidden)
    assert before == 4 * exchange == 721_554_505_728
    assert rerun == 2 * exchange
    assert Fraction(rerun, before + rerun) == Fraction(1, 3)
    # seq_aux_loss counts b·E fp32 = 384·4 = 1536 bytes per pass, all in the re-run forward
    assert v["step.aux_loss_count_reduce.fwd.send_bytes"] == 0
    assert v["step.aux_loss_count_reduce.recompute.send_bytes"] == 1536 * 512 == 786_432
    # stage 0: 6 MoE layers (3 hash-routed) → 6·64 passes
    v0 = {b.name: b.value for b in items if b.stage in (None, 0)}
    assert v0["step.ep_dispatch_hidden.recompute.send_bytes"] == 352_321_536 * 6 * 64


def test_only_work_inside_a_layer_is_recomputed() -> None:
    never = {"dense_grad_reduce", "dense_param_gather", "dense_grad_instance_reduce",
             "expert_grad_reduce", "expert_param_gather", "expert_grad_instance_reduce",
             "embd_grad_reduce", "expert_bias_count_reduce", "pp_activation"}
    for name, entry in COLLECTIVES.items():
        if name in never:
            assert not entry.recomputed_with and RECOMPUTE not in entry.phases, name
            continue
        if not entry.recomputed_with:
            continue
        assert entry.phases[RECOMPUTE] == entry.phases["fwd"], name
        assert entry.layer_kind in RECOMPUTED_LAYERS, name
        assert {(RECOMPUTE, d) for p, d in entry.fixed_when_dropless if p == "fwd"} <= \
            entry.fixed_when_dropless
    moe = {"ep_dispatch_hidden", "ep_combine_hidden", "ep_dispatch_probs", "ep_count_exchange",
           "etp_gather_hidden", "etp_gather_probs", "etp_scatter_hidden", "ag_gather_hidden",
           "ag_gather_probs", "ag_gather_routing_map", "ag_scatter_hidden", "aux_loss_count_reduce"}
    for name in moe:
        assert COLLECTIVES[name].recomputed_with >= {"full", "moe"}, name
        assert COLLECTIVES[name].layer_kind == "L_moe", name
    assert COLLECTIVES["cp_kv_gather"].recomputed_with == {"full", "core_attn"}
    # both aux-loss count reductions run only under grad (Megatron-LM dev@d48bd6be
    # megatron/core/transformer/moe/router.py TopKRouter.routing: torch.is_grad_enabled())
    assert [n for n, e in COLLECTIVES.items() if e.grad_only] == ["aux_loss_count_reduce",
                                                                  "global_aux_count_reduce"]

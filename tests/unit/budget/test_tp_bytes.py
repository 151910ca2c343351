"""Tensor- and sequence-parallel traffic, the SP grad reduction and the global aux loss's counts
(planner/budget/tp_comm.py), with hand-derived expectations.

The small config: h = 64, S = 32, b = 1, bf16 (p = 2), 8 ranks = TP 2 · DP 4 (CP 1, PP 1), EP 2;
B = 8 so m = B / (b · DP) = 2 microbatches. Two blocks: layer 0 dense MLP (f = 128), layer 1 MoE
(E = 8 experts, a shared expert I_s = 32), untied output layer, no MTP.

Per microbatch, the stage's TP-split linears (Megatron-LM dev@d48bd6be
megatron/core/tensor_parallel/layers.py ColumnParallelLinear / RowParallelLinear):
  column-parallel inputs: QKV 2 × h + FC1 (dense + shared) 2 × h + output layer h = 5 h = 320
  row-parallel outputs:   proj 2 × h + FC2 (dense + shared) 2 × h            = 4 h = 256
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.accounting import budgets, formula_book
from planner.config.loader import load_config, parse_config
from planner.docs.formulas_page import baseline_variant
from planner.plan import compile_plan
from planner.rules import run_rules
from tests.support.paths import EXAMPLES

SMALL_TP: dict[str, Any] = {
    "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "kv_channels": 16,
              "ffn_hidden_size": 128, "vocab_size": 256, "num_experts": 8, "moe_router_topk": 2,
              "moe_ffn_hidden_size": 32, "moe_shared_expert_intermediate_size": 32,
              "moe_layer_freq": [0, 1], "untie_embeddings_and_output_weights": True},
    "parallel": {"world_size": 8, "tp": 2, "sequence_parallel": True, "ep": 2},
    "training": {"seq_length": 32, "micro_batch_size": 1, "global_batch_size": 8,
                 "precision": "bf16"},
    "moe": {"moe_token_dispatcher_type": "alltoall", "moe_router_load_balancing_type": "global_aux_loss",
            "moe_aux_loss_coeff": 1.0e-3},
    "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu_memory_gib": 80},
}
TP_NAMES = ("tp_sp_gather", "tp_sp_wgrad_gather", "tp_sp_scatter", "tp_linear_allreduce",
            "tp_embedding_reduce", "tp_mtp_gather", "tp_xent_reduce", "tp_sp_grad_reduce")


def small(**overlay: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(SMALL_TP)
    for section, fields in overlay.items():
        data.setdefault(section, {}).update(fields)
    return data


def stage_values(data: dict[str, Any], stage: int = 0) -> dict[str, Any]:
    return {b.name: b.value for b in budgets(parse_config(data))
            if b.stage is None or b.stage == stage}


def sent(values: dict[str, Any], name: str, phase: str) -> tuple[int, int]:
    base = f"step.{name}.{phase}"
    return values[f"{base}.send_bytes"], values[f"{base}.recv_bytes"]


def step(values: dict[str, Any], name: str, phase: str) -> tuple[int, int, int]:
    base = f"step.{name}.{phase}"
    return values[f"{base}.send_bytes"], values[f"{base}.recv_bytes"], values[f"{base}.wire_bytes"]


def test_tp2_with_sequence_parallelism_hand_derived() -> None:
    v = stage_values(small())
    # n = b·S / TP = 16 rows per rank; each all-gather sends n · width · p per microbatch, × m = 2.
    assert v["tokens_per_rank"] == 16 and v["microbatches"] == 2
    assert v["tp_column_width"] == 320 and v["tp_row_width"] == 256
    # all-gather: send 16·320·2·2 = 20480, receive TP× = 40960, wire (TP-1)·send = 20480
    assert step(v, "tp_sp_gather", "fwd") == (20480, 40960, 20480)
    # its backward reduce-scatter: the whole 40960 in, own 20480 out, wire 40960·1/2 = 20480
    assert step(v, "tp_sp_gather", "bwd") == (40960, 20480, 20480)
    # the weight-gradient re-gather of the stored shards: same as the forward gather
    assert step(v, "tp_sp_wgrad_gather", "bwd") == (20480, 40960, 20480)
    # reduce-scatter of row outputs: whole 2·16·256·2·2 = 32768, own 16384, wire 16384
    assert step(v, "tp_sp_scatter", "fwd") == (32768, 16384, 16384)
    assert step(v, "tp_sp_scatter", "bwd") == (16384, 32768, 16384)
    # embedding [32, 1, 64] bf16 = 4096 per microbatch, reduce-scattered: 8192 in, 4096 out
    assert step(v, "tp_embedding_reduce", "fwd") == (8192, 4096, 4096)
    assert step(v, "tp_embedding_reduce", "bwd") == (4096, 8192, 4096)
    # cross entropy: 3 all-reduces of [32, 1] fp32 = 384 per microbatch, 768 per step,
    # ring wire 2·ceil(768·1/2) = 768
    assert step(v, "tp_xent_reduce", "fwd") == (768, 768, 768)
    # no sequence-parallel-free all-reduce, no MTP
    assert sent(v, "tp_linear_allreduce", "fwd") == sent(v, "tp_linear_allreduce", "bwd") == (0, 0)
    assert step(v, "tp_mtp_gather", "fwd") == (0, 0, 0)
    # finalize_model_grads: norms 2 blocks · 2h = 256, router E·h = 512, final norm h = 64
    # -> 832 fp32 grads = 3328 bytes, wire 2·ceil(3328/2) = 3328
    assert v["tp_replicated_params_on_rank"] == 832
    assert step(v, "tp_sp_grad_reduce", "fwd") == (3328, 3328, 3328)


def test_tp2_without_sequence_parallelism_hand_derived() -> None:
    """Megatron's MoE layer rejects this in training (rule PAR008), but the budget still prices it:
    n = b·S = 32 rows, every all-reduce sends the whole [32, 1, w] tensor."""
    v = stage_values(small(parallel={"sequence_parallel": False}))
    assert v["tokens_per_rank"] == 32
    # forward: row outputs 32·256·2·2 = 32768; wire 2·ceil(32768/2) = 32768
    assert step(v, "tp_linear_allreduce", "fwd") == (32768, 32768, 32768)
    # backward: column-input grads 32·320·2·2 = 40960
    assert step(v, "tp_linear_allreduce", "bwd") == (40960, 40960, 40960)
    # embedding all-reduced: 32·64·2·2 = 8192; backward nothing
    assert step(v, "tp_embedding_reduce", "fwd") == (8192, 8192, 8192)
    assert sent(v, "tp_embedding_reduce", "bwd") == sent(v, "tp_mtp_gather", "bwd") == (0, 0)
    assert step(v, "tp_xent_reduce", "fwd") == (768, 768, 768)
    for name, phase in (("tp_sp_gather", "fwd"), ("tp_sp_gather", "bwd"), ("tp_sp_scatter", "fwd"),
                        ("tp_sp_wgrad_gather", "bwd"), ("tp_sp_grad_reduce", "fwd")):
        assert v[f"step.{name}.{phase}.send_bytes"] == 0, name


def test_global_aux_loss_counts_and_buffers() -> None:
    v = stage_values(small())
    # int64 [E] = 64 bytes per router pass; 1 MoE layer × 2 microbatches = 128 bytes; over
    # tp_dp_cp = TP·DP = 8 ranks: wire 2·ceil(128·7/8) = 224
    assert step(v, "global_aux_count_reduce", "fwd") == (128, 128, 224)
    # buffers: fp32 counts [E] + fp32 step count per router = (8 + 1)·4 = 36 bytes
    assert v["buffer_bytes"] == 36
    other = stage_values(small(moe={"moe_router_load_balancing_type": "aux_loss"}))
    assert sent(other, "global_aux_count_reduce", "fwd") == (0, 0) and other["buffer_bytes"] == 0


def test_shared_expert_overlap_keeps_its_gathered_input() -> None:
    """moe_shared_expert_overlap gathers the shared expert's input itself and its FC1 stores the
    gathered tensor: no weight-gradient re-gather for it (Megatron-LM dev@d48bd6be
    megatron/core/transformer/moe/shared_experts.py SharedExpertMLP)."""
    v = stage_values(small(overlap={"moe_shared_expert_overlap": True}))
    assert step(v, "tp_sp_gather", "fwd") == (20480, 40960, 20480)
    # 320 - 64 (shared FC1) = 256 wide: 16·256·2·2 = 16384
    assert step(v, "tp_sp_wgrad_gather", "bwd") == (16384, 32768, 16384)


def test_mtp_adds_eh_proj_output_layer_embedding_and_gather() -> None:
    """One MTP depth on the same stage: eh_proj input 2h, a second output layer h, a second
    embedding and cross entropy, and the eh_proj output gathered over the hidden dimension."""
    v = stage_values(small(model={"mtp_num_layers": 1}))
    # blocks 3 (2 + MTP block, an MoE block): QKV 3h + FC1 (dense + 2 shared) 3h + eh_proj 2h
    # + output layer 2h = 10h = 640
    assert v["tp_column_width"] == 640
    # eh_proj output [32, 1, 64/2] bf16 = 2048 per microbatch; all-gather send 4096 per step
    assert step(v, "tp_mtp_gather", "fwd") == (4096, 8192, 4096)
    # SP: the sequence scatter after it all-gathers its grad [16, 1, 64] = 2048 per microbatch
    assert step(v, "tp_mtp_gather", "bwd") == (4096, 8192, 4096)
    assert step(v, "tp_xent_reduce", "fwd")[0] == 2 * 768
    assert step(v, "tp_embedding_reduce", "fwd")[0] == 2 * 8192


def test_every_stage_lists_the_tp_steps_and_splits_intra_and_inter_node() -> None:
    """PP 2: the embedding on stage 0 only, the loss on stage 1 only; with one GPU per node the TP
    ring crosses nodes on every edge, with 8 per node on none."""
    data = small(parallel={"pp": 2})
    for stage in (0, 1):
        v = stage_values(data, stage)
        for name in TP_NAMES:
            assert any(key.startswith(f"step.{name}.") for key in v), (stage, name)
        assert (v["step.tp_embedding_reduce.fwd.send_bytes"] > 0) == (stage == 0)
        assert (v["step.tp_xent_reduce.fwd.send_bytes"] > 0) == (stage == 1)
        wire = v["step.tp_sp_gather.fwd.wire_bytes"]
        assert wire > 0 and v["step.tp_sp_gather.fwd.intra_node_bytes"] == wire
        assert v["step.tp_sp_gather.fwd.inter_node_bytes"] == 0
    spread = stage_values(small(parallel={"pp": 2}, cluster={"nodes": 8, "gpus_per_node": 1}), 0)
    for name, phase in (("tp_sp_gather", "fwd"), ("tp_sp_scatter", "bwd"), ("tp_sp_grad_reduce", "fwd")):
        base = f"step.{name}.{phase}"
        assert spread[f"{base}.inter_node_bytes"] == spread[f"{base}.wire_bytes"] > 0
        assert spread[f"{base}.intra_node_bytes"] == 0


def test_tp_one_prices_nothing() -> None:
    """TP = 1 (the V4-Pro example: V4 attention requires it): every TP collective predicts 0."""
    v = {b.name: b.value for b in budgets(load_config(EXAMPLES / "deepseek-v4-pro-1024.yaml"))}
    for name in TP_NAMES:
        sends = [value for key, value in v.items()
                 if key.startswith(f"step.{name}.") and key.endswith("send_bytes")]
        assert sends and set(sends) == {0}, name


def test_mla_gathers_the_up_projection_inputs_and_the_rotary_key() -> None:
    """MLA: down projections are duplicated (no collective); the q/kv up projections are
    column-parallel, and SP gathers the rotary key part separately (not re-gathered for wgrad)."""
    base = dataclasses.replace(baseline_variant(), kinds=frozenset({"mla"}), mla_q_lora=True, tp=True,
                               sp=True)
    formulas = {q.name: q.formula for q in formula_book(base).quantities}
    assert formulas["tp_attention_in_width"] == "q_lora + kv_lora"
    assert formulas["tp_sp_gather_width"] == "tp_column_width + blocks * qk_rope"
    assert formulas["tp_sp_wgrad_width"] == "tp_column_width"
    assert "mla_duplicated_params_per_block" in formulas["tp_replicated_params_on_rank"]
    no_q = dataclasses.replace(base, mla_q_lora=False)
    assert {q.name: q.formula for q in formula_book(no_q).quantities}["tp_attention_in_width"] == \
        "h + kv_lora"


@settings(max_examples=20, deadline=None)
@given(tp=st.sampled_from((2, 4, 8)), layers=st.integers(1, 3), hidden=st.sampled_from((32, 64, 96)),
       seq=st.sampled_from((32, 64)), shared=st.booleans())
def test_sp_gather_and_scatter_move_what_the_all_reduces_move(
        tp: int, layers: int, hidden: int, seq: int, shared: bool) -> None:
    """Ring algebra: an all-reduce is a reduce-scatter then an all-gather, so per linear the SP
    pair (forward + backward) puts exactly the non-SP all-reduce's wire bytes on the wire; SP's only
    extra is the weight-gradient re-gather, equal to the forward gather."""
    model = {"num_layers": layers, "hidden_size": hidden, "moe_layer_freq": [1] * layers,
             "moe_shared_expert_intermediate_size": 32 if shared else None}
    parallel = {"world_size": 8, "tp": tp, "ep": 8 // tp}
    sp = stage_values(small(model=model, parallel={**parallel, "sequence_parallel": True},
                            training={"seq_length": seq}))
    plain = stage_values(small(model=model, parallel={**parallel, "sequence_parallel": False},
                               training={"seq_length": seq}))
    sp_wire = sum(step(sp, name, phase)[2] for name in ("tp_sp_gather", "tp_sp_scatter")
                  for phase in ("fwd", "bwd"))
    plain_wire = sum(step(plain, "tp_linear_allreduce", phase)[2] for phase in ("fwd", "bwd"))
    assert sp_wire == plain_wire > 0
    assert step(sp, "tp_sp_wgrad_gather", "bwd") == step(sp, "tp_sp_gather", "fwd")


def test_the_runtime_runs_tp_and_refuses_the_global_aux_loss(tmp_path) -> None:
    """The bundled runtime splits attention and the MLP over TP (runtime/tensor_parallel.py) but has
    no global aux loss: a compiled TP 2 plan with it is refused before any process group forms,
    naming that field and not the TP layout."""
    import pytest

    from runtime.plan_io import PlanError, check_plan

    cfg = parse_config(small())
    assert cfg.parallel.tp == 2
    document = compile_plan(cfg, run_rules(cfg))
    with pytest.raises(PlanError) as refused:
        check_plan(document)
    assert "layout.tp" not in str(refused.value)
    assert "moe_router_load_balancing_type = 'global_aux_loss'" in str(refused.value)


def test_fewer_query_groups_than_tp_all_gather_the_qkv_output_by_hand() -> None:
    """Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py
    SelfAttention.get_query_key_value_tensors: with num_query_groups < TP every rank all-gathers
    the QKV projection output over TP along the last dimension (backward: reduce-scatter), to take
    its group's heads out of the whole. Small config at TP 4 (8 ranks: TP 4 · DP 2, m = 8 / 2 = 4
    microbatches), 4 heads of d = 16 in 2 groups: each rank's QKV output per block is
    S · (heads + 2·groups)·d / TP = 32 · 128 / 4 = 1024 elements, 2 blocks, bf16: 4096 bytes a
    microbatch, 16384 a step; as many groups as TP issue none."""
    v = stage_values(small(model={"num_query_groups": 2}, parallel={"tp": 4, "ep": 2}))
    assert v["microbatches"] == 4 and v["tp_qkv_gather_send_bytes"] == 2 * 32 * 128 // 4 * 2
    assert step(v, "tp_qkv_gather", "fwd") == (16384, 4 * 16384, 3 * 16384)
    assert step(v, "tp_qkv_gather", "bwd") == (4 * 16384, 16384, 3 * 16384)
    for data in (small(model={"num_query_groups": 4}, parallel={"tp": 4, "ep": 2}), small()):
        assert sent(stage_values(data), "tp_qkv_gather", "fwd") == (0, 0)


def test_fewer_query_groups_than_tp_keep_a_whole_group_per_rank() -> None:
    """The same gather leaves each rank its one group's key and value, [S, b, 1, d] each, for
    core attention's backward: per token of the rank's share (S / TP rows) that is TP·d, not
    groups·d. Small config at TP 4: with 2 groups the stored key and value take 2·4·16 elements a
    token, with 4 groups 2·4·16 as well (one group a rank either way); at TP 2 with 2 groups,
    2·2·16."""
    two = stage_values(small(model={"num_query_groups": 2}, parallel={"tp": 4, "ep": 2}))
    four = stage_values(small(model={"num_query_groups": 4}, parallel={"tp": 4, "ep": 2}))
    assert two["act_attention_per_block"] == four["act_attention_per_block"]
    tp2 = stage_values(small(model={"num_query_groups": 2}))
    assert (tp2["act_attention_per_block"] / tp2["tokens_per_rank"]
            == (two["act_attention_per_block"] / two["tokens_per_rank"]) - 2 * (4 - 2) * 16 * 2)

"""Muon's Newton-Schulz orthogonalisation and the weight-hash check on the time page
(planner/budget/optimizer_time.py), hand-derived on Megatron-LM's own CI model (its
gpt3_moe_mcore_te_ep8 functional tests: 12 layers, hidden 512, 8 heads, 8 experts of 1,024, EP 8
on 8 ranks, GELU, LayerNorm, a learned position table)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from planner.config.loader import parse_config
from planner.estimate import estimate


def ci(overlap: dict[str, Any] | None = None, **training: Any) -> dict[str, Any]:
    est = estimate(parse_config({
        "model": {"num_layers": 12, "hidden_size": 512, "num_attention_heads": 8, "num_experts": 8,
                  "moe_router_topk": 2, "moe_ffn_hidden_size": 1024, "swiglu": False,
                  "add_bias_linear": False, "vocab_size": 50257, "normalization": "LayerNorm",
                  "position_embedding_type": "learned_absolute", "max_position_embeddings": 1024},
        "training": {"micro_batch_size": 4, "global_batch_size": 32, "seq_length": 1024,
                     "optimizer": "muon", **training},
        "parallel": {"world_size": 8, "ep": 8},
        "moe": {"moe_token_dispatcher_type": "allgather", "moe_grouped_gemm": True},
        "overlap": overlap or {}, "cluster": {"gpu": "H100"}}))
    return est.envs[est.slowest_stage]


# Kernels per Muon matrix at 5 Newton-Schulz steps: 10 + 3 x 5; the split QKV matrix: its 3 own
# (weight decay, momentum, update), 3 parts of 8 + 3 x 5, and the concatenation.
ONE, QKV = 10 + 3 * 5, 3 + 3 * (8 + 3 * 5) + 1


def test_every_rank_orthogonalises_all_its_matrices_without_the_distributed_optimizer() -> None:
    env = ci()
    # per layer: QKV, the output projection, the router, the one local expert's fc1 and fc2
    assert env["time_muon_launches"] == 12 * (QKV + 4 * ONE) == 2076
    assert env["time_muon_s"] == env["time_muon_launches"] * env["time_launch_s"]  # host-bound
    assert env["time_optimizer_s"] > env["time_muon_s"]


def test_the_layer_wise_optimizer_splits_dense_matrices_over_dp_and_experts_over_edp() -> None:
    env = ci(use_distributed_optimizer=True)
    # DP 8 shares the dense matrices; EDP 1 leaves each rank its own expert's two
    assert env["time_muon_launches"] == Fraction(12 * (QKV + 2 * ONE), 8) + 12 * 2 * ONE


def test_newton_schulz_flops_of_a_square_matrix() -> None:
    env = ci()
    m, rate, eff = 512, env["time_bf16_rate"], env["time_muon_q_small_eff"]
    # per step X·Xᵀ and B·X (2·m²·n each, n = m here) and A·A (2·m³): 6·m³ at the shape share
    assert env["time_muon_q_ns_s"] == 5 * 6 * m**3 / (rate * eff**3)
    assert ci(muon_num_ns_steps=10)["time_muon_q_ns_s"] == 2 * env["time_muon_q_ns_s"]


def test_the_weight_hash_copies_and_hashes_every_parameter_each_interval() -> None:
    every = ci(check_weight_hash_across_dp_replicas_interval=1)
    # bf16 over PCIe Gen5 x16 (64 GB/s), fp32 at OpenSSL's SHA-1 rate (1.93 cycles/byte, 3 GHz)
    per_param = Fraction(2, 64 * 10**9) + 4 * Fraction(193, 100) / (3 * 10**9)
    assert every["time_weight_hash_check_s"] == every["params_on_rank"] * per_param
    fourth = ci(check_weight_hash_across_dp_replicas_interval=4)
    assert fourth["time_weight_hash_s"] == every["time_weight_hash_s"] / 4
    assert "time_weight_hash_s" not in ci()
    assert "time_muon_s" not in ci(optimizer="adam")


def test_offloaded_activations_cross_the_host_link_beside_the_compute() -> None:
    env = ci({"fine_grained_activation_offloading": True, "offload_modules": ["expert_fc1", "moe_act"]},
             optimizer="adam")
    # PCIe Gen5 x16 on an H100: 64 GB/s each way; every microbatch's offload groups
    copy = env["microbatches"] * env["offload_host_per_microbatch"] / Fraction(64 * 10**9)
    assert env["time_offload_copy_s"] == copy > 0
    compute = env["time_compute_s"]
    assert env["time_offload_exposed_s"] == max(copy - compute / 3, 0) + max(copy - 2 * compute / 3, 0)


def test_counting_zeros_visits_every_tensor_of_the_optimizer_shard() -> None:
    env = ci(optimizer="adam", use_distributed_optimizer=True, log_num_zeros_in_grad=True)
    # per block: QKV (with its LayerNorm weight and bias), output projection, pre-MLP LayerNorm
    # weight and bias, router: 7; word and position embeddings, final LayerNorm: 4 (tied output)
    assert env["time_dense_param_tensors"] == 12 * 7 + 4 == 88
    assert env["time_expert_param_tensors"] == 12 * 2  # one local expert's fc1 and fc2 per layer
    # DP 8 shards the dense buffer (one tensor straddles the boundary); EDP 1 keeps every expert's
    assert env["time_count_zeros_tensors"] == Fraction(88, 8) + 1 + 24
    assert env["time_count_zeros_s"] == 4 * 36 * env["time_launch_s"]
    assert "time_count_zeros_s" not in ci(optimizer="adam")


def test_blockwise_muon_orthogonalises_the_tp_shard_and_gathers_nothing() -> None:
    """Megatron's --muon-tp-mode blockwise (the default) runs newton_schulz on the shard
    (partition_dim None); duplicated gathers the fp32 momentum whole first."""
    def tp2(mode: str) -> dict[str, Any]:
        est = estimate(parse_config({
            "model": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
                      "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 1024,
                      "vocab_size": 50304},
            "training": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 1024,
                         "optimizer": "muon", "muon_tp_mode": mode},
            "parallel": {"world_size": 8, "tp": 2, "ep": 4, "sequence_parallel": True},
            "cluster": {"gpu": "H100"}}))
        return est.envs[est.slowest_stage]
    shard, whole = tp2("blockwise"), tp2("duplicated")
    assert (shard["time_muon_q_small"], whole["time_muon_q_small"]) == (512, 1024)  # 8 x 128 / TP
    assert "step_muon_dense_tp_gather_fwd_intra_node_bytes" not in shard
    assert whole["step_muon_dense_tp_gather_fwd_intra_node_bytes"] > 0


def test_every_catalog_card_has_its_host_link_and_sha1_rate() -> None:
    """PCIe Gen5 x16 (64 GB/s one way) on Hopper, Blackwell and CDNA boards, Gen4 (32) on Ampere
    and Ada, NVLink-C2C (450) to a Grace host; SHA-1 at OpenSSL's cycles per byte and 3 GHz."""
    from planner.config.gpus import GPUS, HOSTS
    for card in GPUS.values():
        link = 450 if card.host == "grace" else 32 if card.family in ("ampere", "ada") else 64
        assert card.host_link_gb_s == link, card.name
        assert card.host in HOSTS, card.name
    assert {h.name: (h.sha1_cycles_per_byte, h.clock_ghz) for h in HOSTS.values()} == {
        "x86": (1.93, 3.0), "grace": (2.35, 3.0)}


def test_the_bf16_optimizer_copies_each_main_parameter_back_with_its_own_kernel() -> None:
    env = ci(optimizer="adam", use_distributed_optimizer=True)
    # the distributed optimizer's shard: 88 dense tensors over DP 8 (one straddling), 24 expert ones
    assert env["time_optimizer_param_tensors"] == Fraction(88, 8) + 1 + 24 == 36
    shard = env["dense_shard_params"] + env["expert_shard_params"]
    gpu = shard * (4 + 2) / env["time_hbm_rate"]  # the fp32 read and the bf16 write
    assert math.isclose(env["time_param_copy_s"], max(36 * env["time_launch_s"] - gpu, 0),
                        rel_tol=1e-12)
    assert env["time_param_copy_s"] > 0  # small tensors: the host's launches set the pace
    # fp16 without the distributed optimizer copies through multi_tensor_applier; the
    # precision-aware optimizer's fused Adam writes the model weights itself
    assert "time_param_copy_s" not in ci(optimizer="adam", precision="fp16")
    assert "time_param_copy_s" not in ci(optimizer="adam", use_distributed_optimizer=True,
                                         use_precision_aware_optimizer=True)


def test_the_parameter_norm_counts_its_kernels_and_collectives() -> None:
    sharded = ci(optimizer="adam", use_distributed_optimizer=True, log_params_norm=True)
    # the shard's 36 tensors fit one multi-tensor launch (<= 110 tensors, <= 320 x 65,536 elements)
    assert sharded["dense_shard_params"] + sharded["expert_shard_params"] <= 320 * 65536
    # 8 around the call, the call's zeros, launch and cleanup, the two model-parallel all-reduces
    # and the add (EP 8: the expert group is not the dense one)
    assert sharded["time_params_norm_launches"] == 8 + 3 + 3 == 14
    assert sharded["time_params_norm_s"] == 14 * sharded["time_launch_s"]
    whole = ci(optimizer="adam", log_params_norm=True)
    # unsharded: the dense call over more than 320 x 65,536 elements takes two launches
    assert 320 * 65536 < whole["dense_shard_params"] <= 2 * 320 * 65536
    assert whole["time_params_norm_launches"] == 7 + (2 + 2) + (2 + 1) + 3 == 17
    assert "time_params_norm_s" not in ci(optimizer="adam")

"""What trains, by hand: LoRA adapters over a frozen base (Megatron-Bridge src/megatron/bridge/peft/
utils.py ParallelLinearAdapter: r·(in + out)/TP a rank per targeted linear, one shared adapter per
grouped-expert linear), frozen parameter groups (no grads, no optimizer states: Megatron-LM
dev@d48bd6be megatron/core/distributed/distributed_data_parallel.py buffers only parameters that
require grad), and an RL engine colocated as slime launches Qwen3-30B-A3B
(THUDM/slime scripts/run-qwen3-30B-A3B.sh @128cb0e7: --colocate, --sglang-mem-fraction-static 0.7,
TP4 SP, EP8, full recompute, --max-tokens-per-gpu 20480, precision-aware optimizer offloaded to the
CPU; 8 GPUs, H100 assumed)."""

from __future__ import annotations

from typing import Any

from planner.accounting import budgets
from planner.config.loader import parse_config
from planner.rules.example_base import example_config_data, merge

MIB = 2**20


def _values(data: dict[str, Any]) -> dict[str, Any]:
    return {b.name: b.value for b in budgets(parse_config(data), stage=0)}


def test_lora_fine_tune_by_hand() -> None:
    """The example base (h 64, 8 heads, 4 query groups of d 8, SwiGLU, shared expert 64, experts of
    64, grouped GEMM, TP 1, stage 0 holds 2 MoE blocks) with LoRA r 8 on the four default targets:
      linear_qkv  8·(64 + (8 + 2·4)·8) = 1,536    linear_proj 8·(8·8 + 64) = 1,024   a block
      shared fc1  8·(64 + 2·64)        = 1,536    shared fc2  8·(64 + 64)  = 1,024   a MoE layer
      routed fc1  8·(64 + 2·64)        = 1,536    routed fc2  8·(64 + 64)  = 1,024   one shared adapter
    dense adapters 2·2,560 + 2·2,560 = 10,240, expert adapters 2·2,560 = 5,120. The base's 132,352
    parameters stay as bf16 tensors; only the adapters have fp32 main grads and Adam's 12 bytes."""
    full = _values(example_config_data(""))
    got = _values(merge(example_config_data(""), {"training": {"lora": {"dim": 8}}}))
    assert (got["lora_dense_params"], got["lora_expert_params"]) == (10_240, 5_120)
    assert got["frozen_params_on_rank"] == full["params_on_rank"] == 132_352
    assert got["weight_bytes"] == (132_352 + 15_360) * 2
    assert got["grad_bytes"] == 15_360 * 4
    assert got["optimizer_bytes"] == 15_360 * 12
    assert got["activation_bytes"] == full["activation_bytes"]  # an upper bound: see the module doc
    only_attention = _values(merge(example_config_data(""), {"training": {"lora": {
        "dim": 8, "target_modules": ["linear_qkv", "linear_proj"]}}}))
    assert (only_attention["lora_dense_params"], only_attention["lora_expert_params"]) == (5_120, 0)


def test_frozen_dense_by_hand() -> None:
    """Everything but the routed experts frozen (embedding, attention, shared experts, routers,
    norms): the 83,200 dense parameters keep their bf16 weights and lose their grads and optimizer
    states; the 49,152 expert parameters train as before."""
    full = _values(example_config_data(""))
    got = _values(merge(example_config_data(""), {"training": {"freeze": ["dense"]}}))
    assert full["dense_params_on_rank"] == 83_200 and full["expert_params_on_rank"] == 49_152
    assert got["weight_bytes"] == full["weight_bytes"] == (83_200 + 49_152) * 2
    assert got["grad_bytes"] == 49_152 * 4
    assert got["optimizer_bytes"] == 49_152 * 12
    assert got["peak_memory_bytes"] == full["peak_memory_bytes"] - 83_200 * (4 + 12)


# Qwen3-VL-30B-A3B's vision tower (tests/support/hf_config_files/qwen3-vl-30b-a3b.json vision_config:
# depth 27, hidden 1152, MLP 4304, patches 2·16·16 of 3 channels, 2304 positions, 2·2 merge to
# 2048, deepstack mergers at blocks 8, 16, 24), as transformers' Qwen3VLMoeVisionModel counts it:
#   patch_embed  3·2·16·16·1152 + 1152                                  =   1,770,624
#   pos_embed    2304·1152                                               =   2,654,208
#   a block      2·2304 (norms) + 1152·3456 + 3456 (qkv) + 1152² + 1152 (proj)
#                + 1152·4304 + 4304 + 4304·1152 + 1152 (MLP)             =  15,239,504 (x27: 411,466,608)
#   merger       2304 (norm of 1152) + 4608² + 4608 + 4608·2048 + 2048   =  30,679,808
#   deepstack    3 x (9216 (norm of 4608) + 4608² + 4608 + 4608·2048 + 2048) = 92,060,160
TOWER = 1_770_624 + 2_654_208 + 27 * 15_239_504 + 30_679_808 + 92_060_160
MERGERS = 30_679_808 + 92_060_160


def test_frozen_vision_tower_by_hand() -> None:
    """The Qwen3-VL-30B-A3B example (TP 1, PP 1) with Megatron-Bridge's freeze_vision_model and
    freeze_vision_projection: the whole 538,631,408-parameter tower kept as bf16 weights (2 B a
    parameter, 1,077,262,816 B), no grads, no optimizer states. With freeze_vision_model alone the
    mergers (122,739,968) train: fp32 main grads (4 B) and, with the distributed optimizer over
    dp_cp 16, Adam's 12 B of their shard."""
    from planner.config.loader import load_config
    from tests.support.paths import EXAMPLES

    assert TOWER == 538_631_408
    data = load_config(EXAMPLES / "architectures" / "qwen3-vl-30b-a3b-16.yaml").model_dump(
        mode="json", exclude_none=True)
    text = _values(data)
    frozen = _values(merge(data, {"training": {"frozen_tower_params": TOWER}}))
    assert frozen["weight_bytes"] - text["weight_bytes"] == TOWER * 2 == 1_077_262_816
    assert (frozen["grad_bytes"], frozen["optimizer_bytes"]) == (text["grad_bytes"],
                                                                 text["optimizer_bytes"])
    assert frozen["peak_memory_bytes"] - text["peak_memory_bytes"] == TOWER * 2
    mergers = _values(merge(data, {"training": {"frozen_tower_params": TOWER - MERGERS,
                                                "trained_tower_params": MERGERS}}))
    assert mergers["dense_grad_params"] - text["dense_grad_params"] == MERGERS
    assert mergers["grad_bytes"] - text["grad_bytes"] == MERGERS * 4
    grown = mergers["dense_buffer_params"] - text["dense_buffer_params"]  # padded to lcm(16, 128)
    assert MERGERS <= grown < MERGERS + 128
    assert mergers["optimizer_bytes"] - text["optimizer_bytes"] == grown // 16 * 12


def test_the_tower_sits_on_the_first_stage_split_over_tp() -> None:
    """The example base at TP 2, PP 2: stage 0 holds half of a 1,000,000-parameter frozen tower
    (2 B each), stage 1 none."""
    base = merge(example_config_data(""), {"parallel": {"tp": 2, "world_size": 16}})
    tower = merge(base, {"training": {"frozen_tower_params": 1_000_000}})
    for stage, share in ((0, 500_000), (1, 0)):
        plain = {b.name: b.value for b in budgets(parse_config(base), stage=stage)}
        got = {b.name: b.value for b in budgets(parse_config(tower), stage=stage)}
        assert got["weight_bytes"] - plain["weight_bytes"] == share * 2
        assert got["grad_bytes"] == plain["grad_bytes"]


SLIME_QWEN3_30B: dict[str, Any] = {
    "model": {"preset": "qwen3-30b-a3b", "hidden_dropout": 0.0, "attention_dropout": 0.0},
    "parallel": {"world_size": 8, "tp": 4, "sequence_parallel": True, "pp": 1, "ep": 8, "etp": 1},
    "training": {"seq_length": 20480, "micro_batch_size": 1, "global_batch_size": 32,
                 "use_distributed_optimizer": True, "use_precision_aware_optimizer": True,
                 "optimizer_cpu_offload": True, "attention_backend": "flash",
                 "rl_colocation": {"engine_memory_fraction": 0.7}},
    "overlap": {"recompute_granularity": "full", "recompute_method": "uniform",
                "recompute_num_layers": 1},
    "moe": {"moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True},
    "cluster": {"gpu": "H100"},
}


def test_slime_colocated_qwen3_30b_a3b_by_hand() -> None:
    """slime's --colocate offloads both sides in the other's phase. Rollout: SGLang's static pool,
    0.7 of the 80 GiB card (56 GiB), plus what training keeps: its CUDA context (0.5 GiB) and NCCL
    buffers: rings TP 4 and DP×CP 2 (EDP 1: no expert ring), 2 · 16 channels · 9,633,792 B, and
    the all-to-all's 7 EP peers · 2 channels · 4 MiB. Training: its own device total plus SGLang's
    context. The device total is the larger phase."""
    got = _values(SLIME_QWEN3_30B)
    nccl = 2 * 16 * 9_633_792 + 7 * 2 * 4 * MIB
    assert got["nccl_buffer_bytes"] == nccl
    assert got["rl_engine_bytes"] == 56 * 2**30 + 0  # 0.7 · 80 GiB, exact in binary
    assert got["rl_rollout_phase_bytes"] == 56 * 2**30 + 512 * MIB + nccl
    own = (got["hot_rank_memory_peak_bytes"] + got["reserved_slack_bytes"] + 512 * MIB + nccl)
    assert got["rl_training_phase_bytes"] == own + 512 * MIB
    assert got["device_memory_bytes"] == max(got["rl_rollout_phase_bytes"], got["rl_training_phase_bytes"])
    # without --offload-train, training's weights, grads and optimizer states stay through rollout
    kept = _values(merge(SLIME_QWEN3_30B, {"training": {"rl_colocation": {"offload_train": False}}}))
    assert kept["rl_rollout_phase_bytes"] == 56 * 2**30 + kept["weight_bytes"] + kept["grad_bytes"] \
        + kept["optimizer_bytes"] + kept["buffer_bytes"] + 512 * MIB + nccl

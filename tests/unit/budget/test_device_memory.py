"""The allocator's peak beyond the stored tensors and the device total (planner/budget/
device_memory.py), by hand, on Megatron-LM's CI case gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4
(model_config.yaml @d98e8a64: 12 layers, hidden 512, 8 heads, 8 experts top-2, TP2 SP, EP4, MBS 4,
seq 1024, GPT-2 vocabulary 50257, --attention-backend unfused; 8 H100)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from planner.accounting import budgets
from planner.config.loader import parse_config
from planner.rules.example_base import merge
from planner.rules.memory import memory_findings
from planner.search.judge import Judge

MIB = 2**20
CI_EP4: dict[str, Any] = {
    "model": {"num_layers": 12, "hidden_size": 512, "num_attention_heads": 8, "add_bias_linear": False,
              "num_experts": 8, "moe_router_topk": 2, "vocab_size": 50257,
              "position_embedding_type": "learned_absolute", "max_position_embeddings": 1024,
              "normalization": "LayerNorm", "swiglu": False},
    "training": {"micro_batch_size": 4, "global_batch_size": 32, "seq_length": 1024,
                 "attention_backend": "unfused"},
    "parallel": {"world_size": 8, "tp": 2, "pp": 1, "ep": 4, "etp": 1, "sequence_parallel": True},
    "moe": {"moe_token_dispatcher_type": "allgather", "moe_grouped_gemm": True},
    "cluster": {"gpu": "H100"},
}


def _env(overlay: dict[str, Any] | None = None) -> dict[str, Any]:
    return {b.name: b.value for b in budgets(parse_config(merge(CI_EP4, overlay or {})), stage=0)}


def test_loss_logits_and_unfused_scores_by_hand() -> None:
    """V_pad = 50,432 (50,257 up to a multiple of 128 · TP); each TP rank holds 25,216 columns of
    the 4 · 1024 = 4096 tokens' logits. The unfused cross entropy keeps the fp32 softmax (4 B) and
    beside it the bf16 logits (2 B) exist while it runs; unfused attention keeps per block
    b · heads/TP · s · s = 4 · 4 · 1024² scores: softmax out (2 B), dropout mask (1 B) and the
    dropped probabilities (2 B) under the default attention_dropout 0.1."""
    env = _env()
    assert env["loss_logit_bytes_per_element"] == 4
    assert env["loss_transient_bytes"] == 4096 * 25_216 * 2
    assert env["act_output"] == 2048 * (512 * 2 + 2 * 25_216 * 4)  # 2048 tokens a rank under SP
    assert env["attn_score_elements"] == 4 * 4 * 1024 * 1024
    assert env["act_attn_scores_per_block"] == 4 * 4 * 1024 * 1024 * 5
    # the largest transient: the loss's 206,569,472 B beat the raw scores' 33,554,432 B
    assert env["transient_extra_bytes"] == 4096 * 25_216 * 2 - env["comm_buffer_bytes"]
    # PyTorch's cuBLAS workspace, Transformer Engine's and its 4 grouped-GEMM streams, 32 MiB each
    assert env["workspace_bytes"] == 6 * 32 * MIB


def test_te_cross_entropy_and_flash_attention_keep_less() -> None:
    """Transformer Engine's cross entropy keeps only the bf16 logits (the gradient is written into
    them) and no fp32 copy; flash attention keeps no scores; the local implementation has no TE
    workspaces."""
    env = _env({"training": {"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te",
                             "attention_backend": "flash"}})
    assert env["act_output"] == 2048 * (512 * 2 + 2 * 25_216 * 2)
    assert env["loss_transient_bytes"] == 0 and "attn_score_elements" not in env
    local = _env({"training": {"transformer_impl": "local", "attention_backend": "auto"}})
    assert local["workspace_bytes"] == 32 * MIB and "act_attn_scores_per_block" in local


def test_an_ampere_card_has_the_smaller_gemm_workspaces() -> None:
    """The same case on an A100: PyTorch's cuBLAS workspace is ":4096:2:16:8" = 8,519,680 B,
    Transformer Engine's 4 MiB on its own stream and each of the 4 grouped-GEMM streams:
    8,519,680 + 5 · 4,194,304 = 29,491,200 B (6 · 32 MiB = 201,326,592 on an H100); with the local
    implementation, PyTorch's alone."""
    a100 = {"cluster": {"gpu": "A100-80GB"}}
    assert _env(a100)["workspace_bytes"] == 29_491_200
    assert _env(merge(a100, {"training": {"transformer_impl": "local", "attention_backend": "auto"}})
                )["workspace_bytes"] == 8_519_680


def test_device_total_of_the_busiest_rank_by_hand() -> None:
    """Rings: TP 2, dp_cp 4 and expt_dp 2 (EP 4 · ETP 1 on 8 ranks): 3 communicators · 16
    channels · (4 MiB + 4,915,200 B + 524,288 B); the AllGather dispatcher and PP 1 send no
    point-to-point. Reserved slack 4 % of the busiest EP rank's peak, CUDA context 0.5 GiB."""
    env = _env()
    nccl = 3 * 16 * (4 * MIB + 4_915_200 + 524_288)
    assert env["nccl_buffer_bytes"] == nccl
    hot = env["hot_rank_memory_peak_bytes"]
    assert hot > env["peak_memory_bytes"]  # the routing quantile's extra rows
    slack = -(-hot * Fraction(1, 25) // 1)
    assert env["device_memory_bytes"] == hot + slack + 512 * MIB + nccl
    alltoall = _env({"moe": {"moe_token_dispatcher_type": "alltoall"}})
    assert alltoall["nccl_buffer_bytes"] == nccl + 3 * 2 * 4 * MIB  # 3 EP peers, 2 channels each


def test_a_layout_at_99_percent_is_refused_by_default_and_accepted_with_a_lower_margin() -> None:
    """The device total at 99 % of the card: MEM002 warns (the default margin keeps 8 % free) and
    search's judge refuses it as HEADROOM; with cluster.memory_margin 0.005 both accept it. MEM001
    stays silent: it fits the card."""
    device = Fraction(_env()["device_memory_bytes"])
    gib = float(device / Fraction(99, 100) / 2**30)
    tight = merge(CI_EP4, {"cluster": {"gpu_memory_gib": gib}})
    cfg = parse_config(tight)
    assert [f.code for f in memory_findings(cfg)] == ["MEM002"]
    refused = Judge(cfg).judge(None)
    assert refused.codes == ("HEADROOM",) and "92% memory headroom" in refused.reason
    lowered = parse_config(merge(tight, {"cluster": {"memory_margin": 0.005}}))
    assert memory_findings(lowered) == []
    accepted = Judge(lowered).judge(None)
    assert not hasattr(accepted, "codes") and 0.009 < accepted.headroom < 0.011


def test_a_logs_memory_lines_beside_both_peaks() -> None:
    """microsoft/ltp-megatron-lm's 6.55B MoE log (tests/support/megatron_logs, with its source):
    rank 0's max allocated 145,529.32 MiB and max reserved 147,018 MiB sit beside the allocated
    peak of its stage, that peak times the reserved ratio, and the device total."""
    from planner.calibrate.megatron_log import parse_log
    from planner.calibrate.memory_lines import memory_report
    from planner.config.importers.megatron_log import config_from_log
    from tests.support.paths import ROOT

    log = ROOT / "tests" / "support" / "megatron_logs" / "ltp_moe_6b_mi300x.log"
    text = log.read_text(encoding="utf-8")
    fixes = {"moe": {"moe_router_load_balancing_type": "global_aux_loss"}, "cluster": {"gpu": "MI300X"}}
    data = merge(config_from_log(text, "ltp")[0], fixes)
    [row] = memory_report(parse_config(data), parse_log(text, "ltp"))
    assert row["rank"] == 0
    assert row["max_allocated_bytes"] == 145529.322265625 * 2**20
    assert row["max_reserved_bytes"] == 147018 * 2**20
    assert row["predicted_reserved_bytes"] == row["predicted_peak_bytes"] * 1.04
    assert row["predicted_device_bytes"] > row["predicted_reserved_bytes"]
    assert row["allocated_ratio"] == row["predicted_peak_bytes"] / row["max_allocated_bytes"]


def test_deepep_buffers_by_hand() -> None:
    """DeepEP's hints (csrc/config.hpp) with Megatron's 20 SMs = 10 channels, for the CI case's
    EP group (ETP 1 · EP 4 ranks) of hidden 512 (1024 B rows) on one 8-GPU node: dispatch and
    combine receive chunks of 256 tokens; per channel and NVLink peer (4) a header of (2·1 + 3)
    ints and 256 tokens of 1024 + 8 (source meta) + 128·8 (top-k indices) + 128·4 (weights) +
    128·4 (scales) = 3080 B: 800 + 31,539,200 = 31,540,000, 128-aligned 31,540,096. One node: no
    RDMA buffer."""
    env = _env({"moe": {"moe_token_dispatcher_type": "flex"}})
    assert 10 * 4 * 5 * 4 + 10 * 4 * 256 * 3080 == 31_540_000
    assert env["deepep_buffer_bytes"] == 31_540_096
    device = env["hot_rank_memory_peak_bytes"] + env["reserved_slack_bytes"] + \
        env["cuda_context_bytes"] + env["nccl_buffer_bytes"] + 31_540_096
    assert env["device_memory_bytes"] == device
    assert "deepep_buffer_bytes" not in _env({"moe": {"moe_token_dispatcher_type": "alltoall"}})


def test_deepep_buffers_across_nodes() -> None:
    """EP 64 of hidden 7168 (14,336 B rows) on nodes of 8: 8 NVLink peers and 8 RDMA ranks.
    NVLink: 288-token chunks, 10·8·(2·8 + 3)·4 + 10·8·288·(14,336 + 8 + 1024 + 512 + 512)
    = 6,080 + 377,671,680 → 377,677,824 aligned. RDMA: receive chunks 128 aligned to the send
    chunks (28 dispatch, 20 combine) = 140 either way; 10·8·(8·2 + 2)·2·4 + 10·8·140·2·(16,392 +
    16) + 1 MiB = 11,520 + 367,539,200 + 1,048,576 = 368,599,296 (already aligned)."""
    from planner.config.deepep_buffers import deepep_buffers

    assert deepep_buffers(64, 7168, 8) == (377_677_824, 368_599_296)
    assert deepep_buffers(8, 7168, 8) == (335_709_824, 0)  # 10·8·5·4 + 20,480·16,392, aligned
    assert deepep_buffers(12, 7168, 8) is None  # no DeepEP configuration: MEM004

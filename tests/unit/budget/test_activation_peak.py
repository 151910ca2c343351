"""The activation budget replays the pipeline schedule per stage (planner/layout/schedule.py): plain 1F1B
keeps the in-flight × per-microbatch numbers, unequal interleaved chunks get their real peak."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from planner.accounting import Accounting, budgets
from planner.config.loader import load_config, parse_config
from tests.support.paths import EXAMPLES


def deepseek_v3_like(layout: str, **overlap: Any) -> dict[str, Any]:
    """DeepSeek-V3's dimensions (MLA, 256 experts top-8, 3 dense layers, one MTP layer) on
    PP16 × VPP2 with EP64 over 1,024 GPUs."""
    return {
        "model": {"num_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
                  "kv_channels": 128, "qk_pos_emb_head_dim": 64, "q_lora_rank": 1536,
                  "kv_lora_rank": 512, "attention_variant": "mla", "ffn_hidden_size": 18432,
                  "vocab_size": 129280, "num_experts": 256, "moe_router_topk": 8,
                  "moe_ffn_hidden_size": 2048, "moe_shared_expert_intermediate_size": 2048,
                  "moe_layer_freq": [0] * 3 + [1] * 58, "mtp_num_layers": 1,
                  "untie_embeddings_and_output_weights": True,
                  "qk_layernorm": True, "hidden_dropout": 0.0, "attention_dropout": 0.0},
        "parallel": {"world_size": 1024, "pp": 16, "ep": 64,
                     "pipeline_model_parallel_layout": layout},
        "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 8192,
                     "precision": "bf16", "use_distributed_optimizer": True},
        "overlap": overlap,
        "cluster": {"nodes": 128, "gpus_per_node": 8, "gpu_memory_gib": 80},
    }


def old_estimate(acc: Accounting, env: dict[str, Any]) -> Fraction:
    """What moeplan computed before: (warm-up + 1)/VPP microbatches × the stage's activations."""
    pp, vpp, s, m = acc.cfg.parallel.pp, acc.split.vpp, env["s"], env["microbatches"]
    flight = Fraction(min(m * vpp, 2 * (pp - s - 1) + (vpp - 1) * pp + 1), vpp)
    return env["act_per_microbatch"] * flight + env["recompute_working_bytes"]


def test_loss_only_last_chunk_was_21_percent_low():
    # The last stage holds chunk 15 (layers 30-31) and chunk 31 (the loss alone: final norm and
    # fp32 logits). Its warm-up runs microbatches 0-15 through chunk 15, then 16 forward/backward
    # pairs of the loss chunk, then F(chunk 15, microbatch 16) before the first chunk-15 backward:
    # 17 chunk-15 microbatches are live, none of the loss chunk.
    acc = Accounting(parse_config(deepseek_v3_like("Et*2|(tt|)*29tm|L")))
    env = acc.stage_env(15)
    envs, peak = acc.schedule(15)
    layers, loss = (e["act_per_microbatch"] for e in envs)
    assert layers > loss > 0
    assert (peak.live, peak.forward_pass) == ((17, 0), 33)
    assert env["activation_bytes"] == 17 * layers
    # The stage's two chunks averaged over 17/2 microbatches miss 21 % of it.
    old = old_estimate(acc, env)
    assert old == (layers + loss) * Fraction(17, 2)
    assert round(float(1 - old / env["activation_bytes"]) * 100) == 21


def test_equal_chunks_keep_the_old_numbers():
    # Middle stages of the same model hold two chunks of two MoE layers each: equal chunks,
    # so the replay equals (warm-up + 1) passes × one chunk, the old formula.
    acc = Accounting(parse_config(deepseek_v3_like("Et*2|(tt|)*29tm|L")))
    for stage in (2, 7, 13):
        env = acc.stage_env(stage)
        assert env["activation_bytes"] == old_estimate(acc, env)
        assert env["in_flight_microbatches"] == Fraction(2 * (16 - stage - 1) + 16 + 1, 2)


@pytest.mark.parametrize("example", ["deepseek-v4-pro-1024.yaml", "deepseek-v4-flash-128.yaml",
                                     "tiny-cpu-8.yaml"])
def test_plain_1f1b_examples_are_unchanged(example):
    cfg = load_config(EXAMPLES / example)
    acc = Accounting(cfg)
    for stage in range(cfg.parallel.pp):
        env = acc.stage_env(stage)
        m = env["microbatches"]
        assert env["live_passes"] == min(m, cfg.parallel.pp - stage)
        assert env["act_live_peak"] == env["act_per_microbatch"] * env["live_passes"]


def test_the_peak_is_explained_chunk_by_chunk():
    items = budgets(parse_config(deepseek_v3_like("Et*2|(tt|)*29tm|L")), stage=15)
    rows = {b.name: b for b in items}  # global rows and those of stage 15
    assert rows["act_live_peak"].formula == "17 * act_chunk_0 + 0 * act_chunk_1"
    assert rows["act_live_peak"].substitution == \
        f"17 · {rows['act_chunk.0'].value} + 0 · {rows['act_chunk.1'].value}"
    assert "after forward pass 33 of 256" in rows["act_live_peak"].doc
    assert "loss" in rows["act_chunk.1"].doc and "layers 30-31" in rows["act_chunk.0"].doc
    assert rows["act_chunk.1"].formula == rows["act_per_microbatch"].formula
    assert rows["activation_bytes"].value == rows["act_live_peak"].value \
        + rows["recompute_working_bytes"].value

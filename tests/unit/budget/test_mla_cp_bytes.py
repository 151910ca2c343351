"""MLA under context parallelism exchanges per-head K and V: priced like standard attention's
K/V gather (CP > 1 used to look free for MLA models), derived by hand."""

from __future__ import annotations

from planner.accounting import budgets
from planner.config.loader import parse_config

MLA = {
    "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 256,
              "num_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 32,
              "ffn_hidden_size": 128, "multi_latent_attention": True, "q_lora_rank": 32,
              "kv_lora_rank": 16, "qk_head_dim": 8, "qk_pos_emb_head_dim": 4, "v_head_dim": 6},
    "parallel": {"world_size": 4, "cp": 2, "ep": 2},
    "training": {"seq_length": 64, "micro_batch_size": 1, "global_batch_size": 4},
}


def values(data: dict) -> dict:
    return {b.name: b.value for b in budgets(parse_config(data)) if b.stage in (None, 0)}


def test_mla_cp_moves_per_head_k_and_v() -> None:
    v = values(MLA)
    # n = b·S/CP = 64/2 = 32 rows; K per head 8 + 4 (nope + rope), V per head 6; bf16
    assert v["cp_kv_bytes"] == 32 * 4 * (8 + 4 + 6) * 2 == 4608
    # DP = 4/2 = 2, microbatches = 4/(1·2) = 2, two blocks; forward all-gather sends its shard
    assert v["step.cp_kv_gather.fwd.send_bytes"] == 4608 * 2 * 2
    assert v["step.cp_kv_gather.fwd.recv_bytes"] == 2 * 4608 * 2 * 2
    assert v["step.cp_kv_gather.bwd.send_bytes"] == 2 * 4608 * 2 * 2


def test_no_cp_no_exchange() -> None:
    data = {**MLA, "parallel": {"world_size": 4, "cp": 1, "ep": 2},
            "training": {"seq_length": 64, "micro_batch_size": 1, "global_batch_size": 8}}
    assert not any(name.startswith("step.cp_kv_gather") for name in values(data))

"""DSA's stored activations by hand (planner/budget/layer_kinds.py DSA `_dsa_activations`).

The toy: tiny-cpu-8 (4 heads, S 32, CP 2, TP 1, two decoder layers) as MLA with kv_lora 32,
qk_rope 8 and a DSA indexer. Megatron-LM dev@d48bd6be's default DSA path (dsa_kernel_backend
none, no indexer loss) runs the indexer under no_grad and the sparse attention as
_unfused_absorbed_dsa_fn over dense scores [b, heads/TP, S/CP, S] = [b, 4, 16, 32]: every figure
below is that function's autograd-saved tensors written out (hn = kv_lora + qk_rope = 40)."""

from __future__ import annotations

from typing import Any

from planner.accounting import budgets
from planner.config.loader import load_config, parse_config
from tests.support.paths import EXAMPLES

HEADS, S, CP, KV_LORA, ROPE = 4, 32, 2, 32, 8
HN = KV_LORA + ROPE
DSA = {"attention_variant": "mla", "kv_lora_rank": KV_LORA, "qk_pos_emb_head_dim": ROPE,
       "qk_head_dim": 16, "v_head_dim": 16, "q_lora_rank": 16, "dsa": True, "index_n_heads": 2,
       "index_head_dim": 8, "index_topk": 4, "qk_layernorm": True}


def _values(model: dict[str, Any] | None = None, **sections: dict[str, Any]) -> dict[str, Any]:
    data = load_config(EXAMPLES / "tiny-cpu-8.yaml").model_dump(mode="json", exclude_unset=True)
    data["model"].update(DSA, **(model or {}))
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return {b.name: b.value for b in budgets(parse_config(data), stage=0) if b.stage in (None, 0)}


def _core(b: int, p: int) -> int:
    """One layer's saved bytes, tensor by tensor."""
    elements, rows = b * HEADS * (S // CP) * S, b * HEADS * (S // CP)
    scores = elements * (3 * 1 + 4 + 4 + p)  # 3 bool masks, exp out, division numerator, probs
    per_row = rows * (8 + 1 + 4 + 4)  # max indices, where condition, clamp_min input, divisor
    query = rows * HN * 4  # the fp32 query of the score matmul
    latent_out = rows * KV_LORA * p  # the up_v einsum's input
    up_v = HEADS * 16 * KV_LORA * p  # and its weight, the contiguous copy of the combined slice
    if b == 1:  # matmul views the broadcast key: fp32 key copy + the latent key (one tensor at fp32)
        keys = S * HN * (4 if p == 4 else 4 + p)
    else:  # matmul expands the key per head before bmm: copies of the fp32 key and latent value
        keys = b * HEADS * S * (HN * 4 + KV_LORA * p)
    return scores + per_row + query + latent_out + up_v + keys


def test_unfused_dsa_core_by_hand() -> None:
    env = _values()  # fp32, micro-batch 1
    assert env["dsa_score_elements"] == 1 * 4 * 16 * 32 == 2048
    assert env["act_dsa_core_per_layer"] == _core(1, 4) == (2048 * 15 + 64 * (17 + 160 + 128)
                                                             + 32 * 40 * 4 + 8192)
    assert _core(1, 4) == 63_552
    bf16 = _values(training={"precision": "bf16"})
    assert bf16["act_dsa_core_per_layer"] == _core(1, 2) == (2048 * 13 + 64 * (17 + 160 + 64)
                                                              + 32 * 40 * 6 + 4096)
    # the largest forward transient, at the softmax's last masked_fill: the caller's scores,
    # masked_logits and the division's output in fp32 (at bf16 also that masked_fill's fp32
    # output, cast before the value matmul) beside the fp32 index mask and its bool validity
    # [b, S/CP, S], against the indexer's two fp32 [S/CP, b, idx_heads 2, S] scores (8,192 bytes)
    # (at fp32 the backward's 19 - 4 bytes a score element win)
    assert env["dsa_transient_bytes"] == max(2 * 16 * 2 * 32 * 4, 3 * 2048 * 4 + 5 * 16 * 32,
                                             2048 * (19 - 4)) == 30_720
    assert bf16["dsa_transient_bytes"] == 4 * 2048 * 4 + 5 * 16 * 32 == 35_328
    # the backward's five fp32 score gradients less the freed probabilities (p) and last mask (1)
    # win from 5 local heads on (forward 16 + 5 / heads bytes a score element at bf16, backward 17)
    wide = _values({"num_attention_heads": 8}, training={"precision": "bf16"})
    assert wide["dsa_transient_bytes"] == 4096 * (19 - 2) == 69_632 > 4096 * 16 + 5 * 16 * 32
    two = _values(training={"precision": "bf16", "micro_batch_size": 2, "global_batch_size": 16})
    assert two["act_dsa_core_per_layer"] == _core(2, 2) == (4096 * 13 + 128 * 241
                                                             + 2 * 4 * 32 * (160 + 64) + 4096)


def test_absorbed_attention_block_by_hand() -> None:
    """The attention block is AbsorbedMLASelfAttention's, per token of the rank (16 = S/CP):
    norm in/out 2h, q norm in and q up-projection in 2·q_lora, kv norm in kv_lora + qk_rope, the
    einsum's copy of the non-rotary query heads·d_qk, linear_proj's input heads·d_v (no per-head
    K or V, no flash statistics); mla_up_proj keeps the checkpoint's latent key and rotary part
    instead of the query copy, and frees the latent key the core viewed (micro-batch 1)."""
    env = _values()
    assert env["act_attention_per_block"] == 16 * (2 * 64 + 2 * 16 + HN + HEADS * 16 + HEADS * 16) * 4
    bare = _values({"qk_layernorm": False})  # no q/kv norms: only the q up-projection's input
    assert bare["act_attention_per_block"] == 16 * (2 * 64 + 16 + HEADS * 16 + HEADS * 16) * 4
    up = _values(overlap={"recompute_granularity": "selective", "recompute_modules": ["mla_up_proj"]})
    assert up["act_attention_per_block"] == 16 * (2 * 64 + 2 * 16 + HN + 1 * HN + HEADS * 16) * 4
    assert up["act_dsa_core_per_layer"] == _core(1, 4) - S * HN * 4 == 58_432
    plain = _values({"dsa": False})  # MLA's record: q, k, v up-projection outputs and statistics
    assert plain["act_attention_per_block"] == 16 * ((2 * 64 + 2 * 16 + 2 * HN + 2 * HEADS * 24
                                                      + 2 * HEADS * 16) * 4 + HEADS * 4)
    assert (env["act_layers_per_microbatch"] - plain["act_layers_per_microbatch"]
            == 2 * (63_552 + env["act_attention_per_block"] - plain["act_attention_per_block"]))


def test_core_attn_recompute_keeps_the_checkpoint_inputs() -> None:
    """Selective core_attn keeps the checkpointed core's absorbed query and local latent key
    instead of its saved tensors, in both layers, and re-runs one layer's core in backward."""
    env = _values()
    assert env["recompute_working_bytes"] == 0
    ckpt = _values(overlap={"recompute_granularity": "selective", "recompute_modules": ["core_attn"]})
    inputs = 1 * HEADS * (S // CP) * HN * 4 + 1 * (S // CP) * HN * 4  # query rows + local key
    assert ckpt["act_dsa_core_inputs_per_layer"] == inputs == 10_240 + 2560
    assert ckpt["recompute_working_bytes"] == 63_552
    assert (env["act_layers_per_microbatch"] - ckpt["act_layers_per_microbatch"]
            == 2 * (63_552 - inputs))

"""DSA's step-time terms by hand (planner/budget/sparse_attention_time.py) on the path `emit
megatron` runs: no --dsa-kernel-backend (Megatron-LM dev@d48bd6be
megatron/training/argument_utils.py _resolve_dsa_kernel_backend_cli_default: `none`) and no
indexer loss (TransformerConfig.dsa_indexer_loss_coeff None).

The toy is test_dsa_memory's: tiny-cpu-8 (4 heads, S 32, CP 2, TP 1, two decoder layers) as MLA
with kv_lora 32, qk_rope 8 and a DSA indexer of 2 heads x 8. The core
(experimental_attention_variant/dsa.py _unfused_absorbed_dsa_fn) multiplies the absorbed query
[hn = kv_lora + qk_rope = 40] by the latent key over all S keys in fp32 and the probabilities by the
latent value [kv_lora 32]: score elements [b, heads/TP, S/CP, S] = [1, 4, 16, 32]."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from planner.config.loader import load_config, parse_config
from planner.estimate import estimate
from tests.support.paths import EXAMPLES

HEADS, S, CP, KV_LORA, ROPE, IDX_HEADS, IDX_DIM, Q_LORA, H = 4, 32, 2, 32, 8, 2, 8, 16, 64
ELEMENTS = 1 * HEADS * (S // CP) * S
DSA = {"attention_variant": "mla", "kv_lora_rank": KV_LORA, "qk_pos_emb_head_dim": ROPE,
       "qk_head_dim": 16, "v_head_dim": 16, "q_lora_rank": Q_LORA, "dsa": True,
       "index_n_heads": IDX_HEADS, "index_head_dim": IDX_DIM, "index_topk": 4, "qk_layernorm": True}


def _values(model: dict[str, Any] | None = None, **sections: dict[str, Any]) -> dict[str, Any]:
    data = load_config(EXAMPLES / "tiny-cpu-8.yaml").model_dump(mode="json", exclude_unset=True)
    data["model"].update(DSA, **(model or {}))
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    est = estimate(parse_config(data))
    return est.envs[est.slowest_stage]


def _core_by_hand(env: dict[str, Any], recomputed: int) -> Fraction:
    """Two DSA layers per microbatch: the products three times (forward, backward's two GEMMs per
    product) plus recompute's forward; the masked softmax's bytes forward (79, no cast at fp32),
    backward (139) and again forward when recomputed; the [b, S/CP, S] index mask (66 bytes an
    element) built in every forward."""
    layers = 2  # fp32 toy
    tf32 = _exact(env["peak_bf16"]) / 2 * _exact(env["eff_gemm_bf16"])
    products = ELEMENTS * (Fraction(2 * (KV_LORA + ROPE)) / tf32 + Fraction(2 * KV_LORA)
                           / _exact(env["time_bf16_rate"]))
    softmax = (layers * (79 + 139) + recomputed * 79) * ELEMENTS
    mask = (layers + recomputed) * (S // CP) * S * 66
    return env["microbatches"] * ((3 * layers + recomputed) * products
                                  + (softmax + mask) / _exact(env["time_hbm_rate"]))


def _exact(value: Any) -> Fraction:
    """A catalog figure or efficiency as the exact decimal it was written as."""
    return Fraction(str(value))


def test_dense_core_over_every_key_by_hand() -> None:
    env = _values()
    assert env["dsa_score_elements"] == ELEMENTS == 2048
    assert env["time_tf32_rate"] == _exact(env["peak_bf16"]) / 2 * _exact(env["eff_gemm_bf16"])
    assert env["time_dsa_score_flops"] == 2 * 40 and env["time_dsa_value_flops"] == 2 * 32
    assert env["time_dsa_softmax_fwd_bytes"] == 79 and env["time_dsa_softmax_bwd_bytes"] == 139
    bf16 = _values(training={"precision": "bf16"})  # the probabilities' cast and its gradient
    assert bf16["time_dsa_softmax_fwd_bytes"] == 79 + 6 and bf16["time_dsa_softmax_bwd_bytes"] == 139 + 6
    assert env["time_dsa_core_s"] == _core_by_hand(env, recomputed=0)
    # no flash kernel: the attention-core row carries nothing of DSA, its time is all here
    assert env["time_attention_core_fwd_flops"] == 0 == env["time_attention_core_s"]


def test_the_mask_saves_nothing() -> None:
    """The top-k only masks the probabilities: the core's time does not depend on index_topk."""
    few, many = _values(), _values({"index_topk": 16})
    assert few["time_dsa_core_s"] == many["time_dsa_core_s"] > 0


def test_indexer_forward_only_by_hand() -> None:
    """Without an indexer loss DSAttention.forward runs the indexer under torch.no_grad: one
    forward per layer, its fp32 scores (2 heads x 8 over all 32 keys) at the TF32 rate, the
    projections at the GEMM rate, per head and key 20 bytes and per key 20 through HBM."""
    env = _values()
    per_token = (Fraction(2 * IDX_HEADS * IDX_DIM * S) / env["time_tf32_rate"]
                 + Fraction(2 * (Q_LORA * IDX_HEADS * IDX_DIM + H * IDX_DIM + H * IDX_HEADS))
                 / env["time_gemm_rate"]
                 + Fraction((20 * IDX_HEADS + 20) * S) / env["time_hbm_rate"])
    tokens = 1 * S // (1 * CP)  # b * S / (TP * CP), every TP rank scoring its whole sequence
    assert env["time_indexer_s"] == env["microbatches"] * tokens * 1 * 2 * per_token


def test_recompute_reruns_the_core_and_indexer_forward() -> None:
    """Selective core_attn checkpoints DSAttention whole (absorbed_mla.py
    AbsorbedMLASelfAttention._checkpointed_attention_forward): both layers' core and indexer
    forwards run again; full recompute of both layers does the same."""
    none = _values()
    for overlap in ({"recompute_granularity": "selective", "recompute_modules": ["core_attn"]},
                    {"recompute_granularity": "full", "recompute_method": "uniform",
                     "recompute_num_layers": 1}):
        env = _values(overlap=overlap)
        assert env["time_dsa_core_s"] == _core_by_hand(env, recomputed=2)
        assert env["time_indexer_s"] == 2 * none["time_indexer_s"]


def test_the_step_lists_the_dsa_core_among_its_parts() -> None:
    """The budget screen's largest parts and `compare` read a stage's compute parts: DSA's core,
    which the attention-core part no longer holds, is one of them."""
    data = load_config(EXAMPLES / "tiny-cpu-8.yaml").model_dump(mode="json", exclude_unset=True)
    data["model"].update(DSA)
    est = estimate(parse_config(data))
    parts = est.stages[est.slowest_stage]["compute_parts_s"]
    assert parts["dsa_core"] == float(est.envs[est.slowest_stage]["time_dsa_core_s"]) > 0
    assert parts["attention_core"] == 0
    plain = estimate(load_config(EXAMPLES / "tiny-cpu-8.yaml"))
    assert "dsa_core" not in plain.stages[plain.slowest_stage]["compute_parts_s"]


def test_a_shared_top_k_keeps_every_core_and_halves_the_indexers() -> None:
    """dsa_indexer_topk_freq 2 on four layers: layers 2 and 4 take their source layer's top-k and
    build no indexer (dsa.py DSAttention.forward), but every layer still runs its dense core."""
    every = _values({"num_layers": 4})
    shared = _values({"num_layers": 4, "dsa_indexer_topk_freq": 2})
    assert shared["time_dsa_core_s"] == every["time_dsa_core_s"] > 0
    assert 2 * shared["time_indexer_s"] == every["time_indexer_s"] > 0

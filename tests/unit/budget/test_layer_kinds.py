"""Each layer kind's own figures, by hand, on tiny-cpu-8 (h 64, 4 heads of d 16, 4 query groups,
TP 1, S 32, 2 decoder layers, no MTP) with the kind switched on (planner/budget/layer_kinds.py)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from planner.accounting import budgets, formula_book
from planner.budget.layer_kinds import KINDS, kinds_present
from planner.config.loader import InvalidConfig, load_config, parse_config
from planner.docs.formulas_page import VARIATIONS, baseline_variant
from planner.emit import EmitError
from planner.emit.megatron import NOT_IN_MEGATRON, megatron_arguments
from tests.support.paths import EXAMPLES

H, HEADS, D, GROUPS, S = 64, 4, 16, 4, 32
PROJECTIONS = 2 * H * D * (2 * HEADS + 2 * GROUPS)  # Q, K, V and output, one token: 32,768
CORE = 2 * HEADS * D * S  # QKᵀ and softmax·V over the causal half of S keys: 4,096


def _tiny(**model: Any):
    data = load_config(EXAMPLES / "tiny-cpu-8.yaml").model_dump(mode="json", exclude_unset=True)
    data["model"].update(model)
    return parse_config(data)


def _values(cfg) -> dict[str, Any]:
    return {b.name: b.value for b in budgets(cfg, stage=0) if b.stage in (None, 0)}


def test_softmax_attention_by_hand() -> None:
    cfg = _tiny()
    assert cfg.model.layer_mixers == ("softmax", "softmax")
    env = _values(cfg)
    assert env["attention_params_per_block"] == 2 * H * D * (HEADS + GROUPS) == 16_384
    assert env["flops_attention_linear_fwd_per_token"] == PROJECTIONS == 32_768
    assert env["flops_attention_core_fwd_per_token"] == CORE
    assert env["time_attention_core_fwd_flops"] == 2 * CORE


def test_sliding_window_layers_by_hand() -> None:
    """window 7 left + itself = 8 keys, on every odd layer (window_attn_skip_freq 2: layer 1 of 2)."""
    cfg = _tiny(window_size=[7, 0], window_attn_skip_freq=2)
    assert cfg.model.layer_mixers == ("window", "softmax")
    env = _values(cfg)
    keys = Fraction(8) * (1 - Fraction(8 - 1, 2 * S))  # 57/8 keys on average under the causal mask
    assert env["flops_window_keys_avg"] == keys
    window = 2 * 2 * HEADS * D * keys  # 1,824
    assert env["flops_attention_window_core_fwd_per_token"] == window == 1824
    assert env["time_attention_core_fwd_flops"] == CORE + window
    # Megatron's FLOPs figure counts the window layer as full attention
    assert env["stage_attention_fwd_flops_per_token"] == 2 * (PROJECTIONS + CORE)


def test_chunked_layers_by_hand() -> None:
    cfg = _tiny(attention_chunk_size=8)
    assert cfg.model.layer_mixers == ("chunked", "chunked")  # every layer is a RoPE layer
    env = _values(cfg)
    assert env["flops_attention_chunk_core_fwd_per_token"] == 2 * HEADS * D * 8 == 1024
    assert env["time_attention_core_fwd_flops"] == 2 * 1024


GDN = {"linear_attention_freq": 2, "linear_key_head_dim": 8, "linear_num_key_heads": 2,
       "linear_value_head_dim": 8, "linear_num_value_heads": 4, "linear_conv_kernel_dim": 4}


def test_gated_delta_net_layers_by_hand() -> None:
    """la_qk = 8·2 = 16, la_v = 8·4 = 32, 4 value heads, conv 4; layer 1 of 2 is DeltaNet."""
    cfg = _tiny(**GDN)
    assert cfg.model.layer_mixers == ("gdn", "softmax")
    env, base = _values(cfg), _values(_tiny())
    in_proj = H * (2 * 16 + 2 * 32 + 2 * 4)  # q, k, v, z, beta, alpha
    gdn = in_proj + (2 * 16 + 32) * 4 + 2 * 4 + 32 * H + 8  # + conv, dt_bias/A_log, out, norm
    assert env["gdn_params_per_layer"] == gdn == 8976
    # the DeltaNet layer replaces its softmax attention; both blocks keep their norms
    assert env["dense_params_on_rank"] - base["dense_params_on_rank"] == gdn - 16_384
    flops = 2 * (in_proj + 4 * (2 * 16 + 32) + 4 * 4 * 8 ** 2 + H * 32)
    assert env["flops_gdn_fwd_per_token"] == flops == 19_968
    assert env["stage_attention_fwd_flops_per_token"] == (PROJECTIONS + CORE) + flops
    assert env["time_attention_core_fwd_flops"] == CORE  # token-linear: no core attention


MLA = {"attention_variant": "mla", "kv_lora_rank": 32, "qk_pos_emb_head_dim": 8, "qk_head_dim": 16,
       "v_head_dim": 16}


def test_mla_by_hand() -> None:
    cfg = _tiny(**MLA)
    assert cfg.model.layer_mixers == ("mla", "mla")
    env = _values(cfg)
    q = H * HEADS * (16 + 8)
    kv = 32 * (H + HEADS * (16 + 16))
    assert env["attention_params_per_block"] == q + kv + H * 8 + HEADS * 16 * H == 16_896
    assert env["flops_attention_core_fwd_per_token"] == HEADS * (16 + 8 + 16) * S


def test_dsa_indexer_by_hand() -> None:
    """The indexer (2 heads of 8, top 4) on MLA with a 16-wide query LoRA."""
    cfg = _tiny(**MLA, q_lora_rank=16, dsa=True, index_n_heads=2, index_head_dim=8, index_topk=4)
    env = _values(cfg)
    assert env["dsa_indexer_params_per_block"] == 2 * 8 * 16 + H * 8 + 2 * 8 + H * 2 == 912
    # Megatron's default DSA core (dsa_kernel_backend none) is no flash kernel: dense absorbed
    # products over all S keys, priced as time_dsa_core_s (tests/unit/budget/test_dsa_time.py)
    assert env["time_dsa_core_flops"] == 0 == env["time_attention_core_fwd_flops"]
    assert env["time_dsa_score_flops"] == 2 * (32 + 8) and env["time_dsa_value_flops"] == 2 * 32


def test_dsa_top_k_shared_every_second_layer_by_hand() -> None:
    """4 DSA layers with dsa_indexer_topk_freq 2 (offset 0, read as 1 by Megatron's
    is_dsa_skip_topk_layer): 1-based layers 1 and 3 compute their top-k (max(n - 1, 0) % 2 == 0),
    2 and 4 reuse them and build no indexer. Against an indexer on every layer: 2 x 912
    parameters fewer (on the rank and among the TP-replicated ones), half the indexer's time
    (scoring, projections, top-k: per computing layer), and under tiny's CP 2 half the indexer-key
    gather: one layer's keys b·S/CP·idx_dim·4 bytes = 1·16·8·4 = 512 sent per microbatch, over 4
    microbatches and 2 computing layers 4,096 bytes backward (8,192 with all four)."""
    dsa = dict(**MLA, q_lora_rank=16, dsa=True, index_n_heads=2, index_head_dim=8, index_topk=4,
               num_layers=4)
    cfg = _tiny(**dsa, dsa_indexer_topk_freq=2)
    assert [cfg.model.dsa_computes_topk(layer) for layer in range(4)] == [True, False, True, False]
    shared, every = _values(cfg), _values(_tiny(**dsa))
    for name in ("dense_params_on_rank", "tp_replicated_params_on_rank"):
        assert every[name] - shared[name] == 2 * 912
    assert shared["time_indexer_s"] * 2 == every["time_indexer_s"]
    gather = "step.cp_dsa_indexer_k_gather.bwd.send_bytes"
    assert (shared[gather], every[gather]) == (4 * 2 * 512, 4 * 4 * 512)
    # the sparse attention itself still runs on every layer (the reused top-k)
    assert shared["time_attention_core_fwd_flops"] == every["time_attention_core_fwd_flops"]


def test_deepseek_v4_layers_follow_the_compress_ratios() -> None:
    """DeepSeek-V4-Flash's pattern [0, 0, 4] + [128, 4] · 20: two window-only layers, then CSA
    and HCA alternating."""
    cfg = load_config(EXAMPLES / "deepseek-v4-flash-128.yaml")
    mixers = cfg.model.layer_mixers
    assert mixers[:5] == ("v4_window", "v4_window", "v4_csa", "v4_hca", "v4_csa")
    env = _values(cfg)
    assert env["flops_attention_swa_fwd_per_token"] == (env["flops_v4_projection_fwd_per_token"]
                                                        + env["flops_v4_window_fwd_per_token"])
    # 43 decoder ratios and one MTP layer past the list's end (ratio 0: window-only)
    assert (mixers.count("v4_csa"), mixers.count("v4_hca"), mixers.count("v4_window")) == (21, 20, 3)


def test_attention_features_by_hand() -> None:
    assert _values(_tiny(softmax_type="learnable"))["sink_params_per_block"] == HEADS
    gate = _values(_tiny(attention_output_gate=True))
    assert gate["attention_gate_params_per_block"] == H * HEADS * D == 4096
    assert gate["flops_attention_linear_fwd_per_token"] == PROJECTIONS + 2 * H * D * HEADS
    assert _values(_tiny(qk_layernorm=True))["qk_norm_params_per_block"] == 2 * D
    per_layer = _values(_tiny(qk_layernorm=True, qk_layernorm_per_layer=True))
    assert per_layer["qk_norm_params_per_block"] == (HEADS + GROUPS) * D


def test_head_wise_attention_gate_by_hand() -> None:
    """Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py SelfAttention.__init__:
    linear_qkv's output grows from heads·d + 2·groups·d = 192 to 196 rows (one per head), so the
    weight gains h · heads = 256 parameters and each token's forward 2 · h · heads = 512 FLOPs;
    Megatron's num_floating_point_operations does not count them (gate_projection_size reads
    attention_output_gate only), moeplan does."""
    cfg = _tiny(head_wise_attn_gate=True)
    assert "head_gate" in kinds_present(cfg)
    env, base = _values(cfg), _values(_tiny())
    assert env["attention_head_gate_params_per_block"] == H * HEADS == 256
    assert env["dense_params_on_rank"] - base["dense_params_on_rank"] == 2 * 256  # two blocks
    assert env["flops_attention_linear_fwd_per_token"] == PROJECTIONS + 2 * H * HEADS == 33_280
    biased = _values(_tiny(head_wise_attn_gate=True, add_qkv_bias=True))
    assert biased["attention_head_gate_params_per_block"] == H * HEADS + HEADS  # its bias rows
    with pytest.raises(InvalidConfig, match="one attention gate"):
        _tiny(head_wise_attn_gate=True, attention_output_gate=True)


def test_every_kind_is_documented_and_varied() -> None:
    """Each modelled kind names its Megatron source, and the formulas page shows every one."""
    varied = set(baseline_variant().kinds)
    for _, changes in VARIATIONS:
        varied |= set(changes.get("kinds", ()))
    for kind in KINDS:
        assert kind.what and kind.megatron.startswith(("Megatron-LM", "Hugging Face")), kind.name
        if not kind.unmodelled:
            assert kind.name in varied, f"{kind.name}: add a variation to its record"
            formula_book(baseline_variant())  # the baseline still builds


def test_mamba_layers_resolve_as_the_block_mixer() -> None:
    """mamba_layers marks the blocks whose mixer is Mamba-2 (its figures: tests/unit/budget/
    test_mamba.py); none marked is the plain model."""
    cfg = _tiny(mamba_layers=[0, 0])
    assert cfg.model.layer_mixers == ("softmax", "softmax") and "mamba" not in kinds_present(cfg)
    hybrid = _tiny(mamba_layers=[1, 0], mamba_num_heads=8, mamba_head_dim=16, mamba_num_groups=2)
    assert hybrid.model.layer_mixers == ("mamba", "softmax") and "mamba" in kinds_present(hybrid)


def test_the_variant_reads_each_family_from_its_base_kind() -> None:
    from planner.budget.variant import FAMILY_BASES

    bases = {kind.name: kind.family for kind in KINDS
             if kind.role == "mixer" and any(type(t).__name__ == "Base" for terms in kind.terms.values()
                                             for t in terms)}
    assert {**FAMILY_BASES, "softmax": "standard"} == bases


CP_EXCHANGES = {  # each kind's CP exchanges, in the order the comm page declares them
    "softmax": ("cp_kv_gather",), "mla": ("cp_kv_gather",),
    "gdn": ("cp_gdn_state_gather", "cp_gdn_relayout", "cp_gdn_conv_boundary"),
    "dsa": ("cp_dsa_indexer_k_gather",),
    "v4_window": ("cp_boundary_hidden", "cp_compressed_kv_gather", "cp_indexer_k_gather"),
    "mamba": ("cp_mamba_a2a",),
}


def test_each_kind_carries_its_cp_exchanges() -> None:
    """The records hold the comm page's CP part: under CP > 1 each kind declares its own table
    entries over cp; at CP = 1 it declares none and closes exactly those (the K/V all-gather
    closes nothing: a CP = 1 book has no step.cp_kv_gather rows)."""
    from dataclasses import replace

    from planner.budget.collectives import collective
    from planner.budget.variant import FAMILY_BASES

    bases = {family: base for base, family in FAMILY_BASES.items()} | {"standard": "softmax"}
    declared = {}
    for kind in KINDS:
        if kind.unmodelled:
            continue
        v = replace(baseline_variant(), kinds=frozenset({bases[kind.family], kind.name}), cp=True)
        on = kind.cp_exchanges(v)
        off = kind.cp_exchanges(replace(v, cp=False))
        names = tuple(x.name for together in on.declare for x in together)
        assert all(x.group == "cp" and "cp" in collective(x.name).groups
                   for together in on.declare for x in together), kind.name
        assert off.declare == () and on.close == off.close, kind.name
        assert set(off.close) == (set() if names == ("cp_kv_gather",) else set(names)), kind.name
        if names:
            declared[kind.name] = names
    assert declared == CP_EXCHANGES


def test_the_comm_page_names_no_kind_in_its_cp_part() -> None:
    """comm.py's CP part is a sum over the records: it tests no kind or family by name."""
    import inspect

    from planner.budget import comm

    source = inspect.getsource(comm._cp_exchanges)
    assert "kinds_of(v)" in source
    for word in ("v.has(", "v.attention", "v.cp", *(f'"{kind.name}"' for kind in KINDS)):
        assert word not in source, word


def test_window_layers_with_their_own_query_heads_by_hand() -> None:
    """8 query heads on the window layer (layer 0), 4 on the full one, the same 4 groups of d 16
    (Laguna-XS.2's and Step-3.5-Flash's layer-wise head counts): the window layer's 4 more heads
    add their q rows and output columns, 2 · h · d · 4 = 8,192 parameters, per token
    4 · h · d · 4 = 16,384 projection FLOPs and 2 · 4 · d · S = 4,096 core FLOPs (as the full count
    does), as its window kernel runs them 2 · 2 · 4 · d · 57/8 = 1,824; and store their query,
    core output (d each, fp32) and softmax statistics (4 bytes) per token."""
    cfg = _tiny(window_size=[7, 0], window_attn_skip_freq=2, window_num_attention_heads=8)
    assert "window_heads" in kinds_present(cfg) and cfg.model.layer_mixers == ("window", "softmax")
    env, base = _values(cfg), _values(_tiny(window_size=[7, 0], window_attn_skip_freq=2))
    assert env["window_heads_params_per_layer"] == 2 * H * D * 4 == 8192
    assert env["dense_params_on_rank"] - base["dense_params_on_rank"] == 8192
    assert env["flops_window_heads_fwd_per_token"] == 4 * H * D * 4 + 2 * 4 * D * S == 20_480
    assert env["stage_attention_fwd_flops_per_token"] == 2 * (PROJECTIONS + CORE) + 20_480
    assert env["time_attention_core_fwd_flops"] == base["time_attention_core_fwd_flops"] + 1824
    assert env["act_window_heads_per_layer"] == env["tokens_per_rank"] * (2 * 4 * D * 4 + 4 * 4)
    assert env["act_layers_per_microbatch"] - base["act_layers_per_microbatch"] \
        == env["act_window_heads_per_layer"]
    gated = _values(_tiny(window_size=[7, 0], window_attn_skip_freq=2, window_num_attention_heads=8,
                          head_wise_attn_gate=True))
    assert gated["window_heads_params_per_layer"] == 8192 + H * 4  # one gate row per added head
    # no Megatron-LM argument builds it: emit refuses, naming the field (EMT010)
    with pytest.raises(EmitError) as refused:
        megatron_arguments(cfg)
    assert refused.value.path == "model.window_num_attention_heads"
    assert refused.value.message.startswith(NOT_IN_MEGATRON)


@pytest.mark.parametrize(("change", "match"), [
    ({"window_num_attention_heads": 8}, "needs sliding-window layers"),
    ({"window_size": [7, 0], "window_num_attention_heads": 6}, "not a multiple of the 4 query"),
])
def test_window_heads_without_their_window_or_groups_are_refused(change: dict[str, Any],
                                                                 match: str) -> None:
    with pytest.raises(InvalidConfig, match=match):
        _tiny(**change)


def _tiny_cp1(**model: Any):
    """The tiny example without context parallelism (Megatron-Bridge's MiMo provider refuses it)."""
    data = load_config(EXAMPLES / "tiny-cpu-8.yaml").model_dump(mode="json", exclude_unset=True)
    data["model"].update(model)
    data["parallel"]["cp"] = 1
    return parse_config(data)


def test_value_width_window_kv_groups_and_window_sinks_by_hand() -> None:
    """MiMo-V2-Flash's attention, shrunk (Megatron-Bridge's MiMoV2FlashSelfAttention): values of 8
    beside q/k heads of 16, 2 KV groups on the full layer (1) and 4 on the window layer (0),
    sinks on the window layer only. Full layer: q 64·4·16 = 4,096, k 64·2·16 = 2,048, v 64·2·8 =
    1,024, o 4·8·64 = 2,048; window layer: q 4,096, k 4,096, v 2,048, o 2,048, 4 sinks. Per token
    the projections run 2 · 9,216 and 2 · 12,288 FLOPs, the core QKᵀ 4·16·S and softmax·V 4·8·S."""
    mimo = {"window_size": [7, 0], "window_attn_skip_freq": 2, "num_query_groups": 2}
    cfg = _tiny_cp1(**mimo, window_num_query_groups=4, v_head_dim=8, softmax_type="learnable",
                    full_attention_softmax_type="vanilla")
    assert {"value_dim", "value_dim_window", "window_kv", "window_sinks"} <= kinds_present(cfg)
    assert "sinks" not in kinds_present(cfg)
    env, base = _values(cfg), _values(_tiny_cp1(**mimo))
    assert env["dense_params_on_rank"] - base["dense_params_on_rank"] \
        == (9216 + 12292) - 2 * 2 * H * D * (HEADS + 2)
    assert env["stage_attention_fwd_flops_per_token"] == 2 * (9216 + 12288) + 2 * (4 * 16 + 4 * 8) * S
    # stored per token (fp32): q 4·16, the core output 4·8 and K, V of 2·16 + 2·8 (full layer) or
    # 4·16 + 4·8 (window layer), against q, the core output, K and V of 4·16, 4·16, 2·16, 2·16
    keys = Fraction(8) * (1 - Fraction(8 - 1, 2 * S))
    assert env["time_attention_core_fwd_flops"] == (4 * 16 + 4 * 8) * S + 2 * (4 * 16 + 4 * 8) * keys
    act = env["act_layers_per_microbatch"] - base["act_layers_per_microbatch"]
    full, window, was = 64 + 32 + 32 + 16, 64 + 32 + 64 + 32, 64 + 64 + 32 + 32
    assert act == env["tokens_per_rank"] * 4 * (full + window - 2 * was) == -6144
    # no Megatron-LM argument builds them: emit refuses, naming the field (EMT010)
    with pytest.raises(EmitError) as refused:
        megatron_arguments(cfg)
    assert refused.value.path == "model.window_num_query_groups"
    assert refused.value.message.startswith(NOT_IN_MEGATRON)


@pytest.mark.parametrize(("change", "match"), [
    ({"window_num_query_groups": 2}, "needs standard attention of full and sliding-window"),
    ({"v_head_dim": 8, "attention_output_gate": True}, "beside model.attention_output_gate"),
    ({"window_size": [7, 0], "full_attention_softmax_type": "vanilla"}, "needs model.softmax_type"),
    ({"window_size": [7, 0], "window_num_query_groups": 3}, "does not divide"),
    ({"v_head_dim": 8}, "beside parallel.cp 2"),
])
def test_per_layer_attention_widths_out_of_their_scope_are_refused(change: dict[str, Any],
                                                                    match: str) -> None:
    with pytest.raises(InvalidConfig, match=match):
        _tiny(**change)


def test_gemma4_attention_and_norms_by_hand() -> None:
    """Gemma-4's layer shapes, shrunk: the full layer (1) with 1 KV group of 16 whose V is its K
    (q 64·4·16 = 4,096, k 64·16 = 1,024, o 4,096, q/k norms 2·16), the window layer (0) with 2 KV
    groups of 8 (q 2,048, k 1,024, v 1,024, o 2,048, q/k norms 2·8), and norms on both sub-layer
    outputs (2·64 per block); each MoE layer's branch norms and router scales 3·64 + 64 + 8."""
    gemma = {"window_size": [7, 0], "window_attn_skip_freq": 2, "num_query_groups": 1,
             "qk_layernorm": True}
    cfg = _tiny_cp1(**gemma, window_num_query_groups=2, window_kv_channels=8,
                    attention_k_eq_v=True, post_sublayer_norms=True, moe_branch_norms=True)
    assert {"window_kv", "k_eq_v", "post_norms", "moe_branch"} <= kinds_present(cfg)
    env, base = _values(cfg), _values(_tiny_cp1(**gemma))
    moe_layers = env["moe_layers"]
    assert env["dense_params_on_rank"] - base["dense_params_on_rank"] \
        == (9216 + 32) + (6144 + 16) - 2 * (2 * H * D * (HEADS + 1) + 32) + 2 * 2 * H \
        + moe_layers * (3 * H + H + 8)
    # Megatron's count of the window layer runs over the whole causal sequence, as for full ones
    assert env["stage_attention_fwd_flops_per_token"] \
        == 2 * 9216 + 2 * HEADS * D * S + 2 * 6144 + HEADS * (8 + 8) * S
    keys = Fraction(8) * (1 - Fraction(8 - 1, 2 * S))
    assert env["time_attention_core_fwd_flops"] == 2 * HEADS * D * S + 2 * HEADS * 16 * keys
    # stored per token (fp32): the window layer's q, core output, K, V and q/k-norm inputs
    # 32 + 32 + 16 + 16 + 48 against 64 + 64 + 16 + 16 + 80; the post norms' inputs 2·64 per
    # block; an MoE layer's branch norms' inputs 3·64
    act = env["act_layers_per_microbatch"] - base["act_layers_per_microbatch"]
    assert act == env["tokens_per_rank"] * 4 * (144 - 240 + 2 * 2 * H + moe_layers * 3 * H)
    with pytest.raises(EmitError) as refused:
        megatron_arguments(cfg)
    assert refused.value.path == "model.window_kv_channels" and "Gemma4VLBridge" in refused.value.message
    with pytest.raises(EmitError) as refused:
        megatron_arguments(_tiny_cp1(post_sublayer_norms=True))
    assert refused.value.path == "model.post_sublayer_norms"


def test_block_sparse_layers_by_hand() -> None:
    """MiniMax-M3's block-sparse attention, shrunk, on layer 1 of 2: a lightning indexer of 2
    heads of 8 with one shared key (q 64·16 = 1,024, k 64·8 = 512, q/k norms 2·8), scoring every
    causal key per token (2·8·S) after its projections (2·64·24); the attention then reads the 2
    picked blocks of 4 keys: 8 keys, 57/8 on average under the causal mask."""
    cfg = _tiny(index_sparse_layers=[0, 1], index_n_heads=2, index_head_dim=8, index_block_size=4,
                index_topk_blocks=2)
    assert cfg.model.layer_mixers == ("softmax", "block_sparse")
    env, base = _values(cfg), _values(_tiny())
    assert env["index_sparse_params_per_layer"] == 1024 + 512 + 16
    assert env["dense_params_on_rank"] - base["dense_params_on_rank"] == 1552
    assert env["stage_attention_fwd_flops_per_token"] \
        == base["stage_attention_fwd_flops_per_token"] + 2 * 64 * 24 + 2 * 8 * S
    keys = Fraction(8) * (1 - Fraction(8 - 1, 2 * S))
    assert env["time_attention_core_fwd_flops"] == CORE + 2 * 2 * HEADS * D * keys + 2 * 8 * S
    with pytest.raises(EmitError) as refused:
        megatron_arguments(cfg)
    assert refused.value.path == "model.index_sparse_layers"
    with pytest.raises(InvalidConfig, match="missing: index_block_size"):
        _tiny(index_sparse_layers=[0, 1], index_n_heads=2, index_head_dim=8, index_topk_blocks=2)


def test_k_eq_v_without_window_fields_takes_v_from_full_layers_only() -> None:
    """attention_k_eq_v in a hand-written config without the window layers' own KV fields: only the
    full layer (1) has no v projection (Hugging Face Gemma4TextAttention: v_proj is None where
    attention_k_eq_v and the layer is not sliding); the window layer (0) keeps its 64·1·16 = 1,024
    v weights. Against the same model without it: 1,024 parameters and 2 · 1,024 projection FLOPs
    per token fewer, not twice that."""
    shape = {"window_size": [7, 0], "window_attn_skip_freq": 2, "num_query_groups": 1}
    cfg = _tiny_cp1(**shape, attention_k_eq_v=True)
    env, base = _values(cfg), _values(_tiny_cp1(**shape))
    assert env["dense_params_on_rank"] - base["dense_params_on_rank"] == -H * 1 * D == -1024
    assert env["stage_attention_fwd_flops_per_token"] \
        - base["stage_attention_fwd_flops_per_token"] == -2 * H * D
    assert env["act_layers_per_microbatch"] == base["act_layers_per_microbatch"]
    # every layer windowed: no full layer, so nothing is taken
    windowed = {"window_size": [7, 0], "num_query_groups": 1}
    assert _values(_tiny_cp1(**windowed, attention_k_eq_v=True))["dense_params_on_rank"] \
        == _values(_tiny_cp1(**windowed))["dense_params_on_rank"]


KDA = {**MLA, "kda_layers": [1, 0], "kda_num_heads": 2, "kda_head_dim": 8,
       "linear_conv_kernel_dim": 4}


def _tiny_kda(cp: int = 1, **model: Any):
    data = load_config(EXAMPLES / "tiny-cpu-8.yaml").model_dump(mode="json", exclude_unset=True)
    data["model"].update(model)
    data["parallel"].update(cp=cp)
    return parse_config(data)


def test_kimi_delta_attention_layer_by_hand() -> None:
    """KDA (transformers modeling_kimi_linear.py KimiLinearDeltaAttention) with 2 heads of 8
    (width 16), conv 4, on layer 1 of 2; layer 2 stays MLA (tiny-cpu-8 at CP 1)."""
    cfg = _tiny_kda(**KDA)
    assert cfg.model.layer_mixers == ("kda", "mla") and "kda" in kinds_present(cfg)
    env, base = _values(cfg), _values(_tiny_kda(**MLA))
    qkv_o = 4 * H * 16  # q, k, v (h → 16 each) and o_proj (16 → h): 4,096
    conv = 3 * 16 * 4  # depthwise over q, k, v, 4 taps, no bias: 192
    decay = H * 8 + 8 * 16 + 16 + 2  # f_a, f_b, dt_bias per channel, A_log per head: 658
    beta, gate, norm = H * 2, H * 8 + 8 * 16, 8  # b_proj, g_a + g_b, o_norm over one head
    kda = qkv_o + conv + decay + beta + gate + norm
    assert env["kda_params_per_layer"] == kda == 5722
    # the KDA layer replaces its MLA; both blocks keep their norms
    assert env["dense_params_on_rank"] - base["dense_params_on_rank"] == kda - 16_896
    flops = 2 * (qkv_o + H * 8 + 8 * 16 + H * 2 + H * 8 + 8 * 16 + conv + 4 * 2 * 8 ** 2)
    assert env["flops_kda_fwd_per_token"] == flops == 12_416
    mla_core = HEADS * (16 + 8 + 16) * S  # the MLA layer's core attention only
    assert env["time_attention_core_fwd_flops"] == mla_core


def test_kimi_delta_attention_is_refused_where_not_priced() -> None:
    """Megatron-LM dev has no KDA layer (EMT010 names the field); CP > 1 and a KDA list of the
    wrong length are config errors naming the field."""
    with pytest.raises(EmitError, match=f"{NOT_IN_MEGATRON}.*Kimi Delta Attention"):
        megatron_arguments(_tiny_kda(**KDA))
    with pytest.raises(InvalidConfig, match="kda_layers"):
        _tiny_kda(**{**KDA, "kda_layers": [1]})
    with pytest.raises(InvalidConfig, match="parallel.cp 2"):
        _tiny_kda(cp=2, **KDA)

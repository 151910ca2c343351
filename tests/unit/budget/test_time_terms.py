"""The step-time model's fixed costs, GEMM shapes and TP latency move the way they must
(planner/budget/time.py): directions, not fitted values."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from planner.budget.hardware import rope_unfused, yarn_concentration
from planner.config.importers.hf_config import map_hf_config
from planner.config.loader import parse_config
from planner.config.routing import expected_max_normal, routing_imbalance
from planner.config.schema import Config
from planner.estimate import estimate
from planner.rules.example_base import example_config_data, merge
from tests.support.estimate_anchors import BALANCED, QWEN, config
from tests.support.hf_configs import DEEPSEEK_V32
from tests.support.launch_arguments import build

# Routed elements by hand: the busiest rank's load stated as the mean (forced balance's default
# is the busiest of the EP ranks, planner/config/routing.py forced_imbalance).
MEAN_LOAD = {"routing_imbalance": 1.0}


def qwen(parallel: dict[str, Any] | None = None, training: dict[str, Any] | None = None,
         overlap: dict[str, Any] | None = None, efficiency: dict[str, Any] | None = None) -> Config:
    return config(QWEN, {"world_size": 16, "ep": 8, "etp": 1, **(parallel or {})},
                  {"seq_length": 4096, "global_batch_size": 256, "use_distributed_optimizer": True,
                   **(training or {})}, moe=BALANCED, overlap=overlap or {},
                  cluster={"gpu": "H100", "efficiency": efficiency or {}})


def env(cfg: Config) -> dict[str, Any]:
    est = estimate(cfg)
    return est.envs[est.slowest_stage]


def test_larger_microbatches_amortise_the_fixed_costs() -> None:
    one, four = env(qwen(training={"micro_batch_size": 1})), env(qwen(training={"micro_batch_size": 4}))
    assert four["time_fixed_s"] < one["time_fixed_s"]


def test_more_microbatches_amortise_the_fixed_step_cost() -> None:
    def per_token(batch: int) -> float:
        cfg = qwen(training={"global_batch_size": batch}, efficiency={"step_fixed_ms": 500})
        return estimate(cfg).step_time_s / (batch * 4096)
    assert per_token(512) < per_token(128) < per_token(32)


def test_cuda_graphs_lower_the_fixed_cost() -> None:
    eff = {"host_us_per_block": 300}
    none = env(qwen(efficiency=eff))["time_fixed_s"]
    router = env(qwen(efficiency=eff, overlap={"cuda_graph_impl": "transformer_engine",
                                               "cuda_graph_scope": ["attn", "moe_router"]}))
    full = env(qwen(efficiency=eff, overlap={"cuda_graph_impl": "full_iteration"}))
    assert full["time_fixed_s"] < router["time_fixed_s"] < none


def test_the_mlp_graph_scope_captures_dense_blocks_only() -> None:
    """Megatron-LM dev@d48bd6be megatron/core/transformer/enums.py CudaGraphModule: `mlp` captures
    dense layers only, `moe` the drop-and-pad MoE layers; a dropless MoE layer's experts stay eager."""
    from planner.budget.hardware import graph_capture
    mixed = qwen(overlap={"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["attn", "mlp"]})
    assert graph_capture(mixed) == {"graph_attn": 1, "graph_router": 0, "graph_preprocess": 0,
                                    "graph_experts": 0, "graph_dense": 1, "graph_full": 0}
    attn_only = qwen(overlap={"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["attn"]})
    # every block of this model is MoE: the mlp scope removes none of its expert launches
    assert env(mixed)["time_launches_fwd"] == env(attn_only)["time_launches_fwd"]
    whole = qwen(overlap={"cuda_graph_impl": "transformer_engine"})
    assert graph_capture(whole)["graph_dense"] == graph_capture(whole)["graph_experts"] == 1


def test_a_skinny_expert_gemm_runs_below_a_square_one() -> None:
    square = env(qwen(parallel={"world_size": 16, "ep": 8, "etp": 1}))
    skinny = env(config({**QWEN, "moe_ffn_hidden_size": 96}, {"world_size": 16, "ep": 8, "etp": 1},
                        {"seq_length": 4096, "global_batch_size": 256}, moe=BALANCED,
                        cluster={"gpu": "H100"}))
    assert skinny["time_routed_shape_eff"] < square["time_routed_shape_eff"] < 1


def test_tp8_exposes_more_communication_than_tp2() -> None:
    def exposed(tp: int) -> Any:
        return env(qwen(parallel={"world_size": 64, "tp": tp, "ep": 8, "etp": 1,
                                  "sequence_parallel": True}))["time_exposed_comm_s"]
    assert exposed(8) > exposed(2)


def test_tp_comm_overlap_hides_part_of_the_sp_collectives() -> None:
    def exposed(on: bool) -> Any:
        return env(qwen(parallel={"world_size": 64, "tp": 4, "ep": 8, "etp": 1,
                                  "sequence_parallel": True},
                        overlap={"tp_comm_overlap": on}))["time_exposed_comm_s"]
    assert exposed(True) < exposed(False)


def test_deepep_v2_is_priced_as_deepep_until_it_has_a_figure_of_its_own() -> None:
    from planner.budget.hardware import dispatch_efficiency, dispatch_latency
    from planner.config.loader import load_config
    from tests.support.paths import EXAMPLES

    cfg = load_config(EXAMPLES / "deepseek-v3-1024.yaml")
    eff = cfg.cluster.efficiency.model_copy(update={"dispatch_deepep": 0.7,
                                                    "dispatch_latency_us_deepep": 40.0})

    def flex(backend: str) -> Config:
        return cfg.model_copy(update={
            "moe": cfg.moe.model_copy(update={"moe_token_dispatcher_type": "flex",
                                              "moe_flex_dispatcher_backend": backend}),
            "cluster": cfg.cluster.model_copy(update={"efficiency": eff})})
    assert dispatch_efficiency(flex("deepepv2")) == dispatch_efficiency(flex("deepep")) == 0.7
    assert dispatch_latency(flex("deepepv2")) == dispatch_latency(flex("deepep")) == 40.0


def test_deepep_exchange_is_bound_by_its_sms() -> None:
    """DeepEP's copy kernels run on the SMs Megatron gives them: on one NVLink domain fewer SMs
    slow its exchange, enough SMs leave it at the link's rate; the alltoall has no such bound."""
    flex = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep"}

    def exchange(moe: dict[str, Any], sms: int) -> Any:
        cfg = config(QWEN, {"world_size": 8, "ep": 8, "etp": 1}, {"seq_length": 4096,
                     "global_batch_size": 8}, moe={**BALANCED, **moe},
                     cluster={"gpu": "H100", "efficiency": {"deepep_num_sms": sms}})
        return env(cfg)["time_ep_dispatch_hidden_fwd"]
    assert exchange(flex, 10) > exchange(flex, 20) > exchange(flex, 132)
    assert exchange({"moe_token_dispatcher_type": "alltoall"}, 10) == exchange(
        {"moe_token_dispatcher_type": "alltoall"}, 132)


def v32(seq: int, cp: int = 1, overlap: dict[str, Any] | None = None,
        parallel: dict[str, Any] | None = None, dsa: bool = True) -> dict[str, Any]:
    """DeepSeek-V3.2 (DSA; plain MLA with `dsa` False) cut to four layers on 16 H100."""
    model = {**map_hf_config(DEEPSEEK_V32).model, "num_layers": 4, "moe_layer_freq": 1,
             "mtp_num_layers": 0, **({} if dsa else {"dsa": False})}
    return env(config(model, {"world_size": 16, "ep": 8, "etp": 1, "cp": cp, **(parallel or {})},
                      {"seq_length": seq, "global_batch_size": 16 // cp}, moe=BALANCED,
                      overlap=overlap or {}, cluster={"gpu": "H100"}))


def test_the_indexer_cost_grows_with_the_sequence() -> None:
    """The lightning indexer scores every earlier key: its time per token grows with S."""
    def per_token(seq: int) -> Any:
        e = v32(seq)
        return e["time_indexer_s"] / (e["microbatches"] * e["time_tokens_per_rank"])
    assert per_token(16384) > 2 * per_token(4096) > 0


def test_the_default_dsa_core_is_dense_over_every_key() -> None:
    """Megatron's default DSA backend (none) multiplies every query by all S keys and masks the
    probabilities: the core's time per token doubles with S, whatever index_topk picks."""
    def per_token(seq: int) -> Any:
        e = v32(seq)
        return e["time_dsa_core_s"] / (e["microbatches"] * e["time_tokens_per_rank"])
    assert per_token(8192) == 2 * per_token(4096) > 0


def test_cp_exposes_the_kv_exchange_unless_a_ring_overlaps_it() -> None:
    """CP all-gathers KV: all_gather leaves it all on the critical path, the p2p ring hides part
    (behind flash attention: plain MLA, since DSA runs all_gather only, rule ARC007)."""
    gather = v32(16384, cp=2, parallel={"cp_comm_type": "all_gather"}, dsa=False)
    ring = v32(16384, cp=2, parallel={"cp_comm_type": "p2p"}, dsa=False)
    assert gather["time_cp_kv_gather_fwd_exposed"] == gather["time_cp_kv_gather_fwd"] > 0
    assert ring["time_cp_kv_gather_fwd_exposed"] < gather["time_cp_kv_gather_fwd_exposed"]


def test_a_cp_ring_across_nodes_moves_every_chunk_at_the_scale_out_rate() -> None:
    """TP 4 x CP 4 on 8-GPU nodes: the CP group is ranks 0, 4, 8, 12 on nodes 0, 0, 1, 1, so two
    of its four ring edges cross (cp_ring_offnode 1/2). Each ring step waits on the slowest edge,
    so the p2p ring's time is all its wire bytes at the scale-out rate; one all_gather collective
    keeps the per-edge split, the crossing half over the scale-out network."""
    def kv(comm_type: str) -> dict[str, Any]:
        return env(qwen(parallel={"tp": 4, "cp": 4, "sequence_parallel": True,
                                  "cp_comm_type": comm_type}, training={"seq_length": 16384}))
    ring, gather = kv("p2p"), kv("all_gather")
    for e in (ring, gather):
        assert e["cp_ring_offnode"] == Fraction(1, 2) and e["cp_nodes"] == 2
        assert e["step_cp_kv_gather_fwd_inter_node_bytes"] * 2 == e["step_cp_kv_gather_fwd_wire_bytes"]
    scale_out = ring["bw_scale_out"] * ring["eff_inter"]
    assert ring["time_cp_kv_gather_fwd"] == ring["step_cp_kv_gather_fwd_wire_bytes"] / scale_out
    assert gather["time_cp_kv_gather_fwd"] == gather["step_cp_kv_gather_fwd_inter_node_bytes"] / scale_out
    # inside one node the ring keeps the NVLink rate: TP 2 x CP 4 is ranks 0, 2, 4, 6
    inside = env(qwen(parallel={"tp": 2, "cp": 4, "sequence_parallel": True}, training={"seq_length": 16384}))
    assert inside["cp_nodes"] == 1 and inside["step_cp_kv_gather_fwd_inter_node_bytes"] == 0
    assert inside["time_cp_kv_gather_fwd"] == inside["step_cp_kv_gather_fwd_intra_node_bytes"] / (
        inside["bw_nvlink"] * inside["eff_intra"])


def routed(force: bool, balancing: str = "aux_loss", efficiency: dict[str, Any] | None = None) -> Config:
    return config(QWEN, {"world_size": 16, "ep": 8, "etp": 1},
                  {"seq_length": 4096, "global_batch_size": 256, "use_distributed_optimizer": True},
                  moe={**BALANCED, "moe_router_force_load_balancing": force,
                       "moe_router_load_balancing_type": balancing},
                  cluster={"gpu": "H100", "efficiency": efficiency or {}})


def test_natural_routing_is_slower_than_forced_on_every_routed_term() -> None:
    """Unset, routing_imbalance follows the router (planner/config/routing.py): forced balance's
    busiest of the EP ranks (under 1 % above the mean here), 1 for Sinkhorn, the published
    natural-routing figure otherwise; the busiest rank's routed GEMMs, permutes, activations and
    exchanges grow with it, the dense work does not."""
    forced, natural = routed(True), routed(False)
    assert 1.0 < routing_imbalance(forced) < 1.01 and routing_imbalance(natural) == 1.5
    assert routing_imbalance(routed(False, "sinkhorn")) == 1.0
    assert routing_imbalance(routed(False, efficiency={"routing_imbalance": 1.2})) == 1.2
    a, b = env(forced), env(natural)
    for term in ("time_routed_gemm_s", "time_ew_permute_elements", "time_ew_act_elements",
                 "time_ep_dispatch_hidden_fwd", "time_ep_combine_hidden_fwd"):
        assert b[term] > a[term], term
    assert b["time_attention_gemm_s"] == a["time_attention_gemm_s"]
    # on a GPU-paced pass the busiest rank's extra work lengthens the step (on a host-bound one,
    # as this Qwen3-30B layout on H100 is at the default host figure, the GPU's idle time
    # absorbs it)
    paced = {"host_us_per_launch": 0}
    assert (estimate(routed(False, efficiency=paced)).step_time_s
            > estimate(routed(True, efficiency=paced)).step_time_s)
    # the memory budget's hot rank takes only a stated imbalance
    assert b["hot_recv_rows"] == a["hot_recv_rows"]


def test_linear_biases_add_the_experts_unfused_fc2_bias() -> None:
    """Megatron's TEGroupedMLP._apply_bias adds fc2's bias outside the grouped GEMM, per local
    expert (b·p and the add) then one torch.cat: 6·k·h elements per token and MoE layer, and
    2·(E/EP) + 1 forward launches per MoE layer (Qwen3-30B: 48 layers, h 2048, top-8, 128
    experts over EP 8; the busiest rank's load stated as the mean, MEAN_LOAD)."""
    def build(bias: bool) -> dict[str, Any]:
        return env(config({**QWEN, "add_bias_linear": bias}, {"world_size": 16, "ep": 8, "etp": 1},
                          {"seq_length": 4096, "global_batch_size": 256}, moe=BALANCED,
                          cluster={"gpu": "H100", "efficiency": MEAN_LOAD}))
    plain, biased = build(False), build(True)
    assert "time_ew_expert_bias_elements" not in plain
    assert biased["time_ew_expert_bias_elements"] == 48 * 6 * 8 * 2048
    assert biased["time_launches_experts"] - plain["time_launches_experts"] == 2 * 16 + 1
    assert biased["time_non_gemm_s"] > plain["time_non_gemm_s"]


def test_yarn_with_a_concentration_factor_rotates_by_the_unfused_path() -> None:
    """GPT-OSS-shaped attention (64 query heads, 8 KV groups of 64) under YaRN factor 32: Megatron's
    concentration factor 1 + 0.1 ln 32 is not 1, so RoPE runs as PyTorch ops (Megatron-LM
    rope_utils.py apply_rotary_pos_emb, _apply_rotary_pos_emb_bshd): ten more passes over q and k
    per block than the fused kernel, and 12 kernels per tensor instead of 1 (6 without autograd)."""
    model = {**QWEN, "num_layers": 4, "num_attention_heads": 64, "num_query_groups": 8,
             "kv_channels": 64, "qk_layernorm": False}
    yarn = {**model, "position_embedding_type": "yarn", "rotary_scaling_factor": 32.0}
    cfg = config(yarn, {"world_size": 16, "ep": 8, "etp": 1},
                 {"seq_length": 4096, "global_batch_size": 256}, moe=BALANCED,
                 cluster={"gpu": "H100"})
    assert yarn_concentration(cfg) == 1 + 0.1 * math.log(32) and rope_unfused(cfg)
    unfused = env(cfg)
    assert unfused["time_ew_rope_unfused_elements"] == 4 * 10 * (64 + 8) * 64
    plain = env(config(model, {"world_size": 16, "ep": 8, "etp": 1},
                       {"seq_length": 4096, "global_batch_size": 256}, moe=BALANCED,
                       cluster={"gpu": "H100"}))
    assert "time_ew_rope_unfused_elements" not in plain
    assert unfused["time_launches_attention"] == plain["time_launches_attention"] + 22
    assert unfused["time_launches_nograd"] == plain["time_launches_nograd"] + 4 * 12
    assert unfused["time_non_gemm_s"] > plain["time_non_gemm_s"]
    # YaRN at factor 1 keeps the fused kernel
    assert not rope_unfused(config({**yarn, "rotary_scaling_factor": 1.0},
                                   {"world_size": 16, "ep": 8, "etp": 1},
                                   {"seq_length": 4096, "global_batch_size": 256}, moe=BALANCED))



def test_no_rope_fusion_rotates_by_the_unfused_path() -> None:
    """--no-rope-fusion (training.apply_rope_fusion false) on standard attention: the same ten
    passes and 12 kernels per tensor as YaRN's fallback (Megatron-LM attention.py branches on
    config.apply_rope_fusion). On MLA only the positional parts rotate (multi_latent_attention.py
    get_query_key_value_tensors: q_pos_emb, qk_rope per head, and the one shared k_pos_emb), and
    MLA with plain RoPE has no fused path (MLATransformerConfig.__post_init__), so the schema resolves
    the switch off there and refuses it on."""
    model = {**QWEN, "num_layers": 4, "num_attention_heads": 32, "num_query_groups": 4,
             "kv_channels": 128}
    def at(model: dict[str, Any], **training: Any) -> Config:
        return config(model, {"world_size": 16, "ep": 8, "etp": 1},
                      {"seq_length": 4096, "global_batch_size": 256, **training}, moe=BALANCED,
                      cluster={"gpu": "H100"})
    fused, plain = at(model), at(model, apply_rope_fusion=False)
    assert fused.training.apply_rope_fusion and not rope_unfused(fused) and rope_unfused(plain)
    a, b = env(fused), env(plain)
    assert b["time_ew_rope_unfused_elements"] == 4 * 10 * (32 + 4) * 128
    assert b["time_launches_attention"] == a["time_launches_attention"] + 22
    assert b["time_launches_nograd"] == a["time_launches_nograd"] + 4 * 12
    mla = {**model, "multi_latent_attention": True, "q_lora_rank": 256, "kv_lora_rank": 128,
           "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128}
    assert at(mla).training.apply_rope_fusion  # MLA's default YaRN fuses
    resolved = at({**mla, "rope_type": "rope"})
    assert not resolved.training.apply_rope_fusion and rope_unfused(resolved)
    assert env(resolved)["time_ew_rope_unfused_elements"] == 4 * 10 * (32 + 1) * 64
    with pytest.raises(ValidationError, match="training.apply_rope_fusion true with MLA"):
        at({**mla, "rope_type": "rope"}, apply_rope_fusion=True)

def test_a_clamped_quick_geglu_adds_its_clamps_and_concatenation() -> None:
    """gpt-oss's routed experts (--quick-geglu, clamp 7): Megatron-LM fused_bias_geglu.py
    weighted_bias_quick_geglu_impl clamps FC1's two halves and concatenates them before the fused
    kernel: 8 more elements per routed row (I = 2048, top-8 here), four more forward kernels, of
    which only the two clamps have a backward kernel each. SwiGLU clamps inside its fused kernel."""
    geglu = {**QWEN, "num_layers": 4, "swiglu": False, "quick_geglu": True,
             "glu_linear_offset": 1.0}
    def at(model: dict[str, Any]) -> dict[str, Any]:
        return env(config(model, {"world_size": 16, "ep": 8, "etp": 1},
                          {"seq_length": 4096, "global_batch_size": 256}, moe=BALANCED,
                          cluster={"gpu": "H100", "efficiency": MEAN_LOAD}))
    plain, clamped = at(geglu), at({**geglu, "swiglu_limit": 7.0})
    k, inter = QWEN["moe_router_topk"], QWEN["moe_ffn_hidden_size"]
    assert clamped["time_ew_act_clamp_elements"] == 4 * 8 * k * inter
    assert "time_ew_act_clamp_elements" not in plain
    assert clamped["time_launches_experts"] == plain["time_launches_experts"] + 4
    assert clamped["time_launches_nograd"] == plain["time_launches_nograd"] + 4 * 3
    assert clamped["time_moe_non_gemm_s"] > plain["time_moe_non_gemm_s"]
    swiglu = at({**QWEN, "num_layers": 4, "swiglu_limit": 7.0})
    assert "time_ew_act_clamp_elements" not in swiglu


def test_unfused_attention_pays_its_products_over_every_key_and_its_score_passes() -> None:
    """dot_product_attention.py DotProductAttention.forward (attention_backend unfused): baddbmm and
    bmm multiply every query by every key, twice the causal half the flops page counts, and the
    [b, heads, s, s] scores go through HBM 4 times forward (baddbmm's write, the fused softmax's
    read and write, bmm's read) and 7 times backward: 11 · 2 bytes per element in BF16 without
    dropout, for 1 · 4 · 32 · 32 = 4096 elements per block and microbatch of the small model."""
    def core(training: dict[str, Any]) -> dict[str, Any]:
        return env(build(training=training))

    fused, unfused = core({}), core({"attention_backend": "unfused"})
    assert unfused["time_attention_scores_bytes"] == 22
    passes = (unfused["microbatches"] * unfused["blocks"] * 4096 * 22) / unfused["time_hbm_rate"]
    assert math.isclose(float(unfused["time_attention_core_s"]),
                        float(2 * fused["time_attention_core_s"] + passes), rel_tol=1e-12)
    assert "time_attention_scores_bytes" not in fused


def test_each_graphed_layer_costs_its_replay() -> None:
    whole = env(qwen(overlap={"cuda_graph_impl": "transformer_engine"}))
    layers = whole["L_moe"] + whole["L_dense"]
    # forward: the input copy and the graph launch; backward: the output gradient's copy and launch
    assert whole["time_graph_replays"] == layers
    assert whole["time_graph_replay_fwd_launches"] == whole["time_graph_replay_bwd_launches"] == 2 * layers
    router = env(qwen(overlap={"cuda_graph_impl": "transformer_engine",
                               "cuda_graph_scope": ["attn", "moe_router"]}))
    # a graph that stops after the router returns the hidden states, probabilities and residual
    assert router["time_graph_replay_bwd_launches"] == 2 * layers + 2 * router["L_moe"]
    none, full = env(qwen()), env(qwen(overlap={"cuda_graph_impl": "full_iteration"}))
    assert none["time_graph_replays"] == full["time_graph_replays"] == 0


def test_a_host_bound_pass_hides_the_token_exchanges_the_gpu_runs() -> None:
    """The host issues the experts while the GPU runs the dispatch and combine: far behind the
    GPU, the host hides every exchange (each pass costs max(host, GPU + exchanges)); with no host
    cost there is no excess to hide and the exchanges add to the compute."""
    exchanges = [f"time_ep_{what}_hidden_{phase}" for what in ("dispatch", "combine")
                 for phase in ("fwd", "bwd")]
    slow = env(qwen(efficiency={"host_us_per_launch": 2000}))
    assert slow["time_host_behind_exchanges_s"] == sum(slow[n] for n in exchanges) > 0
    # far behind: both passes' shared excess rows exceed what the exchanges can hide
    assert slow["time_host_excess_fwd_s"] * slow["microbatches"] >= sum(
        slow[n] for n in exchanges if n.endswith("_fwd"))
    assert slow["time_busy_s"] == (slow["time_compute_s"] + slow["time_exposed_comm_s"]
                                   - sum(slow[n] for n in exchanges))
    free = env(qwen(efficiency={"host_us_per_launch": 0}))
    assert free["time_host_behind_exchanges_s"] == 0
    assert free["time_busy_s"] == free["time_compute_s"] + free["time_exposed_comm_s"]


def test_megatron_fsdp_launches_per_bucket_and_per_tensor() -> None:
    """Megatron-FSDP optim_grads_params on 4 Qwen3-shaped MoE layers, one stage (embedding and
    output with it): a bucket per layer's dense group and per MoE layer's expert group
    (_get_parameter_groups), one for the rest, 4 + 4 + 1 = 9. Forward: one all-gather each;
    backward: the units' 8 gathered again, a reduce-scatter and an add per bucket, and without
    gradient accumulation fusion one copy per parameter tensor (_grad_acc)."""
    model = {**QWEN, "num_layers": 4}
    def at(**training: Any) -> dict[str, Any]:
        return env(config(model, {"world_size": 16, "ep": 8, "etp": 1},
                          {"seq_length": 4096, "global_batch_size": 256, "use_megatron_fsdp": True,
                           "ckpt_format": "fsdp_dtensor", **training}, moe=BALANCED,
                          cluster={"gpu": "H100"}))
    fused, copied = at(), at(gradient_accumulation_fusion=False)
    assert fused["time_fsdp_buckets"] == 9 and fused["time_fsdp_fwd_launches"] == 9
    assert fused["time_fsdp_bwd_launches"] == 8 + 2 * 9
    tensors = copied["time_fsdp_dense_tensors"] + copied["time_fsdp_expert_tensors"]
    assert copied["time_fsdp_expert_tensors"] == 4 * (128 // 8) * 2
    assert copied["time_fsdp_bwd_launches"] == fused["time_fsdp_bwd_launches"] + tensors
    assert copied["time_fsdp_host_bwd_s"] > fused["time_fsdp_host_bwd_s"]
    # one host excess per pass, Megatron-FSDP's launches in it, that the exposed host time and
    # the host time the token exchanges hide both read
    gpu_fwd = fused["time_gpu_s"] / (3 * fused["microbatches"])
    assert fused["time_host_excess_fwd_s"] == max(
        fused["time_host_fwd_s"] + fused["time_fsdp_host_fwd_s"] - gpu_fwd, 0)
    assert fused["time_host_excess_bwd_s"] == max(
        fused["time_host_bwd_s"] + fused["time_fsdp_host_bwd_s"] - 2 * gpu_fwd, 0)
    assert fused["time_host_exposed_s"] == (fused["time_host_excess_fwd_s"]
                                            + fused["time_host_excess_bwd_s"]
                                            + fused["time_sync_restart_s"])
    # optim_grads keeps whole parameters: its buckets follow the bucket size, not priced here
    assert "time_fsdp_buckets" not in at(data_parallel_sharding_strategy="optim_grads")


def test_unfused_attention_launches_its_four_kernels() -> None:
    """attention_backend unfused: DotProductAttention.forward launches baddbmm, the fused
    scale-mask-softmax, bmm and the context's contiguous copy (four kernels where a flash kernel
    is one), and the attention dropout when attention_dropout > 0."""
    model = {**QWEN, "num_layers": 4}
    def at(model: dict[str, Any], **training: Any) -> dict[str, Any]:
        return env(config(model, {"world_size": 16, "ep": 8, "etp": 1},
                          {"seq_length": 4096, "global_batch_size": 256, **training}, moe=BALANCED,
                          cluster={"gpu": "H100"}))
    flash, unfused = at(model), at(model, attention_backend="unfused")
    assert unfused["time_launches_attention"] == flash["time_launches_attention"] + 3
    dropped = at({**model, "attention_dropout": 0.1}, attention_backend="unfused")
    assert dropped["time_launches_attention"] == flash["time_launches_attention"] + 4


def _ncclep(**moe: Any) -> dict[str, Any]:
    return {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "ncclep",
            "moe_expert_rank_capacity_factor": 1.5, **moe}


def test_ncclep_permutes_inside_its_exchange_and_zero_copy_saves_its_buffer_copies() -> None:
    """NCCL EP: Transformer Engine's ep_dispatch writes expert-major rows (Megatron-LM dev
    _NCCLEPManager.get_permuted_hidden_states_by_experts only narrows them), so no permutation;
    the expert outputs (forward) and FC1's input gradients (backward) are copied into the exchange
    buffers, which main's moe_ncclep_zero_copy writes straight into, but the backward's under EP
    overlap. By hand on the example base (stage 0: 2 MoE layers, 4 microbatches of 256 tokens,
    top-2, hidden 64, forced balance off: imbalance 3/2, H100 HBM 3.35 TB/s at 0.8): a copy
    reads and writes 2 * 3/2 * 64 BF16 elements per token and layer, 768 bytes."""
    def stage0(moe: dict[str, Any], overlap: dict[str, Any] | None = None) -> dict[str, Any]:
        data = merge(example_config_data(""), {"moe": moe, "overlap": overlap or {}})
        return estimate(parse_config(data)).envs[0]

    staged = stage0(_ncclep())
    zero = stage0(_ncclep(moe_ncclep_zero_copy=True))
    zero_overlap = stage0(_ncclep(moe_ncclep_zero_copy=True),
                          {"overlap_moe_expert_parallel_comm": True})
    deepep = stage0(_ncclep(moe_flex_dispatcher_backend="deepep"))
    assert staged["time_permute_copies"] == 0 and deepep["time_permute_copies"] == 1
    assert "time_ncclep_copy_s" not in deepep
    per_copy = 4 * 256 * 2 * 768 / (3350e9 * 0.8)  # tokens of the step, layers, bytes per token
    assert (staged["time_ncclep_copies"], zero["time_ncclep_copies"],
            zero_overlap["time_ncclep_copies"]) == (2, 0, 1)
    assert float(staged["time_ncclep_copy_s"]) == pytest.approx(2 * per_copy, rel=1e-12)
    assert float(zero["time_ncclep_copy_s"]) == 0
    assert float(zero_overlap["time_ncclep_copy_s"]) == pytest.approx(per_copy, rel=1e-12)
    assert float(staged["time_non_gemm_s"]) - float(zero["time_non_gemm_s"]) == \
        pytest.approx(2 * per_copy, rel=1e-9)


def test_qk_norms_and_the_qkv_gather_below_the_query_groups_add_their_kernels_and_passes() -> None:
    """Qwen3-30B's attention (32 query heads, 4 KV groups of 128, qk_layernorm) over 4 layers:
    SelfAttention.get_query_key_value_tensors runs q_layernorm and k_layernorm after the split
    (two kernels, and each reads and writes its heads once: 2·(32 + 4)·128 elements per token and
    layer); at TP 8, above the 4 groups, it all-gathers the QKV output along its last dimension
    (the collective and the concatenation of the slices, two kernels), whose concatenation reads
    and writes the full width for every row of the rank: 2·8·(32 + 2·4)·128 per token and layer.
    At TP 4 (as many groups as ranks) there is no gather."""
    model = {**QWEN, "num_layers": 4}

    def at(model: dict[str, Any], tp: int) -> dict[str, Any]:
        return env(config(model, {"world_size": 16, "tp": tp, "ep": 8, "etp": 1,
                                  "sequence_parallel": True},
                          {"seq_length": 4096, "global_batch_size": 256}, moe=BALANCED,
                          cluster={"gpu": "H100"}))
    normed, plain = at(model, 4), at({**model, "qk_layernorm": False}, 4)
    assert normed["time_launches_attention"] == plain["time_launches_attention"] + 2
    assert normed["time_ew_attention_elements"] - plain["time_ew_attention_elements"] == (
        4 * 2 * (32 + 4) * 128)
    assert normed["time_non_gemm_s"] > plain["time_non_gemm_s"]
    gathered = at(model, 8)
    assert gathered["time_launches_attention"] == normed["time_launches_attention"] + 2
    assert gathered["time_ew_attention_elements"] - normed["time_ew_attention_elements"] == (
        4 * 2 * 8 * (32 + 2 * 4) * 128)


def test_only_the_shared_expert_and_expert_tp_launch_tp_collectives_in_a_moe_layer() -> None:
    """The alltoall dispatcher moves the routed rows over expt_tp, not TP
    (MoEAlltoAllTokenDispatcher.tp_group is pg_collection.expt_tp): at ETP 1 a MoE layer without a
    shared expert launches no TP collective whatever TP is; a shared expert gathers and scatters
    over TP (two); ETP 2 adds the gathers of the received tokens and probabilities and the
    combine's reduce-scatter (three)."""
    model = {**QWEN, "num_layers": 4}
    alltoall = {"moe_token_dispatcher_type": "alltoall", "moe_router_force_load_balancing": True}

    def experts(model: dict[str, Any], tp: int, etp: int = 1) -> int:
        return env(config(model, {"world_size": 16, "tp": tp, "ep": 8, "etp": etp,
                                  "sequence_parallel": tp > 1},
                          {"seq_length": 4096, "global_batch_size": 256}, moe=alltoall,
                          cluster={"gpu": "H100"}))["time_launches_experts"]
    assert experts(model, 4) == experts(model, 1)
    shared = {**model, "moe_shared_expert_intermediate_size": 768}
    assert experts(shared, 4) == experts(shared, 1) + 2
    assert experts(model, 2, etp=2) == experts(model, 2) + 3


def test_forced_balance_waits_for_the_busiest_of_the_ep_ranks_random_routing_gives() -> None:
    """Megatron's forced balance replaces the logits by fresh normals (moe_utils.py RandomSTE), so
    each token's top-k is a random k-subset of the experts. Qwen3-30B (128 experts, top-8) at EP 8,
    TP 1, one sequence of 4,096 tokens per rank: the EP group routes T = 32,768 tokens; a rank's 16
    experts get μ = T·8·16/128 rows with per-token variance 8·(1/8)(7/8)(120/127); the counts sum
    to T·8, and the largest of 8 is μ + σ·c(8)·√(8/7), c(8) = 1.4236 the expected maximum of 8
    standard normals. A seeded simulation of the routing itself (on a small MoE) agrees within a
    tenth of the excess; more tokens per microbatch shrink it, and one EP rank has none."""
    var_x = 8 * (1 / 8) * (7 / 8) * 120 / 127
    tokens = 8 * 4096
    by_hand = 1 + math.sqrt(tokens * var_x) * 1.4236 * math.sqrt(8 / 7) / (tokens * 8 * 16 / 128)
    forced = routed(True)
    assert routing_imbalance(forced) == pytest.approx(by_hand, rel=1e-5)
    assert expected_max_normal(8) == pytest.approx(1.42360, abs=1e-5)
    # the routing itself, simulated on a small MoE: 16 experts, top-2, EP 4, 512 tokens a rank
    small = config({**QWEN, "num_layers": 2, "num_experts": 16, "moe_router_topk": 2},
                   {"world_size": 4, "ep": 4, "etp": 1}, {"seq_length": 512, "global_batch_size": 8},
                   moe={**BALANCED, "moe_router_force_load_balancing": True})
    rng, maxima = np.random.default_rng(20261207), []
    for _ in range(2000):
        picks = np.argpartition(rng.standard_normal((4 * 512, 16)), -2, axis=1)[:, -2:]
        maxima.append(np.bincount(picks.ravel() // 4, minlength=4).max())
    simulated = float(np.mean(maxima)) / (4 * 512 * 2 / 4)
    assert abs(simulated - routing_imbalance(small)) < 0.1 * (routing_imbalance(small) - 1)
    four = config(QWEN, {"world_size": 16, "ep": 8, "etp": 1},
                  {"seq_length": 4096, "micro_batch_size": 4, "global_batch_size": 256},
                  moe={**BALANCED, "moe_router_force_load_balancing": True})
    assert 1 < routing_imbalance(four) < routing_imbalance(forced)
    one = config(QWEN, {"world_size": 16, "ep": 1, "etp": 1},
                 {"seq_length": 4096, "global_batch_size": 256},
                 moe={**BALANCED, "moe_router_force_load_balancing": True})
    assert routing_imbalance(one) == 1.0

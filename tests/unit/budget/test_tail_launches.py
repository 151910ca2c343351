"""Launches outside the transformer blocks that no per-layer CUDA graph captures
(planner/budget/tail_launches.py), the router graph's share of the experts part, and Sinkhorn's
loop count: exact counts derived by hand from Megatron's code."""

from __future__ import annotations

from typing import Any

import pytest

from planner.budget.hardware import sinkhorn_iterations, sinkhorn_launch_count
from planner.config.schema import Config
from planner.estimate import estimate

# One stage holding two MoE layers: 4 experts on the rank, no shared expert, RMSNorm, no biases.
SMALL = {"num_layers": 2, "hidden_size": 512, "num_attention_heads": 8, "num_query_groups": 8,
         "ffn_hidden_size": 1024, "vocab_size": 1024, "num_experts": 4, "moe_ffn_hidden_size": 1024,
         "moe_router_topk": 1, "normalization": "RMSNorm", "untie_embeddings_and_output_weights": True}


def env(model: dict[str, Any] | None = None, training: dict[str, Any] | None = None,
        overlap: dict[str, Any] | None = None, parallel: dict[str, Any] | None = None
        ) -> dict[str, Any]:
    cfg = Config.model_validate({
        "model": {**SMALL, **(model or {})},
        "parallel": {"world_size": 1, **(parallel or {})},
        "training": {"micro_batch_size": 1, "global_batch_size": 4, "seq_length": 1024,
                     **(training or {})},
        "overlap": overlap or {}, "cluster": {"gpu": "H100"}}, strict=False)
    est = estimate(cfg, exact=False)
    return est.envs[est.slowest_stage]


def test_grad_hooks_add_every_unfused_gradient() -> None:
    """DistributedDataParallel._make_backward_post_hook adds param.grad into main_grad unless the
    wgrad GEMM accumulated it. Fused: the two norms of each block, each layer's router, the
    embedding and the final norm, 2*2 + 2 + 1 + 1 = 8. Unfused: also each block's QKV and output
    projection (4), the 4 experts' fc1 and fc2 in both layers (16) and the output layer (1)."""
    assert env()["time_grad_hook_launches"] == 8
    assert env(training={"gradient_accumulation_fusion": False})["time_grad_hook_launches"] == 29


def test_per_layer_graphs_keep_the_grad_hooks_a_full_iteration_graph_takes_them() -> None:
    none = env()
    layers = env(overlap={"cuda_graph_impl": "transformer_engine"})
    full = env(overlap={"cuda_graph_impl": "full_iteration"})
    assert layers["time_tail_host_bwd_s"] == none["time_tail_host_bwd_s"] > 0
    assert full["time_tail_host_bwd_s"] == 0
    # the GPU still runs them either way
    assert full["time_tail_kernels"] == none["time_tail_kernels"]


def test_mtp_head_kernels() -> None:
    """main@d98e8a64 multi_token_prediction.py, one MTP layer at TP 1: differentiated, the
    embedding 1, enorm/hnorm/cat/eh_proj/final norm 5, output GEMM and cross entropy 11, the
    loss's mask, scale and division 3: 20. Without backward: two rolls of ids 6, two of labels and
    mask 6, the logged loss 7, the acceptance counts 10, the tracker 3, and once the labels' clone
    and the mask's sum 2: 34. TP 2 adds eh_proj's gather and scatter (2) and the vocab-parallel
    argmax's 8 beyond one argmax."""
    base = env()
    assert base["time_mtp_head_grad_launches"] == base["time_mtp_head_nograd_launches"] == 0
    mtp = env(model={"mtp_num_layers": 1})
    assert (mtp["time_mtp_head_grad_launches"], mtp["time_mtp_head_nograd_launches"]) == (20, 34)
    tp = env(model={"mtp_num_layers": 1}, parallel={"world_size": 2, "tp": 2})
    assert (tp["time_mtp_head_grad_launches"], tp["time_mtp_head_nograd_launches"]) == (22, 42)
    # and six more gradient hooks: the MTP layer's enorm, hnorm and final norm, and its
    # transformer layer's two norms and router
    assert mtp["time_tail_kernels"] == base["time_tail_kernels"] + 3 * 20 + 34 + 6


def test_a_router_graph_holds_the_pre_mlp_norm_and_the_shared_expert() -> None:
    """transformer_layer.py TransformerLayer._get_submodules_under_cudagraphs: moe_router captures
    pre_mlp_layernorm, the router and (not overlapped) the shared experts: 1 + 3 kernels fewer
    outside the graph per MoE layer than the experts part counts."""
    shared = {"moe_shared_expert_intermediate_size": 512}
    scope = {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["attn", "moe_router"]}
    router = env(model=shared, overlap=scope)
    assert router["time_launches_router_graph_also"] == 4
    attn = env(model=shared, overlap={**scope, "cuda_graph_scope": ["attn"]})
    # two MoE layers: each router's kernels and those four leave the eager host count, the
    # shared expert's fc1 and fc2 as Transformer Engine module calls (host_module_op bare ops)
    also = 4 + 2 * (router["host_module_op"] - 1)
    assert router["time_host_units_router_graph_also"] == pytest.approx(also)
    assert attn["time_host_units_fwd"] - router["time_host_units_fwd"] == pytest.approx(2 * (
        router["time_host_units_router"] + also))


@pytest.mark.parametrize(("hidden", "loops"), [(512, 3), (1024, 3), (2048, 4), (4096, 5),
                                               (7168, 6), (8192, 6)])
def test_sinkhorn_loops_grow_with_the_hidden_size(hidden: int, loops: int) -> None:
    assert sinkhorn_iterations(hidden) == loops


def test_sinkhorn_kernels_at_hidden_512() -> None:
    """moe_utils.py sinkhorn: exp, two ones and the closing two products (5), 14 per loop."""
    cfg = Config.model_validate({
        "model": SMALL, "parallel": {"world_size": 1},
        "training": {"micro_batch_size": 1, "global_batch_size": 4, "seq_length": 1024},
        "moe": {"moe_router_load_balancing_type": "sinkhorn", "moe_aux_loss_coeff": 0}},
        strict=False)
    assert sinkhorn_launch_count(cfg) == 5 + 14 * 3


def test_a_router_graph_before_the_dropless_sync_leaves_the_host_waiting() -> None:
    """token_dispatcher.py MoEAlltoAllTokenDispatcher: with EP > 1 the alltoall dispatcher syncs
    before its all-to-all; a graph ending there hands the host nothing to issue while the GPU
    runs it. Without a router graph, or without the sync, no wait."""
    # the fused permute: two launches between the graph and the sync (unfused, its ten cover the
    # graph's GPU time here)
    moe = {"moe": {"moe_token_dispatcher_type": "alltoall", "moe_permute_fusion": True}}
    scope = {"cuda_graph_impl": "transformer_engine",
             "cuda_graph_scope": ["attn", "moe_router", "moe_preprocess"]}
    ep = {"world_size": 2, "ep": 2}

    def wait(overlap: dict[str, Any], parallel: dict[str, Any]) -> Any:
        cfg = Config.model_validate({
            "model": SMALL, "parallel": parallel, "overlap": overlap, **moe,
            "training": {"micro_batch_size": 1, "global_batch_size": 4, "seq_length": 1024},
            "cluster": {"gpu": "H100"}}, strict=False)
        est = estimate(cfg, exact=False)
        return est.envs[0].get("time_graph_sync_wait_s")
    graphed = wait(scope, ep)
    assert graphed is not None and graphed > 0
    assert wait({**scope, "cuda_graph_scope": ["attn"]}, ep) == 0
    assert wait(scope, {"world_size": 1}) is None  # one rank, no expert TP: the sync comes later

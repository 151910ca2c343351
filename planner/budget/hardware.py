"""The step-time model's inputs: the cluster's peaks and bandwidths, its efficiency factors and
the overlap flags the collectives table names (inputs of the time page).

The overlap symbols are made from the table itself: every distinct `overlap` flag of an entry in
planner/budget/collectives.py becomes one 0/1 input read from the config path it names, so a new
overlapped collective needs no change here.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import reduce
from typing import Any

from planner.budget.collectives import TABLE
from planner.budget.expr import Number, Symbol, exact, normalize
from planner.config.gpus import HOST_MODULE_FP8, HOST_MODULE_OP, HOSTS, REFERENCE_HOST, gpu
from planner.config.routing import routing_imbalance
from planner.config.schema import Config
from planner.memo import HeldByIdentity

TERA, GIGA = 10**12, 10**9

OVERLAP_FLAGS: tuple[str, ...] = tuple(sorted({e.overlap for e in TABLE.values() if e.overlap}))


def overlap_symbol(flag: str) -> str:
    """The input naming one overlap flag: `overlap.overlap_grad_reduce` -> `on_overlap_grad_reduce`."""
    return "on_" + flag.rsplit(".", 1)[-1]


# --- step-time model terms: fixed costs, CUDA graphs, GEMM shapes, collective latency.
FIXED_COST_SYMBOLS: tuple[Symbol, ...] = (
    Symbol("delay_wgrad", "1 when overlap.delay_wgrad_compute runs with "
           "overlap_moe_expert_parallel_comm: the experts' weight gradient waits for the "
           "dispatch's backward all-to-all to be issued"),
    Symbol("stack_factor", "the stack's GPU work over the model's (efficiency.stack_factor; 1 "
           "unless a calibration fits it)"),
    Symbol("router_launches", "kernels the router part of one MoE layer's forward launches "
           "(router_launch_count: DeepSeek-V3's measured 72, 31 fused, scaled by the router's "
           "features; Sinkhorn's kernels as counted)"),
    Symbol("router_nograd_launches", "of those, the kernels the backward issues nothing for: "
           "Sinkhorn's (under torch.no_grad), and of the top-k router's the share its backward "
           "leaves out (router_nograd_launch_count: Megatron's router counted op by op, "
           "ROUTER_FORWARD_OPS and ROUTER_BACKWARD_OPS)"),
    Symbol("t_launch", "host seconds to issue one kernel: Python, PyTorch's dispatcher and the "
           "CUDA launch (efficiency.host_us_per_launch)"),
    Symbol("host_module_op", "host time of a Transformer Engine module's GEMM call over a bare "
           "PyTorch op's (planner/config/gpus.py HOST_MODULE_OP: te.Linear over torch.nn.Linear, "
           "measured)"),
    Symbol("host_module_fp8", "a Transformer Engine module GEMM call's host time under FP8 over its "
           "BF16 time (planner/config/gpus.py HOST_MODULE_FP8, measured; the time page applies it "
           "where fp8 is 1)"),
    Symbol("t_kernel_gpu", "GPU seconds each kernel costs beyond its work, host ahead or not, "
           "CUDA graph or not (efficiency.gpu_us_per_kernel)"),
    Symbol("host_scale", "host time per op of the GPU's host CPU over the reference x86 host's "
           "that t_launch is calibrated for (efficiency.host_launch_scale, else the catalog host's: "
           "planner/config/gpus.py HOSTS)"),
    Symbol("t_unbound", "host seconds an unbound rank (cluster.host_numa_binding off) pays per "
           "bare op beyond a bound one: the host's measured bare-op time less the reference's at "
           "host_scale, times the host's unbound_share (planner/config/gpus.py HOSTS); 0 bound"),
    Symbol("t_host_block", "host seconds to launch one block's forward and backward kernels per "
           "microbatch without CUDA graphs (efficiency.host_us_per_block)"),
    Symbol("t_host_expert", "host seconds per local expert of a MoE layer per microbatch "
           "(efficiency.host_us_per_expert)"),
    Symbol("t_host_microbatch", "host seconds per microbatch and model chunk: schedule, P2P set-up, "
           "loss (efficiency.host_us_per_microbatch)"),
    Symbol("t_step_fixed", "fixed seconds per optimizer step: optimizer launches, gradient-sync "
           "set-up, logging (efficiency.step_fixed_ms)"),
    Symbol("graph_attn", "1 when CUDA graphs capture the attention part of a block "
           "(overlap.cuda_graph_impl local/transformer_engine with scope attn or whole layers, or "
           "full_iteration)"),
    Symbol("graph_router", "1 when CUDA graphs capture the MoE router (scope moe_router, moe)"),
    Symbol("graph_preprocess", "1 when CUDA graphs capture the MoE preprocessing (scope "
           "moe_preprocess, moe)"),
    Symbol("graph_experts", "1 when CUDA graphs capture a MoE layer's experts and dispatch (scope "
           "moe, drop-and-pad MoE only; whole layers; or full_iteration)"),
    Symbol("graph_dense", "1 when CUDA graphs capture the dense blocks' MLP (scope mlp, which "
           "captures dense layers only; whole layers; or full_iteration)"),
    Symbol("graph_full", "1 under cuda_graph_impl full_iteration: the whole forward-backward of "
           "every microbatch is one graph, so per-microbatch host costs go too"),
    Symbol("gemm_half", "GEMM dimension reaching half the large-shape efficiency "
           "(efficiency.gemm_half_dim, else the GPU catalog's)"),
    Symbol("gemm_tile", "tile a GEMM dimension is quantised to (efficiency.gemm_tile)"),
    Symbol("t_dispatch", "fixed seconds per token dispatch or combine call of the dispatcher "
           "dispatcher (efficiency.dispatch_latency_us_alltoall / _deepep / _hybridep)"),
    Symbol("t_coll", "latency of one collective call, seconds (efficiency.collective_latency_us)"),
    Symbol("cp_ring", "1 when context parallelism exchanges KV in a ring overlapped with attention "
           "(parallel.cp_comm_type p2p or a2a+p2p); 0 for all_gather and a2a"),
    Symbol("inv_dispatch_sm_rate", "seconds per byte of the dispatcher's own copy kernels: DeepEP's "
           "normal kernels move a token exchange with efficiency.deepep_num_sms SMs at "
           "efficiency.deepep_gb_s_per_sm each; 0 for dispatchers without that bound"),
    Symbol("eff_attention_variant", "share of eff_attention the config's core-attention kernel "
           "reaches (efficiency.attention_mla for MLA, attention_sparse for DeepSeek-V4, else 1)"),
)

HARDWARE_SYMBOLS: tuple[Symbol, ...] = (
    Symbol("peak_bf16", "dense BF16 peak of one GPU, FLOP/s (cluster.peak_bf16_tflops)"),
    Symbol("peak_fp8", "dense FP8 peak of one GPU, FLOP/s (cluster.peak_fp8_tflops)"),
    Symbol("fp8", "1 when the linear layers run in FP8 (training.fp8 / fp8_format)"),
    Symbol("bw_nvlink", "NVLink bandwidth per GPU, one direction, B/s (intra_node_bandwidth_gb_s)"),
    Symbol("bw_scale_out", "scale-out bandwidth per GPU, one direction, B/s "
           "(inter_node_bandwidth_gb_s)"),
    Symbol("bw_hbm", "HBM bandwidth of one GPU, B/s (hbm_bandwidth_tb_s)"),
    Symbol("eff_gemm_bf16", "share of the BF16 peak the GEMMs reach (cluster.efficiency.gemm_bf16)"),
    Symbol("eff_gemm_fp8", "share of the FP8 peak the GEMMs reach (cluster.efficiency.gemm_fp8)"),
    Symbol("eff_fp8_recipe", "the FP8 recipe's GEMM rate against tensor scaling's (Transformer "
           "Engine's block scaling on Hopper, else 1)"),
    Symbol("eff_attention", "share of the BF16 peak core attention reaches (efficiency.attention)"),
    Symbol("eff_intra", "share of the NVLink bandwidth a collective reaches (efficiency.intra_node)"),
    Symbol("eff_inter", "share of the scale-out bandwidth a collective reaches "
           "(efficiency.inter_node)"),
    Symbol("eff_hbm", "share of the HBM bandwidth streaming work reaches: GEMM weight and grad "
           "traffic, elementwise kernels, the optimizer step (efficiency.hbm)"),
    Symbol("eff_overlap", "share of an overlapped collective hidden behind compute "
           "(efficiency.overlap)"),
    Symbol("imbalance", "busiest rank's routed-expert load over the mean in each layer (efficiency."
           "routing_imbalance, by default from the router: planner/config/routing.py; at most EP)"),
    Symbol("imbalance_stated", "the routing_imbalance the config states (1 when left to the "
           "router's default; at most EP): the memory budget's hot rank holds many layers, and "
           "which rank is busiest changes from layer to layer"),
    Symbol("t_non_gemm", "seconds per token and block outside GEMMs and attention, forward and "
           "backward (efficiency.non_gemm_ns_per_token_block)"),
    Symbol("non_gemm_passes", "HBM passes over the forward's elementwise bytes in forward and "
           "backward together (efficiency.non_gemm_passes)"),
    Symbol("permute_fused", "1 when the permutes are fused kernels (moe.moe_permute_fusion, or "
           "the HybridEP backend, which permutes inside its dispatch)"),
    Symbol("eff_permute_unfused", "cost of an unfused permutation over a fused one "
           "(efficiency.permute_unfused)"),
    Symbol("eff_dispatch", "share of the collective bandwidth the token dispatcher's EP exchange "
           "reaches (efficiency.dispatch_alltoall / dispatch_deepep / dispatch_hybridep; 1 for "
           "the others)"),
    *FIXED_COST_SYMBOLS,
    *(Symbol(overlap_symbol(flag), f"1 when {flag} is on (an overlap flag of the collectives "
             "table)" + (", with virtual pipeline stages: Megatron's validate_args turns it off "
                        "under plain 1F1B" if flag == "overlap.overlap_p2p_comm" else ""))
      for flag in OVERLAP_FLAGS),
)


def _flag(cfg: Config, path: str) -> int:
    value: Any = reduce(getattr, path.split("."), cfg)
    if path == "overlap.overlap_p2p_comm":  # validate_args: off without the interleaved schedule
        return int(bool(value) and (cfg.parallel.vpp or 1) > 1)
    return int(bool(value))


def _imbalance(cfg: Config, stated: bool = False) -> Number:
    """The busiest EP rank's routed load over the mean: efficiency.routing_imbalance, which no rank
    can exceed EP times (it would hold every row), so 1 without expert parallelism. The time page
    waits for the busiest rank of every layer (the router's default when unset); the memory
    budget's hot rank (`stated`) takes only what the config states: its activations of many
    layers sum loads of layers in which other ranks are the busiest."""
    value = cfg.cluster.efficiency.routing_imbalance
    if value is None:
        value = 1.0 if stated else routing_imbalance(cfg)
    return exact(min(value, cfg.parallel.ep))


# Transformer Engine's FP8 block scaling (DeepSeek's 1x128 / 128x128 scales) against current
# (tensor) scaling on Hopper, where it runs natively: TE's GEMM profiling guide measures a 5B
# config's GEMMs in autocast (quantisation included) on an H200 NVL at 486.851 ms current scaling
# and 549.171 ms block scaling (NVIDIA/TransformerEngine docs/examples/gemm_profiling/
# gemm_profiling.rst, "Worked Example: 5B Model on H200"); the fitted FP8 share stands for tensor
# scaling. Blackwell emulates block scaling with MXFP8 at about MXFP8's rate (same page), so 1
# there. Added after the one-layer FP8 rows (all block-scaled) had come out too fast.
HOPPER_BLOCK_SCALING_SHARE = Fraction(486851, 549171)


def fp8_recipe_share(cfg: Config) -> Number:
    tr = cfg.training
    if tr.fp8 and tr.fp8_recipe == "blockwise" and gpu(cfg.cluster.gpu).family == "hopper":
        return normalize(HOPPER_BLOCK_SCALING_SHARE)
    return 1


def hardware_values(cfg: Config) -> dict[str, Number]:
    c = _cluster_values(cfg)
    return {
        "peak_bf16": c["peak_bf16"], "peak_fp8": c["peak_fp8"],
        "fp8": int(cfg.training.fp8),
        "bw_nvlink": c["bw_nvlink"], "bw_scale_out": c["bw_scale_out"], "bw_hbm": c["bw_hbm"],
        "eff_gemm_bf16": c["eff_gemm_bf16"], "eff_gemm_fp8": c["eff_gemm_fp8"],
        "eff_fp8_recipe": fp8_recipe_share(cfg),
        "eff_attention": c["eff_attention"], "eff_intra": c["eff_intra"],
        "eff_inter": c["eff_inter"], "eff_hbm": c["eff_hbm"],
        "eff_overlap": c["eff_overlap"], "imbalance": _imbalance(cfg),
        "imbalance_stated": _imbalance(cfg, stated=True),
        "t_non_gemm": c["t_non_gemm"], "non_gemm_passes": c["non_gemm_passes"],
        "permute_fused": int(cfg.moe.moe_permute_fusion or _hybridep(cfg)),
        "eff_permute_unfused": c["eff_permute_unfused"],
        "eff_dispatch": exact(dispatch_efficiency(cfg)),
        **{overlap_symbol(flag): _flag(cfg, flag) for flag in OVERLAP_FLAGS},
        **fixed_cost_values(cfg, c),
    }


def _cluster_values(cfg: Config) -> dict[str, Number]:
    """The inputs that read the cluster section alone, made once per section: `moeplan search`'s
    candidates share the user's cluster, and turning its figures into exact rationals is most of
    the time the hardware inputs take."""
    return _CLUSTERS.get(cfg.cluster, lambda _: _make_cluster_values(cfg))


def _make_cluster_values(cfg: Config) -> dict[str, Number]:
    c, eff = cfg.cluster, cfg.cluster.efficiency
    return {
        "peak_bf16": exact(c.peak_bf16_tflops) * TERA,
        # A card without FP8 (Ampere) runs no FP8 GEMM: its FP8 rate is 0, and CLU005 refuses FP8
        # training on it.
        "peak_fp8": exact(c.peak_fp8_tflops or 0) * TERA,
        # the link's datasheet rate times the share its protocol leaves usable (xGMI's 75 %:
        # planner/config/gpus.py Gpu.link_usable_share; 1 on NVLink)
        "bw_nvlink": exact(c.intra_node_bandwidth_gb_s) * GIGA
        * exact(gpu(c.gpu).link_usable_share),
        "bw_scale_out": exact(c.inter_node_bandwidth_gb_s) * GIGA,
        "bw_hbm": exact(c.hbm_bandwidth_tb_s) * TERA,
        "eff_gemm_bf16": exact(eff.gemm_bf16), "eff_gemm_fp8": exact(eff.gemm_fp8),
        "eff_attention": exact(eff.attention), "eff_intra": exact(eff.intra_node),
        "eff_inter": exact(eff.inter_node), "eff_hbm": exact(eff.hbm),
        "eff_overlap": exact(eff.overlap),
        "t_non_gemm": normalize(Fraction(exact(eff.non_gemm_ns_per_token_block)) / GIGA),
        "non_gemm_passes": exact(eff.non_gemm_passes),
        "eff_permute_unfused": exact(eff.permute_unfused),
        "stack_factor": exact(eff.stack_factor),
        "t_launch": normalize(Fraction(exact(eff.host_us_per_launch)) / 10**6),
        "t_kernel_gpu": normalize(Fraction(exact(eff.gpu_us_per_kernel)) / 10**6),
        "host_scale": host_scale(cfg),
        "t_unbound": unbound_launch_s(cfg),
        "t_host_block": normalize(Fraction(exact(eff.host_us_per_block)) / 10**6),
        "t_host_expert": normalize(Fraction(exact(eff.host_us_per_expert)) / 10**6),
        "t_host_microbatch": normalize(Fraction(exact(eff.host_us_per_microbatch)) / 10**6),
        "t_step_fixed": normalize(Fraction(exact(eff.step_fixed_ms)) / 10**3),
        "gemm_half": exact(eff.gemm_half_dim), "gemm_tile": eff.gemm_tile,
        "t_coll": normalize(Fraction(exact(eff.collective_latency_us)) / 10**6),
    }


# The last few cluster sections' values, by the section's identity (configs are frozen).
_CLUSTERS: HeldByIdentity[dict[str, Number]] = HeldByIdentity(4)


# CUDA-graph scopes (Megatron-LM dev@d48bd6be megatron/core/transformer/enums.py CudaGraphModule;
# megatron/core/transformer/transformer_config.py cuda_graph_impl, cuda_graph_modules): which part
# of a block each captures. An empty scope under local / transformer_engine captures whole layers.
GRAPH_PARTS: dict[str, tuple[str, ...]] = {
    "attn": ("graph_attn",), "moe_router": ("graph_router",),
    "moe_preprocess": ("graph_preprocess",), "mlp": ("graph_dense",),
    "moe": ("graph_router", "graph_preprocess", "graph_experts"),
}
GRAPH_SYMBOLS = ("graph_attn", "graph_router", "graph_preprocess", "graph_experts", "graph_dense")


def graph_capture(cfg: Config) -> dict[str, int]:
    """Which block parts the config's CUDA graphs capture (0/1 each), and full_iteration.

    Every spelling Megatron accepts: cuda_graph_impl full_iteration; the deprecated scope
    "full_iteration" under any impl, which TransformerConfig.__post_init__ migrates to
    cuda_graph_impl="full_iteration" (Megatron-LM dev@d48bd6be
    megatron/core/transformer/cuda_graph_config.py normalize_cuda_graph_modules marks it
    deprecated, TransformerConfig.__post_init__ applies the migration);
    the deprecated scope "full" and an empty scope, whole layers."""
    ov = cfg.overlap
    out = dict.fromkeys((*GRAPH_SYMBOLS, "graph_full"), 0)
    if ov.cuda_graph_impl == "full_iteration" or "full_iteration" in ov.cuda_graph_scope:
        return dict.fromkeys(out, 1)
    if ov.cuda_graph_impl == "none":
        return out
    scopes = [s for s in ov.cuda_graph_scope if s != "full"] or ["attn", "mlp", "moe"]
    for scope in scopes:
        for name in GRAPH_PARTS.get(scope, ()):
            out[name] = 1
    return out


def attention_variant_share(cfg: Config) -> float:
    """The attention kernel's share of eff_attention: MLA's or V4's sparse kernel, else 1."""
    eff = cfg.cluster.efficiency
    return {"mla": eff.attention_mla, "dsv4_hybrid": eff.attention_sparse}.get(
        cfg.model.attention_variant, 1.0)


# Kernels of the router part of a MoE layer's forward. Nsight Systems counted 72 on DeepSeek-V3's
# router (sigmoid scores, group-limited top-k, expert bias, sequence auxiliary loss), 31 with
# Transformer Engine's fused router, --moe-router-fusion (Megatron-LM
# docs/discussions/deepseek-v3-gb200-optimization/deepseek-v3-gb200-optimization.md @1d9edcf8,
# 2.1.4: "reducing the total number of kernels in the router part from 72 to 31"). Another router
# launches that count times its share of the call sites, counted in Megatron-LM dev@d48bd6be
# megatron/core/transformer/moe/router.py TopKRouter.routing and moe_utils.py
# topk_routing_with_score_function: the base (gate GEMM, fp32 casts, score function, top-k, the
# probabilities and routing map scattered to [tokens, E]) 8; a sigmoid score's top-k normalisation
# 3; group_limited_topk 8; the expert bias (added, the unbiased scores gathered, its token counts
# accumulated) 4; an auxiliary loss (its scores, token counts and their all-reduce, the loss, the
# tracker and the autoscaler) 15.
# Sinkhorn (moe_utils.sinkhorn, under torch.no_grad in TopKRouter.sinkhorn_load_balancing) is
# counted kernel by kernel instead, so DeepSeek-V3's measured-over-counted ratio does not apply to
# it: the exp, the two torch.ones and the closing two products, 5, around a loop whose every ATen op
# launches one kernel: each of d0 and d1 a product, a row or column sum, + eps and the scalar over
# the tensor (Tensor.__rtruediv__: a reciprocal and a product), 5 each; the error's difference,
# abs and mean, 3; `error > tol`, 1: 14 per iteration, and the while's bool() a copy to the host
# and a sync. The iterations are data-dependent: the loop runs until the mean change of d1 falls
# under its 1e-4 tolerance, which takes longer the wider the logits spread. Simulated with the loop
# itself in fp32 on 4,096 normalised tokens through a router initialised at std 0.02 (the spread
# the first hundred iterations of training still have, where Megatron's CI measures), it stops
# after 2-3 iterations at hidden 512, 3 at 1,024, 4 at 2,048, 5 at 4,096 and 6-7 at 8,192 (4 to
# 64 experts; fewer with more experts): 3 up to hidden 1,024 and one more per doubling beyond
# (sinkhorn_iterations; it replaced a fixed 4 after Megatron's CI cases with Sinkhorn routers, hidden
# 512, were seen to run 1.4-1.9x faster than estimated). The spread, and so the count, grows as
# the router trains.
SINKHORN_SETUP = 5
SINKHORN_PER_ITERATION = 14


def sinkhorn_iterations(hidden: int) -> int:
    """Sinkhorn's loop count on router logits of the initial spread (see above): 3 up to hidden
    1,024, one more per doubling of the hidden size beyond."""
    return 3 + max(0, (max(hidden, 1) - 1).bit_length() - 10)


ROUTER_MEASURED = (72, 31)  # unfused, fused: DeepSeek-V3's router
ROUTER_SITES = {"base": 8, "sigmoid": 3, "groups": 8, "bias": 4, "aux": 15}
ROUTER_SITES_MEASURED = 8 + 3 + 8 + 4 + 15  # the call sites of the router that was measured


# What the router's backward issues. Megatron-LM dev@d48bd6be's TopKRouter (router.py
# TopKRouter.forward, moe_utils.py topk_routing_with_score_function, group_limited_topk and
# compute_routing_scores_for_aux_loss) was run on a CPU under a torch TorchDispatchMode that counts
# every ATen op that computes (views and allocations left out), forward and then backward, for
# each of its features (tests/integration/megatron/test_router_ops.py runs the count again):
#
#   router (load balancing none)          forward  backward
#   softmax after top-k                       9        6    gate GEMM, top-k, softmax, the
#                                                           probabilities and map scattered;
#                                                           backward: two GEMMs, the softmax's, a
#                                                           gather for the scatter
#   + sigmoid instead of softmax             +3       +7    sigmoid and the top-k normalisation
#                                                           (sum, + eps, divide): the division's
#                                                           gradient alone is five ops
#   + group-limited top-k                    +9       +1    group scores, group top-k, mask; only
#                                                           the selected scores carry a gradient,
#                                                           and none under an expert bias (the
#                                                           biased scores pick indices only)
#   + expert bias                            +4        0    bias add, the unbiased scores' gather,
#                                                           the token counts (no gradient)
#   + auxiliary loss                     +14 (+17)  +6 (+13) its own scores (softmax / sigmoid),
#                                                           the token counts (no gradient), the
#                                                           loss; sequence-level one op more each
#   + top-k scaling factor                   +1       +1
#
# DeepSeek-V3's router (sigmoid, groups, bias, sequence aux loss, scaling): 44 forward, 28
# backward. The backward issues about two thirds of an op per forward op, not the
# BACKWARD_DISPATCHES (two) per forward kernel of a Transformer Engine module: most of the
# router's forward is index work autograd leaves out, and an elementwise op's gradient is one op.
# The measured forward kernels (router_launch_count) are priced with backward at this share:
# measured x (1 - backward / (2 x forward)) of them count as kernels without a backward. Megatron's
# GB200 write-up measured the fused router's gain on DeepSeek-V3 at 16.56 -> 15.16 s a step; at two
# backward dispatches per router kernel moeplan had priced it at 4.39 s, 2.58 s with these. The fused
# router (Transformer Engine's fused_topk_with_score_function, which a CPU cannot run) is priced at
# the unfused router's share.
ROUTER_FORWARD_OPS = {"base": 9, "sigmoid": 3, "groups": 9, "bias": 4, "aux": 14, "aux_sigmoid": 3,
                      "seq_aux": 1, "scaling": 1}
ROUTER_BACKWARD_OPS = {"base": 6, "sigmoid": 7, "groups_unbiased": 1, "bias": 0, "aux": 6,
                       "aux_sigmoid": 7, "seq_aux": 1, "scaling": 1}


def _router_features(cfg: Config) -> dict[str, bool]:
    """Which of the top-k router's counted features this config's router has (the keys of
    ROUTER_SITES, ROUTER_FORWARD_OPS and ROUTER_BACKWARD_OPS)."""
    moe, model = cfg.moe, cfg.model
    sigmoid = model.moe_router_score_function != "softmax"
    groups, bias = bool(model.moe_router_num_groups), bool(model.moe_router_enable_expert_bias)
    aux = (moe.moe_router_load_balancing_type in ("aux_loss", "seq_aux_loss", "global_aux_loss")
           and moe.moe_aux_loss_coeff > 0)
    return {"base": True, "sigmoid": sigmoid, "groups": groups, "groups_unbiased": groups and not bias,
            "bias": bias, "aux": aux, "aux_sigmoid": aux and sigmoid,
            "seq_aux": aux and moe.moe_router_load_balancing_type == "seq_aux_loss",
            "scaling": bool(model.moe_router_topk_scaling_factor)}


def router_ops(cfg: Config) -> tuple[int, int]:
    """(forward, backward) ATen ops of this config's top-k router, from Megatron's router as
    counted (ROUTER_FORWARD_OPS, ROUTER_BACKWARD_OPS)."""
    on = _router_features(cfg)
    return (sum(n for name, n in ROUTER_FORWARD_OPS.items() if on[name]),
            sum(n for name, n in ROUTER_BACKWARD_OPS.items() if on[name]))


def sinkhorn_launch_count(cfg: Config) -> int:
    """Sinkhorn's kernels per router forward (SINKHORN_SETUP and SINKHORN_PER_ITERATION per
    sinkhorn_iterations of the hidden size), under torch.no_grad (Megatron-LM dev@d48bd6be
    megatron/core/transformer/moe/router.py TopKRouter.sinkhorn_load_balancing); 0 for another
    router."""
    if cfg.moe.moe_router_load_balancing_type != "sinkhorn":
        return 0
    return SINKHORN_SETUP + SINKHORN_PER_ITERATION * sinkhorn_iterations(cfg.model.hidden_size)


def router_nograd_launch_count(cfg: Config) -> Number:
    """Kernels of one MoE layer's router forward priced without a backward: Sinkhorn's, and of the
    top-k router's measured kernels the share that makes its backward issue the counted backward
    ops per forward op (see ROUTER_FORWARD_OPS), at BACKWARD_DISPATCHES (two) per remaining kernel:
    kernels x (1 - backward / (2 x forward))."""
    forward, backward = router_ops(cfg)
    return normalize(sinkhorn_launch_count(cfg)
                     + _topk_router_launches(cfg) * (1 - Fraction(backward, 2 * forward)))


def router_launch_count(cfg: Config) -> Number:
    """Kernels of one MoE layer's router forward for this config's router: the call sites' share
    of DeepSeek-V3's measured count (see ROUTER_SITES), and Sinkhorn's own kernels as counted."""
    return normalize(_topk_router_launches(cfg) + sinkhorn_launch_count(cfg))


def _topk_router_launches(cfg: Config) -> Fraction:
    """The top-k router's forward kernels: DeepSeek-V3's measured count (fused or not) times this
    router's share of its call sites (ROUTER_SITES)."""
    on = _router_features(cfg)
    sites = sum(count for name, count in ROUTER_SITES.items() if on[name])
    measured = ROUTER_MEASURED[1] if cfg.moe.moe_router_fusion else ROUTER_MEASURED[0]
    return Fraction(measured * sites, ROUTER_SITES_MEASURED)


def host_scale(cfg: Config) -> Number:
    """The host CPU's time per op over the reference x86 host's that the calibrated host time per
    launch is scaled by: efficiency.host_launch_scale (the bound figure; an unbound rank pays
    unbound_launch_s on top)."""
    return exact(cfg.cluster.efficiency.host_launch_scale)


def unbound_launch_s(cfg: Config) -> Number:
    """Seconds an unbound rank's host spends per bare op beyond a bound one's: the host's measured
    bare-op time less the reference host's at the bound scale, times the host's unbound share
    (planner/config/gpus.py HOSTS: one torch.nn.Linear forward timed on each host, NVIDIA/
    TransformerEngine issue #2053; Grace 37.08 µs against the Xeon's 13.48). An absolute extra per
    op, not a ratio on the calibrated figure: the calibrated time per launch holds Megatron's
    host work around the counted launches as well, and the measurement is of a bare op alone; the
    share comes from a whole-run measurement of binding (Megatron-LM's GB200 write-up,
    bench/grace_binding.py). 0 on a bound rank."""
    if cfg.cluster.host_numa_binding:
        return 0
    host = HOSTS[gpu(cfg.cluster.gpu).host]
    bound = Fraction(exact(cfg.cluster.efficiency.host_launch_scale))
    extra = host.bare_op_s - bound * HOSTS[REFERENCE_HOST].bare_op_s
    return normalize(max(Fraction(str(host.unbound_share)) * extra, Fraction(0)))


def fixed_cost_values(cfg: Config, cluster: dict[str, Number] | None = None) -> dict[str, Number]:
    """The fixed-cost, GEMM-shape and latency inputs of the time page (`cluster`: the cluster's
    own, `_cluster_values`)."""
    c = cluster or _cluster_values(cfg)
    return {
        "stack_factor": c["stack_factor"],
        "delay_wgrad": int(cfg.overlap.delay_wgrad_compute
                           and cfg.overlap.overlap_moe_expert_parallel_comm),
        "router_launches": router_launch_count(cfg),
        "router_nograd_launches": router_nograd_launch_count(cfg),
        "t_launch": c["t_launch"],
        "host_module_op": normalize(HOST_MODULE_OP),
        "host_module_fp8": HOST_MODULE_FP8,
        "t_kernel_gpu": c["t_kernel_gpu"],
        "host_scale": c["host_scale"],
        "t_unbound": c["t_unbound"],
        "t_host_block": c["t_host_block"],
        "t_host_expert": c["t_host_expert"],
        "t_host_microbatch": c["t_host_microbatch"],
        "t_step_fixed": c["t_step_fixed"],
        **graph_capture(cfg),
        "gemm_half": c["gemm_half"], "gemm_tile": c["gemm_tile"],
        "t_dispatch": normalize(Fraction(exact(dispatch_latency(cfg))) / 10**6),
        "t_coll": c["t_coll"],
        "inv_dispatch_sm_rate": dispatch_sm_seconds_per_byte(cfg),
        "cp_ring": int(cfg.parallel.cp_comm_type in ("p2p", "a2a+p2p")),
        "eff_attention_variant": exact(attention_variant_share(cfg)),
    }


def _hybridep(cfg: Config) -> bool:
    """HybridEP permutes inside its own dispatch kernels whatever moe_permute_fusion says
    (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py
    _HybridEPManager.dispatch calls hybrid_ep_dispatch with the routing map)."""
    moe = cfg.moe
    return moe.moe_token_dispatcher_type == "flex" and moe.moe_flex_dispatcher_backend == "hybridep"


def _priced_dispatcher(cfg: Config) -> str | None:
    """Which dispatcher's efficiency factors price the config's token exchange: alltoall, or the
    flex backend's (DeepEP v2 has no published figure of its own yet: it is priced as DeepEP);
    None for the rest (allgather, NCCL EP), which run at the link's rate with no fixed set-up."""
    moe = cfg.moe
    if moe.moe_token_dispatcher_type == "alltoall":
        return "alltoall"
    if moe.moe_token_dispatcher_type == "flex":
        return {"deepep": "deepep", "deepepv2": "deepep",
                "hybridep": "hybridep"}.get(moe.moe_flex_dispatcher_backend or "")
    return None


def dispatch_latency(cfg: Config) -> float:
    """The fixed microseconds per dispatch / combine call of the config's token dispatcher."""
    name = _priced_dispatcher(cfg)
    return getattr(cfg.cluster.efficiency, f"dispatch_latency_us_{name}") if name else 0.0


def dispatch_efficiency(cfg: Config) -> float:
    """The efficiency factor of the config's token dispatcher (its backend under flex)."""
    name = _priced_dispatcher(cfg)
    return getattr(cfg.cluster.efficiency, f"dispatch_{name}") if name else 1.0


def dispatch_sm_seconds_per_byte(cfg: Config) -> Number:
    """1 / (SMs x bytes/s per SM) of DeepEP's normal kernels, 0 for the other dispatchers.

    DeepEP copies each row with SM threads (one sending and one receiving SM per channel), on the
    SMs Megatron hands it (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py
    _DeepepManager.__init__: set_deepep_num_sms, 20 when moe_flex_dispatcher_num_sms is unset), so
    on one NVLink domain its exchange is SM-bound below the link's rate. HybridEP copies with TMA
    and NCCL's all-to-all with its own channels: no such bound is modelled for them."""
    if _priced_dispatcher(cfg) != "deepep":
        return 0
    eff = cfg.cluster.efficiency
    return normalize(Fraction(1) / (eff.deepep_num_sms * Fraction(exact(eff.deepep_gb_s_per_sm)) * GIGA))


def yarn_concentration(cfg: Config) -> float:
    """YaRN's concentration factor (its "mscale") that standard attention multiplies RoPE's cos
    and sin by: 0.1 · ln(rotary_scaling_factor) + 1 for a factor above 1, else 1. A GPT model
    trained with --position-embedding-type yarn takes --mscale 1 and --mscale-all-dim 0
    (Megatron-LM dev@d48bd6be megatron/training/argument_utils.py _apply_yarn_config_from_args),
    so the factor is _yarn_get_mscale(s, 1) / _yarn_get_mscale(s, 0) (megatron/core/models/common/
    embeddings/yarn_rotary_pos_embedding.py _yarn_get_concentration_factor); Megatron-Bridge leaves
    both unset, which gives the same figure. moeplan has no field for --mscale: a config that sets
    --mscale-all-dim equal to --mscale (factor 1) is priced as the default."""
    model = cfg.model
    if model.position_embedding_type != "yarn" or model.attention_variant != "standard":
        return 1.0
    scale = model.rotary_scaling_factor
    return 1.0 if scale <= 1 else 0.1 * math.log(scale) + 1.0


def rope_unfused(cfg: Config) -> bool:
    """Megatron applies RoPE by its unfused PyTorch path (Megatron-LM dev@d48bd6be
    megatron/core/models/common/embeddings/rope_utils.py apply_rotary_pos_emb; the bshd path is
    _apply_rotary_pos_emb_bshd): Transformer Engine's fused kernel takes no cos/sin multiplier, so
    a YaRN concentration factor other than 1 falls back ("te-rope-mscale"); --no-rope-fusion
    (training.apply_rope_fusion false) turns the fused kernel off for every rotary layer
    (megatron/core/transformer/attention.py and multi_latent_attention.py MLASelfAttention
    get_query_key_value_tensors branch on config.apply_rope_fusion), which the schema also resolves
    off where Megatron has no fused path (planner/config/schema.py rope_fusion_refused)."""
    rotary = cfg.model.position_embedding_type in ("rope", "yarn")
    return yarn_concentration(cfg) != 1.0 or (rotary and not cfg.training.apply_rope_fusion)

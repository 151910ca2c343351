"""The step-time model's inputs: the cluster's peaks and bandwidths, its efficiency factors and
the overlap flags the collectives table names (inputs of the time page).

The overlap symbols are made from the table itself: every distinct `overlap` flag of an entry in
planner/budget/collectives.py becomes one 0/1 input read from the config path it names, so a new
overlapped collective needs no change here.
"""

from __future__ import annotations

from fractions import Fraction
from functools import reduce
from typing import Any

from planner.budget.collectives import TABLE
from planner.budget.expr import Number, Symbol, exact, normalize
from planner.config.schema import Config

TERA, GIGA = 10**12, 10**9

OVERLAP_FLAGS: tuple[str, ...] = tuple(sorted({e.overlap for e in TABLE.values() if e.overlap}))


def overlap_symbol(flag: str) -> str:
    """The input naming one overlap flag: `overlap.overlap_grad_reduce` -> `on_overlap_grad_reduce`."""
    return "on_" + flag.rsplit(".", 1)[-1]


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
    Symbol("eff_attention", "share of the BF16 peak core attention reaches (efficiency.attention)"),
    Symbol("eff_intra", "share of the NVLink bandwidth a collective reaches (efficiency.intra_node)"),
    Symbol("eff_inter", "share of the scale-out bandwidth a collective reaches "
           "(efficiency.inter_node)"),
    Symbol("eff_hbm", "share of the HBM bandwidth streaming work reaches: GEMM weight and grad "
           "traffic, elementwise kernels, the optimizer step (efficiency.hbm)"),
    Symbol("eff_overlap", "share of an overlapped collective hidden behind compute "
           "(efficiency.overlap)"),
    Symbol("imbalance", "busiest rank's routed-expert load over the mean (efficiency."
           "routing_imbalance; 1 under forced balance)"),
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
    *(Symbol(overlap_symbol(flag), f"1 when {flag} is on (an overlap flag of the collectives "
             "table)") for flag in OVERLAP_FLAGS),
)


def _flag(cfg: Config, path: str) -> int:
    value: Any = reduce(getattr, path.split("."), cfg)
    return int(bool(value))


def hardware_values(cfg: Config) -> dict[str, Number]:
    c, eff = cfg.cluster, cfg.cluster.efficiency
    return {
        "peak_bf16": exact(c.peak_bf16_tflops) * TERA, "peak_fp8": exact(c.peak_fp8_tflops) * TERA,
        "fp8": int(cfg.training.fp8),
        "bw_nvlink": exact(c.intra_node_bandwidth_gb_s) * GIGA,
        "bw_scale_out": exact(c.inter_node_bandwidth_gb_s) * GIGA,
        "bw_hbm": exact(c.hbm_bandwidth_tb_s) * TERA,
        "eff_gemm_bf16": exact(eff.gemm_bf16), "eff_gemm_fp8": exact(eff.gemm_fp8),
        "eff_attention": exact(eff.attention), "eff_intra": exact(eff.intra_node),
        "eff_inter": exact(eff.inter_node), "eff_hbm": exact(eff.hbm),
        "eff_overlap": exact(eff.overlap), "imbalance": exact(eff.routing_imbalance),
        "t_non_gemm": normalize(Fraction(exact(eff.non_gemm_ns_per_token_block)) / GIGA),
        "non_gemm_passes": exact(eff.non_gemm_passes),
        "permute_fused": int(cfg.moe.moe_permute_fusion or _hybridep(cfg)),
        "eff_permute_unfused": exact(eff.permute_unfused),
        "eff_dispatch": exact(dispatch_efficiency(cfg)),
        **{overlap_symbol(flag): _flag(cfg, flag) for flag in OVERLAP_FLAGS},
    }


def _hybridep(cfg: Config) -> bool:
    """HybridEP permutes inside its own dispatch kernels whatever moe_permute_fusion says
    (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py
    _HybridEPManager.dispatch calls hybrid_ep_dispatch with the routing map)."""
    moe = cfg.moe
    return moe.moe_token_dispatcher_type == "flex" and moe.moe_flex_dispatcher_backend == "hybridep"


def dispatch_efficiency(cfg: Config) -> float:
    """The efficiency factor of the config's token dispatcher (its backend under flex)."""
    eff, moe = cfg.cluster.efficiency, cfg.moe
    if moe.moe_token_dispatcher_type == "alltoall":
        return eff.dispatch_alltoall
    if moe.moe_token_dispatcher_type == "flex":
        backend = moe.moe_flex_dispatcher_backend
        return {"deepep": eff.dispatch_deepep, "hybridep": eff.dispatch_hybridep}.get(backend, 1.0)
    return 1.0

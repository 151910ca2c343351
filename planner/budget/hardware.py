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
from planner.schema import Config

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
    Symbol("eff_hbm", "share of the HBM bandwidth the optimizer step reaches (efficiency.hbm)"),
    Symbol("eff_overlap", "share of an overlapped collective hidden behind compute "
           "(efficiency.overlap)"),
    Symbol("imbalance", "busiest rank's routed-expert load over the mean (efficiency."
           "routing_imbalance; 1 under forced balance)"),
    Symbol("t_non_gemm", "seconds per token and block outside GEMMs and attention, forward and "
           "backward (efficiency.non_gemm_ns_per_token_block)"),
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
        **{overlap_symbol(flag): _flag(cfg, flag) for flag in OVERLAP_FLAGS},
    }

"""Page 5, gradient scaling: the pre-scale factors applied before the gradient reductions."""

from __future__ import annotations

from planner.budget.expr import Book
from planner.budget.symbols import Variant

PAGE = "scaling"


def write(book: Book, v: Variant) -> None:
    """Gradient pre-scale factors (Megatron-LM dev@d48bd6be megatron/core/distributed/
    distributed_data_parallel.py gradient_scaling_factor / expert_gradient_scaling_factor; the GTP
    R_e/R correction of Megatron-LM main@d98e8a64, PR #7165)."""
    add = book.add
    add("gtp_expert_correction", "EGTP / GTP", "ratio", "scaling",
        "R_e/R: expert pre-scale correction when GTP != EGTP")
    if v.per_token_loss:
        add("grad_scale_sum_dense", "1", "ratio", "scaling", "per-token loss: SUM, no pre-scale")
        add("grad_scale_sum_expert", "1", "ratio", "scaling", "per-token loss: SUM, no pre-scale")
        add("grad_scale_per_token", "1 / tokens_per_step", "ratio", "scaling",
            "final scale by the valid tokens of the step (all tokens valid)")
        return
    add("grad_scale_sum_dense", "1 / dp_cp_size", "ratio", "scaling",
        "dense pre-scale before a SUM over dp_cp")
    add("grad_scale_sum_expert", "1 / dp_cp_size * EGTP / GTP", "ratio", "scaling",
        "expert pre-scale before a SUM over expt_dp: the same 1/|DP×CP| (× R_e/R)")
    add("grad_scale_avg_dense", "1", "ratio", "scaling", "dense pre-scale before an AVG over dp_cp")
    add("grad_scale_avg_expert", "expert_dp / dp_cp_size * EGTP / GTP", "ratio", "scaling",
        "expert pre-scale before an AVG over expt_dp (the AVG then divides by |EDP|)")
    add("grad_scale_total_dense", "grad_scale_sum_dense / GTP", "ratio", "scaling",
        "net dense scale after the GTP completion (mean over all data ranks)")
    add("grad_scale_total_expert", "grad_scale_sum_expert / EGTP", "ratio", "scaling",
        "net expert scale after the EGTP completion; equals the dense one")

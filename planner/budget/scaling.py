"""Page 5, gradient scaling: the pre-scale factors applied before the gradient reductions."""

from __future__ import annotations

from planner.budget.expr import Book
from planner.budget.variant import Variant

PAGE = "scaling"


def write(book: Book, v: Variant) -> None:
    """Gradient pre-scale factors (Megatron-LM dev@d48bd6be megatron/core/distributed/
    distributed_data_parallel.py gradient_scaling_factor / expert_gradient_scaling_factor; the GTP
    R_e/R correction of Megatron-LM main@d98e8a64, PR #7165)."""
    add = book.add
    _add_buffer_split(book, v)
    _add_loss_scales(book, v)
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


# --- the grad-buffer split and the loss-scale chain, as budgets the runtime reads


def _add_buffer_split(book: Book, v: Variant) -> None:
    """Whether routed experts are reduced in a buffer of their own (Degrees.expert_grad_buffer):
    1 when the expert grid differs from the dense one, 0 when they share the dense buffer."""
    book.add("expert_grad_buffers", "1" if v.expert_buffer else "0", "count", "scaling",
             "routed-expert grad buffers reduced over expt_dp: 1 when EP > 1, ETP != TP or EGTP != GTP"
             " (Megatron-LM main@d98e8a64 megatron/core/extensions/transformer_engine.py "
             "TELinear.__init__ use_expert_pgs), else 0: the experts share the dense buffer")


def _add_loss_scales(book: Book, v: Variant) -> None:
    """What each microbatch's losses are multiplied by before backward (Megatron-LM dev@d48bd6be
    megatron/core/pipeline_parallel/schedules.py forward_step: `output_tensor /= num_microbatches`
    unless calculate_per_token_loss, and MTPLossAutoScaler.set_loss_scale(loss_scale /
    num_microbatches)); chained with the pre-scales above it makes the mean over the global batch.
    The fp16 dynamic loss scale (grad_scale_func) is a runtime state, not a budget."""
    if v.per_token_loss:
        book.add("loss_scale_microbatch", "1", "ratio", "scaling",
                 "per-token loss: each microbatch's token-loss sum is backpropagated unscaled")
        book.add("loss_scale_mtp", "1", "ratio", "scaling",
                 "per-token loss: the MTP loss term is backpropagated unscaled")
        return
    book.add("loss_scale_microbatch", "1 / microbatches", "ratio", "scaling",
             "1/m: each microbatch's mean token loss is divided by the microbatches of the step")
    book.add("loss_scale_mtp", "1 / microbatches", "ratio", "scaling",
             "1/m: the MTP loss term, scaled like the main loss (MTPLossAutoScaler)")

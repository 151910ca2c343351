"""Page 7, step time: what one rank of a stage spends per optimizer step, as named formulas.

The model is analytical and calibrated, not measured: GEMMs take their Megatron FLOPs (the flops
page; recompute's extra forwards included) at the catalog peak times a GEMM efficiency; core
attention at the BF16 peak times an attention efficiency; every collective of the collectives table
takes its per-step wire bytes of this rank (the comm page), the intra-NVLink-domain part over
NVLink and the rest over the scale-out network, each at its bandwidth times a communication
efficiency, the slower of the two setting its time. A collective whose table entry names an
overlap flag that the config sets is hidden behind compute up to `eff_overlap` of itself (never
more than the compute there is); the rest is exposed. The optimizer step streams the rank's
weights, grads and optimizer state through HBM once. The pipeline bubble and the stage's step need
the other stages' chunk times, so they are formulas of planner/estimate.py, evaluated after this
page on every stage (and on the stages' first and last model chunks alone).

Work per rank: a microbatch of b·S tokens of one replica is spread over its TP·CP ranks (dense
layers by TP and CP, routed experts over the EP group, whose ranks each carry the same share of
assignments under balanced routing), so each rank computes the stage's FLOPs of b·S/(TP·CP)
tokens; `imbalance` scales the routed-expert share for the busiest rank.
"""

from __future__ import annotations

from planner.budget.collectives import TABLE
from planner.budget.expr import Book, ident
from planner.budget.hardware import overlap_symbol
from planner.budget.symbols import Variant

PAGE = "time"

# Selective recompute modules whose forward the backward re-runs, per layer kind they cover
# (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py recompute_modules).
SELECTIVE = {"core_attn": "attention_core", "moe": "moe", "mlp": "dense"}


def write(book: Book, v: Variant) -> None:
    add = book.add
    add("time_tokens_per_rank", "b * S / (TP * CP)", "tokens", "time",
        "tokens of one microbatch whose compute one rank carries (dense by TP·CP, experts "
        "balanced over the EP group)")
    add("time_gemm_rate", "(1 - fp8) * peak_bf16 * eff_gemm_bf16 + fp8 * peak_fp8 * eff_gemm_fp8",
        "FLOP/s", "time", "reached GEMM rate of the linear layers (FP8 peak under FP8)")
    add("time_bf16_rate", "peak_bf16 * eff_gemm_bf16", "FLOP/s", "time",
        "reached BF16 GEMM rate (the output layer stays BF16 under FP8)")
    add("time_attention_rate", "peak_bf16 * eff_attention", "FLOP/s", "time",
        "reached rate of core (flash) attention")
    _kinds(book, v)
    _compute(book)
    exposed = _communication(book, v)
    add("time_exposed_comm_s", " + ".join(exposed) or "0", "s", "time",
        "communication left on the critical path per step (every collective of the table)")
    add("time_busy_s", "time_compute_s + time_exposed_comm_s", "s", "time",
        "compute and exposed communication of all microbatches of the step")
    add("time_microbatch_s", "time_busy_s / microbatches", "s", "time",
        "one microbatch through every model chunk of the stage, forward and backward: the "
        "pipeline's unit of work (planner/estimate.py sums other stages' chunks of it into the "
        "bubble)")
    add("time_optimizer_s", "(weight_bytes + grad_bytes + 2 * optimizer_bytes) / (bw_hbm * eff_hbm)",
        "s", "time", "optimizer step: read grads and state, write state and weights once (HBM)")


def _kinds(book: Book, v: Variant) -> None:
    """Forward FLOPs per token by kind, and the extra forward FLOPs recompute runs again."""
    add = book.add
    core = "0" if v.attention == "dsv4_hybrid" else "blocks * flops_attention_core_fwd_per_token"
    core_rc = ("0" if v.attention == "dsv4_hybrid"
               else "blocks_recomputed * flops_attention_core_fwd_per_token")
    add("time_attention_core_fwd_flops", core, "FLOP", "time",
        "core attention of the stage per token (V4's sparse attention counts as GEMMs)")
    add("time_attention_linear_fwd_flops",
        "stage_attention_fwd_flops_per_token - time_attention_core_fwd_flops", "FLOP", "time",
        "attention projections of the stage per token")
    extra = {"attention_core": core_rc, "moe": "L_moe_recomputed * flops_moe_mlp_fwd_per_token",
             "dense": "L_dense_recomputed * flops_dense_mlp_fwd_per_token"}
    whole = {"attention_core": "time_attention_core_fwd_flops",
             "moe": "stage_moe_fwd_flops_per_token", "dense": "stage_dense_fwd_flops_per_token"}
    for module, kind in SELECTIVE.items():
        if v.recompute == "selective" and module in v.recompute_modules:
            extra[kind] = whole[kind]
    add("time_recompute_attention_core_flops", extra["attention_core"], "FLOP", "time",
        "core attention forward recompute runs again per token")
    add("time_recompute_attention_linear_flops",
        "stage_recompute_fwd_flops_per_token - L_moe_recomputed * flops_moe_mlp_fwd_per_token"
        f" - L_dense_recomputed * flops_dense_mlp_fwd_per_token - ({core_rc})", "FLOP", "time",
        "attention projections full recompute runs again per token")
    add("time_recompute_moe_flops", extra["moe"], "FLOP", "time",
        "MoE MLP forward recompute runs again per token")
    add("time_recompute_dense_flops", extra["dense"], "FLOP", "time",
        "dense MLP forward recompute runs again per token")


def _compute(book: Book) -> None:
    add = book.add
    per_step = "microbatches * time_tokens_per_rank"
    add("time_attention_gemm_s", f"{per_step} * (3 * time_attention_linear_fwd_flops"
        " + time_recompute_attention_linear_flops) / time_gemm_rate", "s", "time",
        "attention projections: forward, data and weight gradients, and recompute")
    add("time_attention_core_s", f"{per_step} * (3 * time_attention_core_fwd_flops"
        " + time_recompute_attention_core_flops) / time_attention_rate", "s", "time",
        "core attention: forward, backward (Megatron's 3x) and recompute")
    add("time_moe_gemm_s", f"{per_step} * (3 * stage_moe_fwd_flops_per_token"
        " + time_recompute_moe_flops) * imbalance / time_gemm_rate", "s", "time",
        "MoE MLPs (routed and shared experts) of the busiest rank, recompute included")
    add("time_dense_gemm_s", f"{per_step} * (3 * stage_dense_fwd_flops_per_token"
        " + time_recompute_dense_flops) / time_gemm_rate", "s", "time",
        "dense MLPs, recompute included")
    add("time_head_gemm_s", f"{per_step} * 3 * stage_head_fwd_flops_per_token / time_bf16_rate",
        "s", "time", "logits and MTP projections (BF16)")
    add("time_non_gemm_s", f"{per_step} * (blocks + blocks_recomputed / 3) * t_non_gemm", "s", "time",
        "work outside GEMMs and attention (norms, router, permutations, activations, launches), "
        "per token and block; a recomputed block's forward (a third) again")
    add("time_compute_s", "time_attention_gemm_s + time_attention_core_s + time_moe_gemm_s"
        " + time_dense_gemm_s + time_head_gemm_s + time_non_gemm_s", "s", "time",
        "all compute of the step")


def _communication(book: Book, v: Variant) -> list[str]:
    """One time per collective and phase the comm page priced; exposed per its overlap flag."""
    add, exposed = book.add, []
    for entry in TABLE.values():
        for phase in entry.phases:
            base = f"step.{entry.name}.{phase}"
            if ident(f"{base}.intra_node_bytes") not in book.levels:
                continue
            name = add(f"time.{entry.name}.{phase}",
                       f"Max(step_{ident(entry.name)}_{phase}_intra_node_bytes / (bw_nvlink * eff_intra),"
                       f" step_{ident(entry.name)}_{phase}_inter_node_bytes / (bw_scale_out * eff_inter))"
                       + (" * imbalance" if entry.routed_rows else ""),
                       "s", "time", f"{entry.name} {phase}: NVLink-domain bytes over NVLink, the rest "
                       "over the scale-out network, the slower setting the time")
            if entry.overlap:
                flag = overlap_symbol(entry.overlap)
                name = add(f"time.{entry.name}.{phase}.exposed",
                           f"{name} - {flag} * Min(eff_overlap * {name}, time_compute_s)", "s", "time",
                           f"the part not hidden behind compute ({entry.overlap})")
            exposed.append(name)
    return exposed

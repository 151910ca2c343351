"""MOE030-MOE032: the flex dispatcher's fourth backend (DeepEP v2, dev only) and NCCL EP's
zero-copy path (main only), each with the limits its manager enforces."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import dev, main

DEEPEPV2_MANAGER = dev("core/transformer/moe/token_dispatcher.py", "_DeepepV2Manager.dispatch")
ZERO_COPY = main("core/transformer/moe/token_dispatcher.py", "_NCCLEPManager.__init__")
ZERO_COPY_BOOTSTRAP = main("core/transformer/moe/token_dispatcher.py",
                           "_NCCLEPManager._ensure_bootstrap")
_V2 = "moe: {moe_token_dispatcher_type: flex, moe_flex_dispatcher_backend: deepepv2"
_ZC = ("moe: {moe_token_dispatcher_type: flex, moe_flex_dispatcher_backend: ncclep, "
       "moe_ncclep_zero_copy: true")


@rule(
    "MOE030", "warning", "the deepepv2 backend takes fp32 routing probabilities",
    source=DEEPEPV2_MANAGER,
    why="""DeepEP v2's ElasticBuffer dispatch accepts only float32 probabilities; with the router's
    default dtype the probs are bf16, so every dispatch casts them to fp32 and Megatron logs a
    warning each time (the dev branch's fourth flex backend, beside deepep, hybridep and ncclep;
    main has no deepepv2).""",
    bad=_V2 + "}",
    good=_V2 + "}\nmodel: {moe_router_dtype: fp32}",
)
def deepepv2_fp32_probs(f: Facts) -> Iterator[Violation]:
    if f.flex_backend == "deepepv2" and f.model.moe_router_dtype is None:
        yield Violation("model.moe_router_dtype", "flex backend deepepv2 with bf16 routing probs "
                        "(moe_router_dtype unset): cast to fp32 at every dispatch",
                        "set model.moe_router_dtype: fp32")


@rule(
    "MOE031", "error", "NCCL EP zero-copy needs the ncclep backend and a rank capacity factor",
    source=ZERO_COPY,
    why="""The zero-copy path writes FC2 outputs and FC1 input grads straight into fixed
    [receive capacity, hidden] symmetric-memory buffers, so it needs the static receive budget
    moe_expert_rank_capacity_factor sets; without it (eager mode) Megatron raises, and no other
    backend reads the flag. Only Megatron-LM main has it (dev's moe_ncclep_use_symm_mem is
    refused and dev bootstraps NCCL EP with zero_copy=False).""",
    bad=_ZC + "}",
    good=_ZC + ", moe_expert_rank_capacity_factor: 1.5}",
)
def zero_copy_needs_static_ncclep(f: Facts) -> Iterator[Violation]:
    if not f.moe.moe_ncclep_zero_copy:
        return
    if f.flex_backend != "ncclep":
        yield Violation("moe.moe_ncclep_zero_copy", f"moe_ncclep_zero_copy with the "
                        f"{f.flex_backend or f.moe.moe_token_dispatcher_type} dispatcher backend",
                        "use moe_token_dispatcher_type: flex with moe_flex_dispatcher_backend: ncclep")
    elif f.moe.moe_expert_rank_capacity_factor is None:
        yield Violation("moe.moe_expert_rank_capacity_factor",
                        "moe_ncclep_zero_copy without moe_expert_rank_capacity_factor",
                        "set moe.moe_expert_rank_capacity_factor, e.g. 1.5")


@rule(
    "MOE032", "warning", "NCCL EP zero-copy with batch-level EP overlap copies every dispatch grad",
    source=ZERO_COPY_BOOTSTRAP,
    why="""The 1F1B EP-overlap schedule detaches the dispatch input, so the dispatch backward
    receives a gradient outside symmetric memory and Megatron stages it into the zero-copy buffer
    with one extra copy per dispatch backward (it warns once).""",
    bad=_ZC + ", moe_expert_rank_capacity_factor: 1.5}\noverlap: {overlap_moe_expert_parallel_comm: true}",
    good=_ZC + ", moe_expert_rank_capacity_factor: 1.5}",
)
def zero_copy_with_ep_overlap(f: Facts) -> Iterator[Violation]:
    if f.moe.moe_ncclep_zero_copy and f.flex_backend == "ncclep" and \
            f.ovl.overlap_moe_expert_parallel_comm:
        yield Violation("overlap.overlap_moe_expert_parallel_comm",
                        "moe_ncclep_zero_copy with overlap_moe_expert_parallel_comm: one extra copy "
                        "of the dispatch gradient per backward", "accept the copy, or turn one off")


@rule(
    "MOE034", "warning", "NCCL EP's static receive capacity holds the busiest rank's rows",
    source=dev("core/transformer/moe/token_dispatcher.py", "_NCCLEPManager._ensure_bootstrap"),
    why="""NCCL EP fixes its receive buffer at the first dispatch: ceil64(local tokens) · ETP·k ·
    moe_expert_rank_capacity_factor rows. Routing skew sends the busiest rank more than the mean
    n·k·ETP; at the stated quantile (efficiency.routing_quantile, on top of routing_imbalance) it
    needs hot_gemm_rows, and a capacity below that overflows the static buffer on that rank.""",
    bad="moe: {" + "moe_token_dispatcher_type: flex, moe_flex_dispatcher_backend: ncclep, "
        "moe_expert_rank_capacity_factor: 1.0}",
    good="moe: {" + "moe_token_dispatcher_type: flex, moe_flex_dispatcher_backend: ncclep, "
         "moe_expert_rank_capacity_factor: 1.5}",
)
def ncclep_capacity_holds_the_hot_rank(f: Facts) -> Iterator[Violation]:
    rows = f.ncclep_receive_rows
    if rows is not None and rows["ncclep_recv_rows"] < rows["hot_gemm_rows"]:
        need = rows["hot_gemm_rows"]
        yield Violation("moe.moe_expert_rank_capacity_factor",
                        f"receive capacity {rows['ncclep_recv_rows']} rows < the busiest rank's "
                        f"{need} at the stated quantile", "raise moe_expert_rank_capacity_factor "
                        "(or lower efficiency.routing_quantile / routing_imbalance if the skew is known)")


RULES = (deepepv2_fp32_probs, zero_copy_needs_static_ncclep, zero_copy_with_ep_overlap,
         ncclep_capacity_holds_the_hot_rank)

"""OVL: communication/computation overlap switches and what each one requires."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import TRANSFORMER_CONFIG, VALIDATE_ARGS, dev

EP_OVERLAP = "overlap.overlap_moe_expert_parallel_comm"
_OVERLAP_ON = "overlap: {overlap_moe_expert_parallel_comm: true}"
_PP1 = "parallel: {pp: 1}"


def _ep_overlap(f: Facts) -> bool:
    return f.ovl.overlap_moe_expert_parallel_comm


@rule(
    "OVL001", "error", "shared-expert overlap and batch-level EP overlap are exclusive",
    source=TRANSFORMER_CONFIG,
    why="""Both schedule the shared expert's computation against the EP all-to-all: the
    shared-expert overlap within one microbatch, the batch-level overlap across two. Megatron
    allows only one of them.""",
    bad="""
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, moe_shared_expert_overlap: true}
    """,
    good="""
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, moe_shared_expert_overlap: false}
    """,
)
def shared_overlap_exclusive(f: Facts) -> Iterator[Violation]:
    if _ep_overlap(f) and f.ovl.moe_shared_expert_overlap:
        yield Violation("overlap.moe_shared_expert_overlap",
                        "moe_shared_expert_overlap and overlap_moe_expert_parallel_comm are both on",
                        "turn one of them off")


@rule(
    "OVL002", "error", "batch-level EP overlap needs EP > 1",
    source=TRANSFORMER_CONFIG,
    why="""overlap_moe_expert_parallel_comm hides the EP all-to-all behind another microbatch's
    compute; with EP = 1 there is no all-to-all to hide.""",
    bad=_OVERLAP_ON + "\nparallel: {pp: 1, ep: 1}",
    good=_OVERLAP_ON + "\nparallel: {pp: 1, ep: 4}",
)
def ep_overlap_needs_ep(f: Facts) -> Iterator[Violation]:
    if _ep_overlap(f) and f.par.ep == 1:
        yield Violation(EP_OVERLAP, "overlap_moe_expert_parallel_comm is on but ep is 1",
                        "raise parallel.ep or turn the overlap off")


@rule(
    "OVL003", "error", "batch-level EP overlap with PP > 1 needs VPP",
    source=TRANSFORMER_CONFIG,
    why="""With pipelining, the overlap pairs the forward of one model chunk with the backward of
    another on the same rank, which only the interleaved (VPP) schedule provides.""",
    bad=_OVERLAP_ON,
    good=_OVERLAP_ON + "\nparallel: {vpp: 2}",
)
def ep_overlap_needs_vpp(f: Facts) -> Iterator[Violation]:
    if _ep_overlap(f) and f.par.pp > 1 and not f.asks_for_virtual_stages:
        yield Violation(EP_OVERLAP, f"overlap_moe_expert_parallel_comm with pp {f.par.pp} and no "
                        "virtual pipeline stages", "set parallel.vpp >= 2 or a layout with "
                        "several stages per rank")


@rule(
    "OVL004", "error", "batch-level EP overlap needs the alltoall or flex dispatcher",
    source=TRANSFORMER_CONFIG,
    why="""The overlap splits dispatch and combine into separately scheduled all-to-alls; the
    allgather dispatcher has no such phases.""",
    bad=_OVERLAP_ON + "\n" + _PP1 + "\nmoe: {moe_token_dispatcher_type: allgather}",
    good=_OVERLAP_ON + "\n" + _PP1 + "\nmoe: {moe_token_dispatcher_type: alltoall}",
)
def ep_overlap_needs_a2a(f: Facts) -> Iterator[Violation]:
    kind = f.moe.moe_token_dispatcher_type
    if _ep_overlap(f) and kind not in ("alltoall", "flex"):
        yield Violation("moe.moe_token_dispatcher_type",
                        f"overlap_moe_expert_parallel_comm with the {kind} dispatcher",
                        "use moe_token_dispatcher_type alltoall or flex")


@rule(
    "OVL005", "error", "delay_wgrad_compute needs batch-level EP overlap",
    source=TRANSFORMER_CONFIG,
    why="""Delaying the weight-gradient GEMMs (dW = Xᵀ·Ȳ) only pays off when the overlap schedule
    fills the gap they leave; Megatron requires overlap_moe_expert_parallel_comm.""",
    bad="overlap: {delay_wgrad_compute: true}",
    good="""
    parallel: {pp: 1}
    overlap: {delay_wgrad_compute: true, overlap_moe_expert_parallel_comm: true}
    """,
)
def delay_wgrad_needs_overlap(f: Facts) -> Iterator[Violation]:
    if f.ovl.delay_wgrad_compute and not _ep_overlap(f):
        yield Violation("overlap.delay_wgrad_compute",
                        "delay_wgrad_compute is on but overlap_moe_expert_parallel_comm is off",
                        "turn on overlap.overlap_moe_expert_parallel_comm or drop delay_wgrad_compute")


@rule(
    "OVL006", "error", "shared-expert overlap needs the alltoall or flex dispatcher",
    source=TRANSFORMER_CONFIG,
    why="""The shared expert is overlapped with the dispatcher's all-to-all (token A2A → shared
    FC1 → probability A2A); the allgather dispatcher offers no such slots.""",
    bad="""
    moe: {moe_token_dispatcher_type: allgather}
    overlap: {moe_shared_expert_overlap: true}
    """,
    good="""
    moe: {moe_token_dispatcher_type: alltoall}
    overlap: {moe_shared_expert_overlap: true}
    """,
)
def shared_overlap_needs_a2a(f: Facts) -> Iterator[Violation]:
    kind = f.moe.moe_token_dispatcher_type
    if f.ovl.moe_shared_expert_overlap and kind not in ("alltoall", "flex"):
        yield Violation("moe.moe_token_dispatcher_type",
                        f"moe_shared_expert_overlap with the {kind} dispatcher",
                        "use moe_token_dispatcher_type alltoall or flex")


@rule(
    "OVL007", "error", "batch-level EP overlap needs bf16 or fp16",
    source=TRANSFORMER_CONFIG,
    why="The overlap schedule is implemented for half-precision training only.",
    bad=_OVERLAP_ON + "\n" + _PP1 + "\ntraining: {precision: fp32}",
    good=_OVERLAP_ON + "\n" + _PP1 + "\ntraining: {precision: bf16}",
)
def ep_overlap_needs_half_precision(f: Facts) -> Iterator[Violation]:
    if _ep_overlap(f) and f.train.precision not in ("bf16", "fp16"):
        yield Violation("training.precision",
                        f"overlap_moe_expert_parallel_comm with precision {f.train.precision}",
                        "use precision bf16 or fp16, or turn the overlap off")


@rule(
    "OVL008", "error", "batch-level EP overlap excludes recomputing 'moe'",
    source=TRANSFORMER_CONFIG,
    why="""Recomputing the whole MoE module re-runs routing and both all-to-alls inside backward,
    which breaks the overlap's pairing of communication with the other microbatch.""",
    bad="""
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, recompute_granularity: selective,
              recompute_modules: [moe]}
    """,
    good="""
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, recompute_granularity: selective,
              recompute_modules: [moe_act]}
    """,
)
def ep_overlap_without_moe_recompute(f: Facts) -> Iterator[Violation]:
    if _ep_overlap(f) and "moe" in (f.ovl.recompute_modules or []):
        yield Violation("overlap.recompute_modules",
                        "overlap_moe_expert_parallel_comm with 'moe' in recompute_modules",
                        "recompute finer modules such as moe_act, or turn the overlap off")


@rule(
    "OVL009", "error", "full recompute needs recompute_method and recompute_num_layers",
    source=TRANSFORMER_CONFIG,
    why="""Full recompute re-runs whole groups of blocks: recompute_method says how the blocks are
    grouped (uniform: every recompute_num_layers blocks; block: the first recompute_num_layers
    of each stage), and Megatron refuses full granularity without both. Under `uniform` the count
    must be at least 1: Megatron's loop over the groups (megatron/core/transformer/transformer_block.py
    TransformerBlock._checkpointed_forward) advances by recompute_num_layers, so 0 never ends it and
    the first step hangs; under `block`, 0 recomputes no block.""",
    bad="overlap: {recompute_granularity: full}",
    good="overlap: {recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1}",
)
def full_recompute_needs_method(f: Facts) -> Iterator[Violation]:
    if f.ovl.recompute_granularity != "full":
        return
    if f.ovl.recompute_method is None:
        yield Violation("overlap.recompute_method", "recompute_granularity full without recompute_method",
                        "set overlap.recompute_method: uniform (or block)")
    if f.ovl.recompute_num_layers is None:
        yield Violation("overlap.recompute_num_layers",
                        "recompute_granularity full without recompute_num_layers",
                        "set overlap.recompute_num_layers, e.g. 1 (every block recomputed on its own)")
    elif f.ovl.recompute_num_layers == 0 and f.ovl.recompute_method == "uniform":
        yield Violation("overlap.recompute_num_layers",
                        "recompute_method uniform with recompute_num_layers 0: Megatron's group loop "
                        "advances by 0 blocks and the first step never ends",
                        "set overlap.recompute_num_layers to 1 or more (or recompute_method: block, "
                        "where 0 recomputes no block)")


@rule(
    "OVL010", "error", "selective recompute takes no recompute_method or recompute_num_layers",
    source=VALIDATE_ARGS + "; " + TRANSFORMER_CONFIG,
    why="""Selective recompute re-runs the chosen modules (recompute_modules) inside every block;
    there are no block groups to pick, and Megatron refuses a recompute_method or
    recompute_num_layers with it instead of ignoring them.""",
    bad="overlap: {recompute_granularity: selective, recompute_method: uniform}",
    good="overlap: {recompute_granularity: selective, recompute_modules: [core_attn]}",
)
def selective_recompute_without_method(f: Facts) -> Iterator[Violation]:
    if f.ovl.recompute_granularity != "selective":
        return
    for name in ("recompute_method", "recompute_num_layers"):
        value = getattr(f.ovl, name)
        if value is not None:
            yield Violation(f"overlap.{name}", f"recompute_granularity selective with {name} {value}",
                            f"remove overlap.{name}, or use recompute_granularity: full")


@rule(
    "OVL011", "error", "batch-level EP overlap supports at most one MTP layer",
    source=TRANSFORMER_CONFIG,
    why="""The overlap schedule pairs one MTP block with the other microbatch's work; Megatron
    refuses overlap_moe_expert_parallel_comm with more than one MTP layer.""",
    bad="""
    model: {mtp_num_layers: 2}
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true}
    """,
    good="""
    model: {mtp_num_layers: 1}
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true}
    """,
)
def ep_overlap_single_mtp_layer(f: Facts) -> Iterator[Violation]:
    if _ep_overlap(f) and f.model.mtp_num_layers > 1:
        yield Violation("model.mtp_num_layers",
                        f"overlap_moe_expert_parallel_comm with mtp_num_layers {f.model.mtp_num_layers}",
                        "use mtp_num_layers: 1 or turn the overlap off")


@rule(
    "OVL012", "error", "MTP with uniform full recompute needs recompute_num_layers 1",
    source=dev("core/transformer/multi_token_prediction.py",
               "MultiTokenPredictionLayer._checkpointed_forward"),
    why="""Under full recompute every MTP block is checkpointed on its own; with the uniform method
    Megatron asserts recompute_num_layers == 1 in the MTP layer's first training forward (and at
    start-up when the batch-level EP overlap is on).""",
    bad="""
    model: {mtp_num_layers: 1}
    overlap: {recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 2}
    """,
    good="""
    model: {mtp_num_layers: 1}
    overlap: {recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1}
    """,
)
def mtp_uniform_recompute_one_layer(f: Facts) -> Iterator[Violation]:
    o = f.ovl
    if (f.model.mtp_num_layers and o.recompute_granularity == "full"
            and o.recompute_method == "uniform" and (o.recompute_num_layers or 1) != 1):
        yield Violation("overlap.recompute_num_layers",
                        f"mtp_num_layers {f.model.mtp_num_layers} with uniform full recompute of "
                        f"recompute_num_layers {o.recompute_num_layers}",
                        "set overlap.recompute_num_layers: 1, or recompute_method: block")


@rule(
    "OVL013", "error", "batch-level EP overlap with full recompute needs dropout 0",
    source=TRANSFORMER_CONFIG,
    why="""Under overlap_moe_expert_parallel_comm the full-recompute replay is scheduled by hand
    across the interleaved microbatches, so the forward RNG stream cannot be replayed: Megatron
    asserts attention_dropout == 0 and hidden_dropout == 0 (its defaults are 0.1).""",
    bad="""
    model: {hidden_dropout: 0.1, attention_dropout: 0.1}
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, recompute_granularity: full,
              recompute_method: uniform, recompute_num_layers: 1}
    """,
    good="""
    model: {hidden_dropout: 0.0, attention_dropout: 0.0}
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, recompute_granularity: full,
              recompute_method: uniform, recompute_num_layers: 1}
    """,
)
def ep_overlap_full_recompute_without_dropout(f: Facts) -> Iterator[Violation]:
    if not (_ep_overlap(f) and f.ovl.recompute_granularity == "full"):
        return
    for name in ("hidden_dropout", "attention_dropout"):
        value = getattr(f.model, name)
        if value:
            yield Violation(f"model.{name}",
                            f"{name} {value} with overlap_moe_expert_parallel_comm and full recompute",
                            f"set model.{name}: 0.0, or drop full recompute")


@rule(
    "OVL014", "error", "batch-level EP overlap without full recompute takes no recompute method",
    source=TRANSFORMER_CONFIG,
    why="""Outside full recompute the overlap schedule has no layer grouping to control, and
    Megatron asserts recompute_method and recompute_num_layers are unset when
    overlap_moe_expert_parallel_comm is on.""",
    bad="""
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true, recompute_num_layers: 1}
    """,
    good="""
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true}
    """,
)
def ep_overlap_without_recompute_method(f: Facts) -> Iterator[Violation]:
    if not _ep_overlap(f) or f.ovl.recompute_granularity == "full":
        return
    for name in ("recompute_method", "recompute_num_layers"):
        value = getattr(f.ovl, name)
        if value is not None:
            yield Violation(f"overlap.{name}",
                            f"{name} {value} with overlap_moe_expert_parallel_comm and "
                            + (f"recompute_granularity {f.ovl.recompute_granularity}"
                               if f.ovl.recompute_granularity else "no full recompute"),
                            f"remove overlap.{name}, or use recompute_granularity: full")


_GRAPHS = ("local", "transformer_engine")
GRAPH_SCOPE = "overlap.cuda_graph_scope"
# Megatron-LM dev@d48bd6be megatron/core/transformer/enums.py CudaGraphModule, plus the names
# megatron/core/transformer/cuda_graph_config.py normalize_cuda_graph_modules maps elsewhere.
GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
GRAPH_SCOPE_NAMES = (*GRAPH_MODULES, "full", "full_iteration", "full_iteration_inference")
_TE_GRAPHS = "overlap: {cuda_graph_impl: transformer_engine, cuda_graph_scope: [%s]}"
_DROP_PAD = "moe: {moe_expert_capacity_factor: 1.0, moe_pad_expert_input_to_capacity: true}"


def _graph_scopes(f: Facts) -> set[str]:
    """The scopes of per-layer CUDA graphs, or nothing when no graphs are captured."""
    return set(f.ovl.cuda_graph_scope) if f.ovl.cuda_graph_impl in _GRAPHS else set()


def _drop_and_pad(f: Facts) -> bool:
    return f.moe.moe_expert_capacity_factor is not None and f.moe.moe_pad_expert_input_to_capacity


@rule(
    "OVL015", "error", "the `moe` CUDA-graph scope needs drop-and-pad",
    source=TRANSFORMER_CONFIG,
    why="""A graph replays fixed shapes. A whole MoE layer has fixed shapes only when every expert
    receives exactly its capacity (a capacity factor with moe_pad_expert_input_to_capacity);
    dropless or dropping layers receive a routing-dependent number of rows, so Megatron asserts
    drop-and-pad for the `moe` scope.""",
    bad=_TE_GRAPHS % "moe",
    good=_TE_GRAPHS % "moe" + "\n" + _DROP_PAD,
)
def moe_graph_needs_drop_and_pad(f: Facts) -> Iterator[Violation]:
    if "moe" in _graph_scopes(f) and not _drop_and_pad(f):
        yield Violation(GRAPH_SCOPE, "cuda_graph_scope 'moe' on a MoE layer without drop-and-pad",
                        "capture moe_router (and moe_preprocess) instead, or set "
                        "moe_expert_capacity_factor with moe_pad_expert_input_to_capacity: true")


@rule(
    "OVL016", "error", "the `moe` and `moe_router` CUDA-graph scopes are exclusive",
    source=TRANSFORMER_CONFIG,
    why="""`moe` captures the whole MoE layer, router included; capturing the router again as its
    own graph would nest one capture in another, which Megatron asserts against
   .""",
    bad=_TE_GRAPHS % "moe, moe_router" + "\n" + _DROP_PAD,
    good=_TE_GRAPHS % "moe" + "\n" + _DROP_PAD,
)
def moe_graph_excludes_router_graph(f: Facts) -> Iterator[Violation]:
    if {"moe", "moe_router"} <= _graph_scopes(f):
        yield Violation(GRAPH_SCOPE, "cuda_graph_scope holds both 'moe' and 'moe_router'",
                        "keep one of 'moe' and 'moe_router'")


@rule(
    "OVL017", "error", "the `moe_preprocess` CUDA-graph scope needs `moe_router`",
    source=TRANSFORMER_CONFIG,
    why="""The preprocess graph continues the router's graph (it reads the routing map the router
    graph produced), so Megatron accepts `moe_preprocess` only beside `moe_router`
   ; the local implementation adds each of the
    two when the other is named, Transformer Engine's does not.""",
    bad=_TE_GRAPHS % "moe_preprocess",
    good=_TE_GRAPHS % "moe_router, moe_preprocess",
)
def moe_preprocess_graph_needs_router(f: Facts) -> Iterator[Violation]:
    scopes = _graph_scopes(f)
    if (f.ovl.cuda_graph_impl == "transformer_engine" and "moe_preprocess" in scopes
            and "moe_router" not in scopes):
        yield Violation(GRAPH_SCOPE, "cuda_graph_scope 'moe_preprocess' without 'moe_router'",
                        "add 'moe_router' to overlap.cuda_graph_scope")


@rule(
    "OVL018", "error", "no `moe_preprocess` CUDA graph when the alltoall preprocess syncs",
    source=TRANSFORMER_CONFIG,
    why="""With a capacity factor but no padding, the alltoall dispatcher's preprocess copies the
    per-expert counts to the host and synchronises; a graph cannot capture that, and Megatron
    asserts against the `moe_preprocess` scope there.""",
    bad=_TE_GRAPHS % "moe_router, moe_preprocess" + "\nmoe: {moe_expert_capacity_factor: 1.0}",
    good=_TE_GRAPHS % "moe_router" + "\nmoe: {moe_expert_capacity_factor: 1.0}",
)
def moe_preprocess_graph_without_host_sync(f: Facts) -> Iterator[Violation]:
    if ("moe_preprocess" in _graph_scopes(f) and not _drop_and_pad(f)
            and f.moe.moe_token_dispatcher_type == "alltoall"
            and f.moe.moe_expert_capacity_factor is not None):
        yield Violation(GRAPH_SCOPE, "cuda_graph_scope 'moe_preprocess' with the alltoall "
                        "dispatcher and a capacity factor without padding",
                        "drop 'moe_preprocess', or pad to capacity "
                        "(moe_pad_expert_input_to_capacity: true)")


@rule(
    "OVL019", "error", "per-layer CUDA graphs exclude full recompute",
    source=TRANSFORMER_CONFIG,
    why="""Full recompute re-runs whole layers inside the backward pass, outside the captured
    forward; Megatron supports it only with a full-iteration graph, which moeplan does not emit,
    and asserts so for the local and Transformer Engine implementations
   .""",
    bad="""
    overlap: {cuda_graph_impl: local, recompute_granularity: full, recompute_method: uniform,
              recompute_num_layers: 1}
    """,
    good="""
    overlap: {cuda_graph_impl: local, cuda_graph_scope: [attn], recompute_granularity: selective,
              recompute_modules: [moe_act]}
    """,
)
def graphs_without_full_recompute(f: Facts) -> Iterator[Violation]:
    if f.ovl.cuda_graph_impl in _GRAPHS and f.ovl.recompute_granularity == "full":
        yield Violation("overlap.cuda_graph_impl",
                        f"cuda_graph_impl {f.ovl.cuda_graph_impl} with full recompute",
                        "set cuda_graph_impl: none, or use selective recompute")


@rule(
    "OVL020", "error", "Transformer Engine `moe_router` graphs exclude recomputing `moe`",
    source=TRANSFORMER_CONFIG,
    why="""Selective recompute of `moe` would re-run a region that covers the captured router
    graph; a recomputed module must lie wholly inside or outside a graph, and Megatron asserts
    against this pair under the Transformer Engine implementation
   .""",
    bad="""
    overlap: {cuda_graph_impl: transformer_engine, cuda_graph_scope: [moe_router],
              recompute_granularity: selective, recompute_modules: [moe]}
    """,
    good="""
    overlap: {cuda_graph_impl: transformer_engine, cuda_graph_scope: [moe_router],
              recompute_granularity: selective, recompute_modules: [core_attn]}
    """,
)
def router_graph_without_moe_recompute(f: Facts) -> Iterator[Violation]:
    if (f.ovl.cuda_graph_impl == "transformer_engine" and "moe_router" in _graph_scopes(f)
            and f.ovl.recompute_granularity == "selective"
            and "moe" in (f.ovl.recompute_modules or [])):
        yield Violation("overlap.recompute_modules",
                        "recompute_modules 'moe' with a Transformer Engine 'moe_router' graph",
                        "drop 'moe' from recompute_modules or 'moe_router' from cuda_graph_scope")


@rule(
    "OVL021", "error", "CUDA-graph scopes Megatron knows",
    source=dev("core/transformer/cuda_graph_config.py", "normalize_cuda_graph_modules"),
    why="""Megatron looks each scope name up in its CudaGraphModule enum (attn, mlp, moe,
    moe_router, moe_preprocess, mamba; `full` alone and the deprecated full_iteration names are
    mapped first); any other name fails the lookup with a KeyError before training starts, and
    `full` beside other scopes is asserted against.""",
    bad="overlap: {cuda_graph_impl: local, cuda_graph_scope: [router]}",
    good="overlap: {cuda_graph_impl: local, cuda_graph_scope: [attn]}",
)
def known_graph_scopes(f: Facts) -> Iterator[Violation]:
    scopes = list(f.ovl.cuda_graph_scope)
    for scope in scopes:
        if scope not in GRAPH_SCOPE_NAMES:
            yield Violation(GRAPH_SCOPE, f"cuda_graph_scope {scope!r} is not a Megatron scope",
                            f"use one of {', '.join(GRAPH_MODULES)}")
    if "full" in scopes and scopes != ["full"]:
        yield Violation(GRAPH_SCOPE, "cuda_graph_scope 'full' beside other scopes",
                        "use 'full' alone, or list the modules without it")


@rule(
    "OVL022", "error", "CUDA graphs with a sequence-packing scheduler need a packed alignment",
    source=VALIDATE_ARGS,
    why="""Packed (THD) batches change shape from step to step; Megatron's validate_args raises
    unless --pad-packed-seq-alignment pads them to a fixed length, a flag moeplan does not emit.""",
    bad="""
    overlap: {cuda_graph_impl: local}
    training: {sequence_packing_scheduler: dp_balanced}
    """,
    good="""
    overlap: {cuda_graph_impl: none}
    training: {sequence_packing_scheduler: dp_balanced}
    """,
)
def graphs_need_packed_alignment(f: Facts) -> Iterator[Violation]:
    if f.ovl.cuda_graph_impl in _GRAPHS and f.train.sequence_packing_scheduler is not None:
        yield Violation("overlap.cuda_graph_impl",
                        f"cuda_graph_impl {f.ovl.cuda_graph_impl} with sequence_packing_scheduler "
                        f"{f.train.sequence_packing_scheduler}",
                        "set cuda_graph_impl: none, or drop the packing scheduler")


@rule(
    "OVL023", "error", "graphed recompute takes no dropout",
    source=TRANSFORMER_CONFIG,
    why="""A captured graph replays the random numbers of its capture, so a recomputed module
    inside a graph would draw different dropout masks in the forward and in the recompute.
    Megatron asserts attention_dropout 0 when core_attn is recomputed inside a graphed attention,
    and hidden_dropout 0 when mlp or moe is recomputed inside a graphed MLP or MoE layer (an empty
    scope graphs the whole layer).""",
    bad="""
    overlap: {cuda_graph_impl: local, recompute_granularity: selective,
              recompute_modules: [core_attn]}
    """,
    good="""
    model: {attention_dropout: 0.0}
    overlap: {cuda_graph_impl: local, recompute_granularity: selective,
              recompute_modules: [core_attn]}
    """,
)
def graphed_recompute_without_dropout(f: Facts) -> Iterator[Violation]:
    if f.ovl.cuda_graph_impl not in _GRAPHS or f.ovl.recompute_granularity != "selective":
        return
    scopes, modules = _graph_scopes(f), set(f.ovl.recompute_modules or ["core_attn"])
    whole = not scopes

    def graphed(module: str, scope: str) -> bool:
        return module in modules and (whole or scope in scopes)

    if f.model.attention_dropout and graphed("core_attn", "attn"):
        yield Violation("model.attention_dropout", f"attention_dropout {f.model.attention_dropout} "
                        "with core_attn recomputed inside a CUDA graph",
                        "set model.attention_dropout: 0.0, or stop graphing or recomputing attention")
    if f.model.hidden_dropout and (graphed("mlp", "mlp") or graphed("moe", "moe")):
        yield Violation("model.hidden_dropout", f"hidden_dropout {f.model.hidden_dropout} with "
                        "mlp or moe recomputed inside a CUDA graph",
                        "set model.hidden_dropout: 0.0, or stop graphing or recomputing the MLP/MoE")


RULES = (
    shared_overlap_exclusive, ep_overlap_needs_ep, ep_overlap_needs_vpp, ep_overlap_needs_a2a,
    delay_wgrad_needs_overlap, shared_overlap_needs_a2a, ep_overlap_needs_half_precision,
    ep_overlap_without_moe_recompute, full_recompute_needs_method, selective_recompute_without_method,
    ep_overlap_single_mtp_layer, mtp_uniform_recompute_one_layer,
    ep_overlap_full_recompute_without_dropout, ep_overlap_without_recompute_method,
    moe_graph_needs_drop_and_pad, moe_graph_excludes_router_graph, moe_preprocess_graph_needs_router,
    moe_preprocess_graph_without_host_sync, graphs_without_full_recompute,
    router_graph_without_moe_recompute, known_graph_scopes, graphs_need_packed_alignment,
    graphed_recompute_without_dropout,
)

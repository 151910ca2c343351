"""PIP: how the decoder layers (and MTP) split over pipeline stages and virtual stages."""

from __future__ import annotations

from collections.abc import Iterator

from planner.config.layout_strings import PER_CHUNK, ChunkHolds, write_layout
from planner.layout.pipeline import SplitError, StageSplit, expand_layout, suggested_layout
from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import PARALLEL_STATE, TRANSFORMER_CONFIG, VALIDATE_ARGS


def _opening(layers: int) -> str:
    """The first chunk of a layout: the embedding and this many decoder layers."""
    return write_layout([ChunkHolds(layers, embedding=True)], PER_CHUNK)


def layout_string(split: StageSplit) -> str:
    """The pipeline_model_parallel_layout that reproduces a split, chunk by chunk."""
    return write_layout([ChunkHolds(len(c.layers), embedding=c.embedding, mtp=len(c.mtp_layers), loss=c.loss)
                         for c in split.chunks], PER_CHUNK)


@rule(
    "PIP001", "error", "layers split over the pipeline stages",
    source=VALIDATE_ARGS,
    why="""Megatron splits num_layers evenly over PP·VPP (virtual) stages unless the first/last
    stage counts or a pipeline_model_parallel_layout say otherwise. A split that does not come out
    in whole layers per stage is rejected before training starts (how 61 blocks + MTP split over
    8 stages is a decision separate from the device grid).""",
    bad="model: {num_layers: 5}",
    good="""
    model: {num_layers: 5}
    parallel: {decoder_first_pipeline_num_layers: 2}
    """,
)
def layers_split_over_stages(f: Facts) -> Iterator[Violation]:
    result = f.split_result
    if isinstance(result, SplitError):
        yield Violation(result.path, result.message, result.fix)


@rule(
    "PIP002", "error", "virtual pipeline stages need PP > 1",
    source=PARALLEL_STATE,
    why="""An interleaved (virtual pipeline) schedule cycles model chunks between pipeline
    ranks; with a single stage there is nothing to interleave and Megatron raises.""",
    bad="parallel: {pp: 1, vpp: 2}",
    good="parallel: {pp: 2, vpp: 2}",
)
def vpp_needs_pipeline(f: Facts) -> Iterator[Violation]:
    if f.par.pp == 1 and f.vpp > 1:
        yield Violation("parallel.vpp", f"vpp {f.vpp} > 1 with pp 1",
                        "remove vpp (and any layout with several stages) or raise pp")


@rule(
    "PIP006", "error", "interleaving without the p2p overlap needs PP > 2",
    source=VALIDATE_ARGS,
    why="""With overlap.overlap_p2p_comm off (--no-overlap-p2p-communication) the interleaved schedule
    batches each step's sends and receives; with two pipeline ranks one batch would hold several
    sends and receives between the same pair, so validate_args asserts PP > 2 before training
    starts.""",
    bad="""
    model: {num_layers: 4}
    parallel: {pp: 2, vpp: 2}
    overlap: {overlap_p2p_comm: false}
    """,
    good="""
    model: {num_layers: 4}
    parallel: {pp: 2, vpp: 2}
    """,
)
def interleaving_without_p2p_overlap(f: Facts) -> Iterator[Violation]:
    if f.vpp > 1 and not f.ovl.overlap_p2p_comm and f.par.pp <= 2:
        yield Violation("overlap.overlap_p2p_comm",
                        f"overlap_p2p_comm false with vpp {f.vpp} and pp {f.par.pp}",
                        "keep overlap.overlap_p2p_comm (Megatron's default) or use pp > 2")


@rule(
    "PIP003", "error", "hash-routed layers sit on the embedding stage",
    source=TRANSFORMER_CONFIG,
    why="""Hash routing looks experts up by token id (tid2eid[input_id]) and input_ids exist only
    where the embedding runs: the first (virtual) pipeline stage. Every hash layer must therefore
    be in that stage.""",
    bad="model: {moe_n_hash_layers: 3}",
    good="""
    model: {moe_n_hash_layers: 2}
    parallel: {pipeline_model_parallel_layout: "Ett|ttL"}
    moe: {moe_tid2eid_source: checkpoint}
    """,
)
def hash_layers_on_first_stage(f: Facts) -> Iterator[Violation]:
    hashed, layers = f.hash_layers, f.model.num_layers
    if hashed == 0:
        return
    if hashed > layers:
        yield Violation("model.moe_n_hash_layers",
                        f"moe_n_hash_layers {hashed} exceeds num_layers {layers}",
                        f"use at most {layers} hash layers")
        return
    first = next((c for c in f.split.chunks if c.embedding), None)
    if first is not None and len(first.layers) < hashed:
        yield Violation(
            "parallel.pipeline_model_parallel_layout",
            f"the embedding stage holds {len(first.layers)} decoder layer(s) but the "
            f"{hashed} hash layers 0..{hashed - 1} must all be there",
            f"give the first stage at least {hashed} layers: a layout starting "
            f"'{_opening(hashed)}', or decoder_first_pipeline_num_layers >= {hashed} times vpp",
        )


@rule(
    "PIP004", "error", "hash routing with PP > 1 needs an explicit pipeline layout",
    source=TRANSFORMER_CONFIG,
    why="""Megatron dev requires pipeline_model_parallel_layout whenever hash layers are used with
    PP > 1 on the GPT path (input_ids exist only on the embedding stage, so the split must be
    stated explicitly); an even or first/last split is rejected at start-up. The fix gives the
    equivalent layout string. DeepSeek-V4 attention runs on the hybrid entry, whose
    --hybrid-layer-pattern carries the split, and Megatron does not ask for a layout there.""",
    bad="""
    model: {moe_n_hash_layers: 1}
    moe: {moe_tid2eid_source: checkpoint}
    """,
    good="""
    model: {moe_n_hash_layers: 1}
    parallel: {pipeline_model_parallel_layout: "Ett|ttL"}
    moe: {moe_tid2eid_source: checkpoint}
    """,
)
def hash_routing_wants_layout(f: Facts) -> Iterator[Violation]:
    if f.hash_layers == 0 or f.par.pp == 1 or f.par.pipeline_model_parallel_layout or f.v4_attention:
        return
    result = f.split_result
    if isinstance(result, SplitError):  # PIP001 says why; the layout still has to be given
        fix = _layout_fix_without_split(f)
    else:
        fix = f'set pipeline_model_parallel_layout: "{layout_string(result)}", the split planned now'
    yield Violation(
        "parallel.pipeline_model_parallel_layout",
        f"{f.hash_layers} hash layer(s) with pp {f.par.pp} and no pipeline_model_parallel_layout",
        fix,
    )


def _layout_fix_without_split(f: Facts) -> str:
    """When the layers do not split as configured: PIP001's suggested layout if it keeps the hash
    layers on the embedding stage, else what such a layout must contain."""
    m = f.model
    layout = suggested_layout(m.num_layers, f.par.pp, m.mtp_num_layers, m)
    if layout is not None and expand_layout(layout)[0].count("t") >= f.hash_layers:
        return f'set pipeline_model_parallel_layout, e.g. "{layout}"'
    return (f"set a pipeline_model_parallel_layout that starts '{_opening(f.hash_layers)}' (the "
            f"hash layers on the embedding stage) and places all {m.num_layers} layers")


@rule(
    "PIP005", "error", "MTP needs rope or no position embedding",
    source=VALIDATE_ARGS,
    why="""Multi-token prediction shifts the input ids per depth and re-embeds them; Megatron
    supports that only with rotary position embeddings or none, and refuses MTP with any other
    position_embedding_type (a learned absolute table is Megatron's default).""",
    bad="model: {mtp_num_layers: 1, position_embedding_type: learned_absolute}",
    good="model: {mtp_num_layers: 1, position_embedding_type: rope}",
)
def mtp_position_embedding(f: Facts) -> Iterator[Violation]:
    kind = f.model.position_embedding_type
    if f.model.mtp_num_layers and kind not in ("rope", "none"):
        yield Violation("model.position_embedding_type",
                        f"mtp_num_layers {f.model.mtp_num_layers} with position_embedding_type {kind}",
                        "set model.position_embedding_type: rope (or none), or mtp_num_layers: 0")


RULES = (layers_split_over_stages, vpp_needs_pipeline, interleaving_without_p2p_overlap,
         hash_layers_on_first_stage, hash_routing_wants_layout, mtp_position_embedding)

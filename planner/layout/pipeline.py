"""Layer → pipeline-stage split, following Megatron's rules for even splits, uneven first/last stages,
the account-for-embedding/loss flags, VPP and `pipeline_model_parallel_layout` strings.

Everything that asks "which layers live on stage s" (the grid's expert ownership, the budgets, the
plan, the runtime) reads the `StageSplit` built here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.config.dsa_share import movable_starts
from planner.config.layout_strings import LayoutStringError, layout_string, parse_layout
from planner.config.schema import Config, ModelSection
from planner.memo import Memo, section_key


class SplitError(ValueError):
    """The layers cannot be split as configured; carries the field to blame and a fix."""

    def __init__(self, message: str, path: str, fix: str) -> None:
        super().__init__(message)
        self.message, self.path, self.fix = message, path, fix


@dataclass(frozen=True)
class Chunk:
    """One virtual pipeline stage: the model chunk `virtual` of physical stage `stage`."""

    index: int  # position in pipeline order, v·PP + p
    stage: int
    virtual: int
    layers: tuple[int, ...]  # decoder layer ids
    mtp_layers: tuple[int, ...]  # MTP depth ids 0..mtp_num_layers-1
    embedding: bool
    loss: bool


@dataclass(frozen=True)
class StageLayers:
    """Everything one physical pipeline stage holds, over all its virtual chunks."""

    stage: int
    layers: tuple[int, ...]
    mtp_layers: tuple[int, ...]
    moe_layers: tuple[int, ...]  # decoder MoE ids, then MTP blocks as num_layers + depth
    hash_layers: tuple[int, ...]
    embedding: bool
    output_head: bool
    chunks: tuple[Chunk, ...] = field(default=())


@dataclass(frozen=True)
class StageSplit:
    vpp: int
    chunks: tuple[Chunk, ...]
    stages: tuple[StageLayers, ...]
    source: str  # how the split was decided, for display


def expand_layout(layout: str) -> list[list[str]]:
    """Expand a Megatron layout string (`Et*4|(tttt|)*14tmL`) into per-virtual-stage symbol lists;
    an unreadable one is a split error on the layout field."""
    try:
        return parse_layout(layout)
    except LayoutStringError as exc:
        raise SplitError(exc.message, "parallel.pipeline_model_parallel_layout", exc.fix) from None


def _chunks_from_layout(cfg: Config) -> tuple[int, list[Chunk]]:
    par, model = cfg.parallel, cfg.model
    path = "parallel.pipeline_model_parallel_layout"
    stages = expand_layout(par.pipeline_model_parallel_layout or "")
    if len(stages) % par.pp:
        raise SplitError(
            f"layout has {len(stages)} stages, not a multiple of pp={par.pp}", path,
            "write PP x VPP stages separated by '|'",
        )
    vpp = len(stages) // par.pp
    if par.vpp is not None and par.vpp != vpp:
        raise SplitError(
            f"vpp={par.vpp} but the layout implies {len(stages)}/{par.pp} = {vpp} virtual stages",
            "parallel.vpp", f"set vpp: {vpp} or drop it",
        )
    n_t = sum(s.count("t") for s in stages)
    n_m = sum(s.count("m") for s in stages)
    if n_t != model.num_layers:
        raise SplitError(f"layout places {n_t} decoder layers (t) but num_layers={model.num_layers}",
                         path, f"write exactly {model.num_layers} 't' symbols")
    if n_m != model.mtp_num_layers:
        raise SplitError(f"layout places {n_m} MTP layers (m) but mtp_num_layers="
                         f"{model.mtp_num_layers}", path, f"write {model.mtp_num_layers} 'm' symbols")
    if "E" not in stages[0] or any("E" in s for s in stages[1:]):
        raise SplitError("the embedding (E) must be in the first layout stage and only there",
                         path, "start the layout with E")
    if "L" not in stages[-1] or any("L" in s for s in stages[:-1]):
        raise SplitError("the loss (L) must be in the last layout stage and only there",
                         path, "end the layout with L")
    chunks, next_t, next_m = [], 0, 0
    for index, symbols in enumerate(stages):
        t, m = symbols.count("t"), symbols.count("m")
        chunks.append(Chunk(index, index % par.pp, index // par.pp,
                            tuple(range(next_t, next_t + t)), tuple(range(next_m, next_m + m)),
                            "E" in symbols, "L" in symbols))
        next_t, next_m = next_t + t, next_m + m
    return vpp, chunks


def _layers_per_chunk(cfg: Config, vpp: int) -> list[int]:
    """Decoder layers on each virtual stage (pipeline order), or SplitError with Megatron's rule."""
    par, layers = cfg.parallel, cfg.model.num_layers
    pp, first, last = par.pp, par.decoder_first_pipeline_num_layers, par.decoder_last_pipeline_num_layers
    if first is not None or last is not None:
        if pp == 1:
            raise SplitError("decoder_first/last_pipeline_num_layers need pp > 1",
                             "parallel.decoder_first_pipeline_num_layers", "remove them or raise pp")
        per_stage: list[int | None] = [None] * pp
        for value, stage, name in ((first, 0, "first"), (last, pp - 1, "last")):
            if value is not None:
                if value % vpp:
                    raise SplitError(f"decoder_{name}_pipeline_num_layers={value} is not divisible"
                                     f" by vpp={vpp}", f"parallel.decoder_{name}_pipeline_num_layers",
                                     f"use a multiple of {vpp}")
                per_stage[stage] = value
        fixed = sum(v for v in per_stage if v is not None)
        middle = [i for i, v in enumerate(per_stage) if v is None]
        rest = layers - fixed
        if rest < 0 or (middle and rest % len(middle)) or (not middle and rest):
            raise SplitError(
                f"{layers} layers minus first/last {fixed} leaves {rest} for {len(middle)} "
                f"middle stage(s), which does not divide evenly",
                "parallel.decoder_first_pipeline_num_layers",
                "choose first/last counts so the middle stages get equal whole layer counts",
            )
        for i in middle:
            per_stage[i] = rest // len(middle)
        if any(v % vpp for v in per_stage if v is not None):
            raise SplitError(f"middle stages get {rest // max(len(middle), 1)} layers, not divisible by "
                             f"vpp={vpp}", "parallel.vpp", "adjust the split or vpp")
        counts = [int(v or 0) for v in per_stage]
        return [counts[p] // vpp for _ in range(vpp) for p in range(pp)]
    extra = int(par.account_for_embedding_in_pipeline_split) + int(par.account_for_loss_in_pipeline_split)
    total = layers + extra
    if total % pp:
        layout = (suggested_layout(layers, pp, cfg.model.mtp_num_layers, cfg.model) if vpp == 1
                  else None)
        raise SplitError(
            f"num_layers={layers}{f' + {extra} accounted' if extra else ''} is not divisible by pp={pp}",
            "parallel.pipeline_model_parallel_layout",
            "set decoder_first/last_pipeline_num_layers or a pipeline_model_parallel_layout"
            + (f', e.g. pipeline_model_parallel_layout: "{layout}"' if layout else ""),
        )
    if (total // pp) % vpp:
        raise SplitError(f"{total // pp} layers per stage are not divisible by vpp={vpp}",
                         "parallel.vpp", "choose a vpp that divides the layers per stage")
    per_chunk = [total // (pp * vpp)] * (pp * vpp)
    if par.account_for_embedding_in_pipeline_split:
        per_chunk[0] -= 1
    if par.account_for_loss_in_pipeline_split:
        per_chunk[-1] -= 1
    return per_chunk


def suggested_layout(layers: int, pp: int, mtp: int, model: ModelSection | None = None) -> str | None:
    """A layout for layers that do not divide by PP: full stages of ceil(L/PP) layers, the
    remainder on the embedding stage (which also holds the hash layers), MTP and loss last. With
    DSA's top-k shared across layers (`model`), each boundary moves to the nearest layer that
    computes its own top-k, as Megatron requires (planner/config/dsa_share.py)."""
    per = -(-layers // pp)
    first = layers - per * (pp - 1)
    if pp < 2 or first < 1:
        return None
    counts = [first] + [per] * (pp - 1)
    if model is not None and model.dsa and model.dsa_indexer_topk_freq > 1:
        starts = [sum(counts[:i]) for i in range(pp)]
        moved = movable_starts(starts, layers, model.dsa_indexer_topk_freq,
                               model.dsa_indexer_skip_topk_offset)
        if moved is None:
            return None
        counts = [end - start for start, end in zip(moved, [*moved[1:], layers], strict=True)]
    return layout_string(counts, mtp)


def _refuse_conflicting_splits(cfg: Config) -> None:
    """Pipeline arguments Megatron refuses together, in its order (Megatron-LM dev@d48bd6be
    megatron/training/arguments.py validate_args: at most one of layers per virtual stage, virtual
    stages per rank and a layout, `_vpp_from_layers_per_stage`; then
    megatron/core/transformer/transformer_config.py
    TransformerConfig.__post_init__: a layout with no other split argument, first/last stage counts
    without the account-for flags)."""
    par = cfg.parallel
    first_last = (par.decoder_first_pipeline_num_layers is not None
                  or par.decoder_last_pipeline_num_layers is not None)
    account = par.account_for_embedding_in_pipeline_split or par.account_for_loss_in_pipeline_split
    if par.num_layers_per_virtual_pipeline_stage is not None:
        _vpp_from_layers_per_stage(cfg)  # validate_args's checks come first
    if par.pipeline_model_parallel_layout and (first_last or account):
        raise SplitError("pipeline_model_parallel_layout with decoder_first/last_pipeline_num_layers or "
                         "an account-for flag: Megatron's TransformerConfig takes a layout alone",
                         "parallel.pipeline_model_parallel_layout",
                         "drop the other split arguments (the layout places E and L itself)")
    if first_last and account:
        raise SplitError("decoder_first/last_pipeline_num_layers with account_for_embedding/loss_in_"
                         "pipeline_split: Megatron's TransformerConfig refuses them together",
                         "parallel.decoder_first_pipeline_num_layers",
                         "drop the account-for flags or the first/last stage counts")


def _vpp_from_layers_per_stage(cfg: Config) -> int:
    """VPP from num_layers_per_virtual_pipeline_stage, as Megatron derives it: the layers plus one
    slot for each account-for flag, split evenly over PP, then over the layers per virtual stage
    (Megatron-LM dev@d48bd6be megatron/training/arguments.py validate_args, the
    num_layers_per_virtual_pipeline_stage branch). Uneven pipelines need the VPP degree itself."""
    par, path = cfg.parallel, "parallel.num_layers_per_virtual_pipeline_stage"
    per_vp = par.num_layers_per_virtual_pipeline_stage or 1
    uneven = "give parallel.vpp (--num-virtual-stages-per-pipeline-rank) instead"
    if par.vpp is not None or par.pipeline_model_parallel_layout:
        other = "parallel.vpp" if par.vpp is not None else "parallel.pipeline_model_parallel_layout"
        raise SplitError(f"num_layers_per_virtual_pipeline_stage={per_vp} and {other} are both set; "
                         "Megatron takes no more than one of --num-layers-per-virtual-pipeline-stage, "
                         "--num-virtual-stages-per-pipeline-rank and --pipeline-model-parallel-layout",
                         path, "drop one of them")
    if par.decoder_first_pipeline_num_layers is not None or par.decoder_last_pipeline_num_layers is not None:
        raise SplitError("num_layers_per_virtual_pipeline_stage with decoder_first/last_pipeline_num_layers"
                         ": Megatron asks for --num-virtual-stages-per-pipeline-rank to set the virtual "
                         "pipeline degree of an uneven pipeline", path, uneven)
    extra = int(par.account_for_embedding_in_pipeline_split) + int(par.account_for_loss_in_pipeline_split)
    slots = cfg.model.num_layers + extra
    accounted = f" + {extra} accounted = {slots}" if extra else ""
    if slots % par.pp:
        raise SplitError(f"num_layers={cfg.model.num_layers}{accounted} is not divisible by pp={par.pp} "
                         "(Megatron: the number of layers must be divisible by the pipeline size)", path,
                         "give decoder_first/last_pipeline_num_layers with parallel.vpp "
                         "(--num-virtual-stages-per-pipeline-rank), or a pipeline_model_parallel_layout "
                         "instead")
    per_stage = slots // par.pp
    if per_stage % per_vp:
        raise SplitError(f"{per_stage} layers per pipeline stage are not divisible by "
                         f"num_layers_per_virtual_pipeline_stage={per_vp} (Megatron: the layers per "
                         "pipeline stage must be divisible by the layers per virtual pipeline stage)",
                         path, f"use a divisor of {per_stage}, or {uneven}")
    return per_stage // per_vp


def _chunks_from_counts(cfg: Config) -> tuple[int, list[Chunk]]:
    par = cfg.parallel
    vpp = par.vpp or 1
    if par.num_layers_per_virtual_pipeline_stage is not None:
        vpp = _vpp_from_layers_per_stage(cfg)
    counts = _layers_per_chunk(cfg, vpp)
    chunks, start, last = [], 0, len(counts) - 1
    for index, count in enumerate(counts):
        mtp = tuple(range(cfg.model.mtp_num_layers)) if index == last else ()
        chunks.append(Chunk(index, index % par.pp, index // par.pp, tuple(range(start, start + count)),
                            mtp, index == 0, index == last))
        start += count
    return vpp, chunks


def stage_layers(cfg: Config, stage: int, chunks: list[Chunk]) -> StageLayers:
    """What `chunks` of physical stage `stage` hold together (all of its chunks, or just one)."""
    model = cfg.model
    layers = tuple(layer for c in chunks for layer in c.layers)
    mtp = tuple(d for c in chunks for d in c.mtp_layers)
    moe = tuple(layer for layer in layers if model.is_moe_layer(layer))
    moe += tuple(model.num_layers + d for d in mtp)
    hashed = tuple(layer for layer in moe if layer < min(model.moe_n_hash_layers, model.num_layers))
    return StageLayers(stage, layers, mtp, moe, hashed, any(c.embedding for c in chunks),
                       any(c.loss for c in chunks), tuple(chunks))


_SPLITS: Memo[tuple[Any, ...], StageSplit] = Memo("stage splits", 4096)


def split_key(cfg: Config) -> tuple[Any, ...]:
    """Everything the split reads: the model and the pipeline fields (a hashable value)."""
    par = cfg.parallel
    return (section_key(cfg.model), par.pp, par.vpp, par.pipeline_model_parallel_layout,
            par.decoder_first_pipeline_num_layers, par.decoder_last_pipeline_num_layers,
            par.num_layers_per_virtual_pipeline_stage, par.account_for_embedding_in_pipeline_split,
            par.account_for_loss_in_pipeline_split)


def stage_split(cfg: Config) -> StageSplit:
    """The split Megatron would build for this config, or SplitError naming the field to change.

    Remembered by `split_key` (search asks for the same split many times)."""
    return _SPLITS.get_or_raise(split_key(cfg), _stage_split, cfg, errors=(SplitError,))


def _stage_split(cfg: Config) -> StageSplit:
    _refuse_conflicting_splits(cfg)
    if cfg.parallel.pipeline_model_parallel_layout:
        vpp, chunks = _chunks_from_layout(cfg)
        source = f"layout {cfg.parallel.pipeline_model_parallel_layout}"
    else:
        vpp, chunks = _chunks_from_counts(cfg)
        source = "even split" if cfg.parallel.decoder_first_pipeline_num_layers is None and \
            cfg.parallel.decoder_last_pipeline_num_layers is None else "first/last stage counts"
    stages = tuple(
        stage_layers(cfg, s, [c for c in chunks if c.stage == s]) for s in range(cfg.parallel.pp)
    )
    return StageSplit(vpp, tuple(chunks), stages, source)

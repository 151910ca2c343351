"""Megatron's `--hybrid-layer-pattern`, both directions, from one symbol table.

The hybrid stack (Megatron-LM dev@d48bd6be megatron/core/models/hybrid/hybrid_layer_allocation.py
`Symbols`, `parse_hybrid_pattern`) reads one symbol per sublayer, `|` between pipeline segments
(virtual stages in pipeline order) and `/` before each MTP depth, which sits on the last segment.
moeplan reads two stacks as decoder blocks (a mixer, then at most one MLP):

* DeepSeek-V4's: per decoder layer an attention symbol (its compress ratio) then its MLP symbol,
  `E` routed MoE or `-` dense, into `model.compress_ratios`;
* the Mamba stack (Nemotron-H, Nemotron-3): `M` Mamba-2 or `*` self-attention, each followed by
  its `E` or `-` MLP layer or, when the next symbol is a mixer again, by none (a mixer-only
  block), into `model.mamba_layers` and `model.mixer_only_layers`.

Both fill `model.moe_layer_freq`, `model.mtp_num_layers` and the pipeline segments. The emitter
writes the pattern from a planned split (planner/emit/megatron.py `hybrid_pattern`), the importer
reads it back (planner/config/importers/megatron_args.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# DeepSeek-V4 attention symbol -> compress ratio: sliding window only, CSA, HCA.
ATTENTION_RATIO: dict[str, int] = {"W": 0, "C": 4, "H": 128}
RATIO_SYMBOL: dict[int, str] = {ratio: symbol for symbol, ratio in ATTENTION_RATIO.items()}
MOE_SYMBOL, DENSE_MLP_SYMBOL = "E", "-"
MLP_IS_MOE: dict[str, bool] = {MOE_SYMBOL: True, DENSE_MLP_SYMBOL: False}
SEGMENT_BREAK, MTP_BREAK = "|", "/"
# The Mamba stack's mixer symbols (`Symbols.MAMBA`, `Symbols.ATTENTION`): one symbol is one layer,
# mixed with `-` and `E` MLP layers (Nemotron-H's `M-M*-`); the value says whether it is Mamba.
MAMBA_SYMBOL, ATTENTION_SYMBOL = "M", "*"
MAMBA_STACK_SYMBOLS: dict[str, bool] = {MAMBA_SYMBOL: True, ATTENTION_SYMBOL: False}
# A Mamba-stack MTP depth moeplan models: moeplan's MTP block, attention then MoE (Nemotron-3-Super's
# mtp_hybrid_override_pattern).
MAMBA_MTP_DEPTH = ATTENTION_SYMBOL + MOE_SYMBOL


class PatternError(ValueError):
    """A pattern Megatron's grammar or moeplan's layer pairs cannot read."""


class PatternNotModelled(PatternError):
    """A well-formed pattern of layers moeplan does not model (Mamba stacks)."""


def mamba_block_symbols(mamba: bool, mlp: bool, moe: bool) -> str:
    """One Mamba-stack block: its mixer symbol, then its MLP symbol unless it is mixer-only."""
    mixer = MAMBA_SYMBOL if mamba else ATTENTION_SYMBOL
    return mixer + ((MOE_SYMBOL if moe else DENSE_MLP_SYMBOL) if mlp else "")


def layer_symbols(ratio: int, moe: bool) -> str:
    """One DeepSeek-V4 layer: its attention symbol, then its MLP symbol."""
    return RATIO_SYMBOL[ratio] + (MOE_SYMBOL if moe else DENSE_MLP_SYMBOL)


def segment_text(layers: Sequence[str], mtp_depths: Sequence[str]) -> str:
    """One pipeline segment: its layers' symbols, then `/` and one layer per MTP depth."""
    return "".join(layers) + "".join(MTP_BREAK + depth for depth in mtp_depths)


def join_segments(segments: Sequence[str]) -> str:
    return SEGMENT_BREAK.join(segments)


def read_hybrid_pattern(pattern: str) -> dict[str, Any]:
    """The layers of a DeepSeek-V4 pattern: compress ratio per decoder then MTP layer, 1/0 MoE per
    decoder layer, the MTP depth count and the decoder layers of each pipeline segment; a pattern
    with Mamba-stack mixers is read by `read_mamba_pattern`."""
    if any(symbol in MAMBA_STACK_SYMBOLS for symbol in pattern):
        return read_mamba_pattern(pattern)
    segments = pattern.split(SEGMENT_BREAK)
    ratios: list[int] = []
    moe: list[int] = []
    mtp_ratios: list[int] = []
    counts: list[int] = []
    for index, segment in enumerate(segments):
        main, *mtp = segment.split(MTP_BREAK)
        if mtp and index != len(segments) - 1:
            raise PatternError("MTP parts ('/') appear before the last pipeline segment")
        if len(main) % 2:
            raise PatternError(f"segment {segment!r} is not attention+MLP symbol pairs")
        for pos in range(0, len(main), 2):
            attention, mlp = main[pos], main[pos + 1]
            if attention not in ATTENTION_RATIO or mlp not in MLP_IS_MOE:
                raise PatternNotModelled(f"{attention + mlp!r} is not a DeepSeek-V4 layer (W/C/H attention "
                                         "then E or - MLP); moeplan models no other hybrid layers")
            ratios.append(ATTENTION_RATIO[attention])
            moe.append(1 if MLP_IS_MOE[mlp] else 0)
        counts.append(len(main) // 2)
        for depth in mtp:
            if len(depth) != 2 or depth[0] not in ATTENTION_RATIO:
                raise PatternNotModelled(f"MTP part {depth!r} is not one DeepSeek-V4 layer")
            mtp_ratios.append(ATTENTION_RATIO[depth[0]])
    return {"num_layers": len(ratios), "compress_ratios": ratios + mtp_ratios, "moe": moe,
            "mtp_num_layers": len(mtp_ratios), "segments": counts}


def read_mamba_pattern(pattern: str) -> dict[str, Any]:
    """The blocks of a Mamba-stack pattern: per block 1/0 Mamba, 1/0 mixer-only, 1/0 MoE, the MTP
    depths (each `*E`) and the blocks of each pipeline segment. An MLP layer with no mixer before it
    in its segment, another mixer family beside `M`/`*`, or another MTP depth is refused as not
    modelled, naming the layer."""
    pattern, *depths = pattern.split(MTP_BREAK)
    for depth in depths:
        if depth != MAMBA_MTP_DEPTH:
            raise PatternNotModelled(f"MTP part {depth!r}: moeplan models a hybrid MTP depth as "
                                     f"{MAMBA_MTP_DEPTH!r} (attention then MoE) only")
    mamba: list[int] = []
    alone: list[int] = []
    moe: list[int] = []
    counts: list[int] = []
    number = 0  # Megatron's 1-based layer number of the symbol read
    for segment in pattern.split(SEGMENT_BREAK):
        blocks = 0
        for symbol in segment:
            number += 1
            if symbol in MAMBA_STACK_SYMBOLS:
                mamba.append(int(MAMBA_STACK_SYMBOLS[symbol]))
                alone.append(1)
                moe.append(0)
                blocks += 1
            elif symbol in MLP_IS_MOE and blocks and alone[-1]:
                alone[-1] = 0
                moe[-1] = int(MLP_IS_MOE[symbol])
            elif symbol in MLP_IS_MOE:
                raise PatternNotModelled(
                    f"layer {number} {symbol!r} is an MLP layer with no mixer before it in its "
                    "pipeline segment; moeplan's blocks are a mixer (M or *) and at most one MLP")
            else:
                raise PatternNotModelled(
                    f"layer {number} {symbol!r} beside Mamba-stack layers: moeplan models M "
                    "(Mamba-2), * (attention), E and - only in one pattern")
        counts.append(blocks)
    return {"num_layers": len(mamba), "mamba_layers": mamba, "mixer_only_layers": alone,
            "moe": moe, "mtp_num_layers": len(depths), "segments": counts}

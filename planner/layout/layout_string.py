"""Megatron pipeline layout strings, written: the one writer, beside the parser
(planner/layout/pipeline.py `expand_layout`, which reads them as Megatron-LM dev@d48bd6be
megatron/core/transformer/pipeline_parallel_layer_layout.py `parse_str_to_list` does).

Layout strings list each virtual pipeline stage (chunk) in pipeline order, separated by `|`:
`E` the embedding, `t` a decoder layer, `m` an MTP layer, `L` the loss; `t*N` repeats and
`(...|)*N` a run of equal chunks. Megatron reads every spelling of one layout alike; the callers
keep the spelling their users have always seen (`Spelling`), so their outputs stay stable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkHolds:
    """What one chunk (virtual pipeline stage) holds, in the order Megatron writes it."""

    layers: int
    embedding: bool = False
    mtp: int = 0
    loss: bool = False


@dataclass(frozen=True)
class Spelling:
    """How a layout is written: a run of `star_from` or more equal symbols as `x*N`, and whether
    runs of equal middle chunks fold into `(...|)*N`."""

    star_from: int = 3
    star_mtp: bool = False
    fold: bool = True


FOLDED = Spelling()  # search's layouts and the PIP001/PIP004 hints: `Ett|(t*8|)*6t*8mL`
IMPORTED = Spelling(star_from=2)  # `moeplan import megatron`: `Et*2|(t*8|)*6t*8mL`
PER_CHUNK = Spelling(star_from=2, star_mtp=True, fold=False)  # a planned split, chunk by chunk


def layout_string(counts: Sequence[int], mtp: int, spelling: Spelling = FOLDED) -> str:
    """The layout of decoder-layer counts per chunk (pipeline order): the embedding opens the
    first chunk, the MTP layers and the loss close the last, e.g. [5, 8, 8, 8, 8, 8, 8, 8] with
    one MTP layer is `Et*5|(t*8|)*6t*8mL`."""
    last = len(counts) - 1
    return write_layout([ChunkHolds(n, embedding=i == 0, mtp=mtp if i == last else 0, loss=i == last)
                         for i, n in enumerate(counts)], spelling)


def write_layout(chunks: Sequence[ChunkHolds], spelling: Spelling = FOLDED) -> str:
    """Any chunk list, in the given spelling."""
    texts = [("E" if c.embedding else "") + _run("t", c.layers, spelling.star_from)
             + (_run("m", c.mtp, spelling.star_from) if spelling.star_mtp else "m" * c.mtp)
             + ("L" if c.loss else "") for c in chunks]
    return _fold(texts) if spelling.fold else "|".join(texts)


def _run(symbol: str, count: int, star_from: int) -> str:
    return f"{symbol}*{count}" if count >= star_from else symbol * count


def _fold(parts: list[str]) -> str:
    """Join chunk strings with '|', writing runs of equal middle chunks as (..|)*n."""
    if len(parts) < 3:
        return "|".join(parts)
    out, i = [parts[0]], 1
    while i < len(parts) - 1:
        j = i
        while j < len(parts) - 1 and parts[j] == parts[i]:
            j += 1
        run = j - i
        out.append(f"({parts[i]}|)*{run}" if run > 1 else f"{parts[i]}|")
        i = j
    return out[0] + "|" + "".join(out[1:]) + parts[-1]

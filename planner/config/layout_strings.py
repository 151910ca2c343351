"""Megatron pipeline layout strings, both directions: the one writer and the one reader, as
Megatron-LM dev@d48bd6be megatron/core/transformer/pipeline_parallel_layer_layout.py
`parse_str_to_list` reads them. Config vocabulary: the layout is the value of
`parallel.pipeline_model_parallel_layout`, and the importer writes one from a hybrid pattern.

Layout strings list each virtual pipeline stage (chunk) in pipeline order, separated by `|`:
`E` the embedding, `t` a decoder layer, `m` an MTP layer, `L` the loss; `t*N` repeats and
`(...|)*N` a run of equal chunks. Megatron reads every spelling of one layout alike; the callers
keep the spelling their users have always seen (`Spelling`), so their outputs stay stable.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_TOKEN = re.compile(r"\s*(\(|\)|\*\s*\d+|[EtmL|])")
MAX_LAYOUT_SYMBOLS = 1_000_000  # far above any real model; bounds the expansion of `t*N`


class LayoutStringError(ValueError):
    """A layout string Megatron's grammar cannot read: what is wrong, and the fix."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message, self.fix = message, fix


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


# ---------------------------------------------------------------------------------------- reading
def _symbol_count(item: str | list) -> int:
    return sum(_symbol_count(i) for i in item) if isinstance(item, list) else 1


def parse_layout(layout: str) -> list[list[str]]:
    """Expand a Megatron layout string (`Et*4|(tttt|)*14tmL`) into per-virtual-stage symbol lists."""
    pos, stack = 0, [[]]
    # Commas are cosmetic, as Megatron reads them (Megatron-LM dev@d48bd6be
    # megatron/core/transformer/pipeline_parallel_layer_layout.py parse_str_to_list): `Et*3|(tt|)*29,m|L`.
    text = layout.replace(",", "").strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise LayoutStringError(
                f"pipeline_model_parallel_layout {layout!r}: unexpected {text[pos]!r} at {pos}",
                "use only E (embedding), t (decoder layer), m (MTP), L (loss), | (stage break), "
                "( ) groups, *N repeats and cosmetic commas",
            )
        token = match.group(1).replace(" ", "")
        pos = match.end()
        if token == "(":
            stack.append([])
        elif token == ")":
            if len(stack) == 1:
                raise LayoutStringError(f"layout {layout!r}: unbalanced ')'", "balance the parentheses")
            group = stack.pop()
            stack[-1].append(group)
        elif token.startswith("*"):
            if not stack[-1]:
                raise LayoutStringError(f"layout {layout!r}: '*' with nothing to repeat", "write e.g. t*4")
            last, repeats = stack[-1].pop(), int(token[1:])
            total = repeats * _symbol_count(last) + sum(_symbol_count(i) for s in stack for i in s)
            if total > MAX_LAYOUT_SYMBOLS:
                raise LayoutStringError(f"layout expands to {total} symbols (limit {MAX_LAYOUT_SYMBOLS})",
                                        "check the repeat counts")
            stack[-1].extend([last] * repeats)
        else:
            stack[-1].append(token)
    if len(stack) != 1:
        raise LayoutStringError(f"layout {layout!r}: unbalanced '('", "balance the parentheses")

    def flatten(items: list) -> list[str]:
        flat: list[str] = []
        for item in items:
            flat.extend(flatten(item) if isinstance(item, list) else [item])
        return flat

    stages: list[list[str]] = [[]]
    for symbol in flatten(stack[0]):
        if symbol == "|":
            stages.append([])
        else:
            stages[-1].append(symbol)
    return stages

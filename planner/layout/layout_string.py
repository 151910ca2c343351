"""Megatron pipeline layout strings, written: the one writer, beside the parser
(planner/layout/pipeline.py `expand_layout`, which reads them as Megatron-LM dev@d48bd6be
megatron/core/transformer/pipeline_parallel_layer_layout.py `parse_str_to_list` does).

Layout strings list each virtual pipeline stage (chunk) in pipeline order, separated by `|`:
`E` the embedding, `t` a decoder layer, `m` an MTP layer, `L` the loss; `t*N` repeats and
`(...|)*N` a run of equal chunks.
"""

from __future__ import annotations

from collections.abc import Sequence


def layout_string(counts: Sequence[int], mtp: int) -> str:
    """The layout of decoder-layer counts per chunk (pipeline order, at least two chunks): the
    embedding opens the first chunk, the MTP layers and the loss close the last, and runs of
    equal middle chunks are folded, e.g. [5, 8, 8, 8, 8, 8, 8, 8] with one MTP layer is
    `Et*5|(t*8|)*6t*8mL`."""
    parts = [f"E{_layers(counts[0])}", *(_layers(c) for c in counts[1:-1]),
             f"{_layers(counts[-1])}{'m' * mtp}L"]
    return _fold(parts)


def _layers(count: int) -> str:
    return f"t*{count}" if count > 2 else "t" * count


def _fold(parts: list[str]) -> str:
    """Join chunk strings with '|', writing runs of equal middle chunks as (..|)*n."""
    out, i = [parts[0]], 1
    while i < len(parts) - 1:
        j = i
        while j < len(parts) - 1 and parts[j] == parts[i]:
            j += 1
        run = j - i
        out.append(f"({parts[i]}|)*{run}" if run > 1 else f"{parts[i]}|")
        i = j
    return out[0] + "|" + "".join(out[1:]) + parts[-1]

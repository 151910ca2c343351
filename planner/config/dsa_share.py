"""DSA top-k shared across layers, as Megatron numbers it: which layers compute their own top-k
(and build an indexer) for a (dsa_indexer_topk_freq, dsa_indexer_skip_topk_offset) pair, the pair
that gives a per-layer pattern, and where a pipeline chunk may start.

Megatron-LM dev@d48bd6be megatron/core/transformer/experimental_attention_variant/dsa.py
is_dsa_skip_topk_layer: the 1-based layer n reuses an earlier top-k when
max(n - max(offset, 1), 0) % freq != 0, and source_dsa_compute_layer names the layer it reuses;
megatron/core/models/gpt/experimental_attention_variant_module_specs.py
_validate_dsa_index_share_pipeline_split refuses a stage whose reused top-k comes from outside it.
Hugging Face's GlmMoeDsaConfig writes the same choice per layer (indexer_types 'full' / 'shared').
"""

from __future__ import annotations

from collections.abc import Sequence


def computes_topk(layer: int, freq: int, offset: int) -> bool:
    """The 0-based `layer` computes its own top-k (Megatron's layer number is layer + 1; an MTP
    depth's is num_layers + depth, as DSAttention.__init__ numbers it)."""
    return freq <= 1 or max(layer + 1 - max(offset, 1), 0) % freq == 0


def source_layer(layer: int, freq: int, offset: int) -> int:
    """The 0-based layer whose top-k `layer` reuses (itself when it computes its own)."""
    if computes_topk(layer, freq, offset):
        return layer
    return layer - (layer + 1 - max(offset, 1)) % freq


def share_of(full: Sequence[bool], prefer: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """The (freq, offset) pair whose computing layers are exactly the True entries of `full`
    (one per decoder layer), `prefer` first when it gives them; None when no pair does (a
    pattern Megatron's two arguments cannot express). All True is (1, 0): nothing shared.

    Megatron's layers 1 .. max(offset, 1) all compute and the next one reuses: the first
    reusing 0-based layer j is the offset, and the next computing one, k, is freq layers after
    layer j - 1 (past the last layer when none follows)."""
    wanted = [bool(x) for x in full]
    n = len(wanted)

    def gives(freq: int, offset: int) -> bool:
        return all(computes_topk(i, freq, offset) == wanted[i] for i in range(n))

    if all(wanted):
        return 1, 0
    if prefer is not None and prefer[0] > 1 and prefer[1] >= 0 and gives(*prefer):
        return prefer
    first = wanted.index(False)
    following = next((k for k in range(first + 1, n) if wanted[k]), n)
    freq = following - first + 1
    return (freq, first) if first >= 1 and gives(freq, first) else None


def chunk_start_problems(starts: Sequence[int], freq: int, offset: int) -> list[tuple[int, int]]:
    """(start, source) for each pipeline chunk that starts on a layer reusing a top-k computed on
    an earlier chunk (`starts`: each chunk's first 0-based decoder layer): Megatron refuses it
    (_validate_dsa_index_share_pipeline_split). A chunk's later layers reuse only layers after
    its start, so its first layer is the one to check."""
    return [(start, source_layer(start, freq, offset)) for start in starts
            if not computes_topk(start, freq, offset)]


def computing_layers(num_layers: int, freq: int, offset: int) -> list[int]:
    """The 0-based decoder layers that compute their own top-k: where a chunk may start."""
    return [i for i in range(num_layers) if computes_topk(i, freq, offset)]


def movable_starts(starts: Sequence[int], num_layers: int, freq: int, offset: int) -> list[int] | None:
    """Each chunk's first layer moved to the nearest computing layer (the earlier one on a tie),
    keeping them increasing: the smallest change of a pipeline split that Megatron accepts; None
    when the chunks cannot all start on distinct computing layers."""
    computing = computing_layers(num_layers, freq, offset)
    moved: list[int] = []
    for start in starts:
        after = [c for c in computing if not moved or c > moved[-1]]
        if not after:
            return None
        moved.append(min(after, key=lambda c: (abs(c - start), c)))
    return moved

"""Layer kinds, one record each: what a kind of attention layer (or an attention feature) adds to
every formula page, so the pages sum over the kinds present instead of branching on a flag per
kind (the way planner/layout/group_kinds.py keeps one record per process-group kind).

The cut. The config's attention family (model.attention_variant: standard, MLA, DeepSeek-V4) owns
the projections every attention layer has (params, FLOPs, activations, TP widths: the pages'
family tables). A kind is what differs from that:

* a *mixer* is the token mixer of a layer, exactly one per layer, resolved once by
  `ModelSection.layer_mixers` (softmax, window, chunked, gated DeltaNet, MLA, V4's CSA/HCA/window,
  Mamba). Each family has one *base* mixer (softmax, mla, v4_window) counted over all blocks; the
  others either replace it on their layers (`Replace`: subtracted from the base's count, their own
  row written instead) or add to it (`Add`: V4's compressors sit beside the shared projections).
* a *feature* is a change every attention layer of its family carries (learnable sinks, the
  output gate, the head-wise gate, q/k norms, DSA's indexer): one more parameter row per block,
  one more projection term, or (`Rebase`) another core-attention row for the base.

`kind_sum` composes a page's per-layer rows over the kinds present, in `KINDS` order, so the
formula text is the one the pages wrote by hand before (the golden snapshots hold it). A record
whose `unmodelled` says why is refused (`kinds_of`, which every page reads the kinds through): a
config with such layers is never counted as attention.

The comm page's context-parallel part is a sum over the records too: `write_cp_bytes` writes
each kind's per-layer payloads (`cp_kv`, `cp_bytes`) and planner/budget/comm.py declares each
kind's `cp_exchanges`, closing what CP = 1 does not issue.

Adding a kind: one `LayerKind` in `KINDS` (and its name in `ModelSection.layer_mixers` for a
mixer, or its config switch in `present` for a feature), with its hand-derived test in
tests/unit/budget/test_layer_kinds.py; a CP exchange of a new collective also needs its entry in
planner/budget/collectives.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from planner.budget.collectives import Exchange
from planner.budget.expr import Book, Number, Symbol
from planner.budget.sparse_attention_time import write_dsa_kernels
from planner.budget.variant import Variant
from planner.config.schema import Config, ModelSection

MIXER, FEATURE = "mixer", "feature"
# The views `kind_sum` composes: the flops page's per-layer attention row as Megatron's
# num_floating_point_operations counts it (FLOPS), the flops page's core attention (CORE), the
# core attention as the time page's kernels run it (KERNEL), the attention weights (WEIGHTS), and
# the layers whose K/V a CP all-gather moves (KV).
FLOPS, CORE, KERNEL, WEIGHTS, KV = "flops", "core", "kernel", "weights", "kv"


@dataclass(frozen=True)
class Base:
    """The family's base row: counted over the blocks no other kind replaces."""
    row: str


@dataclass(frozen=True)
class Replace:
    """The kind's layers are taken from the base's count and counted at `row` ("" for nothing)."""
    row: str


@dataclass(frozen=True)
class Add:
    """The kind's layers add `row` beside the base's (counted, not taken from the base)."""
    row: str


@dataclass(frozen=True)
class Rebase:
    """A feature that gives the base another row (DSA's sparse kernel for MLA's core)."""
    row: str


Term = Base | Replace | Add | Rebase


# The rows a softmax-family base (standard or MLA attention) counts every block at: projections and
# core attention over the whole causal sequence, and its attention weights.
FULL_ATTENTION_TERMS: dict[str, tuple[Term, ...]] = {
    FLOPS: (Base("(flops_attention_linear_fwd_per_token + flops_attention_core_fwd_per_token)"),),
    CORE: (Base("flops_attention_core_fwd_per_token"),),
    KERNEL: (Base("flops_attention_core_fwd_per_token"),),
    WEIGHTS: (Base("attention_params_per_block"),)}


def _never(book: Book, v: Variant) -> str:
    return ""


def _no_terms(book: Book, v: Variant, attention_side: str) -> str:
    return ""


class CpExchanges(NamedTuple):
    """A kind's context-parallel exchanges as the comm page declares them (planner/budget/comm.py
    Collectives.exchange): each tuple of `declare` is one declaration (its forwards, then its
    backwards, as Megatron runs them), empty at CP = 1; `close` names the table entries that get
    "CP = 1" zero rows where they were not declared."""
    declare: tuple[tuple[Exchange, ...], ...] = ()
    close: tuple[str, ...] = ()


def _no_cp(v: Variant) -> CpExchanges:
    return CpExchanges()


@dataclass(frozen=True, eq=False)  # records compare by identity: one per kind
class LayerKind:
    """One attention mixer or attention feature and its share of every page."""

    name: str  # its name in Variant.kinds (and, for a mixer, in ModelSection.layer_mixers)
    role: str  # MIXER or FEATURE
    family: str  # the model.attention_variant it belongs to ("" for a mixer of no family)
    what: str  # one line: what the kind is, as the formulas page's VARIATIONS label says it
    megatron: str  # the Megatron source it follows
    present: Callable[[ModelSection], bool]  # the config has it (a flag, not a layer count)
    variations: tuple[tuple[str, dict[str, Any]], ...] = ()  # formulas page: label, Variant changes
    count: str = ""  # stage symbol of its layers (mixers other than their family's base)
    count_doc: str = ""
    model_count: str = ""  # the whole model's count of its layers (the flops page's)
    terms: Mapping[str, tuple[Term, ...]] = field(default_factory=dict)  # kind_sum's views
    # params page: rows of one block, returning " + row" terms of the attention side of a block
    block_params: Callable[[Book, Variant], str] = _never
    beside_norms: bool = False  # its block parameters come before the attention biases
    # params page: rows of its own layers, returning " + L_x * ..." terms of the stage
    layer_params: Callable[[Book, Variant, str], str] = _no_terms
    # params page: its share of the parameters replicated over TP (sequence-parallel grads)
    tp_replicated_block: str | Callable[[Variant], str] = ""  # per block
    tp_replicated_layers: Callable[[Variant], str] = lambda v: ""  # per stage
    projection_flops: tuple[str, str] = ("", "")  # flops page: (" + term", " and doc") per layer
    flops: Callable[[Book, Variant], None] = lambda book, v: None  # flops page rows
    activations: Callable[[Book, Variant, str], str] = _no_terms  # memory page: " + L_x * ..."
    kernels: Callable[[Book], None] = lambda book: None  # time page: its kernel rows
    kernel_note: str = ""  # time page: what its kernels change in the core attention's doc
    # comm page, CP > 1 only: one layer's K/V all-gather payload (formula, doc) for `cp_kv_bytes`,
    # a feature's replacing its family base's (DSA's latent key for MLA's per-head K and V)
    cp_kv: tuple[str, str] | tuple[()] = ()
    cp_bytes: Callable[[Book, Variant], None] = lambda book, v: None  # its own per-layer payloads
    cp_exchanges: Callable[[Variant], CpExchanges] = _no_cp  # its exchanges per step (collectives.py)
    unmodelled: str = ""  # why its figures are not modelled: a config with it is refused

    def replicated_block(self, v: Variant) -> str:
        """Its per-block share of the TP-replicated parameters under `v`."""
        block = self.tp_replicated_block
        return block if isinstance(block, str) else block(v)


# ------------------------------------------------------------------------------ standard family


def _softmax_present(m: ModelSection) -> bool:
    return m.attention_variant == "standard"


def _standard(flag: Callable[[ModelSection], bool]) -> Callable[[ModelSection], bool]:
    """A standard-attention feature: the flag, on standard attention only."""
    return lambda m: m.attention_variant == "standard" and flag(m)


def _kv_exchange(v: Variant) -> CpExchanges:
    """Under CP every softmax-family attention layer all-gathers its local K and V (`cp_kv_bytes`,
    its family base's or a feature's payload); backward reduce-scatters dK, dV. A gated DeltaNet
    layer exchanges none (`attention_blocks` leaves it out). Window and chunked layers run the
    same exchange as full attention: Megatron hands window_size to Transformer Engine's attention
    (Megatron-LM dev@d48bd6be
    megatron/core/extensions/transformer_engine.py TEDotProductAttention.__init__). CP = 1 writes
    no zero rows for it."""
    if not v.cp:
        return CpExchanges()
    kv = f"cp_kv_bytes * {attention_blocks(v)} * microbatches"
    return CpExchanges(((Exchange("cp_kv_gather", "cp", kv, f"CP * {kv}", "CP all-gather of local K and V",
                                  "its backward reduce-scatter of dK, dV"),),))


SOFTMAX = LayerKind(
    "softmax", MIXER, "standard", "standard (softmax) attention over the whole causal sequence",
    "Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py SelfAttention",
    _softmax_present,
    variations=(("standard attention with CP > 1", {"kinds": frozenset({"softmax"}), "cp": True}),),
    terms=FULL_ATTENTION_TERMS,
    cp_kv=("b * S / cp_runtime * 2 * groups * d * p / TP",
           "local K and V of one attention layer (all-gathered over CP)"),
    cp_exchanges=_kv_exchange,
)


def _window_flops(book: Book, v: Variant) -> None:
    """Sliding-window core attention as it runs. Megatron's (Megatron-LM dev@d48bd6be
    megatron/training/training.py num_floating_point_operations) has no window term: its figure
    (flops_per_token) counts window layers over the whole causal sequence like full ones, so these
    rows feed only the time page. A causal query at position i reads
    min(i + 1, K) keys, K = window_keys (left window + itself) capped at S; over S queries that
    averages K · (1 − (K − 1) / (2S))."""
    add = book.add
    add("flops_window_keys_avg", "Min(window_keys, S) * (1 - (Min(window_keys, S) - 1) / (2 * S))",
        "keys", "flops", "average keys a sliding-window query reads under the causal mask")
    add("flops_attention_window_core_fwd_per_token", "2 * 2 * heads * d * flops_window_keys_avg",
        "FLOP", "flops", "one sliding-window attention layer's QKᵀ and softmax·V per token as "
        "computed (moeplan's count; Megatron's FLOPs figure counts the layer as full attention)")
    add("flops_window_fwd_per_token", "L_model_window * (flops_attention_window_core_fwd_per_token"
        " - flops_attention_core_fwd_per_token)", "FLOP", "flops",
        "what the model's window layers change in one forward per token against Megatron's "
        "full-attention count (negative: work the window skips)")


WINDOW = LayerKind(
    "window", MIXER, "standard", "sliding-window attention layers (window_size)",
    "Megatron-LM dev@d48bd6be megatron/core/transformer/utils.py is_layer_window_attention "
    "(window_size, window_attn_skip_freq)",
    _standard(lambda m: m.window_size is not None),
    variations=(("sliding-window attention layers (window_size)",
                 {"kinds": frozenset({"softmax", "window"}), "cp": False}),),
    count="L_window", count_doc="sliding-window attention layers on the stage (decoder layers)",
    model_count="L_model_window",
    terms={KERNEL: (Replace("flops_attention_window_core_fwd_per_token"),)},
    flops=_window_flops, kernel_note="sliding-window and chunked layers over their keys",
)


def _chunked_flops(book: Book, v: Variant) -> None:
    """Chunked attention as it runs (Llama 4's RoPE layers): a query reads the causal part of its
    own chunk of C = attention_chunk_size tokens, so the core term is Megatron's causal one over
    Min(C, S) keys instead of S (equal to it while S <= C, where chunking changes nothing).
    Megatron has no chunked attention; these rows feed only the time page."""
    add = book.add
    add("flops_attention_chunk_core_fwd_per_token", "2 * heads * d * Min(chunk_keys, S)", "FLOP",
        "flops", "one chunked-attention layer's QKᵀ and softmax·V per token over the causal half "
        "of its chunk (moeplan's count)")
    add("flops_chunk_fwd_per_token", "L_model_chunked * (flops_attention_chunk_core_fwd_per_token"
        " - flops_attention_core_fwd_per_token)", "FLOP", "flops",
        "what the model's chunked layers change in one forward per token against Megatron's "
        "full-attention count (0 while S <= attention_chunk_size)")


CHUNKED = LayerKind(
    "chunked", MIXER, "standard", "chunked attention layers (attention_chunk_size)",
    "Hugging Face Llama4TextAttention (attention_chunk_size on its RoPE layers); Megatron has none",
    _standard(lambda m: m.attention_chunk_size is not None),
    variations=(("chunked attention layers (attention_chunk_size)",
                 {"kinds": frozenset({"softmax", "chunked"}), "cp": False}),),
    count="L_chunked", count_doc="chunked-attention layers on the stage (decoder layers)",
    model_count="L_model_chunked",
    terms={KERNEL: (Replace("flops_attention_chunk_core_fwd_per_token"),)},
    flops=_chunked_flops, kernel_note="sliding-window and chunked layers over their keys",
)


def _gdn_layer_params(book: Book, v: Variant, attention_side: str) -> str:
    """One gated DeltaNet layer (Megatron-LM dev@d48bd6be megatron/core/ssm/gated_delta_net/
    common.py _GDNBase.__init__ and gdn.py GatedDeltaNet): in_proj h → q, k (la_qk each), v, the
    output gate z (la_v each) and beta, alpha (la_nv each); the depthwise conv1d over q, k, v
    (la_conv taps, no bias); dt_bias and A_log per value head; the gated RMSNorm over one value
    head (la_dv, whole on every TP rank); out_proj la_v → h. Everything but the norm is split
    over TP by heads. It replaces the layer's softmax attention (the block keeps its two norms)."""
    book.add("gdn_params_per_layer", "(h * (2 * la_qk + 2 * la_v + 2 * la_nv) + (2 * la_qk + la_v)"
             " * la_conv + 2 * la_nv + la_v * h) / TP + la_dv", "params", "memory",
             "gated DeltaNet projections, short convolution, decay/step parameters and output "
             "norm of one linear-attention layer on this rank")
    return f" + L_linear * (gdn_params_per_layer - ({attention_side}))"


def _gdn_flops(book: Book, v: Variant) -> None:
    book.add("flops_gdn_fwd_per_token", "2 * (h * (2 * la_qk + 2 * la_v + 2 * la_nv) + la_conv"
             " * (2 * la_qk + la_v) + 4 * la_nv * la_dv ** 2 + h * la_v)", "FLOP", "flops",
             "one gated DeltaNet layer per token, as Megatron's num_floating_point_operations "
             "counts it: in_proj, the short convolution, the delta rule (KKᵀ, VKᵀ, the state "
             "update and SQ over one value head each) and out_proj; token-linear, no S term")


# Chunk length of flash-linear-attention's chunked gated delta rule (fla.ops.gated_delta_rule
# chunk_gated_delta_rule, BT = 64): its saved WY matrix A holds 64 fp32 entries per token and head.
GDN_CHUNK = 64


def _gdn_activations(book: Book, v: Variant, per_block: str) -> str:
    """What one gated DeltaNet layer keeps for backward instead of softmax attention's tensors
    (Megatron-LM dev@d48bd6be megatron/core/ssm/gated_delta_net/gdn.py GatedDeltaNet.forward and
    the chunked kernel it calls): the norm's input and output, the short convolution's input and
    output (q, k, v: 2·la_qk + la_v each), the output gate z, the kernel output and the gated
    norm's output (la_v each) in the training precision, and per value head the fp32 step and
    decay (beta, g) and the kernel's chunk matrix A (GDN_CHUNK entries). The recurrent state is
    recomputed per chunk in backward, not stored, and no final state exists in training:
    GatedDeltaNet._forward_compute calls the kernel with initial_state=None and
    output_final_state=False (and the short convolution likewise), so it adds 0 bytes per layer
    and microbatch. The layer keeps its block's other tensors (the MLP side, dropout, mHC); its
    softmax-attention terms are taken back."""
    book.add("act_gdn_per_layer", f"tokens_per_rank * (({_norm_rows(v)} + 4 * la_qk + 5 * la_v) * p"
             f" + la_nv * (2 + {GDN_CHUNK}) * 4)", "bytes", "memory",
             "per microbatch: one gated DeltaNet layer's stored tensors (its conv and kernel "
             "inputs, gate, outputs; fp32 step, decay and chunk matrix per value head)")
    _beyond_attention(book, "act_gdn_per_layer", per_block, "a gated DeltaNet layer")
    return " + L_linear * act_gdn_per_layer_extra"


def _norm_rows(v: Variant) -> str:
    """The pre-norm's stored rows per token of a mixer layer: its input and output (h each), only
    its input when layernorm is recomputed."""
    return "h" if "layernorm" in v.recompute_modules else "2 * h"


def _beyond_attention(book: Book, name: str, per_block: str, what: str) -> None:
    """`<name>_extra`: what a mixer layer counted as a softmax-attention block stores beyond that
    block's attention tensors (and its q/k-norm tensors, where the block has them)."""
    attention = "act_attention_per_block" + (" + act_qk_norm_per_block" if "act_qk_norm_per_block"
                                             in per_block else "")
    book.add(f"{name}_extra", f"{name} - ({attention})", "bytes", "memory",
             f"per microbatch: what {what} stores beyond the softmax-attention block it is "
             "counted as")


GDN_CP = ("Megatron-LM dev@d48bd6be megatron/core/ssm/gated_delta_net/gdn.py GatedDeltaNet.forward "
          "(linear_cp_mode 'chunkwise', TransformerConfig's default)")


def _gdn_cp_bytes(book: Book, v: Variant) -> None:
    """A gated DeltaNet layer under CP exchanges no K/V. In Megatron's default chunkwise mode
    (GDN_CP) the layer converts a zigzag CP layout to the contiguous one and back
    (convert_module_input_tensors_cp_partition_mode, an all-to-all of the hidden rows,
    megatron/core/context_parallel_layout/conversion.py) and calls flash-linear-attention with a
    CP context (fla.ops.cp build_cp_context): the short convolution sends its last la_conv − 1 input
    rows to the next CP rank (conv_cp_send_recv_fwd; their grads come back), and the chunked delta
    rule all-gathers each rank's fp32 state and transition matrix [value heads, d_k, d_k + d_v]
    (chunk_gated_delta_rule_fwd_h_pre_process; the backward gathers their gradients alike,
    chunk_gated_delta_rule_bwd_dhu_pre_process). Bytes of one layer and microbatch."""
    add = book.add
    add("cp_gdn_state_bytes", "la_nv / TP * la_dk * (la_dk + la_dv) * 4", "bytes", "bytes",
        "gated DeltaNet: one rank's fp32 chunk state and transition matrix (all-gathered over CP)")
    add("cp_gdn_conv_bytes", "(la_conv - 1) * (2 * la_qk + la_v) / TP * p", "bytes", "bytes",
        "gated DeltaNet: the short convolution's last la_conv − 1 input rows (to the next CP rank)")
    add("cp_gdn_relayout_bytes", "gdn_cp_relayout * tokens_per_rank * h * p", "bytes", "bytes",
        "gated DeltaNet: the hidden rows of one zigzag ↔ contiguous conversion (all-to-all)")


def _gdn_cp_exchanges(v: Variant) -> CpExchanges:
    """Per step, over the stage's DeltaNet layers (_gdn_cp_bytes gives one layer's payloads)."""
    closed = ("cp_gdn_state_gather", "cp_gdn_conv_boundary", "cp_gdn_relayout")
    if not v.cp:
        return CpExchanges(close=closed)
    m = "microbatches"
    state = f"cp_gdn_state_bytes * L_linear * {m}"
    relayout = f"2 * cp_gdn_relayout_bytes * L_linear * {m}"
    conv = f"cp_gdn_conv_bytes * L_linear * {m}"
    return CpExchanges((
        (Exchange("cp_gdn_state_gather", "cp", state, f"CP * {state}",
                  "CP all-gather of the DeltaNet chunk states", "CP all-gather of their gradients"),
         Exchange("cp_gdn_relayout", "cp", relayout, relayout,
                  "zigzag → contiguous and back around each DeltaNet layer",
                  "the same conversions of the gradients")),
        (Exchange("cp_gdn_conv_boundary", "cp", f"cp_has_next * {conv}", f"cp_has_prev * {conv}",
                  "DeltaNet conv boundary rows to the next CP rank",
                  "their grads back to the previous CP rank"),)), closed)


GDN = LayerKind(
    "gdn", MIXER, "standard", "gated DeltaNet layers (linear_attention_freq)",
    "Megatron-LM dev@d48bd6be megatron/core/ssm/gated_delta_net/gdn.py GatedDeltaNet",
    _standard(lambda m: m.linear_attention_freq is not None),
    variations=(("gated DeltaNet layers (linear_attention_freq)",
                 {"kinds": frozenset({"softmax", "gdn"}), "cp": False}),
                ("gated DeltaNet layers with CP > 1 (chunkwise linear CP)",
                 {"kinds": frozenset({"softmax", "gdn"}), "cp": True})),
    count="L_linear", count_doc="gated DeltaNet layers on the stage (decoder and MTP layers)",
    model_count="L_model_linear",
    terms={FLOPS: (Replace("flops_gdn_fwd_per_token"),), CORE: (Replace(""),),
           KERNEL: (Replace(""),), WEIGHTS: (Replace("gdn_params_per_layer"),), KV: (Replace(""),)},
    layer_params=_gdn_layer_params,
    # a DeltaNet layer has no q/k norms but its whole output norm (la_dv)
    tp_replicated_layers=lambda v: (" + L_linear * (la_dv - qk_norm_params_per_block)" if v.qk_norm
                                    else " + L_linear * la_dv"),
    flops=_gdn_flops, activations=_gdn_activations,
    cp_bytes=_gdn_cp_bytes, cp_exchanges=_gdn_cp_exchanges,
)


# ------------------------------------------------------------------------------ MLA family

MLA = LayerKind(
    "mla", MIXER, "mla", "multi-latent attention (MLA)",
    "Megatron-LM dev@d48bd6be megatron/core/transformer/multi_latent_attention.py MLASelfAttention",
    lambda m: m.attention_variant == "mla",
    variations=(("MLA attention with CP > 1", {"kinds": frozenset({"mla"}), "cp": True}),
                ("MLA with a query LoRA", {"kinds": frozenset({"mla"}), "mla_q_lora": True, "cp": False}),
                ("MLA without a query LoRA",
                 {"kinds": frozenset({"mla"}), "mla_q_lora": False, "cp": False})),
    terms=FULL_ATTENTION_TERMS,
    # MLA attends with per-head K (nope + rope parts) and V after the up projections, and context
    # parallelism exchanges those (Megatron-LM dev@d48bd6be
    # megatron/core/transformer/multi_latent_attention.py MLASelfAttention.forward)
    cp_kv=("b * S / cp_runtime * heads * (d_qk + qk_rope + d_v) * p / TP",
           "MLA: local per-head K and V of one attention layer (all-gathered over CP)"),
    cp_exchanges=_kv_exchange,
)


# ------------------------------------------------------------------------------ Kimi Delta Attention

KDA_SRC = ("Hugging Face transformers 5.25 src/transformers/models/kimi_linear/modeling_kimi_linear.py "
           "KimiLinearDeltaAttention (Megatron-LM dev has no KDA layer)")
# How a KDA layer splits over TP where it is trained with Megatron: only Megatron-Bridge's
# michal2409/Megatron-Bridge@269a192c src/megatron/bridge/models/kimi/kimi_linear_bridge.py
# KimiLinearBridge.mapping_registry says it (q/k/v, their convolutions, A_log, dt_bias, f_b, g_b
# and b column-parallel, o_proj row-parallel; f_a, g_a and o_norm replicated).
KDA_TP = "michal2409/Megatron-Bridge@269a192c kimi/kimi_linear_bridge.py KimiLinearBridge"


def _kda_layer_params(book: Book, v: Variant, attention_side: str) -> str:
    """One KDA layer (KDA_SRC __init__ and KimiLinearForgetGate): q_proj, k_proj, v_proj h → kda_d
    each; the depthwise conv1d over q, k, v (kda_conv taps, no bias); the low-rank per-channel
    decay f_a h → kda_dh, f_b kda_dh → kda_d with dt_bias per channel and A_log per head; beta
    b_proj h → heads; the low-rank output gate g_a h → kda_dh, g_b kda_dh → kda_d; the gated
    RMSNorm over one head (kda_dh); o_proj kda_d → h; no biases. Split over TP as KDA_TP maps it:
    everything but f_a, g_a and the norm by heads. It replaces the layer's MLA (the block keeps its
    two norms)."""
    book.add("kda_params_per_layer", "(h * (4 * kda_d + kda_nh) + 3 * kda_conv * kda_d"
             " + 2 * kda_dh * kda_d + kda_d + kda_nh) / TP + 2 * h * kda_dh + kda_dh", "params",
             "memory", "KDA projections, short convolutions, low-rank decay and gate, dt_bias, "
             "A_log and output norm of one Kimi Delta Attention layer on this rank")
    return f" + L_kda * (kda_params_per_layer - ({attention_side}))"


def _kda_flops(book: Book, v: Variant) -> None:
    book.add("flops_kda_fwd_per_token", "2 * (h * (4 * kda_d + 2 * kda_dh + kda_nh)"
             " + 2 * kda_dh * kda_d + 3 * kda_conv * kda_d + 4 * kda_nh * kda_dh ** 2)", "FLOP",
             "flops", "one KDA layer per token: its projections (q, k, v, o, the low-rank decay "
             "and gate, beta), the short convolutions and the chunked delta rule counted as "
             "Megatron counts gated DeltaNet's (KKᵀ, VKᵀ, the state update and SQ over one head "
             "each; the per-channel decay's elementwise work left out); token-linear, no S term")


def _kda_activations(book: Book, v: Variant, per_block: str) -> str:
    """What one KDA layer keeps for backward (KDA_SRC forward and flash-linear-attention's
    chunk_kda, the gated DeltaNet kernel family): the norm's input and output, the short
    convolutions' inputs and outputs (q, k, v: kda_d each), the output gate, the kernel output and
    the gated norm's output (kda_d each) and the two low-rank intermediates (kda_dh each) in the
    training precision; in fp32 the per-channel decay g (kda_d), beta per head and the chunk
    matrix A per head (GDN_CHUNK entries, as gated DeltaNet's). Approximate: the per-channel
    kernel's own extra chunk tensors are counted as GDN's. No recurrent state in training (no
    initial or final state). Its MLA tensors are taken back."""
    book.add("act_kda_per_layer", f"tokens_per_rank * (({_norm_rows(v)} + 9 * kda_d + 2 * kda_dh)"
             f" * p + (kda_d + kda_nh * (1 + {GDN_CHUNK})) * 4)", "bytes", "memory",
             "per microbatch: one KDA layer's stored tensors (conv and kernel inputs, gate, "
             "outputs; fp32 per-channel decay, beta and chunk matrix per head)")
    _beyond_attention(book, "act_kda_per_layer", per_block, "a KDA layer")
    return " + L_kda * act_kda_per_layer_extra"


KDA = LayerKind(
    "kda", MIXER, "mla", "Kimi Delta Attention layers among MLA layers (kda_layers)", KDA_SRC,
    lambda m: m.attention_variant == "mla" and m.kda_layers is not None and any(m.kda_layers),
    variations=(("Kimi Delta Attention layers among MLA layers (kda_layers)",
                 {"kinds": frozenset({"mla", "kda"}), "mla_q_lora": False, "cp": False}),),
    count="L_kda", count_doc="Kimi Delta Attention layers on the stage (decoder layers)",
    model_count="L_model_kda",
    terms={FLOPS: (Replace("flops_kda_fwd_per_token"),), CORE: (Replace(""),),
           KERNEL: (Replace(""),), WEIGHTS: (Replace("kda_params_per_layer"),), KV: (Replace(""),)},
    layer_params=_kda_layer_params,
    # f_a, g_a and the output norm are whole on every TP rank; MLA's duplicated down projections
    # and latent norms are not in a KDA layer
    tp_replicated_layers=lambda v: " + L_kda * (2 * h * kda_dh + kda_dh"
                                   " - mla_duplicated_params_per_block)",
    flops=_kda_flops, activations=_kda_activations,
)


def dsa_indexer_layers(v: Variant, suffix: str = "") -> str:
    """The stage's layers that build a DSA indexer and compute their own top-k (`suffix`
    "_recomputed": those full recompute re-runs): every block, or with the top-k shared across
    layers (the dsa_share feature) only the computing ones (Megatron-LM dev@d48bd6be
    megatron/core/transformer/experimental_attention_variant/dsa.py DSAttention.__init__ builds
    no indexer on an is_dsa_skip_topk_layer; DSAttention.forward takes its source layer's picks)."""
    return ("L_dsa_topk" if v.has("dsa_share") else "blocks") + suffix


def _dsa_params(book: Book, v: Variant) -> str:
    # megatron/core/transformer/experimental_attention_variant/dsa.py DSAIndexer.__init__:
    # linear_wq_b [q_lora → idx_heads·idx_dim], linear_wk [h → idx_dim], k_norm (LayerNorm,
    # weight and bias) and linear_weights_proj [h → idx_heads], all "duplicated" over TP.
    book.add("dsa_indexer_params_per_block", "idx_heads * idx_dim * q_lora + h * idx_dim"
             " + 2 * idx_dim + h * idx_heads", "params", "memory",
             "DSA lightning indexer (whole on every TP rank)")
    return "" if v.has("dsa_share") else " + dsa_indexer_params_per_block"


def _dsa_layer_params(book: Book, v: Variant, attention_side: str) -> str:
    """With the top-k shared, only the computing layers hold an indexer."""
    return " + L_dsa_topk * dsa_indexer_params_per_block" if v.has("dsa_share") else ""


def _dsa_activations(book: Book, v: Variant, per_block: str) -> str:
    """What DSA's attention core keeps for backward on the path Megatron takes by default
    (dsa_kernel_backend none, dsa_indexer_loss_coeff unset): Megatron-LM dev@d48bd6be
    megatron/core/transformer/experimental_attention_variant/dsa.py DSAttention.forward runs the
    lightning indexer under torch.no_grad (no indexer loss), so the indexer keeps nothing and its
    top-k indices only build a mask outside the graph; the sparse attention is
    _unfused_absorbed_dsa_fn over the dense [b, heads/TP, S/CP, S] scores (the key gathered over
    TP-SP and CP: S rows). Autograd keeps per score element the three bool masks of
    dsa_masking.masked_softmax's masked_fill calls, exp's fp32 output, the fp32 numerator of its
    division and the probabilities cast to the training dtype for the value matmul (3 + 4 + 4 + p
    bytes); per score row the max's int64 indices, torch.where's bool condition and the clamped
    fp32 row sum kept by clamp_min and the division (8 + 1 + 4 + 4); the fp32 query copy of the
    score matmul; the latent output and the V up-projection weight's contiguous copy kept by the
    up_v einsum; and on the key side, with b = 1, the
    fp32 key copy and the latent key the value matmul reads as a view (one tensor at fp32), with
    b > 1 torch.matmul's expanded copies per head (fp32 key, latent value). Selective core_attn
    recompute checkpoints the whole core (experimental_attention_variant/absorbed_mla.py
    AbsorbedMLASelfAttention._checkpointed_attention_forward): the layer keeps the checkpoint's
    absorbed query and latent key instead, and one layer's core is re-materialised in backward."""
    add = book.add
    add("dsa_score_elements", "b * heads / TP * S / cp_runtime * S", "count", "memory",
        "per microbatch and DSA layer: the dense scores of the unfused absorbed sparse attention "
        "(the rank's heads, its S/CP queries, all S keys)")
    add("dsa_score_rows", "b * heads / TP * S / cp_runtime", "count", "memory",
        "per microbatch and DSA layer: score rows (the rank's heads times its queries)")
    wide = "Min(b - 1, 1)"  # 0 at micro-batch 1 (matmul views the broadcast key), 1 above
    # the up_v einsum also keeps DSAttention.forward's contiguous copy of the V up-projection
    # weight (AbsorbedMLASelfAttention._get_kv_up_weights slices the combined kv_up weight)
    # at micro-batch 1 the fp32 key copy (the key itself at fp32) and the latent key viewed; under
    # mla_up_proj recompute the latent key's storage is discarded after the forward
    # (CheckpointWithoutOutput.discard_output_and_register_recompute) and rebuilt for backward
    narrow = ("4 * Min(4 - p, 1)" if "mla_up_proj" in v.recompute_modules and v.recompute != "full"
              else "4 + Min(4 - p, 1) * p")
    add("act_dsa_core_per_layer", "dsa_score_elements * (11 + p) + dsa_score_rows * (17 + 4 * "
        f"(kv_lora + qk_rope) + kv_lora * p) + S * ((1 - {wide}) * (kv_lora + qk_rope) * ({narrow})"
        f" + {wide} * b * heads / TP * (4 * (kv_lora + qk_rope) + kv_lora * p))"
        " + heads / TP * d_v * kv_lora * p",
        "bytes", "memory",
        "per microbatch: what one DSA layer's unfused sparse attention keeps (dsa_kernel_backend "
        "none): masks, exp output, numerator and cast probabilities of the dense scores "
        "(3 + 4 + 4 + p bytes each), per row the max indices, where condition and row sums, the "
        "fp32 query, the latent output, the fp32 and latent key (per head above micro-batch 1) and "
        "the contiguous copy of the V up-projection weight the output einsum reads")
    # transients of one DSA layer's forward (also in its re-run under recompute): the indexer's
    # no-grad scores, einsum output and ReLU output (then the weighted product) in fp32
    # [S/CP, b, idx_heads, S] on every TP rank (dsa.py _compute_index_scores); in the core, at
    # masked_softmax's last masked_fill: the caller's masked scores, masked_logits, the division's
    # output and the masked_fill's own output (saved, not transient, at fp32 where the value
    # matmul reads it uncast), fp32 each, beside the fp32 index mask and its bool validity
    # In the core's backward, at the division's gradient for its divisor (-grad · (self / other)
    # / other): the incoming fp32 gradient, the divided gradient, the quotient, the negated
    # gradient and their product, 5 fp32 score tensors, once the cast probabilities (p) and the
    # last mask (1) are freed: (19 - p) bytes per score element beyond the stored set
    add("dsa_transient_bytes", "Max(2 * b * S / cp_runtime * idx_heads * S * 4, "
        "dsa_score_elements * (12 + 4 * Min(4 - p, 1)) + 5 * b * S / cp_runtime * S, "
        "dsa_score_elements * (19 - p))", "bytes", "memory",
        "one DSA layer's largest transient: the indexer's two fp32 [S/CP, b, idx_heads, S] score "
        "tensors; the sparse attention's fp32 score tensors unsaved at the softmax's end (four, "
        "three at fp32) with the fp32 index mask and bool validity [b, S/CP, S]; or its "
        "backward's five fp32 score gradients less the freed cast probabilities and mask")
    if "core_attn" in v.recompute_modules and v.recompute != "full":
        add("act_dsa_core_inputs_per_layer", "dsa_score_rows * (kv_lora + qk_rope) * p"
            " + b * S / cp_runtime * (kv_lora + qk_rope) * p", "bytes", "memory",
            "per microbatch: selective core_attn recompute keeps the checkpointed DSA core's "
            "absorbed query and gathered latent key instead of its scores")
        return f" + {attention_blocks(v)} * act_dsa_core_inputs_per_layer"
    # every attention block is a DSA layer (the computing and the top-k-sharing ones alike)
    return f" + {attention_blocks(v)} * act_dsa_core_per_layer"


def _dsa_cp_bytes(book: Book, v: Variant) -> None:
    """DSA under CP (Megatron-LM dev@d48bd6be megatron/core/transformer/
    experimental_attention_variant/dsa.py DSAttention.forward, all-gather CP only): the absorbed
    MLA attention gathers its single latent key [kv_lora + qk_rope] (value None), whole on every TP
    rank (the record's `cp_kv`), and the lightning indexer gathers its keys [idx_dim]; backward
    reduce-scatters both."""
    book.add("cp_dsa_indexer_k_bytes", "b * S / cp_runtime * idx_dim * p", "bytes", "bytes",
             "DSA: the lightning indexer's local keys of one layer (all-gathered over CP)")


def _dsa_cp_exchanges(v: Variant) -> CpExchanges:
    closed = ("cp_dsa_indexer_k_gather",)
    if not v.cp:
        return CpExchanges(close=closed)
    keys = f"cp_dsa_indexer_k_bytes * {dsa_indexer_layers(v)} * microbatches"
    return CpExchanges(((Exchange("cp_dsa_indexer_k_gather", "cp", keys, f"CP * {keys}",
                                  "CP all-gather of the DSA indexer keys",
                                  "its backward reduce-scatter of the indexer-key grads"),),), closed)


DSA = LayerKind(
    "dsa", FEATURE, "mla", "DSA: MLA with a lightning indexer (dsa)",
    "Megatron-LM dev@d48bd6be megatron/core/transformer/experimental_attention_variant/dsa.py "
    "DSAttention, DSAIndexer",
    lambda m: m.attention_variant == "mla" and m.dsa,
    variations=(("DSA: MLA with a lightning indexer (dsa)",
                 {"kinds": frozenset({"mla", "dsa"}), "mla_q_lora": True, "cp": False}),
                ("DSA with CP > 1 (latent key and indexer keys all-gathered)",
                 {"kinds": frozenset({"mla", "dsa"}), "mla_q_lora": True, "cp": True})),
    terms={KERNEL: (Rebase("time_dsa_core_flops"),)},
    block_params=_dsa_params, layer_params=_dsa_layer_params, activations=_dsa_activations,
    # the indexer's grads are averaged over TP (average_gradients_across_tp_domain)
    tp_replicated_block=lambda v: "" if v.has("dsa_share") else " + dsa_indexer_params_per_block",
    tp_replicated_layers=lambda v: (" + L_dsa_topk * dsa_indexer_params_per_block"
                                    if v.has("dsa_share") else ""),
    kernels=write_dsa_kernels,
    cp_kv=("b * S / cp_runtime * (kv_lora + qk_rope) * p",
           "DSA: the local latent key of one attention layer (all-gathered over CP)"),
    cp_bytes=_dsa_cp_bytes, cp_exchanges=_dsa_cp_exchanges,
)

DSA_SHARE = LayerKind(
    "dsa_share", FEATURE, "mla",
    "DSA with its top-k shared across layers (dsa_indexer_topk_freq > 1: indexers on the "
    "computing layers only)",
    "Megatron-LM dev@d48bd6be megatron/core/transformer/experimental_attention_variant/dsa.py "
    "is_dsa_skip_topk_layer, DSAttention.__init__",
    lambda m: m.attention_variant == "mla" and m.dsa and m.dsa_indexer_topk_freq > 1,
    variations=(("DSA with its top-k shared across layers (indexers on L_dsa_topk layers)",
                 {"kinds": frozenset({"mla", "dsa", "dsa_share"}), "mla_q_lora": True, "cp": False}),
                ("DSA with its top-k shared, CP > 1 (indexer keys gathered on L_dsa_topk layers)",
                 {"kinds": frozenset({"mla", "dsa", "dsa_share"}), "mla_q_lora": True,
                  "cp": True})),
)


# ------------------------------------------------------------------------------ DeepSeek-V4 family

V4 = "Megatron-LM dev@d48bd6be megatron/core/transformer/experimental_attention_variant/"


def _v4_present(m: ModelSection) -> bool:
    return m.attention_variant == "dsv4_hybrid"


def _csa_params(book: Book, v: Variant, attention_side: str) -> str:
    book.add("csa_params_per_layer", "(4 * d * h + csa_ratio * 2 * d + d + idx_heads * idx_dim * q_lora"
             " + idx_heads * h + 4 * idx_dim * h + csa_ratio * 2 * idx_dim + idx_dim) / (TP * GTP)",
             "params", "memory", "CSA compressor (overlapping, 2x width) + lightning indexer")
    return " + L_csa * csa_params_per_layer"


def _hca_params(book: Book, v: Variant, attention_side: str) -> str:
    book.add("hca_params_per_layer", "(2 * d * h + hca_ratio * d + d) / (TP * GTP)", "params",
             "memory", "HCA compressor")
    return " + L_hca * hca_params_per_layer"


def _csa_flops(book: Book, v: Variant) -> None:
    """DeepSeek-V4: every layer has the MLA-style projections and window attention (the family's
    shared rows, written with the first V4 kind); CSA adds top-k compressed keys, its compressor
    and the lightning indexer."""
    add = book.add
    add("flops_v4_projection_fwd_per_token",
        "2 * (q_lora * (h + heads * d_v + 1) + h * d_v + d_v + heads * d_v * o_lora"
        " + o_groups * o_lora * h)", "FLOP", "flops",
        "one V4 attention layer's q (through q_lora), joint KV and grouped low-rank output "
        "projections per token")
    add("flops_v4_window_fwd_per_token", "2 * 2 * heads * csa_window * d_v", "FLOP", "flops",
        "sliding-window attention per token (every V4 layer): QKᵀ and softmax·V over the window")
    add("flops_v4_csa_topk", "Min(idx_topk, floor(S / 4))", "entries", "flops",
        "compressed entries a CSA query attends (index_topk, at most S/4)")
    add("flops_v4_csa_avg_compressed", "flops_v4_csa_topk * (1 - flops_v4_csa_topk * 4 / (2 * S))",
        "entries", "flops", "average compressed entries per query under the causal mask")
    add("flops_attention_csa_fwd_per_token",
        "flops_v4_projection_fwd_per_token + 2 * (2 * heads * (csa_window + flops_v4_csa_avg_compressed)"
        " * d_v + 2 * h * 2 * d_v + 2 * h * 2 * idx_dim + q_lora * idx_heads * idx_dim"
        " + h * idx_heads + idx_heads * idx_dim * S / 4)", "FLOP", "flops",
        "one CSA layer per token: projections, window + top-k compressed attention, the "
        "overlapping compressor (2x width), the indexer's compressor, q and weight projections "
        "and its scoring of ~S/4 compressed keys")


def _hca_flops(book: Book, v: Variant) -> None:
    book.add("flops_attention_hca_fwd_per_token",
             "flops_v4_projection_fwd_per_token + 2 * (2 * heads * csa_window * d_v + 2 * h * d_v"
             " + heads * d_v * S / 128)", "FLOP", "flops",
             "one HCA layer per token: projections, window attention, the compressor and attention "
             "over all ~S/128 causal compressed keys (Megatron counts ratio 128)")


def _swa_flops(book: Book, v: Variant) -> None:
    book.add("flops_attention_swa_fwd_per_token",
             "flops_v4_projection_fwd_per_token + flops_v4_window_fwd_per_token", "FLOP", "flops",
             "one window-only V4 layer per token: projections and window attention")


def _csa_activations(book: Book, v: Variant, per_block: str) -> str:
    book.add("act_csa_per_layer", "tokens_per_rank * ((4 * d + idx_heads * idx_dim + idx_heads"
             " + 4 * idx_dim) * p + idx_topk * 4)", "bytes", "memory",
             "per microbatch: CSA compressor, indexer scores and int32 top-k indices")
    return " + L_csa * act_csa_per_layer"


def _hca_activations(book: Book, v: Variant, per_block: str) -> str:
    book.add("act_hca_per_layer", "tokens_per_rank * 2 * d * p", "bytes", "memory",
             "per microbatch: HCA compressor")
    return " + L_hca * act_hca_per_layer"


def _v4_cp_activations(book: Book, v: Variant, per_block: str) -> str:
    if not v.cp:
        return ""
    book.add("act_v4_cp_per_microbatch", "cp_boundary_bytes + (L_csa * cp_boundary_rows_csa"
             " + L_hca * cp_boundary_rows_hca + (blocks - L_csa - L_hca) * cp_boundary_rows_swa)"
             " * d * p + CP * (cp_compressed_kv_bytes + cp_indexer_k_bytes)", "bytes", "memory",
             "per microbatch, V4 attention under CP: what backward keeps of the exchanges (the "
             "received boundary hidden rows and their projected KV, the all-gathered compressed KV "
             "in the attention's saved KV buffer, the gathered CSA indexer keys), all the stage's "
             "layers; Megatron-LM dev@d48bd6be megatron/core/transformer/"
             "experimental_attention_variant/csa.py CompressedSparseAttention._forward_thd_cp")
    return " + act_v4_cp_per_microbatch"


def _csa_kernels(book: Book) -> None:
    book.add("time_v4_csa_core_flops", "2 * 2 * heads * (csa_window + flops_v4_csa_avg_compressed) * d_v",
             "FLOP", "time", "one CSA layer's sparse attention per token: QKᵀ and softmax·V over the "
             "window and the indexer's top-k compressed keys (causal average)")


def _hca_kernels(book: Book) -> None:
    book.add("time_v4_hca_core_flops", "2 * (2 * heads * csa_window * d_v + heads * d_v * S / 128)",
             "FLOP", "time", "one HCA layer's attention per token: the window and all ~S/128 causal "
             "compressed keys (the compressed branch)")


def _v4_cp_bytes(book: Book, v: Variant) -> None:
    """DeepSeek-V4 attention under THD context parallelism, per layer per microbatch (Megatron-LM
    dev@d48bd6be megatron/core/transformer/experimental_attention_variant/csa_utils/cp_utils.py
    exchange_cp_boundary_hidden, prepare_cp_compressor_input; csa.py
    CompressedSparseAttention._forward_thd_cp).

    Layout: THD packing with a contiguous CP split, so CP rank r holds packed rows
    [r·n, (r+1)·n) of the microbatch (n = tokens_per_rank). Each V4 attention layer first sends
    its last max(window, compressor reach) rows of the attention input (hidden width h, not KV)
    to the next CP rank, which projects their KV itself; the compressor reach is 2·4 = 8 rows for
    CSA (overlapping windows), the ratio for HCA, 0 for window-only layers. A compressed row
    belongs to the rank holding its group's last token; each rank pads its compressed rows to a
    fixed capacity floor((n + reach) / ratio), rounded up to a multiple of 32 / gcd(32, ratio),
    and those fixed-capacity buffers are all-gathered rank-major over CP: the attention KV
    (d wide) for CSA and HCA, and the indexer keys (idx_dim wide) for CSA. Backward
    reduce-scatters both gathers' grads and returns the boundary rows' grads to their owner.

    The DeepSeek-V4 Megatron write-up describes the neighbour message as uncompressed tail KV;
    the code sends hidden rows (h wide), which these formulas follow.
    """
    add = book.add
    for kind, reach in (("csa", "2 * csa_ratio"), ("hca", "hca_ratio"), ("swa", "0")):
        add(f"cp_boundary_rows_{kind}", f"Max(csa_window, {reach})", "rows", "rows",
            f"V4 CP: boundary rows a {kind.upper()} layer sends to the next CP rank: "
            "max(window, compressor reach)")
    add("cp_boundary_bytes", "(L_csa * cp_boundary_rows_csa + L_hca * cp_boundary_rows_hca"
        " + (blocks - L_csa - L_hca) * cp_boundary_rows_swa) * h * p", "bytes", "bytes",
        "V4 CP: boundary hidden rows of all the stage's attention layers, one microbatch (every "
        "V4 layer exchanges, window-only and MTP layers included)")
    for kind, ratio, reach in (("csa", "csa_ratio", "2 * csa_ratio"),
                               ("hca", "Max(hca_ratio, 1)", "hca_ratio")):
        add(f"cp_{kind}_compressed_rows",
            f"ceiling(Max(1, floor((tokens_per_rank + {reach}) / {ratio})) / {kind}_align)"
            f" * {kind}_align", "rows", "rows",
            f"V4 CP: fixed-capacity compressed {kind.upper()} rows per rank (padded; the capacity "
            "every rank contributes to the all-gather)")
    add("cp_compressed_kv_bytes", "(L_csa * cp_csa_compressed_rows + L_hca * cp_hca_compressed_rows)"
        " * d * p", "bytes", "bytes",
        "V4 CP: this rank's compressed KV of all the stage's CSA and HCA layers, one microbatch")
    add("cp_indexer_k_bytes", "L_csa * cp_csa_compressed_rows * idx_dim * p", "bytes", "bytes",
        "V4 CP: this rank's compressed indexer keys of the stage's CSA layers, one microbatch")


def _v4_cp_exchanges(v: Variant) -> CpExchanges:
    """Per step: the boundary rows, then the compressed KV and indexer-key gathers (_v4_cp_bytes
    gives their payloads, already summed over the stage's layers)."""
    closed = ("cp_boundary_hidden", "cp_compressed_kv_gather", "cp_indexer_k_gather")
    if not v.cp:
        return CpExchanges(close=closed)
    rows = "cp_boundary_bytes * microbatches"
    boundary = Exchange("cp_boundary_hidden", "cp", f"cp_has_next * {rows}", f"cp_has_prev * {rows}",
                        "V4 CP boundary hidden rows to the next CP rank",
                        "their grads back to the previous CP rank")
    gathers = tuple((Exchange(name, "cp", f"{own} * microbatches", f"CP * {own} * microbatches",
                              f"V4 CP all-gather of {what}",
                              f"its backward reduce-scatter of the {what} grads"),)
                    for name, own, what in (
                        ("cp_compressed_kv_gather", "cp_compressed_kv_bytes", "compressed KV"),
                        ("cp_indexer_k_gather", "cp_indexer_k_bytes", "indexer keys")))
    return CpExchanges(((boundary,), *gathers), closed)


# V4's kinds are written CSA, HCA, window: the base (window-only layers) last, as the flops
# page's per-layer row has always read.
CSA = LayerKind(
    "v4_csa", MIXER, "dsv4_hybrid", "DeepSeek-V4 CSA layers (compress ratio 4: compressed sparse "
    "attention with a lightning indexer)", V4 + "csa.py CompressedSparseAttention", _v4_present,
    count="L_csa", count_doc="CSA attention layers on the stage (V4)", model_count="L_model_csa",
    terms={FLOPS: (Replace("flops_attention_csa_fwd_per_token"),),
           CORE: (Replace("time_v4_csa_core_flops"), Add("time_indexer_score_flops")),
           KERNEL: (Replace("time_v4_csa_core_flops"),), WEIGHTS: (Add("csa_params_per_layer"),)},
    layer_params=_csa_params, flops=_csa_flops, activations=_csa_activations, kernels=_csa_kernels,
)
HCA = LayerKind(
    "v4_hca", MIXER, "dsv4_hybrid", "DeepSeek-V4 HCA layers (heavily compressed attention)",
    V4 + "csa.py CompressedSparseAttention (compress ratio 128)", _v4_present,
    count="L_hca", count_doc="HCA attention layers on the stage (V4)", model_count="L_model_hca",
    terms={FLOPS: (Replace("flops_attention_hca_fwd_per_token"),),
           CORE: (Replace("time_v4_hca_core_flops"),), KERNEL: (Replace("time_v4_hca_core_flops"),),
           WEIGHTS: (Add("hca_params_per_layer"),)},
    layer_params=_hca_params, flops=_hca_flops, activations=_hca_activations, kernels=_hca_kernels,
)
V4_WINDOW = LayerKind(
    "v4_window", MIXER, "dsv4_hybrid", "DeepSeek-V4 window-only layers (compress ratio 0)",
    V4 + "deepseek_v4_hybrid_attention.py", _v4_present,
    variations=(("DeepSeek-V4 attention with CP = 1", {"cp": False}),),
    terms={FLOPS: (Base("flops_attention_swa_fwd_per_token"),),
           CORE: (Base("flops_v4_window_fwd_per_token"),),
           KERNEL: (Base("flops_v4_window_fwd_per_token"),), WEIGHTS: (Base("attention_params_per_block"),)},
    flops=_swa_flops,
    # The family's CP exchanges sit on its base, every V4 layer's kind: the boundary rows span
    # all the stage's layers and the compressed-KV gather CSA's and HCA's together, so they are
    # one piece, not a share per kind (and its activations read them)
    activations=_v4_cp_activations, cp_bytes=_v4_cp_bytes, cp_exchanges=_v4_cp_exchanges,
)


# ------------------------------------------------------------------------------ Mamba

MAMBA_SRC = "Megatron-LM dev@d48bd6be megatron/core/ssm/mamba_mixer.py MambaMixer"
# MambaMixer.__init__'s defaults the hybrid layer specs keep (megatron/core/models/hybrid/
# hybrid_layer_specs.py builds MambaMixer without them): the causal conv kernel and the SSD chunk.
MAMBA_D_CONV, MAMBA_CHUNK = 4, 128


def _mamba_present(m: ModelSection) -> bool:
    return m.attention_variant == "standard" and "mamba" in m.layer_mixers


def _mamba_layer_params(book: Book, v: Variant, attention_side: str) -> str:
    """One Mamba-2 mixer on a TP rank (MambaMixer.__init__): in_proj h → [z, x, B, C, dt]
    (2·d_inner + 2·groups·state + heads), the depthwise conv1d over [x, B, C] with its bias
    (conv taps + 1 per channel), dt_bias, A_log and D (one per head; D_has_hdim False), the gated
    RMSNorm over d_inner and out_proj d_inner → h; no linear biases (MambaMixer asserts
    `not bias`). Every one of them is split over TP by heads and groups (tensor_model_parallel,
    partition_dim 0). The layer's pre-norm is fused into in_proj (TELayerNormColumnParallelLinear,
    hybrid_layer_specs.py), whole on every TP rank: it is the block's first norm. It replaces the
    block's attention side."""
    book.add("mamba_params_per_layer", "(h * (2 * mb_din + 2 * mb_g * mb_n + mb_nh)"
             " + (mb_din + 2 * mb_g * mb_n) * (mb_conv + 1) + 3 * mb_nh + mb_din + mb_din * h) / TP",
             "params", "memory", "Mamba-2 in_proj, conv1d (weight and bias), dt_bias, A_log, D, "
             "gated norm and out_proj of one mixer layer on this rank (all split over TP)")
    return f" + L_mamba * (mamba_params_per_layer - ({attention_side}))"


def _mamba_flops(book: Book, v: Variant) -> None:
    """Megatron's count and the work as it runs. Megatron-LM dev@d48bd6be
    megatron/training/training.py num_floating_point_operations (hybrid_flops,
    mamba_layer_flops) prices a Mamba layer with d_in = 2·hidden_size whatever mamba_num_heads
    says: in_proj, 7·d_in·state for the scan, out_proj. moeplan keeps that figure for the FLOPs
    page (MFU as Megatron reports it) and prices the layer as it runs on the time page: the
    projections at the real d_inner (as GEMMs), the causal conv and the chunked SSD scan of
    mamba_split_conv1d_scan_combined as kernels."""
    add = book.add
    add("flops_mamba_fwd_per_token", "2 * h * (4 * h + 2 * mb_g * mb_n + mb_nh) + 14 * h * mb_n"
        " + 4 * h * h", "FLOP", "flops", "one Mamba-2 layer per token as Megatron's "
        "num_floating_point_operations counts it (mamba_layer_flops: d_in = 2h)")
    add("flops_mamba_proj_fwd_per_token", "2 * h * (2 * mb_din + 2 * mb_g * mb_n + mb_nh)"
        " + 2 * mb_din * h", "FLOP", "flops",
        "one Mamba-2 layer's in_proj and out_proj per token at its real d_inner (moeplan's count)")
    add("flops_mamba_scan_fwd_per_token", "2 * mb_conv * (mb_din + 2 * mb_g * mb_n)"
        " + 2 * mb_g * mb_chunk * mb_n + mb_din * mb_chunk + 4 * mb_din * mb_n", "FLOP", "flops",
        "one Mamba-2 layer's causal conv1d and chunked SSD scan per token (moeplan's count): "
        "C·Bᵀ over a whole chunk per group, the causal half of the chunk's (C·Bᵀ∘L)·x per head, "
        "the chunk states Bᵀ·x and their output C·h per head (state passing between chunks and "
        "the elementwise gate, D skip and softplus left out)")
    add("flops_mamba_counted_core_fwd_per_token",
        "flops_mamba_fwd_per_token - flops_mamba_proj_fwd_per_token", "FLOP", "flops",
        "what Megatron's Mamba figure holds beyond the real projections (taken off the GEMM "
        "work the time page prices; the scan is priced as a kernel instead)")


def _mamba_activations(book: Book, v: Variant, per_block: str) -> str:
    """What one Mamba-2 layer keeps for backward on Megatron's training path
    (MambaMixer._ssm_training, use_mamba_mem_eff_path True): in_proj's fused norm its input and
    output (h each; h with layernorm recompute), mamba_split_conv1d_scan_combined its input
    zxBCdt (2·d_inner + 2·groups·state + heads) and the scan output out_x (d_inner), the gated
    RMSNorm its input (d_inner) and fp32 rstd per group, out_proj its input (d_inner); widths
    split over TP like the rows of tokens_per_rank. The SSM states are recomputed in backward
    (no initial or final state in training), so none is stored. It replaces the block's softmax
    attention tensors."""
    book.add("act_mamba_per_layer", f"tokens_per_rank * (({_norm_rows(v)} + 5 * mb_din"
             " + 2 * mb_g * mb_n + mb_nh) * p + mb_g * 4)", "bytes", "memory",
             "per microbatch: one Mamba-2 layer's stored tensors (norm in/out, zxBCdt, scan "
             "output, gated norm input and fp32 rstd, out_proj input)")
    _beyond_attention(book, "act_mamba_per_layer", per_block, "a Mamba-2 layer")
    return " + L_mamba * act_mamba_per_layer_extra"


MAMBA_CP = ("Megatron-LM dev@d48bd6be megatron/core/ssm/mamba_context_parallel.py "
            "MambaContextParallel.pre_conv_ssm, post_conv_ssm")


def _mamba_cp_bytes(book: Book, v: Variant) -> None:
    """Mamba-2 under CP exchanges no K/V: MAMBA_CP turns the sequence shards into head shards
    before the conv and scan (all-to-all of z, x, B, C, dt; B and C repeated group_repeat_count
    times when a rank holds fewer groups than CP ranks) and back after (all-to-all of y). One
    rank's local tensors per layer and microbatch."""
    book.add("cp_mamba_pre_bytes", "b * S / cp_runtime * (2 * mb_din + 2 * mb_g * mb_n * mb_repeat"
             " + mb_nh) / TP * p", "bytes", "bytes",
             "Mamba-2: one rank's zxBCdt of one layer (all-to-all sequence → heads over CP)")
    book.add("cp_mamba_post_bytes", "b * S / cp_runtime * mb_din / TP * p", "bytes", "bytes",
             "Mamba-2: one rank's scan output of one layer (all-to-all heads → sequence over CP)")


def _mamba_cp_exchanges(v: Variant) -> CpExchanges:
    closed = ("cp_mamba_a2a",)
    if not v.cp:
        return CpExchanges(close=closed)
    a2a = "(cp_mamba_pre_bytes + cp_mamba_post_bytes) * L_mamba * microbatches"
    return CpExchanges(((Exchange("cp_mamba_a2a", "cp", a2a, a2a,
                                  "Mamba-2 all-to-alls sequence ↔ heads around the conv and scan",
                                  "the same all-to-alls of the gradients"),),), closed)


MAMBA = LayerKind(
    "mamba", MIXER, "standard", "Mamba-2 mixer layers of a hybrid model (hybrid_layer_pattern `M`)",
    MAMBA_SRC, _mamba_present,
    variations=(("Mamba-2 mixer layers (hybrid_layer_pattern M)",
                 {"kinds": frozenset({"softmax", "mamba"}), "cp": False}),
                ("Mamba-2 mixer layers with CP > 1 (all-to-all CP)",
                 {"kinds": frozenset({"softmax", "mamba"}), "cp": True})),
    count="L_mamba", count_doc="Mamba-2 mixer layers on the stage (hybrid models)",
    model_count="L_model_mamba",
    terms={FLOPS: (Replace("flops_mamba_fwd_per_token"),),
           CORE: (Replace("flops_mamba_counted_core_fwd_per_token"),),
           KERNEL: (Replace("flops_mamba_scan_fwd_per_token"),),
           WEIGHTS: (Replace("mamba_params_per_layer"),), KV: (Replace(""),)},
    layer_params=_mamba_layer_params,
    # a Mamba layer has no q/k norms; everything of its own is split over TP
    tp_replicated_layers=lambda v: " - L_mamba * qk_norm_params_per_block" if v.qk_norm else "",
    flops=_mamba_flops, activations=_mamba_activations,
    kernel_note="Mamba-2 layers: causal conv and chunked SSD scan",
    cp_bytes=_mamba_cp_bytes, cp_exchanges=_mamba_cp_exchanges,
)


# ------------------------------------------------------------------------------ attention features


def _qk_norm_params(book: Book, v: Variant) -> str:
    # Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py SelfAttention.__init__:
    # q_layernorm and k_layernorm normalise each head (hidden_size_per_attention_head wide).
    book.add("qk_norm_params_per_block", "4 * d" if v.layernorm else "2 * d", "params", "memory",
             "qk_layernorm: q and k norms over the head dimension (replicated over TP)")
    return " + qk_norm_params_per_block"


def _qk_norm_layer_params(book: Book, v: Variant) -> str:
    # MiniMax-M2: one q norm of heads·d and one k norm of groups·d
    book.add("qk_norm_params_per_block", ("2 * " if v.layernorm else "") + "(heads + groups) * d",
             "params", "memory",
             "qk_layernorm: q and k norms over all heads of the layer at once (replicated over TP)")
    return " + qk_norm_params_per_block"


QK_NORM = LayerKind(
    "qk_norm", FEATURE, "standard", "qk_layernorm on standard attention",
    "Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py SelfAttention.__init__ "
    "(q_layernorm, k_layernorm)",
    _standard(lambda m: m.qk_layernorm and not m.qk_layernorm_per_layer),
    variations=(("qk_layernorm on standard attention",
                 {"kinds": frozenset({"softmax", "qk_norm"}), "cp": False}),),
    block_params=_qk_norm_params, beside_norms=True,
    tp_replicated_block=" + qk_norm_params_per_block",
)
QK_NORM_LAYER = LayerKind(
    "qk_norm_layer", FEATURE, "standard", "q/k norms over all heads of a layer (qk_layernorm_per_layer)",
    "Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py SelfAttention.__init__ "
    "(qk_layernorm_per_layer)",
    _standard(lambda m: m.qk_layernorm and m.qk_layernorm_per_layer),
    variations=(("q/k norms over all heads of a layer (qk_layernorm_per_layer)",
                 {"kinds": frozenset({"softmax", "qk_norm_layer"}), "cp": False}),),
    block_params=_qk_norm_layer_params, beside_norms=True,
    tp_replicated_block=" + qk_norm_params_per_block",
)


def _sink_params(book: Book, v: Variant) -> str:
    book.add("sink_params_per_block", "heads / TP", "params", "memory",
             "softmax_type learnable: one sink logit per attention head (split over TP)")
    return " + sink_params_per_block"


SINKS = LayerKind(
    "sinks", FEATURE, "standard", "learnable attention sinks (softmax_type learnable)",
    "Megatron-LM dev@d48bd6be "
    "megatron/core/transformer/dot_product_attention.py DotProductAttention.__init__ "
    "(softmax_offset [heads / TP])",
    _standard(lambda m: m.softmax_type == "learnable" and m.full_attention_softmax_type is None),
    variations=(("learnable attention sinks (softmax_type learnable)",
                 {"kinds": frozenset({"softmax", "sinks"}), "cp": False}),),
    block_params=_sink_params,
)


def _output_gate_params(book: Book, v: Variant) -> str:
    # megatron/core/transformer/attention.py SelfAttention.__init__: linear_qkv_out_dim grows
    # by kv_channels · heads with attention_output_gate.
    book.add("attention_gate_params_per_block", "h * heads * d / (TP * GTP)", "params", "memory",
             "attention_output_gate: the heads·d output gate fused into linear_qkv (split over TP)")
    return " + attention_gate_params_per_block"


OUTPUT_GATE = LayerKind(
    "output_gate", FEATURE, "standard", "gated attention (attention_output_gate)",
    "Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py SelfAttention.__init__ "
    "(attention_output_gate)",
    _standard(lambda m: m.attention_output_gate),
    variations=(("gated attention (attention_output_gate)",
                 {"kinds": frozenset({"softmax", "output_gate"}), "cp": False}),),
    block_params=_output_gate_params,
    projection_flops=(" + 2 * h * d * heads", " and its output gate (Megatron's gate_projection_size)"),
)


def _head_gate_params(book: Book, v: Variant) -> str:
    # megatron/core/transformer/attention.py SelfAttention.__init__: linear_qkv_out_dim grows by
    # num_attention_heads with head_wise_attn_gate (one scalar gate per head; its bias with the
    # QKV bias, add_bias_linear or add_qkv_bias, both column-parallel: split over TP).
    bias = " + heads / TP" if v.bias or v.qkv_bias else ""
    book.add("attention_head_gate_params_per_block", f"h * heads / (TP * GTP){bias}", "params",
             "memory", "head_wise_attn_gate: one gate row per head fused into linear_qkv (split over TP)"
             + (", with its bias" if bias else ""))
    return " + attention_head_gate_params_per_block"


HEAD_GATE = LayerKind(
    "head_gate", FEATURE, "standard", "a per-head attention gate (head_wise_attn_gate)",
    "Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py SelfAttention.__init__ and "
    "get_query_key_value_tensors (head_wise_attn_gate)",
    _standard(lambda m: m.head_wise_attn_gate),
    variations=(("a per-head attention gate (head_wise_attn_gate)",
                 {"kinds": frozenset({"softmax", "head_gate"}), "cp": False}),),
    block_params=_head_gate_params,
    # Megatron's num_floating_point_operations has no head-gate term (its gate_projection_size
    # reads attention_output_gate only); moeplan counts the GEMM the gate rows run.
    projection_flops=(" + 2 * h * heads", " and its per-head gate rows (head_wise_attn_gate; "
                      "Megatron's FLOPs figure leaves them out)"),
)

# ------------------------------------------------------------------------------ window layers' heads

WINDOW_HEADS_SRC = ("Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py "
                    "SelfAttention.__init__ (built with the layer's num_attention_heads: "
                    "Megatron-LM has no per-layer count, Megatron-Bridge@017062bc "
                    "src/megatron/bridge/models/stepfun/step35_provider.py Step35DecoderLayer "
                    "overrides it on every sliding-attention layer)")
# dh: the window layers' heads beyond the model's (negative when they have fewer)
_DH = "(heads_w - heads)"


def _window_heads_params(book: Book, v: Variant, attention_side: str) -> str:
    """What a window layer's own head count changes in its parameters on a TP rank, term by term
    against the family's (Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py
    SelfAttention.__init__, built with the layer's num_attention_heads as Step35DecoderLayer
    does): the q rows and the output projection's columns (h·d each per head), the q bias
    (add_bias_linear or add_qkv_bias), a sink logit per head, the output gate's h·d rows or the
    head gate's h rows per head (and its bias), and q norms over all heads of the layer. K, V and
    the per-head q/k norms are the model's."""
    terms = [f"2 * h * d * {_DH} / (TP * GTP)"]
    if v.bias or v.qkv_bias:
        terms.append(f"{_DH} * d / TP")
    if "sinks" in v.kinds:
        terms.append(f"{_DH} / TP")
    if "output_gate" in v.kinds:
        terms.append(f"h * {_DH} * d / (TP * GTP)")
    if "head_gate" in v.kinds:
        terms.append(f"h * {_DH} / (TP * GTP)" + (f" + {_DH} / TP" if v.bias or v.qkv_bias else ""))
    if "qk_norm_layer" in v.kinds:
        terms.append(("2 * " if v.layernorm else "") + f"{_DH} * d")
    book.add("window_heads_params_per_layer", " + ".join(terms), "params", "memory",
             "a window layer's own query heads beyond the model's: their q rows and output "
             "columns, and the biases, sinks, gate rows and q-norm weights that go per head")
    book.add("window_heads_weights_per_layer", f"2 * h * d * {_DH} / (TP * GTP)", "params",
             "memory", "a window layer's q and output projection weights beyond the model's")
    return " + L_window * window_heads_params_per_layer"


def _window_heads_flops(book: Book, v: Variant) -> None:
    """A window layer's own heads in its FLOPs per token: the q and output projections (2·h·d
    each per head), the core's QKᵀ and softmax·V over the causal half of S keys (2·d·S per head,
    as flops_attention_core_fwd_per_token counts a head), and the gate rows per head. Megatron's
    num_floating_point_operations, which Megatron-Bridge's training loop runs, reads one
    num_attention_heads for every layer; these rows count what the window layers compute."""
    gates = (" + 2 * h * d * " + _DH if "output_gate" in v.kinds else "") + (
        " + 2 * h * " + _DH if "head_gate" in v.kinds else "")
    add = book.add
    add("flops_window_heads_core_fwd_per_token", f"2 * {_DH} * d * S", "FLOP", "flops",
        "a window layer's own query heads beyond the model's: their QKᵀ and softmax·V per token "
        "over the whole causal sequence, as the full-attention count does")
    add("flops_window_heads_fwd_per_token", f"4 * h * d * {_DH}{gates}"
        " + flops_window_heads_core_fwd_per_token", "FLOP", "flops",
        "a window layer's own query heads beyond the model's: their q and output projections"
        + (" and gate rows" if gates else "") + " and core attention per token")
    add("flops_window_heads_kernel_fwd_per_token", f"2 * 2 * {_DH} * d * flops_window_keys_avg",
        "FLOP", "flops", "a window layer's own query heads beyond the model's, as its window "
        "kernel runs them (over the keys a sliding-window query reads)")


def _window_heads_activations(book: Book, v: Variant, per_block: str) -> str:
    """A window layer's own heads in what it stores for backward, against the family's per-block
    tensors (planner/budget/memory.py act_attention_per_block): the query and the core output
    (d each per head) and the fp32 softmax statistics per head, and the q its per-head q norm
    keeps (qk_layernorm)."""
    normed = "act_qk_norm_per_block" in per_block
    rows = f"2 * {_DH} * d * p + {_DH} * 4" + (f" + {_DH} * d * p" if normed else "")
    book.add("act_window_heads_per_layer", f"tokens_per_rank * ({rows})", "bytes", "memory",
             "per microbatch: what a window layer's own query heads store beyond the model's "
             "(query, core output, softmax statistics" + (", q-norm input" if normed else "") + ")")
    return " + L_window * act_window_heads_per_layer"


WINDOW_HEADS = LayerKind(
    "window_heads", FEATURE, "standard",
    "sliding-window layers with their own query-head count (window_num_attention_heads)",
    WINDOW_HEADS_SRC, _standard(lambda m: m.window_num_attention_heads is not None),
    variations=(("sliding-window layers with their own query-head count",
                 {"kinds": frozenset({"softmax", "window", "window_heads"}), "cp": False}),),
    count="L_window", model_count="L_model_window",
    terms={FLOPS: (Add("flops_window_heads_fwd_per_token"),),
           CORE: (Add("flops_window_heads_core_fwd_per_token"),),
           KERNEL: (Add("flops_window_heads_kernel_fwd_per_token"),),
           WEIGHTS: (Add("window_heads_weights_per_layer"),)},
    layer_params=_window_heads_params,
    tp_replicated_layers=lambda v: (" + L_window * " + ("2 * " if v.layernorm else "") + f"{_DH} * d"
                                    if "qk_norm_layer" in v.kinds else ""),
    flops=_window_heads_flops, activations=_window_heads_activations,
)

# ------------------------------------------------------------------------------ value heads' width

MIMO_SRC = ("Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py SelfAttention "
            "(one head width and one num_query_groups for every layer: Megatron-LM builds none of "
            "this), Megatron-Bridge@812b989a src/megatron/bridge/models/mimo_v2_flash/"
            "modeling_mimo_v2_flash.py MiMoV2FlashSelfAttention.__init__ (linear_qkv of "
            "heads·d + groups·d + groups·d_v rows, linear_proj of heads·d_v columns, "
            "num_query_groups switched per layer) and MiMoV2FlashTEDotProductAttention.__init__ "
            "(k_channels d, v_channels d_v; softmax_type learnable on window layers, vanilla on "
            "full ones)")
# dv: the value heads' width beyond kv_channels (negative when narrower)
_DV = "(d_v - d)"


def _value_dim_params(book: Book, v: Variant) -> str:
    """What value heads of their own width change in a block on a TP rank: the v rows of
    linear_qkv (groups of them) and the output projection's columns (one per query head), and
    the v bias with the QKV bias (add_bias_linear or add_qkv_bias)."""
    bias = f" + groups * {_DV} / TP" if v.bias or v.qkv_bias else ""
    book.add("value_dim_params_per_block", f"h * (heads + groups) * {_DV} / (TP * GTP){bias}",
             "params", "memory", "value heads of their own width (v_head_dim beside kv_channels): "
             "the v rows and output-projection columns beyond kv_channels'" + (", the v bias"
                                                                              if bias else ""))
    book.add("value_dim_weights_per_block", f"h * (heads + groups) * {_DV} / (TP * GTP)", "params",
             "memory", "the v projection and output projection weights beyond kv_channels'")
    return " + value_dim_params_per_block"


def _value_dim_flops(book: Book, v: Variant) -> None:
    """Value heads of their own width in the core attention: softmax·V is d_v wide per head
    (QKᵀ stays d), over the causal half of S keys as flops_attention_core_fwd_per_token counts."""
    book.add("flops_value_dim_core_fwd_per_token", f"heads * {_DV} * S", "FLOP", "flops",
             "value heads of their own width: what softmax·V adds per token over the causal half "
             "of S keys (Megatron's num_floating_point_operations reads kv_channels for both)")


def _value_dim_activations(book: Book, v: Variant, per_block: str) -> str:
    """Value heads of their own width in what a block stores: V (groups wide) and the core
    output (heads wide), d_v instead of d each."""
    book.add("act_value_dim_per_block", f"tokens_per_rank * (heads + groups) * {_DV} * p", "bytes",
             "memory", "per microbatch: what value heads of their own width store beyond "
             "kv_channels' (V and the core attention output)")
    return " + blocks * act_value_dim_per_block"


VALUE_DIM = LayerKind(
    "value_dim", FEATURE, "standard", "value heads of their own width (v_head_dim beside kv_channels)",
    MIMO_SRC, _standard(lambda m: m.v_head_dim != m.kv_channels),
    variations=(("value heads of their own width (v_head_dim beside kv_channels)",
                 {"kinds": frozenset({"softmax", "value_dim"}), "cp": False}),),
    count="blocks", model_count="L_model",
    terms={FLOPS: (Add("flops_value_dim_core_fwd_per_token"),),
           CORE: (Add("flops_value_dim_core_fwd_per_token"),),
           KERNEL: (Add("flops_value_dim_core_fwd_per_token"),),
           WEIGHTS: (Add("value_dim_weights_per_block"),)},
    block_params=_value_dim_params,
    projection_flops=(f" + 2 * h * (heads + groups) * {_DV}",
                      " and the value heads' own width (v_head_dim)"),
    flops=_value_dim_flops, activations=_value_dim_activations,
)


def _value_dim_window_flops(book: Book, v: Variant) -> None:
    book.add("flops_value_dim_window_kernel_fwd_per_token",
             f"heads * {_DV} * (2 * flops_window_keys_avg - S)", "FLOP", "flops",
             "value heads of their own width on a sliding-window layer, as its kernel runs them: "
             "softmax·V over the keys a window query reads instead of the causal half of S")


VALUE_DIM_WINDOW = LayerKind(
    "value_dim_window", FEATURE, "standard",
    "value heads of their own width on sliding-window layers", MIMO_SRC,
    _standard(lambda m: m.v_head_dim != m.kv_channels and m.window_size is not None),
    variations=(("value heads of their own width on sliding-window layers",
                 {"kinds": frozenset({"softmax", "window", "value_dim", "value_dim_window"}),
                  "cp": False}),),
    count="L_window", model_count="L_model_window",
    terms={KERNEL: (Add("flops_value_dim_window_kernel_fwd_per_token"),)},
    flops=_value_dim_window_flops,
)

# ------------------------------------------------------------------------------ window layers' KV shape
# A window layer's attention against the family's (standard attention, value width, K = V): its
# own KV groups (groups_w), q/k head width (d_w) and value width (dv_w); the family's v rows are
# dvb wide (0 where the full layers' V is their K, attention_k_eq_v, which K_EQ_V takes from every
# block and these rows give back to the window layers).


def _dvb(v: Variant) -> str:
    return "0" if "k_eq_v" in v.kinds else "d_v"


def _window_qkv(v: Variant) -> str:
    """A window layer's q, k and v rows beyond the family's, per unit of h."""
    return (f"heads * (d_w - d) + groups_w * (d_w + dv_w) - groups * (d + {_dvb(v)})")


def _window_kv_params(book: Book, v: Variant, attention_side: str) -> str:
    """A window layer's own KV groups and head widths on a TP rank, against the family's: its q,
    k and v rows and the output projection's columns (heads · (dv_w - d_v)), their biases with the
    QKV bias (add_bias_linear or add_qkv_bias), and per-head q/k norms d_w wide."""
    rows = f"{_window_qkv(v)} + heads * (dv_w - d_v)"
    bias = f" + ({_window_qkv(v)}) / TP" if v.bias or v.qkv_bias else ""
    norms = (" + " + ("4" if v.layernorm else "2") + " * (d_w - d)") if "qk_norm" in v.kinds else ""
    book.add("window_kv_params_per_layer", f"h * ({rows}) / (TP * GTP){bias}{norms}", "params",
             "memory", "a window layer's own KV groups and head widths beyond the model's: q, k, v "
             "rows and output columns" + (", biases" if bias else "") + (", q/k norms" if norms
                                                                        else ""))
    book.add("window_kv_weights_per_layer", f"h * ({rows}) / (TP * GTP)", "params", "memory",
             "a window layer's q, k, v and output projection weights beyond the model's")
    return " + L_window * window_kv_params_per_layer"


def _window_kv_flops(book: Book, v: Variant) -> None:
    add = book.add
    core = "heads * ((d_w - d) + (dv_w - d_v))"
    add("flops_window_kv_core_fwd_per_token", f"{core} * S", "FLOP", "flops",
        "a window layer's own head widths in QKᵀ and softmax·V per token over the causal half of "
        "S keys, as the full-attention count does")
    add("flops_window_kv_fwd_per_token", f"2 * h * ({_window_qkv(v)} + heads * (dv_w - d_v))"
        " + flops_window_kv_core_fwd_per_token", "FLOP", "flops",
        "a window layer's own KV groups and head widths beyond the model's: its projections and "
        "core attention per token")
    add("flops_window_kv_kernel_fwd_per_token", f"2 * {core} * flops_window_keys_avg", "FLOP",
        "flops", "a window layer's own head widths as its window kernel runs them (over the keys "
        "a sliding-window query reads)")


def _window_kv_activations(book: Book, v: Variant, per_block: str) -> str:
    """What a window layer stores beyond the family's: q and the core output (d_w, dv_w per
    head), K and V (groups_w of d_w, dv_w), and the q/k the per-head norms keep."""
    normed = "act_qk_norm_per_block" in per_block
    rows = "heads * (d_w - d + dv_w - d_v) + groups_w * (d_w + dv_w) - groups * (d + d_v)" + (
        " + heads * (d_w - d) + groups_w * d_w - groups * d" if normed else "")
    book.add("act_window_kv_per_layer", f"tokens_per_rank * ({rows}) * p", "bytes", "memory",
             "per microbatch: what a window layer's own KV groups and head widths store beyond "
             "the model's (q, core output, K, V" + (", q/k norm inputs" if normed else "") + ")")
    return " + L_window * act_window_kv_per_layer"


WINDOW_KV = LayerKind(
    "window_kv", FEATURE, "standard",
    "sliding-window layers with their own KV groups or head width (window_num_query_groups, "
    "window_kv_channels)", MIMO_SRC,
    # attention_k_eq_v takes the v rows from every block (K_EQ_V); a model with window layers gets
    # them back here even without the window fields (groups_w, d_w, dv_w then the model's own),
    # since only its full-attention layers' V is their K (Gemma4TextAttention: v_proj is None only
    # where attention_k_eq_v and the layer is not sliding)
    _standard(lambda m: m.window_num_query_groups is not None or m.window_kv_channels is not None
              or (m.attention_k_eq_v and m.window_size is not None)),
    variations=(("sliding-window layers with their own KV groups or head width",
                 {"kinds": frozenset({"softmax", "window", "window_kv"}), "cp": False}),),
    count="L_window", model_count="L_model_window",
    terms={FLOPS: (Add("flops_window_kv_fwd_per_token"),),
           CORE: (Add("flops_window_kv_core_fwd_per_token"),),
           KERNEL: (Add("flops_window_kv_kernel_fwd_per_token"),),
           WEIGHTS: (Add("window_kv_weights_per_layer"),)},
    layer_params=_window_kv_params, flops=_window_kv_flops, activations=_window_kv_activations,
    tp_replicated_layers=lambda v: (" + L_window * " + ("4" if v.layernorm else "2") + " * (d_w - d)"
                                    if "qk_norm" in v.kinds else ""),
)

GEMMA4_SRC = ("Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py SelfAttention and "
              "megatron/core/models/gpt/gpt_layer_specs.py "
              "get_gpt_layer_with_transformer_engine_submodules (one v projection, two pre-norms: "
              "Megatron-LM builds none of this); Hugging Face Gemma4TextAttention "
              "(attention_k_eq_v: no v_proj on full-attention layers) and Gemma4TextDecoderLayer "
              "(post-attention and post-feed-forward norms; the MoE block's own norms and router "
              "scales)")


def _k_eq_v_params(book: Book, v: Variant) -> str:
    bias = " - groups * d_v / TP" if v.bias or v.qkv_bias else ""
    book.add("k_eq_v_params_per_block", f"- h * groups * d_v / (TP * GTP){bias}", "params",
             "memory", "attention_k_eq_v: the v rows a block does not have (its V is its K)")
    book.add("k_eq_v_weights_per_block", "- h * groups * d_v / (TP * GTP)", "params", "memory",
             "attention_k_eq_v: the v projection weights a block does not have")
    return " + k_eq_v_params_per_block"


K_EQ_V = LayerKind(
    "k_eq_v", FEATURE, "standard",
    "full-attention layers whose V is their K (attention_k_eq_v)", GEMMA4_SRC,
    _standard(lambda m: m.attention_k_eq_v),
    variations=(("full-attention layers whose V is their K (attention_k_eq_v)",
                 {"kinds": frozenset({"softmax", "window", "window_kv", "k_eq_v"}), "cp": False}),),
    count="blocks", model_count="L_model",
    terms={WEIGHTS: (Add("k_eq_v_weights_per_block"),)},
    block_params=_k_eq_v_params,
    projection_flops=(" - 2 * h * groups * d_v", ", less the v projection a layer whose V is its "
                      "K does not run (attention_k_eq_v)"),
)


def _post_norm_params(book: Book, v: Variant) -> str:
    book.add("post_norm_params_per_block", "4 * h" if v.layernorm else "2 * h", "params", "memory",
             "post_sublayer_norms: norms on the attention output and the MLP output (replicated "
             "over TP)")
    return " + post_norm_params_per_block"


def _post_norm_activations(book: Book, v: Variant, per_block: str) -> str:
    book.add("act_post_norms_per_block", "tokens_per_rank * 2 * h * p", "bytes", "memory",
             "per microbatch: the attention and MLP outputs the post norms keep for backward")
    return " + blocks * act_post_norms_per_block"


POST_NORMS = LayerKind(
    "post_norms", FEATURE, "standard",
    "norms on the attention and MLP outputs (post_sublayer_norms)", GEMMA4_SRC,
    _standard(lambda m: m.post_sublayer_norms),
    variations=(("norms on the attention and MLP outputs (post_sublayer_norms)",
                 {"kinds": frozenset({"softmax", "post_norms"}), "cp": False}),),
    block_params=_post_norm_params, tp_replicated_block=" + post_norm_params_per_block",
    activations=_post_norm_activations,
)


def _moe_branch_params(book: Book, v: Variant, attention_side: str) -> str:
    book.add("moe_branch_params_per_layer", "3 * h + h + E", "params", "memory",
             "moe_branch_norms: an MoE layer's norms on the shared branch's output and the "
             "experts' input and output, the router's input scale [h] and per-expert scales [E] "
             "(replicated over TP)")
    return " + moe_layers * moe_branch_params_per_layer"


def _moe_branch_activations(book: Book, v: Variant, per_block: str) -> str:
    book.add("act_moe_branch_per_layer", "tokens_per_rank * 3 * h * p", "bytes", "memory",
             "per microbatch: what an MoE layer's own branch norms keep for backward")
    return " + moe_layers * act_moe_branch_per_layer"


MOE_BRANCH = LayerKind(
    "moe_branch", FEATURE, "standard",
    "an MoE layer's own branch norms and router scales (moe_branch_norms)", GEMMA4_SRC,
    _standard(lambda m: m.moe_branch_norms),
    variations=(("an MoE layer's own branch norms and router scales (moe_branch_norms)",
                 {"kinds": frozenset({"softmax", "moe_branch"}), "cp": False}),),
    layer_params=_moe_branch_params,
    tp_replicated_layers=lambda v: " + moe_layers * moe_branch_params_per_layer",
    activations=_moe_branch_activations,
)


def _window_sink_params(book: Book, v: Variant, attention_side: str) -> str:
    book.add("window_sink_params_per_layer", "heads / TP", "params", "memory",
             "learnable sinks on sliding-window layers only: one sink logit per head (split "
             "over TP)")
    return " + L_window * window_sink_params_per_layer"


WINDOW_SINKS = LayerKind(
    "window_sinks", FEATURE, "standard",
    "learnable sinks on sliding-window layers only (full_attention_softmax_type vanilla)", MIMO_SRC,
    _standard(lambda m: m.softmax_type == "learnable" and m.full_attention_softmax_type is not None),
    variations=(("learnable sinks on sliding-window layers only",
                 {"kinds": frozenset({"softmax", "window", "window_sinks"}), "cp": False}),),
    count="L_window", model_count="L_model_window", layer_params=_window_sink_params,
)

# ------------------------------------------------------------------------------ block-sparse layers

BLOCK_SPARSE_SRC = ("Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py SelfAttention "
                    "(no indexer on standard attention: Megatron-LM builds none of this); Hugging "
                    "Face MiniMaxM3VLIndexer (q_proj of index_n_heads x index_head_dim, one shared "
                    "key, q/k norms; per query the top index_topk_blocks blocks of "
                    "index_block_size keys)")


def _block_sparse_params(book: Book, v: Variant, attention_side: str) -> str:
    """A block-sparse layer's lightning indexer: its q projection (index heads x their width),
    one shared key of that width, and q/k norms of the width; whole on every TP rank (nothing
    splits it: transformers builds it unsharded)."""
    book.add("index_sparse_params_per_layer", "h * idx_heads * idx_dim + h * idx_dim + 2 * idx_dim",
             "params", "memory", "a block-sparse layer's lightning indexer: q projection, shared key, q/k "
             "norms (replicated over TP)")
    return " + L_bsparse * index_sparse_params_per_layer"


def _block_sparse_flops(book: Book, v: Variant) -> None:
    """The indexer scores every causal key (the causal half of S, as the core count reads a
    head), per index head, over its width, then the attention reads the keys of the blocks it
    picks: at most index_topk_blocks x index_block_size, fewer early in the sequence (averaged as
    a window of that many keys under the causal mask)."""
    add = book.add
    add("flops_index_sparse_fwd_per_token",
        "2 * h * (idx_heads * idx_dim + idx_dim) + idx_heads * idx_dim * S", "FLOP", "flops",
        "a block-sparse layer's indexer per token: its projections and its scores over the "
        "causal half of S keys (Megatron's FLOPs figure has no such layer)")
    add("flops_index_scores_fwd_per_token", "idx_heads * idx_dim * S", "FLOP", "flops",
        "a block-sparse layer's indexer scores per token over the causal half of S keys")
    add("flops_sparse_keys_avg", "Min(sparse_keys, S) * (1 - (Min(sparse_keys, S) - 1) / (2 * S))",
        "keys", "flops", "average keys a block-sparse query reads: its picked blocks "
        "(index_topk_blocks x index_block_size) under the causal mask")
    add("flops_sparse_core_fwd_per_token", "2 * 2 * heads * d * flops_sparse_keys_avg", "FLOP",
        "flops", "a block-sparse layer's QKᵀ and softmax·V per token over the keys of its picked "
        "blocks, as its kernel runs them")


BLOCK_SPARSE = LayerKind(
    "block_sparse", MIXER, "standard",
    "block-sparse attention layers with a lightning indexer (index_sparse_layers)",
    BLOCK_SPARSE_SRC, _standard(lambda m: m.index_sparse_layers is not None),
    variations=(("block-sparse attention layers with a lightning indexer",
                 {"kinds": frozenset({"softmax", "block_sparse"}), "cp": False}),),
    count="L_bsparse", count_doc="block-sparse attention layers on the stage (decoder layers)",
    model_count="L_model_bsparse",
    terms={FLOPS: (Add("flops_index_sparse_fwd_per_token"),),
           CORE: (Add("flops_index_scores_fwd_per_token"),),
           KERNEL: (Replace("flops_sparse_core_fwd_per_token"),
                    Add("flops_index_scores_fwd_per_token"))},
    layer_params=_block_sparse_params, flops=_block_sparse_flops,
    tp_replicated_layers=lambda v: " + L_bsparse * index_sparse_params_per_layer",
)

# Every kind, in the order the pages write them (mixers, then features).
KINDS: tuple[LayerKind, ...] = (SOFTMAX, WINDOW, CHUNKED, GDN, MLA, KDA, CSA, HCA, V4_WINDOW, MAMBA,
                                QK_NORM, QK_NORM_LAYER, SINKS, DSA, DSA_SHARE, OUTPUT_GATE, HEAD_GATE,
                                WINDOW_HEADS, VALUE_DIM, VALUE_DIM_WINDOW, WINDOW_KV, WINDOW_SINKS,
                                K_EQ_V, POST_NORMS, MOE_BRANCH, BLOCK_SPARSE)
MIXERS = tuple(kind for kind in KINDS if kind.role == MIXER)


def kinds_present(cfg: Config) -> frozenset[str]:
    """The names of the kinds the config has (a mixer: its switch, not its layer count, so every
    config of one model shares the formulas of its kinds)."""
    return frozenset(kind.name for kind in KINDS if kind.present(cfg.model))


def kinds_of(v: Variant) -> tuple[LayerKind, ...]:
    """The kinds of the variant, in `KINDS` order; a kind without figures is refused, never
    left out (its layers would be counted as the base's)."""
    kinds = tuple(kind for kind in KINDS if kind.name in v.kinds)
    for kind in kinds:
        if kind.unmodelled:
            raise ValueError(kind.unmodelled)
    return kinds


def kind_sum(v: Variant, view: str, total: str, counts: Callable[[LayerKind], str]) -> tuple[str, list[str]]:
    """One view's per-layer rows over the kinds present: the base row over the blocks no kind
    replaces, each replacing kind's row over its layers, in `KINDS` order; and the `Add` terms
    beside them (returned apart: some pages subtract them). `total` counts all blocks, `counts`
    names a kind's layers (its stage or model symbol)."""
    written: list[str | None] = []
    taken: list[str] = []
    adds: list[str] = []
    base, rebase = "", ""
    for kind in kinds_of(v):
        for term in kind.terms.get(view, ()):
            if isinstance(term, Base):
                base = term.row
                written.append(None)
            elif isinstance(term, Rebase):
                rebase = term.row
            elif isinstance(term, Replace):
                taken.append(counts(kind))
                if term.row:
                    written.append(f"{counts(kind)} * {term.row}")
            else:
                adds.append(f"{counts(kind)} * {term.row}")
    blocks = f"({total} - {' - '.join(taken)})" if taken else total
    row = rebase or base
    return " + ".join(f"{blocks} * {row}" if term is None else term for term in written), adds


def stage_sum(v: Variant, view: str, suffix: str = "") -> str:
    """`kind_sum` over the stage's blocks (`suffix` "_recomputed": those full recompute re-runs),
    its `Add` terms after."""
    main, adds = kind_sum(v, view, "blocks" + suffix, lambda kind: kind.count + suffix)
    return " + ".join([main, *adds])


def model_sum(v: Variant, view: str) -> str:
    """`kind_sum` over the whole model's blocks, as the flops page counts them."""
    main, adds = kind_sum(v, view, "L_model", lambda kind: kind.model_count)
    return " + ".join([main, *adds])


def write_cp_bytes(book: Book, v: Variant) -> None:
    """The comm page's per-layer CP payloads of the kinds present, CP > 1 only: one layer's K/V
    (`cp_kv_bytes`: the last present kind's `cp_kv`, so a feature's rebases its family base's),
    then each kind's own, in `KINDS` order."""
    if not v.cp:
        return
    kinds = kinds_of(v)
    kv = [kind.cp_kv for kind in kinds if kind.cp_kv]
    if kv:
        formula, doc = kv[-1]
        book.add("cp_kv_bytes", formula, "bytes", "bytes", doc)
    for kind in kinds:
        kind.cp_bytes(book, v)


def attention_blocks(v: Variant, suffix: str = "") -> str:
    """The stage's blocks with softmax-family attention (K/V to exchange under CP): all but the
    layers a kind replaces with a mixer of its own."""
    taken = [kind.count + suffix for kind in kinds_of(v)
             if any(isinstance(term, Replace) for term in kind.terms.get(KV, ()))]
    return f"(blocks{suffix} - {' - '.join(taken)})" if taken else "blocks" + suffix


# ------------------------------------------------------------------------------ symbols and values

KIND_SYMBOLS: tuple[Symbol, ...] = (
    Symbol("window_keys", "keys a causal sliding-window query reads at most: window_size's left "
           "part + itself (the causal mask hides the right part; 0 without a window)"),
    Symbol("L_model_window", "sliding-window attention layers of the whole model (decoder layers; "
           "MTP layers counted full)"),
    Symbol("heads_w", "query heads of a sliding-window layer (window_num_attention_heads; the "
           "model's num_attention_heads when unset)"),
    Symbol("L_model_bsparse", "block-sparse attention layers of the whole model (index_sparse_layers)"),
    Symbol("sparse_keys", "keys a block-sparse query reads at most: index_topk_blocks x "
           "index_block_size (0 without block-sparse layers)"),
    Symbol("d_w", "q/k head width of a sliding-window layer (window_kv_channels; kv_channels "
           "when unset)"),
    Symbol("dv_w", "value head width of a sliding-window layer (window_kv_channels; v_head_dim "
           "when unset)"),
    Symbol("groups_w", "KV groups of a sliding-window layer (window_num_query_groups; the "
           "model's num_query_groups when unset)"),
    Symbol("chunk_keys", "tokens of one attention chunk (attention_chunk_size; 0 without chunking)"),
    Symbol("L_model_chunked", "chunked-attention layers of the whole model (Llama 4's RoPE layers)"),
    Symbol("L_model_linear", "gated DeltaNet (linear attention) layers of the whole model, MTP "
           "layers included, as Megatron's FLOPs formula counts them over num_layers + mtp"),
    Symbol("la_qk", "gated DeltaNet q (and k) width: linear_key_head_dim · linear_num_key_heads"),
    Symbol("la_v", "gated DeltaNet v (and gate z) width: linear_value_head_dim · linear_num_value_heads"),
    Symbol("la_nv", "gated DeltaNet value heads (linear_num_value_heads)"),
    Symbol("la_dv", "gated DeltaNet value head dimension (linear_value_head_dim)"),
    Symbol("la_conv", "gated DeltaNet short-convolution kernel (linear_conv_kernel_dim)"),
    # ---- gated DeltaNet under CP (Megatron's default linear_cp_mode 'chunkwise').
    Symbol("la_dk", "gated DeltaNet key head dimension (linear_key_head_dim)"),
    Symbol("L_model_mamba", "Mamba-2 mixer layers of the whole model (hybrid_layer_pattern M)"),
    Symbol("mb_din", "Mamba-2 inner width d_inner: mamba_num_heads · mamba_head_dim"),
    Symbol("mb_nh", "Mamba-2 heads (mamba_num_heads, else 2 · hidden_size / mamba_head_dim)"),
    Symbol("mb_n", "Mamba-2 state size (mamba_state_dim)"),
    Symbol("mb_g", "Mamba-2 B/C groups (mamba_num_groups)"),
    Symbol("mb_conv", "Mamba-2 causal conv kernel (MambaMixer d_conv, 4)"),
    Symbol("mb_chunk", "Mamba-2 SSD chunk length (MambaMixer chunk_size, 128)"),
    Symbol("mb_repeat", "Mamba-2 under CP: how often each B/C group is repeated so every CP rank "
           "holds one (CP / (mamba_num_groups / TP) when that is > 1, else 1)"),
    Symbol("L_model_kda", "Kimi Delta Attention layers of the whole model (kda_layers)"),
    Symbol("kda_d", "KDA q (and k, v, gate, decay) width: kda_num_heads · kda_head_dim"),
    Symbol("kda_nh", "KDA heads (kda_num_heads)"),
    Symbol("kda_dh", "KDA head width and low-rank decay/gate rank (kda_head_dim)"),
    Symbol("kda_conv", "KDA short-convolution taps (linear_conv_kernel_dim)"),
    Symbol("gdn_cp_relayout", "1 when CP's zigzag layout must be converted to the contiguous one "
           "around every gated DeltaNet layer (cp_partition_mode zigzag), else 0"),
)

# Per-stage layer counts of the kinds that count their layers, and of those among the blocks
# full recompute re-runs (V4's CSA/HCA counts are declared beside the stage's other counts).
KIND_STAGE_SYMBOLS: tuple[tuple[str, str], ...] = tuple(
    pair for kind in (WINDOW, CHUNKED, GDN, KDA, MAMBA, BLOCK_SPARSE) for pair in (
        (kind.count, kind.count_doc),
        (f"{kind.count}_recomputed",
         f"{kind.count_doc.split(' on the stage')[0]} among blocks_recomputed"))) + (
    ("L_dsa_topk", "DSA layers on the stage that compute their own top-k and build an indexer "
                   "(decoder and MTP layers; all DSA layers unless dsa_indexer_topk_freq > 1)"),
    ("L_dsa_topk_recomputed", "DSA layers computing their own top-k among blocks_recomputed"))


def kind_values(cfg: Config) -> dict[str, Number]:
    """The global inputs of the kinds' formulas (0 for a kind the config lacks)."""
    m = cfg.model
    mixers = m.layer_mixers
    return {"window_keys": m.window_size[0] + 1 if m.window_size else 0,
            "L_model_window": mixers.count("window"),
            "heads_w": m.window_num_attention_heads or m.num_attention_heads,
            "groups_w": m.window_num_query_groups or m.num_query_groups,
            "d_w": m.window_kv_channels or m.kv_channels,
            "L_model_bsparse": mixers.count("block_sparse"),
            "sparse_keys": (m.index_topk_blocks or 0) * (m.index_block_size or 0),
            "dv_w": m.window_kv_channels or m.v_head_dim,
            "chunk_keys": m.attention_chunk_size or 0,
            "L_model_chunked": mixers.count("chunked"),
            "L_model_linear": mixers.count("gdn"),
            "la_qk": m.linear_key_head_dim * m.linear_num_key_heads,
            "la_v": m.linear_value_head_dim * m.linear_num_value_heads,
            "la_nv": m.linear_num_value_heads, "la_dv": m.linear_value_head_dim,
            "la_conv": m.linear_conv_kernel_dim, "la_dk": m.linear_key_head_dim,
            "gdn_cp_relayout": int(cfg.parallel.cp_partition_mode == "zigzag"),
            "L_model_kda": mixers.count("kda"), "kda_d": m.kda_num_heads * m.kda_head_dim,
            "kda_nh": m.kda_num_heads, "kda_dh": m.kda_head_dim,
            "kda_conv": m.linear_conv_kernel_dim,
            "L_model_mamba": mixers.count("mamba"), "mb_din": m.mamba_d_inner,
            "mb_nh": m.mamba_heads, "mb_n": m.mamba_state_dim, "mb_g": m.mamba_num_groups,
            "mb_conv": MAMBA_D_CONV, "mb_chunk": MAMBA_CHUNK, "mb_repeat": _group_repeat(cfg)}


def _group_repeat(cfg: Config) -> int:
    """MambaContextParallel._set_cp_params group_repeat_count: CP / local groups when a TP rank
    holds fewer B/C groups than there are CP ranks, else 1."""
    local = cfg.model.mamba_num_groups // cfg.parallel.tp
    cp = cfg.parallel.cp
    return cp // local if 0 < local < cp else 1


def layer_counts(model: ModelSection, layers: Iterable[int], suffix: str = "") -> dict[str, Number]:
    """How many of the 0-based `layers` (MTP layers numbered from num_layers on) each counted
    mixer runs, under its stage symbol (+ `suffix`)."""
    mixers = model.layer_mixers
    layers = [layer for layer in layers if layer < len(mixers)]
    picked = [mixers[layer] for layer in layers]
    return {**{kind.count + suffix: picked.count(kind.name) for kind in MIXERS
               if kind.count and not kind.unmodelled},
            "L_dsa_topk" + suffix: sum(1 for layer in layers if model.dsa_computes_topk(layer))}

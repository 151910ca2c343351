"""ARC: what Megatron refuses with the mechanisms of the current MoE architectures (gpt-oss,
GLM-4.5, MiniMax-M2, Llama 4, Qwen3-Next, DeepSeek-V3.2): the NoPE pattern, the GLU offset, the
L2 q/k norm, the gated DeltaNet heads, DSA's biases and CP exchange, linear biases beside a shared
expert, the head-wise attention gate over TP, the Mamba-2 heads and groups over TP and CP, and
where pipeline chunks may start when DSA shares its top-k across layers."""

from __future__ import annotations

from collections.abc import Iterator

from planner.config.dsa_share import (
    chunk_start_problems,
    computing_layers,
    movable_starts,
    source_layer,
)
from planner.config.layout_strings import layout_string
from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import TRANSFORMER_CONFIG, dev

GPT_LAYER_SPECS = dev("core/models/gpt/gpt_layer_specs.py",
                      "get_gpt_layer_with_transformer_engine_submodules")


@rule(
    "ARC001", "error", "no_rope_freq must fit the layer count",
    source=TRANSFORMER_CONFIG,
    why="""Megatron expands an integer no_rope_freq N into a per-layer pattern repeated
    num_layers / N times and asserts N divides num_layers; a list must name every layer.""",
    bad="model: {no_rope_freq: 3}",
    good="model: {no_rope_freq: 4}",
)
def no_rope_pattern_fits(f: Facts) -> Iterator[Violation]:
    skip, layers = f.model.no_rope_freq, f.model.num_layers
    if isinstance(skip, int) and layers % skip:
        yield Violation("model.no_rope_freq", f"no_rope_freq {skip} does not divide num_layers {layers}",
                        f"pick a divisor of {layers} or give the 0/1 list per layer")
    elif isinstance(skip, list) and len(skip) != layers:
        yield Violation("model.no_rope_freq", f"no_rope_freq lists {len(skip)} layers, the model has "
                        f"{layers}", "give one 1 (no RoPE) or 0 per layer")


@rule(
    "ARC002", "error", "glu_linear_offset needs quick_geglu",
    source=TRANSFORMER_CONFIG,
    why="""With the fused bias-activation kernel (Megatron's default for gated MLPs) a non-zero
    glu_linear_offset is refused unless the activation is quick-GEGLU: only that kernel adds the
    offset to the linear half (gpt-oss's clamped GLU).""",
    bad="model: {glu_linear_offset: 1.0}",
    good="model: {glu_linear_offset: 1.0, quick_geglu: true}",
)
def glu_offset_needs_quick_geglu(f: Facts) -> Iterator[Violation]:
    m = f.model
    if m.glu_linear_offset != 0 and not m.quick_geglu and (m.swiglu or m.add_bias_linear):
        yield Violation("model.glu_linear_offset", f"glu_linear_offset {m.glu_linear_offset} with "
                        f"{'swiglu' if m.swiglu else 'gelu'}", "set model.quick_geglu: true or drop "
                        "the offset")


@rule(
    "ARC003", "error", "qk_l2_norm needs standard attention",
    source=GPT_LAYER_SPECS,
    why="""Megatron's layer specs assert that the L2 q/k norm is not combined with multi-latent
    attention (its MLA q/k norms are the latent RMSNorms).""",
    bad="model: {qk_l2_norm: true, multi_latent_attention: true, kv_lora_rank: 32}",
    good="model: {qk_l2_norm: true}",
)
def qk_l2_norm_standard_attention(f: Facts) -> Iterator[Violation]:
    if f.model.qk_l2_norm and f.model.attention_variant != "standard":
        yield Violation("model.qk_l2_norm", f"qk_l2_norm with attention_variant "
                        f"{f.model.attention_variant}", "drop qk_l2_norm (MLA normalises its latents)")


_GDN = "model: {linear_attention_freq: 4, "
_TP4 = "parallel: {tp: 4, ep: 2, sequence_parallel: true}"


@rule(
    "ARC004", "error", "gated DeltaNet value heads are a multiple of its key heads",
    source=TRANSFORMER_CONFIG,
    why="""Each gated DeltaNet key head serves linear_num_value_heads / linear_num_key_heads value
    heads; Megatron asserts the ratio is whole.""",
    bad=_GDN + "linear_num_key_heads: 4, linear_num_value_heads: 6}",
    good=_GDN + "linear_num_key_heads: 4, linear_num_value_heads: 8}",
)
def gdn_value_heads_per_key_head(f: Facts) -> Iterator[Violation]:
    m = f.model
    if m.linear_attention_freq is not None and m.linear_num_value_heads % m.linear_num_key_heads:
        yield Violation("model.linear_num_value_heads", f"linear_num_value_heads "
                        f"{m.linear_num_value_heads} is not a multiple of linear_num_key_heads "
                        f"{m.linear_num_key_heads}", "make the value heads a multiple of the key heads")


@rule(
    "ARC005", "error", "TP divides the gated DeltaNet heads",
    source=TRANSFORMER_CONFIG,
    why="""Gated DeltaNet splits its key and value heads over the tensor-parallel ranks (with the
    default chunkwise CP every CP rank keeps its TP rank's heads); Megatron asserts TP divides
    both head counts.""",
    bad=_GDN + "linear_num_key_heads: 2, linear_num_value_heads: 4}\n" + _TP4,
    good=_GDN + "linear_num_key_heads: 4, linear_num_value_heads: 8}\n" + _TP4,
)
def gdn_heads_fit_tp(f: Facts) -> Iterator[Violation]:
    m, tp = f.model, f.par.tp
    if m.linear_attention_freq is None:
        return
    for name in ("linear_num_key_heads", "linear_num_value_heads"):
        if getattr(m, name) % tp:
            yield Violation(f"model.{name}", f"{name} {getattr(m, name)} not divisible by TP {tp}",
                            f"pick a TP that divides {getattr(m, name)}")


_DSA = ("model: {multi_latent_attention: true, kv_lora_rank: 32, q_lora_rank: 32, dsa: true, "
        "index_n_heads: 4, index_head_dim: 16, index_topk: 64")


@rule(
    "ARC006", "error", "DSA takes no linear biases",
    source=TRANSFORMER_CONFIG,
    why="""DSA runs Megatron's absorbed MLA attention, which refuses add_bias_linear.""",
    bad=_DSA + ", add_bias_linear: true}",
    good=_DSA + "}",
)
def dsa_without_bias(f: Facts) -> Iterator[Violation]:
    if f.model.dsa and f.model.add_bias_linear:
        yield Violation("model.add_bias_linear", "add_bias_linear with DSA", "set add_bias_linear: false")


@rule(
    "ARC007", "error", "DSA under CP needs the all-gather CP exchange",
    source=TRANSFORMER_CONFIG,
    why="""DSA's context parallelism gathers the keys over the CP group; Megatron asserts every
    cp_comm_type is all_gather.""",
    bad=_DSA + "}\nparallel: {world_size: 16, cp: 2, cp_comm_type: p2p}",
    good=_DSA + "}\nparallel: {world_size: 16, cp: 2, cp_comm_type: all_gather}",
)
def dsa_cp_all_gather(f: Facts) -> Iterator[Violation]:
    if f.model.dsa and f.par.cp > 1 and f.par.cp_comm_type != "all_gather":
        yield Violation("parallel.cp_comm_type", f"DSA with CP {f.par.cp} over {f.par.cp_comm_type}",
                        "set parallel.cp_comm_type: all_gather")


@rule(
    "ARC008", "error", "linear biases take no shared expert",
    source=dev("core/transformer/moe/shared_experts.py", "SharedExpertMLP.__init__"),
    why="""Megatron's shared expert asserts add_bias_linear is off: its MLP has no biases, so
    gpt-oss-style biases (add_bias_linear) and a shared expert cannot be trained together.""",
    bad="model: {add_bias_linear: true, moe_shared_expert_intermediate_size: 32}",
    good="model: {add_bias_linear: true, moe_shared_expert_intermediate_size: 0}",
)
def bias_without_shared_expert(f: Facts) -> Iterator[Violation]:
    shared = f.model.moe_shared_expert_intermediate_size
    if f.model.add_bias_linear and shared:
        yield Violation("model.add_bias_linear", f"add_bias_linear with a shared expert of {shared}",
                        "set add_bias_linear: false or moe_shared_expert_intermediate_size: 0")


_GATE = "model: {head_wise_attn_gate: true, num_attention_heads: 8, "


@rule(
    "ARC009", "error", "the head-wise attention gate fits TP",
    source=TRANSFORMER_CONFIG,
    why="""The head-wise gate's rows (one per attention head) are appended to linear_qkv and peeled
    off per TP rank before the query groups are resliced: Megatron refuses it unless TP divides the
    attention heads and the query groups are at least TP; under FP8 (FP4) each rank's linear_qkv
    output, (heads + 2 * groups) * kv_channels + heads over TP, must be a multiple of 16 (32).""",
    bad=_GATE + "num_query_groups: 2}\nparallel: {tp: 4, ep: 2, sequence_parallel: true}",
    good=_GATE + "num_query_groups: 4}\nparallel: {tp: 4, ep: 2, sequence_parallel: true}",
)
def head_gate_fits_tp(f: Facts) -> Iterator[Violation]:
    m, tp = f.model, f.par.tp
    if not m.head_wise_attn_gate:
        return
    if m.num_attention_heads % tp:
        yield Violation("model.num_attention_heads", f"head_wise_attn_gate with "
                        f"{m.num_attention_heads} heads over TP {tp}",
                        f"pick a TP that divides {m.num_attention_heads}")
    if m.num_query_groups < tp:
        yield Violation("model.num_query_groups", f"head_wise_attn_gate with {m.num_query_groups} "
                        f"query groups < TP {tp}", f"use TP <= {m.num_query_groups}")
    if f.train.fp8 or f.train.fp4:
        align = 32 if f.train.fp4 else 16
        out = (m.num_attention_heads + 2 * m.num_query_groups) * m.kv_channels + m.num_attention_heads
        if (out // tp) % align:
            yield Violation("model.head_wise_attn_gate", f"linear_qkv's {out // tp} output rows per "
                            f"TP rank ({out} over TP {tp}) are not a multiple of {align} under "
                            f"{'FP4' if f.train.fp4 else 'FP8'}",
                            "change the heads, groups or TP, or train without the head-wise gate")


MAMBA_MIXER = dev("core/ssm/mamba_mixer.py", "MambaMixer.__init__")
_MAMBA = ("model: {num_layers: 2, mamba_layers: [1, 0], mamba_num_heads: 8, mamba_head_dim: 16, "
          "mamba_num_groups: ")
_TP2 = "parallel: {tp: 2, ep: 2, sequence_parallel: true}"


@rule(
    "ARC010", "error", "Mamba-2 heads and groups fit TP and CP",
    source=MAMBA_MIXER,
    why="""A Mamba-2 mixer splits its heads and its B/C groups over the tensor-parallel ranks and
    asserts TP divides both; under context parallelism each TP rank's heads are split again over
    the CP ranks (megatron/core/ssm/mamba_context_parallel.py MambaContextParallel._set_cp_params
    asserts CP divides them, and that a rank's groups and CP divide one another). Under FP8 the
    in_proj output width, 2·d_inner + 2·groups·state + heads, must be a multiple of 16.""",
    bad=_MAMBA + "1}\n" + _TP2,
    good=_MAMBA + "2}\n" + _TP2,
)
def mamba_fits_tp_cp(f: Facts) -> Iterator[Violation]:
    m, tp, cp = f.model, f.par.tp, f.par.cp
    if 1 not in (m.mamba_layers or []):
        return
    heads, groups = m.mamba_heads, m.mamba_num_groups
    if heads % tp:
        yield Violation("model.mamba_num_heads", f"{heads} Mamba heads not divisible by TP {tp}",
                        f"pick a TP that divides {heads}")
    if groups % tp:
        yield Violation("model.mamba_num_groups", f"{groups} Mamba groups not divisible by TP {tp}",
                        f"pick a TP that divides {groups}")
    elif cp > 1:
        local = groups // tp
        if (heads // tp) % cp:
            yield Violation("parallel.cp", f"{heads // tp} Mamba heads per TP rank not divisible by "
                            f"CP {cp}", f"pick a CP that divides {heads // tp}")
        if (cp % local) if local < cp else (local % cp):
            yield Violation("parallel.cp", f"{local} Mamba groups per TP rank and CP {cp} do not "
                            "divide one another", "pick a CP that divides or is a multiple of "
                            f"{local}")
    if f.train.fp8 or f.train.fp4:
        width = 2 * m.mamba_d_inner + 2 * groups * m.mamba_state_dim + heads
        if width % 16:
            yield Violation("model.mamba_num_heads", f"Mamba in_proj output width {width} is not "
                            "a multiple of 16 under FP8", "change the Mamba heads, groups or state "
                            "size, or train without FP8")


HYBRID_RECOMPUTE = dev("core/recompute.py", "checkpointed_forward")


@rule(
    "ARC011", "error", "block-method full recompute of a Mamba stack is not modelled",
    source=HYBRID_RECOMPUTE,
    why="""Megatron's hybrid stack (megatron/core/models/hybrid/hybrid_block.py HybridStack)
    checkpoints its own layers, one per pattern symbol, so the block method recomputes the first
    recompute_num_layers pattern layers of each chunk: half a block of moeplan's can be recomputed
    and half not. moeplan's memory page counts whole blocks there, so it refuses to price it
    rather than print a wrong figure; the uniform method (every layer recomputed) is modelled.""",
    bad=_MAMBA + "2}\n" + _TP2 + "\noverlap: {recompute_granularity: full, recompute_method: block, "
        "recompute_num_layers: 1}",
    good=_MAMBA + "2}\n" + _TP2 + "\noverlap: {recompute_granularity: full, recompute_method: "
         "uniform, recompute_num_layers: 1}",
)
def hybrid_block_recompute(f: Facts) -> Iterator[Violation]:
    m, ov = f.model, f.cfg.overlap
    if 1 not in (m.mamba_layers or []) + (m.mixer_only_layers or []):
        return
    if ov.recompute_granularity == "full" and ov.recompute_method == "block":
        yield Violation("overlap.recompute_method", "block-method full recompute of a Mamba stack "
                        "(Megatron counts recompute_num_layers in pattern layers, moeplan in blocks)",
                        "use recompute_method: uniform, or selective recompute")


DSA_INDEX_SHARE = dev("core/models/gpt/experimental_attention_variant_module_specs.py",
                      "_validate_dsa_index_share_pipeline_split")
_SHARED = _DSA + ", dsa_indexer_topk_freq: 2, dsa_indexer_skip_topk_offset: 2}"


@rule(
    "ARC012", "error", "with DSA top-k shared, every pipeline chunk starts on a computing layer",
    source=DSA_INDEX_SHARE,
    why="""With dsa_indexer_topk_freq > 1 a layer between two computing layers has no indexer and
    reuses the top-k of the last computing layer before it; that layer must run earlier in the
    same pipeline chunk, since the top-k indices do not cross pipeline stages. Megatron refuses
    the split when it builds the chunk's layers.""",
    bad=_SHARED,
    good=_SHARED + "\nparallel: {pipeline_model_parallel_layout: Et|t*3L}",
)
def dsa_share_chunk_starts(f: Facts) -> Iterator[Violation]:
    m = f.model
    if not m.dsa or m.dsa_indexer_topk_freq <= 1:
        return
    freq, offset = m.dsa_indexer_topk_freq, m.dsa_indexer_skip_topk_offset
    yield from _mtp_sources(f, freq, offset)
    chunks = [c for c in f.split.chunks if c.layers]
    starts = [min(c.layers) for c in chunks]
    problems = chunk_start_problems(starts, freq, offset)
    if not problems:
        return
    starts_text = ", ".join(str(start) for start, _ in problems)
    sources = ", ".join(str(source) for _, source in problems)
    shown = (f"a chunk starts on layer {starts_text} (0-based), which reuses the top-k of layer "
             f"{sources} on an earlier chunk" if len(problems) == 1 else
             f"chunks start on layers {starts_text} (0-based), which reuse the top-k of layers "
             f"{sources} on earlier chunks")
    moved = movable_starts(starts, m.num_layers, freq, offset)
    if moved is None:
        fix = (f"use fewer pipeline chunks: only layers {computing_layers(m.num_layers, freq, offset)}"
               " compute their own top-k")
    else:
        ends = [*moved[1:], m.num_layers]
        counts = iter(end - start for start, end in zip(moved, ends, strict=True))
        per_chunk = [next(counts) if c.layers else 0 for c in f.split.chunks]
        fix = (f"start each chunk on a computing layer, e.g. pipeline_model_parallel_layout: "
               f"\"{layout_string(per_chunk, m.mtp_num_layers)}\"")
    yield Violation("parallel.pipeline_model_parallel_layout",
                    f"DSA top-k shared every {freq} layers (offset {offset}): {shown}", fix)


def _mtp_sources(f: Facts, freq: int, offset: int) -> Iterator[Violation]:
    """An MTP depth is DSA layer num_layers + depth (DSAttention.__init__); when it reuses a
    top-k, the layer it reuses must have run earlier on its own chunk (DSAttention.forward raises
    otherwise)."""
    m = f.model
    for chunk in f.split.chunks:
        for depth in chunk.mtp_layers:
            layer = m.num_layers + depth
            source = source_layer(layer, freq, offset)
            held = set(chunk.layers) | {m.num_layers + d for d in chunk.mtp_layers if d < depth}
            if source != layer and source not in held:
                yield Violation("parallel.pipeline_model_parallel_layout",
                                f"DSA top-k shared every {freq} layers (offset {offset}): MTP depth "
                                f"{depth + 1} (layer {layer}, 0-based) reuses the top-k of layer "
                                f"{source}, which is not on its pipeline chunk",
                                f"put the MTP layers on the chunk that holds layer {source}")


ROUTER = dev("core/transformer/moe/router.py", "Router.__init__")
_LONGCAT = ("model: {num_layers: 4, moe_layer_freq: [1, 0, 1, 0], moe_zero_experts: 4, "
            "moe_shortcut: true, moe_shared_expert_intermediate_size: 96}")


@rule(
    "ARC013", "warning", "zero-computation experts and the shortcut MoE are priced at a bound",
    source=ROUTER,
    why="""LongCat-Flash's router scores zero-computation (identity) experts beside the routed
    ones: a top-k pick that lands on one costs no expert GEMM and no dispatch, so a token's
    activated compute depends on the routing. Megatron's router holds a [num_moe_experts, h]
    weight and computes every pick; moeplan prices every pick as a computing expert (the static
    upper bound transformers' meta build counts as activated), so expert FLOPs, the dispatch and
    the step time are upper bounds. Its shortcut MoE pairs layers (the MoE block of an even layer
    adds its output after the odd layer that follows): a pipeline chunk that starts inside a pair
    sends the block's output to the next stage, which the plan does not price.""",
    bad=_LONGCAT + "\nparallel: {world_size: 8, pp: 2, pipeline_model_parallel_layout: Et|t*3L}",
    good="model: {num_layers: 4}",
)
def longcat_moe_bounds(f: Facts) -> Iterator[Violation]:
    m = f.model
    if m.moe_zero_experts:
        yield Violation("model.moe_zero_experts", f"{m.moe_zero_experts} zero-computation experts "
                        f"beside {m.num_experts} routed ones: the expert compute, dispatch and step "
                        f"time are priced as if all top-{m.moe_router_topk} picks computed (an "
                        "upper bound; the routing-dependent share is not priced)",
                        "read expert FLOPs and step time as upper bounds; ignore ARC013 to accept")
    odd = [min(c.layers) for c in f.split.chunks if c.layers and min(c.layers) % 2]
    if m.moe_shortcut and odd:
        yield Violation("parallel.pipeline_model_parallel_layout", "the shortcut MoE pairs layers "
                        f"(0, 1), (2, 3), ...; pipeline chunks start on layers {odd} (0-based), "
                        "inside a pair, so the MoE output crosses a stage boundary the plan does "
                        "not price", "start every pipeline chunk on an even layer")


RULES = (no_rope_pattern_fits, glu_offset_needs_quick_geglu, qk_l2_norm_standard_attention,
         gdn_value_heads_per_key_head, gdn_heads_fit_tp, dsa_without_bias, dsa_cp_all_gather,
         bias_without_shared_expert, head_gate_fits_tp, mamba_fits_tp_cp, hybrid_block_recompute,
         dsa_share_chunk_starts, longcat_moe_bounds)

"""The Megatron-LM argument list that reproduces a plan: parallel sizes, rank order, pipeline split,
batch sizes, model shape, MoE router/dispatcher/capacity settings, overlaps and recompute.

Flag names follow Megatron-LM's argparse names (Megatron-LM dev@d48bd6be
megatron/training/arguments.py add_megatron_arguments). DeepSeek-V4
models (`attention_variant: dsv4_hybrid`) target the hybrid entry, `pretrain_hybrid.py`, whose
`--hybrid-layer-pattern` carries the per-layer attention kind, the MoE layers, the pipeline
segments and the MTP block in one string; everything else targets `pretrain_gpt.py`.
Data, tokenizer, checkpoint and logging arguments are not part of a plan and stay the user's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from planner.config.argument_classes import argument_class, argument_words
from planner.config.entry_parsers import entry_argument
from planner.config.hybrid_pattern import (
    MAMBA_MTP_DEPTH,
    RATIO_SYMBOL,
    join_segments,
    layer_symbols,
    mamba_block_symbols,
    segment_text,
)
from planner.config.megatron_arguments import (
    Emit,
    Hand,
    argument_table,
    emit_steps,
    is_dsv4,
    is_hybrid,
    is_mamba_stack,
    megatron_default,
)
from planner.config.megatron_branch import BranchConflict, megatron_branch
from planner.config.megatron_names import HYBRID_DSV4_SPEC, PP_DP_ORDER, moeplan_field
from planner.config.schema import DEFAULT_ORDER, Config, ModelSection, rope_fusion_refused
from planner.emit.safety import EmitError
from planner.layout.pipeline import SplitError, StageSplit, stage_split

GPT_ENTRY = "pretrain_gpt.py"
# The code `emit megatron` prefixes a refusal with when Megatron-LM dev cannot train the model at all
# (not a layout it refuses: those are rule findings).
NOT_IN_MEGATRON = "EMT010"
HYBRID_ENTRY = "pretrain_hybrid.py"



@dataclass(frozen=True)
class MegatronFlag:
    flag: str
    values: tuple[str, ...]
    source: str  # the config field it reproduces, written as a trailing comment


def launch_environment(cfg: Config) -> dict[str, str]:
    """Environment Megatron-LM asserts at start-up. With TP or CP > 1 before Blackwell it requires
    CUDA_DEVICE_MAX_CONNECTIONS=1, unless FSDP (which requires it unset or > 1) or EP-overlap (a
    warning) is on (Megatron-LM dev@d48bd6be megatron/training/arguments.py validate_args). Setting
    it on Blackwell as well costs nothing there."""
    p, t = cfg.parallel, cfg.training
    fsdp = t.use_megatron_fsdp or t.use_torch_fsdp2
    env = {}
    if (p.tp > 1 or p.cp > 1) and not fsdp and not cfg.overlap.overlap_moe_expert_parallel_comm:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    # validate_args asserts NVTE_CPU_OFFLOAD_V1=1 under fine-grained activation
    # offloading with Transformer Engine >= 2.10 (so TE does not offload weights); harmless before.
    if cfg.overlap.fine_grained_activation_offloading:
        env["NVTE_CPU_OFFLOAD_V1"] = "1"
    return env


@dataclass
class MegatronArgs:
    entry: str
    branch: str
    flags: list[MegatronFlag] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # settings Megatron-LM cannot take
    env: dict[str, str] = field(default_factory=dict)  # exported before Megatron-LM starts
    extra: tuple[str, ...] = ()  # launch.megatron_extra_args, verbatim after the plan's flags

    def add(self, flag: str, *values: object, source: str) -> None:
        """Append a flag; one already held is refused (argparse would keep the last silently, so two
        writers of one flag are a bug however their values agree)."""
        held = next((f for f in self.flags if f.flag == flag), None)
        if held is not None:
            raise ValueError(f"{flag} is emitted twice: from {held.source} and from {source}")
        self.flags.append(MegatronFlag(flag, tuple(_word(v) for v in values), source))

    def add_if(self, condition: bool, flag: str, *values: object, source: str) -> None:
        if condition:
            self.add(flag, *values, source=source)

    def as_dict(self) -> dict[str, tuple[str, ...]]:
        return {f.flag: f.values for f in self.flags}


def _word(value: object) -> str:
    if isinstance(value, bool):
        raise TypeError("boolean settings are store_true flags, not values")
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def _branch(cfg: Config) -> str:
    """The branch the command line targets (planner/config/megatron_branch.py); a config that
    needs both cannot be emitted."""
    try:
        return megatron_branch(cfg)
    except BranchConflict as conflict:
        raise EmitError(conflict.path, str(conflict)) from None


def _order_axes_of_size_one(cfg: Config) -> set[str]:
    """Axes that are 1 in both the dense and the expert generator change no group."""
    p = cfg.parallel
    sizes = {"tp": max(p.tp, cfg.degrees.etp), "cp": p.cp, "ep": p.ep, "pp": p.pp,
             "dp": max(cfg.dp, cfg.edp), "gtp_remat": max(p.gtp, p.egtp)}
    return {axis for axis, size in sizes.items() if size == 1}


def _reduced(order: str, ones: set[str]) -> list[str]:
    return [axis for axis in order.lower().split("-") if axis not in ones]


def order_flags(cfg: Config) -> bool:
    """True when the layout needs `--use-tp-pp-dp-mapping`; EmitError for orders Megatron's CLI lacks."""
    ones = _order_axes_of_size_one(cfg)
    order = _reduced(cfg.parallel.order, ones)
    if order == _reduced(DEFAULT_ORDER, ones):
        return False
    if order == _reduced(PP_DP_ORDER, ones):
        return True
    raise EmitError("parallel.order", f"Megatron-LM's command line offers only {DEFAULT_ORDER} (default) "
                    f"and {PP_DP_ORDER} (--use-tp-pp-dp-mapping); {cfg.parallel.order} needs the "
                    "Megatron-Core API")


@dataclass(frozen=True)
class HybridPattern:
    """The `--hybrid-layer-pattern` text and where each decoder layer's MLP symbol lands in Megatron's
    layer numbering: the hybrid stack gives every main-pattern symbol its own 1-based layer number,
    counted across pipeline segments (`|` and the MTP part after `/` are not counted)."""

    text: str
    mlp_layer_numbers: dict[int, int]  # decoder layer id -> Megatron layer number of its MLP symbol


def hybrid_pattern(cfg: Config, split: StageSplit) -> HybridPattern:
    """`HEHECE…|…/WE`: attention kind + MLP kind per layer, `|` between pipeline segments (virtual
    stages in pipeline order), `/` before each MTP depth, which must sit on the last segment."""
    model = cfg.model
    if is_mamba_stack(cfg):
        return _mamba_pattern(cfg, split)
    ratios = model.compress_ratios
    total = model.num_layers + model.mtp_num_layers
    if ratios is None or len(ratios) < total:
        raise EmitError("model.compress_ratios", f"the hybrid layer pattern needs one compress ratio per "
                        f"decoder and MTP layer ({total}), got {0 if ratios is None else len(ratios)}")
    bad = sorted({r for r in ratios[:total] if r not in RATIO_SYMBOL})
    if bad:
        raise EmitError("model.compress_ratios", f"ratios {bad} have no hybrid-pattern symbol "
                        "(0 = window only, 4 = CSA, 128 = HCA)")
    moe_layers = {layer for stage in split.stages for layer in stage.moe_layers}

    def symbols(layer: int) -> str:
        return layer_symbols(ratios[layer], layer in moe_layers)

    return _pattern(split, symbols, lambda depth: symbols(model.num_layers + depth))


def _pattern(split: StageSplit, block: Callable[[int], str],
             mtp_depth: Callable[[int], str]) -> HybridPattern:
    """The pattern from each decoder layer's symbols (`block`) and each MTP depth's (`mtp_depth`):
    one segment per pipeline chunk, the MTP depths on the last, and every layer's Megatron number
    (the count of main-pattern symbols up to and including its own)."""
    segments: list[str] = []
    numbers: dict[int, int] = {}
    counted = 0
    last = len(split.chunks) - 1
    for chunk in split.chunks:
        if not chunk.layers:
            raise EmitError("parallel.pipeline_model_parallel_layout", f"pipeline segment {chunk.index} "
                            "holds no decoder layer; a hybrid layer pattern cannot express it")
        if chunk.mtp_layers and chunk.index != last:
            raise EmitError("parallel.pipeline_model_parallel_layout", "the hybrid layer pattern places "
                            "MTP layers after the last pipeline segment; move 'm' to the last stage")
        pieces = [block(layer) for layer in chunk.layers]
        for layer, piece in zip(chunk.layers, pieces, strict=True):
            counted += len(piece)
            numbers[layer] = counted
        segments.append(segment_text(pieces, [mtp_depth(d) for d in chunk.mtp_layers]))
    return HybridPattern(join_segments(segments), numbers)


def _mamba_pattern(cfg: Config, split: StageSplit) -> HybridPattern:
    """`MEM*E…|…/*E`: per block its mixer (M Mamba-2, * attention), then its MLP (E, -) unless
    the block is mixer-only, `|` between pipeline segments (virtual stages in pipeline order), `/*E`
    per MTP depth on the last segment."""
    model = cfg.model
    mamba = model.mamba_layers or [0] * model.num_layers
    moe_layers = {layer for stage in split.stages for layer in stage.moe_layers}
    return _pattern(split, lambda layer: mamba_block_symbols(mamba[layer] == 1, model.has_mlp(layer),
                                                             layer in moe_layers),
                    lambda _: MAMBA_MTP_DEPTH)


def planned_hash_blocks(split: StageSplit) -> list[int]:
    """The decoder MoE blocks the plan routes by token id (MTP blocks never are)."""
    return sorted(layer for stage in split.stages for layer in stage.hash_layers)


def megatron_hash_layer_count(cfg: Config, split: StageSplit, numbers: dict[int, int] | None) -> int:
    """The `--moe-n-hash-layers` value under which Megatron hashes exactly the planned MoE blocks.

    Megatron hashes a non-MTP MoE layer when its layer number is <= moe_n_hash_layers
    (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/router.py TopKRouter.__init__). The GPT
    stack numbers decoder layers 1..L; the hybrid stack numbers every pattern symbol
    (megatron/core/models/hybrid/hybrid_block.py HybridStack.__init__, offsets from
    hybrid_layer_allocation.py select_pipeline_segment), so there the count must reach the last
    planned block's `E`. `numbers` maps a decoder layer to its Megatron layer number (None: GPT).
    0 when no MoE block is planned as hashed."""
    planned = planned_hash_blocks(split)
    if not planned:
        return 0
    number = numbers if numbers is not None else {layer: layer + 1 for layer in range(cfg.model.num_layers)}
    count = number[planned[-1]]
    moe = {layer for stage in split.stages for layer in stage.moe_layers if layer < cfg.model.num_layers}
    hashed = sorted(layer for layer in moe if number[layer] <= count)
    if hashed != planned:
        raise EmitError("model.moe_n_hash_layers", f"no --moe-n-hash-layers value makes Megatron hash "
                        f"exactly the planned MoE blocks {planned} (with {count} it would hash {hashed})")
    return count


@dataclass(frozen=True)
class _Planned:
    """What hand-written steps read beside the config: the stage split and the hybrid pattern."""

    split: StageSplit
    pattern: HybridPattern | None


def _plain(cfg: Config, args: MegatronArgs, step: Emit) -> None:
    """A table argument: its field's value, when it differs from Megatron's default (or always)."""
    if step.when is not None and not step.when(cfg):
        return
    dotted, kind = argument_table()[step.flag]
    section, name = dotted.split(".", 1)
    value = getattr(getattr(cfg, section), name)
    if not step.always and (value is None or value == [] or value == megatron_default(dotted)):
        return
    if kind == "flag":
        negation = step.flag.startswith(("--no-", "--disable-"))  # --disable-bias-linear
        if value:
            args.add(step.flag, source=dotted)
        else:  # Megatron's default is on: the table's negation, or its --no- spelling, turns it off
            args.add(step.flag if negation else "--no-" + name.replace("_", "-"), source=f"{dotted} false")
        return
    if kind in ("ints", "strs"):
        args.add(step.flag, *value, source=dotted)
    elif kind == "int_tuple":  # megatron/training/arguments.py tuple_type reads "left,right"
        args.add(step.flag, ",".join(str(n) for n in value), source=dotted)
    else:
        args.add(step.flag, value, source=dotted)


def _weight_shards(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    p = cfg.parallel
    args.add_if(p.gtp > 1, "--tensor-parallel-num-weight-shards", p.tp * p.gtp,
                source="parallel.gtp (TP x GTP)")
    args.add_if(p.egtp > 1, "--expert-tensor-parallel-num-weight-shards", cfg.degrees.etp * p.egtp,
                source="parallel.egtp (ETP x EGTP)")


def _order(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    args.add_if(order_flags(cfg), "--use-tp-pp-dp-mapping", source=f"parallel.order {cfg.parallel.order}")


def _hybrid_layer_pattern(cfg: Config, args: MegatronArgs, planned: _Planned) -> None:
    if planned.pattern is not None:
        fields = ("model.mamba_layers + mixer_only_layers" if is_mamba_stack(cfg)
                  else "model.compress_ratios")
        args.add("--hybrid-layer-pattern", planned.pattern.text,
                 source=f"{fields} + stage split ({planned.split.source}) + MTP")


def _virtual_stages(cfg: Config, args: MegatronArgs, planned: _Planned) -> None:
    """One of the layout, the layers per virtual stage or the virtual stage count (GPT entry)."""
    p = cfg.parallel
    if planned.pattern is not None:
        return
    if p.pipeline_model_parallel_layout:  # Megatron takes commas, not spaces
        args.add("--pipeline-model-parallel-layout", "".join(p.pipeline_model_parallel_layout.split()),
                 source="parallel.pipeline_model_parallel_layout")
    elif p.num_layers_per_virtual_pipeline_stage is not None:
        args.add("--num-layers-per-virtual-pipeline-stage", p.num_layers_per_virtual_pipeline_stage,
                 source="parallel.num_layers_per_virtual_pipeline_stage")
    elif planned.split.vpp > 1:
        args.add("--num-virtual-stages-per-pipeline-rank", planned.split.vpp, source="parallel.vpp")


def _group_query_attention(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    m = cfg.model
    if m.attention_variant == "standard" and m.group_query_attention:
        args.add("--group-query-attention", source="model.group_query_attention / num_query_groups")
        args.add("--num-query-groups", m.num_query_groups, source="model.num_query_groups")


def _max_position_embeddings(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    m = cfg.model
    if m.max_position_embeddings is not None:
        args.add("--max-position-embeddings", m.max_position_embeddings,
                 source="model.max_position_embeddings")
    else:  # Megatron requires it and needs it >= seq_length (arguments.py validate_args)
        args.add("--max-position-embeddings", cfg.training.seq_length,
                 source="training.seq_length (model.max_position_embeddings unset)")


# What Megatron-LM dev@d48bd6be cannot train, one record each: the field named, when it applies, and
# why (with where the model trains instead). The first that applies refuses the emit as EMT010.
_GEMMA_WHY = ("it builds one head width and a v projection for every layer and two pre-norms per "
              "block (megatron/core/models/gpt/gpt_layer_specs.py "
              "get_gpt_layer_with_transformer_engine_submodules); a model with these layers trains "
              "with its own model class where a Megatron-Bridge bridge has one (Gemma-4: "
              "Gemma4VLBridge)")
_MIMO_WHY = ("(megatron/core/transformer/attention.py SelfAttention); Megatron-Bridge's "
             "MiMoV2FlashSelfAttention switches KV groups, sinks and the value width per layer "
             "(train it there, MiMoV2FlashBridge)")
_LONGCAT_WHY = ("its router scores only experts that compute (megatron/core/transformer/moe/router.py "
                "Router.__init__: a [num_moe_experts, h] weight), and its MoE block adds its output "
                "in the layer that reads its input ("
                "megatron/core/transformer/transformer_layer.py TransformerLayer); no "
                "Megatron-Bridge bridge for LongCat-Flash is known")
UNTRAINABLE: tuple[tuple[str, Callable[[ModelSection], bool], str], ...] = (
    ("model.qk_layernorm_per_layer", lambda m: m.qk_layernorm_per_layer,
     "its qk_layernorm normalises each head (megatron/core/transformer/attention.py "
     "SelfAttention.__init__: q_layernorm over hidden_size_per_attention_head), none normalises all "
     "heads of a layer at once (MiniMax-M2); set it false to train per-head q/k norms instead"),
    ("model.window_num_attention_heads",
     lambda m: m.window_num_attention_heads not in (None, m.num_attention_heads),
     "it builds every layer's attention with one num_attention_heads (megatron/core/transformer/"
     "attention.py SelfAttention); Megatron-Bridge's Step35DecoderLayer overrides it on "
     "sliding-attention layers (train it there)"),
    ("model.index_sparse_layers", lambda m: m.index_sparse_layers is not None and any(m.index_sparse_layers),
     "its lightning indexer (DSA) belongs to multi-latent attention and picks tokens, not key blocks "
     "(megatron/core/transformer/attention.py SelfAttention has none); no Megatron-Bridge bridge for "
     "MiniMax-M3 is known"),
    ("model.kda_layers", lambda m: m.kda_layers is not None and any(m.kda_layers),
     "it has no Kimi Delta Attention layer (megatron/core/models/gpt/"
     "experimental_attention_variant_module_specs.py is_linear_attention_variant knows "
     "gated_delta_net only); NVIDIA-NeMo/Megatron-Bridge has no kimi_linear bridge, the fork "
     "michal2409/Megatron-Bridge@269a192c builds KDA with its own layer spec (KimiLinearBridge: "
     "train it there)"),
    ("model.window_kv_channels", lambda m: m.window_kv_channels is not None, _GEMMA_WHY),
    ("model.attention_k_eq_v", lambda m: m.attention_k_eq_v, _GEMMA_WHY),
    ("model.post_sublayer_norms", lambda m: m.post_sublayer_norms, _GEMMA_WHY),
    ("model.moe_branch_norms", lambda m: m.moe_branch_norms, _GEMMA_WHY),
    ("model.window_num_query_groups",
     lambda m: m.window_num_query_groups not in (None, m.num_query_groups),
     "it builds every layer's attention with one num_query_groups " + _MIMO_WHY),
    ("model.full_attention_softmax_type", lambda m: m.full_attention_softmax_type is not None,
     "it builds every layer's attention with one softmax_type (megatron/core/transformer/"
     "dot_product_attention.py) " + _MIMO_WHY),
    ("model.v_head_dim", lambda m: m.attention_variant == "standard" and m.v_head_dim != m.kv_channels,
     "it builds every layer's attention with one head width, kv_channels, for q, k and v " + _MIMO_WHY),
    ("model.moe_zero_experts", lambda m: m.moe_zero_experts > 0, _LONGCAT_WHY),
    ("model.moe_shortcut", lambda m: m.moe_shortcut, _LONGCAT_WHY),
)


def _not_in_megatron(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    """Mechanisms of current models Megatron-LM dev@d48bd6be cannot train (UNTRAINABLE, and chunked
    attention beyond its chunk)."""
    m = cfg.model
    for name, applies, why in UNTRAINABLE:
        if applies(m):
            raise EmitError(name, f"{NOT_IN_MEGATRON} Megatron-LM dev cannot train this: {why}")
    chunk = m.attention_chunk_size
    if chunk is not None and cfg.training.seq_length > chunk and not all(
            not m.is_chunked_layer(layer) for layer in range(m.num_layers)):
        raise EmitError("model.attention_chunk_size", f"{NOT_IN_MEGATRON} Megatron-LM dev cannot "
                        f"train this: its attention has no chunked mode (megatron/core/transformer/"
                        f"attention.py SelfAttention), and at seq_length {cfg.training.seq_length} > "
                        f"attention_chunk_size {chunk} chunked layers differ from causal ones; train "
                        f"at seq_length <= {chunk}, where they are the same")


def _dsa(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    m = cfg.model
    if m.dsa:  # DeepSeek-V3.2
        args.add("--experimental-attention-variant", "dsa", source="model.dsa")
        args.add("--dsa-indexer-n-heads", m.index_n_heads, source="model.index_n_heads")
        args.add("--dsa-indexer-head-dim", m.index_head_dim, source="model.index_head_dim")
        args.add("--dsa-indexer-topk", m.index_topk, source="model.index_topk")
    # RoPE fusion off: the config's own switch, or resolved off where Megatron has no fused RoPE
    # (DSA, MLA with plain RoPE: planner/config/schema.py rope_fusion_refused)
    why = rope_fusion_refused(m)
    args.add_if(not cfg.training.apply_rope_fusion, "--no-rope-fusion",
                source=f"training.apply_rope_fusion false{f' ({why} has no fused RoPE)' if why else ''}")


def _gated_delta_net(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    if cfg.model.linear_attention_freq is not None:  # Qwen3-Next's gated DeltaNet layers
        args.add("--experimental-attention-variant", "gated_delta_net",
                 source="model.linear_attention_freq (gated DeltaNet layers)")


def _hash_routing(cfg: Config, args: MegatronArgs, split: StageSplit, pattern: HybridPattern | None) -> None:
    requested = cfg.model.moe_n_hash_layers
    if requested == 0:
        return
    count = megatron_hash_layer_count(cfg, split, pattern.mlp_layer_numbers if pattern else None)
    if count == 0:
        args.notes.append(f"model.moe_n_hash_layers {requested}: the first {requested} layers hold no MoE "
                          "block, so nothing is hash-routed; not passed")
        return
    blocks = planned_hash_blocks(split)
    why = (f"model.moe_n_hash_layers {requested}: MoE blocks {blocks} (the hybrid stack numbers every "
           "pattern symbol)" if pattern else "model.moe_n_hash_layers")
    args.add("--moe-n-hash-layers", count, source=why)


def rotary_fields(cfg: Config) -> tuple[str, ...]:
    """The model's rotary fields Megatron reads for its attention kind: the rope type when set, the
    base always, the YaRN scaling for MLA and DSv4 attention and its factor for standard attention
    under --position-embedding-type yarn (the config's yarn_rotary_scaling_factor, Megatron-LM
    dev@d48bd6be megatron/training/argument_utils.py _apply_yarn_config_from_args), the
    compressed-layer base for DSv4 only
    (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py MLATransformerConfig,
    TransformerConfig.csa_compress_rotary_base)."""
    m = cfg.model
    names = ["rope_type"] if m.rope_type is not None else []
    names.append("rotary_base")
    if m.attention_variant in ("mla", "dsv4_hybrid"):
        names += ["rotary_scaling_factor", "original_max_position_embeddings"]
    elif m.position_embedding_type == "yarn":  # argument_utils.py _apply_yarn_config_from_args
        names.append("rotary_scaling_factor")
    if is_dsv4(cfg):
        names.append("csa_compress_rotary_base")
    if m.rotary_percent != 1.0:  # GPTModel.__init__ passes it to RotaryEmbedding
        names.append("rotary_percent")
    return tuple(names)


def _rope(cfg: Config, args: MegatronArgs) -> None:
    """Rotary settings; the YaRN ones only where Megatron reads them (MLA and DSv4 attention, and the
    factor of standard attention's YaRN)."""
    m = cfg.model
    if m.rope_type == "yarn" and m.attention_variant == "standard":
        # Megatron-LM dev@d48bd6be megatron/training/arguments.py core_transformer_config_from_args
        raise EmitError("model.rope_type", "rope_type 'yarn' with standard attention: Megatron's "
                        "standard attention takes rope_type 'rope' only; use 'rope', drop the field, "
                        "or pick an MLA attention_variant")
    for name in rotary_fields(cfg):
        args.add("--" + name.replace("_", "-"), getattr(m, name), source=f"model.{name}")


def _multi_latent_attention(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    m = cfg.model
    if m.attention_variant in ("mla", "dsv4_hybrid"):
        args.add("--multi-latent-attention", source=f"model.attention_variant {m.attention_variant}")


def _dsv4_v_head_dim(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    # Megatron's MLA: q/k heads qk_head_dim + qk_pos_emb_head_dim wide, v heads v_head_dim
    # (Megatron-LM dev@d48bd6be megatron/core/transformer/multi_latent_attention.py); DSv4's are kv_channels.
    if is_dsv4(cfg):
        args.add("--v-head-dim", cfg.model.kv_channels, source="model.kv_channels")


def _dsv4_attention(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    if is_dsv4(cfg):
        args.add("--experimental-attention-variant", "dsv4_hybrid", source="model.attention_variant")


def _dsv4_compress_ratios(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    # One ratio per decoder and MTP layer: Megatron wants exactly one per attention symbol of the
    # pattern (Megatron-LM dev@d48bd6be megatron/training/argument_utils.py
    # _normalize_dsv4_hybrid_csa_compress_ratios); a preset's longer list is cut to the model.
    m = cfg.model
    ratios = (m.compress_ratios or [])[:m.num_layers + m.mtp_num_layers]
    args.add_if(is_dsv4(cfg) and bool(ratios), "--csa-compress-ratios", ratios,
                source="model.compress_ratios (one per decoder and MTP layer)")


def _spec(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    # A Mamba stack keeps the hybrid entry's default spec (Megatron-LM dev@d48bd6be
    # megatron/training/models/hybrid.py: hybrid_stack_spec, M/*/-/E layers)
    if is_dsv4(cfg):
        args.add("--spec", *HYBRID_DSV4_SPEC, source="hybrid DSv4 layer specs")


def _virtual_experts(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    if cfg.moe.moe_virtual_experts:
        args.notes.append("moe.moe_virtual_experts: no Megatron-LM flag yet (PR #7450, unmerged); "
                          "not passed")


def _global_batch_size(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    args.add("--global-batch-size", cfg.global_batch_size, source="training.global_batch_size")


def _sequence_packing(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    t = cfg.training
    args.add_if(t.sequence_packing_scheduler is not None, "--sequence-packing-scheduler",
                t.sequence_packing_scheduler, source="training.sequence_packing_scheduler")


def _precision(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    t = cfg.training
    args.add_if(t.precision == "bf16", "--bf16", source="training.precision")
    args.add_if(t.precision == "fp16", "--fp16", source="training.precision")
    args.add_if(t.fp8, "--fp8-format", t.fp8_format, source="training.fp8")


def _fp4(cfg: Config, args: MegatronArgs, _: _Planned) -> None:
    args.add_if(cfg.training.fp4, "--fp4-format", "e2m1", source="training.fp4")


HandWriter = Callable[[Config, MegatronArgs, _Planned], None]
# The writer of each `Hand` step of planner/config/megatron_arguments.py EMIT_ORDER.
HAND_WRITTEN: dict[str, HandWriter] = {
    "weight_shards": _weight_shards, "order": _order, "hybrid_layer_pattern": _hybrid_layer_pattern,
    "virtual_stages": _virtual_stages, "group_query_attention": _group_query_attention,
    "max_position_embeddings": _max_position_embeddings, "not_in_megatron": _not_in_megatron,
    "dsa": _dsa, "gated_delta_net": _gated_delta_net,
    "rope": lambda cfg, args, _: _rope(cfg, args),
    "multi_latent_attention": _multi_latent_attention, "dsv4_v_head_dim": _dsv4_v_head_dim,
    "dsv4_attention": _dsv4_attention, "dsv4_compress_ratios": _dsv4_compress_ratios, "spec": _spec,
    "hash_routing": lambda cfg, args, planned: _hash_routing(cfg, args, planned.split, planned.pattern),
    "virtual_experts": _virtual_experts, "global_batch_size": _global_batch_size,
    "sequence_packing": _sequence_packing, "precision": _precision, "fp4": _fp4,
}


def megatron_arguments(cfg: Config) -> MegatronArgs:
    """Every flag, in the table's order (planner/config/megatron_arguments.py emit_steps)."""
    try:
        split = stage_split(cfg)
    except SplitError as exc:
        raise EmitError(exc.path, exc.message) from None
    args = MegatronArgs(entry=HYBRID_ENTRY if is_hybrid(cfg) else GPT_ENTRY, branch=_branch(cfg),
                        env=launch_environment(cfg))
    order_flags(cfg)  # an order Megatron's command line cannot express is refused first
    planned = _Planned(split, hybrid_pattern(cfg, split) if args.entry == HYBRID_ENTRY else None)
    for step in emit_steps():
        if isinstance(step, Hand):
            HAND_WRITTEN[step.name](cfg, args, planned)
        else:
            _plain(cfg, args, step)
    args.extra = extra_arguments(cfg, args)
    return args


def extra_arguments(cfg: Config, args: MegatronArgs) -> tuple[str, ...]:
    """launch.megatron_extra_args, verbatim; a flag moeplan emits itself is refused (the plan's
    value and the passthrough's would fight, and Megatron's argparse keeps the last silently)."""
    extra = tuple(cfg.launch.megatron_extra_args)
    emitted = {f.flag: f.source for f in args.flags}
    for index, word in enumerate(extra):
        flag = word.split("=", 1)[0]
        path = f"launch.megatron_extra_args[{index}]"
        if flag in emitted:
            raise EmitError(path, f"{word!r} duplicates {flag}, which moeplan emits from "
                            f"{emitted[flag]}; set that field instead and drop it from "
                            "megatron_extra_args")
        modelled = moeplan_field(flag[2:].replace("-", "_")) if flag.startswith("--") else None
        if modelled is not None:
            raise EmitError(path, f"{word!r} is modelled by moeplan as {modelled}: passed through, "
                            "it would change the model behind the plan's back; set "
                            f"{modelled} instead")
    return _without_entry_arguments(cfg, args, extra)


def _without_entry_arguments(cfg: Config, args: MegatronArgs, extra: tuple[str, ...]) -> tuple[str, ...]:
    """The carried words less the arguments only the launch's own entry script's parser defines
    (launch.megatron_entry: Pai-Megatron-Patch's, MindSpeed-LLM's; rule ARG008): Megatron-LM's entry
    script, the one emitted, refuses them, so each is left out with a note."""
    script = cfg.launch.megatron_entry
    dropped: set[int] = set()
    for index, name, values in argument_words(extra):
        if argument_class(name) is None and entry_argument(script, name) is not None:
            width = 1 if "=" in extra[index] else 1 + len(values)
            dropped.update(range(index, index + width))
            args.notes.append(f"--{name.replace('_', '-')} left out: an argument of {script}'s own parser "
                              "(rule ARG008), which Megatron-LM's entry script refuses")
    return tuple(word for index, word in enumerate(extra) if index not in dropped)

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

from dataclasses import dataclass, field

from planner.config.hybrid_pattern import RATIO_SYMBOL, join_segments, layer_symbols, segment_text
from planner.config.megatron_branch import BranchConflict, megatron_branch
from planner.config.megatron_names import HYBRID_DSV4_SPEC, PP_DP_ORDER, moeplan_field
from planner.config.schema import DEFAULT_ORDER, VOCAB_DIVISOR, Config, OverlapSection
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
    # issue 22 (offload): validate_args asserts NVTE_CPU_OFFLOAD_V1=1 under fine-grained activation
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


def is_dsv4(cfg: Config) -> bool:
    return cfg.model.attention_variant == "dsv4_hybrid"


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
        pieces = [symbols(layer) for layer in chunk.layers]
        for layer, piece in zip(chunk.layers, pieces, strict=True):
            counted += len(piece)
            numbers[layer] = counted
        segments.append(segment_text(pieces, [symbols(model.num_layers + d) for d in chunk.mtp_layers]))
    return HybridPattern(join_segments(segments), numbers)


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


def _parallel(cfg: Config, args: MegatronArgs) -> None:
    p, t = cfg.parallel, cfg.training
    args.add("--tensor-model-parallel-size", p.tp, source="parallel.tp")
    args.add("--pipeline-model-parallel-size", p.pp, source="parallel.pp")
    args.add("--context-parallel-size", p.cp, source="parallel.cp")
    args.add("--expert-model-parallel-size", p.ep, source="parallel.ep")
    args.add("--expert-tensor-parallel-size", p.etp, source="parallel.etp")
    args.add_if(p.gtp > 1, "--tensor-parallel-num-weight-shards", p.tp * p.gtp,
                source="parallel.gtp (TP x GTP)")
    args.add_if(p.egtp > 1, "--expert-tensor-parallel-num-weight-shards", cfg.degrees.etp * p.egtp,
                source="parallel.egtp (ETP x EGTP)")
    args.add_if(order_flags(cfg), "--use-tp-pp-dp-mapping", source=f"parallel.order {p.order}")
    args.add_if(p.sequence_parallel, "--sequence-parallel", source="parallel.sequence_parallel")
    args.add_if(p.cp > 1, "--cp-comm-type", p.cp_comm_type, source="parallel.cp_comm_type")
    args.add_if(p.cp_partition_mode != "zigzag", "--cp-partition-mode", p.cp_partition_mode,
                source="parallel.cp_partition_mode")
    if p.hierarchical_context_parallel_sizes:
        args.add("--hierarchical-context-parallel-sizes", *p.hierarchical_context_parallel_sizes,
                 source="parallel.hierarchical_context_parallel_sizes")
    args.add_if(p.dynamic_context_parallel, "--dynamic-context-parallel",
                source="parallel.dynamic_context_parallel")
    args.add_if(p.hybrid_context_parallel, "--hybrid-context-parallel",
                source="parallel.hybrid_context_parallel")
    args.add_if(t.num_distributed_optimizer_instances > 1, "--num-distributed-optimizer-instances",
                t.num_distributed_optimizer_instances, source="training.num_distributed_optimizer_instances")


def _pipeline(cfg: Config, args: MegatronArgs, split: StageSplit, pattern: HybridPattern | None) -> None:
    p, m = cfg.parallel, cfg.model
    if pattern is not None:
        args.add("--hybrid-layer-pattern", pattern.text,
                 source=f"model.compress_ratios + stage split ({split.source}) + MTP")
    else:
        args.add("--num-layers", m.num_layers, source="model.num_layers")
        if p.pipeline_model_parallel_layout:  # Megatron takes commas, not spaces
            args.add("--pipeline-model-parallel-layout", "".join(p.pipeline_model_parallel_layout.split()),
                     source="parallel.pipeline_model_parallel_layout")
        elif p.num_layers_per_virtual_pipeline_stage is not None:
            args.add("--num-layers-per-virtual-pipeline-stage", p.num_layers_per_virtual_pipeline_stage,
                     source="parallel.num_layers_per_virtual_pipeline_stage")
        elif split.vpp > 1:
            args.add("--num-virtual-stages-per-pipeline-rank", split.vpp, source="parallel.vpp")
        args.add_if(p.decoder_first_pipeline_num_layers is not None, "--decoder-first-pipeline-num-layers",
                    p.decoder_first_pipeline_num_layers, source="parallel.decoder_first_pipeline_num_layers")
        args.add_if(p.decoder_last_pipeline_num_layers is not None, "--decoder-last-pipeline-num-layers",
                    p.decoder_last_pipeline_num_layers, source="parallel.decoder_last_pipeline_num_layers")
        args.add_if(p.account_for_embedding_in_pipeline_split, "--account-for-embedding-in-pipeline-split",
                    source="parallel.account_for_embedding_in_pipeline_split")
        args.add_if(p.account_for_loss_in_pipeline_split, "--account-for-loss-in-pipeline-split",
                    source="parallel.account_for_loss_in_pipeline_split")
    args.add_if(p.microbatch_group_size_per_vp_stage is not None,
                "--microbatch-group-size-per-virtual-pipeline-stage", p.microbatch_group_size_per_vp_stage,
                source="parallel.microbatch_group_size_per_vp_stage")


def _model(cfg: Config, args: MegatronArgs) -> None:
    m = cfg.model
    args.add("--hidden-size", m.hidden_size, source="model.hidden_size")
    args.add("--ffn-hidden-size", m.ffn_hidden_size, source="model.ffn_hidden_size")
    args.add("--num-attention-heads", m.num_attention_heads, source="model.num_attention_heads")
    args.add("--kv-channels", m.kv_channels, source="model.kv_channels")
    if m.attention_variant == "standard" and m.group_query_attention:
        args.add("--group-query-attention", source="model.group_query_attention / num_query_groups")
        args.add("--num-query-groups", m.num_query_groups, source="model.num_query_groups")
    args.add("--vocab-size", m.vocab_size, source="model.vocab_size")
    args.add_if(m.make_vocab_size_divisible_by != VOCAB_DIVISOR, "--make-vocab-size-divisible-by",
                m.make_vocab_size_divisible_by, source="model.make_vocab_size_divisible_by")
    if m.max_position_embeddings is not None:
        args.add("--max-position-embeddings", m.max_position_embeddings,
                 source="model.max_position_embeddings")
    else:  # Megatron requires it and needs it >= seq_length (arguments.py validate_args)
        args.add("--max-position-embeddings", cfg.training.seq_length,
                 source="training.seq_length (model.max_position_embeddings unset)")
    args.add("--position-embedding-type", m.position_embedding_type, source="model.position_embedding_type")
    args.add("--hidden-dropout", m.hidden_dropout, source="model.hidden_dropout")
    args.add("--attention-dropout", m.attention_dropout, source="model.attention_dropout")
    args.add_if(m.qk_layernorm, "--qk-layernorm", source="model.qk_layernorm")
    args.add_if(m.swiglu, "--swiglu", source="model.swiglu")
    args.add("--normalization", m.normalization, source="model.normalization")
    args.add("--norm-epsilon", m.norm_epsilon, source="model.norm_epsilon")
    args.add_if(not m.add_bias_linear, "--disable-bias-linear", source="model.add_bias_linear false")
    args.add_if(m.untie_embeddings_and_output_weights, "--untie-embeddings-and-output-weights",
                source="model.untie_embeddings_and_output_weights")
    args.add_if(m.swiglu_limit is not None, "--activation-func-clamp-value", m.swiglu_limit,
                source="model.swiglu_limit")
    _current_architectures(cfg, args)
    _rope(cfg, args)
    if m.attention_variant in ("mla", "dsv4_hybrid"):
        args.add("--multi-latent-attention", source=f"model.attention_variant {m.attention_variant}")
        args.add_if(m.q_lora_rank is not None, "--q-lora-rank", m.q_lora_rank, source="model.q_lora_rank")
        args.add("--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim, source="model.qk_pos_emb_head_dim")
    if is_dsv4(cfg):
        args.add("--v-head-dim", m.kv_channels, source="model.kv_channels")
    if m.attention_variant == "mla":
        # Megatron's MLA: q/k heads qk_head_dim + qk_pos_emb_head_dim wide, v heads v_head_dim
        # (Megatron-LM dev@d48bd6be megatron/core/transformer/multi_latent_attention.py).
        args.add("--kv-lora-rank", m.kv_lora_rank, source="model.kv_lora_rank")
        args.add("--qk-head-dim", m.qk_head_dim, source="model.qk_head_dim")
        args.add("--v-head-dim", m.v_head_dim, source="model.v_head_dim")
    if is_dsv4(cfg):
        args.add("--experimental-attention-variant", "dsv4_hybrid", source="model.attention_variant")
        args.add_if(m.o_groups is not None, "--o-groups", m.o_groups, source="model.o_groups")
        args.add_if(m.o_lora_rank is not None, "--o-lora-rank", m.o_lora_rank, source="model.o_lora_rank")
        args.add_if(m.csa_window_size is not None, "--csa-window-size", m.csa_window_size,
                    source="model.csa_window_size")
        # One ratio per decoder and MTP layer: Megatron wants exactly one per attention symbol of the
        # pattern (Megatron-LM dev@d48bd6be megatron/training/argument_utils.py
        # _normalize_dsv4_hybrid_csa_compress_ratios); a preset's longer list is cut to the model.
        ratios = (m.compress_ratios or [])[:m.num_layers + m.mtp_num_layers]
        args.add_if(bool(ratios), "--csa-compress-ratios", ratios,
                    source="model.compress_ratios (one per decoder and MTP layer)")
        args.add_if(m.index_n_heads is not None, "--dsa-indexer-n-heads", m.index_n_heads,
                    source="model.index_n_heads")
        args.add_if(m.index_head_dim is not None, "--dsa-indexer-head-dim", m.index_head_dim,
                    source="model.index_head_dim")
        args.add_if(m.index_topk is not None, "--dsa-indexer-topk", m.index_topk, source="model.index_topk")
    if m.enable_hyper_connections:
        args.add("--enable-hyper-connections", source="model.enable_hyper_connections")
        args.add("--num-residual-streams", m.num_residual_streams, source="model.num_residual_streams")
        args.add("--mhc-sinkhorn-iterations", m.mhc_sinkhorn_iterations,
                 source="model.mhc_sinkhorn_iterations")
    args.add_if(m.mtp_num_layers > 0, "--mtp-num-layers", m.mtp_num_layers, source="model.mtp_num_layers")
    args.add_if(m.mtp_num_layers > 0, "--mtp-loss-scaling-factor", m.mtp_loss_scaling_factor,
                source="model.mtp_loss_scaling_factor")
    if args.entry == HYBRID_ENTRY:
        args.add("--spec", *HYBRID_DSV4_SPEC, source="hybrid DSv4 layer specs")


def _current_architectures(cfg: Config, args: MegatronArgs) -> None:
    """gpt-oss / GLM-4.5 / MiniMax-M2 mechanisms, each a Megatron-LM dev@d48bd6be TransformerConfig
    field with its own flag (megatron/core/transformer/transformer_config.py); --window-size is
    parsed as "left,right" (megatron/training/arguments.py tuple_type)."""
    m = cfg.model
    if m.qk_layernorm_per_layer:
        raise EmitError("model.qk_layernorm_per_layer", f"{NOT_IN_MEGATRON} Megatron-LM dev cannot "
                        "train this: its qk_layernorm normalises each head (megatron/core/transformer/"
                        "attention.py SelfAttention.__init__: q_layernorm over "
                        "hidden_size_per_attention_head), none normalises all heads of a layer at once "
                        "(MiniMax-M2); set it false to train per-head q/k norms instead")
    chunk = m.attention_chunk_size
    if chunk is not None and cfg.training.seq_length > chunk and not all(
            not m.is_chunked_layer(layer) for layer in range(m.num_layers)):
        raise EmitError("model.attention_chunk_size", f"{NOT_IN_MEGATRON} Megatron-LM dev cannot "
                        f"train this: its attention has no chunked mode (megatron/core/transformer/"
                        f"attention.py SelfAttention), and at seq_length {cfg.training.seq_length} > "
                        f"attention_chunk_size {chunk} chunked layers differ from causal ones; train "
                        f"at seq_length <= {chunk}, where they are the same")
    args.add_if(m.quick_geglu, "--quick-geglu", source="model.quick_geglu")
    args.add_if(m.glu_linear_offset != 0, "--glu-linear-offset", m.glu_linear_offset,
                source="model.glu_linear_offset")
    args.add_if(m.softmax_type != "vanilla", "--softmax-type", m.softmax_type, source="model.softmax_type")
    if m.window_size is not None:
        args.add("--window-size", ",".join(str(n) for n in m.window_size), source="model.window_size")
        args.add_if(m.window_attn_skip_freq is not None, "--window-attn-skip-freq",
                    m.window_attn_skip_freq, source="model.window_attn_skip_freq")
    args.add_if(m.add_qkv_bias, "--add-qkv-bias", source="model.add_qkv_bias")
    args.add_if(m.no_rope_freq is not None, "--no-rope-freq", m.no_rope_freq, source="model.no_rope_freq")
    args.add_if(m.qk_l2_norm, "--qk-l2-norm", source="model.qk_l2_norm")
    args.add_if(m.attention_output_gate, "--attention-output-gate", source="model.attention_output_gate")
    if m.dsa:  # DeepSeek-V3.2 (megatron/core/transformer/transformer_config.py: DSA refuses RoPE fusion)
        args.add("--experimental-attention-variant", "dsa", source="model.dsa")
        args.add("--dsa-indexer-n-heads", m.index_n_heads, source="model.index_n_heads")
        args.add("--dsa-indexer-head-dim", m.index_head_dim, source="model.index_head_dim")
        args.add("--dsa-indexer-topk", m.index_topk, source="model.index_topk")
        args.add("--no-rope-fusion", source="model.dsa (DSAttention has no fused RoPE)")
    if m.linear_attention_freq is not None:  # Qwen3-Next's gated DeltaNet layers
        args.add("--experimental-attention-variant", "gated_delta_net",
                 source="model.linear_attention_freq (gated DeltaNet layers)")
        args.add("--linear-attention-freq", m.linear_attention_freq, source="model.linear_attention_freq")
        for name in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                     "linear_num_key_heads", "linear_num_value_heads"):
            args.add("--" + name.replace("_", "-"), getattr(m, name), source=f"model.{name}")


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
    base always, the YaRN scaling for MLA and DSv4 attention, the compressed-layer base for DSv4 only
    (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py MLATransformerConfig,
    TransformerConfig.csa_compress_rotary_base)."""
    m = cfg.model
    names = ["rope_type"] if m.rope_type is not None else []
    names.append("rotary_base")
    if m.attention_variant in ("mla", "dsv4_hybrid"):
        names += ["rotary_scaling_factor", "original_max_position_embeddings"]
    if is_dsv4(cfg):
        names.append("csa_compress_rotary_base")
    if m.rotary_percent != 1.0:  # GPTModel.__init__ passes it to RotaryEmbedding
        names.append("rotary_percent")
    return tuple(names)


def _rope(cfg: Config, args: MegatronArgs) -> None:
    """Rotary settings; the YaRN ones only where Megatron reads them (MLA and DSv4 attention)."""
    m = cfg.model
    if m.rope_type == "yarn" and m.attention_variant == "standard":
        # Megatron-LM dev@d48bd6be megatron/training/arguments.py core_transformer_config_from_args
        raise EmitError("model.rope_type", "rope_type 'yarn' with standard attention: Megatron's "
                        "standard attention takes rope_type 'rope' only; use 'rope', drop the field, "
                        "or pick an MLA attention_variant")
    for name in rotary_fields(cfg):
        args.add("--" + name.replace("_", "-"), getattr(m, name), source=f"model.{name}")


def _moe(cfg: Config, args: MegatronArgs, split: StageSplit, pattern: HybridPattern | None) -> None:
    m, moe = cfg.model, cfg.moe
    args.add("--num-experts", m.num_experts, source="model.num_experts")
    if args.entry == GPT_ENTRY:
        args.add("--moe-layer-freq", m.moe_layer_freq, source="model.moe_layer_freq")
    args.add("--moe-ffn-hidden-size", m.moe_ffn_hidden_size, source="model.moe_ffn_hidden_size")
    args.add_if(bool(m.moe_shared_expert_intermediate_size), "--moe-shared-expert-intermediate-size",
                m.moe_shared_expert_intermediate_size, source="model.moe_shared_expert_intermediate_size")
    args.add_if(m.moe_shared_expert_gate, "--moe-shared-expert-gate", source="model.moe_shared_expert_gate")
    args.add("--moe-router-topk", m.moe_router_topk, source="model.moe_router_topk")
    args.add_if(m.moe_router_dtype is not None, "--moe-router-dtype", m.moe_router_dtype,
                source="model.moe_router_dtype")
    args.add("--moe-router-score-function", m.moe_router_score_function,
             source="model.moe_router_score_function")
    args.add_if(m.moe_router_topk_scaling_factor is not None, "--moe-router-topk-scaling-factor",
                m.moe_router_topk_scaling_factor, source="model.moe_router_topk_scaling_factor")
    args.add_if(m.moe_router_pre_softmax, "--moe-router-pre-softmax", source="model.moe_router_pre_softmax")
    if m.moe_router_enable_expert_bias:
        args.add("--moe-router-enable-expert-bias", source="model.moe_router_enable_expert_bias")
        args.add("--moe-router-bias-update-rate", m.moe_router_bias_update_rate,
                 source="model.moe_router_bias_update_rate")
    args.add_if(m.moe_router_num_groups is not None, "--moe-router-num-groups", m.moe_router_num_groups,
                source="model.moe_router_num_groups")
    args.add_if(m.moe_router_group_topk is not None, "--moe-router-group-topk", m.moe_router_group_topk,
                source="model.moe_router_group_topk")
    _hash_routing(cfg, args, split, pattern)
    args.add("--moe-router-load-balancing-type", moe.moe_router_load_balancing_type,
             source="moe.moe_router_load_balancing_type")
    args.add("--moe-aux-loss-coeff", moe.moe_aux_loss_coeff, source="moe.moe_aux_loss_coeff")
    args.add_if(moe.moe_router_force_load_balancing, "--moe-router-force-load-balancing",
                source="moe.moe_router_force_load_balancing")
    args.add("--moe-token-dispatcher-type", moe.moe_token_dispatcher_type,
             source="moe.moe_token_dispatcher_type")
    args.add_if(moe.moe_token_dispatcher_type == "flex", "--moe-flex-dispatcher-backend",
                moe.moe_flex_dispatcher_backend, source="moe.moe_flex_dispatcher_backend")
    if moe.moe_expert_capacity_factor is not None:
        args.add("--moe-expert-capacity-factor", moe.moe_expert_capacity_factor,
                 source="moe.moe_expert_capacity_factor")
        args.add("--moe-token-drop-policy", moe.moe_token_drop_policy, source="moe.moe_token_drop_policy")
    args.add_if(moe.moe_pad_expert_input_to_capacity, "--moe-pad-expert-input-to-capacity",
                source="moe.moe_pad_expert_input_to_capacity")
    args.add_if(moe.moe_expert_rank_capacity_factor is not None, "--moe-expert-rank-capacity-factor",
                moe.moe_expert_rank_capacity_factor, source="moe.moe_expert_rank_capacity_factor")
    args.add_if(moe.moe_ncclep_zero_copy, "--moe-ncclep-zero-copy",  # main only (issue 25)
                source="moe.moe_ncclep_zero_copy")
    args.add_if(moe.moe_latent_size is not None, "--moe-latent-size", moe.moe_latent_size,
                source="moe.moe_latent_size")
    args.add_if(moe.moe_apply_probs_on_input, "--moe-apply-probs-on-input",
                source="moe.moe_apply_probs_on_input")
    args.add_if(moe.moe_grouped_gemm, "--moe-grouped-gemm", source="moe.moe_grouped_gemm")
    args.add_if(moe.moe_permute_fusion, "--moe-permute-fusion", source="moe.moe_permute_fusion")
    if moe.moe_virtual_experts:
        args.notes.append("moe.moe_virtual_experts: no Megatron-LM flag yet (PR #7450, unmerged); "
                          "not passed")


def _training(cfg: Config, args: MegatronArgs) -> None:
    t = cfg.training
    args.add("--seq-length", t.seq_length, source="training.seq_length")
    args.add("--micro-batch-size", t.micro_batch_size, source="training.micro_batch_size")
    args.add("--global-batch-size", cfg.global_batch_size, source="training.global_batch_size")
    args.add_if(t.sequence_packing_scheduler is not None, "--sequence-packing-scheduler",
                t.sequence_packing_scheduler, source="training.sequence_packing_scheduler")
    args.add_if(t.variable_seq_lengths, "--variable-seq-lengths", source="training.variable_seq_lengths")
    args.add_if(t.precision == "bf16", "--bf16", source="training.precision")
    args.add_if(t.precision == "fp16", "--fp16", source="training.precision")
    args.add_if(t.fp8, "--fp8-format", t.fp8_format, source="training.fp8")
    args.add_if(t.fp8_recipe is not None, "--fp8-recipe", t.fp8_recipe, source="training.fp8_recipe")
    args.add_if(t.fp8_param_gather, "--fp8-param-gather", source="training.fp8_param_gather")
    args.add_if(t.fp4, "--fp4-format", "e2m1", source="training.fp4")
    args.add("--optimizer", t.optimizer, source="training.optimizer")
    args.add("--lr", t.lr, source="training.lr")
    if t.optimizer == "adam":
        args.add("--adam-beta1", t.adam_beta1, source="training.adam_beta1")
        args.add("--adam-beta2", t.adam_beta2, source="training.adam_beta2")
        args.add("--adam-eps", t.adam_eps, source="training.adam_eps")
    args.add("--weight-decay", t.weight_decay, source="training.weight_decay")
    args.add("--seed", t.seed, source="training.seed")
    args.add_if(t.use_distributed_optimizer, "--use-distributed-optimizer",
                source="training.use_distributed_optimizer")
    args.add_if(t.calculate_per_token_loss, "--calculate-per-token-loss",
                source="training.calculate_per_token_loss")
    args.add_if(t.average_in_collective, "--ddp-average-in-collective",
                source="training.average_in_collective")
    args.add("--ckpt-format", t.ckpt_format, source="training.ckpt_format")
    args.add_if(t.use_megatron_fsdp, "--use-megatron-fsdp", source="training.use_megatron_fsdp")
    args.add_if(t.use_megatron_fsdp, "--data-parallel-sharding-strategy",
                t.data_parallel_sharding_strategy, source="training.data_parallel_sharding_strategy")
    args.add_if(t.use_torch_fsdp2, "--use-torch-fsdp2", source="training.use_torch_fsdp2")


def _overlap(cfg: Config, args: MegatronArgs) -> None:
    o = cfg.overlap
    args.add_if(o.overlap_grad_reduce, "--overlap-grad-reduce", source="overlap.overlap_grad_reduce")
    args.add_if(o.overlap_param_gather, "--overlap-param-gather", source="overlap.overlap_param_gather")
    args.add_if(o.overlap_moe_expert_parallel_comm, "--overlap-moe-expert-parallel-comm",
                source="overlap.overlap_moe_expert_parallel_comm")
    args.add_if(o.moe_shared_expert_overlap, "--moe-shared-expert-overlap",
                source="overlap.moe_shared_expert_overlap")
    args.add_if(o.delay_wgrad_compute, "--delay-wgrad-compute", source="overlap.delay_wgrad_compute")
    args.add_if(o.recompute_granularity is not None, "--recompute-granularity", o.recompute_granularity,
                source="overlap.recompute_granularity")
    args.add_if(o.recompute_method is not None, "--recompute-method", o.recompute_method,
                source="overlap.recompute_method")
    args.add_if(o.recompute_num_layers is not None, "--recompute-num-layers", o.recompute_num_layers,
                source="overlap.recompute_num_layers")
    if o.recompute_modules:
        args.add("--recompute-modules", *o.recompute_modules, source="overlap.recompute_modules")
    args.add_if(o.cuda_graph_impl != "none", "--cuda-graph-impl", o.cuda_graph_impl,
                source="overlap.cuda_graph_impl")
    if o.cuda_graph_scope:
        args.add("--cuda-graph-scope", *o.cuda_graph_scope, source="overlap.cuda_graph_scope")
    # step-time model (issue 23): TP communication overlap, priced on the time page.
    args.add_if(o.tp_comm_overlap, "--tp-comm-overlap", source="overlap.tp_comm_overlap")
    _activation_offload_arguments(args, o)


def megatron_arguments(cfg: Config) -> MegatronArgs:
    """Every flag, in a stable order (parallel, pipeline, model, MoE, training, overlap)."""
    try:
        split = stage_split(cfg)
    except SplitError as exc:
        raise EmitError(exc.path, exc.message) from None
    args = MegatronArgs(entry=HYBRID_ENTRY if is_dsv4(cfg) else GPT_ENTRY, branch=_branch(cfg),
                        env=launch_environment(cfg))
    _parallel(cfg, args)
    pattern = hybrid_pattern(cfg, split) if args.entry == HYBRID_ENTRY else None
    _pipeline(cfg, args, split, pattern)
    _model(cfg, args)
    _moe(cfg, args, split, pattern)
    _training(cfg, args)
    _overlap(cfg, args)
    _launch_script_fields(cfg, args)
    args.extra = extra_arguments(cfg, args)
    return args


def _launch_script_fields(cfg: Config, args: MegatronArgs) -> None:
    """The fields real launch scripts set (issue 22): a given padded vocabulary, the
    precision-aware optimizer's dtypes, the gradient-buffer dtype and optimizer CPU offload; each
    written only when it differs from Megatron's default."""
    m, t = cfg.model, cfg.training
    args.add_if(m.padded_vocab_size is not None, "--padded-vocab-size", m.padded_vocab_size,
                source="model.padded_vocab_size")
    args.add_if(t.use_precision_aware_optimizer, "--use-precision-aware-optimizer",
                source="training.use_precision_aware_optimizer")
    for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        value = getattr(t, name)
        args.add_if(value != "fp32", "--" + name.replace("_", "-"), value, source=f"training.{name}")
    args.add_if(t.accumulate_allreduce_grads_in_fp32, "--accumulate-allreduce-grads-in-fp32",
                source="training.accumulate_allreduce_grads_in_fp32")
    args.add_if(t.grad_reduce_in_bf16, "--grad-reduce-in-bf16", source="training.grad_reduce_in_bf16")
    args.add_if(t.optimizer_cpu_offload, "--optimizer-cpu-offload", source="training.optimizer_cpu_offload")
    args.add_if(t.optimizer_cpu_offload and t.optimizer_offload_fraction != 1.0,
                "--optimizer-offload-fraction", t.optimizer_offload_fraction,
                source="training.optimizer_offload_fraction")


def _activation_offload_arguments(args: MegatronArgs, o: OverlapSection) -> None:
    """Fine-grained activation offloading (issue 22), each setting written only when it differs
    from Megatron's default (TransformerConfig's fields of the same names)."""
    if not o.fine_grained_activation_offloading:
        return
    args.add("--fine-grained-activation-offloading", source="overlap.fine_grained_activation_offloading")
    args.add("--offload-modules", *o.offload_modules, source="overlap.offload_modules")
    defaults = OverlapSection()
    for name in ("min_offloaded_tensor_size", "delta_offload_bytes_across_pp_ranks",
                 "activation_offload_fraction", "fine_grained_offloading_max_inflight_offloads"):
        value = getattr(o, name)
        args.add_if(value != getattr(defaults, name), "--" + name.replace("_", "-"), value,
                    source=f"overlap.{name}")


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
    return extra

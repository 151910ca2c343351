"""Megatron-LM's arguments as moeplan models them: one table that `moeplan import megatron` reads
arguments through (planner/config/importers/megatron_args.py) and `emit megatron` writes them from
(planner/emit/megatron.py).

Every schema field of a Megatron section whose name (or AliasChoices alias) is a Megatron argument
name maps to `--the-name`; `EXPLICIT` covers the arguments moeplan spells differently, `SPECIAL`
the ones that set several fields or depend on another. `EMIT_ORDER` is the order the emitter
writes them in, with each plain argument's condition; a plain field it does not list is written
after it whenever it differs from Megatron's default, so a new plain argument needs no emitter
edit. Names and defaults follow Megatron-LM dev@d48bd6be megatron/training/arguments.py
add_megatron_arguments and megatron/core/transformer/transformer_config.py TransformerConfig.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from planner.config.schema import Config

# Sections whose fields are Megatron arguments; cluster and launch describe the machine and the job.
MEGATRON_SECTIONS = ("model", "parallel", "training", "moe", "overlap")
# Schema fields that are not Megatron arguments of their own name (moeplan's own settings, or fields
# the table below reads from other arguments).
NOT_ARGUMENTS = {
    "model.preset", "model.attention_variant", "parallel.world_size", "parallel.order",
    "parallel.embedding_ranks_rule", "parallel.gtp", "parallel.egtp", "training.precision",
    "training.fp8", "training.fp4", "training.qkv_format", "moe.moe_virtual_experts",
    "moe.moe_tid2eid_source",
    "model.qk_layernorm_per_layer",  # MiniMax-M2's per-layer q/k norm: no Megatron argument
    "model.moe_zero_experts",  # LongCat-Flash's identity experts: no Megatron argument
    "model.moe_shortcut",  # LongCat-Flash's shortcut MoE: no Megatron argument
    "model.attention_chunk_size",  # Llama 4's chunked attention: no Megatron argument
    "model.window_num_attention_heads",  # window layers' own head count: no Megatron argument
    "model.window_num_query_groups",  # window layers' own KV groups: no Megatron argument
    "model.full_attention_softmax_type",  # sinks on window layers only: no Megatron argument
    "model.window_kv_channels",  # window layers' own head width: no Megatron argument
    "model.index_sparse_layers",  # MiniMax-M3's block-sparse layers: no Megatron argument
    "model.index_block_size",  # their key blocks: no Megatron argument
    "model.index_topk_blocks",  # the blocks each query reads: no Megatron argument
    "model.attention_k_eq_v",  # full layers' V is their K: no Megatron argument
    "model.post_sublayer_norms",  # norms on the sub-layer outputs: no Megatron argument
    "model.moe_branch_norms",  # an MoE layer's own branch norms and router scales: none either
    "model.dsa",  # written as --experimental-attention-variant dsa
    "model.mamba_layers",  # the M layers of --hybrid-layer-pattern
    "model.mixer_only_layers",  # the mixers of --hybrid-layer-pattern with no MLP symbol after them
    "model.hybrid_layer_pattern",  # read into the block fields; the emitter writes it from them
    # Kimi-Linear's KDA layers: Megatron-LM has no KDA layer (emit refuses them, EMT010)
    "model.kda_layers", "model.kda_num_heads", "model.kda_head_dim",
}
# THD packing's packed lengths and their basis, and the pipeline schedule, are moeplan's own settings.
NOT_ARGUMENTS |= {"training.packed_lengths", "training.packed_length_basis",
                  "overlap.pipeline_schedule"}
# What trains (frozen groups, LoRA adapters) is Megatron-Bridge's PEFT and freeze options, not a
# Megatron-LM argument.
NOT_ARGUMENTS |= {"training.freeze", "training.lora", "training.rl_colocation",
                  "training.frozen_tower_params", "training.trained_tower_params"}
Kind = Literal["flag", "int", "float", "str", "ints", "strs", "moe_freq", "bracket_ints", "int_tuple",
               "special"]

# Arguments whose moeplan field has another name or kind than the schema's name and type give.
EXPLICIT: dict[str, tuple[str, Kind]] = {
    "--activation-func-clamp-value": ("model.swiglu_limit", "float"),
    "--disable-bias-linear": ("model.add_bias_linear", "flag"),
    # store_false, dest gradient_accumulation_fusion (megatron/training/arguments.py)
    "--no-gradient-accumulation-fusion": ("training.gradient_accumulation_fusion", "flag"),
    # store_false, dest overlap_p2p_comm (megatron/training/arguments.py)
    "--no-overlap-p2p-communication": ("overlap.overlap_p2p_comm", "flag"),
    # store_false, dest apply_rope_fusion (megatron/training/arguments.py)
    "--no-rope-fusion": ("training.apply_rope_fusion", "flag"),
    "--dsa-indexer-n-heads": ("model.index_n_heads", "int"),
    "--dsa-indexer-head-dim": ("model.index_head_dim", "int"),
    "--dsa-indexer-topk": ("model.index_topk", "int"),
    "--csa-compress-ratios": ("model.compress_ratios", "bracket_ints"),
    "--moe-layer-freq": ("model.moe_layer_freq", "moe_freq"),
    # The per-layer capture regions: --cuda-graph-modules is Megatron dev's name, --cuda-graph-scope
    # its deprecated spelling, still parsed into the same list (megatron/training/arguments.py
    # _normalize_cuda_graph_modules_args); the emitter writes dev's name.
    "--cuda-graph-modules": ("overlap.cuda_graph_scope", "strs"),
    "--cuda-graph-scope": ("overlap.cuda_graph_scope", "strs"),
    # An int or a list expression, parsed as --moe-layer-freq is (megatron/training/arguments.py
    # moe_freq_type, no_rope_freq_type, la_freq_type); the window is "left,right" (tuple_type).
    "--window-attn-skip-freq": ("model.window_attn_skip_freq", "moe_freq"),
    "--no-rope-freq": ("model.no_rope_freq", "moe_freq"),
    "--linear-attention-freq": ("model.linear_attention_freq", "moe_freq"),
    "--window-size": ("model.window_size", "int_tuple"),
    "--microbatch-group-size-per-virtual-pipeline-stage": (
        "parallel.microbatch_group_size_per_vp_stage", "int"),
    "--multi-latent-attention": ("model.multi_latent_attention", "flag"),
    "--qk-head-dim": ("model.qk_head_dim", "int"),
    "--v-head-dim": ("model.v_head_dim", "int"),
    "--group-query-attention": ("model.group_query_attention", "flag"),
    "--normalization": ("model.normalization", "str"),
    "--swiglu": ("model.swiglu", "flag"),
    "--make-vocab-size-divisible-by": ("model.make_vocab_size_divisible_by", "int"),
    "--moe-router-dtype": ("model.moe_router_dtype", "str"),
    "--moe-shared-expert-gate": ("model.moe_shared_expert_gate", "flag"),
    "--moe-router-load-balancing-type": ("moe.moe_router_load_balancing_type", "str"),  # nargs='+'
    "--moe-aux-loss-coeff": ("moe.moe_aux_loss_coeff", "float"),  # nargs='+'
}
# Read by the importer's `_apply_special` (one argument, several fields, or a value that depends on
# another one); the emitter writes them by hand (`Hand` steps below).
SPECIAL = {
    "--bf16", "--fp16", "--fp8-format", "--fp4-format", "--use-tp-pp-dp-mapping",
    "--tensor-parallel-num-weight-shards", "--expert-tensor-parallel-num-weight-shards",
    "--experimental-attention-variant", "--hybrid-layer-pattern", "--spec", "--moe-n-hash-layers",
    "--sequence-packing-scheduler",
    "--use-rotary-position-embeddings", "--recompute-activations",  # LEGACY_SPELLINGS below
    "--no-position-embedding", "--linear-attention-type", "--moe-enable-deepep",
    "--enable-cuda-graph", "--external-cuda-graph",
}
# Megatron's older spellings of a field, resolved as validate_args resolves them (Megatron-LM
# dev@d48bd6be megatron/training/arguments.py validate_args: "Legacy RoPE arguments" sets
# position_embedding_type rope; recompute_activations sets recompute_granularity selective; the
# deprecated CUDA-graph switches set cuda_graph_impl local / transformer_engine).
LEGACY_SPELLINGS: dict[str, tuple[str, str]] = {
    "--use-rotary-position-embeddings": ("model.position_embedding_type", "rope"),
    "--recompute-activations": ("overlap.recompute_granularity", "selective"),
    "--enable-cuda-graph": ("overlap.cuda_graph_impl", "local"),
    "--external-cuda-graph": ("overlap.cuda_graph_impl", "transformer_engine"),
}
# Megatron's defaults where moeplan's differ: an absent argument means these values
# (Megatron-LM dev@d48bd6be megatron/training/arguments.py and
# megatron/core/transformer/transformer_config.py TransformerConfig / MLATransformerConfig).
MEGATRON_DEFAULTS: dict[str, Any] = {
    "model.position_embedding_type": "learned_absolute",
    "model.norm_epsilon": 1e-5,
    "model.add_bias_linear": True,
    "training.precision": "fp32",
    "training.weight_decay": 0.01,
    "training.adam_beta2": 0.999,
    "moe.moe_grouped_gemm": False,
    "moe.moe_token_dispatcher_type": "allgather",
    "model.normalization": "LayerNorm",
    "model.swiglu": False,
}
MLA_DEFAULTS: dict[str, Any] = {  # _add_mla_args; only where MLA attention reads them
    "model.qk_pos_emb_head_dim": 64,
    "model.kv_lora_rank": 32,
    "model.qk_head_dim": 128,
    "model.v_head_dim": 128,
}


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
        return annotation
    return annotation


def _kind(annotation: Any) -> Kind | None:
    base = _unwrap(annotation)
    origin = typing.get_origin(base)
    if base is bool:
        return "flag"
    if base is int:
        return "int"
    if base is float:
        return "float"
    if base is str:
        return "str"
    if origin is Literal:
        return "int" if all(isinstance(v, int) for v in typing.get_args(base)) else "str"
    if origin is list:
        [item] = typing.get_args(base)
        return "ints" if _kind(item) == "int" else "strs" if _kind(item) == "str" else None
    return None


def section_model(section: str) -> type[BaseModel] | None:
    info = Config.model_fields.get(section)
    model = info.annotation if info else None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


@functools.cache
def argument_table() -> Mapping[str, tuple[str, Kind]]:
    """Megatron flag → (section.field, kind), from the schema's names and aliases plus EXPLICIT.
    Built once and read-only: the emitter looks up every plain step in it, and walking the schema's
    annotations per lookup made one `emit megatron` spend most of its time here."""
    table: dict[str, tuple[str, Kind]] = {}
    respelled = {dotted for dotted, _ in EXPLICIT.values()}  # reachable only by Megatron's spelling
    for section in MEGATRON_SECTIONS:
        model = section_model(section)
        assert model is not None
        for name, info in model.model_fields.items():
            dotted = f"{section}.{name}"
            kind = _kind(info.annotation)
            if dotted in NOT_ARGUMENTS or dotted in respelled or kind is None:
                continue
            names = [name]
            alias = info.validation_alias
            if alias is not None and hasattr(alias, "choices"):
                names += [str(c) for c in alias.choices]
            aliases = [n for n in names if n != name]
            for spelling in aliases or [name]:  # an alias is the Megatron spelling of a short name
                table["--" + spelling.replace("_", "-")] = (dotted, kind)
    table.update(EXPLICIT)
    return types.MappingProxyType(table)


# ---------------------------------------------------------------------------------------- emit order
@dataclass(frozen=True)
class Emit:
    """A plain argument: its table field's value, written when it differs from Megatron's default
    (or `always`), where `when` holds."""

    flag: str
    always: bool = False
    when: Callable[[Config], bool] | None = None


@dataclass(frozen=True)
class Hand:
    """A step the emitter writes by hand (`planner/emit/megatron.py` HAND_WRITTEN[name]): a
    `SPECIAL` argument, a value that needs the plan, or a refusal; `fields` are the table fields
    it writes, so no plain step writes them again."""

    name: str
    fields: tuple[str, ...] = ()


def is_dsv4(c: Config) -> bool:
    """DeepSeek-V4 attention: Megatron trains it on the hybrid entry (pretrain_hybrid.py)."""
    return c.model.attention_variant == "dsv4_hybrid"


def is_mamba_stack(c: Config) -> bool:
    """Mamba-2 layers: Megatron trains them on the hybrid entry (pretrain_hybrid.py) with its
    default Mamba stack spec."""
    return 1 in (c.model.mamba_layers or []) or 1 in (c.model.mixer_only_layers or [])


def is_hybrid(c: Config) -> bool:
    """The model goes through pretrain_hybrid.py and --hybrid-layer-pattern."""
    return is_dsv4(c) or is_mamba_stack(c)


def _mla_attention(c: Config) -> bool:  # MLA and DSv4 attention both read the MLA arguments
    return c.model.attention_variant in ("mla", "dsv4_hybrid")


def _gpt(c: Config) -> bool:  # pretrain_gpt.py: the hybrid pattern carries what these say on the hybrid entry
    return not is_hybrid(c)


def _both(*tests: Callable[[Config], bool]) -> Callable[[Config], bool]:
    return lambda c: all(t(c) for t in tests)


EMIT_ORDER: tuple[Emit | Hand, ...] = (
    # parallel sizes and rank order
    *(Emit(f, always=True) for f in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                      "--context-parallel-size", "--expert-model-parallel-size",
                                      "--expert-tensor-parallel-size")),
    Hand("weight_shards", ("parallel.gtp", "parallel.egtp")),
    Hand("order", ("parallel.order",)),
    Emit("--sequence-parallel"),
    Emit("--cp-comm-type", always=True, when=lambda c: c.parallel.cp > 1),
    Emit("--cp-partition-mode"),
    Emit("--hierarchical-context-parallel-sizes"),
    Emit("--dynamic-context-parallel"),
    Emit("--hybrid-context-parallel"),
    Emit("--num-distributed-optimizer-instances"),
    # pipeline split
    Hand("hybrid_layer_pattern"),
    Emit("--num-layers", always=True, when=_gpt),
    Hand("virtual_stages", ("parallel.pipeline_model_parallel_layout",
                            "parallel.num_layers_per_virtual_pipeline_stage", "parallel.vpp")),
    Emit("--decoder-first-pipeline-num-layers", when=_gpt),
    Emit("--decoder-last-pipeline-num-layers", when=_gpt),
    Emit("--account-for-embedding-in-pipeline-split", when=_gpt),
    Emit("--account-for-loss-in-pipeline-split", when=_gpt),
    Emit("--microbatch-group-size-per-virtual-pipeline-stage"),
    # model shape
    *(Emit(f, always=True) for f in ("--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
                                      "--kv-channels")),
    Hand("group_query_attention", ("model.group_query_attention", "model.num_query_groups")),
    Emit("--vocab-size", always=True),
    Emit("--make-vocab-size-divisible-by"),
    Hand("max_position_embeddings", ("model.max_position_embeddings",)),
    *(Emit(f, always=True) for f in ("--position-embedding-type", "--hidden-dropout",
                                      "--attention-dropout")),
    Emit("--qk-layernorm"),
    Emit("--swiglu"),
    Emit("--normalization", always=True),
    Emit("--norm-epsilon", always=True),
    Emit("--disable-bias-linear"),
    Emit("--untie-embeddings-and-output-weights"),
    Emit("--activation-func-clamp-value"),
    Hand("not_in_megatron"),
    Emit("--quick-geglu"),
    Emit("--squared-relu"),
    Emit("--glu-linear-offset"),
    Emit("--softmax-type"),
    Emit("--window-size"),
    *(Emit(f, always=True, when=is_mamba_stack) for f in (
        "--mamba-state-dim", "--mamba-head-dim", "--mamba-num-groups")),
    Emit("--mamba-num-heads", when=is_mamba_stack),
    Emit("--window-attn-skip-freq", when=lambda c: c.model.window_size is not None),
    Emit("--add-qkv-bias"),
    Emit("--no-rope-freq"),
    Emit("--qk-l2-norm"),
    Emit("--attention-output-gate"),
    Hand("dsa", ("model.dsa", "training.apply_rope_fusion")),
    Emit("--dsa-indexer-topk-freq"),
    Emit("--dsa-indexer-skip-topk-offset", when=lambda c: c.model.dsa_indexer_topk_freq > 1),
    Hand("gated_delta_net"),
    Emit("--linear-attention-freq"),
    *(Emit(f, always=True, when=lambda c: c.model.linear_attention_freq is not None)
      for f in ("--linear-conv-kernel-dim", "--linear-key-head-dim", "--linear-value-head-dim",
                "--linear-num-key-heads", "--linear-num-value-heads")),
    Hand("rope", ("model.rope_type", "model.rotary_base", "model.rotary_scaling_factor",
                  "model.original_max_position_embeddings", "model.csa_compress_rotary_base",
                  "model.rotary_percent")),
    Hand("multi_latent_attention", ("model.multi_latent_attention",)),
    Emit("--q-lora-rank", when=_mla_attention),
    Emit("--qk-pos-emb-head-dim", always=True, when=_mla_attention),
    Hand("dsv4_v_head_dim"),
    *(Emit(f, always=True, when=lambda c: c.model.attention_variant == "mla")
      for f in ("--kv-lora-rank", "--qk-head-dim", "--v-head-dim")),
    Hand("dsv4_attention"),
    *(Emit(f, when=is_dsv4) for f in ("--o-groups", "--o-lora-rank", "--csa-window-size")),
    Hand("dsv4_compress_ratios", ("model.compress_ratios",)),
    *(Emit(f, when=_both(is_dsv4, lambda c: not c.model.dsa))
      for f in ("--dsa-indexer-n-heads", "--dsa-indexer-head-dim", "--dsa-indexer-topk")),
    Emit("--enable-hyper-connections"),
    *(Emit(f, always=True, when=lambda c: c.model.enable_hyper_connections)
      for f in ("--num-residual-streams", "--mhc-sinkhorn-iterations")),
    Emit("--mtp-num-layers"),
    Emit("--mtp-loss-scaling-factor", always=True, when=lambda c: c.model.mtp_num_layers > 0),
    Hand("spec"),
    # MoE
    Emit("--num-experts", always=True),
    Emit("--moe-layer-freq", always=True, when=_gpt),
    Emit("--moe-ffn-hidden-size", always=True),
    Emit("--moe-shared-expert-intermediate-size",
         when=lambda c: bool(c.model.moe_shared_expert_intermediate_size)),
    Emit("--moe-shared-expert-gate"),
    Emit("--moe-router-topk", always=True),
    Emit("--moe-router-dtype"),
    Emit("--moe-router-score-function", always=True),
    Emit("--moe-router-topk-scaling-factor"),
    Emit("--moe-router-pre-softmax"),
    Emit("--moe-router-enable-expert-bias"),
    Emit("--moe-router-bias-update-rate", always=True, when=lambda c: c.model.moe_router_enable_expert_bias),
    Emit("--moe-router-num-groups"),
    Emit("--moe-router-group-topk"),
    Hand("hash_routing", ("model.moe_n_hash_layers",)),
    Emit("--moe-router-load-balancing-type", always=True),
    Emit("--moe-aux-loss-coeff", always=True),
    Emit("--moe-router-force-load-balancing"),
    Emit("--moe-token-dispatcher-type", always=True),
    Emit("--moe-flex-dispatcher-backend", always=True,
         when=lambda c: c.moe.moe_token_dispatcher_type == "flex"),
    Emit("--moe-expert-capacity-factor"),
    Emit("--moe-token-drop-policy", always=True, when=lambda c: c.moe.moe_expert_capacity_factor is not None),
    Emit("--moe-pad-expert-input-to-capacity"),
    Emit("--moe-expert-rank-capacity-factor"),
    Emit("--moe-ncclep-zero-copy"),  # main only
    Emit("--moe-latent-size"),
    Emit("--moe-apply-probs-on-input"),
    Emit("--moe-grouped-gemm"),
    Emit("--moe-permute-fusion"),
    Emit("--moe-router-fusion"),
    Hand("virtual_experts"),
    # training
    Emit("--seq-length", always=True),
    Emit("--micro-batch-size", always=True),
    Hand("global_batch_size", ("training.global_batch_size",)),
    Hand("sequence_packing", ("training.sequence_packing_scheduler",)),
    Emit("--variable-seq-lengths"),
    Hand("precision", ("training.fp8_format",)),
    Emit("--fp8-recipe"),
    Emit("--fp8-param-gather"),
    Hand("fp4"),
    Emit("--optimizer", always=True),
    Emit("--lr", always=True),
    *(Emit(f, always=True, when=lambda c: c.training.optimizer == "adam")
      for f in ("--adam-beta1", "--adam-beta2", "--adam-eps")),
    Emit("--weight-decay", always=True),
    Emit("--seed", always=True),
    Emit("--use-distributed-optimizer"),
    Emit("--calculate-per-token-loss"),
    Emit("--ddp-average-in-collective"),
    Emit("--ckpt-format", always=True),
    Emit("--use-megatron-fsdp"),
    Emit("--data-parallel-sharding-strategy", always=True, when=lambda c: c.training.use_megatron_fsdp),
    Emit("--use-torch-fsdp2"),
    # overlaps and recompute
    *(Emit(f) for f in ("--overlap-grad-reduce", "--overlap-param-gather",
                        "--overlap-moe-expert-parallel-comm", "--moe-shared-expert-overlap",
                        "--delay-wgrad-compute", "--recompute-granularity", "--recompute-method",
                        "--recompute-num-layers", "--recompute-modules", "--cuda-graph-impl",
                        "--cuda-graph-modules", "--tp-comm-overlap", "--fine-grained-activation-offloading")),
    Emit("--offload-modules", always=True, when=lambda c: c.overlap.fine_grained_activation_offloading),
    *(Emit(f, when=lambda c: c.overlap.fine_grained_activation_offloading)
      for f in ("--min-offloaded-tensor-size", "--delta-offload-bytes-across-pp-ranks",
                "--activation-offload-fraction", "--fine-grained-offloading-max-inflight-offloads")),
    # what real launch scripts set: a given padded vocabulary, the optimizer's dtypes and offload
    Emit("--padded-vocab-size"),
    Emit("--use-precision-aware-optimizer"),
    *(Emit(f) for f in ("--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype",
                        "--exp-avg-sq-dtype", "--accumulate-allreduce-grads-in-fp32",
                        "--grad-reduce-in-bf16", "--optimizer-cpu-offload")),
    Emit("--optimizer-offload-fraction", when=lambda c: c.training.optimizer_cpu_offload),
)


# Fields the importer reads that the emitter does not pass, and why.
NOT_EMITTED: dict[str, str] = {
    "parallel.gtp_remat_num_sequence_shards": (
        "GTP sequence shards: moeplan's model, in no Megatron-LM branch's training loop yet "
        "(planner/layout/sequence_shards.py)"),
}


def megatron_default(dotted: str) -> Any:
    """What Megatron takes for an absent argument: MEGATRON_DEFAULTS where moeplan's default
    differs, else the schema's default (the two agree everywhere else)."""
    if dotted in MEGATRON_DEFAULTS:
        return MEGATRON_DEFAULTS[dotted]
    section, name = dotted.split(".", 1)
    model = section_model(section)
    assert model is not None
    return model.model_fields[name].get_default(call_default_factory=True)


@functools.cache
def emit_steps() -> tuple[Emit | Hand, ...]:
    """EMIT_ORDER, then every table field no step writes, in table order, written when it differs
    from Megatron's default."""
    table = argument_table()
    written = {table[s.flag][0] for s in EMIT_ORDER if isinstance(s, Emit)}
    written |= {f for s in EMIT_ORDER if isinstance(s, Hand) for f in s.fields} | set(NOT_EMITTED)
    rest: dict[str, str] = {}
    for flag, (dotted, _) in table.items():
        if dotted not in written:
            rest.setdefault(dotted, flag)
    return EMIT_ORDER + tuple(Emit(flag) for flag in rest.values())

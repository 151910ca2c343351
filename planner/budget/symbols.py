"""The inputs of the budget formulas: config dimensions, per-stage facts, per-rank placement facts.

Each input is a `Symbol` with a one-line meaning; `global_values`, `Holdings` and `rank_values`
read their values from the config, the pipeline split and the grid. `Variant` holds the structural
choices (dispatcher, capacity mode, optimizer, recompute ...) that pick which formula applies.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache
from statistics import NormalDist
from typing import Any

from planner.budget.expr import Number, Symbol, exact, normalize
from planner.budget.hardware import HARDWARE_SYMBOLS, hardware_values, rope_unfused
from planner.budget.layer_kinds import (
    KIND_STAGE_SYMBOLS,
    KIND_SYMBOLS,
    kind_values,
    kinds_present,
    layer_counts,
)
from planner.budget.model_counts import MODEL_SYMBOLS, model_values
from planner.budget.optimizer_time import OPTIMIZER_SYMBOLS, optimizer_values
from planner.budget.variant import Variant
from planner.config.deepep_buffers import deepep_buffers
from planner.config.gpus import pre_hopper, takes_tn_only
from planner.config.offload_groups import offload_groups
from planner.config.schema import DSV4_CSA_RATIO, Config
from planner.layout.nodes import Places, node_of, nodes_of
from planner.layout.pipeline import Chunk, StageLayers, StageSplit, split_key, stage_layers
from planner.memo import Memo

ELEMENT_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
CSA_RATIO = DSV4_CSA_RATIO  # DeepSeek-V4: ratio 4 is CSA; the others HCA (planner/config/schema.py)

GLOBAL_SYMBOLS: tuple[Symbol, ...] = (
    Symbol("N", "world size (ranks)"),
    Symbol("TP", "tensor-parallel size"),
    Symbol("CP", "context-parallel size (configured)"),
    Symbol("PP", "pipeline-parallel size"),
    Symbol("VPP", "virtual pipeline chunks per stage"),
    Symbol("EP", "expert-parallel size"),
    Symbol("ETP", "expert tensor-parallel size"),
    Symbol("GTP", "dense GTP (weight rematerialisation) size R"),
    Symbol("EGTP", "expert GTP size R_e"),
    Symbol("q_s", "GTP sequence shards (gtp_remat_num_sequence_shards, 1 when unset)"),
    Symbol("TP_seq", "TP ranks that split the sequence (TP with sequence parallelism, else 1)"),
    Symbol("h", "hidden size"),
    Symbol("E", "routed experts per MoE layer"),
    Symbol("Z", "zero-computation (identity) experts the router also scores (moe_zero_experts)"),
    Symbol("k", "routed experts per token (top-k)"),
    Symbol("I", "routed expert intermediate size (moe_ffn_hidden_size)"),
    Symbol("I_s", "shared expert intermediate size (0 = none)"),
    Symbol("f", "dense MLP intermediate size (ffn_hidden_size)"),
    Symbol("V", "vocabulary size"),
    Symbol("V_pad", "vocabulary padded to a multiple of make_vocab_size_divisible_by (default 128) "
           "times TP, the rows of the embedding and output layers"),
    Symbol("heads", "attention heads"),
    Symbol("groups", "query groups (KV heads)"),
    Symbol("d", "head dimension (kv_channels)"),
    Symbol("q_lora", "query LoRA rank (0 = none)"),
    Symbol("kv_lora", "KV LoRA rank (MLA)"),
    Symbol("qk_rope", "rotary part of the q/k head (qk_pos_emb_head_dim)"),
    Symbol("d_qk", "MLA: the q/k head's part without RoPE (qk_head_dim, kv_channels when unset)"),
    Symbol("d_v", "MLA: the v head dimension (v_head_dim, kv_channels when unset)"),
    Symbol("o_groups", "grouped output projection groups (V4)"),
    Symbol("o_lora", "output LoRA rank (V4)"),
    Symbol("idx_heads", "lightning-indexer heads (V4 CSA)"),
    Symbol("idx_dim", "lightning-indexer head dimension (V4 CSA)"),
    Symbol("idx_topk", "compressed entries the indexer keeps per query (V4 CSA)"),
    Symbol("csa_ratio", "CSA compression ratio (4)"),
    Symbol("hca_ratio", "HCA compression ratio (largest other ratio in compress_ratios)"),
    Symbol("n_hc", "residual-stream width multiplier (mHC expansion, 1 without mHC)"),
    Symbol("S", "sequence length: seq_length, or with training.packed_lengths the max (or mean, "
           "packed_length_basis) packed tokens of a microbatch over b, rounded up"),
    Symbol("b", "micro-batch size"),
    Symbol("B", "global batch size (sequences per optimizer step)"),
    Symbol("p", "bytes per element of training.precision"),
    Symbol("cf", "expert capacity factor (0 when unset)"),
    Symbol("rcf", "NCCL EP rank capacity factor, moe_expert_rank_capacity_factor (0 when unset)"),
    Symbol("I_opt", "distributed-optimizer instances"),
    Symbol("N_r", "recompute_num_layers (1 when unset)"),
    Symbol("pad_dense", "elements the dense grad buffer's end is padded to a multiple of: lcm(its "
           "optimizer shards, 128) with the distributed optimizer, else 1"),
    Symbol("pad_expert", "the same for the expert grad buffer: lcm(expert optimizer shards, 128)"),
    Symbol("mem_gib", "GPU memory per rank in GiB (cluster.gpu_memory_gib)"),
    Symbol("reserved_ratio", "the caching allocator's reserved over allocated bytes at the peak "
           "(cluster.allocator_reserved_ratio)"),
    Symbol("context_gib", "CUDA context and loaded kernels per rank in GiB (cluster.cuda_context_gib)"),
    Symbol("nccl_channels", "channels NCCL opens per ring communicator (cluster.nccl_channels)"),
    Symbol("mem_margin", "share of GPU memory kept free of the device total (cluster.memory_margin)"),
    Symbol("tower_params", "parameters of an encoder tower on the first stage that stay frozen "
           "(training.frozen_tower_params; 0 without)"),
    Symbol("tower_trained_params", "parameters of an encoder tower on the first stage that train "
           "(training.trained_tower_params; 0 without)"),
    Symbol("lora_rank", "LoRA adapter rank (training.lora.dim; 0 without LoRA)"),
    Symbol("rl_engine_fraction", "share of GPU memory a colocated RL inference engine takes "
           "(training.rl_colocation.engine_memory_fraction; 0 without)"),
    Symbol("deepep_nvl_bytes", "DeepEP's NVLink buffer for the EP group (ETP·EP ranks): the larger "
           "of its dispatch and combine size hints (planner/config/deepep_buffers.py; 0 when DeepEP has "
           "no configuration for the group size)"),
    Symbol("deepep_rdma_bytes", "DeepEP's RDMA buffer (NVSHMEM) for an EP group wider than a node: "
           "the larger of its RDMA size hints, else 0"),
    Symbol("recv_z2", "z² of the busiest EP rank's stated quantile: z = Φ⁻¹(q^(1/EP)) for "
           "q = efficiency.routing_quantile (the quantile of the largest of EP receive counts)"),
    Symbol("h_moe", "width of the routed token rows: moe_latent_size with latent MoE (the rows "
           "are projected h → latent before dispatch and back after combine), else h"),
    Symbol("csa_window", "raw sliding window of every V4 attention layer (csa_window_size)"),
    Symbol("csa_align", "V4 CP: per-rank compressed CSA rows are padded to a multiple of "
           "32 / gcd(32, csa_ratio)"),
    Symbol("hca_align", "the same for HCA rows: 32 / gcd(32, hca_ratio)"),
    Symbol("miss_rank", "probability that a token's k distinct picks miss all E/EP experts of one "
           "EP rank: C(E − E/EP, k) / C(E, k) for picks uniform over the E experts; with "
           "group-limited routing k/g picks in each of g groups of G (symbols.miss_probability), "
           "precomputed (the formulas have no binomials)"),
    Symbol("q_align", "rows each local expert's token count is padded to a multiple of for "
           "quantised grouped GEMMs: 16 with fp8 (32 with training.fp8_recipe mxfp8), 128 with fp4, "
           "else 1 (Megatron-LM dev@d48bd6be "
           "megatron/core/transformer/moe/moe_utils.py get_align_size_for_quantization)"),
    Symbol("vex_slots", "temporary expert slots per rank and MoE layer with virtual experts "
           "(moeplan assumes one; 0 without virtual experts)"),
    # the learned position table and the optimizer's CPU offload
    Symbol("pos_rows", "rows of the learned position table (max_position_embeddings, seq_length "
           "when unset; Megatron-LM dev@d48bd6be megatron/core/models/common/embeddings/"
           "language_model_embedding.py LanguageModelEmbedding)"),
    Symbol("opt_gpu_share", "share of the optimizer states on the GPU: 1 - optimizer_offload_fraction "
           "with optimizer_cpu_offload, else 1"),
    # fine-grained activation offloading
    Symbol("min_offloaded", "overlap.min_offloaded_tensor_size: elements below which a saved tensor "
           "stays on the GPU"),
    Symbol("offload_keep_share", "1 - overlap.activation_offload_fraction (in floating point, as "
           "Megatron computes it): share of each chunk's eligible offload groups kept on the GPU"),
    Symbol("offload_delta_bytes", "overlap.delta_offload_bytes_across_pp_ranks: pipeline rank r keeps "
           "r times this many offloadable bytes on the GPU"),
    *MODEL_SYMBOLS,
    *KIND_SYMBOLS,
    *HARDWARE_SYMBOLS,
    *OPTIMIZER_SYMBOLS,
)

STAGE_SYMBOLS: tuple[Symbol, ...] = tuple(Symbol(n, doc, "stage") for n, doc in (
    ("s", "pipeline stage index"),
    ("chunks", "model chunks the counts cover: VPP for a stage, 1 for one chunk (its own block)"),
    ("blocks", "transformer blocks on the stage (decoder layers + MTP layers)"),
    ("L_moe", "MoE layers on the stage (MTP blocks included)"),
    ("L_dense", "blocks with a dense MLP instead of MoE"),
    ("L_nomlp", "hybrid models: blocks that are a mixer alone (no MLP layer, one norm)"),
    ("L_pattern", "hybrid models: Megatron's layers on the stage (one per pattern symbol: a block's "
                  "mixer and its MLP; MTP depths one each)"),
    ("L_hash", "hash-routed MoE layers on the stage (no expert bias)"),
    ("L_mtp", "MTP layers on the stage"),
    ("L_csa", "CSA attention layers on the stage (V4)"),
    ("L_hca", "HCA attention layers on the stage (V4)"),
    ("has_embedding", "1 when the stage holds the input embedding"),
    ("has_mtp_embedding", "1 when the stage holds MTP layers but not the embedding (an embedding copy)"),
    ("has_output", "1 when the stage computes the loss (final norm, logits)"),
    ("has_output_weight", "1 when the stage holds an output-layer weight (untied, or tied copy with PP > 1)"),
    ("is_first_stage", "1 on the stage holding the first pipeline chunk"),
    ("is_last_stage", "1 on the stage holding the last pipeline chunk"),
    ("embd_size", "ranks in this stage's embedding group (1 when not a member)"),
    ("embd_sync", "1 when this stage syncs embedding grads over an embedding group of >= 2 ranks"),
    ("live_passes", "forward chunk passes whose activations the stage holds at its peak (Megatron's "
                    "1F1B or interleaved order replayed, planner/layout/schedule.py)"),
    ("act_live_peak", "stored activations at that peak: each live pass holds its own chunk's "
                      "act_per_microbatch (see the act_chunk.* and act_live_peak rows)"),
    ("blocks_recomputed", "blocks whose forward full recompute re-runs in backward (uniform: all, "
                          "MTP included; block: the first N_r decoder blocks of each chunk)"),
    ("symbols_recomputed", "hybrid stacks, block method: pattern layers (symbols) whose forward "
                           "full recompute re-runs, the first N_r of each chunk"),
    ("L_moe_recomputed", "MoE layers among blocks_recomputed"),
    ("L_dense_recomputed", "dense-MLP blocks among blocks_recomputed"),
    ("L_csa_recomputed", "CSA attention layers among blocks_recomputed (V4)"),
    ("L_hca_recomputed", "HCA attention layers among blocks_recomputed (V4)"),
    ("L_bf16", "decoder blocks kept in BF16 under FP8 (training.first_last_layers_bf16: the "
               "first and last N of the model)"),
    ("L_moe_bf16", "MoE layers among L_bf16"),
    ("L_dense_bf16", "dense-MLP blocks among L_bf16"),
    *KIND_STAGE_SYMBOLS,
))

# The rank's neighbours in its CP group (group order, no wrap-around): V4 attention's boundary
# rows go to the next CP rank (Megatron-LM dev@d48bd6be megatron/core/transformer/
# experimental_attention_variant/csa_utils/cp_utils.py _LeftBoundaryExchange).
CP_NEIGHBOUR_SYMBOLS: dict[str, str] = {
    "cp_has_next": "1 when the rank has a next rank in its CP group (not the last)",
    "cp_has_prev": "1 when the rank has a previous rank in its CP group (not the first)",
    "cp_next_offnode": "1 when the next CP rank is on another node (0 without one)",
    "cp_prev_offnode": "1 when the previous CP rank is on another node (0 without one)",
}

# Group kinds whose physical placement the topology split reports.
TOPOLOGY_GROUPS: tuple[str, ...] = ("ep", "expt_tp", "tp_ep", "cp", "tp_cp", "dp_cp", "expt_dp", "tp_dp_cp",
                                    "embd", "intra_dp_cp", "intra_expt_dp", "inter_dist_opt",
                                    "gtp_remat", "expt_gtp_remat", "tp")

RANK_SYMBOLS: tuple[Symbol, ...] = (
    Symbol("rank", "global rank", "rank"),
    Symbol("node", "node of the rank (rank // gpus_per_node node-major; cluster.rank_distribution / "
           "rank_nodes otherwise)", "rank"),
    Symbol("pp_next_offnode", "1 when the next pipeline stage's rank is on another node", "rank"),
    Symbol("pp_prev_offnode", "1 when the previous pipeline stage's rank is on another node", "rank"),
    *(s for kind in TOPOLOGY_GROUPS for s in (
        Symbol(f"{kind}_on_node", f"ranks of this rank's {kind} group on its node (itself included)",
               "rank"),
        Symbol(f"{kind}_nodes", f"nodes spanned by this rank's {kind} group", "rank"),
        Symbol(f"{kind}_ring_offnode", f"share of the {kind} ring's edges (group order) that cross "
               "nodes: the expected share of a rank's ring bytes leaving its node", "rank"),
    )),
    *(Symbol(name, doc, "rank") for name, doc in CP_NEIGHBOUR_SYMBOLS.items()),
    Symbol("miss_node", "probability that a token's k picks miss every expert on one node of its "
           "tp_ep group: C(E − m, k) / C(E, k) with m = E · tp_ep_on_node / tp_ep_size experts on "
           "the node (the ETP shards of an expert share its node); with group-limited routing k/g "
           "picks in each of g groups of G (symbols.miss_probability), precomputed", "rank"),
)

ALL_SYMBOLS: tuple[Symbol, ...] = GLOBAL_SYMBOLS + STAGE_SYMBOLS + RANK_SYMBOLS


def variant_of(cfg: Config, split: StageSplit) -> Variant:
    par, tr, moe, ov, model = cfg.parallel, cfg.training, cfg.moe, cfg.overlap, cfg.model
    if moe.moe_expert_capacity_factor is None:
        capacity = "dropless"
    else:
        capacity = "pad" if moe.moe_pad_expert_input_to_capacity else "drop"
    modules = frozenset(ov.recompute_modules or (["core_attn"] if ov.recompute_granularity ==
                                                 "selective" else []))
    return Variant(
        dispatcher=moe.moe_token_dispatcher_type,
        ncclep=moe.moe_token_dispatcher_type == "flex" and moe.moe_flex_dispatcher_backend == "ncclep",
        capacity=capacity,
        ep=par.ep > 1,
        etp=cfg.degrees.etp > 1,
        tp_ep=cfg.degrees.tp_ep_size > 1,
        dp_cp=cfg.degrees.dp_cp_size > 1,
        edp=cfg.degrees.edp > 1,
        tp_dp_cp=cfg.degrees.tp_dp_cp_size > 1,
        pp=par.pp > 1,
        dist_opt=_shards_optimizer(cfg),
        instances=tr.num_distributed_optimizer_instances > 1,
        kinds=kinds_present(cfg),
        mhc=model.enable_hyper_connections and model.mhc_expansion > 1,
        per_token_loss=tr.calculate_per_token_loss,
        expert_bias=model.moe_router_enable_expert_bias,
        optimizer=tr.optimizer,
        master_copy=ELEMENT_BYTES[tr.precision] < 4,
        recompute=ov.recompute_granularity,
        recompute_method=ov.recompute_method or ("uniform" if ov.recompute_granularity == "full"
                                                 else None),
        recompute_modules=modules if ov.recompute_granularity == "selective" else frozenset(),
        mla_q_lora=bool(model.q_lora_rank),
        flex_backend=str(moe.moe_flex_dispatcher_backend) if moe.moe_token_dispatcher_type == "flex" else "",
        quant_pad=tr.fp8 or tr.fp4,
        virtual_experts=moe.moe_virtual_experts,
        aux_counts=moe.moe_router_load_balancing_type
        if moe.moe_router_load_balancing_type in ("aux_loss", "seq_aux_loss")
        and moe.moe_aux_loss_coeff > 0 and par.tp * par.cp > 1 else "",
        latent=moe.moe_latent_size is not None,
        cp=par.cp > 1,
        fsdp=tr.data_parallel_sharding_strategy if tr.use_megatron_fsdp else "",
        fsdp_grad_copy=tr.use_megatron_fsdp and not tr.gradient_accumulation_fusion,
        gtp=par.gtp > 1,
        egtp=par.egtp > 1,
        muon_tp=tr.optimizer == "muon" and tr.muon_tp_mode == "duplicated"
        and (par.tp > 1 or cfg.degrees.etp > 1),
        weight_hash=tr.check_weight_hash_across_dp_replicas_interval is not None,
        count_zeros=tr.log_num_zeros_in_grad,
        param_copy_loop=ELEMENT_BYTES[tr.precision] < 4 and (tr.precision == "bf16" or _shards_optimizer(cfg))
        and not (tr.use_precision_aware_optimizer or tr.use_megatron_fsdp or tr.optimizer_cpu_offload
                 or (tr.fp8 and tr.fp8_param_gather)),
        params_norm=tr.log_params_norm,
        tp=par.tp > 1,
        sp=par.tp > 1 and par.sequence_parallel,
        qkv_gather=par.tp > 1 and model.attention_variant == "standard" and model.num_query_groups < par.tp,
        shared_overlap=ov.moe_shared_expert_overlap and bool(model.moe_shared_expert_intermediate_size),
        dualpipe=ov.pipeline_schedule == "dualpipe" and par.pp > 1,
        global_aux=moe.moe_router_load_balancing_type == "global_aux_loss" and moe.moe_aux_loss_coeff > 0,
        layernorm=model.normalization == "LayerNorm",
        swiglu=model.gated_mlp,
        bias=model.add_bias_linear,
        dropout=model.hidden_dropout > 0,
        shared_gate=model.moe_shared_expert_gate and bool(model.moe_shared_expert_intermediate_size),
        zero_experts=model.moe_zero_experts > 0,
        router_fp64=model.moe_router_dtype == "fp64",
        mla_norms=model.qk_layernorm or model.attention_variant != "mla",
        fp8_weights=FP8_WEIGHTS[tr.fp8_recipe] if tr.fp8 and tr.fp8_recipe else "",
        fp8_transpose=tr.fp8 and takes_tn_only(cfg.cluster.gpu)
        and tr.fp8_recipe in ("delayed", "tensorwise"),
        fp8_param_gather=tr.fp8 and tr.fp8_param_gather,
        learned_positions=model.position_embedding_type == "learned_absolute",
        grads_fp32=tr.grads_in_fp32 or tr.precision == "fp32",
        precision_aware=precision_aware_bytes(cfg),
        optimizer_offload=tr.optimizer_cpu_offload and tr.optimizer_offload_fraction > 0,
        qkv_bias=model.add_qkv_bias and not model.add_bias_linear and model.attention_variant == "standard",
        expert_buffer=cfg.degrees.expert_grad_buffer,
        ncclep_zero_copy=moe.moe_ncclep_zero_copy and moe.moe_token_dispatcher_type == "flex"
        and moe.moe_flex_dispatcher_backend == "ncclep",
        packed_basis=tr.packed_length_basis if tr.packed_lengths else "",
        quick_geglu=model.quick_geglu,
        wgrad_unfused=not tr.gradient_accumulation_fusion and not tr.use_megatron_fsdp,
        offload=offload_groups(cfg),
        mixer_only=1 in (model.mixer_only_layers or []),
        # Megatron trains Mamba stacks and DeepSeek-V4 on the hybrid entry, whose HybridStack has
        # one layer per pattern symbol (a V4 block is two: its attention and its MoE)
        hybrid_stack=1 in (model.mamba_layers or []) + (model.mixer_only_layers or [])
        or model.attention_variant == "dsv4_hybrid",
        attn_scores=tr.attention_backend in ("unfused", "local") or tr.transformer_impl == "local",
        attention_dropout=model.attention_dropout > 0,
        ce_impl=tr.cross_entropy_fusion_impl if tr.cross_entropy_loss_fusion else "unfused",
        te=tr.transformer_impl == "transformer_engine",
        grouped_gemm=moe.moe_grouped_gemm and model.num_experts > 0,
        large_workspaces=not pre_hopper(cfg.cluster.gpu),
        freeze=frozenset(tr.freeze),
        lora=frozenset(tr.lora.target_modules) if tr.lora else frozenset(),
        rl=_rl(tr),
        bf16_layers=tr.fp8 and bf16_layers(cfg) is not None,
        rope_unfused=rope_unfused(cfg),
        moe_act_clamp=model.quick_geglu and model.swiglu_limit is not None,
        tower=tr.frozen_tower_params + tr.trained_tower_params > 0,
    )


def _deepep_values(cfg: Config) -> dict[str, Number]:
    """DeepEP's buffer sizes for the config's EP group (ETP·EP ranks, h_moe-wide rows)."""
    sizes = deepep_buffers(cfg.degrees.tp_ep_size,
                           cfg.moe.moe_latent_size or cfg.model.hidden_size, cfg.cluster.gpus_per_node)
    nvl, rdma = sizes or (0, 0)
    return {"deepep_nvl_bytes": nvl, "deepep_rdma_bytes": rdma}


def _rl(tr: Any) -> str:
    """Which sides of an RL colocation release their memory in the other's phase."""
    rl = tr.rl_colocation
    if rl is None:
        return ""
    sides = [side for side, on in (("train", rl.offload_train), ("rollout", rl.offload_rollout)) if on]
    return "+".join(sides) or "none"


# Bytes of one optimizer state element per --main-params-dtype / --exp-avg-dtype choice; fp8 moments
# keep one scale per tensor besides (left out).
STATE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def precision_aware_bytes(cfg: Config) -> tuple[str, str, str] | tuple[()]:
    """(master, exp_avg, exp_avg_sq) bytes per parameter of Transformer Engine's FusedAdam under
    --use-precision-aware-optimizer (Megatron-LM dev@d48bd6be megatron/core/optimizer/__init__.py
    _get_megatron_optimizer_based_on_param_groups). TE keeps the master weights unless they are
    fp32 under an FP8 recipe other than delayed without CPU offload (then Megatron's distributed
    optimizer keeps fp32 ones: OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8); an
    fp32 master of a bf16 parameter is stored as its 16-bit remainder (store_param_remainders,
    default true, distrib_optimizer.py). fp32 training parameters need no master copy."""
    tr = cfg.training
    if not tr.use_precision_aware_optimizer:
        return ()
    te_master = (tr.main_params_dtype != "fp32" or not tr.fp8 or tr.fp8_recipe == "delayed"
                 or tr.optimizer_cpu_offload)
    if tr.precision == "fp32":
        master = 0
    elif tr.main_params_dtype == "fp32":
        master = 2 if te_master and tr.precision == "bf16" else 4
    else:
        master = STATE_BYTES[tr.main_params_dtype]
    return (str(master), str(STATE_BYTES[tr.exp_avg_dtype]), str(STATE_BYTES[tr.exp_avg_sq_dtype]))


# How Transformer Engine stores a quantised weight per Megatron recipe (the schema fills in
# Megatron's default, delayed: Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py
# TransformerConfig.fp8_recipe).
FP8_WEIGHTS = {"delayed": "tensor", "tensorwise": "tensor", "blockwise": "blockwise", "mxfp8": "mxfp8"}


def _shards_optimizer(cfg: Config) -> bool:
    """Optimizer state sharded over the data-parallel replicas: the distributed optimizer, or
    Megatron-FSDP with any strategy but no_shard (Megatron turns the distributed optimizer on for
    it: Megatron-LM dev@d48bd6be megatron/training/arguments.py validate_args)."""
    tr = cfg.training
    if tr.use_megatron_fsdp:
        return tr.data_parallel_sharding_strategy != "no_shard"
    return tr.use_distributed_optimizer
# Rows of one local expert are padded to these multiples for quantised grouped GEMMs
# (Megatron-LM dev@d48bd6be megatron/core/fp8_utils.py get_fp8_align_size: 16 but for mxfp8's 32;
# megatron/core/fp4_utils.py get_fp4_align_size: 128).
QUANT_ALIGN = {"fp8": 16, "mxfp8": 32, "fp4": 128}


def miss_probability(experts: int, topk: int, held: int,
                     groups: tuple[int | None, int | None] = (None, None)) -> Number:
    """Chance that a token's k picks avoid all `held` experts of one block (a rank's or a node's
    experts), averaged over the blocks of that size that tile the E experts.

    Plain top-k: k distinct experts drawn uniformly from E, C(E − held, k) / C(E, k) (0 when k
    exceeds the experts left). Group-limited top-k (model.moe_router_num_groups G and
    moe_router_group_topk g; Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_utils.py
    group_limited_topk): a token first picks g of the G equal groups, by the sum of each group's
    top-(k/g) scores, then its k experts inside them. Each picked group was picked for its
    strongest experts, so it receives k/g of the picks (not uniformly 0..k; a simulation of
    Megatron's routing on the random logits of forced balancing agrees to about 2 %); a block
    overlapping group j in o_j experts is then missed with probability
    E_S[prod_{j in S} C(s − o_j, k/g) / C(s, k/g)] over the uniform g-subsets S of groups."""
    num_groups, group_topk = groups
    if experts <= 0 or topk > experts:
        return 0
    if not num_groups or not group_topk or num_groups <= group_topk or experts % num_groups:
        return normalize(Fraction(math.comb(experts - held, topk), math.comb(experts, topk)))
    return _grouped_miss(experts, topk, max(held, 1), num_groups, group_topk)


@cache
def _grouped_miss(experts: int, topk: int, held: int, num_groups: int, group_topk: int) -> Number:
    size, per_group = experts // num_groups, max(topk // group_topk, 1)
    patterns: Counter[tuple[int, ...]] = Counter()
    for start in range(0, experts, held):
        end = min(start + held, experts)
        patterns[tuple(o for j in range(num_groups)
                       if (o := min(end, (j + 1) * size) - max(start, j * size)) > 0)] += 1
    total = Fraction(0)
    for overlaps, blocks in patterns.items():
        # e_i over the groups the block touches (a group it misses contributes a factor 1)
        subsets = [Fraction(1)] + [Fraction(0)] * len(overlaps)
        for overlap in overlaps:
            value = Fraction(math.comb(size - overlap, per_group), math.comb(size, per_group))
            for picked in range(len(overlaps), 0, -1):
                subsets[picked] += subsets[picked - 1] * value
        untouched = num_groups - len(overlaps)
        missed = sum(subsets[i] * math.comb(untouched, group_topk - i)
                     for i in range(min(len(overlaps), group_topk) + 1))
        total += blocks * missed / math.comb(num_groups, group_topk)
    return normalize(total / sum(patterns.values()))


BUCKET_ALIGN = 128  # elements; Megatron-LM dev@d48bd6be megatron/core/optimizer/param_layout.py


def _buffer_pad(cfg: Config, replicas: int) -> int:
    """The distributed optimizer pads each grad/param bucket's end to a multiple of
    lcm(data-parallel shards, 128) elements so every shard is whole (Megatron-LM dev@d48bd6be
    megatron/core/optimizer/param_layout.py bucket_end_divisor, used by distrib_optimizer.py
    DistributedOptimizer._compute_per_buffer_param_layout); without it nothing is padded. Megatron-FSDP's
    sharded buffers are assumed padded the same way (an approximation of its DataParallelBuffer)."""
    instances = cfg.training.num_distributed_optimizer_instances
    if not _shards_optimizer(cfg) or replicas < 1 or replicas % instances:
        return 1
    return math.lcm(replicas // instances, BUCKET_ALIGN)


def _ratios(cfg: Config) -> list[int]:
    return list(cfg.model.compress_ratios or [])


def global_values(cfg: Config, split: StageSplit) -> dict[str, Number]:
    m, par, tr = cfg.model, cfg.parallel, cfg.training
    hca = [r for r in _ratios(cfg) if r not in (0, CSA_RATIO)]
    return {
        "N": par.world_size, "TP": par.tp, "CP": par.cp, "PP": par.pp, "VPP": split.vpp,
        "EP": par.ep, "ETP": cfg.degrees.etp, "GTP": par.gtp, "EGTP": par.egtp,
        "q_s": par.gtp_remat_num_sequence_shards or 1,
        "TP_seq": par.tp if par.sequence_parallel else 1,
        "h": m.hidden_size, "E": m.num_experts, "Z": m.moe_zero_experts, "k": m.moe_router_topk,
        "I": m.moe_ffn_hidden_size, "I_s": m.moe_shared_expert_intermediate_size,
        "f": m.ffn_hidden_size, "V": m.vocab_size,
        "V_pad": cfg.padded_vocab_size,
        "heads": m.num_attention_heads,
        "groups": m.num_query_groups, "d": m.kv_channels,
        "q_lora": m.q_lora_rank or 0, "kv_lora": m.kv_lora_rank or 0,
        "qk_rope": m.qk_pos_emb_head_dim, "d_qk": m.qk_head_dim, "d_v": m.v_head_dim,
        "o_groups": m.o_groups or 1, "o_lora": m.o_lora_rank or 0,
        "idx_heads": m.index_n_heads or 0, "idx_dim": m.index_head_dim or 0,
        "idx_topk": m.index_topk or 0, "csa_ratio": CSA_RATIO, "hca_ratio": max(hca, default=0),
        "n_hc": m.mhc_expansion, "S": packed_sequence_length(tr), "b": tr.micro_batch_size,
        "B": cfg.global_batch_size, "p": ELEMENT_BYTES[tr.precision],
        "cf": exact(cfg.moe.moe_expert_capacity_factor or 0),
        "rcf": exact(cfg.moe.moe_expert_rank_capacity_factor or 0),
        "I_opt": tr.num_distributed_optimizer_instances,
        "N_r": cfg.overlap.recompute_num_layers or 1,
        "pad_dense": _buffer_pad(cfg, cfg.degrees.dp_cp_size),
        "pad_expert": _buffer_pad(cfg, cfg.degrees.edp),
        "mem_gib": exact(cfg.cluster.gpu_memory_gib),
        "reserved_ratio": exact(cfg.cluster.allocator_reserved_ratio),
        "context_gib": exact(cfg.cluster.cuda_context_gib),
        "nccl_channels": cfg.cluster.nccl_channels,
        "mem_margin": exact(cfg.cluster.memory_margin),
        "lora_rank": tr.lora.dim if tr.lora else 0,
        "tower_params": tr.frozen_tower_params,
        "tower_trained_params": tr.trained_tower_params,
        "rl_engine_fraction": exact(tr.rl_colocation.engine_memory_fraction) if tr.rl_colocation else 0,
        **_deepep_values(cfg),
        "recv_z2": hot_rank_z2(cfg.cluster.efficiency.routing_quantile, par.ep),
        "h_moe": cfg.moe.moe_latent_size or m.hidden_size,
        "csa_window": m.csa_window_size or 0,
        "csa_align": 32 // math.gcd(32, CSA_RATIO),
        "hca_align": 32 // math.gcd(32, max(hca, default=0)),
        "miss_rank": miss_probability(m.num_experts, m.moe_router_topk, m.num_experts // max(par.ep, 1),
                                      (m.moe_router_num_groups, m.moe_router_group_topk)),
        "q_align": (QUANT_ALIGN["mxfp8" if tr.fp8_recipe == "mxfp8" else "fp8"] if tr.fp8
                    else QUANT_ALIGN["fp4"] if tr.fp4 else 1),
        "vex_slots": int(cfg.moe.moe_virtual_experts),
        # the learned position table and the optimizer's CPU offload
        "pos_rows": m.max_position_embeddings or tr.seq_length,
        "opt_gpu_share": 1 - exact(tr.optimizer_offload_fraction) if tr.optimizer_cpu_offload else 1,
        # fine-grained activation offloading
        "min_offloaded": cfg.overlap.min_offloaded_tensor_size,
        # Megatron computes int(eligible * (1 - fraction)) in floats: 1 - 0.9 is just under 0.1
        "offload_keep_share": exact(1 - cfg.overlap.activation_offload_fraction),
        "offload_delta_bytes": cfg.overlap.delta_offload_bytes_across_pp_ranks,
        **model_values(cfg),
        **kind_values(cfg),
        **hardware_values(cfg),
        **optimizer_values(cfg),
    }


@dataclass(frozen=True, eq=False)
class Holdings:
    """What each stage (and each model chunk alone) of one split holds: the per-stage counts of
    `STAGE_SYMBOLS`, made on first ask. Shared by every config with the same model, pipeline and
    recompute fields (`holdings`): callers copy a dict before changing it."""

    cfg: Config
    split: StageSplit
    _made: dict[tuple[str, int, int], dict[str, Number]] = field(default_factory=dict, repr=False)

    def stage(self, stage: int, embd_group: Sequence[int] | None = None) -> dict[str, Number]:
        """Per-stage counts; `embd_group` is the embedding group of the stage's ranks (grid), if
        any."""
        embd_size = len(embd_group) if embd_group else 1
        key = ("stage", stage, embd_size)
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = _holding_values(self.cfg, self.split, self.split.stages[stage],
                                                     self.split.vpp, embd_size)
        return made

    def chunk(self, chunk: Chunk) -> dict[str, Number]:
        """The same counts for one model chunk alone: what one of its forward passes stores."""
        key = ("chunk", chunk.index, 1)
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = _holding_values(
                self.cfg, self.split, stage_layers(self.cfg, chunk.stage, [chunk]), 1, 1)
        return made


_HOLDINGS: Memo[tuple[Any, ...], Holdings] = Memo("stage holdings", 4096)


def holdings(cfg: Config, split: StageSplit) -> Holdings:
    """The holdings of `split` (the config's `stage_split`), remembered by what they read: the
    model, the pipeline fields and the recompute setting (search asks for the same ones for every
    knob setting of a layout)."""
    ov = cfg.overlap
    key = (split_key(cfg), ov.recompute_granularity, ov.recompute_method, ov.recompute_num_layers,
           bf16_layers(cfg))
    return _HOLDINGS.get(key, Holdings, cfg, split)


def _holding_values(cfg: Config, split: StageSplit, st: StageLayers, chunks: int,
                    embd_size: int) -> dict[str, Number]:
    stage, model, pp = st.stage, cfg.model, cfg.parallel.pp
    blocks = len(st.layers) + len(st.mtp_layers)
    alone = sum(1 for layer in st.layers if not model.has_mlp(layer))
    tied_copy = not model.untie_embeddings_and_output_weights and pp > 1
    first_chunk, last_chunk = split.chunks[0], split.chunks[-1]
    return {
        "s": stage, "chunks": chunks, "blocks": blocks, "L_moe": len(st.moe_layers),
        "L_dense": blocks - len(st.moe_layers) - alone, "L_nomlp": alone,
        "L_pattern": 2 * len(st.layers) - alone + len(st.mtp_layers), "L_hash": len(st.hash_layers),
        "L_mtp": len(st.mtp_layers),
        **layer_counts(model, [*st.layers, *(model.num_layers + d for d in st.mtp_layers)]),
        "has_embedding": int(st.embedding),
        "has_mtp_embedding": int(bool(st.mtp_layers) and not st.embedding),
        "has_output": int(st.output_head),
        "has_output_weight": int(st.output_head and (model.untie_embeddings_and_output_weights
                                                     or tied_copy)),
        "is_first_stage": int(first_chunk.stage == stage),
        "is_last_stage": int(last_chunk.stage == stage),
        "embd_size": embd_size,
        # Megatron all-reduces word-embedding grads over the group only for a shared weight:
        # tied input/output embeddings, or the MTP stages' copies of the input embedding.
        "embd_sync": int(embd_size > 1 and (not model.untie_embeddings_and_output_weights
                                            or model.mtp_num_layers > 0)),
        **_recompute_values(cfg, st),
        **_bf16_values(cfg, st),
    }


def bf16_layers(cfg: Config) -> tuple[int, int] | None:
    """The (first, last) decoder-layer counts kept in BF16 under FP8/FP4, None when all are
    quantised (Megatron-LM dev@d48bd6be megatron/core/fp8_utils.py is_first_last_bf16_layer)."""
    tr = cfg.training
    if not tr.first_last_layers_bf16 or not (tr.fp8 or tr.fp4):
        return None
    return tr.num_layers_at_start_in_bf16, tr.num_layers_at_end_in_bf16


def _bf16_values(cfg: Config, st: StageLayers) -> dict[str, Number]:
    """The stage's decoder blocks kept in BF16, by MLP kind. Megatron numbers them globally
    (TransformerBlock build_layer passes the global layer index to get_fp8_context), so only the
    stages holding the model's first or last layers have any; MTP layers are built under the
    plain FP8 context (index -1) and stay quantised."""
    counts, model = bf16_layers(cfg), cfg.model
    start, end = counts or (0, 0)
    layers = [layer for layer in st.layers if layer < start or layer >= model.num_layers - end] \
        if counts else []
    moe = sum(1 for layer in layers if model.is_moe_layer(layer))
    alone = sum(1 for layer in layers if not model.has_mlp(layer))
    return {"L_bf16": len(layers), "L_moe_bf16": moe, "L_dense_bf16": len(layers) - moe - alone}


def _recompute_values(cfg: Config, st: StageLayers) -> dict[str, Number]:
    """The blocks of the stage whose forward full recompute re-runs, by kind. Megatron-LM
    dev@d48bd6be megatron/core/transformer/transformer_block.py TransformerBlock._checkpointed_forward:
    `uniform` checkpoints every layer of the chunk in groups of recompute_num_layers, `block` only the
    first recompute_num_layers of each chunk; megatron/core/transformer/multi_token_prediction.py
    MultiTokenPredictionLayer._checkpointed_forward recomputes MTP layers under `uniform` only."""
    ov, model = cfg.overlap, cfg.model
    layers: list[int] = []
    if ov.recompute_granularity == "full":
        block = ov.recompute_method == "block"
        limit = 1 if ov.recompute_num_layers is None else ov.recompute_num_layers
        for chunk in st.chunks:
            layers += chunk.layers[:limit] if block else chunk.layers
            layers += [] if block else [model.num_layers + d for d in chunk.mtp_layers]
    moe = sum(1 for layer in layers if layer >= model.num_layers or model.is_moe_layer(layer))
    alone = sum(1 for layer in layers if layer < model.num_layers and not model.has_mlp(layer))
    # Megatron's HybridStack (megatron/core/recompute.py checkpointed_forward over its own layers)
    # recomputes the first N_r pattern symbols of each chunk: a block is two, a mixer alone one
    symbols = sum(min(1 if ov.recompute_num_layers is None else ov.recompute_num_layers,
                      sum(2 if model.has_mlp(layer) else 1 for layer in chunk.layers))
                  for chunk in st.chunks) if ov.recompute_granularity == "full" else 0
    return {"blocks_recomputed": len(layers), "symbols_recomputed": symbols, "L_moe_recomputed": moe,
            "L_dense_recomputed": len(layers) - moe - alone, **layer_counts(model, layers, "_recomputed")}


def rank_values(rank: int, gpus_per_node: Places, groups: dict[str, list[int]],
                pp_group: Sequence[int],
                experts: tuple[int, int, int | None, int | None] = (1, 1, None, None),
                ) -> dict[str, Number]:
    """Node-major placement facts of one rank: for each group kind, peers on its node, nodes
    spanned, and the share of ring edges (i -> i+1 in group order) that cross nodes; a kind the
    layout lacks counts as the rank alone. Pipeline sends go to the exact neighbour stage.
    `experts` is (E, k, G, g) (G, g: group-limited routing, or None), for the chance that a
    token skips a node of its tp_ep group."""
    values: dict[str, Number] = {"rank": rank, "node": node_of(rank, gpus_per_node)}
    for kind in TOPOLOGY_GROUPS:
        values.update(group_values(kind, groups.get(kind) or [rank], rank, gpus_per_node))
    values.update(_cp_neighbours(rank, gpus_per_node, groups.get("cp") or [rank]))
    values.update(pipeline_values(rank, gpus_per_node, pp_group))
    num_experts, topk, num_groups, group_topk = experts
    on_node = int(values["tp_ep_on_node"])
    tp_ep = max(len(groups.get("tp_ep") or [rank]), 1)
    values["miss_node"] = miss_probability(num_experts, topk, num_experts * on_node // tp_ep,
                                           (num_groups, group_topk))
    return values


def moved_rank_values(values: dict[str, Number], rank: int, gpus_per_node: Places,
                      groups: dict[str, list[int]], pp_group: Sequence[int]) -> dict[str, Number]:
    """`rank_values` of `rank` from those of another rank whose groups are this rank's moved by a
    whole number of nodes, but `groups` (recomputed here) and the pipeline neighbours: every
    per-node count and crossing share is unchanged by such a move."""
    moved = dict(values)
    moved.update(rank=rank, node=node_of(rank, gpus_per_node))
    for kind, members in groups.items():
        moved.update(group_values(kind, members or [rank], rank, gpus_per_node))
    moved.update(pipeline_values(rank, gpus_per_node, pp_group))
    return moved


def group_values(kind: str, members: Sequence[int], rank: int,
                 gpus_per_node: Places) -> dict[str, Number]:
    """One group kind's placement facts for `rank`: peers on its node, nodes spanned, and the
    share of ring edges crossing nodes (nodes as `gpus_per_node` places ranks: planner/layout/nodes.py)."""
    nodes = nodes_of(members, gpus_per_node)
    crossing = sum(map(operator.ne, nodes, nodes[1:] + nodes[:1]))
    return {f"{kind}_on_node": nodes.count(node_of(rank, gpus_per_node)),
            f"{kind}_nodes": len(set(nodes)),
            f"{kind}_ring_offnode": normalize(Fraction(crossing, len(nodes)))}


def pipeline_values(rank: int, gpus_per_node: Places, pp_group: Sequence[int]) -> dict[str, Number]:
    """Whether the rank's next and previous pipeline stages sit on another node."""
    node = node_of(rank, gpus_per_node)
    where = list(pp_group).index(rank) if rank in pp_group else 0
    size = max(len(pp_group), 1)
    values: dict[str, Number] = {}
    for key, neighbour in (("pp_next_offnode", where + 1), ("pp_prev_offnode", where - 1)):
        peer = pp_group[neighbour % size] if pp_group else rank
        values[key] = int(node_of(peer, gpus_per_node) != node)
    return values


def _cp_neighbours(rank: int, gpus_per_node: Places, cp_group: Sequence[int]) -> dict[str, Number]:
    """Whether the rank has a previous / next CP rank and whether it sits on another node."""
    members = list(cp_group)
    where = members.index(rank) if rank in members else 0
    node = node_of(rank, gpus_per_node)
    values: dict[str, Number] = {}
    for side, peer in (("next", where + 1), ("prev", where - 1)):
        there = 0 <= peer < len(members)
        values[f"cp_has_{side}"] = int(there)
        values[f"cp_{side}_offnode"] = int(there and node_of(members[peer], gpus_per_node) != node)
    return values


def hot_rank_z2(quantile: float, ep: int) -> Number:
    """z² for the stated quantile of the busiest of EP ranks: P(max of EP receive counts ≤ x) =
    P(one ≤ x)^EP for independent ranks, so each rank's count sits at its q^(1/EP) quantile
    (normal approximation; the counts are nearly independent when E/EP ≪ E). Rounded to 6
    decimals so the budget stays an exact rational."""
    z = NormalDist().inv_cdf(quantile ** (1 / max(ep, 1)))
    return exact(round(max(z, 0.0) ** 2, 6))


def packed_sequence_length(tr: Any) -> int:
    """The S the budgets use: seq_length (fixed), or for variable-length THD packing the max or
    the mean of training.packed_lengths (tokens per packed microbatch) over b, rounded up."""
    lengths = tr.packed_lengths
    if not lengths:
        return int(tr.seq_length)
    tokens = max(lengths) if tr.packed_length_basis == "max" else Fraction(sum(lengths), len(lengths))
    return math.ceil(Fraction(tokens) / tr.micro_batch_size)

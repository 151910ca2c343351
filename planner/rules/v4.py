"""V4: DeepSeek-V4 specifics — CSA/HCA attention, its context parallelism, hash routing and mHC."""

from __future__ import annotations

from collections.abc import Iterator

from planner.config.megatron_branch import branch_features
from planner.config.schema import DSV4_CSA_RATIO as CSA_RATIO
from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import TRANSFORMER_CONFIG, V4_WRITE_UP, VALIDATE_ARGS, dev

COMPRESS_RATIOS = (0, 4, 128)
# The dev-only features of the DeepSeek-V4 model and its dispatch (planner/config/megatron_branch.py).
V4_ONLY = ("model.attention_variant", "model.moe_n_hash_layers", "model.enable_hyper_connections",
           "moe.moe_flex_dispatcher_backend")

# A custom model with V4 attention needs one compress ratio per layer (4 layers in the base).
_V4_MODEL = "model: {attention_variant: dsv4_hybrid, compress_ratios: [0, 4, 128, 4]}"
_V4_CP = """
model: {attention_variant: dsv4_hybrid, compress_ratios: [0, 4, 128, 4]}
parallel: {cp: 2, cp_partition_mode: contiguous}
training: {sequence_packing_scheduler: dp_balanced}
"""


@rule(
    "V4001", "error", "DeepSeek-V4 attention needs TP = 1",
    source=TRANSFORMER_CONFIG,
    why="""Megatron's dsv4_hybrid (CSA/HCA) attention has no tensor-parallel implementation; it
    raises for TP > 1. Scale V4 attention with CP and DP instead.""",
    bad=_V4_MODEL + "\nparallel: {tp: 2, sequence_parallel: true}",
    good=_V4_MODEL + "\nparallel: {tp: 1}",
)
def v4_attention_tp1(f: Facts) -> Iterator[Violation]:
    if f.v4_attention and f.par.tp > 1:
        yield Violation("parallel.tp", f"attention_variant dsv4_hybrid with tp {f.par.tp}",
                        "set parallel.tp: 1; scale attention with cp or data parallelism instead")


@rule(
    "V4002", "error", "DeepSeek-V4 with CP > 1 needs a sequence-packing scheduler",
    source=TRANSFORMER_CONFIG,
    why="""V4 context parallelism uses the contiguous CP partition (V4003), and Megatron dev accepts
    that partition with CP > 1 only on packed THD input, which comes from a sequence-packing
    scheduler: there is no qkv_format argument on dev. Dynamic CP picks its scheduler itself.""",
    bad="""
    model: {attention_variant: dsv4_hybrid, compress_ratios: [0, 4, 128, 4]}
    parallel: {cp: 2, cp_partition_mode: contiguous}
    """,
    good=_V4_CP,
)
def v4_cp_needs_packing(f: Facts) -> Iterator[Violation]:
    if (f.v4_attention and f.par.cp > 1 and f.train.sequence_packing_scheduler is None
            and not f.par.dynamic_context_parallel):
        yield Violation("training.sequence_packing_scheduler",
                        f"dsv4_hybrid attention with cp {f.par.cp} but no sequence_packing_scheduler",
                        "set training.sequence_packing_scheduler: dp_balanced")


@rule(
    "V4003", "error", "DeepSeek-V4 with CP > 1 needs the contiguous CP partition",
    source=TRANSFORMER_CONFIG,
    why="""The compressed-attention CP exchange assumes each CP rank holds one contiguous piece
    of the sequence; Megatron rejects the default zigzag partition for V4.""",
    bad="""
    model: {attention_variant: dsv4_hybrid, compress_ratios: [0, 4, 128, 4]}
    parallel: {cp: 2, cp_partition_mode: zigzag}
    training: {sequence_packing_scheduler: dp_balanced}
    """,
    good=_V4_CP,
)
def v4_cp_contiguous(f: Facts) -> Iterator[Violation]:
    if f.v4_attention and f.par.cp > 1 and f.par.cp_partition_mode != "contiguous":
        yield Violation("parallel.cp_partition_mode",
                        f"dsv4_hybrid attention with cp {f.par.cp} but cp_partition_mode is "
                        f"{f.par.cp_partition_mode}", "set parallel.cp_partition_mode: contiguous")


@rule(
    "V4004", "warning", "DeepSeek-V4 attention with dynamic CP",
    source=V4_WRITE_UP + "; " + VALIDATE_ARGS,
    why="""The DeepSeek-V4 Megatron write-up says V4 attention supports static context parallelism
    only. Megatron dev accepts dynamic CP with dsv4_hybrid attention all the same, as long as
    calculate_per_token_loss is on and the default_dynamic_cp packing scheduler is used (PAR015).
    moeplan follows the code and warns: the combination starts, but the write-up does not vouch
    for it.""",
    bad="""
    model: {attention_variant: dsv4_hybrid, compress_ratios: [0, 4, 128, 4]}
    parallel: {cp: 2, cp_partition_mode: contiguous, dynamic_context_parallel: true}
    training: {sequence_packing_scheduler: default_dynamic_cp, calculate_per_token_loss: true}
    """,
    good=_V4_CP,
)
def v4_cp_static(f: Facts) -> Iterator[Violation]:
    if f.v4_attention and f.par.cp > 1 and f.dynamic_cp:
        yield Violation(f"parallel.{f.dynamic_cp}",
                        f"dsv4_hybrid attention with cp {f.par.cp} and {f.dynamic_cp} on: Megatron "
                        "dev accepts it, the DeepSeek-V4 write-up supports static CP only",
                        f"set parallel.{f.dynamic_cp}: false to stay on the documented path")


@rule(
    "V4005", "error", "hash routing forbids overlap_moe_expert_parallel_comm",
    source=TRANSFORMER_CONFIG,
    why="""Hash MoE layers route by token id instead of the gate; Megatron's batch-level EP
    overlap cannot schedule them and rejects the combination.""",
    bad="""
    model: {moe_n_hash_layers: 1}
    parallel: {pp: 1}
    moe: {moe_tid2eid_source: checkpoint}
    overlap: {overlap_moe_expert_parallel_comm: true}
    """,
    good="""
    model: {moe_n_hash_layers: 1}
    parallel: {pp: 1}
    moe: {moe_tid2eid_source: checkpoint}
    overlap: {overlap_moe_expert_parallel_comm: false}
    """,
)
def hash_forbids_ep_overlap(f: Facts) -> Iterator[Violation]:
    if f.hash_layers and f.ovl.overlap_moe_expert_parallel_comm:
        yield Violation("overlap.overlap_moe_expert_parallel_comm",
                        f"moe_n_hash_layers {f.hash_layers} with overlap_moe_expert_parallel_comm on",
                        "set overlap.overlap_moe_expert_parallel_comm: false")


@rule(
    "V4006", "warning", "hash routing without a tid2eid table source",
    source=TRANSFORMER_CONFIG,
    why="""Megatron initialises the hash layers' token→expert table (tid2eid) with a round-robin
    placeholder and warns. Load the real table from a checkpoint, or state the initialisation you
    train from scratch with.""",
    bad="""
    model: {moe_n_hash_layers: 1}
    parallel: {pp: 1}
    """,
    good="""
    model: {moe_n_hash_layers: 1}
    parallel: {pp: 1}
    moe: {moe_tid2eid_source: checkpoint}
    """,
)
def hash_needs_tid2eid_source(f: Facts) -> Iterator[Violation]:
    if f.hash_layers and not f.moe.moe_tid2eid_source:
        yield Violation("moe.moe_tid2eid_source",
                        f"{f.hash_layers} hash layer(s) but no tid2eid table source: Megatron would "
                        "use its round-robin placeholder",
                        "set moe.moe_tid2eid_source: checkpoint, or name the init strategy")


@rule(
    "V4007", "warning", "mHC with PP > 1 and overlap_moe_expert_parallel_comm",
    source=V4_WRITE_UP + "; " + TRANSFORMER_CONFIG,
    why="""mHC widens the residual stream, so the pipeline boundary tensors are several times
    [n, h]; the DeepSeek-V4 Megatron write-up advises against the batch-level EP overlap with
    pipeline parallelism for that reason. Megatron dev accepts the combination: with PP > 1 the
    overlap only needs virtual pipeline stages (OVL003), and with full recompute zero dropout.
    moeplan follows the code and warns.""",
    bad="""
    model: {enable_hyper_connections: true, num_residual_streams: 4}
    parallel: {vpp: 2}
    overlap: {overlap_moe_expert_parallel_comm: true}
    """,
    good="""
    model: {enable_hyper_connections: true, num_residual_streams: 4}
    parallel: {pp: 1}
    overlap: {overlap_moe_expert_parallel_comm: true}
    """,
)
def mhc_pp_with_ep_overlap(f: Facts) -> Iterator[Violation]:
    if f.mhc and f.par.pp > 1 and f.ovl.overlap_moe_expert_parallel_comm:
        yield Violation("overlap.overlap_moe_expert_parallel_comm",
                        f"enable_hyper_connections with pp {f.par.pp} and "
                        "overlap_moe_expert_parallel_comm on: Megatron dev accepts it, the "
                        "DeepSeek-V4 write-up advises against it",
                        "set overlap.overlap_moe_expert_parallel_comm: false or pp: 1 to follow the "
                        "write-up, or keep it as Megatron dev allows")


@rule(
    "V4008", "warning", "V3-style group/node-limited routing on a DeepSeek-V4 model",
    source=V4_WRITE_UP,
    why="""DeepSeek-V4 dropped V3's node-limited routing (no n_group/topk_group). Group-limited
    routing only limits destination nodes when the groups match the physical placement; on V4 it
    changes the model's routing.""",
    bad="""
    model: {attention_variant: dsv4_hybrid, compress_ratios: [0, 4, 128, 4],
            moe_router_num_groups: 4, moe_router_group_topk: 2}
    """,
    good=_V4_MODEL,
)
def v4_without_node_limits(f: Facts) -> Iterator[Violation]:
    m = f.model
    if f.v4_model and (m.moe_router_num_groups or m.moe_router_group_topk):
        yield Violation("model.moe_router_group_topk",
                        f"DeepSeek-V4 model with moe_router_num_groups {m.moe_router_num_groups} and "
                        f"moe_router_group_topk {m.moe_router_group_topk}",
                        "remove moe_router_num_groups and moe_router_group_topk (V4 routes without "
                        "a node limit)")


@rule(
    "V4009", "error", "DeepSeek-V4 attention has a compress ratio per layer",
    source=TRANSFORMER_CONFIG,
    why="""CSA/HCA attention compresses the KV of each layer by its own ratio, the MTP layers
    included, so compress_ratios needs at least num_layers + mtp_num_layers entries.""",
    bad="model: {attention_variant: dsv4_hybrid, compress_ratios: [0, 4]}",
    good=_V4_MODEL,
)
def v4_compress_ratio_count(f: Facts) -> Iterator[Violation]:
    if not f.v4_attention:
        return
    m = f.model
    need = m.num_layers + m.mtp_num_layers
    have = len(m.compress_ratios or [])
    if have < need:
        yield Violation("model.compress_ratios",
                        f"compress_ratios has {have} entries, needs num_layers + mtp_num_layers = "
                        f"{m.num_layers} + {m.mtp_num_layers} = {need}",
                        f"give {need} ratios, each 0, 4 or 128")


@rule(
    "V4010", "error", "DeepSeek-V4 compress ratios are 0, 4 or 128",
    source=TRANSFORMER_CONFIG,
    why="""Each layer is either sliding-window only (0), compressed sparse attention (4) or heavily
    compressed attention (128); there are kernels for no other ratio.""",
    bad="model: {attention_variant: dsv4_hybrid, compress_ratios: [0, 4, 8, 4]}",
    good=_V4_MODEL,
)
def v4_compress_ratio_values(f: Facts) -> Iterator[Violation]:
    if not f.v4_attention:
        return
    wrong = sorted({r for r in f.model.compress_ratios or [] if r not in COMPRESS_RATIOS})
    if wrong:
        yield Violation("model.compress_ratios", f"compress_ratios contains {wrong}",
                        "use only 0, 4 and 128")


CSA_REACH = 2 * CSA_RATIO  # two overlapping windows of 4 tokens
BOUNDARY_EXCHANGE = dev("core/transformer/experimental_attention_variant/csa_utils/cp_utils.py",
                        "_LeftBoundaryExchange.forward")


@rule(
    "V4011", "error", "every CP rank of DeepSeek-V4 attention holds a whole boundary window",
    source=BOUNDARY_EXCHANGE,
    why="""Under context parallelism each V4 attention layer sends the last max(window, compressor
    reach) rows of its input to the next CP rank (reach: 8 for CSA's overlapping windows, the ratio
    for HCA). Megatron raises at the first forward when a rank holds fewer rows than that window:
    the packed rows per CP rank, micro_batch_size · seq_length / CP, must reach it.""",
    bad=_V4_CP.replace("cp: 2", "cp: 4"),
    good=_V4_CP,
)
def v4_cp_boundary_window(f: Facts) -> Iterator[Violation]:
    if not f.v4_attention or f.par.cp <= 1:
        return
    ratios = set(f.model.compress_ratios or [])
    reach = max([CSA_REACH] * (CSA_RATIO in ratios) + [r for r in ratios if r > CSA_RATIO],
                default=0)
    window = max(f.model.csa_window_size or 0, reach)
    shards = f.par.cp * f.sequence_shards
    tokens = f.train.micro_batch_size * f.train.seq_length
    rows = tokens // shards
    if rows < window:
        yield Violation("parallel.cp", f"cp {f.par.cp} leaves {rows} packed rows per CP rank "
                        f"(micro_batch_size {f.train.micro_batch_size} · seq_length "
                        f"{f.train.seq_length} / {shards}), fewer than the boundary window "
                        f"{window} = max(csa_window_size, compressor reach)",
                        f"use cp <= {max(1, tokens // (window * f.sequence_shards))} or a longer "
                        "seq_length")


@rule(
    "V4012", "error", "DeepSeek-V4 features and main-only GTP / NCCL EP zero-copy are not in one Megatron",
    source=(f"{dev('core/transformer/transformer_config.py', 'TransformerConfig')}; Megatron-LM "
            "main@d98e8a64 megatron/core/transformer/transformer_config.py TransformerConfig"),
    why="""DeepSeek-V4 attention, hash routing, mHC and the deepepv2 backend exist only on
    Megatron-LM dev; GTP and NCCL EP's zero-copy path only on main. No one Megatron builds a config
    with both, and `emit` refuses it; so does check.""",
    bad=_V4_MODEL + "\nparallel: {gtp: 2}",
    good=_V4_MODEL,
)
def one_branch(f: Facts) -> Iterator[Violation]:
    dev_only, main_only = branch_features(f.cfg)
    # The CP and packing features are left to the GTP rules (GTP004, GTP009), which judge them with GTP.
    dev_only = [(path, what) for path, what in dev_only if path in V4_ONLY]
    if dev_only and main_only:
        path, what = main_only[0]
        yield Violation(path, f"{', '.join(w for _, w in main_only)} exist(s) only on Megatron-LM main, "
                        f"{', '.join(w for _, w in dev_only)} only on dev: no one Megatron runs both",
                        f"drop {what} to run on dev, or the dev-only feature(s) to run on main")


RULES = (
    v4_attention_tp1, v4_cp_needs_packing, v4_cp_contiguous, v4_cp_static, hash_forbids_ep_overlap,
    hash_needs_tid2eid_source, mhc_pp_with_ep_overlap, v4_without_node_limits,
    v4_compress_ratio_count, v4_compress_ratio_values, v4_cp_boundary_window, one_branch,
)

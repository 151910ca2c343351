"""DOP: the distributed optimizer, its instances, parameter-gather overlap, FSDP and loss reduction."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.hints import divisor_hint
from planner.rules.sources import DDP, PARALLEL_STATE, TRANSFORMER_CONFIG, VALIDATE_ARGS, dev

_INSTANCES_16 = """
parallel: {world_size: 16}
training: {use_distributed_optimizer: true, num_distributed_optimizer_instances: 2}
"""


@rule(
    "DOP001", "error", "optimizer instances divide DP·CP",
    source=PARALLEL_STATE,
    why="""Several distributed-optimizer instances cut every dense DP×CP group into I contiguous
    slices (inner shard, outer sync), so I must divide DP·CP.""",
    bad="training: {use_distributed_optimizer: true, num_distributed_optimizer_instances: 3}",
    good=_INSTANCES_16,
)
def instances_divide_dp_cp(f: Facts) -> Iterator[Violation]:
    instances, dp_cp = f.train.num_distributed_optimizer_instances, f.dp_cp_size
    if instances > 1 and dp_cp % instances:
        yield Violation("training.num_distributed_optimizer_instances",
                        f"num_distributed_optimizer_instances {instances} does not divide DP·CP = "
                        f"{f.dp}·{f.par.cp} = {dp_cp}",
                        f"choose a divisor of {dp_cp}{divisor_hint(dp_cp, instances)}")


@rule(
    "DOP002", "error", "optimizer instances divide EDP",
    source=PARALLEL_STATE,
    why="""The expert data-parallel group is cut into the same I instances ([EDP/I, I]
    hierarchy), so I must also divide EDP.""",
    bad="training: {use_distributed_optimizer: true, num_distributed_optimizer_instances: 2}",
    good=_INSTANCES_16,
)
def instances_divide_edp(f: Facts) -> Iterator[Violation]:
    instances, edp = f.train.num_distributed_optimizer_instances, f.edp
    if instances > 1 and edp % instances:
        yield Violation("training.num_distributed_optimizer_instances",
                        f"num_distributed_optimizer_instances {instances} does not divide EDP {edp}",
                        f"choose a divisor of {edp}{divisor_hint(edp, instances)}; or raise EDP")


@rule(
    "DOP003", "error", "several optimizer instances need the distributed optimizer",
    source=DDP,
    why="""Instances partition the distributed optimizer's shards; Megatron's DDP wrapper asserts
    that partial DistOpt is not used without DistOpt. (Argument validation passes; the job stops
    when the model is wrapped.) Megatron-FSDP turns the distributed optimizer on by itself.""",
    bad="""
    parallel: {world_size: 16}
    training: {num_distributed_optimizer_instances: 2}
    """,
    good=_INSTANCES_16,
)
def instances_need_distributed_optimizer(f: Facts) -> Iterator[Violation]:
    instances = f.train.num_distributed_optimizer_instances
    if instances > 1 and not f.train.use_distributed_optimizer and not f.fsdp:
        yield Violation("training.use_distributed_optimizer",
                        f"num_distributed_optimizer_instances {instances} without the distributed "
                        "optimizer", "set training.use_distributed_optimizer: true")


@rule(
    "DOP004", "error", "overlap_param_gather needs the distributed optimizer and grad-reduce overlap",
    source=VALIDATE_ARGS,
    why="""Parameter all-gathers exist only when the optimizer state is sharded (distributed
    optimizer or Megatron-FSDP), and their overlap is built on the gradient reduce-scatter
    overlap.""",
    bad="overlap: {overlap_param_gather: true}",
    good="""
    training: {use_distributed_optimizer: true}
    overlap: {overlap_param_gather: true, overlap_grad_reduce: true}
    """,
)
def param_gather_overlap_requirements(f: Facts) -> Iterator[Violation]:
    if not f.ovl.overlap_param_gather:
        return
    if not (f.train.use_distributed_optimizer or f.train.use_megatron_fsdp):
        yield Violation("training.use_distributed_optimizer",
                        "overlap_param_gather without the distributed optimizer",
                        "set training.use_distributed_optimizer: true")
    if not f.ovl.overlap_grad_reduce:
        yield Violation("overlap.overlap_grad_reduce", "overlap_param_gather without overlap_grad_reduce",
                        "set overlap.overlap_grad_reduce: true")


@rule(
    "DOP005", "error", "per-token loss excludes average-in-collective",
    source=DDP,
    why="""Per-token loss keeps SUM collectives and divides by the total number of valid tokens
    afterwards; an AVG collective would divide by the group size as well.""",
    bad="training: {calculate_per_token_loss: true, average_in_collective: true}",
    good="training: {calculate_per_token_loss: true, average_in_collective: false}",
)
def per_token_loss_sums(f: Facts) -> Iterator[Violation]:
    if f.train.calculate_per_token_loss and f.train.average_in_collective:
        yield Violation("training.average_in_collective",
                        "calculate_per_token_loss with average_in_collective",
                        "set training.average_in_collective: false")


@rule(
    "DOP006", "error", "torch FSDP2 needs PP = 1 and EP = 1",
    source=VALIDATE_ARGS,
    why="""Megatron's torch FSDP2 path supports neither pipeline nor expert parallelism; for MoE
    layouts use Megatron-FSDP or the distributed optimizer.""",
    bad="training: {use_torch_fsdp2: true}",
    good="""
    parallel: {pp: 1, ep: 1}
    training: {use_torch_fsdp2: true}
    """,
)
def torch_fsdp2_limits(f: Facts) -> Iterator[Violation]:
    if not f.train.use_torch_fsdp2:
        return
    for axis in ("pp", "ep"):
        size = getattr(f.par, axis)
        if size > 1:
            yield Violation(f"parallel.{axis}", f"use_torch_fsdp2 with {axis} {size}",
                            f"set parallel.{axis}: 1 or use use_megatron_fsdp / the distributed "
                            "optimizer")


@rule(
    "DOP007", "error", "Muon needs DDP or the distributed optimizer, not an FSDP",
    source=VALIDATE_ARGS,
    why="""Megatron's emerging optimizers (Muon) run on DDP buffers, alone or as the layer-wise
    distributed optimizer; validate_args asserts that neither Megatron-FSDP nor torch FSDP2 is on
    with them.""",
    bad="""
    training: {optimizer: muon, use_megatron_fsdp: true}
    """,
    good="training: {optimizer: muon, use_distributed_optimizer: true}",
)
def muon_without_fsdp(f: Facts) -> Iterator[Violation]:
    if f.train.optimizer != "muon":
        return
    for field in ("use_megatron_fsdp", "use_torch_fsdp2"):
        if getattr(f.train, field):
            yield Violation(f"training.{field}", f"optimizer muon with {field}",
                            f"set training.{field}: false (use_distributed_optimizer: true gives "
                            "Muon the layer-wise distributed optimizer) or optimizer: adam")


@rule(
    "DOP008", "error", "fp8_param_gather needs FP8 and a sharded parameter gather",
    source=f"{VALIDATE_ARGS}; {TRANSFORMER_CONFIG}",
    why="""With fp8_param_gather the FP8 weights are the parameters and the distributed
    optimizer's (or an FSDP's) parameter all-gather moves them in FP8: validate_args asserts the
    distributed optimizer, torch FSDP2 or Megatron-FSDP, and TransformerConfig refuses fp8_param
    without FP8. (Torch FSDP2 on Transformer Engine 2.x turns it off with a warning.)""",
    bad="training: {fp8_param_gather: true}",
    good="training: {fp8_format: e4m3, fp8_param_gather: true, use_distributed_optimizer: true}",
)
def fp8_param_gather_requirements(f: Facts) -> Iterator[Violation]:
    if not f.train.fp8_param_gather:
        return
    if not f.train.fp8:
        yield Violation("training.fp8_param_gather", "fp8_param_gather without FP8",
                        "set training.fp8_format (e4m3 or hybrid), or fp8_param_gather: false")
    if not (f.train.use_distributed_optimizer or f.fsdp):
        yield Violation("training.use_distributed_optimizer",
                        "fp8_param_gather without the distributed optimizer or an FSDP",
                        "set training.use_distributed_optimizer: true")


def muon_unpriced_matrices(f: Facts) -> list[str]:
    """The model's weight matrices whose shapes the time page's Muon term does not follow
    (planner/budget/optimizer_time.py prices standard attention's q, k, v and output, MLA's
    projections, the router, routed and shared experts, dense MLPs and MTP's projection): it prices
    these layers as standard attention's matrices."""
    m = f.model
    parts = [(m.attention_variant == "dsv4_hybrid", "DeepSeek-V4 attention (compressors, indexer, "
              "grouped output)"),
             ("mamba" in m.layer_mixers, "Mamba mixers"),
             (m.linear_attention_freq is not None, "gated delta-net layers"),
             (m.attention_variant == "mla" and m.dsa, "DSA's indexer"),
             (m.index_sparse_layers is not None, "the block-sparse indexer"),
             (m.attention_output_gate or m.head_wise_attn_gate, "the attention output gate"),
             (m.window_num_attention_heads is not None or m.window_num_query_groups is not None
              or m.window_kv_channels is not None or m.attention_k_eq_v
              or (m.attention_variant == "standard" and m.v_head_dim != m.kv_channels),
              "attention heads of their own width (window heads, value heads, K = V)"),
             (f.cfg.moe.moe_latent_size is not None, "latent MoE projections"),
             (f.train.muon_tp_mode == "distributed" and (f.par.tp > 1 or f.degrees.etp > 1),
              "tp_mode distributed's TP-sharded iteration (its all-reduce of X·Xᵀ every step)")]
    return [what for on, what in parts if on]


@rule(
    "DOP009", "warning", "Muon's update is priced on the standard layers' matrices only",
    source=dev("core/optimizer/emerging_optimizers.py", "TensorParallelMuon.orthogonalize"),
    why="""Muon orthogonalises each weight matrix's momentum with num_ns_steps Newton-Schulz
    iterations, three matrix products each, in a per-matrix Python loop (newton_schulz_tp). The
    time page prices them (time_muon_s: the GEMMs at their shapes, the loop's kernels at the host's
    time per launch) for the matrices of standard and MLA attention, routers, routed and shared
    experts, dense MLPs and MTP; the matrices of other mixers (DeepSeek-V4, Mamba, gated
    delta-net, indexers, gates, heads of their own width, latent MoE projections) are priced as
    standard attention's, so their orthogonalisation is approximate.""",
    bad="""
    model: {linear_attention_freq: 2}
    training: {optimizer: muon, use_distributed_optimizer: true}
    """,
    good="training: {optimizer: muon, use_distributed_optimizer: true}",
)
def muon_update_is_not_timed(f: Facts) -> Iterator[Violation]:
    if f.train.optimizer != "muon":
        return
    unpriced = muon_unpriced_matrices(f)
    if unpriced:
        yield Violation("training.optimizer", "optimizer muon: the step time prices Newton-Schulz "
                        "on " + ", ".join(unpriced) + " as on standard attention's matrices",
                        "read time_muon_s as approximate for those layers (`moeplan estimate "
                        "--explain time_muon_s`), or calibrate on a measured Muon run (`moeplan "
                        "calibrate LOG`); ignore DOP009 to accept it")


RULES = (
    instances_divide_dp_cp, instances_divide_edp, instances_need_distributed_optimizer,
    param_gather_overlap_requirements, per_token_loss_sums, torch_fsdp2_limits, muon_without_fsdp,
    fp8_param_gather_requirements, muon_update_is_not_timed,
)

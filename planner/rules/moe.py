"""MOE: token dispatchers, capacity and padding, the router, biases and group-limited routing."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import FLEX_DISPATCHER, NCCLEP_MANAGER, TRANSFORMER_CONFIG, dev, main

AUX_LOSS_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")
BIAS_SCORES = ("sigmoid", "sqrtsoftplus")
_FLEX = "moe_token_dispatcher_type: flex"
_NCCLEP = _FLEX + ", moe_flex_dispatcher_backend: ncclep, moe_expert_rank_capacity_factor: 1.5"


@rule(
    "MOE001", "error", "pad-to-capacity needs a capacity factor",
    source=TRANSFORMER_CONFIG,
    why="""Drop-and-pad fills every expert to exactly c = ceil(n·k/E · capacity_factor) rows; without
    a factor there is no capacity to pad to.""",
    bad="moe: {moe_pad_expert_input_to_capacity: true}",
    good="moe: {moe_pad_expert_input_to_capacity: true, moe_expert_capacity_factor: 1.0}",
)
def pad_needs_capacity(f: Facts) -> Iterator[Violation]:
    if f.moe.moe_pad_expert_input_to_capacity and f.moe.moe_expert_capacity_factor is None:
        yield Violation("moe.moe_expert_capacity_factor",
                        "moe_pad_expert_input_to_capacity is on but moe_expert_capacity_factor is unset",
                        "set moe.moe_expert_capacity_factor, e.g. 1.0, or turn padding off")


@rule(
    "MOE002", "error", "capacity factor only with aux-loss-type load balancing",
    source=TRANSFORMER_CONFIG,
    why="""Token dropping ranks assignments by router probability per expert; Megatron allows it
    only with the aux_loss, seq_aux_loss, global_aux_loss or none balancing types, not with
    sinkhorn.""",
    bad="moe: {moe_expert_capacity_factor: 1.0, moe_router_load_balancing_type: sinkhorn}",
    good="moe: {moe_expert_capacity_factor: 1.0, moe_router_load_balancing_type: aux_loss}",
)
def capacity_needs_aux_loss_type(f: Facts) -> Iterator[Violation]:
    kind = f.moe.moe_router_load_balancing_type
    if f.moe.moe_expert_capacity_factor is not None and kind not in AUX_LOSS_TYPES:
        yield Violation("moe.moe_router_load_balancing_type",
                        f"moe_expert_capacity_factor {f.moe.moe_expert_capacity_factor} with "
                        f"load balancing {kind}",
                        f"use one of {', '.join(AUX_LOSS_TYPES)} or drop the capacity factor")


@rule(
    "MOE003", "warning", "drop-and-pad with the ncclep backend: main rejects it, dev accepts it",
    source=main("core/transformer/moe/token_dispatcher.py", "MoEFlexTokenDispatcher.__init__")
    + "; " + NCCLEP_MANAGER,
    why="""Megatron-LM main rejects a capacity factor or pad-to-capacity with the NCCL EP backend
    of the flex dispatcher (dropless only). Megatron dev, the branch with the DeepSeek-V4 code,
    accepts it and bounds each rank's receive buffer with moe_expert_rank_capacity_factor
    (MOE018) instead. moeplan emits for dev when a config uses V4 features and for main when it
    uses GTP, so the verdict depends on the Megatron you launch.""",
    bad="moe: {" + _NCCLEP + ", moe_expert_capacity_factor: 1.0}",
    good="moe: {" + _NCCLEP + "}",
)
def ncclep_drop_and_pad(f: Facts) -> Iterator[Violation]:
    if f.flex_backend == "ncclep" and f.drop_and_pad:
        target = {"dev": "this config targets dev (DeepSeek-V4 features)",
                  "main": "this config targets main (GTP), where it fails"}.get(
                      f.megatron_branch, "on main it fails")
        yield Violation("moe.moe_expert_capacity_factor",
                        "flex backend ncclep with a capacity factor or pad-to-capacity: Megatron-LM "
                        f"main rejects it, dev accepts it; {target}",
                        "on main remove moe_expert_capacity_factor and "
                        "moe_pad_expert_input_to_capacity (or use the hybridep backend); on dev it "
                        "runs as configured")


@rule(
    "MOE004", "error", "the allgather dispatcher does not take variable sequence lengths",
    source=TRANSFORMER_CONFIG,
    why="""The allgather dispatcher gathers equally sized token blocks from every rank of the
    ETP×EP domain; packed or variable-length sequences (a sequence-packing scheduler turns them
    on) break that assumption.""",
    bad="""
    moe: {moe_token_dispatcher_type: allgather}
    training: {variable_seq_lengths: true}
    """,
    good="""
    moe: {moe_token_dispatcher_type: alltoall}
    training: {variable_seq_lengths: true}
    """,
)
def allgather_fixed_lengths(f: Facts) -> Iterator[Violation]:
    if f.moe.moe_token_dispatcher_type == "allgather" and f.variable_seq_lengths:
        why = ("sequence_packing_scheduler " + f.train.sequence_packing_scheduler
               if f.train.sequence_packing_scheduler else "variable_seq_lengths")
        yield Violation("moe.moe_token_dispatcher_type",
                        f"allgather dispatcher with variable sequence lengths ({why})",
                        "use moe_token_dispatcher_type alltoall or flex")


@rule(
    "MOE005", "error", "expert bias needs sigmoid or sqrtsoftplus scores",
    source=TRANSFORMER_CONFIG,
    why="""The load-control expert bias β is added to the scores for selection only
    (TopK(s + β)), DeepSeek's aux-loss-free balancing. Megatron supports it for the per-expert
    sigmoid and sqrt-softplus scores, not for softmax.""",
    bad="model: {moe_router_enable_expert_bias: true, moe_router_score_function: softmax}",
    good="model: {moe_router_enable_expert_bias: true, moe_router_score_function: sigmoid}",
)
def expert_bias_score_function(f: Facts) -> Iterator[Violation]:
    score = f.model.moe_router_score_function
    if f.model.moe_router_enable_expert_bias and score not in BIAS_SCORES:
        yield Violation("model.moe_router_score_function",
                        f"moe_router_enable_expert_bias with score function {score}",
                        "use moe_router_score_function sigmoid or sqrtsoftplus")


@rule(
    "MOE006", "error", "moe_apply_probs_on_input needs top-1 routing",
    source=dev("core/transformer/moe/experts.py", "TEGroupedMLP.forward"),
    why="""Megatron asserts top-1 when the routing weight scales the expert input instead of its
    output. Even then the two differ: SwiGLU is not linear, so f(g·x) is not g·f(x) and the option
    changes the model rather than reordering one product; with top-1 each token still has exactly
    one scaled branch, which is the case Megatron supports. With k > 1 every chosen expert would see
    a differently scaled copy of the token (Megatron-LM dev@d48bd6be
    megatron/core/transformer/moe/experts.py TEGroupedMLP.forward).""",
    bad="moe: {moe_apply_probs_on_input: true}",
    good="""
    model: {moe_router_topk: 1, moe_router_score_function: sigmoid}
    moe: {moe_apply_probs_on_input: true}
    """,
)
def probs_on_input_top1(f: Facts) -> Iterator[Violation]:
    if f.moe.moe_apply_probs_on_input and f.model.moe_router_topk != 1:
        yield Violation("moe.moe_apply_probs_on_input",
                        f"moe_apply_probs_on_input with moe_router_topk {f.model.moe_router_topk}",
                        "turn moe_apply_probs_on_input off or route top-1")


@rule(
    "MOE007", "error", "MoE linear biases need ETP = 1",
    source=TRANSFORMER_CONFIG,
    why="""With ETP > 1 the FC2 outputs are partial sums reduced over ETP; a bias added on every
    ETP rank would be counted ETP times.""",
    bad="""
    model: {add_bias_linear: true, moe_shared_expert_intermediate_size: 0}
    parallel: {ep: 2, etp: 2}
    """,
    good="""
    model: {add_bias_linear: true, moe_shared_expert_intermediate_size: 0}
    parallel: {ep: 4, etp: 1}
    """,
)
def moe_bias_needs_etp1(f: Facts) -> Iterator[Violation]:
    if f.model.add_bias_linear and f.etp > 1:
        yield Violation("parallel.etp", f"add_bias_linear with etp {f.etp}",
                        "set parallel.etp: 1 or add_bias_linear: false")


@rule(
    "MOE008", "error", "flex deepep/deepepv2/ncclep backends need ETP·EP > 1",
    source=FLEX_DISPATCHER,
    why="""DeepEP and NCCL EP are communication kernels over the ETP×EP domain; with a single
    rank in it they refuse to start.""",
    bad="""
    parallel: {ep: 1}
    moe: {moe_token_dispatcher_type: flex, moe_flex_dispatcher_backend: deepep}
    """,
    good="""
    parallel: {ep: 4}
    moe: {moe_token_dispatcher_type: flex, moe_flex_dispatcher_backend: deepep}
    """,
)
def flex_needs_ep_domain(f: Facts) -> Iterator[Violation]:
    backend = f.flex_backend
    if backend in ("deepep", "deepepv2", "ncclep") and f.degrees.tp_ep_size == 1:
        yield Violation("parallel.ep", f"flex backend {backend} with etp·ep = {f.etp}·{f.par.ep} = 1",
                        "raise ep or etp, or use the alltoall dispatcher")


@rule(
    "MOE009", "error", "experts divisible by router groups",
    source=TRANSFORMER_CONFIG,
    why="""Group-limited routing splits the E experts into moe_router_num_groups equal groups;
    Megatron checks the division whenever moe_router_group_topk turns that routing on.""",
    bad="model: {moe_router_num_groups: 3, moe_router_group_topk: 1}",
    good="model: {moe_router_num_groups: 4, moe_router_group_topk: 2}",
)
def experts_divisible_by_groups(f: Facts) -> Iterator[Violation]:
    groups, experts = f.model.moe_router_num_groups, f.model.num_experts
    if groups and f.model.moe_router_group_topk and experts % groups:
        yield Violation("model.moe_router_num_groups",
                        f"num_experts {experts} is not divisible by moe_router_num_groups {groups}",
                        "use a number of groups that divides num_experts")


@rule(
    "MOE010", "error", "group_topk at most the number of groups",
    source=TRANSFORMER_CONFIG,
    why="Group-limited routing first picks group_topk of the moe_router_num_groups groups.",
    bad="model: {moe_router_num_groups: 2, moe_router_group_topk: 4}",
    good="model: {moe_router_num_groups: 2, moe_router_group_topk: 1}",
)
def group_topk_within_groups(f: Facts) -> Iterator[Violation]:
    groups, topk = f.model.moe_router_num_groups, f.model.moe_router_group_topk
    if groups and topk and topk > groups:
        yield Violation("model.moe_router_group_topk",
                        f"moe_router_group_topk {topk} > moe_router_num_groups {groups}",
                        f"use a group_topk of at most {groups}")


@rule(
    "MOE011", "error", "group_topk needs moe_router_num_groups",
    source=TRANSFORMER_CONFIG,
    why="Group-limited routing is only defined once the experts are divided into groups.",
    bad="model: {moe_router_group_topk: 2}",
    good="model: {moe_router_group_topk: 2, moe_router_num_groups: 4}",
)
def group_topk_needs_groups(f: Facts) -> Iterator[Violation]:
    if f.model.moe_router_group_topk and not f.model.moe_router_num_groups:
        yield Violation("model.moe_router_num_groups",
                        f"moe_router_group_topk {f.model.moe_router_group_topk} without "
                        "moe_router_num_groups", "set moe_router_num_groups or drop group_topk")


@rule(
    "MOE012", "error", "the ncclep backend needs the flex dispatcher",
    source=TRANSFORMER_CONFIG,
    why="NCCL EP is a backend of the flex dispatcher; with another dispatcher it cannot be used.",
    bad="moe: {moe_token_dispatcher_type: alltoall, moe_flex_dispatcher_backend: ncclep}",
    good="moe: {" + _NCCLEP + "}",
)
def ncclep_needs_flex(f: Facts) -> Iterator[Violation]:
    kind = f.moe.moe_token_dispatcher_type
    if f.moe.moe_flex_dispatcher_backend == "ncclep" and kind != "flex":
        yield Violation("moe.moe_token_dispatcher_type", f"backend ncclep with the {kind} dispatcher",
                        "set moe_token_dispatcher_type: flex")


@rule(
    "MOE013", "error", "the deepep and deepepv2 backends do not pad to capacity",
    source=TRANSFORMER_CONFIG,
    why="""DeepEP's dispatch produces variable per-expert row counts; it has no drop-and-pad
    mode, so pad-to-capacity is rejected (hybridep supports it).""",
    bad="""
    moe: {moe_token_dispatcher_type: flex, moe_flex_dispatcher_backend: deepep,
          moe_expert_capacity_factor: 1.0, moe_pad_expert_input_to_capacity: true}
    """,
    good="""
    moe: {moe_token_dispatcher_type: flex, moe_flex_dispatcher_backend: hybridep,
          moe_expert_capacity_factor: 1.0, moe_pad_expert_input_to_capacity: true}
    """,
)
def deepep_no_padding(f: Facts) -> Iterator[Violation]:
    if f.flex_backend in ("deepep", "deepepv2") and f.moe.moe_pad_expert_input_to_capacity:
        yield Violation("moe.moe_pad_expert_input_to_capacity",
                        f"flex backend {f.flex_backend} with moe_pad_expert_input_to_capacity",
                        "turn padding off or use the hybridep backend")


@rule(
    "MOE014", "error", "top-1 softmax routing needs pre-softmax",
    source=TRANSFORMER_CONFIG,
    why="""Softmax over the single chosen expert always gives weight 1, so the gate would get no
    gradient; Megatron requires moe_router_pre_softmax for top-1 softmax routing.""",
    bad="model: {moe_router_topk: 1}",
    good="model: {moe_router_topk: 1, moe_router_pre_softmax: true}",
)
def top1_softmax_pre_softmax(f: Facts) -> Iterator[Violation]:
    m = f.model
    if (m.moe_router_topk == 1 and m.moe_router_score_function == "softmax"
            and not m.moe_router_pre_softmax and f.moe.moe_router_load_balancing_type != "sinkhorn"):
        yield Violation("model.moe_router_pre_softmax",
                        "moe_router_topk 1 with softmax scores and no pre-softmax",
                        "set moe_router_pre_softmax: true or use sigmoid scores")


@rule(
    "MOE015", "error", "top-k at most the number of experts",
    source=dev("core/transformer/moe/moe_utils.py", "topk_routing_with_score_function"),
    why="Each token picks k distinct routed experts out of E (I_t = TopK(s + β, k)).",
    bad="model: {moe_router_topk: 9}",
    good="model: {moe_router_topk: 8}",
)
def topk_within_experts(f: Facts) -> Iterator[Violation]:
    k, experts = f.model.moe_router_topk, f.model.num_experts
    if k > experts:
        yield Violation("model.moe_router_topk", f"moe_router_topk {k} > num_experts {experts}",
                        f"use moe_router_topk <= {experts}")


@rule(
    "MOE016", "error", "latent MoE excludes shared-expert overlap",
    source=dev("core/transformer/moe/moe_layer.py", "MoELayer.preprocess"),
    why="""Latent MoE wraps the dispatch in an h → latent projection and back; the overlapped
    shared expert is scheduled inside that same dispatch, and Megatron rejects the combination in
    training.""",
    bad="""
    moe: {moe_latent_size: 32}
    overlap: {moe_shared_expert_overlap: true}
    """,
    good="""
    moe: {moe_latent_size: 32}
    overlap: {moe_shared_expert_overlap: false}
    """,
)
def latent_without_shared_overlap(f: Facts) -> Iterator[Violation]:
    if f.moe.moe_latent_size and f.ovl.moe_shared_expert_overlap:
        yield Violation("overlap.moe_shared_expert_overlap",
                        f"moe_latent_size {f.moe.moe_latent_size} with moe_shared_expert_overlap",
                        "turn moe_shared_expert_overlap off")


@rule(
    "MOE017", "error", "sinkhorn routing takes no aux loss",
    source=dev("core/transformer/moe/router.py", "TopKRouter.sinkhorn_load_balancing"),
    why="Sinkhorn balances the load itself; an auxiliary loss coefficient must be zero.",
    bad="moe: {moe_router_load_balancing_type: sinkhorn, moe_aux_loss_coeff: 0.01}",
    good="moe: {moe_router_load_balancing_type: sinkhorn, moe_aux_loss_coeff: 0.0}",
)
def sinkhorn_without_aux_loss(f: Facts) -> Iterator[Violation]:
    if f.moe.moe_router_load_balancing_type == "sinkhorn" and f.moe.moe_aux_loss_coeff:
        yield Violation("moe.moe_aux_loss_coeff",
                        f"sinkhorn load balancing with moe_aux_loss_coeff {f.moe.moe_aux_loss_coeff}",
                        "set moe_aux_loss_coeff: 0")


@rule(
    "MOE018", "error", "the ncclep backend needs moe_expert_rank_capacity_factor",
    source=NCCLEP_MANAGER,
    why="""Megatron dev sizes the NCCL EP receive buffer of every rank once, as
    ceil64(local tokens) · ETP·k · moe_expert_rank_capacity_factor rows, and refuses the ncclep
    backend without the factor: tokens beyond that budget cannot be received. 1.0 is exactly the
    balanced load; leave headroom for routing imbalance.""",
    bad="moe: {" + _FLEX + ", moe_flex_dispatcher_backend: ncclep}",
    good="moe: {" + _NCCLEP + "}",
)
def ncclep_needs_rank_capacity(f: Facts) -> Iterator[Violation]:
    if f.flex_backend == "ncclep" and f.moe.moe_expert_rank_capacity_factor is None:
        yield Violation("moe.moe_expert_rank_capacity_factor",
                        "flex backend ncclep without moe_expert_rank_capacity_factor",
                        "set moe.moe_expert_rank_capacity_factor, e.g. 1.5 (1.0 receives exactly a "
                        "balanced load)")


OP_FUSER = "--use-transformer-engine-op-fuser"  # TransformerConfig.use_transformer_engine_op_fuser


@rule(
    "MOE019", "error", "moe_expert_rank_capacity_factor needs ncclep, or hybridep with the TE op fuser",
    source=TRANSFORMER_CONFIG,
    why="""The per-rank receive budget exists only in the hybridep and ncclep backends of the flex
    dispatcher; Megatron rejects it with any other backend, and with hybridep unless
    use_transformer_engine_op_fuser is on (`--use-transformer-engine-op-fuser` carried in
    launch.megatron_extra_args).""",
    bad="moe: {" + _FLEX + ", moe_flex_dispatcher_backend: deepep, moe_expert_rank_capacity_factor: 1.5}",
    good="moe: {" + _NCCLEP + "}",
)
def rank_capacity_needs_ncclep(f: Facts) -> Iterator[Violation]:
    factor = f.moe.moe_expert_rank_capacity_factor
    backend = f.flex_backend
    fuser = OP_FUSER in f.cfg.launch.megatron_extra_args
    if factor is None or backend == "ncclep" or (backend == "hybridep" and fuser):
        return
    if backend == "hybridep":
        yield Violation("moe.moe_expert_rank_capacity_factor",
                        f"moe_expert_rank_capacity_factor {factor} with backend hybridep needs "
                        f"{OP_FUSER}, which launch.megatron_extra_args does not carry",
                        f"add {OP_FUSER} to launch.megatron_extra_args, or use "
                        "moe_flex_dispatcher_backend: ncclep")
        return
    why = "is only read by the hybridep and ncclep backends"
    using = f"backend {backend}" if backend else f"dispatcher {f.moe.moe_token_dispatcher_type}"
    yield Violation("moe.moe_expert_rank_capacity_factor",
                    f"moe_expert_rank_capacity_factor {factor} with {using} {why}",
                    "remove moe_expert_rank_capacity_factor, or use moe_token_dispatcher_type: flex "
                    "with moe_flex_dispatcher_backend: ncclep")


@rule(
    "MOE020", "warning", "router groups without moe_router_group_topk are ignored",
    source=dev("core/transformer/moe/moe_utils.py", "topk_routing_with_score_function"),
    why="""Megatron turns group-limited routing on only when moe_router_group_topk is set; the
    number of groups alone changes nothing (it is not even checked against the experts), so the
    model routes over all experts.""",
    bad="model: {moe_router_num_groups: 4}",
    good="model: {moe_router_num_groups: 4, moe_router_group_topk: 2}",
)
def groups_without_group_topk(f: Facts) -> Iterator[Violation]:
    groups = f.model.moe_router_num_groups
    if groups and not f.model.moe_router_group_topk:
        yield Violation("model.moe_router_group_topk",
                        f"moe_router_num_groups {groups} without moe_router_group_topk: Megatron "
                        "ignores the groups", "set moe_router_group_topk or drop moe_router_num_groups")


# Both dimensions of a quantised expert weight must be multiples of these (the 16-byte alignment
# of Transformer Engine's FP8/FP4 GEMMs: 16 FP8 values, 32 FP4 values; Megatron-LM dev@d48bd6be
# megatron/core/fp4_utils.py get_fp4_align_size explains the 32).
WEIGHT_ALIGN = {"fp8": 16, "fp4": 32}


@rule(
    "MOE021", "warning", "quantised expert GEMMs need I/ETP and h aligned",
    source=dev("core/transformer/moe/experts.py", "TEGroupedMLP.__init__"),
    why="""Megatron pads the token dimension of each expert's rows for FP8/FP4 grouped GEMMs
    (quantization_padding, get_align_size_for_quantization), but not the weights: FC1 is
    [2·I/ETP, h] and FC2 [h, I/ETP] on each ETP rank, and the quantised GEMM kernels need both
    dimensions to be multiples of 16 FP8 (32 FP4) values. Megatron's config checks do not test
    this; the kernels fail at the first step, so the expert split must keep I/ETP aligned, as
    the DeepSeek-V4 Megatron write-up notes for ETP.""",
    bad="""
    model: {moe_ffn_hidden_size: 40}
    training: {fp8: true}
    """,
    good="""
    model: {moe_ffn_hidden_size: 48}
    training: {fp8: true}
    """,
)
def quantised_expert_dims_aligned(f: Facts) -> Iterator[Violation]:
    kind = "fp8" if f.train.fp8 else "fp4" if f.train.fp4 else None
    if kind is None:
        return
    align, width = WEIGHT_ALIGN[kind], f.model.moe_ffn_hidden_size // f.etp
    if width % align:
        yield Violation("model.moe_ffn_hidden_size",
                        f"moe_ffn_hidden_size / etp = {f.model.moe_ffn_hidden_size} / {f.etp} = "
                        f"{width}, not a multiple of {align} for {kind} GEMMs",
                        f"make moe_ffn_hidden_size / etp a multiple of {align}, or lower etp")
    if f.model.hidden_size % align:
        yield Violation("model.hidden_size", f"hidden_size {f.model.hidden_size} is not a multiple "
                        f"of {align} for {kind} GEMMs", f"use a hidden_size divisible by {align}")


RULES = (
    pad_needs_capacity, capacity_needs_aux_loss_type, ncclep_drop_and_pad, allgather_fixed_lengths,
    expert_bias_score_function, probs_on_input_top1, moe_bias_needs_etp1, flex_needs_ep_domain,
    experts_divisible_by_groups, group_topk_within_groups, group_topk_needs_groups,
    ncclep_needs_flex, deepep_no_padding, top1_softmax_pre_softmax, topk_within_experts,
    latent_without_shared_overlap, sinkhorn_without_aux_loss, ncclep_needs_rank_capacity,
    rank_capacity_needs_ncclep, groups_without_group_topk, quantised_expert_dims_aligned,
)

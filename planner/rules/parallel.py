"""PAR: the two device grids, divisibility of weights by their shard degrees, and the rank order."""

from __future__ import annotations

from collections.abc import Iterator
from math import prod

from planner.layout.rank_generator import GridError
from planner.layout.spec import dense_generator, expert_generator, order_dp_rule_holds, pp_group_mismatch
from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.hints import divisor_hint, multiple_hint
from planner.rules.sources import PARALLEL_STATE, RANK_GENERATOR, TRANSFORMER_CONFIG, VALIDATE_ARGS, dev

# The grid compares the pp groups as whole lists (as Megatron does), linear in N; 2^20 ranks take
# about a second, far beyond any real job.
PP_GROUP_LISTING_LIMIT = 1 << 20


@rule(
    "PAR001", "error", "world size divisible by TP·CP·PP·GTP (dense grid)",
    source=PARALLEL_STATE,
    why="""Attention ranks form the dense grid N = TP·CP·DP·PP·GTP. If N is not a multiple of
    TP·CP·PP·GTP the attention data-parallel size DP is a fraction and Megatron refuses to build
    any process group.""",
    bad="parallel: {world_size: 8, cp: 3}",
    good="parallel: {world_size: 8, cp: 2}",
)
def dense_grid_divides(f: Facts) -> Iterator[Violation]:
    if not f.dense_grid_ok:
        p, size = f.par, f.degrees.dense_model_size
        yield Violation(
            "parallel.world_size",
            f"world_size {f.world_size} is not divisible by TP·CP·PP·GTP = {p.tp}·{p.cp}·{p.pp}·{p.gtp}"
            f" = {size}, so DP = {f.world_size}/{size} is not a whole number",
            f"use a world size that is a multiple of {size}, e.g. "
            f"{multiple_hint(size, f.world_size)}, or change tp/cp/pp/gtp",
        )


@rule(
    "PAR002", "error", "world size divisible by ETP·EP·PP·EGTP (expert grid)",
    source=PARALLEL_STATE,
    why="""Routed experts use their own grid N = ETP·EP·EDP·PP·EGTP over the same ranks (MoE
    parallel folding). A world size that is not a multiple of ETP·EP·PP·EGTP leaves the
    expert data-parallel size EDP fractional and Megatron raises while building groups.""",
    bad="parallel: {world_size: 12, ep: 4}",
    good="parallel: {world_size: 16, ep: 4}",
)
def expert_grid_divides(f: Facts) -> Iterator[Violation]:
    if not f.expert_grid_ok:
        p, size = f.par, f.degrees.expert_model_size
        yield Violation(
            "parallel.world_size",
            f"world_size {f.world_size} is not divisible by ETP·EP·PP·EGTP = {f.etp}·{p.ep}·{p.pp}·"
            f"{p.egtp} = {size}, so EDP = {f.world_size}/{size} is not a whole number",
            f"use a world size that is a multiple of {size}, e.g. "
            f"{multiple_hint(size, f.world_size)}, or change etp/ep/pp/egtp",
        )


@rule(
    "PAR003", "error", "number of experts divisible by EP",
    source=dev("core/transformer/moe/moe_layer.py", "BaseMoELayer.__init__"),
    why="""Each EP rank owns a contiguous, equal block of E/EP experts (EP rank j holds experts
    j·E/EP … (j+1)·E/EP − 1). With E not a multiple of EP there is no such block.""",
    bad="model: {num_experts: 6}",
    good="model: {num_experts: 12}",
)
def experts_divisible_by_ep(f: Facts) -> Iterator[Violation]:
    experts, ep = f.model.num_experts, f.par.ep
    if experts % ep:
        yield Violation(
            "parallel.ep",
            f"num_experts {experts} is not divisible by ep {ep} ({experts}/{ep} experts per rank)",
            f"choose ep dividing {experts}{divisor_hint(experts, ep)}",
        )


@rule(
    "PAR004", "error", "moe_ffn_hidden_size divisible by ETP",
    source=dev("core/extensions/transformer_engine.py", "TEGroupedLinear"),
    why="""ETP shards every routed expert's FC1 columns and FC2 rows into I/ETP slices; the
    hidden size h is never split. An intermediate size I that ETP does not divide
    cannot be sharded.""",
    bad="""
    model: {moe_ffn_hidden_size: 50}
    parallel: {pp: 1, ep: 2, etp: 4}
    """,
    good="""
    model: {moe_ffn_hidden_size: 48}
    parallel: {pp: 1, ep: 2, etp: 4}
    """,
)
def expert_ffn_divisible_by_etp(f: Facts) -> Iterator[Violation]:
    size, etp = f.model.moe_ffn_hidden_size, f.etp
    if size % etp:
        yield Violation(
            "model.moe_ffn_hidden_size",
            f"moe_ffn_hidden_size {size} is not divisible by etp {etp}",
            f"choose etp dividing {size}{divisor_hint(size, etp)}; or a multiple of {etp} for "
            "moe_ffn_hidden_size",
        )


@rule(
    "PAR005", "error", "shared-expert size divisible by TP",
    source=dev("core/transformer/moe/shared_experts.py", "SharedExpertMLP"),
    why="""The shared expert uses the dense tensor-parallel layout (the attention TP group, not
    ETP), so its intermediate size is split TP ways.""",
    bad="""
    model: {moe_shared_expert_intermediate_size: 50}
    parallel: {tp: 4, sequence_parallel: true}
    """,
    good="""
    model: {moe_shared_expert_intermediate_size: 48}
    parallel: {tp: 4, sequence_parallel: true}
    """,
)
def shared_expert_divisible_by_tp(f: Facts) -> Iterator[Violation]:
    size, tp = f.model.moe_shared_expert_intermediate_size, f.par.tp
    if size and size % tp:
        yield Violation(
            "model.moe_shared_expert_intermediate_size",
            f"moe_shared_expert_intermediate_size {size} is not divisible by tp {tp}",
            f"choose tp dividing {size}{divisor_hint(size, tp)}; or a multiple of {tp} for the "
            "shared-expert size",
        )


@rule(
    "PAR006", "error", "attention heads divisible by TP",
    source=TRANSFORMER_CONFIG,
    why="Tensor parallelism gives each TP rank num_attention_heads/TP whole heads.",
    bad="""
    model: {num_attention_heads: 6, num_query_groups: 2}
    parallel: {tp: 4, sequence_parallel: true}
    """,
    good="""
    model: {num_attention_heads: 8, num_query_groups: 2}
    parallel: {tp: 4, sequence_parallel: true}
    """,
)
def heads_divisible_by_tp(f: Facts) -> Iterator[Violation]:
    heads, tp = f.model.num_attention_heads, f.par.tp
    if heads % tp:
        yield Violation(
            "model.num_attention_heads",
            f"num_attention_heads {heads} is not divisible by tp {tp}",
            f"choose tp dividing {heads}{divisor_hint(heads, tp)}",
        )
    window = f.model.window_num_attention_heads  # the window layers' own count splits alike
    if window is not None and window % tp:
        yield Violation(
            "model.window_num_attention_heads",
            f"window_num_attention_heads {window} is not divisible by tp {tp}",
            f"choose tp dividing {window}{divisor_hint(window, tp)}",
        )


@rule(
    "PAR007", "error", "query groups a multiple or a divisor of TP",
    source=TRANSFORMER_CONFIG,
    why="""With grouped-query attention the key/value groups are either split over TP ranks
    (groups a multiple of TP) or replicated onto them (groups a divisor of TP); anything else
    leaves a rank with a partial group.""",
    bad="""
    model: {num_attention_heads: 24, num_query_groups: 6}
    parallel: {tp: 4, sequence_parallel: true}
    """,
    good="""
    model: {num_attention_heads: 24, num_query_groups: 8}
    parallel: {tp: 4, sequence_parallel: true}
    """,
)
def query_groups_fit_tp(f: Facts) -> Iterator[Violation]:
    groups, tp = f.model.num_query_groups, f.par.tp
    if groups % tp and tp % groups:
        yield Violation(
            "model.num_query_groups",
            f"num_query_groups {groups} is neither a multiple nor a divisor of tp {tp}",
            f"choose tp dividing {groups}{divisor_hint(groups, tp)}; or a tp that is a multiple of "
            f"{groups}",
        )
    groups_w = f.model.window_num_query_groups  # the window layers' own KV groups split alike
    if groups_w is not None and groups_w % tp and tp % groups_w:
        yield Violation(
            "model.window_num_query_groups",
            f"window_num_query_groups {groups_w} is neither a multiple nor a divisor of tp {tp}",
            f"choose tp dividing {groups_w}{divisor_hint(groups_w, tp)}")


@rule(
    "PAR008", "error", "sequence parallelism on when TP > 1 (MoE training)",
    source=dev("core/transformer/moe/moe_layer.py", "MoELayer.forward"),
    why="""In training, Megatron's MoE layer raises when attention TP > 1 and sequence
    parallelism is off, whatever EP is. The argument check only warns, so the job fails at the
    first forward pass instead of at start-up. A model without MoE layers (no experts, or a
    moe_layer_freq list of zeros) trains TP without sequence parallelism.""",
    bad="parallel: {tp: 2}",
    good="parallel: {tp: 2, sequence_parallel: true}",
)
def sequence_parallel_with_tp(f: Facts) -> Iterator[Violation]:
    freq = f.model.moe_layer_freq
    has_moe_layers = bool(f.model.num_experts) and (not isinstance(freq, list) or any(freq))
    if has_moe_layers and f.par.tp > 1 and not f.par.sequence_parallel:
        yield Violation(
            "parallel.sequence_parallel",
            f"tp {f.par.tp} > 1 but sequence_parallel is off; the MoE layer rejects this in training",
            "set parallel.sequence_parallel: true",
        )


@rule(
    "PAR009", "error", "rank order is valid and names every axis of size > 1",
    source=RANK_GENERATOR,
    why="""Both rank generators lay out the axes in the order string. Megatron raises when an axis
    of size > 1 is not named (dense: tp, cp, dp, pp; expert: tp=ETP, ep, dp=EDP, pp), and rejects
    unknown or repeated names.""",
    bad="parallel: {order: tp-cp-dp-pp}",
    good="parallel: {order: tp-cp-ep-dp-pp}",
)
def order_names_every_axis(f: Facts) -> Iterator[Violation]:
    problems: list[str] = []
    for build in (dense_generator, expert_generator):
        try:
            build(f.grid_spec)
        except GridError as err:
            problems.extend(p for p in err.problems if p not in problems)
    for problem in problems:
        yield Violation("parallel.order", problem,
                        "name each of tp, cp, ep, dp, pp once, e.g. the default tp-cp-ep-dp-pp")


@rule(
    "PAR010", "error", "pp-dp order needs DP == EDP when PP > 1",
    source=PARALLEL_STATE,
    why="""Unless the order ends with pp (or PP = 1), Megatron asserts that the attention and the
    expert data-parallel sizes are equal: with pp inside the order the two generators would
    otherwise place pipeline stages on different ranks. This rejects `tp-cp-ep-pp-dp`
    (--use-tp-pp-dp-mapping) for most MoE layouts.""",
    bad="parallel: {order: tp-cp-ep-pp-dp}",
    good="parallel: {order: tp-cp-ep-pp-dp, cp: 4}",
)
def order_dp_matches_edp(f: Facts) -> Iterator[Violation]:
    if not order_dp_rule_holds(f.grid_spec):
        yield Violation(
            "parallel.order",
            f"order '{f.par.order}' does not end with pp, pp {f.par.pp} > 1 and DP {f.dp} != EDP "
            f"{f.edp}",
            "end the order with pp, e.g. tp-cp-ep-dp-pp, or choose degrees with TP·CP·GTP = "
            "ETP·EP·EGTP so that DP == EDP",
        )


@rule(
    "PAR011", "error", "dense and expert pipeline groups agree",
    source=PARALLEL_STATE,
    why="""Attention and experts of one layer live on the same pipeline stage, so both generators
    must produce identical pp groups (compared as whole lists). pp-last orders always agree; only
    custom orders with pp inside can differ, e.g. `tp-pp-cp-ep-dp` with TP != ETP.""",
    bad="parallel: {tp: 2, sequence_parallel: true, ep: 2, order: tp-pp-cp-ep-dp}",
    good="parallel: {tp: 2, sequence_parallel: true, ep: 2, order: tp-cp-ep-dp-pp}",
)
def pp_groups_agree(f: Facts) -> Iterator[Violation]:
    if not order_dp_rule_holds(f.grid_spec) or f.world_size > PP_GROUP_LISTING_LIMIT:
        return  # Megatron asserts PAR010 first; beyond the limit listing the groups is too slow
    mismatch = pp_group_mismatch(f.grid_spec)
    if mismatch is not None:
        dense, expert = mismatch
        yield Violation(
            "parallel.order",
            f"under order '{f.par.order}' the dense pp groups start {dense[:2]} but the expert pp "
            f"groups start {expert[:2]}",
            "end the order with pp, e.g. tp-cp-ep-dp-pp",
        )


@rule(
    "PAR012", "warning", "sequence parallelism with TP = 1 is ignored",
    source=VALIDATE_ARGS,
    why="""Sequence parallelism splits activations over the TP group; with TP = 1 there is no
    group and Megatron switches it off with a warning.""",
    bad="parallel: {sequence_parallel: true}",
    good="parallel: {sequence_parallel: false}",
)
def sequence_parallel_without_tp(f: Facts) -> Iterator[Violation]:
    if f.par.sequence_parallel and f.par.tp == 1:
        yield Violation("parallel.sequence_parallel", "sequence_parallel is on but tp is 1",
                        "remove sequence_parallel or raise tp")


@rule(
    "PAR013", "error", "hierarchical CP sizes multiply to CP",
    source=PARALLEL_STATE,
    why="""Hierarchical context parallelism cuts every CP group into nested levels; the level
    sizes must multiply to exactly CP.""",
    bad="parallel: {cp: 2, hierarchical_context_parallel_sizes: [2, 2]}",
    good="parallel: {cp: 2, hierarchical_context_parallel_sizes: [1, 2], cp_comm_type: a2a+p2p}",
)
def hierarchical_cp_product(f: Facts) -> Iterator[Violation]:
    sizes = f.par.hierarchical_context_parallel_sizes
    if sizes and prod(sizes) != f.par.cp:
        yield Violation(
            "parallel.hierarchical_context_parallel_sizes",
            f"hierarchical_context_parallel_sizes {sizes} multiply to {prod(sizes)}, not cp {f.par.cp}",
            f"give sizes whose product is {f.par.cp}",
        )


@rule(
    "PAR014", "error", "cp_comm_type a2a+p2p needs hierarchical CP sizes",
    source=VALIDATE_ARGS,
    why="""The a2a+p2p context-parallel exchange runs all-to-all inside the first hierarchy level
    and point-to-point across levels, so the levels must be given.""",
    bad="parallel: {cp: 2, cp_comm_type: a2a+p2p}",
    good="parallel: {cp: 2, cp_comm_type: a2a+p2p, hierarchical_context_parallel_sizes: [1, 2]}",
)
def a2a_p2p_needs_hierarchy(f: Facts) -> Iterator[Violation]:
    if f.par.cp_comm_type == "a2a+p2p" and not f.par.hierarchical_context_parallel_sizes:
        yield Violation("parallel.cp_comm_type", "cp_comm_type is a2a+p2p but "
                        "hierarchical_context_parallel_sizes is not set",
                        f"set hierarchical_context_parallel_sizes (product {f.par.cp}) or use "
                        "cp_comm_type p2p")


@rule(
    "PAR015", "error", "dynamic CP needs per-token loss and the default_dynamic_cp scheduler",
    source=VALIDATE_ARGS,
    why="""Dynamic context parallelism regroups the DP×CP ranks per batch by sequence length, so
    samples no longer contribute equally per rank: Megatron requires calculate_per_token_loss and
    its own packing scheduler, default_dynamic_cp (which it picks when none is set).""",
    bad="""
    parallel: {cp: 2, dynamic_context_parallel: true}
    training: {sequence_packing_scheduler: dp_balanced}
    """,
    good="""
    parallel: {cp: 2, dynamic_context_parallel: true}
    training: {calculate_per_token_loss: true}
    """,
)
def dynamic_cp_requirements(f: Facts) -> Iterator[Violation]:
    if not f.par.dynamic_context_parallel:
        return
    if not f.train.calculate_per_token_loss:
        yield Violation("training.calculate_per_token_loss",
                        "dynamic_context_parallel without calculate_per_token_loss",
                        "set training.calculate_per_token_loss: true")
    scheduler = f.train.sequence_packing_scheduler
    if scheduler not in (None, "default_dynamic_cp"):
        yield Violation("training.sequence_packing_scheduler",
                        f"dynamic_context_parallel with sequence_packing_scheduler {scheduler}",
                        "set training.sequence_packing_scheduler: default_dynamic_cp, or leave it unset")


@rule(
    "PAR016", "error", "hybrid / dynamic context parallelism needs an even DP·CP",
    source=PARALLEL_STATE,
    why="""Hybrid (and, on Megatron-LM dev, dynamic) context parallelism cuts every DP×CP group into
    power-of-two chunks and asserts that the group has an even number of ranks; an odd DP·CP stops
    Megatron while it builds the process groups.""",
    bad="parallel: {world_size: 4, pp: 4, ep: 1, hybrid_context_parallel: true}",
    good="parallel: {hybrid_context_parallel: true}",
)
def chunked_dp_cp_is_even(f: Facts) -> Iterator[Violation]:
    mode = f.grid_spec.dp_cp_chunks
    width = f.dp_cp_size
    if mode != "none" and width % 2:
        yield Violation(f"parallel.{mode}_context_parallel",
                        f"{mode}_context_parallel with DP·CP = {f.dp}·{f.par.cp} = {width}, which is odd",
                        "choose degrees that make DP·CP even, or turn it off")


@rule(
    "PAR017", "error", "the legacy torch checkpoint format does not shard experts by ETP",
    source="Megatron-LM dev@d48bd6be megatron/training/checkpointing.py save_checkpoint",
    why="""ckpt_format torch writes one file per TP, PP and EP rank and does not go through the
    sharded state dict, so expert weights split by an expert tensor-parallel size other than TP are
    saved as if split by TP: the checkpoint holds the wrong number of expert shards. Megatron's
    maintainers state the torch format lacks the ETP handling torch_dist has (NVIDIA/Megatron-LM
    GitHub issue #1719).""",
    bad="parallel: {tp: 2, etp: 1, sequence_parallel: true}\ntraining: {ckpt_format: torch}",
    good="parallel: {tp: 2, etp: 1, sequence_parallel: true}\ntraining: {ckpt_format: torch_dist}",
)
def torch_checkpoint_with_etp(f: Facts) -> Iterator[Violation]:
    if f.train.ckpt_format == "torch" and f.etp != f.par.tp and f.model.num_experts:
        yield Violation("training.ckpt_format", f"ckpt_format torch with etp {f.etp} ≠ tp {f.par.tp}: "
                        "expert shards are saved by TP rank, not ETP rank",
                        "use ckpt_format: torch_dist (the default), or etp equal to tp")


RULES = (
    dense_grid_divides, expert_grid_divides, experts_divisible_by_ep, expert_ffn_divisible_by_etp,
    shared_expert_divisible_by_tp, heads_divisible_by_tp, query_groups_fit_tp,
    sequence_parallel_with_tp, order_names_every_axis, order_dp_matches_edp, pp_groups_agree,
    sequence_parallel_without_tp, hierarchical_cp_product, a2a_p2p_needs_hierarchy,
    dynamic_cp_requirements, chunked_dp_cp_is_even, torch_checkpoint_with_etp,
)

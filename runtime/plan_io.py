"""Read a compiled plan and decide, before any process group forms, whether this runtime can run it.

The runtime never re-derives the layout: every group, every rank's coordinates, the expert
ownership, the gradient pre-scales and every config value (with its default) come from plan.json.
A plan from another version, a plan edited after compile, or a layout the runtime cannot execute
yet is refused here with a message naming the field, so nothing ever runs wrongly and no rank
waits on a group that will never form.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from planner.plan_format import PlanFileError, read_plan

# Every group the runtime creates, in the order all ranks create them.
RUNTIME_GROUP_NAMES = (
    "tp", "cp", "dp", "dp_cp", "pp", "ep", "expt_tp", "tp_ep", "expt_dp", "tp_dp_cp", "tp_cp",
    "embd",
)
# Groups that hold only some ranks (the embedding group: first stage, last stage when tied).
PARTIAL_GROUP_NAMES = frozenset({"embd"})


class PlanError(Exception):
    """A plan this runtime must not run; the message says why and what to change."""


def required(section: Mapping[str, Any], key: str, where: str) -> Any:
    """A value the compiled plan always holds (the compiler dumps every field, defaults included).

    The runtime never substitutes a default of its own: a second copy of a default drifts from
    the schema's. A missing key means a plan from another moeplan or one edited by hand.
    """
    if key not in section:
        raise PlanError(f"the plan has no {where}.{key}: it was written by another moeplan or "
                        "edited; recompile the config")
    return section[key]


# The planner's gradient pre-scale budgets (the formula book's scaling page) are named
# grad_scale_{sum,avg}_{dense,expert}; under per-token loss the step also applies this one.
PER_TOKEN_SCALE_BUDGET = "grad_scale_per_token"


@dataclass(frozen=True)
class GradScales:
    """How one step's gradients are scaled around their reductions, as the plan computed it.

    `dense`/`expert` multiply the local grads before the dp_cp / expt_dp all-reduce (`average`:
    the collective is an AVG, else a SUM); `per_token` multiplies every grad after it when the
    loss is a per-token sum (1 / tokens of the step), None otherwise.
    """

    dense: float
    expert: float
    average: bool
    per_token: float | None
    # The loss-scale chain and the buffer split (the scaling page's loss_scale_microbatch,
    # loss_scale_mtp and expert_grad_buffers): what a microbatch's loss and MTP term are multiplied
    # by before backward, and whether routed experts are reduced apart from the dense buffer.
    loss: float = 1.0
    mtp_loss: float = 1.0
    expert_buffer: bool = True


@dataclass(frozen=True)
class ExpertOwnership:
    """The routed experts one rank holds, as the plan lists them (global ids, in local order)."""

    first: int
    ids: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class Plan:
    """The parts of plan.json the runtime consumes, with the raw document kept for the report."""

    raw: dict[str, Any]

    @property
    def digest(self) -> str:
        return str(self.raw["digest"])

    @property
    def layout(self) -> dict[str, Any]:
        return self.raw["layout"]

    @property
    def padded_vocab_size(self) -> int:
        """Embedding/head rows: the planner's padded vocabulary (Megatron pads to 128·TP)."""
        return int(self.layout["padded_vocab_size"])

    @property
    def model(self) -> dict[str, Any]:
        return self.raw["config"]["model"]

    @property
    def moe(self) -> dict[str, Any]:
        return self.raw["config"]["moe"]

    @property
    def training(self) -> dict[str, Any]:
        return self.raw["config"]["training"]

    @property
    def parallel(self) -> dict[str, Any]:
        return self.raw["config"]["parallel"]

    @property
    def world_size(self) -> int:
        return int(self.layout["world_size"])

    @property
    def microbatches(self) -> int:
        return int(self.layout["microbatches"])

    @property
    def groups(self) -> dict[str, list[list[int]]]:
        return self.raw["groups"]

    def rank_info(self, rank: int) -> dict[str, Any]:
        for entry in self.raw["ranks"]:
            if entry["rank"] == rank:
                return entry
        raise PlanError(f"plan has no entry for rank {rank} in 'ranks'")

    def expert_ownership(self, rank: int) -> ExpertOwnership:
        """The experts the plan assigns to `rank`; the runtime builds exactly these."""
        owned = required(self.rank_info(rank), "experts", f"ranks[{rank}]")
        ids = tuple(int(e) for e in required(owned, "ids", f"ranks[{rank}].experts"))
        first = int(required(owned, "first", f"ranks[{rank}].experts"))
        count = int(required(owned, "count", f"ranks[{rank}].experts"))
        if count != len(ids) or (ids and first != ids[0]):
            raise PlanError(f"ranks[{rank}].experts is inconsistent (first {first}, count {count}, "
                            f"ids {list(ids)}): recompile the config")
        return ExpertOwnership(first, ids)

    def budget(self, name: str) -> Fraction:
        """A step-wide budget (scope 'all ranks') the planner computed, as an exact fraction."""
        for entry in required(self.raw, "budgets", "plan"):
            if entry.get("name") == name and entry.get("stage") is None:
                return Fraction(str(entry["value"]))
        raise PlanError(f"the plan has no budget {name!r}: it was written by another moeplan "
                        "or edited; recompile the config")

    @property
    def grad_scales(self) -> GradScales:
        """The plan's gradient pre-scales for this step's loss mode (never recomputed here)."""
        average = bool(required(self.training, "average_in_collective", "config.training"))
        per_token = bool(required(self.training, "calculate_per_token_loss", "config.training"))
        mode = "avg" if average and not per_token else "sum"
        return GradScales(
            dense=float(self.budget(f"grad_scale_{mode}_dense")),
            expert=float(self.budget(f"grad_scale_{mode}_expert")),
            average=average,
            per_token=float(self.budget(PER_TOKEN_SCALE_BUDGET)) if per_token else None,
            loss=float(self.budget("loss_scale_microbatch")),
            mtp_loss=float(self.budget("loss_scale_mtp")),
            expert_buffer=bool(self.budget("expert_grad_buffers")),
        )

    @property
    def pp(self) -> int:
        return int(required(self.layout, "pp", "layout"))

    def moe_layers(self) -> list[int]:
        """Layers that hold an MoE block, over every stage."""
        return sorted(layer for stage in self.raw["stages"] for layer in stage["moe_layers"])

    def hash_layers(self) -> list[int]:
        return sorted(layer for stage in self.raw["stages"] for layer in stage["hash_layers"])

    def chunks(self, stage: int) -> list[dict[str, Any]]:
        """The model chunks (virtual stages) of one pipeline stage, in virtual order."""
        for entry in self.raw["stages"]:
            if int(entry["stage"]) == stage:
                return sorted(entry["chunks"], key=lambda chunk: int(chunk["virtual"]))
        raise PlanError(f"plan has no stage {stage} in 'stages': recompile the config")


def load_plan(path: str | Path) -> Plan:
    """Integrity (format, version, digest: the planner's own reader), then structure, then what
    the runtime can run; raise PlanError with a user-facing message."""
    try:
        document = read_plan(path)
    except PlanFileError as exc:
        raise PlanError(str(exc)) from None
    return check_plan(document, source=str(path))


def check_plan(document: dict[str, Any], source: str = "plan") -> Plan:
    """Structure and runnability of an already integrity-checked plan document."""
    missing = [key for key in ("config", "layout", "stages", "groups", "ranks") if key not in document]
    if missing:
        raise PlanError(f"{source} lacks {', '.join(missing)}: recompile the config")
    plan = Plan(document)
    try:
        _check_structure(plan, source)
        _check_plan_values(plan)
        problems = unsupported_features(plan)
        if not problems:  # a plan the runtime cannot run anyway says why first
            _check_degrees(plan, source)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlanError(f"{source} is malformed ({type(exc).__name__}: {exc}): recompile the "
                        "config") from None
    if problems:
        listed = "\n".join(f"  - {problem}" for problem in problems)
        raise PlanError(f"the runtime cannot run {source} yet:\n{listed}")
    return plan


def _check_structure(plan: Plan, source: str) -> None:
    """Every group the runtime forms must be in the plan and cover each rank exactly once."""
    world = plan.world_size
    for name in RUNTIME_GROUP_NAMES:
        groups = plan.groups.get(name)
        if groups is None:
            raise PlanError(f"{source} has no {name!r} group list: recompile the config")
        covered = sorted(rank for ranks in groups for rank in ranks)
        if name in PARTIAL_GROUP_NAMES:
            if len(set(covered)) != len(covered) or not set(covered) <= set(range(world)):
                raise PlanError(f"{source}: the {name!r} groups hold unknown or repeated ranks: "
                                "recompile the config")
        elif covered != list(range(world)):
            raise PlanError(f"{source}: the {name!r} groups do not cover ranks 0..{world - 1} "
                            "exactly once: recompile the config")
    ranks = sorted(entry.get("rank", -1) for entry in plan.raw["ranks"])
    if ranks != list(range(world)):
        raise PlanError(f"{source}: 'ranks' does not list ranks 0..{world - 1}: recompile the config")


# Each group kind the runtime forms, the coordinates that stay fixed inside one of its groups and
# the coordinate that orders it, as the plan's own `ranks` rows state them (planner/plan.py _ranks).
_GROUP_COORDINATES: dict[str, tuple[tuple[str, ...], str, str]] = {
    "tp": (("stage", "cp_rank", "dp_rank"), "tp_rank", "tp"),
    "cp": (("stage", "tp_rank", "dp_rank"), "cp_rank", "cp"),
    "dp": (("stage", "tp_rank", "cp_rank"), "dp_rank", "dp"),
    "pp": (("tp_rank", "cp_rank", "dp_rank"), "stage", "pp"),
    "ep": (("stage", "etp_rank", "edp_rank"), "ep_rank", "ep"),
    "expt_tp": (("stage", "ep_rank", "edp_rank"), "etp_rank", "etp"),
    "expt_dp": (("stage", "ep_rank", "etp_rank"), "edp_rank", "edp"),
}


def _check_degrees(plan: Plan, source: str) -> None:
    """The plan's groups against its own declared degrees and rank coordinates (a consistency
    check, not a re-derivation): every group of a kind has the kind's degree of ranks, holds
    exactly the ranks whose other coordinates agree, in the order of the kind's own coordinate.
    A plan whose groups were re-paired (and re-digested) is refused naming the group."""
    if any(int(plan.layout.get(axis, 1)) != 1 for axis in ("gtp", "egtp")):
        return  # GTP adds an axis these rows do not carry (the runtime refuses GTP plans anyway)
    rows = {int(entry["rank"]): entry for entry in plan.raw["ranks"]}
    for kind, (fixed, order, degree) in _GROUP_COORDINATES.items():
        size = int(plan.layout[degree])
        for index, group in enumerate(plan.groups.get(kind, [])):
            where = f"{source}: {kind} group {index} {list(group)[:8]}"
            if len(group) != size:
                raise PlanError(f"{where} has {len(group)} ranks, the plan declares {degree} = {size}: "
                                "recompile the config")
            keys = {tuple(rows[r][c] for c in fixed) for r in group}
            positions = [rows[r][order] for r in group]
            if len(keys) != 1 or positions != list(range(size)):
                raise PlanError(f"{where} does not match the plan's rank coordinates ({', '.join(fixed)} "
                                f"must agree, {order} run 0..{size - 1}): the groups were edited; "
                                "recompile the config")


def _check_plan_values(plan: Plan) -> None:
    """What the runtime reads instead of recomputing must be there before any group forms: the
    gradient pre-scales and every rank's expert ownership."""
    _ = plan.grad_scales
    for rank in range(plan.world_size):
        plan.expert_ownership(rank)


def pipeline_problems(plan: Plan) -> list[str]:
    """What torch.distributed.pipelining's schedules (1F1B, interleaved 1F1B) cannot run."""
    pp, vpp, m = plan.pp, int(required(plan.layout, "vpp", "layout")), plan.microbatches
    problems = []
    if vpp > 1 and pp == 1:
        problems.append(f"layout.vpp = {vpp}: virtual pipeline stages need PP > 1; use vpp = 1")
    if pp > 1 and vpp == 1 and m < pp:
        problems.append(f"layout.microbatches = {m} < pp = {pp}: torch's 1F1B schedule needs at "
                        "least one microbatch per stage; raise global_batch_size")
    group = required(plan.parallel, "microbatch_group_size_per_vp_stage", "config.parallel")
    group = pp if group is None else int(group)  # None: Megatron groups by pp
    if vpp > 1 and group != pp:
        problems.append(f"parallel.microbatch_group_size_per_vp_stage = {group}: torch's "
                        f"interleaved 1F1B groups microbatches by pp = {pp}; leave it unset")
    if pp > 1:
        chunks = {stage: len(plan.chunks(stage)) for stage in range(pp)}
        if set(chunks.values()) != {vpp}:
            problems.append(f"stages: chunks per stage {chunks} differ from vpp = {vpp}: "
                            "recompile the config")
    return problems


def tensor_parallel_problems(plan: Plan) -> list[str]:
    """What the runtime's TP split (runtime/tensor_parallel.py) cannot run, or Megatron refuses."""
    tp = int(required(plan.layout, "tp", "layout"))
    if tp == 1:
        return []
    model = plan.model

    def value(key: str) -> Any:
        return required(model, key, "config.model")

    sp = bool(required(plan.parallel, "sequence_parallel", "config.parallel"))
    problems = []
    mode = required(plan.parallel, "cp_partition_mode", "config.parallel")
    if int(value("mtp_num_layers")) > 0 and sp and mode == "contiguous" and int(
            required(plan.layout, "cp", "layout")) > 1:
        problems.append(f"model.mtp_num_layers with layout.tp = {tp}, sequence parallelism and "
                        "contiguous CP: Megatron refuses it (megatron/core/transformer/"
                        "transformer_config.py TransformerConfig.__post_init__); use zigzag CP")
    if plan.moe_layers() and not sp:
        problems.append(f"layout.tp = {tp} with MoE layers and parallel.sequence_parallel false: "
                        "Megatron refuses to train it (megatron/core/transformer/moe/moe_layer.py "
                        "MoELayer.forward); set parallel.sequence_parallel: true")
    shares = [("num_attention_heads", int(value("num_attention_heads"))),
              ("num_query_groups", int(value("num_query_groups"))),
              ("ffn_hidden_size", int(value("ffn_hidden_size")))]
    if flagged_layers(model.get("mamba_layers")):  # unset heads: d_inner 2·h / head_dim
        heads = value("mamba_num_heads") or 2 * int(value("hidden_size")) // int(
            value("mamba_head_dim"))
        shares += [("mamba_num_heads", int(heads)),
                   ("mamba_num_groups", int(value("mamba_num_groups")))]
    for field, count in shares:
        if count % tp:
            problems.append(f"model.{field} = {count} does not split over layout.tp = {tp}: "
                            "use a multiple of tp")
    cp = int(required(plan.layout, "cp", "layout"))
    rows = int(required(plan.training, "seq_length", "config.training")) // cp
    if sp and rows % tp:
        problems.append(f"training.seq_length / cp = {rows} rows per CP rank do not split into "
                        f"layout.tp = {tp} sequence-parallel shares")
    return problems


def unsupported_features(plan: Plan) -> list[str]:
    """Everything in the plan that this runtime would otherwise run wrongly, one line each."""
    def section(where: str, values: dict[str, Any]) -> Callable[[str], Any]:
        return lambda key: required(values, key, where)

    layout = section("layout", plan.layout)
    model, moe = section("config.model", plan.model), section("config.moe", plan.moe)
    training = section("config.training", plan.training)
    parallel = section("config.parallel", plan.parallel)
    problems: list[str] = []

    def refuse(condition: bool, message: str) -> None:
        if condition:
            problems.append(message)

    for axis, why in (("gtp", "GTP weight rematerialisation"),
                      ("egtp", "expert GTP weight rematerialisation")):
        size = int(layout(axis))
        refuse(size > 1, f"layout.{axis} = {size}: {why} is not implemented; use {axis} = 1")
    problems.extend(tensor_parallel_problems(plan))
    problems.extend(pipeline_problems(plan))
    dispatcher = moe("moe_token_dispatcher_type")
    refuse(dispatcher not in ("alltoall", "allgather"),
           f"moe.moe_token_dispatcher_type = {dispatcher!r}: only 'alltoall' and 'allgather' run here")
    placed = sorted(int(depth) for stage in plan.raw["stages"] for chunk in stage["chunks"]
                    for depth in chunk["mtp_layers"])
    depths = int(model("mtp_num_layers"))
    refuse(placed != list(range(depths)), f"stages place MTP depths {placed} but "
           f"model.mtp_num_layers = {depths}: recompile the config")
    off_loss = sorted(int(chunk["index"]) for stage in plan.raw["stages"]
                      for chunk in stage["chunks"] if chunk["mtp_layers"] and not chunk["loss"])
    refuse(bool(off_loss), f"stages: MTP layers on chunk(s) {off_loss} without the loss (L): the "
           "runtime runs MTP after the main model's final norm, in the loss chunk; put every 'm' "
           "in the last stage of parallel.pipeline_model_parallel_layout")
    variant = model("attention_variant")
    refuse(variant != "standard", f"model.attention_variant = {variant!r}: the runtime's decoder has "
           "standard causal attention only; use 'standard'" + (
               " (DeepSeek-V4 attention's CP exchanges, step.cp_boundary_hidden / "
               "cp_compressed_kv_gather / cp_indexer_k_gather, are predicted only)"
               if variant == "dsv4_hybrid" else ""))
    position = model("position_embedding_type")
    refuse(position not in ("rope", "none"), f"model.position_embedding_type = {position!r}: the "
           "runtime's attention applies RoPE on every layer or none (NoPE); use 'rope' or 'none'")
    refuse(model("rope_type") == "yarn", "model.rope_type = 'yarn': YaRN is not implemented; the "
           "runtime's attention uses plain RoPE with model.rotary_base")
    refuse(bool(model("enable_hyper_connections")),
           "model.enable_hyper_connections: mHC residual streams are not implemented")
    refuse(bool(model("add_bias_linear")) and int(layout("etp")) > 1,
           "model.add_bias_linear with layout.etp > 1: the routed experts' FC2 bias under expert "
           "tensor parallelism is not implemented; use etp = 1")
    shape = plan.model
    refuse(shape.get("normalization", "RMSNorm") != "RMSNorm",
           "model.normalization: the runtime's blocks use RMSNorm only")
    problems.extend(attention_mechanism_problems(plan.model))
    refuse(shape.get("window_size") is not None and int(model("mtp_num_layers")) > 0,
           "model.window_size with model.mtp_num_layers > 0: which MTP blocks are windowed is not "
           "implemented; drop one of them for the runtime")
    refuse(bool(shape.get("qk_layernorm")), "model.qk_layernorm: q/k norms are not implemented")
    refuse(bool(shape.get("moe_shared_expert_gate")),
           "model.moe_shared_expert_gate: the shared-expert gate is not implemented")
    refuse(model("moe_router_num_groups") is not None,
           "model.moe_router_num_groups: group-limited routing is not implemented")
    refuse(bool(model("moe_router_pre_softmax")),
           "model.moe_router_pre_softmax: pre-softmax top-k is not implemented")
    precision = training("precision")
    refuse(precision not in ("fp32", "bf16"), f"training.precision = {precision!r}: fp16 needs "
           "Megatron's dynamic loss scaler, which the runtime does not implement; use bf16 or fp32")
    states = [key for key in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
              if plan.training.get(key, "fp32") != "fp32"]  # older plans: fp32
    refuse(bool(states), f"training.{states[0] if states else ''}: the runtime keeps main params "
           "and AdamW's moments in fp32; leave the precision-aware optimizer's state dtypes fp32")
    refuse(bool(training("fp8")) or bool(training("fp4")),
           "training.fp8/fp4: low-precision GEMMs are not implemented")
    refuse(bool(training("calculate_per_token_loss")) and bool(
        training("average_in_collective")), "training.calculate_per_token_loss with "
           "average_in_collective: per-token loss must SUM in the collective (as Megatron asserts)")
    refuse(bool(training("variable_seq_lengths")),
           "training.variable_seq_lengths: the runtime packs fixed-length sequences")
    optimizer = training("optimizer")
    refuse(optimizer != "adam", f"training.optimizer = {optimizer!r}: only 'adam' (AdamW) runs here")
    refuse(int(training("num_distributed_optimizer_instances")) > 1,
           "training.num_distributed_optimizer_instances > 1 is not implemented")
    refuse(bool(training("use_megatron_fsdp")) or bool(training("use_torch_fsdp2")),
           "training.use_megatron_fsdp/use_torch_fsdp2: FSDP is not implemented")
    refuse(bool(moe("moe_virtual_experts")), "moe.moe_virtual_experts is not implemented")
    refuse(bool(moe("moe_apply_probs_on_input")),
           "moe.moe_apply_probs_on_input: probs are applied after the activation only")
    balancing = moe("moe_router_load_balancing_type")
    refuse(balancing not in ("aux_loss", "seq_aux_loss", "none"),
           f"moe.moe_router_load_balancing_type = {balancing!r}: only aux_loss, seq_aux_loss and none")
    policy = moe("moe_token_drop_policy")
    refuse(policy != "probs", f"moe.moe_token_drop_policy = {policy!r}: only 'probs' is implemented")
    source = moe("moe_tid2eid_source")
    refuse(int(model("moe_n_hash_layers")) > 0 and source not in (None, "seeded"),
           f"moe.moe_tid2eid_source = {source!r}: loading tid2eid from a checkpoint is not "
           "implemented; use 'seeded' (a table drawn from the seed)")
    refuse(bool(moe("moe_pad_expert_input_to_capacity")) and dispatcher == "allgather",
           "moe.moe_pad_expert_input_to_capacity with the allgather dispatcher is not implemented")
    problems.extend(ownership_problems(plan, int(model("num_experts"))))

    cp = int(layout("cp"))
    overlap = section("config.overlap", required(plan.raw["config"], "overlap", "config"))
    refuse(overlap("recompute_granularity") == "selective" and cp > 1 and "core_attn" in (
        overlap("recompute_modules") or ["core_attn"]), "overlap.recompute_modules with "
           "core_attn and cp > 1: re-running only core attention (its CP K/V gather) is not "
           "implemented; recompute 'full' or other modules")
    mamba = list(flagged_layers(shape.get("mamba_layers")))
    refuse(bool(mamba) and cp > 1, f"model.mamba_layers (Mamba-2 mixers on layers {mamba}) with "
           f"layout.cp = {cp}: the mixer's CP all-to-all (Megatron's MambaContextParallel) is not "
           "implemented; use cp = 1")
    seq = int(training("seq_length"))
    mode = parallel("cp_partition_mode")
    chunks = 2 * cp if (cp > 1 and mode == "zigzag") else cp
    refuse(seq % chunks != 0, f"training.seq_length = {seq} does not split into {chunks} equal CP "
           f"chunks ({mode} layout, cp = {cp})")
    heads, groups = int(model("num_attention_heads")), int(model("num_query_groups"))
    refuse(heads % groups != 0, f"model.num_attention_heads = {heads} is not a multiple of "
           f"model.num_query_groups = {groups}")
    return problems


# Attention and position mechanisms the planner budgets but the runtime's decoder does not run:
# (field, the value that means "off", what the runtime would otherwise silently leave out).
UNRUN_ATTENTION_FIELDS = (
    ("attention_chunk_size", None, "chunked attention"),
    ("window_num_attention_heads", None, "window layers' own query-head count"),
    ("window_num_query_groups", None, "window layers' own KV groups"),
    ("full_attention_softmax_type", None, "sinks on window layers only"),
    ("window_kv_channels", None, "window layers' own head width"),
    ("index_sparse_layers", None, "block-sparse attention layers"),
    ("kda_layers", None, "Kimi Delta Attention layers"),
    ("attention_k_eq_v", False, "full-attention layers whose V is their K"),
    ("post_sublayer_norms", False, "norms on the sub-layer outputs"),
    ("moe_branch_norms", False, "an MoE layer's own branch norms and router scales"),
    ("no_rope_freq", None, "NoPE layers"),
    ("rotary_percent", 1.0, "partial rotary embeddings"),
    ("qk_l2_norm", False, "L2 q/k norms"),
    ("qk_layernorm_per_layer", False, "per-layer q/k norms"),
    ("linear_attention_freq", None, "gated DeltaNet linear attention"),
    ("attention_output_gate", False, "the attention output gate"),
    ("head_wise_attn_gate", False, "the head-wise attention gate"),
    ("dsa", False, "DeepSeek sparse attention"),
)


def flagged_layers(flags: list[int] | None) -> tuple[int, ...]:
    """The ids of the layers a 0/1-per-layer list marks (model.mamba_layers, mixer_only_layers)."""
    return tuple(layer for layer, flag in enumerate(flags or []) if flag)


def attention_mechanism_problems(model: dict[str, Any]) -> list[str]:
    """A refusal for every attention mechanism the plan turns on that the runtime does not run
    (a plan written before a field existed lacks it and has the mechanism off)."""
    problems = [f"model.{field} = {model[field]!r}: {what} is not implemented by the runtime's "
                f"decoder (the plan budgets it; runs need {field}: {off!r})"
                for field, off, what in UNRUN_ATTENTION_FIELDS
                if field in model and model[field] != off]
    value, width = model.get("v_head_dim"), model.get("kv_channels")
    if model.get("attention_variant", "standard") == "standard" and value not in (None, width):
        problems.append(f"model.v_head_dim = {value!r}: value heads of their own width are not "
                        "implemented by the runtime's decoder (the plan budgets them; runs need "
                        f"v_head_dim: {width!r}, the kv_channels)")
    return problems


def ownership_problems(plan: Plan, num_experts: int) -> list[str]:
    """The runtime's dispatchers send EP rank r the r-th of EP equal consecutive blocks of expert
    ids; a plan whose ownership differs (hand-edited, or a future placement) is refused here, on
    every rank alike, instead of routing tokens to experts a rank does not hold."""
    for group in plan.groups["ep"]:
        ranks = sorted(group, key=lambda rank: int(plan.rank_info(rank)["ep_rank"]))
        owned = [list(plan.expert_ownership(rank).ids) for rank in ranks]
        if [e for ids in owned for e in ids] != list(range(num_experts)) or len(
                {len(ids) for ids in owned}) != 1:
            listed = ", ".join(f"rank {rank}: {ids}" for rank, ids in zip(ranks, owned, strict=True))
            return [f"ranks[].experts of EP group {sorted(group)} ({listed}): the runtime's "
                    f"dispatchers need EP rank r to hold the r-th of {len(ranks)} equal consecutive "
                    f"blocks of the {num_experts} experts; recompile the config"]
    return []

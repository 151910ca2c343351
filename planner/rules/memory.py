"""MEM: the estimated per-rank peak memory of every stage against `cluster.gpu_memory_gib`.

The estimate is the memory page of the formula book (planner/budget/memory.py, evaluated by
planner/accounting.py); these rules own the verdict: the thresholds, the message and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from fractions import Fraction
from functools import cache
from typing import TYPE_CHECKING

from planner.config.deepep_buffers import DISPATCH_CONFIG
from planner.config.schema import Config
from planner.findings import Finding
from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.units import fixed, format_bytes, number_text

if TYPE_CHECKING:
    from planner.accounting import Number

SOURCE = ("Megatron-LM dev@d48bd6be megatron/training/theoretical_memory_usage.py "
          "report_theoretical_memory; Megatron-LM dev@d48bd6be "
          "megatron/core/pipeline_parallel/schedules.py get_forward_backward_func")
_PARTS = (("weight_bytes", "weights"), ("grad_bytes", "grads"), ("optimizer_bytes", "optimizer"),
          ("activation_bytes", "activations"), ("comm_buffer_bytes", "comm buffers"))
# What each verdict compares: the busiest EP rank's device total (allocated peak at the routing
# quantile, the allocator's reserved slack, the CUDA context and NCCL's buffers) over GPU memory.
SHARE = "device_memory_utilization"


def headroom_share(cfg: Config) -> Fraction:
    """The share of GPU memory the device total may use before MEM002 warns and search refuses:
    1 - cluster.memory_margin."""
    return _headroom(cfg.cluster.memory_margin)


@cache
def _headroom(margin: float) -> Fraction:
    return 1 - Fraction(margin).limit_denominator(10**6)


def _verdict(f: Facts, over: Fraction, upto: Fraction | None, what: str) -> Iterator[Violation]:
    """One violation naming the worst stage whose device share lies in (over, upto]. Float
    shares (search's, given only when clear of every threshold by far more than their rounding:
    planner/search/judge.py Judge._float_memory) compare with float thresholds: the same verdict
    without turning each float into a Fraction."""
    stages = f.stage_memory or []
    floats = any(isinstance(env[SHARE], float) for env in stages)
    low = float(over) if floats else over
    high = None if upto is None else float(upto) if floats else upto
    hits = [(s, env) for s, env in enumerate(stages)
            if env[SHARE] > low and (high is None or env[SHARE] <= high)]
    if not hits:
        return
    s, env = max(hits, key=lambda item: item[1][SHARE])
    others = f"; {len(hits)} of {len(stages)} stages {what}" if len(hits) > 1 else ""
    if f.terse:  # the caller reads the code (search words its own reason): the share alone
        yield Violation("cluster.gpu_memory_gib", f"stage {s} needs an estimated "
                        f"{float(env[SHARE]):.1%} of GPU memory{others}",
                        f"see `moeplan budget --stage {s}` for every part")
        return
    yield Violation("cluster.gpu_memory_gib", f"stage {s} needs an estimated {_memory_text(env)}"
                    f"{others}", _memory_fix(f.cfg, s, env))


def _memory_text(env: dict[str, Number]) -> str:
    share = Fraction(env[SHARE]) * 100
    parts = ", ".join(f"{label} {format_bytes(env[key], digits=2)}" for key, label in _PARTS)
    flight = number_text(env["in_flight_microbatches"])
    rest = Fraction(env["device_memory_bytes"]) - Fraction(env["hot_rank_memory_peak_bytes"])
    return (f"{format_bytes(env['device_memory_bytes'], digits=2)} per rank, "
            f"{fixed(share, 1)} % of {format_bytes(env['gpu_memory_bytes'], digits=2)} (device "
            f"total: an allocated peak of {format_bytes(env['hot_rank_memory_peak_bytes'], digits=2)}"
            f" on the busiest EP rank, {parts}, {flight} microbatch(es) in flight; plus "
            f"{format_bytes(rest, digits=2)} of reserved slack, CUDA context and NCCL buffers)")


def ranked_parts(env: dict[str, Number]) -> list[tuple[str, str]]:
    """The stage's memory parts (key, label), largest first."""
    return sorted(_PARTS, key=lambda part: env[part[0]], reverse=True)


def _memory_fix(cfg: Config, stage: int, env: dict[str, Number]) -> str:
    """The levers of the stage's largest part (what shrinks it in Megatron), those of the next
    largest, then the degrees that shrink every part."""
    (key, label), (second, second_label) = ranked_parts(env)[:2]
    share = fixed(Fraction(env[key]) / Fraction(env["peak_memory_bytes"]) * 100, 0)
    levers = PART_LEVERS[key](cfg)
    text = (f"the largest part is {label} ({format_bytes(env[key], digits=2)}, {share} % of the peak): "
            + (f"try {'; '.join(levers)}" if levers else "its levers are in use"))
    more = [lever for lever in PART_LEVERS[second](cfg) if lever not in levers]
    if more:
        text += f"; for {second_label} ({format_bytes(env[second], digits=2)}): {'; '.join(more)}"
    degrees = ("a larger TP (with sequence_parallel) or CP" if key == "activation_bytes"
               else "a larger EP or PP")
    return f"{text}; or {degrees}; see `moeplan budget --stage {stage}` for every part"


FSDP_ORDER = ("no_shard", "optim", "optim_grads", "optim_grads_params")


def _sharding_levers(cfg: Config, strategy: str) -> list[str]:
    """What shards this part over the data-parallel ranks: the distributed optimizer (optimizer
    states), Megatron-FSDP's strategy that includes it (Megatron-LM dev@d48bd6be
    megatron/training/arguments.py --data-parallel-sharding-strategy)."""
    tr = cfg.training
    if tr.use_megatron_fsdp:
        if FSDP_ORDER.index(tr.data_parallel_sharding_strategy) < FSDP_ORDER.index(strategy):
            return [f"training.data_parallel_sharding_strategy: {strategy}"]
        return []
    if strategy == "optim":
        return [] if tr.use_distributed_optimizer else ["training.use_distributed_optimizer: true"]
    return [f"Megatron-FSDP (training.use_megatron_fsdp with data_parallel_sharding_strategy {strategy})"]


def _optimizer_levers(cfg: Config) -> list[str]:
    """Optimizer states: shard them, hold them in 16 bits (Transformer Engine's precision-aware
    FusedAdam), or keep a share on the CPU (Megatron-LM dev@d48bd6be megatron/core/optimizer/
    optimizer_config.py OptimizerConfig)."""
    tr = cfg.training
    hints = _sharding_levers(cfg, "optim")
    if tr.num_distributed_optimizer_instances > 1:
        hints.append("training.num_distributed_optimizer_instances: 1 (shard over all of DP)")
    if tr.optimizer == "adam" and tr.use_distributed_optimizer and not tr.use_megatron_fsdp:
        if tr.exp_avg_dtype == "fp32" or tr.exp_avg_sq_dtype == "fp32":
            hints.append("training.use_precision_aware_optimizer: true with exp_avg_dtype and "
                         "exp_avg_sq_dtype bf16")
        if not tr.optimizer_cpu_offload or tr.optimizer_offload_fraction < 1:
            hints.append("training.optimizer_cpu_offload: true with an optimizer_offload_fraction "
                         "(needs the precision-aware optimizer)")
    return hints


def _weight_levers(cfg: Config) -> list[str]:
    hints = _sharding_levers(cfg, "optim_grads_params")
    if cfg.training.fp8 and not cfg.training.fp8_param_gather:
        hints.append("training.fp8_param_gather: true (FP8 weights without a BF16 copy)")
    return hints


def _grad_levers(cfg: Config) -> list[str]:
    hints = _sharding_levers(cfg, "optim_grads")
    tr = cfg.training
    if (tr.grads_in_fp32 and tr.precision == "bf16" and tr.use_distributed_optimizer
            and tr.optimizer == "adam"):
        hints.append("bf16 grad buffers (training.use_precision_aware_optimizer with main_grads_dtype "
                     "bf16)")
    return hints


def _activation_levers(cfg: Config) -> list[str]:
    """Recompute first (selective, then full: OVL009 wants a method and a count), then smaller
    microbatches and sequence parallelism."""
    ov, hints = cfg.overlap, []
    if ov.recompute_granularity is None:
        hints.append("overlap.recompute_granularity: selective (or the recompute_modules moe_act, "
                     "layernorm, mla_up_proj)")
    if ov.recompute_granularity != "full":
        hints.append("overlap: {recompute_granularity: full, recompute_method: uniform, "
                     "recompute_num_layers: 1}")
    # the MoE side's saved tensors to pinned host memory
    if not ov.fine_grained_activation_offloading and ov.cuda_graph_impl == "none" \
            and ov.recompute_granularity != "full":
        hints.append("overlap: {fine_grained_activation_offloading: true, offload_modules: "
                     "[expert_fc1, moe_act]} (their inputs wait in pinned host memory)")
    if cfg.training.micro_batch_size > 1:
        hints.append(f"a micro_batch_size below {cfg.training.micro_batch_size}")
    if cfg.parallel.tp > 1 and not cfg.parallel.sequence_parallel:
        hints.append("parallel.sequence_parallel: true")
    return hints


def _buffer_levers(cfg: Config) -> list[str]:
    hints = [f"a micro_batch_size below {cfg.training.micro_batch_size}"] \
        if cfg.training.micro_batch_size > 1 else []
    if cfg.moe.moe_expert_capacity_factor is None:
        hints.append("moe.moe_expert_capacity_factor (bounded dispatch buffers)")
    return hints


PART_LEVERS: dict[str, Callable[[Config], list[str]]] = {
    "weight_bytes": _weight_levers, "grad_bytes": _grad_levers, "optimizer_bytes": _optimizer_levers,
    "activation_bytes": _activation_levers, "comm_buffer_bytes": _buffer_levers,
}


@rule(
    "MEM001", "error", "every stage fits in GPU memory",
    source=SOURCE,
    why="""The estimated device total of the busiest EP rank (its allocated peak: weights, fp32
    main grads, optimizer states, MoE-aware activations at the routing quantile times the
    microbatches in flight, communication buffers, the loss's logits and GEMM workspaces; plus the
    allocator's reserved slack, the CUDA context and NCCL's buffers) is above the GPU's memory:
    the job would OOM at the first step that reaches the peak. `moeplan budget --stage S` shows
    every part of the estimate.""",
    bad="cluster: {gpu_memory_gib: 0.8}",
    good="cluster: {gpu_memory_gib: 1}",
)
def memory_fits(f: Facts) -> Iterator[Violation]:
    yield from _verdict(f, Fraction(1), None, "above 100 %")


@rule(
    "MEM002", "warning", "every stage leaves cluster.memory_margin of GPU memory free",
    source=SOURCE,
    why="""The device total leaves less than cluster.memory_margin (8 % by default) of the GPU
    free. The allocator's reserved slack varies from run to run (max reserved over max allocated
    was 1.010 to 1.133 in the measured logs moeplan was checked on; the device total assumes the
    median, cluster.allocator_reserved_ratio), and a communicator created late (an expert-DP
    group's first all-reduce) allocates its NCCL buffers then: plan for the margin. `moeplan
    search` refuses layouts above it unless --memory-headroom says otherwise.""",
    bad="cluster: {gpu_memory_gib: 0.9}",
    good="cluster: {gpu_memory_gib: 1}",
)
def memory_headroom(f: Facts) -> Iterator[Violation]:
    share = headroom_share(f.cfg)
    yield from _verdict(f, share, Fraction(1), f"above {fixed(share * 100, 0)} %")


@rule(
    "MEM003", "warning", "what trains is budgeted, and the launch must apply it",
    source="planner/budget/training_modes.py trainable; planner/budget/device_memory.py "
           "write_rl_colocation",
    why="""training.lora, training.freeze, training.frozen_tower_params and training.rl_colocation
    change what the memory budget holds (frozen weights without grads or optimizer states,
    adapters, a frozen vision tower, an inference engine's share of the GPU), but Megatron-LM's
    pretrain_gpt.py, which `emit megatron` launches, trains every
    parameter and runs no engine: the job must be launched by Megatron-Bridge (its PEFT and freeze
    options) or by slime / verl, with the same settings, for the budget to hold.""",
    bad="training: {freeze: [dense]}",
    good="training: {freeze: []}",
)
def training_mode_launch(f: Facts) -> Iterator[Violation]:
    tr = f.cfg.training
    for name, on, launcher in (("lora", tr.lora is not None, "Megatron-Bridge's PEFT LoRA"),
                               ("freeze", bool(tr.freeze), "Megatron-Bridge's freeze options"),
                               ("rl_colocation", tr.rl_colocation is not None, "slime or verl"),
                               ("frozen_tower_params",
                                tr.frozen_tower_params + tr.trained_tower_params > 0,
                                "Megatron-Bridge (its vision model and freeze options)")):
        if on:
            yield Violation(f"training.{name}", f"training.{name} is budgeted, but `emit megatron` "
                            "writes a Megatron-LM pretraining launch that trains every parameter",
                            f"launch the job with {launcher} using the same settings")


@rule(
    "MEM004", "warning", "DeepEP has a buffer configuration for the EP group's size",
    source="Megatron-LM dev@d48bd6be megatron/core/transformer/moe/fused_a2a.py get_buffer; "
           "planner/config/deepep_buffers.py DISPATCH_CONFIG",
    why="""Megatron's flex dispatcher with the deepep backend sizes DeepEP's NVLink and RDMA
    buffers from DeepEP's recommended configuration for the EP group's size (ETP·EP ranks), which
    DeepEP's Buffer.get_dispatch_config lists for 2, 4, 8, 16, 24, 32, 64, 128, 144 and 160 ranks
    and asserts on any other: the first dispatch fails, and moeplan cannot size the buffers that
    the device total would hold (they are left out).""",
    bad="model: {num_experts: 12}\nparallel: {world_size: 12, ep: 6}\n"
        "training: {global_batch_size: 12}\nmoe: {moe_token_dispatcher_type: flex}",
    good="moe: {moe_token_dispatcher_type: flex}",
)
def deepep_group_size(f: Facts) -> Iterator[Violation]:
    cfg = f.cfg
    if cfg.moe.moe_token_dispatcher_type != "flex" or cfg.moe.moe_flex_dispatcher_backend != "deepep":
        return
    ranks = cfg.degrees.tp_ep_size
    if ranks > 1 and ranks not in DISPATCH_CONFIG:
        sizes = ", ".join(str(n) for n in DISPATCH_CONFIG)
        yield Violation("parallel.ep", f"the EP group has {ranks} ranks (ETP·EP); DeepEP's buffer "
                        f"configurations cover {sizes}: the deepep backend fails at its first "
                        "dispatch and its buffers are not in the device total",
                        f"choose EP (times ETP) among {sizes}, or another flex backend (hybridep)")


VERDICTS = (memory_fits, memory_headroom)
RULES = (*VERDICTS, training_mode_launch, deepep_group_size)


def memory_findings(cfg: Config) -> list[Finding]:
    """MEM001 and MEM002 alone, for callers that want only the memory verdict."""
    facts = Facts(cfg)
    return [finding for unit in VERDICTS for finding in unit.findings(facts)]

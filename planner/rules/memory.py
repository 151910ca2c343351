"""MEM: the estimated per-rank peak memory of every stage against `cluster.gpu_memory_gib`.

The estimate is the memory page of the formula book (planner/budget/memory.py, evaluated by
planner/accounting.py); these rules own the verdict: the thresholds, the message and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction

from planner.accounting import Number, number_text
from planner.config.schema import Config
from planner.findings import Finding
from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.units import fixed, format_bytes

SOURCE = ("Megatron-LM dev@d48bd6be megatron/training/theoretical_memory_usage.py "
          "report_theoretical_memory; Megatron-LM dev@d48bd6be "
          "megatron/core/pipeline_parallel/schedules.py get_forward_backward_func")
HEADROOM = Fraction(4, 5)  # MEM002 above this share of GPU memory, MEM001 above 1
_PARTS = (("weight_bytes", "weights"), ("grad_bytes", "grads"), ("optimizer_bytes", "optimizer"),
          ("activation_bytes", "activations"), ("comm_buffer_bytes", "comm buffers"))


def _verdict(f: Facts, over: Fraction, upto: Fraction | None, what: str) -> Iterator[Violation]:
    """One violation naming the worst stage whose utilisation lies in (over, upto]."""
    stages = f.stage_memory or []
    hits = [(s, env) for s, env in enumerate(stages)
            if env["memory_utilization"] > over and (upto is None or env["memory_utilization"] <= upto)]
    if not hits:
        return
    s, env = max(hits, key=lambda item: item[1]["memory_utilization"])
    others = f"; {len(hits)} of {len(stages)} stages {what}" if len(hits) > 1 else ""
    yield Violation("cluster.gpu_memory_gib", f"stage {s} needs an estimated {_memory_text(env)}"
                    f"{others}", _memory_fix(f.cfg, s))


def _memory_text(env: dict[str, Number]) -> str:
    share = Fraction(env["memory_utilization"]) * 100
    parts = ", ".join(f"{label} {format_bytes(env[key], digits=2)}" for key, label in _PARTS)
    flight = number_text(env["in_flight_microbatches"])
    return (f"{format_bytes(env['peak_memory_bytes'], digits=2)} per rank, "
            f"{fixed(share, 1)} % of {format_bytes(env['gpu_memory_bytes'], digits=2)} ({parts}; "
            f"{flight} microbatch(es) in flight)")


def _memory_fix(cfg: Config, stage: int) -> str:
    hints = []
    tr = cfg.training
    if tr.use_megatron_fsdp:
        # Megatron-FSDP already shards the optimizer (it forces the distributed optimizer on);
        # what is left is sharding grads and weights too (Megatron-LM dev@d48bd6be
        # megatron/training/arguments.py --data-parallel-sharding-strategy).
        if tr.data_parallel_sharding_strategy != "optim_grads_params":
            hints.append("training.data_parallel_sharding_strategy: optim_grads_params")
    elif not tr.use_distributed_optimizer:
        hints.append("training.use_distributed_optimizer: true")
    if cfg.overlap.recompute_granularity != "full":
        # Megatron refuses full recompute without a method and a layer count (OVL009).
        hints.append("overlap: {recompute_granularity: full, recompute_method: uniform, "
                     "recompute_num_layers: 1}")
    hints.append("a larger EP or PP")
    return f"try {', '.join(hints)}; see `moeplan budget --stage {stage}` for every part"


@rule(
    "MEM001", "error", "every stage fits in GPU memory",
    source=SOURCE,
    why="""The estimated peak of a rank (weights, fp32 main grads, optimizer states, MoE-aware
    activations times the microbatches in flight, communication buffers) is above the GPU's
    memory: the job would OOM at the first step that reaches the peak. `moeplan budget --stage S`
    shows every part of the estimate.""",
    bad="cluster: {gpu_memory_gib: 0.004}",
    good="cluster: {gpu_memory_gib: 0.01}",
)
def memory_fits(f: Facts) -> Iterator[Violation]:
    yield from _verdict(f, Fraction(1), None, "above 100 %")


@rule(
    "MEM002", "warning", "every stage leaves 20 % GPU memory headroom",
    source=SOURCE,
    why="""Above 80 % of GPU memory the estimate's blind spots (allocator fragmentation, the CUDA
    context, NCCL and GEMM workspaces) decide whether the job fits; plan for headroom.""",
    bad="cluster: {gpu_memory_gib: 0.0055}",
    good="cluster: {gpu_memory_gib: 0.01}",
)
def memory_headroom(f: Facts) -> Iterator[Violation]:
    yield from _verdict(f, HEADROOM, Fraction(1), "above 80 %")


RULES = (memory_fits, memory_headroom)


def memory_findings(cfg: Config) -> list[Finding]:
    """MEM001 and MEM002 alone, for callers that want only the memory verdict."""
    facts = Facts(cfg)
    return [finding for unit in RULES for finding in unit.findings(facts)]

"""MEM: the estimated per-rank peak memory of every stage against `cluster.gpu_memory_gib`.

The estimate itself lives in planner/accounting (one home for every quantity); these units only
turn its verdict into catalog findings, so `ignore:`, `moeplan rules MEM001` and `check` treat
memory like any other rule.
"""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts

SOURCE = "planner/accounting_memory.py (megatron/training/theoretical_memory_usage.py, MoE-aware)"


def _violations(f: Facts, code: str) -> Iterator[Violation]:
    for finding in f.memory_findings:
        if finding.code == code:
            yield Violation(finding.path, finding.message, finding.fix)


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
    yield from _violations(f, "MEM001")


@rule(
    "MEM002", "warning", "every stage leaves 20 % GPU memory headroom",
    source=SOURCE,
    why="""Above 80 % of GPU memory the estimate's blind spots (allocator fragmentation, the CUDA
    context, NCCL and GEMM workspaces) decide whether the job fits; plan for headroom.""",
    bad="cluster: {gpu_memory_gib: 0.0055}",
    good="cluster: {gpu_memory_gib: 0.01}",
)
def memory_headroom(f: Facts) -> Iterator[Violation]:
    yield from _violations(f, "MEM002")


RULES = (memory_fits, memory_headroom)

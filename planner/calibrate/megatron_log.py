"""The measured figures of one Megatron-LM training log: step times, throughput, memory, stack.

Megatron-LM's console format (megatron/training/training.py training_log): one line per log
interval, `iteration N/ T | ... | elapsed time per iteration (ms): X | throughput per GPU
(TFLOP/s/GPU): Y | ... | number of skipped iterations: K |`; per rank after the first interval
`[Rank R] (after N iterations) memory (MB) | allocated: A | max allocated: M | reserved: ... |
max reserved: ...` (training_log's report_memory); the argument dump between `arguments` and
`end of arguments` rules (megatron/training/arguments.py _print_args). Lines are cleaned of colour
codes and launcher prefixes first (planner/config/importers/log_lines.py).

The measured step is the median elapsed time over steady intervals: the first logged interval
(start-up, compilation, allocator warm-up) and every interval with a skipped iteration are left
out. An interval printed twice (AMD Primus logs each iteration line from two call sites, and
prints `elapsed time per iteration (ms): LAST/AVERAGE`; the first figure is the interval's own) is
read once; a rank's memory is its highest `max allocated` report. A log with no timing line, or
two argument dumps that disagree, is refused with a finding.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

from planner.config.gpus import GPUS
from planner.config.importers.log_lines import clean_lines
from planner.config.importers.megatron_log import LogRead, read_lines

ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.eE+-]+)")
THROUGHPUT = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([0-9.eE+-]+)")
SKIPPED = re.compile(r"number of skipped iterations:\s*(\d+)")
MEMORY = re.compile(r"\[Rank (\d+)\].*memory \(MB\)\s*\|\s*allocated:\s*([0-9.]+)\s*\|\s*"
                    r"max allocated:\s*([0-9.]+)\s*\|\s*reserved:\s*([0-9.]+)\s*\|\s*"
                    r"max reserved:\s*([0-9.]+)")
VERSION = re.compile(r"(?:megatron[-_ ]?(?:core|lm)?\s*(?:version|commit)[: =]+)([\w.+-]+)", re.I)
GPU_NAME = re.compile(r"\b(?:NVIDIA\s+|AMD\s+Instinct\s+)?(" + "|".join(
    sorted(GPUS, key=len, reverse=True)) + r")\b")


class LogError(ValueError):
    """A log moeplan cannot read figures from (the message names the log and the fix)."""


@dataclass(frozen=True)
class Interval:
    """One logged interval."""

    iteration: int
    elapsed_ms: float
    tflops: float | None
    skipped: int


@dataclass
class MeasuredLog:
    """What one log measured and what it says of its stack."""

    path: str
    intervals: list[Interval]
    steady: list[Interval]
    memory_mb: dict[int, dict[str, float]] = field(default_factory=dict)
    arguments: dict[str, str] = field(default_factory=dict)
    gpu: str | None = None
    version: str | None = None
    truncated: bool = False
    notes: list[str] = field(default_factory=list)
    read: LogRead | None = None  # the log importer's read of the same cleaned lines (its config)

    @property
    def step_s(self) -> float:
        return statistics.median(i.elapsed_ms for i in self.steady) / 1e3

    @property
    def tflops_per_gpu(self) -> float | None:
        values = [i.tflops for i in self.steady if i.tflops is not None]
        return statistics.median(values) if values else None

    @property
    def peak_memory_bytes(self) -> dict[int, float]:
        """`max allocated` per rank, bytes (Megatron prints MB = 2**20 bytes)."""
        return {rank: m["max_allocated"] * 2**20 for rank, m in self.memory_mb.items()}


def _arguments(dumps: list[dict[str, str]], path: str) -> dict[str, str]:
    """The run's argument dump (the log importer reads the dumps); two that differ are two runs."""
    ignore = {"rank", "local_rank", "world_size", "save", "load", "wandb_exp_name", "timestamp"}
    first = dumps[0] if dumps else {}
    for other in dumps[1:]:
        differ = sorted(k for k in set(first) | set(other)
                        if k not in ignore and first.get(k) != other.get(k))
        if differ:
            shown = ", ".join(f"{k} {first.get(k)!r} vs {other.get(k)!r}" for k in differ[:3])
            raise LogError(f"{path}: two different configs in one log ({shown}): split it into "
                           "one log per run")
    return first


def parse_log(text: str, path: str = "<log>") -> MeasuredLog:
    """The figures of one Megatron log; raises LogError when it has no timing lines."""
    lines = clean_lines(text)
    by_iteration: dict[int, Interval] = {}
    repeated = 0
    truncated = False
    memory: dict[int, dict[str, float]] = {}
    for line in lines:
        if (it := ITERATION.search(line)) and (el := ELAPSED.search(line)):
            tf, sk = THROUGHPUT.search(line), SKIPPED.search(line)
            interval = Interval(int(it.group(1)), float(el.group(1)), float(tf.group(1)) if tf else None,
                                int(sk.group(1)) if sk else 0)
            repeated += by_iteration.get(interval.iteration) == interval
            by_iteration[interval.iteration] = interval
        elif it and "elapsed time" in line:
            truncated = True
        if m := MEMORY.search(line):
            rank = int(m.group(1))
            report = dict(zip(("allocated", "max_allocated", "reserved", "max_reserved"),
                              map(float, m.groups()[1:]), strict=True))
            if report["max_allocated"] >= memory.get(rank, {}).get("max_allocated", 0.0):
                memory[rank] = report
    intervals = [by_iteration[i] for i in sorted(by_iteration)]
    if not intervals:
        raise LogError(f"{path}: no timing lines ('iteration N/ T | ... elapsed time per "
                       "iteration (ms): X'): pass Megatron's console log with --log-interval set")
    notes: list[str] = [f"{repeated} interval line(s) printed twice, read once"] if repeated else []
    steady = [i for i in intervals[1:] if i.skipped == 0]
    if len(intervals) > 1 and len(steady) < len(intervals) - 1:
        notes.append(f"{len(intervals) - 1 - len(steady)} interval(s) with skipped iterations left out")
    if not steady:
        steady = [i for i in intervals if i.skipped == 0] or intervals
        notes.append("no steady interval after the first (warm-up) one: the first is used")
    finished = any("after training is done" in ln for ln in lines)
    last = intervals[-1]
    if not finished and (m := ITERATION.search(next(ln for ln in reversed(lines)
                                                     if ITERATION.search(ln)))):
        truncated = truncated or int(m.group(1)) < int(m.group(2))
    train_iters = last.iteration
    if truncated:
        notes.append(f"log ends before training did (last interval at iteration {train_iters}): "
                     "truncated, the complete intervals are used")
    read = read_lines(lines)
    arguments = _arguments(read.every_dump, path)
    gpu = next((m.group(1) for ln in lines if (m := GPU_NAME.search(ln))), None)
    version = next((m.group(1) for ln in lines if (m := VERSION.search(ln))), None)
    return MeasuredLog(path, intervals, steady, memory, arguments, gpu, version, truncated, notes, read)

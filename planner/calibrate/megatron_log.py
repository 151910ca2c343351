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
from collections.abc import Iterable
from dataclasses import dataclass, field

from planner.config.gpus import card_named
from planner.config.importers.log_lines import clean_line
from planner.config.importers.megatron_log import (
    MAX_DUMP_LINES,
    LogRead,
    dump_end,
    dump_entry,
    dump_start,
    read_lines,
)

ITERATION = re.compile(r"\biteration\s+(\d{1,18})\s*/\s*(\d{1,18})\s*\|")
ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.eE+-]+)")
THROUGHPUT = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([0-9.eE+-]+)")
SKIPPED = re.compile(r"number of skipped iterations:\s*(\d{1,18})(?!\d)")
# report_memory's figures, then the `[Rank R]` before them: two searches, each linear in the line
# (one pattern `\[Rank (\d+)\].*memory` rescans the rest of the line from every `[Rank`).
MEMORY = re.compile(r"memory \(MB\)\s*\|\s*allocated:\s*([0-9.]+)\s*\|\s*"
                    r"max allocated:\s*([0-9.]+)\s*\|\s*reserved:\s*([0-9.]+)\s*\|\s*"
                    r"max reserved:\s*([0-9.]+)")
RANK = re.compile(r"\[Rank (\d{1,9})\]")
VERSION = re.compile(r"(?:megatron[-_ ]?(?:core|lm)?\s*(?:version|commit)[: =]+)([\w.+-]+)", re.I)


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


# What one log may hold before the reader stops keeping more (each far beyond any real run; the
# log is streamed, so these bound the memory of a log of any length).
MAX_INTERVALS = 1_000_000  # logged intervals kept (a 1M-step run logged every step)
MAX_RANKS = 1 << 20  # ranks with a memory report kept (the config's rank ceiling)
_IGNORED = {"rank", "local_rank", "world_size", "save", "load", "wandb_exp_name", "timestamp"}


def _number(text: str) -> float | None:
    """A printed figure as a finite float, or None (`1.2.3`, `1e999`, `nan` are not figures)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def _differ(first: dict[str, str], other: dict[str, str], path: str) -> None:
    """Two argument dumps of one log that differ are two runs: refused."""
    differ = sorted(k for k in set(first) | set(other)
                    if k not in _IGNORED and first.get(k) != other.get(k))
    if differ:
        shown = ", ".join(f"{k} {first.get(k)!r:.60} vs {other.get(k)!r:.60}" for k in differ[:3])
        raise LogError(f"{path}: two different configs in one log ({shown}): split it into "
                       "one log per run")


class _Reader:
    """One pass over a log's lines in bounded memory: the intervals, the memory reports, the
    stack, and of the argument dumps only the first (every later one is compared with it) and
    the last (the importer reads it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.by_iteration: dict[int, Interval] = {}
        self.memory: dict[int, dict[str, float]] = {}
        self.repeated = self.dropped = self.bad = 0
        self.bad_example = ""  # the first elapsed time that is not a positive, finite number
        self.truncated = self.finished = False
        self.last_iteration: tuple[int, int] | None = None
        self.gpu: str | None = None
        self.version: str | None = None
        self.first_dump: dict[str, str] | None = None
        self.last_dump: list[str] = []
        self.dumps = 0
        self.current: list[str] | None = None
        self.entries: dict[str, str] = {}
        self.tail: dict[str, str] = {}  # the last padded-vocabulary and microbatch lines

    def feed(self, raw: str) -> None:
        line = clean_line(raw)
        self._dump(line)
        if it := ITERATION.search(line):
            self.last_iteration = (int(it.group(1)), int(it.group(2)))
            if el := ELAPSED.search(line):
                self._interval(line, int(it.group(1)), el.group(1))
            elif "elapsed time" in line:
                self.truncated = True
        if (m := MEMORY.search(line)) and (r := RANK.search(line, 0, m.start())):
            self._memory(int(r.group(1)), m.groups())
        self.finished = self.finished or "after training is done" in line
        if self.gpu is None:
            self.gpu = card_named(line)
        # a case-blind pattern gets no fast literal search: look for its word first (15 µs a line)
        if self.version is None and "megatron" in line.lower() and (v := VERSION.search(line)):
            self.version = v.group(1)

    def _interval(self, line: str, iteration: int, elapsed: str) -> None:
        ms = _number(elapsed)
        if ms is None or ms <= 0:
            self.bad += 1
            self.bad_example = self.bad_example or f"{elapsed[:40]} at iteration {iteration}"
            return
        tf, sk = THROUGHPUT.search(line), SKIPPED.search(line)
        tflops = _number(tf.group(1)) if tf else None
        interval = Interval(iteration, ms, tflops, int(sk.group(1)) if sk else 0)
        if iteration not in self.by_iteration and len(self.by_iteration) >= MAX_INTERVALS:
            self.dropped += 1
            return
        self.repeated += self.by_iteration.get(iteration) == interval
        self.by_iteration[iteration] = interval

    def _memory(self, rank: int, groups: tuple[str, ...]) -> None:
        values = [_number(g) for g in groups]
        if None in values or (rank not in self.memory and len(self.memory) >= MAX_RANKS):
            return
        report = dict(zip(("allocated", "max_allocated", "reserved", "max_reserved"),
                          values, strict=True))
        if report["max_allocated"] >= self.memory.get(rank, {}).get("max_allocated", 0.0):
            self.memory[rank] = report  # type: ignore[assignment]

    def _dump(self, line: str) -> None:
        stripped = line.strip()
        if dump_start(stripped):
            self.current, self.entries = [line], {}
        elif self.current is not None:
            self.current.append(line)
            if dump_end(stripped):
                self._dump_done(self.current)
                self.current = None
            elif (entry := dump_entry(line)) is not None:
                self.entries[entry[0]] = entry[1]
            if self.current is not None and len(self.current) > MAX_DUMP_LINES:
                self.current = None  # a dump cut off: never ends
        elif "padded vocab" in line:
            self.tail["padded"] = line
        elif "micro" in line and "batches to constant" in line:
            self.tail["microbatches"] = line

    def _dump_done(self, lines: list[str]) -> None:
        self.dumps += 1
        if self.first_dump is None:
            self.first_dump = self.entries
        else:
            _differ(self.first_dump, self.entries, self.path)
        self.last_dump = lines

    def result(self) -> MeasuredLog:
        intervals = [self.by_iteration[i] for i in sorted(self.by_iteration)]
        if not intervals and self.bad:
            raise LogError(f"{self.path}: no usable timing line: {self.bad} whose elapsed time "
                           f"is not a positive, finite number of ms (first: {self.bad_example}); "
                           "pass the log as Megatron printed it")
        if not intervals:
            raise LogError(f"{self.path}: no timing lines ('iteration N/ T | ... elapsed time per "
                           "iteration (ms): X'): pass Megatron's console log with --log-interval set")
        notes = [f"{self.repeated} interval line(s) printed twice, read once"] if self.repeated else []
        if self.bad:
            notes.append(f"{self.bad} timing line(s) whose elapsed time is not a positive, finite "
                         f"number of ms left out (first: {self.bad_example})")
        if self.dropped:
            notes.append(f"{self.dropped} interval(s) after the first {MAX_INTERVALS:,} left out")
        steady = [i for i in intervals[1:] if i.skipped == 0]
        if len(intervals) > 1 and len(steady) < len(intervals) - 1:
            notes.append(f"{len(intervals) - 1 - len(steady)} interval(s) with skipped iterations "
                         "left out")
        if not steady:
            steady = [i for i in intervals if i.skipped == 0] or intervals
            notes.append("no steady interval after the first (warm-up) one: the first is used")
        truncated = self.truncated
        if not self.finished and self.last_iteration is not None:
            truncated = truncated or self.last_iteration[0] < self.last_iteration[1]
        if truncated:
            notes.append(f"log ends before training did (last interval at iteration "
                         f"{intervals[-1].iteration}): truncated, the complete intervals are used")
        read = read_lines(self.last_dump + list(self.tail.values()))
        read.dumps = self.dumps
        read.every_dump = [d for d in (self.first_dump,) if d is not None] + (
            [read.dump] if self.dumps > 1 else [])
        return MeasuredLog(self.path, intervals, steady, self.memory, self.first_dump or {},
                           self.gpu, self.version, truncated, notes, read)


def parse_log(source: str | Iterable[str], path: str = "<log>") -> MeasuredLog:
    """The figures of one Megatron log, from its text or its lines streamed (planner/config/
    loader.py read_lines, which caps each line); raises LogError when it has no timing lines, or
    when it holds two argument dumps that differ."""
    reader = _Reader(path)
    for raw in source.split("\n") if isinstance(source, str) else source:
        reader.feed(raw)
    return reader.result()

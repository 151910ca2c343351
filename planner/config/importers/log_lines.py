"""Training-log lines as Megatron printed them: without terminal colour codes, carriage-return
progress redraws, and the prefixes launchers and loggers stamp in front of every line.

A log passes through torchrun (`[default0]:`, `[rank0]:`), Slurm (`0: `), Python's logging
(`INFO:megatron.core…:`, `2025-01-01 12:00:00,123 - INFO -`), and framework wrappers such as AMD
Primus (`[20250301 12:00:00][rank-0/8][INFO ] [file.py:42] :`) before a user keeps it. The
readers of Megatron's argument dump and its iteration lines want Megatron's own text, so every
such stamp is taken off the front of the line, however many are stacked.
"""

from __future__ import annotations

import re

# CSI sequences (colours, cursor moves), OSC sequences (window titles), and lone escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_STAMPS = (
    re.compile(r"\[[^\[\]\n]{0,120}\]:?[ \t]*"),  # [default0]: [rank0]: [2025-01-01 12:00:00] [INFO]
    re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?[ \t]*(?:[-|][ \t]*)?"),
    re.compile(r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)(?::[\w.]+:|[ \t]*[-|:][ \t]*|[ \t]+)"),
    re.compile(r"\d{1,5}:[ \t]"),  # srun --label: "12: "
    re.compile(r"(?:rank|RANK)[ \t]*\d+[ \t]*[:|][ \t]*"),
    re.compile(r"\[?[\w.]+\.py:\d+\]?[ \t]*:?[ \t]*"),  # [file.py:42] :
    re.compile(r":[ \t]"),  # the separator a stamp leaves before the message
)
_DUMP_LINE = re.compile(r"^\s*[A-Za-z_]\w* \.+ ")
# Megatron's own per-rank lines start with a bracket too (training.py report_memory's `[Rank R]`):
# stamps stop there, or the memory lines would lose the rank they report.
_MEGATRON_OWN = re.compile(r"\[Rank \d+\]")


# Any run of stamps, tried in the order above, stopping at Megatron's own `[Rank R]`: one match
# in C, linear in the line (taking stamps off one by one copied the rest of the line each time, so
# a 3 MB line of stacked stamps took minutes).
_STAMP_RUN = re.compile(r"(?:(?!\[Rank \d+\])(?:" + "|".join(s.pattern for s in _STAMPS) + "))*")


def _strip_stamps(line: str) -> str:
    """Take stamps off the front until none matches; the dump's two-space indent survives."""
    return line[_STAMP_RUN.match(line).end():]  # type: ignore[union-attr] - `*` always matches


def clean_line(raw: str) -> str:
    line = _ANSI.sub("", raw)
    if "\r" in line:
        line = line.rstrip("\r").rsplit("\r", 1)[-1]  # what a terminal shows after redraws
    if _DUMP_LINE.match(line):
        return line.rstrip()
    return _strip_stamps(line.lstrip()).rstrip()


def clean_lines(text: str) -> list[str]:
    """Every line of `text` with colour codes and logger prefixes removed."""
    return [clean_line(raw) for raw in text.split("\n")]

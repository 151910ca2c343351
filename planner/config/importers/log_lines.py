"""Lines of a training log as Megatron printed them: colour codes and launcher prefixes removed.

Launchers wrap Megatron's console output: ANSI colour codes, torchrun's `[default0]:` or Slurm's
`0: ` rank tags, and logger stamps such as AMD Primus's
`[20250101 12:00:00][rank-0/8][INFO ] [--------trainer.py:123] : `. What remains is the line
Megatron-LM's print_rank_0 / print_rank_last wrote (megatron/training/training.py training_log).
"""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
# One leading wrapper token: a bracketed stamp, a `rank:` tag, a log level, a `file.py:123` origin,
# an ISO or compact time stamp, or the ` : ` / ` | ` separator a logger puts before the message.
PREFIX = re.compile(
    r"^(?:\s*\[[^\]\n]{0,120}\]\s*:?"          # [stamp] [rank-0/8] [INFO ] [default0]:
    r"|\s*\d{1,5}:(?=\s)"                         # Slurm's `0: `
    r"|\s*(?:DEBUG|INFO|WARNING|WARN|ERROR)\b\s*:?"
    r"|\s*\d{4}-?\d{2}-?\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\s*"
    r"|\s*[\w./-]+\.py:\d+\s*:?"
    r"|\s*[:|]\s)"
)
# Megatron's own lines start with these (after their leading spaces); a prefix is never cut into.
MEGATRON_START = re.compile(r"^\s*(?:\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\]\s*)?iteration\s|"
                            r"^\s*\[Rank \d+\]|^-{3,}")


def clean_line(line: str) -> str:
    """One line without colour codes and without the launcher's prefix tokens."""
    line = ANSI.sub("", line).rstrip("\r\n")
    for _ in range(8):
        if MEGATRON_START.match(line):
            break
        cut = PREFIX.match(line)
        if not cut or not cut.group(0):
            break
        line = line[cut.end():]
    return line


def clean_lines(text: str) -> list[str]:
    """Every line of a log, cleaned (carriage-return progress redraws keep their last state)."""
    return [clean_line(part.rsplit("\r", 1)[-1]) for part in text.split("\n")]

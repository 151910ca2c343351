"""Seeded mutations of a text file (a launch script, an argument map, a training log, a config)
for the CLI fuzz of the commands that read them.

A plain `random.Random(seed)` applies a few line-level edits: delete, duplicate or swap lines,
replace a number with an extreme or malformed one, replace a word with junk (quotes, brackets,
YAML anchors and tags, shell substitutions, control and non-ASCII characters), insert a junk
line, re-indent a line, or cut the text short. A case is reproduced by its seed alone.
"""

from __future__ import annotations

import random
import re

NUMBERS = ("0", "-1", "1e400", "-0.0", "nan", "inf", "0x10", "1_000", "017", "9" * 40,
           "9223372036854775808", "2.5", "1/2", "")
WORDS = ("", "null", "[", "{", "'", '"', "--", "&a", "*a", "!!python/object:os.system", "\x00",
         "é", "$(reboot)", "`id`", "\\", "=", "--num-layers", "${UNSET}", "true", "~", "#")
LINES = ("---", "  - x", "key: [unclosed", "\t", "<<: *a", "export X=$(( 1/0 ))",
         "--num-layers 2 --num-layers x", "[Rank 0] iteration 1/ 10 | elapsed time per iteration (ms): -1",
         "arguments:", "  num_layers ........ 9999999999999999999999", "\x1b[31m", "\ufeff")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_WORD = re.compile(r"[A-Za-z_][\w.-]*")


def _replace_one(rng: random.Random, line: str, pattern: re.Pattern, junk: tuple[str, ...]) -> str:
    found = list(pattern.finditer(line))
    if not found:
        return line
    hit = rng.choice(found)
    return line[:hit.start()] + rng.choice(junk) + line[hit.end():]


def mutate_text(text: str, seed: int, steps: int = 3) -> tuple[str, list[str]]:
    """(the mutated text, the edits made), from 1 to `steps` edits chosen by `seed`."""
    rng = random.Random(seed)
    lines = text.splitlines(keepends=True) or [""]
    done: list[str] = []
    for _ in range(rng.randint(1, steps)):
        i = rng.randrange(len(lines))
        kind = rng.choice(("delete", "duplicate", "swap", "number", "word", "insert", "indent", "cut"))
        if kind == "delete" and len(lines) > 1:
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        elif kind == "swap":
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "number":
            lines[i] = _replace_one(rng, lines[i], _NUMBER, NUMBERS)
        elif kind == "word":
            lines[i] = _replace_one(rng, lines[i], _WORD, WORDS)
        elif kind == "insert":
            lines.insert(i, rng.choice(LINES) + "\n")
        elif kind == "indent":
            lines[i] = rng.choice(("  ", "\t", "")) + lines[i].lstrip(" ")
        elif kind == "cut":
            joined = "".join(lines)
            lines = [joined[:rng.randrange(len(joined) + 1)]]
        done.append(f"{kind} at line {i + 1}")
    return "".join(lines), done

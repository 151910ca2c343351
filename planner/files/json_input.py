"""JSON from a user's file, bounded: the plan, the runtime report, a Hugging Face config.json.

`json.loads` alone turns hostile JSON into tracebacks or worse: a 5,000-digit integer is a
ValueError (Python's int-string limit), nesting 100,000 deep a RecursionError, `NaN` and `1e999`
become numbers no budget can use. Here each is UnreadableInput naming the path and the limit;
the file itself is read through reading.read_bytes (its kind's size cap).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from planner.files.reading import UnreadableInput, decode_text, read_bytes

MAX_DEPTH = 64  # moeplan's own artifacts nest 6 deep; a config.json 3
MAX_INT_DIGITS = 40  # 128-bit integers fit; every count and byte figure moeplan writes fits 64 bits


def _integer(path: str | Path, text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise UnreadableInput("FILE007", path, f"a {len(text.lstrip('-')):,}-digit integer; JSON "
                              f"numbers here have at most {MAX_INT_DIGITS} digits")
    return int(text)


def _number(path: str | Path, text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnreadableInput("FILE007", path, f"the number {text[:40]} is beyond a 64-bit float")
    return value


def _constant(path: str | Path, text: str) -> float:
    raise UnreadableInput("FILE007", path, f"{text} is not JSON (only finite numbers are)")


def _python_constant(text: str) -> float:
    """`Infinity`, `-Infinity` and `NaN` as Python's json reads them: a Hugging Face config.json
    may hold one (`"time_step_limit": [0.0, Infinity]`); the importer range-checks every number
    it reads, so a non-finite one is refused there, by its field."""
    return float(text)


def depth_over(data: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether containers nest deeper than `limit` (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict)
                                                          else node) if isinstance(child, dict | list))
    return False


def parse_json(text: str, path: str | Path, *, constants: bool = False) -> Any:
    """Decode JSON text; UnreadableInput for syntax, depth, huge integers and non-finite numbers
    (with `constants`, the literals Infinity/-Infinity/NaN are read as Python reads them)."""
    try:
        data = json.loads(text, parse_int=lambda t: _integer(path, t),
                          parse_float=lambda t: _number(path, t),
                          parse_constant=_python_constant if constants
                          else lambda t: _constant(path, t))
    except json.JSONDecodeError as exc:
        raise UnreadableInput("FILE005", path, f"invalid JSON at line {exc.lineno}, column "
                              f"{exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise UnreadableInput("FILE007", path, f"JSON nested deeper than {MAX_DEPTH} levels") from None
    if depth_over(data):
        raise UnreadableInput("FILE007", path, f"JSON nested deeper than {MAX_DEPTH} levels")
    return data


def read_json(path: str | Path, kind: str, *, constants: bool = False) -> Any:
    """A JSON file of `kind` (its size cap), parsed with the limits above."""
    return parse_json(decode_text(read_bytes(path, kind), path, kind), path, constants=constants)

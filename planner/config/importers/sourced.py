"""`source FILE` / `. FILE` lines of a launch script, followed statically: where FILE is found
beside the launch file (its path relative to the script's folder, after the `${SCRIPT_DIR}/`-style
prefix the script computes at run time), its text takes the line's place before the script is read,
as bash would run it there. Nothing is executed; a file not found stays a named unknown.
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_DEPTH = 4  # sourced files may source others (slime's model files do not; Primus' do)
MAX_BYTES = 1 << 20
_SOURCE = re.compile(r"^(?P<indent>[ \t]*)(?:source|\.)[ \t]+(?P<path>[^\s;&|]+)[ \t]*(?:#.*)?$", re.M)
_EXPANSION_PREFIX = re.compile(r"^(?:\$\{[^}]*\}|\$\([^)]*\)|\$[A-Za-z_][A-Za-z0-9_]*)+/")


def _candidates(word: str, origin: Path) -> list[Path]:
    path = word.strip("\"'")
    tail = _EXPANSION_PREFIX.sub("", path)
    if "$" in tail:
        return []
    given = Path(tail)
    if given.is_absolute():
        return [given]
    # `${SCRIPT_DIR}/../scripts/models/x.sh` from a copy of the script kept outside its repository
    # (the sourced file beside it, under the same folder names): the path without its leading `../D/`
    parts = given.parts
    while len(parts) > 2 and parts[0] == "..":
        parts = parts[2:]
    return [origin / given] + ([origin / Path(*parts)] if parts != given.parts else [])


def inline_sourced(text: str, origin: Path | None, depth: int = 0) -> tuple[str, list[str]]:
    """The script with each found sourced file inlined, and the files read (as written in it)."""
    if origin is None or depth >= MAX_DEPTH:
        return text, []
    read: list[str] = []

    def replace(match: re.Match[str]) -> str:
        for candidate in _candidates(match.group("path"), origin):
            if candidate.is_file() and candidate.stat().st_size <= MAX_BYTES:
                inner, deeper = inline_sourced(candidate.read_text(encoding="utf-8", errors="replace"),
                                               candidate.parent, depth + 1)
                read.append(match.group("path").strip("\"'"))
                read.extend(deeper)
                return inner
        return match.group(0)

    return _SOURCE.sub(replace, text), read

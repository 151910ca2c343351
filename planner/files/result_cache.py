"""Results a later run may reuse, keyed by everything that decided them.

`moeplan groups CONFIG --rank R` is asked once per rank of a job (16,384 times for a 16,384-rank
job); validating the config and running the rules each time costs more than the answer. The first
run that finds the config valid stores what the answer is computed from (the layout's grid spec);
later runs with the same config bytes, the same moeplan files and the same validating libraries
read it back instead. The key is a SHA-256 of the kind of result, the config's bytes, the path,
size and modification time of every file of the installed `planner` package, those of pydantic's,
pydantic-core's and PyYAML's version files, the Python version and every `MOEPLAN_*` variable:
editing the config or moeplan, or reinstalling a library, is a different key, never a stale answer.

Where: `$MOEPLAN_CACHE_DIR` if set (empty: no cache at all), else `$XDG_CACHE_HOME/moeplan`, else
`~/.cache/moeplan`. The cache is an optimisation only: a folder that cannot be read or written, or an
entry that does not parse, is a miss and the result is computed as without it. Entries are written
atomically (planner/files/writing.py), so ranks racing on one node read a whole entry or none.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

from planner.files.reading import UnreadableInput, read_bytes
from planner.files.writing import WriteFailed, write_atomic

CACHE_VARIABLE = "MOEPLAN_CACHE_DIR"
# Libraries whose behaviour decides whether a config validates: their version files' stat is keyed.
_LIBRARIES = ("pydantic", "pydantic_core", "yaml")
_PACKAGE = Path(__file__).resolve().parent.parent  # the installed planner package


def cache_dir() -> Path | None:
    """The cache folder, or None when `MOEPLAN_CACHE_DIR` is set empty (caching off)."""
    chosen = os.environ.get(CACHE_VARIABLE)
    if chosen is not None:
        return Path(chosen).expanduser() if chosen.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "moeplan"


def result_key(kind: str, data: bytes) -> str:
    """The key of a `kind` result computed from `data` by this moeplan, with these libraries."""
    digest = hashlib.sha256()
    for part in (kind, sys.version, _code_fingerprint(), *_moeplan_variables()):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(data)
    return digest.hexdigest()


def load(kind: str, key: str) -> Any | None:
    """The stored result, or None (no cache, no entry, unreadable or not JSON)."""
    path = _entry(kind, key)
    if path is None:
        return None
    try:
        return json.loads(read_bytes(path, "cache"))
    except (UnreadableInput, OSError, ValueError):
        return None


def store(kind: str, key: str, value: Any) -> None:
    """Remember `value` (JSON-serialisable) under `key`; a folder that refuses it is not an error."""
    path = _entry(kind, key)
    if path is None:
        return
    try:
        write_atomic(path, json.dumps(value, separators=(",", ":")), parents=True)
    except (WriteFailed, OSError):
        pass


def _entry(kind: str, key: str) -> Path | None:
    folder = cache_dir()
    return None if folder is None else folder / kind / f"{key}.json"


def _moeplan_variables() -> list[str]:
    """Every MOEPLAN_* setting but the cache's own: they change caps and limits of the reading."""
    return [f"{name}={os.environ[name]}" for name in sorted(os.environ)
            if name.startswith("MOEPLAN_") and name != CACHE_VARIABLE]


@cache
def _code_fingerprint() -> str:
    """Path, size and mtime of every planner file and of the validating libraries' version files."""
    entries: list[str] = []
    stack = [_PACKAGE]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as items:
            for item in sorted(items, key=lambda entry: entry.name):
                if item.is_dir(follow_symlinks=False):
                    if item.name != "__pycache__":
                        stack.append(Path(item.path))
                    continue
                info = item.stat()
                entries.append(f"{item.path}:{info.st_size}:{info.st_mtime_ns}")
    for library in _LIBRARIES:
        spec = importlib.util.find_spec(library)
        origin = spec.origin if spec is not None else None
        if origin is None:
            entries.append(f"{library}:absent")
            continue
        folder = Path(origin).parent
        for name in ("version.py", "__init__.py"):
            candidate = folder / name
            if candidate.is_file():
                info = candidate.stat()
                entries.append(f"{candidate}:{info.st_size}:{info.st_mtime_ns}")
                break
    return "\n".join(entries)

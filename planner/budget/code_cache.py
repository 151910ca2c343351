"""The formula book's compiled functions kept on disk between runs, as Python keeps `.pyc` files.

planner/budget/expr.py compiles each group of formulas into one Python function. Compiling is most
of what a first evaluation of a variant costs (a few milliseconds per level, hundreds of levels in
one `moeplan search`), and a search's worker processes would each compile the variants they meet
again. The code object depends on nothing but the generated source and the interpreter's bytecode
format, so it is stored under a SHA-256 of the two and read back with `marshal`, as the import
system reads bytecode: the same source gives the same code object, hence the same numbers.

Where: the result cache's folder (planner/files/result_cache.py: `$MOEPLAN_CACHE_DIR`, empty for
no cache; else `$XDG_CACHE_HOME/moeplan` or `~/.cache/moeplan`), under `formulas/`. Each entry
holds a SHA-256 of its payload, checked before the payload is unmarshalled: a damaged or foreign
entry is a miss, never code run. A folder that cannot be read or written is a miss too; entries
are written atomically, so processes racing on one entry read a whole one or none.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
from pathlib import Path
from types import CodeType

from planner.files.reading import UnreadableInput, read_bytes
from planner.files.result_cache import cache_dir
from planner.files.writing import WriteFailed, write_atomic

KIND = "formulas"
_HEADER = b"moeplan compiled formulas 1\n"
_DIGEST = hashlib.sha256().digest_size


def compiled(source: str, filename: str) -> CodeType:
    """`compile(source, filename, "exec")`, read from the cache when an earlier run stored it."""
    path = _entry(source, filename)
    if path is not None:
        code = _load(path)
        if code is not None:
            return code
    code = compile(source, filename, "exec")
    if path is not None:
        _store(path, code)
    return code


def _entry(source: str, filename: str) -> Path | None:
    folder = cache_dir()
    if folder is None:
        return None
    key = hashlib.sha256(importlib.util.MAGIC_NUMBER + filename.encode() + b"\0" + source.encode())
    return folder / KIND / f"{key.hexdigest()}.code"


def _load(path: Path) -> CodeType | None:
    """The stored code object, or None (no entry, unreadable, damaged, or not code)."""
    try:
        data = read_bytes(path, "cache")
    except (UnreadableInput, OSError):
        return None
    start = len(_HEADER) + _DIGEST
    if not data.startswith(_HEADER) or hashlib.sha256(data[start:]).digest() != data[len(_HEADER):start]:
        return None
    try:
        code = marshal.loads(data[start:])
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def _store(path: Path, code: CodeType) -> None:
    payload = marshal.dumps(code)
    try:
        write_atomic(path, _HEADER + hashlib.sha256(payload).digest() + payload, parents=True)
    except (WriteFailed, OSError):
        pass

"""Bounded reads: every file moeplan opens is read here, with a size cap for its kind.

A config, a Hugging Face config.json, an argument file or a plan is read whole, so an input that
never ends (`/dev/zero`, a FIFO with no writer, a multi-gigabyte sparse file) would otherwise end
in MemoryError or a hang. Here a non-regular file is refused before a byte is read (`-` reads
stdin instead, with a deadline), a regular file larger than its kind's cap is refused from its
size alone, and what is read is never more than the cap. Logs are streamed line by line
(`read_lines`), with a cap per line and one on the whole. Each refusal names the path, the size,
the cap and the environment variable that raises it; it is a usage error (exit 2).
"""

from __future__ import annotations

import os
import select
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

MiB, GiB = 1 << 20, 1 << 30
STDIN = "-"

# The largest file of each kind read whole (log: the whole stream), in bytes. Real inputs are far
# smaller: a config is a few KiB (a million-entry ignore list is ~10 MiB), a Hugging Face
# config.json a few KiB, a plan ~1.1 KiB per rank (144 MiB at 131,072 ranks).
CAPS: dict[str, int] = {
    "config": 32 * MiB,
    "hf_config": 16 * MiB,
    "tokenizer": 256 * MiB,  # a tokenizer.json holds the whole vocabulary and merges (tens of MiB)
    "args": 16 * MiB,
    "script": 16 * MiB,
    "plan": 1 * GiB,
    "report": 1 * GiB,
    "profile": 64 * MiB,
    "log": 64 * GiB,
    "cache": 1 * MiB,  # a result cache entry (planner/files/result_cache.py): a grid spec, ~1 KiB
}
LINE_CAP = 1 * MiB  # one log line; a longer one is binary junk, not a log
STDIN_SECONDS = 60.0  # a stdin that stays silent this long is refused, not waited on forever
_CHUNK = 1 * MiB


class UnreadableInput(Exception):
    """A file moeplan cannot read (missing, not a regular file, too large, not text): exit 2.
    `code` is one of the FILE codes in docs/limits.md."""

    def __init__(self, code: str, path: str | Path, reason: str) -> None:
        super().__init__(f"{path}: {reason} [{code}]")
        self.code, self.path, self.reason = code, str(path), reason


def cap_variable(kind: str) -> str:
    return f"MOEPLAN_MAX_BYTES_{kind.upper()}"


def cap_of(kind: str) -> int:
    """The kind's cap, raised (or lowered) by MOEPLAN_MAX_BYTES_<KIND>."""
    if kind not in CAPS:
        raise ValueError(f"unknown file kind {kind!r}; known: {', '.join(CAPS)}")
    raw = os.environ.get(cap_variable(kind), "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return CAPS[kind]


def stdin_seconds() -> float:
    raw = os.environ.get("MOEPLAN_STDIN_SECONDS", "")
    try:
        return max(0.1, float(raw)) if raw else STDIN_SECONDS
    except ValueError:
        return STDIN_SECONDS


def _too_large(path: str | Path, kind: str, size: str) -> UnreadableInput:
    cap = cap_of(kind)
    return UnreadableInput("FILE002", path, f"{size} is over the {kind} limit of {cap:,} bytes; "
                           f"if the file is real, raise it with {cap_variable(kind)}=<bytes>")


_NOT_REGULAR = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
                stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def _open_regular(path: str | Path, kind: str) -> tuple[int, int]:
    """An fd open for reading and the file's size; refuses what is not a regular file. O_NONBLOCK
    keeps the open itself from waiting for a FIFO's writer."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UnreadableInput("FILE001", path, "no such file") from None
    except IsADirectoryError:
        raise UnreadableInput("FILE003", path, f"is a directory, expected a {kind} file") from None
    except OSError as exc:
        raise UnreadableInput("FILE004", path, f"cannot read ({exc.strerror or exc})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        if stat.S_ISDIR(info.st_mode):
            raise UnreadableInput("FILE003", path, f"is a directory, expected a {kind} file")
        what = _NOT_REGULAR.get(stat.S_IFMT(info.st_mode), "not a regular file")
        raise UnreadableInput("FILE003", path, f"is {what}, not a regular file; moeplan reads "
                              f"{kind} files only (pipe it through stdin with - where the command "
                              "takes -)")
    os.set_blocking(fd, True)
    return fd, info.st_size


def _read_fd(fd: int, limit: int, path: str | Path, kind: str, deadline: float | None) -> bytes:
    """At most `limit` bytes (one more is the refusal); with a deadline, stop waiting then."""
    parts, total = [], 0
    while True:
        if deadline is not None:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                raise UnreadableInput("FILE006", path, f"no end of input after {stdin_seconds():g} s; "
                                      "close the pipe (or raise MOEPLAN_STDIN_SECONDS)")
        try:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
        except OSError as exc:
            raise UnreadableInput("FILE004", path, f"cannot read ({exc.strerror or exc})") from None
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        total += len(chunk)
        if total > limit:
            raise _too_large(path, kind, f"more than {limit:,} bytes")


def read_bytes(path: str | Path, kind: str = "config") -> bytes:
    """The whole file (or stdin for `-`), never more than the kind's cap."""
    limit = cap_of(kind)
    if str(path) == STDIN:
        fd = _stdin_fd()
        if fd is None:  # an in-memory stdin (a test runner's): it cannot hang, only be large
            raw = sys.stdin.buffer.read(limit + 1)
            if len(raw) > limit:
                raise _too_large("<stdin>", kind, f"more than {limit:,} bytes")
            return raw
        return _read_fd(fd, limit, "<stdin>", kind, time.monotonic() + stdin_seconds())
    fd, size = _open_regular(path, kind)
    try:
        if size > limit:
            raise _too_large(path, kind, f"{size:,} bytes")
        return _read_fd(fd, limit, path, kind, None)
    finally:
        os.close(fd)


def _stdin_fd() -> int | None:
    try:
        return sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return None


def decode_text(raw: bytes, path: str | Path, kind: str = "config") -> str:
    if b"\x00" in raw:
        raise UnreadableInput("FILE005", path, f"binary data, expected a {kind} text file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableInput("FILE005", path, f"not UTF-8 text (byte {exc.start})") from None


def read_text(path: str | Path, kind: str = "config") -> str:
    """The file as UTF-8 text (no NUL bytes), within the kind's cap; UnreadableInput otherwise."""
    return decode_text(read_bytes(path, kind), "<stdin>" if str(path) == STDIN else path, kind)


def read_lines(path: str | Path, kind: str = "log") -> Iterator[str]:
    """Stream a text file (or stdin, `-`) line by line without its line ending, in bounded memory:
    undecodable bytes become U+FFFD (logs carry junk), a line over LINE_CAP bytes or a stream over
    the kind's cap is UnreadableInput. The file is opened (and refused) at the call, not at the
    first line."""
    limit = cap_of(kind)
    if str(path) == STDIN:
        fd = _stdin_fd()
        if fd is None:  # an in-memory stdin: read it whole (within the cap) and split it
            return iter(decode_text(read_bytes(STDIN, kind), "<stdin>", kind).splitlines())
        return _lines(fd, False, "<stdin>", kind, limit, stdin_seconds())
    fd, size = _open_regular(path, kind)
    if size > limit:
        os.close(fd)
        raise _too_large(path, kind, f"{size:,} bytes")
    return _lines(fd, True, path, kind, limit, None)


def _lines(fd: int, owned: bool, path: str | Path, kind: str, limit: int,
           silence: float | None) -> Iterator[str]:
    """The generator behind read_lines; `silence`: seconds stdin may stay quiet between chunks."""
    pending, total = b"", 0
    try:
        while True:
            deadline = None if silence is None else time.monotonic() + silence
            chunk = _chunk(fd, path, deadline)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise _too_large(path, kind, f"more than {limit:,} bytes")
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
            if len(pending) > LINE_CAP:
                raise UnreadableInput("FILE002", path, f"a line longer than {LINE_CAP:,} bytes "
                                      f"after byte {total - len(pending):,}: not a text {kind}")
        if pending:
            yield pending.rstrip(b"\r").decode("utf-8", "replace")
    finally:
        if owned:
            os.close(fd)


def _chunk(fd: int, path: str | Path, deadline: float | None) -> bytes:
    if deadline is not None and not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        raise UnreadableInput("FILE006", path, f"no input for {stdin_seconds():g} s; close the pipe "
                              "(or raise MOEPLAN_STDIN_SECONDS)")
    try:
        return os.read(fd, _CHUNK)
    except OSError as exc:
        raise UnreadableInput("FILE004", path, f"cannot read ({exc.strerror or exc})") from None

"""Atomic writes: every file moeplan writes (plans, launch scripts, reports, imported configs,
search winners, SVGs, calibration profiles) goes through `write_atomic`.

The text goes into a temporary file beside the target, which is then renamed over it: a reader sees
the old file or the whole new one, never a half-written one, and a failed write (read-only mount,
full disk, `ulimit -f`) removes its temporary file and raises WriteFailed naming the path and the
cause (the CLI's exit 2). `check_target` refuses, before any work is done, a target that is a
directory or a device, FIFO or socket (a rename would replace the node), and an existing file
unless the command was given --force.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


class WriteFailed(Exception):
    """A file moeplan cannot or will not write (exit 2); the message names the path and why."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = str(path), reason


def check_target(path: str | Path, *, force: bool, option: str = "-o") -> None:
    """Refuse a target that is not a plain file to (over)write: call it before doing the work."""
    target = Path(path)
    try:
        info = target.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise WriteFailed(target, f"cannot write ({exc.strerror or exc})") from None
    if stat.S_ISDIR(info.st_mode):
        raise WriteFailed(target, f"is a directory; {option} names the file to write")
    if not stat.S_ISREG(info.st_mode):
        raise WriteFailed(target, "exists and is not a regular file (a device, FIFO or socket); "
                          "moeplan never replaces one: give another path")
    if not force:
        raise WriteFailed(target, "exists; pass --force to overwrite it")


def write_atomic(path: str | Path, text: str | bytes, *, mode: int = 0o644, parents: bool = True) -> None:
    """Write through a temporary file in the same folder and rename; WriteFailed on any OSError.
    parents: create missing folders first (a plan's run folder); False refuses a missing one."""
    target = Path(path)
    check_target(target, force=True)
    folder = target.parent if str(target.parent) else Path(".")
    try:
        if parents:
            folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.name[:100]}.", suffix=".tmp")
    except OSError as exc:
        raise WriteFailed(target, f"cannot write ({exc.strerror or exc})") from None
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise WriteFailed(target, f"cannot write ({exc.strerror or exc}); nothing was written") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

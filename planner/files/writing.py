"""Atomic writes: every file moeplan writes (plans, launch scripts, reports, imported configs,
search winners, SVGs, calibration profiles) goes through `write_atomic`.

The text goes into a temporary file beside the target, which is then renamed over it: a reader sees
the old file or the whole new one, never a half-written one, and a failed write (read-only mount,
full disk, `ulimit -f`) removes its temporary file and raises WriteFailed naming the path and the
cause (the CLI's exit 2). `check_target` refuses, before any work is done, a target that is a
directory, a symbolic link or a device, FIFO or socket (a rename would replace the node or the
link), and an existing file unless the command was given --force. A temporary file's name is the
target's cut to 100 bytes plus 13, so any name the file system takes (255 bytes) can be written.
"""

from __future__ import annotations

import os
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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
        info = target.lstat()  # the entry itself: a rename replaces a link, not what it points at
    except FileNotFoundError:
        return
    except OSError as exc:
        raise WriteFailed(target, f"cannot write ({exc.strerror or exc})") from None
    if stat.S_ISLNK(info.st_mode):
        raise WriteFailed(target, "is a symbolic link; moeplan never replaces one (not even with "
                          "--force): give the path it points at, or another path")
    if stat.S_ISDIR(info.st_mode):
        raise WriteFailed(target, f"is a directory; {option} names the file to write")
    if not stat.S_ISREG(info.st_mode):
        raise WriteFailed(target, "exists and is not a regular file (a device, FIFO or socket); "
                          "moeplan never replaces one: give another path")
    if not force:
        raise WriteFailed(target, "exists; pass --force to overwrite it")


@contextmanager
def _signals_end_cleanly() -> Iterator[None]:
    """While temporary files exist, SIGTERM and SIGHUP raise SystemExit(128 + signal) instead of
    ending the process where it stands, so the cleanup below runs as it does for SIGINT's
    KeyboardInterrupt (a signal whose handler is SIG_IGN, as under nohup, stays ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    saved = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            saved[sig] = signal.signal(sig, leave)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def write_atomic(path: str | Path, text: str | bytes, *, mode: int = 0o644, parents: bool = True) -> None:
    """Write through a temporary file in the same folder and rename; WriteFailed on any OSError.
    parents: create missing folders first (a plan's run folder); False refuses a missing one."""
    target = Path(path)
    check_target(target, force=True)
    folder = target.parent if str(target.parent) else Path(".")
    try:
        if parents:
            folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteFailed(target, f"cannot write ({exc.strerror or exc})") from None
    with _signals_end_cleanly():
        tmp = _staged(target, text, mode)
        try:
            os.replace(tmp, target)
        except OSError as exc:
            raise WriteFailed(target, f"cannot write ({exc.strerror or exc}); nothing was written") from None
        finally:
            Path(tmp).unlink(missing_ok=True)


def _staged(target: Path, text: str | bytes, mode: int) -> str:
    """The text in a temporary file beside `target` (its name: the target's, shortened so the
    temporary name fits where the target's does); removed again on any failure."""
    folder = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{_short(target.name)}.", suffix=".tmp")
    except OSError as exc:
        raise WriteFailed(target, f"cannot write ({exc.strerror or exc})") from None
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise WriteFailed(target, f"cannot write ({exc.strerror or exc}); nothing was written") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def _short(name: str) -> str:
    """At most 100 bytes of `name`, cut on a character boundary (mkstemp adds '.' + 8 + '.tmp')."""
    return name.encode("utf-8")[:100].decode("utf-8", "ignore")


def write_together(files: list[tuple[Path, str | bytes, int]], made: Sequence[Path] = ()) -> None:
    """Several files as one: every text is written to its temporary file first, and only when all
    of them are complete are they renamed over their targets, so a full disk (or any failure)
    midway leaves no file of the set, and removes the folders in `made` the caller created for
    it when they are left empty. WriteFailed names the file and the cause."""
    staged: list[tuple[str, Path]] = []
    renamed: list[Path] = []
    fresh = {path for path, _, _ in files if not os.path.lexists(path)}
    with _signals_end_cleanly():
        try:
            for path, text, mode in files:
                check_target(path, force=True)
                staged.append((_staged(path, text, mode), path))
            for tmp, path in staged:
                try:
                    os.replace(tmp, path)
                except OSError as exc:
                    raise WriteFailed(path, f"cannot write ({exc.strerror or exc}); nothing was "
                                      "written") from None
                renamed.append(path)
        except BaseException:
            for tmp, _ in staged:
                Path(tmp).unlink(missing_ok=True)
            for path in renamed:
                if path in fresh:
                    path.unlink(missing_ok=True)
            for folder in reversed(list(made)):
                try:
                    folder.rmdir()  # only when empty
                except OSError:
                    pass
            raise

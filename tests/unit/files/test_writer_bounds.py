"""The atomic writer under adversarial targets and signals (issue 36): a link is never replaced,
the file system's 255 bytes are the user's, and SIGTERM, SIGINT and SIGHUP mid-write leave no
temporary file behind."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from planner.files.writing import WriteFailed, write_atomic, write_together


@pytest.mark.parametrize("force", [False, True])
def test_a_symlink_is_never_replaced(tmp_path: Path, force: bool) -> None:
    """Before, `-o` naming a link to /dev/stdout with --force replaced the link."""
    real = tmp_path / "real.json"
    real.write_text("keep me")
    link = tmp_path / "out.json"
    link.symlink_to(real)
    with pytest.raises(WriteFailed, match="is a symbolic link; moeplan never replaces one"):
        write_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "keep me"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(WriteFailed, match="symbolic link"):
        write_together([(dangling, "new", 0o644)])
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("characters", [122, 125])
def test_a_name_the_file_system_takes_is_written(tmp_path: Path, characters: int) -> None:
    """249 and 255 bytes of UTF-8 (two bytes a character): before, the temporary name's suffix
    took it past 255 and the write was refused as too long."""
    name = "é" * characters + ".json"
    assert len(name.encode()) in (249, 255)
    write_atomic(tmp_path / name, "{}")
    assert (tmp_path / name).read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == [name]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_mid_write_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     signum: int) -> None:
    real_fdopen = os.fdopen
    # The disposition a user's shell gives: a job started with `&` inherits SIGINT ignored and
    # one under nohup SIGHUP ignored, and an ignored signal stays ignored (the writer's own
    # rule), so the test sets the default itself rather than inherit its runner's.
    default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
    inherited = signal.signal(signum, default)
    before = signal.getsignal(signum)

    def interrupted(fd: int, *args: Any, **kwargs: Any) -> Any:
        handle = real_fdopen(fd, *args, **kwargs)
        # To this thread, not the process: os.kill lets the kernel hand the signal to any thread
        # that does not block it (xdist's and execnet's helper threads), which on a loaded box
        # may run its C handler only after the write has ended and the handlers are put back.
        # pthread_kill delivers it here before it returns; Python runs the handler at the next
        # bytecode, mid-write.
        signal.pthread_kill(threading.get_ident(), signum)
        return handle

    monkeypatch.setattr(os, "fdopen", interrupted)
    expected = KeyboardInterrupt if signum == signal.SIGINT else SystemExit
    try:
        with pytest.raises(expected) as caught:
            write_together([(tmp_path / "plan.json", "x" * 100_000, 0o644),
                            (tmp_path / "run.sh", "y", 0o755)])
        after = signal.getsignal(signum)
    finally:
        signal.signal(signum, inherited)
    if expected is SystemExit:
        assert caught.value.code == 128 + signum
    assert list(tmp_path.iterdir()) == []
    assert after == before  # the handlers are put back

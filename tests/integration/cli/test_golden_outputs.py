"""No behaviour change by accident: every example's CLI output matches its recorded snapshot, and a
change fails with the diff (tests/support/golden_outputs.py says what the snapshots hold)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.golden_outputs import (
    COMMANDS,
    GOLDEN,
    UPDATE,
    difference,
    examples,
    key,
    snapshot,
    snapshot_path,
)


def test_every_example_is_recorded() -> None:
    recorded = {p.relative_to(GOLDEN) for p in GOLDEN.rglob("*.txt")}
    expected = {snapshot_path(command, c).relative_to(GOLDEN) for c in examples() for command in COMMANDS}
    assert recorded == expected, f"re-record with `{UPDATE}`"


@pytest.mark.parametrize("config", examples(), ids=key)
@pytest.mark.parametrize("command", COMMANDS)
def test_output_is_byte_identical(command: str, config: Path) -> None:
    path = snapshot_path(command, config)
    diff = difference(path.read_text(encoding="utf-8"), snapshot(command, config),
                      path.relative_to(GOLDEN).as_posix())
    if diff is not None:
        pytest.fail(f"`moeplan {command}` on {key(config)} changed; if intended, re-record with "
                    f"`{UPDATE}` and say why in the commit\n{diff}", pytrace=False)


def test_a_changed_byte_fails_with_its_line() -> None:
    """The check is not vacuous: one digit changed in a recorded snapshot is reported as that line."""
    config = examples()[0]
    now = snapshot("check", config)
    recorded = now.replace('"ok": true', '"ok": false', 1)
    assert recorded != now
    diff = difference(recorded, now, "check.txt")
    assert diff is not None and '-  "ok": false' in diff and '+  "ok": true' in diff

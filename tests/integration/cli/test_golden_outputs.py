"""No behaviour change by accident: every example's CLI output matches its recorded fingerprint."""

from __future__ import annotations

import json

import pytest

from tests.support.golden_outputs import COMMANDS, GOLDEN, examples, fingerprint, key

RECORDED = json.loads(GOLDEN.read_text())


def test_every_example_is_recorded() -> None:
    assert sorted(RECORDED) == sorted(key(c) for c in examples())


@pytest.mark.parametrize("config", examples(), ids=key)
@pytest.mark.parametrize("command", COMMANDS)
def test_output_is_byte_identical(command: str, config) -> None:
    assert fingerprint(command, config) == RECORDED[key(config)][command], (
        f"`moeplan {command}` on {key(config)} changed; if intended, re-record with "
        "`python -m tests.support.golden_outputs --update` and say why in the commit")

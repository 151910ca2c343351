"""Read one line of the Megatron-LM dev checkout the rule tests cite, to prove the citation still
holds. The checkout is found by tests/support/oracle.py; tests skip, with the reason, where there is none."""

from __future__ import annotations

import pytest

from tests.support.oracle import megatron_lm_dir


def megatron_line(path: str, line: int) -> str:
    """Line `line` (1-based) of `megatron/<path>`; skips the test when no checkout is present."""
    root, why_missing = megatron_lm_dir()
    if root is None:
        pytest.skip(why_missing)
    lines = (root / "megatron" / path).read_text().splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else ""

"""Read one line of the Megatron-LM dev checkout the rule tests cite, to prove the citation still
holds. The checkout is found by tests/support/oracle.py; tests skip, with the reason, where there is none."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.oracle import megatron_lm_dir


def megatron_line(path: str, line: int) -> str:
    """Line `line` (1-based) of `megatron/<path>`; skips the test when no checkout is present."""
    root, why_missing = megatron_lm_dir()
    if root is None:
        pytest.skip(why_missing)
    lines = (root / "megatron" / path).read_text().splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else ""


# --- issue 25 (article): lines of Megatron-LM main@d98e8a64, read from a main checkout when one is
# named (MOEPLAN_MEGATRON_LM_MAIN); the tests skip without it, as they do without the dev one.
MAIN_ENV_VARIABLE = "MOEPLAN_MEGATRON_LM_MAIN"


def megatron_main_line(path: str, line: int) -> str:
    """Line `line` of `megatron/<path>` in the main checkout; skips without one."""
    configured = os.environ.get(MAIN_ENV_VARIABLE)
    source = Path(configured or "") / "megatron" / path
    if not configured or not source.is_file():
        pytest.skip(f"no Megatron-LM main checkout (set {MAIN_ENV_VARIABLE})")
    lines = source.read_text().splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else ""

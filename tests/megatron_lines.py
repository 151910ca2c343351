"""Read one line of the Megatron-LM dev checkout the rule tests cite, to prove the citation still
holds. MOEPLAN_MEGATRON_LM names the checkout (the folder holding `megatron/`); by default this
repository's CI copy beside it. Tests skip, with the reason, where neither exists."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def megatron_root() -> Path | None:
    configured = os.environ.get("MOEPLAN_MEGATRON_LM")
    root = Path(configured) if configured else REPO.parent / "shared" / "oracle" / "megatron-lm-dev"
    return root if (root / "megatron").is_dir() else None


def megatron_line(path: str, line: int) -> str:
    """Line `line` (1-based) of `megatron/<path>`; skips the test when no checkout is present."""
    root = megatron_root()
    if root is None:
        pytest.skip("no Megatron-LM dev checkout (set MOEPLAN_MEGATRON_LM to one)")
    lines = (root / "megatron" / path).read_text().splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else ""

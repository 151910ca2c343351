"""Shared fixtures: the bundled examples and a small valid base config to mutate."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

MINIMAL_V4: dict[str, Any] = {
    "model": {"preset": "deepseek-v4-pro"},
    "parallel": {"world_size": 1024, "tp": 1, "cp": 2, "pp": 8, "ep": 64, "etp": 1},
    "training": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 4096},
}


@pytest.fixture
def minimal_v4() -> dict[str, Any]:
    return copy.deepcopy(MINIMAL_V4)

"""Shared fixtures. Constants tests import live in tests/support/ (paths, base_configs)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.base_configs import MINIMAL_V4


@pytest.fixture
def minimal_v4() -> dict[str, Any]:
    return copy.deepcopy(MINIMAL_V4)

"""A small valid config the rule and budget tests mutate (the `minimal_v4` fixture copies it)."""

from __future__ import annotations

from typing import Any

MINIMAL_V4: dict[str, Any] = {
    "model": {"preset": "deepseek-v4-pro"},
    "parallel": {"world_size": 1024, "tp": 1, "cp": 2, "pp": 8, "ep": 64, "etp": 1},
    "training": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 4096},
}

"""Where the Megatron-LM oracle checkout is: the one place the tests name a folder outside the repo.

MOEPLAN_MEGATRON_LM wins; otherwise the checkout this repository's CI keeps beside it,
<repo>/../shared/oracle/megatron-lm-dev (Megatron-LM dev@d48bd6be, unmodified). Tests that need it
skip with the reason when neither is there.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VARIABLE = "MOEPLAN_MEGATRON_LM"
DEFAULT_ORACLE = Path(__file__).resolve().parents[3] / "shared" / "oracle" / "megatron-lm-dev"


MAIN_ENV_VARIABLE = "MOEPLAN_MEGATRON_LM_MAIN"


def megatron_lm_main_dir() -> tuple[Path | None, str]:
    """(a Megatron-LM main checkout, "") when MOEPLAN_MEGATRON_LM_MAIN names one, else (None, why):
    the checks against main are opt-in, CI reads the committed main list."""
    configured = os.environ.get(MAIN_ENV_VARIABLE)
    if configured and (Path(configured) / "megatron" / "training" / "arguments.py").is_file():
        return Path(configured), ""
    return None, f"no Megatron-LM main checkout: set {MAIN_ENV_VARIABLE} (opt-in)"


def megatron_lm_dir() -> tuple[Path | None, str]:
    """(the checkout holding the `megatron` package, "") or (None, why the tests must skip)."""
    configured = os.environ.get(ENV_VARIABLE)
    folder = Path(configured) if configured else DEFAULT_ORACLE
    if (folder / "megatron" / "training" / "arguments.py").is_file():
        return folder, ""
    where = f"{ENV_VARIABLE}={configured}" if configured else f"{folder} (set {ENV_VARIABLE})"
    return None, f"no Megatron-LM checkout (megatron/training/arguments.py) at {where}"

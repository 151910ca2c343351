"""A calibration profile: the fitted efficiency factors of one software stack, as YAML.

    stack: {gpu: H100, megatron: core_r0.14.0, logs: [run1.log, run2.log]}
    factors: {host_us_per_expert: 512.0, gemm_fp8: 0.47}

`estimate`, `search`, `budget` and `report` take it with `--calibration FILE` or
`cluster.calibration: FILE` in the config; its factors replace the config's efficiency defaults
(family-scoped names such as `gemm_fp8@hopper` only on that family's GPUs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from planner.calibrate.factors import BY_NAME, split_name, with_factors
from planner.config.loader import read_text
from planner.config.schema import Config


class ProfileError(ValueError):
    """A profile moeplan cannot use (the message names the file, the entry and the fix)."""


def dump_profile(stack: dict[str, Any], factors: dict[str, float]) -> str:
    return yaml.safe_dump({"stack": stack, "factors": {k: float(v) for k, v in factors.items()}},
                          sort_keys=False)


def read_profile(path: str | Path) -> tuple[dict[str, Any], dict[str, float]]:
    """The stack and factors of a profile file; raises ProfileError (or the loader's
    UnreadableConfig for a file that cannot be read)."""
    data = yaml.safe_load(read_text(path, "profile"))
    if not isinstance(data, dict) or not isinstance(data.get("factors"), dict):
        raise ProfileError(f"{path}: not a calibration profile (expected a 'factors' mapping; "
                           "write one with `moeplan calibrate LOG -o FILE`)")
    factors: dict[str, float] = {}
    for name, value in data["factors"].items():
        if split_name(str(name))[0] not in BY_NAME:
            raise ProfileError(f"{path}: factors.{name} is not a calibrated factor (known: "
                               f"{', '.join(BY_NAME)})")
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ProfileError(f"{path}: factors.{name} = {value!r} is not a number")
        factors[str(name)] = float(value)
    stack = data.get("stack") if isinstance(data.get("stack"), dict) else {}
    return stack, factors


def apply_profile(cfg: Config, path: str | Path | None) -> Config:
    """`cfg` with the profile's factors (the given file, else cluster.calibration, else as is)."""
    target = path or getattr(cfg.cluster, "calibration", None)
    if not target:
        return cfg
    _, factors = read_profile(target)
    return with_factors(cfg, factors)

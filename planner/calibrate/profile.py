"""A calibration profile: the fitted efficiency factors of one software stack, as YAML.

    stack: {gpu: H100, megatron: core_r0.14.0, logs: [run1.log, run2.log]}
    factors: {host_us_per_expert: 512.0, gemm_fp8: 0.47}

`estimate`, `search`, `budget` and `report` take it with `--calibration FILE` or
`cluster.calibration: FILE` in the config; its factors replace the config's efficiency defaults
(family-scoped names such as `gemm_fp8@hopper` only on that family's GPUs).

A profile is read like a config (planner/config/loader.py parse_yaml: the bounded reader, the
safe loader, the alias and node caps), and each factor must be a finite number inside the range
the same field of `cluster.efficiency` takes (planner/config/schema.py EfficiencySection): the
factors are applied without the schema's validation, so a negative share would otherwise turn
into a negative step time that `search` ranks first.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from planner.calibrate.factors import BY_NAME, split_name, with_factors
from planner.config.loader import InvalidConfig, parse_yaml, read_text
from planner.config.schema import Config, EfficiencySection

MAX_FACTORS = 1_000  # a profile names each of the ~20 factors once per GPU family at most


class ProfileError(ValueError):
    """A profile moeplan cannot use (the message names the file, the entry and the fix)."""


def dump_profile(stack: dict[str, Any], factors: dict[str, float]) -> str:
    return yaml.safe_dump({"stack": stack, "factors": {k: float(v) for k, v in factors.items()}},
                          sort_keys=False)


@cache
def _field_check(name: str) -> TypeAdapter:
    """The validator of one efficiency field, with its range (gt/ge/le) from the schema."""
    info = EfficiencySection.model_fields[name]
    return TypeAdapter(info.rebuild_annotation())


def _range_problem(name: str, value: float) -> str | None:
    """Why `value` is outside the field's range (the schema's own message), or None."""
    try:
        _field_check(name).validate_python(value)
    except ValidationError as exc:
        return "; ".join(e["msg"] for e in exc.errors()).lower()
    return None


def _factor(path: str | Path, name: Any, value: Any) -> tuple[str, float]:
    text = str(name)[:80]
    if not isinstance(name, str) or split_name(name)[0] not in BY_NAME:
        raise ProfileError(f"{path}: factors.{text} is not a calibrated factor (known: "
                           f"{', '.join(BY_NAME)})")
    family = split_name(name)[1]
    if family and not family.isidentifier():
        raise ProfileError(f"{path}: factors.{text}: {family!r} after @ is not a GPU family name")
    shown = repr(value)[:40]
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ProfileError(f"{path}: factors.{text} = {shown} is not a number")
    if isinstance(value, int) and value.bit_length() > 64:
        raise ProfileError(f"{path}: factors.{text} is a {value.bit_length()}-bit integer: give "
                           "the fitted value (`moeplan calibrate LOG -o FILE` writes one)")
    number = float(value)
    if not math.isfinite(number):
        raise ProfileError(f"{path}: factors.{text} = {shown} is not a finite number: give the "
                           "fitted value (`moeplan calibrate LOG -o FILE` writes one)")
    field_name = split_name(name)[0]
    problem = _range_problem(field_name, number)
    if problem:
        raise ProfileError(f"{path}: factors.{text} = {number:g} is outside the range of "
                           f"cluster.efficiency.{field_name} ({problem}): a time priced with it "
                           "would not be positive; fit it again or fix the value")
    return name, number


def read_profile(path: str | Path) -> tuple[dict[str, Any], dict[str, float]]:
    """The stack and factors of a profile file; raises ProfileError (or the loader's
    UnreadableConfig for a file that cannot be read or parsed)."""
    try:
        data, _, duplicates = parse_yaml(read_text(path, "profile"), str(path))
    except InvalidConfig as exc:  # the node and alias caps
        raise ProfileError(f"{path}: " + "; ".join(f.message for f in exc.findings)) from None
    if not isinstance(data, dict) or not isinstance(data.get("factors"), dict):
        raise ProfileError(f"{path}: not a calibration profile (expected a 'factors' mapping; "
                           "write one with `moeplan calibrate LOG -o FILE`)")
    if duplicates:
        where, (line, _) = duplicates[0]
        raise ProfileError(f"{path}: key {'.'.join(map(str, where))} appears twice (line {line}): "
                           "keep one")
    if len(data["factors"]) > MAX_FACTORS:
        raise ProfileError(f"{path}: {len(data['factors']):,} factors; a profile has one per "
                           f"efficiency factor and GPU family ({len(BY_NAME)} factors)")
    factors = dict(_factor(path, name, value) for name, value in data["factors"].items())
    stack = data.get("stack") if isinstance(data.get("stack"), dict) else {}
    return stack, factors


def apply_profile(cfg: Config, path: str | Path | None) -> Config:
    """`cfg` with the profile's factors (the given file, else cluster.calibration, else as is)."""
    target = path or getattr(cfg.cluster, "calibration", None)
    if not target:
        return cfg
    _, factors = read_profile(target)
    return with_factors(cfg, factors)

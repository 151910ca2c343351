"""Run inside a subprocess with Megatron-LM dev on sys.path: hand an argument list to Megatron's own
`parse_args` -> `validate_args` -> `set_global_variables` -> `core_transformer_config_from_args`
and report fields of the config it builds. Stand-ins, each for a query that needs a GPU or a
package this CPU machine lacks, and nothing else patched:

* `typing.override` <- `typing_extensions.override` (Megatron's training code needs Python 3.12);
* `torch.cuda.get_device_capability` / `get_device_properties` -> sm_90 (a Hopper GPU);
* `megatron.core.utils._te_version` = 2.14.0 (the Transformer Engine version gate; TE is absent).

Input on stdin: a JSON list of {"argv": [...], "world_size": N, "fields": [...]}. Output: one JSON
line, per case {field: value}; values that are not JSON types are given as their repr.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import typing
from typing import Any

import torch
import typing_extensions
from packaging.version import Version

from tests.megatron_oracle import answer_cases

typing.override = typing_extensions.override  # type: ignore[attr-defined]


class _Sm90:
    major, minor = 9, 0


torch.cuda.get_device_capability = lambda *args, **kwargs: (9, 0)
torch.cuda.get_device_properties = lambda *args, **kwargs: _Sm90

with contextlib.redirect_stdout(io.StringIO()):
    import megatron.core.utils as megatron_utils
    from megatron.training.arguments import core_transformer_config_from_args, parse_args, validate_args
    from megatron.training.global_vars import set_global_variables, unset_global_variables

megatron_utils._te_version = Version("2.14.0")


def _plain(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)


def build_config(argv: list[str], world_size: int) -> Any:
    """The TransformerConfig Megatron's training entry builds from `argv` on rank 0 of `world_size`."""
    os.environ.update(WORLD_SIZE=str(world_size), RANK="0", LOCAL_RANK="0")
    sys.argv = ["pretrain", *argv]
    args = parse_args()
    validate_args(args)
    set_global_variables(args)
    try:
        return core_transformer_config_from_args(args)
    finally:
        unset_global_variables()


def config_fields(case: dict[str, Any]) -> dict[str, Any]:
    config = build_config(case["argv"], case["world_size"])
    return {name: _plain(getattr(config, name)) for name in case["fields"]}


if __name__ == "__main__":
    answer_cases(config_fields)

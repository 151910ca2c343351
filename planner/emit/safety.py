"""What a launch script will not accept from the `launch:` section, and why.

Quoting (render.py) makes any printable string inert in bash. Two things quoting cannot fix:
control characters — a newline inside an `#SBATCH` value ends the directive, and the rest of the
line becomes a shell command — and environment-variable *names*, which are never quoted. Those are
refused here, before anything is rendered, with the field to blame.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from planner.config.schema import Config

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Variables that change how bash itself runs the script (or its child shells).
SHELL_INTERNAL_NAMES = frozenset({
    "IFS", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4", "CDPATH", "GLOBIGNORE",
    "BASH_XTRACEFD", "PROMPT_COMMAND",
})

# sbatch options the batch script derives from the plan or from dedicated launch fields.
MANAGED_SBATCH_OPTIONS: dict[str, str] = {
    "--nodes": "cluster.nodes", "-N": "cluster.nodes",
    "--ntasks-per-node": "the plan (one torchrun agent per node)",
    "--ntasks": "the plan (one torchrun agent per node)", "-n": "the plan (one torchrun agent per node)",
    "--gpus-per-node": "cluster.gpus_per_node",
    "--cpus-per-task": "launch.cpus_per_task", "-c": "launch.cpus_per_task",
    "--job-name": "launch.job_name", "-J": "launch.job_name",
    "--output": "launch.output_dir", "-o": "launch.output_dir",
    "--error": "launch.output_dir", "-e": "launch.output_dir",
    "--partition": "launch.partition", "-p": "launch.partition",
    "--account": "launch.account", "-A": "launch.account",
    "--time": "launch.time", "-t": "launch.time",
}


class EmitError(ValueError):
    """A config that is valid for planning but cannot be written as a safe launch script."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


def _strings(cfg: Config) -> Iterator[tuple[str, str]]:
    launch = cfg.launch
    for name in ("job_name", "partition", "account", "time", "container_image", "output_dir"):
        value = getattr(launch, name)
        if value is not None:
            yield f"launch.{name}", value
    for index, entry in enumerate(launch.extra_sbatch):
        yield f"launch.extra_sbatch[{index}]", entry
    for key, value in launch.env.items():
        yield f"launch.env.{key}", key
        yield f"launch.env.{key}", value
    for index, entry in enumerate(launch.megatron_extra_args):
        yield f"launch.megatron_extra_args[{index}]", entry


def _option_name(entry: str) -> str:
    """`--time=1:00` → `--time`; `-t1:00` → `-t`; `--exclusive` → `--exclusive`."""
    if entry.startswith("--"):
        return entry.split("=", 1)[0]
    return entry[:2]


def check_launch_strings(cfg: Config) -> None:
    """Raise EmitError for the first launch value no script can carry safely."""
    for path, value in _strings(cfg):
        match = _CONTROL.search(value)
        if match:
            raise EmitError(path, f"contains the control character {match.group()!r}; launch values must "
                            "be single-line printable text")
    launch = cfg.launch
    for name in ("job_name", "time", "output_dir"):
        if not getattr(launch, name).strip():
            raise EmitError(f"launch.{name}", "must not be empty")
    for key in launch.env:
        if not _ENV_NAME.fullmatch(key):
            raise EmitError(f"launch.env.{key}", f"{key!r} is not a valid environment variable name "
                            "(letters, digits and _, not starting with a digit)")
        if key in SHELL_INTERNAL_NAMES or key.startswith("BASH_FUNC_"):
            raise EmitError(f"launch.env.{key}", f"{key} changes how bash runs the launch script itself; "
                            "set it outside moeplan if you really need it")
    for index, entry in enumerate(launch.extra_sbatch):
        path = f"launch.extra_sbatch[{index}]"
        if not entry.startswith("-") or entry.strip() != entry or entry in ("-", "--"):
            raise EmitError(path, f"{entry!r} is not one sbatch option; write each option as a single "
                            "word such as '--exclusive' or '--gres=gpu:8'")
        option = _option_name(entry)
        if option in MANAGED_SBATCH_OPTIONS:
            raise EmitError(path, f"{option} is set by moeplan from {MANAGED_SBATCH_OPTIONS[option]}; "
                            "change it there")

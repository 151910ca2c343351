"""A run folder's worth of files: plan.json plus the requested launch scripts, rendered completely
before anything is written, then written atomically and only where nothing would be overwritten
(unless forced) — a refused emit leaves the folder as it was.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from planner.config.schema import Config
from planner.emit.bridge import bridge_text
from planner.emit.safety import check_launch_strings, check_slurm_paths
from planner.emit.scripts import (
    MEGATRON_FILE,
    SLURM_FILE,
    TORCHRUN_FILE,
    megatron_script,
    slurm_script,
    torchrun_script,
)
from planner.emit.shape import PLAN_FILE, launch_shape
from planner.files.writing import WriteFailed, write_atomic

Target = Literal["torchrun", "slurm", "megatron", "bridge", "all"]
TARGETS: tuple[str, ...] = ("torchrun", "slurm", "megatron", "bridge", "all")
BRIDGE_FILE = "bridge_overrides.txt"
SCRIPT_MODE, DATA_MODE = 0o755, 0o644


@dataclass(frozen=True)
class EmittedFile:
    name: str
    text: str
    mode: int
    description: str


def emit_files(cfg: Config, plan: dict[str, Any], target: Target,
               config_path: Path | str) -> list[EmittedFile]:
    """Render everything `target` asks for (EmitError before any output when a value is unsafe)."""
    check_launch_strings(cfg)
    shape = launch_shape(cfg, plan, config_path)
    wanted = {"torchrun", "slurm", "megatron"} if target == "all" else {target}
    files = [EmittedFile(PLAN_FILE, json.dumps(plan, indent=1) + "\n", DATA_MODE,
                         f"compiled plan {plan['digest']}")]
    if "torchrun" in wanted:
        files.append(EmittedFile(TORCHRUN_FILE, torchrun_script(shape), SCRIPT_MODE,
                                 f"torchrun launcher, {shape.nodes} node(s) x {shape.nproc_per_node}"))
    if "slurm" in wanted:
        check_slurm_paths(cfg)
        files.append(EmittedFile(SLURM_FILE, slurm_script(cfg, shape), SCRIPT_MODE,
                                 f"Slurm batch script, {shape.nodes} node(s), srun + torchrun"))
    if "megatron" in wanted:
        files.append(EmittedFile(MEGATRON_FILE, megatron_script(cfg, shape), SCRIPT_MODE,
                                 "Megatron-LM argument list"))
    if "bridge" in wanted:
        files.append(EmittedFile(BRIDGE_FILE, bridge_text(cfg, config_path), DATA_MODE,
                                 "Megatron-Bridge ConfigContainer overrides"))
    return files


def log_folder(cfg: Config, out_dir: Path, files: list[EmittedFile]) -> Path | None:
    """Slurm opens --output/--error before the script runs and fails silently when their folder is
    missing, so a relative launch.output_dir is created next to job.sbatch at emit time."""
    if not any(f.name == SLURM_FILE for f in files) or os.path.isabs(cfg.launch.output_dir):
        return None
    return out_dir / cfg.launch.output_dir


def existing(out_dir: Path, files: list[EmittedFile]) -> list[Path]:
    return [out_dir / f.name for f in files if (out_dir / f.name).exists()]


def write_files(out_dir: Path, files: list[EmittedFile], logs: Path | None = None) -> list[Path]:
    """Write each file atomically (plan first, so a script never points at a missing plan);
    WriteFailed names the path and the cause."""
    written = []
    for folder in (out_dir, logs):
        try:
            if folder is not None:
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteFailed(folder, f"cannot create the folder ({exc.strerror or exc})") from None
    for f in files:
        path = out_dir / f.name
        write_atomic(path, f.text, mode=f.mode)
        written.append(path)
    return written

"""Render the three launch scripts from a config and its compiled plan."""

from __future__ import annotations

import posixpath

from planner.config.schema import Config
from planner.emit.megatron import megatron_arguments
from planner.emit.render import render
from planner.emit.safety import slurm_literal
from planner.emit.shape import PLAN_FILE, REPORT_FILE, LaunchShape

TORCHRUN_FILE = "torchrun.sh"
SLURM_FILE = "job.sbatch"
MEGATRON_FILE = "megatron_args.sh"


def torchrun_script(shape: LaunchShape) -> str:
    return render("torchrun.sh.j2", shape=shape, plan_file=PLAN_FILE, report_file=REPORT_FILE)


def slurm_script(cfg: Config, shape: LaunchShape) -> str:
    launch = cfg.launch
    return render(
        "job.sbatch.j2", shape=shape, launch=launch, plan_file=PLAN_FILE, report_file=REPORT_FILE,
        output_path=posixpath.join(slurm_literal(launch.output_dir), "%x-%j.out"),
        error_path=posixpath.join(slurm_literal(launch.output_dir), "%x-%j.err"),
    )


def megatron_script(cfg: Config, shape: LaunchShape) -> str:
    return render("megatron_args.sh.j2", shape=shape, args=megatron_arguments(cfg))


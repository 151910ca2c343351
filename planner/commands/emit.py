"""`moeplan emit {torchrun,slurm,megatron,bridge,all} CONFIG -o DIR`: plan.json plus launch scripts
(bridge: Megatron-Bridge ConfigContainer overrides; `all` writes the launchers, not the overrides).

With `--check-with MEGATRON_LM_DIR` the user's own Megatron-LM judges the emitted arguments first;
nothing is written unless it passes (exit 1 when Megatron rejects them or derives other values than
the plan, exit 2 when the folder or `--check-python` cannot run it).
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from planner.cli_common import EXIT_CONFIG, EXIT_USAGE, exit_on_errors, fail, load_config_or_exit, stdout
from planner.config.schema import Config

CheckWith = Annotated[Path | None, typer.Option(
    "--check-with", metavar="MEGATRON_LM_DIR", help="first run this Megatron-LM (the folder holding the "
    "megatron package) on the emitted arguments; write nothing unless it accepts them and derives the "
    "plan's values")]
CheckPython = Annotated[str, typer.Option(
    "--check-python", help="the Python that runs --check-with (needs torch, numpy, packaging, pyyaml, "
    "einops, typing_extensions, triton)")]


class EmitTarget(StrEnum):
    torchrun = "torchrun"
    slurm = "slurm"
    megatron = "megatron"
    bridge = "bridge"
    all = "all"


def _next_steps(out_dir: Path, names: set[str]) -> list[str]:
    hints = []
    if "torchrun.sh" in names:
        hints.append(f"run here:       bash {out_dir / 'torchrun.sh'}")
    if "job.sbatch" in names:
        hints.append(f"submit:         cd {out_dir} && sbatch job.sbatch")
    if "megatron_args.sh" in names:
        hints.append(f"Megatron args:  bash {out_dir / 'megatron_args.sh'}")
    return hints


def megatron_preflight(cfg: Config, plan: dict[str, object], megatron_lm: Path, python: str,
                       config: Path) -> None:
    """Print Megatron-LM's verdict on the plan's arguments; exit 1 (rejected or other values) or 2
    (cannot run) unless it passes."""
    from planner.emit import EmitError
    from planner.emit.megatron_check import CheckUnusable, check_config, summary_lines

    try:
        run = check_config(cfg, plan, megatron_lm, python, name=str(config))
    except CheckUnusable as exc:
        fail(EXIT_USAGE, f"--check-with {megatron_lm}: {exc}")
    except EmitError as exc:
        fail(EXIT_CONFIG, f"{exc.path}: {exc.message}")
    [result] = run.results
    for line in summary_lines(run, megatron_lm):
        stdout.print(line, markup=False)
    if not result.passed:
        fail(EXIT_CONFIG, "Megatron-LM does not build this plan as moeplan does; nothing written")


def emit_command(
    target: Annotated[EmitTarget, typer.Argument(help="which launcher to write (all = every one)")],
    config: Annotated[Path, typer.Argument(help="YAML config to compile and emit")],
    output: Annotated[Path, typer.Option("-o", "--output", help="run folder to write into")],
    force: Annotated[bool, typer.Option("--force", help="overwrite files that already exist")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what would be written, write nothing")
                       ] = False,
    check_with: CheckWith = None,
    check_python: CheckPython = sys.executable,
) -> None:
    """Compile CONFIG and write plan.json plus the requested launch scripts into a run folder."""
    from planner.emit import EmitError, emit_files, existing, log_folder, write_files
    from planner.plan import compile_plan

    cfg = load_config_or_exit(config)
    findings = exit_on_errors(cfg)
    if output.exists() and not output.is_dir():
        fail(EXIT_USAGE, f"{output} exists and is not a folder")
    plan = compile_plan(cfg, findings)
    try:
        files = emit_files(cfg, plan, target.value, config)
    except EmitError as exc:
        fail(EXIT_CONFIG, f"{exc.path}: {exc.message}")
    clashes = existing(output, files)
    if clashes and not force:
        fail(EXIT_USAGE, f"{', '.join(str(p) for p in clashes)} already exist(s); pass --force to overwrite")
    logs = log_folder(cfg, output, files)
    if check_with is not None:
        megatron_preflight(cfg, plan, check_with, check_python, config)
    if dry_run:
        stdout.print(f"dry run: would write {len(files)} file(s) into {output}/", markup=False)
        for f in files:
            verb = "overwrite" if (output / f.name).exists() else "create"
            size = f"mode {f.mode:o}, {len(f.text)} bytes"
            stdout.print(f"  {verb} {output / f.name} ({size}): {f.description}", markup=False)
        if logs is not None and not logs.exists():
            stdout.print(f"  create folder {logs} (Slurm log files)", markup=False)
        for f in files:
            if f.mode & 0o111:
                sys.stdout.write(f"\n===== {output / f.name} =====\n{f.text}")
        return
    from planner.files.writing import WriteFailed

    try:
        written = write_files(output, files, logs)
    except WriteFailed as exc:
        fail(EXIT_USAGE, f"cannot write into {output}: {exc}")
    stdout.print(f"wrote {', '.join(str(p) for p in written)} (plan {plan['digest'][:19]}…)", markup=False)
    for hint in _next_steps(output, {f.name for f in files}):
        stdout.print(f"  {hint}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("emit")(emit_command)

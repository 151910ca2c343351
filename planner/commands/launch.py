"""`moeplan launch CONFIG`: compile, emit torchrun.sh into a fresh run folder, run every rank of the
plan on this machine, then show `moeplan verify` for the report it wrote."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from planner.cli_common import EXIT_CONFIG, EXIT_USAGE, exit_on_errors, fail, load_config_or_exit, stdout
from planner.commands.emit import CheckPython, CheckWith, megatron_preflight

_UNSAFE_IN_FOLDER_NAME = re.compile(r"[^A-Za-z0-9._-]+")
INTERRUPTED = 130
DEFAULT_MAX_RANKS = 32


def run_folder(runs_dir: Path, job_name: str) -> Path:
    """`runs/<job>-<UTC time>/`, created now and never reused (a suffix breaks same-second ties)."""
    slug = _UNSAFE_IN_FOLDER_NAME.sub("_", job_name).strip("._-") or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    runs_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        folder = runs_dir / (f"{slug}-{stamp}" if attempt == 1 else f"{slug}-{stamp}-{attempt}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"no free run folder name under {runs_dir}")


def local_environment(world_size: int) -> dict[str, str]:
    """Every rank on this machine: one node, all ranks local, this interpreter unless PYTHON says."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("NODE_RANK", "MASTER_ADDR", "RDZV_ID")}
    env.update(NNODES="1", NPROC_PER_NODE=str(world_size))
    env.setdefault("PYTHON", sys.executable)
    return env


def show_verify(plan_path: Path, report_path: Path) -> int:
    """The same table and verdict `moeplan verify PLAN REPORT` prints; its exit code."""
    from planner.commands.verify import verify_command

    try:
        verify_command(plan_path=plan_path, report_path=report_path, rank=None,
                       mismatches_only=False, as_json=False)
    except typer.Exit as done:
        return done.exit_code
    return 0


def launch_command(
    config: Annotated[Path, typer.Argument(help="YAML config to compile and run here")],
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="where run folders are created")] = Path(
        "runs"),
    max_ranks: Annotated[int, typer.Option("--max-ranks", min=1, help="refuse plans with more ranks: "
                                           "every rank becomes a process on this machine")
                         ] = DEFAULT_MAX_RANKS,
    check_with: CheckWith = None,
    check_python: CheckPython = sys.executable,
) -> None:
    """Compile CONFIG, emit torchrun.sh into a fresh run folder, run it on this machine, verify."""
    from planner.emit import EmitError, emit_files, write_files
    from planner.plan import compile_plan

    cfg = load_config_or_exit(config)
    findings = exit_on_errors(cfg)
    world = cfg.parallel.world_size
    if world > max_ranks:
        fail(EXIT_USAGE, f"the plan has {world} ranks and launch starts every one of them on this "
             f"machine (limit --max-ranks {max_ranks}); for a cluster use `moeplan emit slurm` or "
             "`moeplan emit torchrun`")
    plan = compile_plan(cfg, findings)
    try:
        files = emit_files(cfg, plan, "torchrun", config)
    except EmitError as exc:
        fail(EXIT_CONFIG, f"{exc.path}: {exc.message}")
    if check_with is not None:  # before the run folder exists: a refused plan leaves nothing behind
        megatron_preflight(cfg, plan, check_with, check_python, config)
    from planner.files.writing import WriteFailed

    try:
        folder = run_folder(runs_dir, cfg.launch.job_name)
        write_files(folder, files)
    except OSError as exc:
        fail(EXIT_USAGE, f"cannot create a run folder under {runs_dir}: {exc.strerror or exc}")
    except WriteFailed as exc:
        fail(EXIT_USAGE, f"cannot write the run folder: {exc}")
    stdout.print(f"run folder {folder}: {world} rank(s) on this machine, plan {plan['digest'][:19]}…",
                 markup=False)
    sys.stdout.flush()
    try:
        run = subprocess.run(["bash", str(folder / "torchrun.sh")], env=local_environment(world))
    except KeyboardInterrupt:
        fail(INTERRUPTED, f"interrupted; partial results in {folder}")
    code = run.returncode if run.returncode >= 0 else 128 - run.returncode  # killed by a signal
    report = folder / "report.json"
    if not report.exists():
        fail(code or EXIT_USAGE, f"the run wrote no report (exit code {code}); see the output above "
             f"and {folder}")
    stdout.print(f"\nmoeplan verify {folder / 'plan.json'} {report}", markup=False)
    verified = show_verify(folder / "plan.json", report)
    raise typer.Exit(code or verified)


def register(app: typer.Typer) -> None:
    app.command("launch")(launch_command)

"""`moeplan calibrate LOG... [--gpu NAME] [--config CONFIG] [-o profile.yaml] [--json]`.

Each Megatron log gives a measured step (planner/calibrate/megatron_log.py) and, through its
config (planner/calibrate/source.py), a predicted one; the efficiency factors the runs exercise
are fitted by bounded least squares (planner/calibrate/fit.py), the rest stay at their defaults
and the output says so. Printed per run: measured, predicted before and after, and predicted peak
memory beside each rank's `max allocated`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from planner.cli_common import EXIT_OK, EXIT_USAGE, check_output_or_exit, fail, stdout, write_or_exit


def calibrate(
    logs: Annotated[list[Path], typer.Argument(help="Megatron-LM training logs (console output)")],
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU of the runs when the logs do not "
                                                         "name it (a cluster.gpu catalog name)")] = None,
    config: Annotated[list[Path] | None, typer.Option("--config", help="config of each log, in "
                                                      "order (one for all when given once); without "
                                                      "it, each log's argument dump is the config")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write the profile YAML")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON object only")] = False,
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing -o file")] = False,
) -> None:
    """Fit the step-time model's efficiency factors to measured Megatron runs."""
    from planner.calibrate.calibration import CalibrationError, run_calibration

    configs = list(config or [])
    if configs and len(configs) not in (1, len(logs)):
        fail(EXIT_USAGE, f"--config given {len(configs)} times for {len(logs)} logs: give one per "
                         "log, in order, or one for all")
    if output is not None:
        check_output_or_exit(output, force=force)
    try:
        result = run_calibration(logs, configs, gpu)
    except CalibrationError as exc:
        fail(exc.code, str(exc))
    if output is not None:
        write_or_exit(output, result.profile_yaml())
    if as_json:
        print(json.dumps(result.as_json(), indent=1))
    else:
        _render(result.as_json(), output)
    raise typer.Exit(EXIT_OK)


def _render(data: dict[str, Any], output: Path | None) -> None:
    from planner.calibrate.calibration import apart_text  # as run_calibration: only when run

    for run in data["runs"]:
        stdout.print(f"[bold]{escape(run['log'])}[/]: measured {run['measured_step_s']:.3f} s/step, "
                     f"predicted {run['predicted_step_s_before']:.3f} s before, "
                     f"{run['predicted_step_s_after']:.3f} s after")
        for note in run["notes"]:
            stdout.print(f"  note: {escape(note)}")
        reserved = run["reserved_by_rank"]
        for rank, (measured, predicted, _, device) in sorted(run["memory_by_rank"].items(),
                                                             key=lambda kv: int(kv[0])):
            line = (f"  rank {rank}: max allocated {measured / 2**30:.2f} GiB, predicted peak "
                    f"{predicted / 2**30:.2f} GiB")
            if rank in reserved:
                line += (f"; max reserved {reserved[rank][0] / 2**30:.2f} GiB, predicted "
                         f"{reserved[rank][1] / 2**30:.2f} GiB")
            stdout.print(line + f"; predicted device total {device / 2**30:.2f} GiB")
    for name, f in data["factors"].items():
        state = (f"fitted in [{f['low']:g}, {f['high']:g}]" if f["fitted"]
                 else f"not fitted: {f['why']}")
        stdout.print(f"{escape(name)}: {f['value']:.4g} (default {f['default']:.4g}; {escape(state)})"
                     + (f"; identified by {len(f['identified_by'])} runs" if f["fitted"] else ""))
        if f["missing_term"]:
            stdout.print(f"  [yellow]missing term:[/] {escape(f['missing_term'])}")
    for run in data["unexplained_runs"]:
        apart = apart_text(run) or "no field"
        stdout.print(f"[yellow]{escape(run['run'])}: still {run['error']:+.1%} after the fit[/]: no "
                     "shared factor separates it from the other runs; it alone sets "
                     f"{escape(apart)}" + (f" (of {run['apart_fields']} fields)"
                                           if run["apart_fields"] > len(run["apart_in"]) else "")
                     + ": a term for what those change is missing or mispriced")
    stack = ", ".join(f"{k} {v}" for k, v in data["stack"].items() if k != "logs")
    stdout.print(f"[dim]stack: {escape(stack)}" + (f"; profile written to {escape(str(output))}"
                                                    if output else "") + "[/]")


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)




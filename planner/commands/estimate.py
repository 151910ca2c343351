"""`moeplan estimate CONFIG`: predicted step time, tokens/s/GPU, Megatron TFLOP/s/GPU and MFU.

Every figure comes from the time page of the formula book (planner/budget/time.py) and its
pipeline page (planner/budget/pipeline.py: bubble and step across stages); `--explain NAME` shows
one of their quantities as formula → substitution → value. The efficiency factors used
are printed with every estimate (cluster.efficiency overrides them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from planner.cli_common import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_USAGE,
    CalibrationOption,
    calibrated_or_exit,
    collect_findings,
    fail,
    load_config_or_exit,
    print_findings,
    stdout,
)
from planner.findings import has_errors

if TYPE_CHECKING:  # pragma: no cover - typing only
    from planner.estimate import Estimate


def estimate(
    config: Annotated[Path, typer.Argument(help="YAML config to estimate")],
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON object only")] = False,
    explain: Annotated[str | None, typer.Option("--explain", metavar="NAME",
                                                help="show one quantity's formula and values "
                                                     "(on the slowest stage)")] = None,
    calibration: CalibrationOption = None,
    measured: Annotated[Path | None, typer.Option("--measured", metavar="LOG", help="a Megatron "
                        "log of this config's run: its measured step beside the prediction")] = None,
) -> None:
    """Predicted step time per stage and its parts; the slowest stage sets the step."""
    cfg, used = calibrated_or_exit(load_config_or_exit(config), calibration)
    # As `moeplan budget`: findings go to stderr and decide the exit code; a layout with errors
    # (one that does not fit included) is still estimated when its grids can be built.
    findings = collect_findings(cfg)
    done = EXIT_CONFIG if has_errors(findings) else EXIT_OK
    from planner.accounting import BudgetError, pretty
    from planner.estimate import estimate as run

    try:
        result = run(cfg)
    except BudgetError as exc:
        print_findings(findings)
        fail(EXIT_CONFIG, f"no estimate for {config}: {exc} (run `moeplan check` for the findings)")
    if explain is not None:
        budget = result.explain(explain)
        if budget is None:
            fail(EXIT_USAGE, f"--explain {explain}: no such quantity (see `moeplan budget --json` "
                             "or docs/formulas.md for the names)")
        if as_json:
            print(json.dumps(budget.as_json() | {"substitution": budget.substitution,
                                                 "doc": budget.doc}, indent=1))
        else:
            stdout.print(f"[bold]{escape(budget.name)}[/] ({escape(budget.scope)}): "
                         f"{escape(budget.doc)}\n{escape(pretty(budget.formula))}\n"
                         f"= {escape(budget.substitution)}\n= {float(budget.value):.6g} {budget.unit}")
        print_findings(findings)
        raise typer.Exit(done)
    data = result.as_json()
    data["breakdown"]["calibration"] = used
    if measured is not None:
        data["measured"] = _compare_or_exit(result, measured)
    if as_json:
        print(json.dumps(data, indent=1))
    else:
        _render(data)
    print_findings(findings)
    raise typer.Exit(done)


def _compare_or_exit(est: Estimate, path: Path) -> dict[str, Any]:
    """The measured log beside the estimate. The exit lives here, not in planner/calibrate/, so
    the library raises and only a command decides the exit code: an unreadable log is a usage
    error (2), a log without timing lines a config error (1)."""
    from planner.calibrate.compare import compare_log
    from planner.calibrate.megatron_log import LogError, parse_log
    from planner.calibrate.memory_lines import memory_report
    from planner.config.loader import UnreadableConfig, read_lines

    try:
        log = parse_log(read_lines(path, "log"), str(path))  # streamed, a line at a time
        out = compare_log(est, log, str(path))
        out["memory"] = memory_report(est.cfg, log)
        return out
    except UnreadableConfig as exc:
        fail(EXIT_USAGE, str(exc).replace("YAML", "log"))
    except LogError as exc:
        fail(EXIT_CONFIG, str(exc))


def _render(data: dict[str, Any]) -> None:
    b = data["breakdown"]
    stdout.print(f"step time [bold]{data['step_time_s']:.3f} s[/] (stage {b['slowest_stage']} is "
                 f"the slowest)   {data['tokens_per_s_per_gpu']:.0f} tokens/s/GPU   "
                 f"{data['tflops_per_gpu']:.1f} TFLOP/s/GPU (Megatron's formula, "
                 f"{data['flops_per_token'] / 1e9:.1f} GFLOP/token)   MFU "
                 f"{data['mfu']['value']:.1%} of the {escape(data['mfu']['denominator'])}")
    table = Table(title="per stage (first rank), seconds per step", title_justify="left")
    for column in ("stage", "compute", "exposed comm", "bubble", "optimizer", "step", "top exposed"):
        table.add_column(column, justify="left" if column == "top exposed" else "right")
    for row in b["stages"]:
        top = sorted(row["exposed_comm_parts_s"].items(), key=lambda kv: -kv[1])[:2]
        table.add_row(str(row["stage"]), f"{row['compute_s']:.3f}", f"{row['exposed_comm_s']:.3f}",
                      f"{row['bubble_s']:.3f}", f"{row['optimizer_s']:.3f}", f"{row['step_s']:.3f}",
                      ", ".join(f"{k} {v:.2f}" for k, v in top))
    stdout.print(table)
    eff = ", ".join(f"{k} {v:g}" for k, v in b["efficiency"].items())
    stdout.print(f"[dim]efficiency factors (cluster.efficiency): {escape(eff)}; NVLink domain "
                 f"{b['nvlink_domain']} GPUs; calibration: {escape(str(b.get('calibration')))}[/]")
    if "measured" in data:
        m = data["measured"]
        stdout.print(f"measured [bold]{m['measured_step_s']:.3f} s[/] per step vs predicted "
                     f"{m['predicted_step_s']:.3f} s (ratio {m['ratio']:.2f}); the terms that "
                     "would have to move to close the gap:")
        for term in m["terms"]:
            stdout.print(f"  {escape(term['term'])} {term['seconds']:.3f} s: x{term['scale']:.2f} "
                         f"alone ({escape(term['factor'])})")
        for row in m.get("memory", []):
            line = (f"rank {row['rank']}: max allocated {row['max_allocated_bytes'] / 2**30:.2f} GiB "
                    f"vs predicted {row['predicted_peak_bytes'] / 2**30:.2f} GiB (ratio "
                    f"{row['allocated_ratio']:.2f})")
            if "max_reserved_bytes" in row:
                line += (f"; max reserved {row['max_reserved_bytes'] / 2**30:.2f} GiB vs predicted "
                         f"{row['predicted_reserved_bytes'] / 2**30:.2f} GiB")
            stdout.print(line + f"; predicted device total {row['predicted_device_bytes'] / 2**30:.2f} GiB")


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate)

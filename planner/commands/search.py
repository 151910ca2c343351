"""`moeplan search CONFIG`: the fastest fitting layouts of CONFIG's model, cluster and batch.

The search itself is planner/search/run.py (candidates judged by the rule catalog, timed by the
estimate); this module prints it, shows a progress bar and writes the winner with `--emit`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from planner.cli_common import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_USAGE,
    CalibrationOption,
    calibrated_or_exit,
    check_output_or_exit,
    collect_findings,
    exit_with_findings,
    fail,
    load_config_or_exit,
    print_findings,
    stderr,
    stdout,
    write_or_exit,
)

GIB = 1 << 30


def search(
    config: Annotated[Path, typer.Argument(help="YAML config whose model, cluster and batch to keep")],
    top: Annotated[int, typer.Option("--top", min=1, help="how many candidates to list")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON object only")] = False,
    emit: Annotated[Path | None, typer.Option("--emit", metavar="FILE",
                                              help="write the winner as a config")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing --emit file")] = False,
    memory_headroom: Annotated[float | None, typer.Option(
        "--memory-headroom", metavar="FRACTION",
        help="the share of GPU memory a candidate's device total (busiest stage and EP rank) may "
             "use (default 1 - cluster.memory_margin, MEM002's line; 1 accepts layouts at the "
             "edge, what MEM001 alone accepts)")] = None,
    refine: Annotated[int, typer.Option(
        "--refine", min=0, help="families whose layouts and knobs are searched in full, fastest "
                                "first (default 0: every family that fits, the whole space; N: "
                                "the N fastest at their anchor, a faster heuristic)")] = 0,
    calibration: CalibrationOption = None,
) -> None:
    """Search TP, CP, PP (layouts, VPP), EP, ETP, micro-batch, recompute, dispatcher and EP
    overlap; rank what the rules and the memory budget accept by predicted step time."""
    if memory_headroom is not None and not 0 < memory_headroom <= 1:
        fail(EXIT_USAGE, f"--memory-headroom {memory_headroom}: give a fraction of GPU memory in "
                         "(0, 1], e.g. 0.9")
    if emit is not None:
        check_output_or_exit(emit, force=force, option="--emit")
    cfg, calibration_used = calibrated_or_exit(load_config_or_exit(config, as_json=as_json),
                                               calibration)
    findings = collect_findings(cfg)
    blocking = [f for f in findings if f.severity == "error" and f.code != "MEM001"]
    if blocking:  # a layout that does not fit is what search is for; other errors are not
        exit_with_findings(findings, as_json=as_json)
    if emit is not None and not (emit.parent if str(emit.parent) else Path(".")).is_dir():
        fail(EXIT_USAGE, f"--emit {emit}: cannot write (no folder {emit.parent})")
    from planner.search.run import search as run

    options = {"top": top, "refine": refine, "memory_headroom": memory_headroom}
    if as_json:
        result = run(cfg, **options)
    else:
        result = _with_progress(cfg, options, run)
    if as_json:
        print(json.dumps(result.as_json() | {"calibration": calibration_used}, indent=1))
    else:
        _render(result)
        stdout.print(f"[dim]ranked with calibration: {escape(calibration_used)}[/]")
    if emit is not None and result.winner is not None:
        _emit(config, emit, result.winner, quiet=as_json)
    if result.winner is None:
        if not as_json:
            stderr.print("[bold red]no layout fits[/]: every candidate was refused "
                         "(see the reasons above)")
        raise typer.Exit(EXIT_CONFIG)
    raise typer.Exit(EXIT_OK)


def _with_progress(cfg: Any, options: dict[str, Any], run: Any) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=stderr, transient=True) as bar:
        task = bar.add_task("searching layouts", total=None)
        return run(cfg, **options, progress=lambda done, total: bar.update(task, completed=done,
                                                                         total=total))


def _render(result: Any) -> None:
    headroom = (f" within {result.memory_headroom:.0%} of GPU memory"
                if result.memory_headroom < 1 else "")
    stdout.print(f"explored {result.explored} configs: {result.legal} legal, {result.fitting} "
                 f"fit{headroom} and were timed, in {result.wall_s:.1f} s; not built: "
                 + "; ".join(f"{n} {why}" for why, n in result.pruned_by.items() if n))
    table = Table(title="fastest fitting layouts", title_justify="left")
    for column in ("#", "TP", "CP", "PP", "VPP", "EP", "ETP", "DP", "MBS", "recompute", "dispatcher",
                   "EP overlap", "step s", "TFLOP/s/GPU", "tokens/s/GPU", "peak GiB (stage)",
                   "device GiB", "headroom"):
        table.add_column(column, justify="left" if column in ("recompute", "dispatcher") else "right")
    for i, cand in enumerate(result.candidates, 1):
        j = cand.as_json()
        p, moe = j["parallel"], j["moe"]
        dispatcher = moe["moe_token_dispatcher_type"] + (
            f"/{moe['moe_flex_dispatcher_backend']}" if moe["moe_flex_dispatcher_backend"] else "")
        table.add_row(f"{i}{' (yours)' if cand.is_user else ''}", *(str(p[k]) for k in
                      ("tp", "cp", "pp", "vpp", "ep", "etp", "dp")),
                      str(j["training"]["micro_batch_size"]), escape(j["recompute"]), dispatcher,
                      "yes" if j["overlap_moe_expert_parallel_comm"] else "no",
                      f"{cand.step_time_s:.3f}", f"{cand.tflops_per_gpu:.1f}",
                      f"{cand.tokens_per_s_per_gpu:.0f}",
                      f"{cand.peak_memory_bytes / GIB:.1f} ({cand.peak_stage})",
                      f"{cand.device_memory_bytes / GIB:.1f}", f"{cand.headroom:.1%}")
    stdout.print(table)
    winner = result.winner
    if winner is None:
        return
    layout = winner.cfg.parallel.pipeline_model_parallel_layout
    if layout:
        stdout.print(f"winner's pipeline layout: {escape(layout)}")
    if len(winner.stage_step_s) > 1:
        stdout.print("winner's step time per stage (s): "
                     + " ".join(f"{t:.2f}" for t in winner.stage_step_s))
    if result.user is not None and not winner.is_user:
        gain = result.user.step_time_s / winner.step_time_s
        stdout.print(f"your layout: {result.user.step_time_s:.3f} s per step; the winner is "
                     f"{gain:.2f}x faster")
    elif result.user is None:
        stdout.print("your layout does not fit or is not legal (see the findings of `moeplan check`)")
    if result.ruled_out:
        stdout.print("faster candidates near the winner that were ruled out:")
        for r in result.ruled_out:
            stdout.print(f"  {r.step_time_s:.3f} s  {escape(_changes_text(r.difference or {}))}: "
                         f"{escape(r.reason)}")


def _changes_text(difference: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in difference.items()) or "the same knobs"


def _emit(source: Path, target: Path, winner: Any, *, quiet: bool) -> None:
    """Write the winner over the user's YAML (their comments dropped), checked before writing."""
    from planner.commands.import_ import config_yaml
    from planner.config.loader import InvalidConfig, parse_config, parse_yaml, read_text
    from planner.findings import has_errors
    from planner.rules import run_rules

    raw, _, _ = parse_yaml(read_text(source), str(source))
    data = emitted_data(raw, winner)
    hf = (data.get("model") or {}).get("hf_config")
    if isinstance(hf, str) and not Path(hf).is_absolute():  # keep it pointing at the same file
        data["model"]["hf_config"] = str((source.parent / hf).resolve())
    text = config_yaml(data, [f"moeplan search winner for {source.name}: "
                              f"{winner.step_time_s:.3f} s per step (predicted)"])
    try:
        emitted = parse_config(parse_yaml(text, str(target))[0], base_dir=target.parent)
    except InvalidConfig as exc:
        print_findings(exc.findings)
        fail(EXIT_USAGE, f"--emit {target}: the winner does not load back (a bug); nothing written")
    if has_errors(run_rules(emitted)):
        fail(EXIT_USAGE, f"--emit {target}: the winner does not pass the rules (a bug); nothing written")
    write_or_exit(target, text)
    if not quiet:
        stdout.print(f"wrote the winner to {escape(str(target))}")


def emitted_data(raw: dict[str, Any], winner: Any) -> dict[str, Any]:
    """The user's YAML data with the winner's knobs written over it (None drops a key); the
    user's own layout (no knobs) leaves it as it is."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for section, values in (winner.knobs.sections() if winner.knobs else {}).items():
        target = data.setdefault(section, {})
        for key, value in values.items():
            for alias in _aliases(section, key):
                target.pop(alias, None)
            if value is not None and value is not False or key in target:
                target[key] = value
            if value is None:
                target.pop(key, None)
    return data


def _aliases(section: str, key: str) -> list[str]:
    """The other spellings the schema accepts for a field (e.g. tensor_model_parallel_size)."""
    from planner.config.schema import Config

    model = Config.model_fields[section].annotation
    info = getattr(model, "model_fields", {}).get(key)
    choices = getattr(getattr(info, "validation_alias", None), "choices", None) or []
    return [c for c in choices if isinstance(c, str) and c != key]


def register(app: typer.Typer) -> None:
    app.command("search")(search)

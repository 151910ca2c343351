"""`moeplan groups CONFIG`: the process groups Megatron-Core would build, offline.

Default: one table per layout (dense, expert). `--rank R`: what R holds and talks to.
`--kind K`: one kind in full. `--svg FILE`: one pipeline stage drawn in both views.
`--json`: the same data, machine-readable, groups in Megatron's generator order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from planner import cli_common
from planner.cli_common import (
    EXIT_USAGE,
    check_output_or_exit,
    exit_on_errors,
    exit_with_findings,
    fail,
    load_config_or_exit,
    write_or_exit,
)
from planner.files.reading import STDIN, UnreadableInput, read_text
from planner.files.result_cache import load, result_key, store
from planner.findings import Finding
from planner.layout.grid import Grid, RankView
from planner.layout.rank_generator import GridError
from planner.layout.spec import GridSpec, grid_spec_from_config

if TYPE_CHECKING:
    from rich.table import Table

_SHOWN_RANKS = 12  # ranks printed per group before it is abbreviated
_CACHE_KIND = "grid-spec"


def format_group(group: list[int], limit: int = _SHOWN_RANKS) -> str:
    """A group as text; long ones as runs, e.g. `[0–63, 128–191, …, 960–1023] (1024)`."""
    if len(group) <= limit:
        return "[" + ", ".join(map(str, group)) + "]"
    runs: list[tuple[int, int]] = []
    for rank in group:
        if runs and rank == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], rank)
        else:
            runs.append((rank, rank))
    if all(a == b for a, b in runs):
        body = f"{group[0]}, {group[1]}, …, {group[-1]}"
    else:
        shown = [f"{a}–{b}" if a != b else str(a) for a, b in runs]
        body = ", ".join(shown if len(shown) <= 4 else [*shown[:2], "…", shown[-1]])
    return f"[{body}] ({len(group)})"


def _grid_or_exit(cfg: Any, as_json: bool) -> Grid:
    """Build the grid; a layout Megatron would reject exits 1 like a rule finding."""
    try:
        return Grid(grid_spec_from_config(cfg))
    except GridError as err:
        findings = [
            Finding("GRID", "error", "parallel", problem,
                    "fix the parallel degrees or order (see `moeplan check`)",
                    "Megatron-LM dev@d48bd6be megatron/core/parallel_state.py initialize_model_parallel")
            for problem in err.problems
        ]
        exit_with_findings(findings, as_json=as_json)


def _valid_grid(config: Path, as_json: bool) -> Grid:
    """The grid of a config the rules pass, or exit as `check` would.

    A config this moeplan found valid before is not validated again: its grid spec is read from the
    result cache (planner/files/result_cache.py, keyed by the config's bytes and moeplan's files),
    so a job that asks `groups --rank R` once per rank loads neither the schema nor the rules."""
    text = _config_text(config)
    key = None if text is None else result_key(_CACHE_KIND, text.encode())
    if key is not None:
        cached = load(_CACHE_KIND, key)
        if isinstance(cached, dict):
            try:
                return Grid(GridSpec.from_json(cached))
            except (TypeError, ValueError, GridError):
                pass  # an entry another version wrote: validate as without it
    cfg = load_config_or_exit(config, as_json=as_json, text=text)
    # Megatron builds the groups of a layout that will not fit memory (the OOM comes later, at the
    # first step), so only the rules on what Megatron refuses to build decide here: `check` and
    # `budget` judge memory. This also keeps the formula book out of `groups --rank R --json`.
    exit_on_errors(cfg, as_json=as_json, budget=False)
    grid = _grid_or_exit(cfg, as_json)
    from planner.config.loader import may_read_other_files  # loaded already, by the validation

    if key is not None and not may_read_other_files(text):
        store(_CACHE_KIND, key, grid.spec.to_json())
    return grid


def _config_text(config: Path) -> str | None:
    """A config file's text, read once for both the cache key and the validation; stdin (which the
    loader reads itself) and anything unreadable go the validating way, which reports them."""
    if str(config) == STDIN:
        return None
    try:
        return read_text(config, "config")
    except (UnreadableInput, OSError):
        return None


def _header(grid: Grid) -> str:
    s = grid.spec
    return (
        f"N = {s.world_size}   DP = {grid.dp}   EDP = {grid.edp}   PP = {s.pp}   "
        f"ranks/stage = {s.ranks_per_stage}\n"
        f"dense order  {grid.dense.order}  sizes {list(grid.dense.sizes)}\n"
        f"expert order {grid.expert.order}  sizes {list(grid.expert.sizes)}"
    )


def _layout_table(grid: Grid, layout: str, first: int) -> Table:
    from rich.table import Table

    table = Table(title=f"{layout} layout", title_justify="left")
    for name, justify in (("kind", "left"), ("built from", "left"), ("size", "right"),
                          ("groups", "right"), ("first groups", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for kind in grid.listing_kinds():  # families (hcp, DP×CP chunks) member by member
        record = grid.group_kind(kind)
        if record.grid != layout:
            continue
        groups = grid.groups(kind)
        shown = "\n".join(format_group(g) for g in groups[:first])
        if len(groups) > first:
            shown += f"\n… {len(groups) - first} more"
        table.add_row(kind, record.built_from, str(grid.group_size(kind)), str(grid.num_groups(kind)), shown)
    return table


def _print_rank(view: RankView, only_kind: str | None) -> None:
    from rich.table import Table

    stdout = cli_common.stdout
    stdout.print(f"[bold]rank {view.rank}[/] — pipeline stage {view.stage}", markup=True)
    dense = "  ".join(f"{a}={v}" for a, v in view.dense_coords.items())
    expert = "  ".join(f"{a}={v}" for a, v in view.expert_coords.items())
    stdout.print(f"dense coordinates   {dense}\nexpert coordinates  {expert}")
    table = Table(title="groups containing this rank", title_justify="left")
    for name in ("kind", "size", "ranks"):
        table.add_column(name)
    for kind, group in view.groups.items():
        if only_kind in (None, kind):
            text = str(group) if only_kind else format_group(group)
            table.add_row(kind, str(len(group)), text)
    stdout.print(table)
    if only_kind is not None:
        return
    own = view.experts
    if own.expert_ids:
        layers = list(own.experts_by_layer) or "none on this stage"
        stdout.print(
            f"experts: EP rank {own.ep_rank} of {own.ep_size} holds global experts "
            f"{own.expert_ids[0]}–{own.expert_ids[-1]} in every MoE layer of stage {own.stage} "
            f"(MoE layers: {layers}); {own.shard}"
        )
    else:
        stdout.print(f"experts: {own.note}")
    stdout.print(f"expert replicas (expt_dp peers, same parameters): {list(own.replica_peers)}")
    for name, formula in view.formulas.items():
        coords = ", ".join(f"{sym}={value}" for sym, value in formula.coordinates_of(view.rank).items())
        stdout.print(
            f"{name} formula: {formula.text()}  ({formula.ranges()})\n"
            f"    stage {view.stage}: {formula.text(stage=True)};  {coords}"
        )


def groups(
    config: Annotated[Path, typer.Argument(help="YAML config")],
    rank: Annotated[int | None, typer.Option("--rank", help="show what this rank holds")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="print one group kind in full")] = None,
    svg: Annotated[Path | None, typer.Option("--svg", help="write a picture of one stage")] = None,
    stage: Annotated[int, typer.Option("--stage", help="pipeline stage for --svg")] = 0,
    first: Annotated[int, typer.Option("--first", min=1, help="groups shown per kind")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing --svg file")] = False,
) -> None:
    """Print the process groups Megatron-Core would build, or one rank's view of them."""
    if svg is not None:
        check_output_or_exit(svg, force=force, option="--svg")
    grid = _valid_grid(config, as_json)
    spec = grid.spec
    if rank is not None and not 0 <= rank < spec.world_size:
        fail(EXIT_USAGE, f"--rank {rank} is outside 0..{spec.world_size - 1}")
    families = {f: m for f, m in grid.members.items() if m}
    known = grid.listing_kinds() + list(families)
    if kind is not None and kind not in known:
        fail(EXIT_USAGE, f"--kind {kind} is not a group kind of this layout; one of: "
                         f"{', '.join(known)}")
    if rank is not None and kind in families:
        fail(EXIT_USAGE, f"with --rank ask for one member of {kind}: {', '.join(families[kind])}")
    if svg is not None:
        _write_svg(grid, svg, stage, quiet=as_json)
    if rank is not None:
        view = grid.rank_view(rank)
        if as_json:
            payload = _json_head(grid) | view.to_dict()
            if kind is not None:
                payload["groups"] = {k: g for k, g in view.groups.items() if k == kind}
            print(json.dumps(payload))
        else:
            _print_rank(view, kind)
        return
    if as_json:
        kinds = [kind] if kind is not None else list(grid.kinds)
        print(json.dumps(_json_head(grid) | {"groups": {k: grid.groups(k) for k in kinds}}))
        return
    stdout = cli_common.stdout  # rich is imported only for the text and tables below
    if kind is not None:
        stdout.print(f"[bold]{kind}[/]: {grid.num_groups(kind)} group(s)", markup=True)
        for i, group in enumerate(grid.groups(kind)):
            stdout.print(f"{i}: {group}")
        return
    if svg is not None:
        return
    stdout.print(_header(grid))
    stdout.print(_layout_table(grid, "dense", first))
    stdout.print(_layout_table(grid, "expert", first))


def _json_head(grid: Grid) -> dict[str, Any]:
    s = grid.spec
    return {
        "world_size": s.world_size,
        "order": s.order,
        "dp": grid.dp,
        "edp": grid.edp,
        "dense_order": grid.dense.order,
        "expert_order": grid.expert.order,
    }


def _write_svg(grid: Grid, path: Path, stage: int, *, quiet: bool) -> None:
    from planner.report.grid_svg import render_stage_svg

    if not 0 <= stage < grid.spec.pp:
        fail(EXIT_USAGE, f"--stage {stage} is outside 0..{grid.spec.pp - 1}")
    write_or_exit(path, render_stage_svg(grid, stage))
    if not quiet:
        cli_common.stdout.print(f"wrote {path} (stage {stage}, {grid.spec.ranks_per_stage} ranks)")


def register(app: typer.Typer) -> None:
    app.command("groups")(groups)

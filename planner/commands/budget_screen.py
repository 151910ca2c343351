"""`moeplan budget CONFIG`'s first screen: the verdict, per-stage peak memory with a bar, the
largest collectives per step and the step-time estimate (planner/summary.py gathers them)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from planner.accounting import phase_label
from planner.cli_common import stdout
from planner.summary import HEADROOM_SHARE, Summary, gib
from planner.units import format_bytes

BAR_WIDTH = 40
TOP_COLLECTIVES = 10
TOP_TIME_PARTS = 6
_VERDICT_STYLE = {"fits": "bold green", "MEM002": "bold yellow", "MEM001": "bold red",
                  "errors": "bold red"}


def bar(share: float, width: int = BAR_WIDTH, mark: float = HEADROOM_SHARE) -> str:
    """`share` of the GPU as a bar of `width` cells, with `|` where MEM002's line (`mark`) falls."""
    filled = min(width, round(share * width))
    line = round(mark * width)
    cells = ["█" if i < filled else ("|" if i == line else "·") for i in range(width)]
    return "".join(cells) + ("▶" if share > 1 else "")


def _bytes(value: float) -> str:
    return format_bytes(int(value), digits=1)


def render_screen(summary: Summary) -> None:
    style = _VERDICT_STYLE[summary.verdict]
    stdout.print(f"[{style}]{escape(summary.headline())}[/]")
    for f in summary.errors + [f for f in summary.findings if f.code == "MEM002"]:
        stdout.print(f"  {f.code} {escape(f.path)}: {escape(f.message)} [dim](fix: {escape(f.fix)})[/]")
    if summary.budget_error or not summary.stages:
        return
    _memory(summary)
    _collectives(summary)
    _time(summary)
    stdout.print("[dim]full tables: --all   one stage or rank: --stage S / --rank R   formulas: "
                 "--explain   machine-readable: --json[/]")


def _memory(summary: Summary) -> None:
    gpu = summary.stages[0].gpu
    table = Table(title=f"peak memory per stage (first rank's max allocated) and device total "
                        f"(busiest EP rank; GPU {gib(gpu)}, | marks {summary.line * 100:.0f} %)",
                  title_justify="left", box=None, pad_edge=False)
    for name, justify in (("stage", "right"), ("rank", "right"), ("peak", "right"),
                          ("device", "right"), ("share", "right"), ("0 % … 100 % of the GPU", "left"),
                          ("largest part", "left")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for s in summary.stages:
        part, value = max(s.parts.items(), key=lambda kv: kv[1])
        share = s.device_share
        colour = "red" if share > 1 else "yellow" if share > summary.line else "green"
        table.add_row(str(s.stage), str(s.rank), gib(s.peak), gib(s.device), f"{share:.1%}",
                      f"[{colour}]{bar(share, mark=summary.line)}[/]", f"{part} {gib(value)}")
    stdout.print(table)


def _collectives(summary: Summary) -> None:
    table = Table(title=f"largest collectives per optimizer step (top {TOP_COLLECTIVES}, on the "
                        "stage where each is largest; step = once per step)",
                  title_justify="left", box=None, pad_edge=False)
    for name, justify in (("collective", "left"), ("phase", "left"), ("stage", "right"),
                          ("on the wire", "right"), ("intra-node", "right"),
                          ("inter-node", "right"), ("inter share", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for c in summary.collectives[:TOP_COLLECTIVES]:
        table.add_row(c.name, c.label, str(c.stage), _bytes(c.wire), _bytes(c.intra),
                      _bytes(c.inter), f"{c.inter / c.wire:.0%}" if c.wire else "–")
    stdout.print(table)
    if len(summary.collectives) > TOP_COLLECTIVES:
        stdout.print(f"[dim]{len(summary.collectives) - TOP_COLLECTIVES} more issued collective "
                     "phases in --all[/]")


def _time(summary: Summary) -> None:
    est = summary.estimate
    if est is None:
        stdout.print(f"[dim]no step-time estimate: {escape(summary.estimate_error or '')}[/]")
        return
    b = est["breakdown"]
    slow = b["stages"][b["slowest_stage"]]
    stdout.print(f"step time [bold]{est['step_time_s']:.2f} s[/] (estimate; stage "
                 f"{b['slowest_stage']} is the slowest)   {est['tokens_per_s_per_gpu']:.0f} "
                 f"tokens/s/GPU   MFU {est['mfu']['value']:.1%}")
    stdout.print("  " + "   ".join(f"{name} {slow[key]:.2f} s" for name, key in (
        ("compute", "compute_s"), ("exposed comm", "exposed_comm_s"), ("bubble", "bubble_s"),
        ("optimizer", "optimizer_s"))))
    parts = [(f"compute {k}", v) for k, v in slow["compute_parts_s"].items()]
    for key, value in slow["exposed_comm_parts_s"].items():
        name, phase = key.rsplit(".", 1)
        parts.append((f"exposed {name} {phase_label(name, phase)}", value))
    largest = sorted(parts, key=lambda kv: -kv[1])[:TOP_TIME_PARTS]
    stdout.print(f"  largest parts of stage {b['slowest_stage']}'s step:")
    for name, seconds in largest:
        stdout.print(f"    {seconds:8.2f} s  {escape(name)}")

"""Judge the step-time model on published figures (bench/heldout.yaml) by source family: the
fitted factors (FITTED) refitted without a family, then that family's figures predicted.

Every figure is a real moeplan config (a base from the data file with the figure's fragment
merged over it) that goes through the loader, the rule catalog and `planner.estimate.estimate`,
as `moeplan estimate` would. Printed per figure: predicted and published throughput
(tokens/s/GPU, or Megatron TFLOP/s/GPU where a source gives only that; one-layer figures: forward
+ backward milliseconds of the MoE layer), their ratio,
Megatron's GFLOP/token next to the published TFLOP/s ÷ tokens/s, and what the rule catalog says
(a rule error or MEM001 "does not fit" is shown, never hidden: the figure is still estimated when
its grids build). Last line: the median absolute error |ratio − 1| over the estimated figures.

These figures judge; they do not gate: nothing here fails on a bad ratio.

    OMP_NUM_THREADS=1 .venv/bin/python bench/heldout.py               # table on the terminal
    OMP_NUM_THREADS=1 .venv/bin/python bench/heldout.py --markdown    # the table as Markdown
    OMP_NUM_THREADS=1 .venv/bin/python bench/heldout.py --update-docs # rewrite docs/estimate.md's table
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.accounting import BudgetError  # noqa: E402
from planner.calibrate.factors import with_factors  # noqa: E402
from planner.calibrate.fit import Run, fit  # noqa: E402
from planner.config.loader import InvalidConfig, parse_config  # noqa: E402
from planner.config.schema import Config  # noqa: E402
from planner.estimate import estimate  # noqa: E402
from planner.findings import Finding  # noqa: E402
from planner.rules import run_rules  # noqa: E402

DATA = ROOT / "bench" / "heldout.yaml"
DOC = ROOT / "docs" / "estimate.md"
BEGIN, END = "<!-- heldout table: begin -->", "<!-- heldout table: end -->"


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` deep-merged onto `base` (mappings merge, anything else replaces)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = (merged(out[key], value) if isinstance(value, dict)
                    and isinstance(out.get(key), dict) else value)
    return out


@dataclass
class Figure:
    """One published figure and the moeplan config of its layout."""

    id: str
    source: str
    published: dict[str, float]
    data: dict[str, Any]
    recipe: str = ""
    notes: str = ""
    calibration: bool = False  # a figure the default factors were fitted on (it does not judge)
    sweep: str = ""  # figures of one sweep: one model, cluster and stack, several settings
    family: str = ""  # the publication the figure comes from (one stack, one team, one write-up)
    sweep_only: bool = False  # a point of a scaling curve read for its order, not its value

    @property
    def is_layer(self) -> bool:
        """One-MoE-layer figures publish forward/backward milliseconds, not throughput."""
        return "forward_ms" in self.published

    @property
    def metric(self) -> str:
        """What is compared: the layer's seconds, else the step's seconds, else tokens/s/GPU,
        else (a source that gives only that) Megatron TFLOP/s/GPU."""
        if self.is_layer:
            return "layer_s"
        for name in ("step_time_s", "tokens_per_s_per_gpu"):
            if name in self.published:
                return name
        return "tflops_per_gpu"

    @property
    def is_time(self) -> bool:
        """A time (lower is faster), not a throughput."""
        return self.metric in ("layer_s", "step_time_s")

    @property
    def published_value(self) -> float:
        if self.is_layer:
            return (self.published["forward_ms"] + self.published["backward_ms"]) / 1e3
        return float(self.published[self.metric])

    def config(self) -> Config:
        return parse_config(self.data)


# libyaml's safe loader where PyYAML has it: the file's 3,200 lines take 0.2 s instead of 1.2 s,
# paid by every bench run and by each test worker that collects tests/unit/test_heldout.py.
_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


def load_figures(path: Path = DATA) -> list[Figure]:
    raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_LOADER)  # noqa: S506 - a safe loader
    bases = raw.get("bases", {})
    figures = []
    for entry in raw["figures"]:
        base = bases[entry["base"]] if "base" in entry else {}
        figures.append(Figure(id=entry["id"], source=entry["source"],
                              published=entry["published"],
                              data=merged(base, entry.get("config", {})),
                              recipe=entry.get("recipe", ""), notes=entry.get("notes", ""),
                              calibration=bool(entry.get("calibration",
                                                         not entry.get("sweep_only", False))),
                              sweep=entry.get("sweep", ""), family=entry["family"],
                              sweep_only=bool(entry.get("sweep_only", False))))
    return figures


@dataclass
class Judged:
    """A figure, what the model predicts for it, and what the rule catalog says of its layout."""

    figure: Figure
    predicted: float | None = None
    gflop_per_token: float | None = None
    findings: list[Finding] = field(default_factory=list)
    failure: str = ""

    @property
    def ratio(self) -> float | None:
        """Predicted speed over published speed: above 1, moeplan is too fast."""
        if self.predicted is None:
            return None
        ratio = self.predicted / self.figure.published_value
        return 1 / ratio if self.figure.is_time else ratio

    def run(self) -> Run:
        """The figure as a measured run for a fit: its step (or layer) seconds, the throughput
        converted through the predicted step (tokens and FLOPs per step are the config's)."""
        assert self.ratio is not None
        cfg = self.figure.config()
        if self.figure.is_layer:
            return Run(self.figure.id, cfg, self.figure.published_value, "layer_s")
        step = estimate(cfg, exact=False).step_time_s
        return Run(self.figure.id, cfg, step * self.ratio)

    @property
    def verdict(self) -> str:
        """The rule catalog's errors (first clause of each message), then why no estimate."""
        parts = [f"{f.code} {f.message.split(' (')[0]}" for f in self.findings
                 if f.severity == "error"]
        return "; ".join(parts + [self.failure] if self.failure else parts) or "ok"


def judge(figure: Figure, factors: dict[str, float] | None = None) -> Judged:
    """The figure estimated with the default factors, or with `factors` in their place."""
    try:
        cfg = with_factors(figure.config(), factors or {})
    except InvalidConfig as exc:
        return Judged(figure, failure="config: " + "; ".join(
            f"{f.code} {f.path}: {f.message}" for f in exc.findings))
    out = Judged(figure, findings=run_rules(cfg))
    try:
        est = estimate(cfg)
    except BudgetError as exc:
        out.failure = f"no estimate: {exc}"
        return out
    data = est.as_json()
    out.gflop_per_token = data["flops_per_token"] / 1e9
    out.predicted = (est.moe_layer_seconds() if figure.is_layer
                     else est.step_time_s if figure.metric == "step_time_s" else data[figure.metric])
    return out


def median_abs_error(rows: list[Judged]) -> float | None:
    errors = [abs(r.ratio - 1) for r in rows if r.ratio is not None]
    return statistics.median(errors) if errors else None


def _value(figure: Figure, value: float | None) -> str:
    if value is None:
        return "—"
    return {"layer_s": f"{value * 1e3:.2f} ms", "step_time_s": f"{value:.3f} s/step",
            "tokens_per_s_per_gpu": f"{value:,.0f}",
            "tflops_per_gpu": f"{value:,.0f} TFLOP/s"}[figure.metric]


def _gflop(row: Judged) -> str:
    pub = row.figure.published
    published = (f"{pub['tflops_per_gpu'] * 1e3 / pub['tokens_per_s_per_gpu']:.1f}"
                 if {"tflops_per_gpu", "tokens_per_s_per_gpu"} <= set(pub) else "—")
    ours = "—" if row.gflop_per_token is None or row.figure.is_layer else f"{row.gflop_per_token:.1f}"
    return f"{published} / {ours}"


HEADER = ("figure", "published", "predicted", "ratio", "GFLOP/token published / moeplan",
          "moeplan check")


def table_rows(rows: list[Judged]) -> list[tuple[str, ...]]:
    return [(r.figure.id + (" (calibration)" if r.figure.calibration else ""),
             _value(r.figure, r.figure.published_value), _value(r.figure, r.predicted),
             "—" if r.ratio is None else f"{r.ratio:.2f}", _gflop(r), r.verdict) for r in rows]


def kendall_tau(pairs: list[tuple[float, float]]) -> tuple[float, int, int]:
    """Kendall's tau-a of (measured, predicted) values, and the pairs in measured order of all
    pairs (a tied prediction counts as out of order)."""
    concordant = discordant = 0
    for i in range(len(pairs)):
        for j in range(i + 1, len(pairs)):
            sign = (pairs[i][0] - pairs[j][0]) * (pairs[i][1] - pairs[j][1])
            concordant += sign > 0
            discordant += sign <= 0
    total = concordant + discordant
    return ((concordant - discordant) / total if total else 1.0), concordant, total


def sweep_rows(rows: list[Judged]) -> list[tuple[str, int, str, str]]:
    """Per sweep: figures, pairs in measured order, Kendall tau (throughput, or layer speed)."""
    sweeps: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r.figure.sweep and r.predicted is not None:
            # Faster is higher: throughput as is, seconds inverted.
            flip = -1.0 if r.figure.is_time else 1.0
            sweeps.setdefault(r.figure.sweep, []).append(
                (flip * r.figure.published_value, flip * r.predicted))
    out = []
    for name, pairs in sweeps.items():
        tau, good, total = kendall_tau(pairs)
        out.append((name, len(pairs), f"{good}/{total}", f"{tau:.2f}"))
    return out


def sweep_markdown(rows: list[Judged]) -> str:
    lines = ["| sweep | figures | pairs in measured order | Kendall τ |", "|---|---|---|---|"]
    found = sweep_rows(rows)
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in found]
    good = sum(int(c.split("/")[0]) for _, _, c, _ in found)
    total = sum(int(c.split("/")[1]) for _, _, c, _ in found)
    if total:
        lines.append(f"\nSame-sweep pairs in the measured order: {good} of {total} "
                     f"({good / total:.0%}).")
    return "\n".join(lines) + "\n"


# The factors whose defaults (planner/config/schema.py EfficiencySection, the GPU catalog's GEMM
# shares and Grace's host scale, planner/config/gpus.py) are fitted on the bench; every other
# default is measured or cited. `--fit-defaults` prints the fit on every calibration figure;
# leaving a family out refits them on the calibration figures of the other families only.
FITTED = ("host_us_per_launch", "host_launch_scale@grace", "gemm_bf16@hopper",
          "gemm_bf16@blackwell", "gemm_fp8@hopper", "gemm_fp8@blackwell")
FIT_ITERATIONS = 10


@dataclass
class FamilyRow:
    """One source family: its figures judged with the defaults and with the factors fitted on
    the calibration figures of the other families only."""

    family: str
    rows: list[Judged]
    held_out: list[Judged]
    calibration: int
    values: dict[str, float]


def _errors(rows: list[Judged]) -> list[float]:
    return [abs(r.ratio - 1) for r in rows if r.ratio is not None]


def calibration_runs(rows: list[Judged]) -> dict[str, Run]:
    """The figures the defaults are fitted on, as measured runs."""
    return {r.figure.id: r.run() for r in rows if r.figure.calibration and r.ratio is not None}


def leave_family_out(rows: list[Judged]) -> list[FamilyRow]:
    """Per family: FITTED refitted on the calibration figures of every other family, and every
    figure of the family (calibration or not; sweep-only points aside) judged with that fit."""
    runs = calibration_runs(rows)
    out = []
    for family in sorted({r.figure.family for r in rows}):
        judged = [r for r in rows if r.figure.family == family and not r.figure.sweep_only]
        others = [runs[r.figure.id] for r in rows
                  if r.figure.id in runs and r.figure.family != family]
        values = fit(others, FITTED, iterations=FIT_ITERATIONS).values
        held = [judge(r.figure, values) for r in judged]
        out.append(FamilyRow(family, judged, held, len(runs) - len(others), values))
    return out


def family_markdown(families: list[FamilyRow]) -> str:
    def med(rows: list[Judged]) -> str:
        errors = _errors(rows)
        return f"{statistics.median(errors):.1%}" if errors else "—"

    def worst(rows: list[Judged]) -> str:
        errors = _errors(rows)
        return f"{max(errors):.1%}" if errors else "—"
    lines = ["| source family | figures | of them calibration | median error, defaults | "
             "median error, fitted without the family | worst, fitted without |",
             "|---|---|---|---|---|---|"]
    for f in families:
        lines.append(f"| {f.family} | {len(f.rows)} | {f.calibration} | {med(f.rows)} | "
                     f"{med(f.held_out)} | {worst(f.held_out)} |")
    held = [r for f in families for r in f.held_out]
    per_family = [statistics.median(_errors(f.held_out)) for f in families if _errors(f.held_out)]
    lines.append(f"\nLeave-one-source-family-out (each family judged by {', '.join(FITTED)} "
                 "fitted on the other families' calibration figures): median |ratio − 1| = "
                 f"{statistics.median(_errors(held)):.1%} over {len(_errors(held))} figures of "
                 f"{len(families)} families; the median family's median "
                 f"{statistics.median(per_family):.1%}; worst family "
                 f"{max(per_family):.1%}.\n")
    return "\n".join(lines) + "\n"


def summary(rows: list[Judged]) -> str:
    def part(name: str, subset: list[Judged]) -> str:
        mae = median_abs_error(subset)
        estimated = sum(r.ratio is not None for r in subset)
        return (f"{name}: none estimated" if mae is None
                else f"{name}: median |ratio − 1| = {mae:.1%} over {estimated} of {len(subset)}")
    fitted = [r for r in rows if r.figure.calibration]
    whole = [r for r in fitted if not r.figure.is_layer]
    layers = [r for r in fitted if r.figure.is_layer]
    held = [r for r in rows if not r.figure.calibration and not r.figure.sweep_only]
    never = [r for r in rows if r.figure.sweep_only]
    flagged = sum(r.verdict != "ok" for r in rows)
    return (f"in sample (the defaults are fitted on these; the leave-one-family-out table below "
            f"is the honest figure): {part('all calibration figures', fitted)}; "
            f"{part('whole models', whole)}; {part('one MoE layer', layers)}; never fitted: "
            f"{part('held-out figures', held)}; {part('scaling-curve points', never)}. "
            f"{flagged} flagged by the rule catalog or not estimated (still counted when "
            "estimated). Ratio = predicted speed / published speed: "
            "tokens/s/GPU for whole models (TFLOP/s/GPU where only that is published, the "
            "inverse of the step time where that is), the inverse of forward + backward time for "
            "one layer; above 1 moeplan is too fast")


def markdown(rows: list[Judged]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
              for row in table_rows(rows)]
    return ("\n".join(lines) + "\n\n" + summary(rows) + ".\n\n" + sweep_markdown(rows))


def plain(rows: list[Judged]) -> str:
    body = [HEADER, *table_rows(rows)]
    widths = [max(len(row[i]) for row in body) for i in range(len(HEADER) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
             for row in body]
    return "\n".join(lines) + "\n" + summary(rows) + "\n\n" + sweep_markdown(rows)


def update_docs(text: str, doc: Path = DOC) -> None:
    """Replace what lies between the held-out markers of docs/estimate.md (atomic write)."""
    page = doc.read_text(encoding="utf-8")
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{doc}: the markers {BEGIN} … {END} are missing")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    tmp = doc.with_suffix(".md.tmp")
    tmp.write_text(f"{head}{BEGIN}\n{text}{END}{tail}", encoding="utf-8")
    tmp.replace(doc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--update-docs", action="store_true",
                        help="rewrite the held-out table in docs/estimate.md")
    parser.add_argument("--only", metavar="SUBSTRING", help="judge the figures whose id has it")
    parser.add_argument("--no-refit", action="store_true",
                        help="skip the leave-one-source-family-out refits")
    parser.add_argument("--fit-defaults", action="store_true",
                        help="print the factors fitted on every calibration figure (the defaults)")
    args = parser.parse_args(argv)
    figures = [f for f in load_figures() if not args.only or args.only in f.id]
    rows = [judge(f) for f in figures]
    if args.fit_defaults:
        result = fit(list(calibration_runs(rows).values()), FITTED, iterations=FIT_ITERATIONS,
                     use_prior=False)
        print("\n".join(f"{n}: {result.values[n]:.4g} (now {result.defaults[n]:.4g})"
                        for n in FITTED))
        return 0
    text = markdown(rows)
    if not args.no_refit:
        text += "\n" + family_markdown(leave_family_out(rows))
    if args.update_docs:
        update_docs(text)
    print(text if args.markdown or args.update_docs else
          plain(rows) + text[text.index("| source family"):] if not args.no_refit else plain(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Judge the step-time model on published figures it was never calibrated on (bench/heldout.yaml).

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

    @property
    def is_layer(self) -> bool:
        """One-MoE-layer figures publish forward/backward milliseconds, not throughput."""
        return "forward_ms" in self.published

    @property
    def metric(self) -> str:
        """What is compared: the layer's seconds, else tokens/s/GPU, else (a source that gives
        only that) Megatron TFLOP/s/GPU."""
        if self.is_layer:
            return "layer_s"
        return ("tokens_per_s_per_gpu" if "tokens_per_s_per_gpu" in self.published
                else "tflops_per_gpu")

    @property
    def published_value(self) -> float:
        if self.is_layer:
            return (self.published["forward_ms"] + self.published["backward_ms"]) / 1e3
        return float(self.published[self.metric])

    def config(self) -> Config:
        return parse_config(self.data)


def load_figures(path: Path = DATA) -> list[Figure]:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    bases = raw.get("bases", {})
    figures = []
    for entry in raw["figures"]:
        base = bases[entry["base"]] if "base" in entry else {}
        figures.append(Figure(id=entry["id"], source=entry["source"],
                              published=entry["published"],
                              data=merged(base, entry.get("config", {})),
                              recipe=entry.get("recipe", ""), notes=entry.get("notes", ""),
                              calibration=bool(entry.get("calibration", False)),
                              sweep=entry.get("sweep", "")))
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
        return None if self.predicted is None else self.predicted / self.figure.published_value

    @property
    def verdict(self) -> str:
        """The rule catalog's errors (first clause of each message), then why no estimate."""
        parts = [f"{f.code} {f.message.split(' (')[0]}" for f in self.findings
                 if f.severity == "error"]
        return "; ".join(parts + [self.failure] if self.failure else parts) or "ok"


def judge(figure: Figure) -> Judged:
    try:
        cfg = figure.config()
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
    out.predicted = est.moe_layer_seconds() if figure.is_layer else data[figure.metric]
    return out


def median_abs_error(rows: list[Judged]) -> float | None:
    errors = [abs(r.ratio - 1) for r in rows if r.ratio is not None]
    return statistics.median(errors) if errors else None


def _value(figure: Figure, value: float | None) -> str:
    if value is None:
        return "—"
    return {"layer_s": f"{value * 1e3:.2f} ms", "tokens_per_s_per_gpu": f"{value:,.0f}",
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
            # Faster is higher: throughput as is, a layer's seconds inverted.
            flip = -1.0 if r.figure.is_layer else 1.0
            sweeps.setdefault(r.figure.sweep, []).append(
                (flip * r.figure.published_value, flip * r.predicted))
    out = []
    for name, pairs in sweeps.items():
        tau, good, total = kendall_tau(pairs)
        out.append((name, len(pairs), f"{good}/{total}", f"{tau:.2f}"))
    return out


def sweep_markdown(rows: list[Judged]) -> str:
    lines = ["| sweep | figures | pairs in measured order | Kendall τ |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in sweep_rows(rows)]
    return "\n".join(lines) + "\n"


def summary(rows: list[Judged]) -> str:
    def part(name: str, subset: list[Judged]) -> str:
        mae = median_abs_error(subset)
        estimated = sum(r.ratio is not None for r in subset)
        return (f"{name}: none estimated" if mae is None
                else f"{name}: median |ratio − 1| = {mae:.1%} over {estimated} of {len(subset)}")
    judging = [r for r in rows if not r.figure.calibration]
    whole = [r for r in judging if not r.figure.is_layer]
    layers = [r for r in judging if r.figure.is_layer]
    flagged = sum(r.verdict != "ok" for r in rows)
    calibration = [r for r in rows if r.figure.calibration]
    return (f"held out: {part('all figures', judging)}; {part('whole models', whole)}; "
            f"{part('one MoE layer', layers)}; {part('calibration figures', calibration)}. "
            f"{flagged} flagged by the rule catalog or not "
            "estimated (still counted when estimated). Ratio = predicted / published: "
            "tokens/s/GPU for whole models (TFLOP/s/GPU where only that is published), "
            "forward + backward time for one layer")


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
    args = parser.parse_args(argv)
    figures = [f for f in load_figures() if not args.only or args.only in f.id]
    rows = [judge(f) for f in figures]
    text = markdown(rows)
    if args.update_docs:
        update_docs(text)
    print(text if args.markdown or args.update_docs else plain(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

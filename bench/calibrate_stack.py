"""`moeplan calibrate` on four published runs of one stack, then a fifth run of that stack
predicted with the fitted factors: does a calibration carry to a run it did not see?

The runs are published figures of bench/heldout.yaml (each with its source there), grouped by
their sweep (one model, one cluster, one stack, several settings). For every run of the sweep in
turn, the four runs before it in the file's order (wrapping round, the run itself left out) are
calibrated with the command's own code (planner/calibrate/calibration.py `calibrate_runs`: the
same factor choice, bounded fit and identification as `moeplan calibrate LOG...`), and the fifth
is predicted with the fitted factors. Printed: each fit's four runs reproduced (measured, fitted,
error), the fifth predicted (measured, predicted, error), which runs identified each fitted
factor, and any factor that ended at its bound, named as a missing term.

`--carry SWEEP` then fits every run of the sweep at once and predicts each run of another sweep
of the same stack with those factors (another model, a software feature added): whether a
calibration carries past the layouts it saw.

The default factors were fitted on bench/heldout.yaml's calibration figures, the Moonlight rows
among them (bench/heldout.py FITTED); the GB200 write-up, gpt-oss and AMD rows are held out of that
fit. Nothing here gates. The documented sweeps (docs/estimate.md, "Four runs of one stack"):

    moonlight-recompute               Moonlight-16B, 8 H100, six recompute settings (calibration rows)
    pf-scaling-qwen2-57b-mcore        Qwen2-57B MCore, 64-1024 H100 (a scaling curve, never fitted)
    gb200-writeup-roadmap             DeepSeek-V3, 256 GB200, each row a software step (never fitted)
    amd-dsv2lite-mi355x-baseline-mbs  DeepSeek-V2-Lite, 8 MI355X, Primus baseline, MBS 1-12 (held out;
                                      --carry amd-dsv2lite-mi355x-features amd-dsv2-mi355x-32-features)
    aws-qwen3-30b-p5-efa              Qwen3-30B-A3B, 64 H100 on AWS EFA, EP16/32 x MBS x EP overlap
                                      (never fitted; moeplan 1.16-1.50x too fast on every row)

    OMP_NUM_THREADS=1 .venv/bin/python bench/calibrate_stack.py                       # Moonlight
    OMP_NUM_THREADS=1 .venv/bin/python bench/calibrate_stack.py --sweep NAME --markdown
    OMP_NUM_THREADS=1 .venv/bin/python bench/calibrate_stack.py --sweep NAME --carry OTHER
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from heldout import Figure, judge, load_figures  # noqa: E402

from planner.calibrate.calibration import apart_text, calibrate_runs, missing_term  # noqa: E402
from planner.calibrate.fit import Run  # noqa: E402

FIT_RUNS = 4


def sweep_runs(sweep: str) -> list[Run]:
    """The sweep's figures as measured runs (their published step, or throughput converted
    through the predicted step: bench/heldout.py Judged.run)."""
    runs = []
    for figure in load_figures():
        if figure.sweep != sweep:
            continue
        judged = judge(figure)
        if judged.ratio is None:
            print(f"  {figure.id}: no estimate ({judged.verdict}); left out", file=sys.stderr)
            continue
        runs.append(judged.run())
    return runs


def one_fold(runs: list[Run], held: int) -> dict[str, object]:
    """Calibrate on the FIT_RUNS runs after `held` (wrapping), predict run `held`."""
    order = [runs[(held + 1 + i) % len(runs)] for i in range(len(runs) - 1)][:FIT_RUNS]
    result = calibrate_runs(order)
    fitted = {n: v for n, v in result.values.items() if n not in result.why}
    target = runs[held]
    return {"fit": [(r.name, r.measured, a) for r, a in zip(order, result.after, strict=True)],
            "fifth": (target.name, target.measured, target.predict({}), target.predict(fitted)),
            "fitted": fitted, "identified": result.identified,
            "missing": [missing_term(n, fitted[n]) for n in sorted(result.pinned)],
            "unexplained": result.unexplained}


def error(predicted: float, measured: float) -> float:
    return predicted / measured - 1


def report(sweep: str, markdown: bool) -> int:
    runs = sweep_runs(sweep)
    if len(runs) <= FIT_RUNS:
        print(f"sweep {sweep}: {len(runs)} runs with an estimate; a fit of {FIT_RUNS} and a fifth "
              "need more", file=sys.stderr)
        return 1
    rows: list[tuple[str, ...]] = []
    fit_errors, fifth_errors, default_errors = [], [], []
    notes = []
    for held in range(len(runs)):
        fold = one_fold(runs, held)
        for name, measured, after in fold["fit"]:  # type: ignore[attr-defined]
            fit_errors.append(abs(error(after, measured)))
            rows.append((f"fold {held + 1}", "fit", name, f"{measured:.4g}", f"{after:.4g}",
                         f"{error(after, measured):+.1%}"))
        name, measured, default, predicted = fold["fifth"]  # type: ignore[misc]
        fifth_errors.append(abs(error(predicted, measured)))
        default_errors.append(abs(error(default, measured)))
        rows.append((f"fold {held + 1}", "**fifth**" if markdown else "FIFTH", name,
                     f"{measured:.4g}", f"{predicted:.4g} (defaults {default:.4g})",
                     f"{error(predicted, measured):+.1%}"))
        factors = ", ".join(f"{n} {v:.4g} (from {len(fold['identified'].get(n, []))} runs)"  # type: ignore[attr-defined]
                            for n, v in fold["fitted"].items())  # type: ignore[attr-defined]
        notes.append(f"fold {held + 1}: fitted {factors or 'nothing'}"
                     + "".join(f"; AT ITS BOUND: {m}" for m in fold["missing"])  # type: ignore[attr-defined]
                     + "".join(f"; LEFT {u['error']:+.1%}: {u['run']}, which alone sets "
                               + apart_text(u) for u in fold["unexplained"]))  # type: ignore[attr-defined]
    head = ("fold", "role", "run", "measured s", "fitted / predicted s", "error")
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        for row in (head, *rows):
            print(f"{row[0]:7} {row[1]:9} {row[2]:58} {row[3]:>10} {row[4]:>30} {row[5]:>8}")
    print()
    for note in notes:
        print(("* " if markdown else "") + note)
    print()
    med = statistics.median
    print(f"sweep {sweep}: {len(runs)} runs, {len(runs)} folds of {FIT_RUNS} fitted + 1 predicted; "
          f"fitted runs reproduced within {max(fit_errors):.1%} (median {med(fit_errors):.1%}); "
          f"fifth run predicted within {max(fifth_errors):.1%} (median {med(fifth_errors):.1%}; "
          f"default factors: median {med(default_errors):.1%})")
    return 0


def carry(sweep: str, others: list[str], markdown: bool) -> int:
    """Fit every run of `sweep` at once; predict each figure of the `others` sweeps with it."""
    figures: list[Figure] = [f for f in load_figures() if f.sweep in others]
    missing = sorted(set(others) - {f.sweep for f in figures})
    if missing:
        print(f"no figure of sweep {', '.join(missing)} in bench/heldout.yaml", file=sys.stderr)
        return 1
    runs = sweep_runs(sweep)
    if not runs:
        print(f"sweep {sweep}: no run with an estimate", file=sys.stderr)
        return 1
    result = calibrate_runs(runs)
    fitted = {n: v for n, v in result.values.items() if n not in result.why}
    print(f"fitted on all {len(runs)} runs of {sweep}: "
          + ", ".join(f"{n} {v:.4g}" for n, v in fitted.items())
          + "".join(f"; AT ITS BOUND: {missing_term(n, fitted[n])}" for n in sorted(result.pinned)))
    head = ("sweep", "figure", "ratio, defaults", "ratio, calibrated")
    rows, before, after = [], [], []
    for figure in figures:
        default, calibrated = judge(figure).ratio, judge(figure, fitted).ratio
        if default is None or calibrated is None:
            print(f"  {figure.id}: no estimate; left out", file=sys.stderr)
            continue
        before.append(abs(default - 1))
        after.append(abs(calibrated - 1))
        rows.append((figure.sweep, figure.id, f"{default:.2f}", f"{calibrated:.2f}"))
    if markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        print("\n".join("| " + " | ".join(row) + " |" for row in rows))
    else:
        for row in (head, *rows):
            print(f"{row[0]:34} {row[1]:44} {row[2]:>15} {row[3]:>17}")
    med = statistics.median
    print(f"\n{len(rows)} figures (ratio = predicted / published speed): median |ratio - 1| "
          f"{med(before):.1%} with the defaults, {med(after):.1%} with the factors fitted on {sweep}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", default="moonlight-recompute",
                        help="a `sweep` of bench/heldout.yaml (default: moonlight-recompute)")
    parser.add_argument("--carry", nargs="+", metavar="SWEEP",
                        help="fit every run of --sweep, predict these sweeps' figures with it")
    parser.add_argument("--markdown", action="store_true", help="the table as Markdown")
    args = parser.parse_args(argv)
    if args.carry:
        return carry(args.sweep, args.carry, args.markdown)
    return report(args.sweep, args.markdown)


if __name__ == "__main__":
    raise SystemExit(main())

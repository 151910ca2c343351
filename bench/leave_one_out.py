"""Leave-one-out calibration within one published stack: one source family's rows of
bench/heldout.yaml (a Megatron-Bridge container, the Moonlight recompute sweep). For each row,
the factors are fitted (planner/calibrate/fit.py) on the other rows and the left-out row is
predicted; printed beside the default factors' error.

    OMP_NUM_THREADS=1 .venv/bin/python bench/leave_one_out.py [FAMILY]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import heldout  # noqa: E402

from planner.calibrate.fit import Run, fit  # noqa: E402

STACK = sys.argv[1] if len(sys.argv) > 1 else "bridge-26.02"  # a source family of the bench
# What one software stack changes against the defaults: its own speed (the stack-level term,
# planner/calibrate/factors.py stack_factor) and its host's time per kernel launch.
FACTORS = ("stack_factor", "host_us_per_launch")


def run_of(figure: heldout.Figure) -> Run:
    cfg = figure.config()
    tokens = cfg.training.global_batch_size * cfg.training.seq_length / cfg.parallel.world_size
    if "step_time_s" in figure.published:
        return Run(figure.id, cfg, figure.published["step_time_s"])
    return Run(figure.id, cfg, tokens / figure.published["tokens_per_s_per_gpu"])


def main() -> int:
    figures = [f for f in heldout.load_figures() if f.family == STACK and not f.is_layer
               and {"tokens_per_s_per_gpu", "step_time_s"} & set(f.published)]
    runs = [run_of(f) for f in figures]
    print(f"| left out | default error | after calibrating on the other {len(runs) - 1} |")
    print("|---|---|---|")
    before, after = [], []
    for i, run in enumerate(runs):
        others = runs[:i] + runs[i + 1:]
        values = fit(others, FACTORS, iterations=10).values
        b = abs(run.measured / run.predict({}) - 1)
        a = abs(run.measured / run.predict(values) - 1)
        before.append(b)
        after.append(a)
        print(f"| {run.name} | {b:.1%} | {a:.1%} |")
    print(f"| median | {statistics.median(before):.1%} | {statistics.median(after):.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

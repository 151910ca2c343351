"""Leave-one-out calibration within one published stack: one Megatron-Bridge container's
rows of bench/heldout.yaml. For each row, the factors are fitted (planner/calibrate/fit.py) on
the other rows and the left-out row is predicted; printed beside the default factors' error.

    OMP_NUM_THREADS=1 .venv/bin/python bench/leave_one_out.py
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

STACK = sys.argv[1] if len(sys.argv) > 1 else "26.02 NeMo container"
# What one software stack changes against the defaults: its host cost per microbatch and model
# chunk (launches, schedule, CUDA-graph coverage). The GEMM shares are the GPU's and trade against
# that cost on these rows (both grow with microbatches x chunks): with them free, leaving out the
# one row without per-microbatch host cost (25.11's full-iteration CUDA graph on GB300) moves
# gemm_fp8@blackwell from 0.29 to 0.63 and that row's error from 1.5 % to 33 %.
FACTORS = ("host_us_per_microbatch",)


def run_of(figure: heldout.Figure) -> Run:
    cfg = figure.config()
    tokens = cfg.training.global_batch_size * cfg.training.seq_length / cfg.parallel.world_size
    return Run(figure.id, cfg, tokens / figure.published["tokens_per_s_per_gpu"])


def main() -> int:
    figures = [f for f in heldout.load_figures() if STACK in f.source and not f.is_layer]
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

"""How fast `moeplan search` covers DeepSeek-V3 on 1,024 H100 (examples/deepseek-v3-1024.yaml).

Prints the wall time, the configs judged by the rule catalog per second, and the counts
explored / legal / fitting, plus the winner, judging in one process and in two (the issue's
target: under 10 s on a 2-core machine). Run:
`OMP_NUM_THREADS=1 .venv/bin/python bench/search_bench.py [CONFIG ...]`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.loader import load_config  # noqa: E402
from planner.search import search  # noqa: E402

DEFAULT = ROOT / "examples" / "deepseek-v3-1024.yaml"


def bench(path: Path, workers: int) -> None:
    start = time.perf_counter()
    cfg = load_config(path)
    result = search(cfg, top=3, workers=workers)
    wall = time.perf_counter() - start
    best = result.winner
    print(f"{path.name}, {workers} worker(s): {wall:.2f} s wall, {result.explored} configs judged "
          f"({result.explored / wall:.0f} candidates/s), {result.legal} legal, {result.fitting} "
          f"fitting and timed; never built: "
          + ", ".join(f"{n} {why}" for why, n in result.pruned_by.items() if n))
    if best is not None:
        p = best.cfg.parallel
        user = f"{result.user.step_time_s:.3f} s" if result.user else "does not fit"
        print(f"  winner TP{p.tp} CP{p.cp} PP{p.pp} EP{p.ep} ETP{p.etp} MBS "
              f"{best.cfg.training.micro_batch_size}: {best.step_time_s:.3f} s/step, "
              f"{best.tflops_per_gpu:.0f} TFLOP/s/GPU (yours: {user})")
        print(f"  layout {p.pipeline_model_parallel_layout or 'even'}; step time per stage (s): "
              + " ".join(f"{t:.2f}" for t in best.stage_step_s))


if __name__ == "__main__":
    for arg in sys.argv[1:] or [str(DEFAULT)]:
        for workers in (1, 2):
            bench(Path(arg), workers)

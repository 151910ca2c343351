"""How fast `moeplan search` covers DeepSeek-V3 on 1,024 H100 (examples/deepseek-v3-1024.yaml).

Prints the wall time, the configs judged by the rule catalog per second, and the counts
explored / legal / fitting, plus the winner, judging in one process and in two (the issue's
target: under 10 s on a 2-core machine). Run:
`OMP_NUM_THREADS=1 .venv/bin/python bench/search_bench.py [--refine N] [CONFIG ...]`
(`--refine 0`: the whole space; the default refines the 6 fastest families).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.loader import load_config  # noqa: E402
from planner.search import _vpp, recompute_label, search  # noqa: E402

DEFAULT = ROOT / "examples" / "deepseek-v3-1024.yaml"


def bench(path: Path, workers: int, refine: int) -> None:
    start = time.perf_counter()
    cfg = load_config(path)
    result = search(cfg, top=3, workers=workers, refine=refine)
    wall = time.perf_counter() - start
    best = result.winner
    scope = "whole space" if refine == 0 else f"refine {refine}"
    print(f"{path.name} ({scope}), {workers} worker(s): {wall:.2f} s wall, {result.explored} configs judged "
          f"({result.explored / wall:.0f} candidates/s), {result.legal} legal, {result.fitting} "
          f"fitting and timed; never built: "
          + ", ".join(f"{n} {why}" for why, n in result.pruned_by.items() if n))
    if best is not None:
        p = best.cfg.parallel
        user = f"{result.user.step_time_s:.3f} s" if result.user else "does not fit"
        print(f"  winner TP{p.tp} CP{p.cp} PP{p.pp} VPP{_vpp(best.cfg)} EP{p.ep} ETP{p.etp} MBS "
              f"{best.cfg.training.micro_batch_size} {recompute_label(best.cfg)} "
              f"{best.cfg.moe.moe_token_dispatcher_type}/{best.cfg.moe.moe_flex_dispatcher_backend}"
              f" EP overlap {best.cfg.overlap.overlap_moe_expert_parallel_comm}: "
              f"{best.step_time_s:.3f} s/step, "
              f"{best.tflops_per_gpu:.0f} TFLOP/s/GPU (yours: {user})")
        print(f"  layout {p.pipeline_model_parallel_layout or 'even'}; step time per stage (s): "
              + " ".join(f"{t:.2f}" for t in best.stage_step_s))


if __name__ == "__main__":
    args = sys.argv[1:]
    refine = 6
    if args[:1] == ["--refine"]:
        refine, args = int(args[1]), args[2:]
    for arg in args or [str(DEFAULT)]:
        for workers in (1, 2):
            bench(Path(arg), workers, refine)

"""How fast `moeplan search` covers DeepSeek-V3 on 1,024 H100 (examples/deepseek-v3-1024.yaml).

Each measurement runs in a fresh process (cold caches, as `moeplan search` starts): the wall
time of the search, the configs the rule catalog judged per second, the counts explored / legal /
fitting and what was never built, and the winner — judging in one process and in two (the
issue's target: the whole space in under 10 s on a 2-core machine), and the ratio of the two.
Run: `OMP_NUM_THREADS=1 .venv/bin/python bench/search_bench.py [--top K] [--refine N] [--workers W]
[--baseline TREE] [CONFIG ...]` (defaults as `moeplan search`: the top 10 over the whole space,
`--refine 0`; W 0 = one and two workers). `--baseline TREE` (a checkout of an earlier commit, e.g.
`git archive 861707c | tar -x -C /tmp/base`) measures that tree's search on the same config right
after each of this tree's, in the same run: old and new model under the same machine load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT = ROOT / "examples" / "deepseek-v3-1024.yaml"


def measure(path: Path, workers: int, top: int, refine: int) -> dict:
    """One search in this process; its figures as JSON-able data."""
    from planner.config.loader import load_config
    from planner.search.knobs import Recompute, vpp_of
    from planner.search.run import search

    cfg = load_config(path)
    start = time.perf_counter()
    result = search(cfg, top=top, workers=workers, refine=refine)
    wall = time.perf_counter() - start
    best = result.winner
    winner = None
    if best is not None:
        p = best.cfg.parallel
        winner = (f"TP{p.tp} CP{p.cp} PP{p.pp} VPP{vpp_of(best.cfg)} EP{p.ep} ETP{p.etp} MBS "
                  f"{best.cfg.training.micro_batch_size} {Recompute.of(best.cfg).label} "
                  f"{best.cfg.moe.moe_token_dispatcher_type}/"
                  f"{best.cfg.moe.moe_flex_dispatcher_backend} EP overlap "
                  f"{best.cfg.overlap.overlap_moe_expert_parallel_comm}: "
                  f"{best.step_time_s:.3f} s/step, {best.tflops_per_gpu:.0f} TFLOP/s/GPU "
                  f"(yours: {f'{result.user.step_time_s:.3f} s' if result.user else 'does not fit'})")
    return {"wall": wall, "explored": result.explored, "legal": result.legal,
            "fitting": result.fitting, "pruned_by": result.pruned_by, "winner": winner}


def _one(tree: Path, path: Path, workers: int, top: int, refine: int) -> dict:
    """One measurement in a fresh process of `tree`'s planner (no caches carried over)."""
    done = subprocess.run([sys.executable, str(tree / "bench" / "search_bench.py"), "--one",
                           str(workers), "--top", str(top), "--refine", str(refine), str(path)],
                          capture_output=True, text=True, check=True, cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree)})
    return json.loads(done.stdout)


def bench(path: Path, top: int, refine: int, counts: tuple[int, ...] = (1, 2),
          baseline: Path | None = None) -> None:
    scope = "whole space" if refine == 0 else f"refine {refine}"
    walls = {}
    for workers in counts:
        figures = _one(ROOT, path.resolve(), workers, top, refine)
        walls[workers] = figures["wall"]
        if baseline is not None:
            old = _one(baseline, path.resolve(), workers, top, refine)
            print(f"{path.name}, {workers} worker(s), baseline {baseline}: {old['wall']:.2f} s wall, "
                  f"{old['explored']} configs judged; winner {old['winner']}")
        print(f"{path.name} ({scope}, top {top}), {workers} worker(s): {figures['wall']:.2f} s "
              f"wall, {figures['explored']} configs judged "
              f"({figures['explored'] / figures['wall']:.0f} candidates/s), {figures['legal']} "
              f"legal, {figures['fitting']} fitting and timed; never built: "
              + ", ".join(f"{n} {why}" for why, n in figures["pruned_by"].items() if n))
        if figures["winner"]:
            print(f"  winner {figures['winner']}")
    if len(walls) == 2:
        print(f"  two workers / one: {walls[2] / walls[1]:.2f} of the wall time")


def main(args: list[str]) -> None:
    options: dict[str, int] = {"--top": 10, "--refine": 0, "--one": 0, "--workers": 0}
    baseline = None
    while args[:1] and (args[0] in options or args[0] == "--baseline"):
        if args[0] == "--baseline":
            baseline, args = Path(args[1]).resolve(), args[2:]
            continue
        options[args[0]], args = int(args[1]), args[2:]
    paths = [Path(a) for a in args] or [DEFAULT]
    if options["--one"]:
        print(json.dumps(measure(paths[0], options["--one"], options["--top"], options["--refine"])))
        return
    for path in paths:
        counts = (options["--workers"],) if options["--workers"] else (1, 2)
        bench(path, options["--top"], options["--refine"], counts, baseline)


if __name__ == "__main__":
    main(sys.argv[1:])

"""How `reshard_plan` grows with the world size: DeepSeek-V3 (examples/deepseek-v3-1024.yaml)
resharded from EP64 to EP32 at 8,192 / 32,768 / 131,072 ranks (expert data parallelism grows
with N). Each replica of an expert used to be weighed for every rank that needs it (≈ n^1.8);
the plan now indexes one holder per shard, so the time should grow by ≈4× per 4× ranks.

Run: `.venv/bin/python bench/reshard_bench.py [RANKS ...] [--tree OLD_TREE]`; `--tree` times
another source tree's planner (e.g. `git archive <commit> planner examples | tar -x -C /tmp/old`).
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path

DEFAULT_RANKS = (8192, 32768, 131072)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ranks", nargs="*", type=int, default=list(DEFAULT_RANKS))
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    import yaml

    from planner.config.loader import parse_config
    from planner.reshard import reshard_plan

    base = yaml.safe_load((args.tree / "examples" / "deepseek-v3-1024.yaml").read_text())

    def config(ranks: int, ep: int):  # noqa: ANN202 - a Config of the tree under test
        data = copy.deepcopy(base)
        data["parallel"].update(world_size=ranks, ep=ep)
        data["cluster"]["nodes"] = ranks // data["cluster"]["gpus_per_node"]
        data["training"]["global_batch_size"] = max(data["training"]["global_batch_size"], ranks)
        return parse_config(data)

    print(f"tree {args.tree}")
    previous: tuple[int, float] | None = None
    for ranks in args.ranks:
        old, new = config(ranks, 64), config(ranks, 32)
        start = time.process_time()
        plan = reshard_plan(old, new)
        seconds = time.process_time() - start
        growth = ""
        if previous:
            growth = f"  growth n^{math.log(seconds / previous[1]) / math.log(ranks / previous[0]):.2f}"
        print(f"{ranks:>8,} ranks  {seconds:8.2f} s CPU  {len(plan['ranks']):,} rows{growth}", flush=True)
        previous = ranks, seconds


if __name__ == "__main__":
    main()

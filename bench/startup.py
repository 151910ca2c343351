"""How fast moeplan starts: `check` against `python -c "import sympy"`, `groups --rank R --json` at
16,384 ranks, and `search` on the tiny example, each as whole fresh processes.

`groups` runs twice: warm (its result cache holds the config's grid spec, as for every rank but the
first of a job asking once per rank; planner/files/result_cache.py) and cold (MOEPLAN_CACHE_DIR
empty: the config is validated and the rules run every time). The other commands run without the
cache.

Ratios, not seconds, are the figures to quote: the commands run in turn (A B A B …) so machine
drift hits both, and the median of the per-pair ratios is printed. The 16,384-rank config is
examples/deepseek-v4-pro-1024.yaml with world size and nodes scaled 16x (DP 64 -> 1,024), written
to a temporary folder. PYTHONDONTWRITEBYTECODE is passed through as set: with it, every planner
module is compiled from source on each start (sympy's site-packages bytecode is still read), so
run once with and once without it to see both. Run: `.venv/bin/python bench/startup.py [--runs N]
[--baseline TREE]` (TREE: a checkout of an earlier commit, e.g. `git archive b28d374 | tar -x -C
/tmp/base`, timed against this tree pair by pair).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "deepseek-v4-pro-1024.yaml"
TINY = ROOT / "examples" / "tiny-cpu-8.yaml"
SCALE = 16


def scaled_config(folder: Path) -> Path:
    """The V4-Pro example on 16,384 ranks: world size and nodes x16, everything else as written."""
    text = EXAMPLE.read_text()
    for key, value in (("world_size", 1024), ("nodes", 128)):
        old = f"{key}: {value}\n"
        assert old in text, f"{EXAMPLE} no longer says {old!r}"
        text = text.replace(old, f"{key}: {value * SCALE}\n")
    path = folder / "deepseek-v4-pro-16384.yaml"
    path.write_text(text)
    return path


def wall(command: list[str], tree: Path, extra: dict[str, str] | None = None) -> float:
    """Seconds one fresh process takes, run from `tree` with it first on the import path."""
    env = os.environ | {"PYTHONPATH": str(tree)} | (extra or {})
    start = time.perf_counter()
    subprocess.run(command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False)
    return time.perf_counter() - start


def paired(a: list[str], b: list[str], runs: int, tree_a: Path, tree_b: Path,
           env_a: dict[str, str]) -> dict[str, float]:
    """Medians of A, B and of A/B pair by pair, after one warm-up of each (which fills A's result
    cache when `env_a` names one)."""
    wall(a, tree_a, env_a)
    wall(b, tree_b, env_a)
    times_a, times_b = [], []
    for _ in range(runs):
        times_a.append(wall(a, tree_a, env_a))
        times_b.append(wall(b, tree_b, env_a))
    return {"a_s": statistics.median(times_a), "b_s": statistics.median(times_b),
            "ratio": statistics.median(x / y for x, y in zip(times_a, times_b, strict=True))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline", type=Path, help="an earlier tree, timed against this one")
    args = parser.parse_args()
    py = sys.executable
    moeplan = [py, "-m", "planner.cli"]
    sympy = [py, "-c", "import sympy"]
    with tempfile.TemporaryDirectory() as folder:
        big = str(scaled_config(Path(folder)))
        rank = [*moeplan, "groups", big, "--rank", "12345", "--json"]
        no_cache = {"MOEPLAN_CACHE_DIR": ""}
        # warm: the result cache holds the config's grid spec (a job asking once per rank);
        # cold: no cache, every run validates the config and runs the rules
        cases = [
            ("check V4-Pro", [*moeplan, "check", str(EXAMPLE)], no_cache),
            ("groups --rank 12345 --json, 16,384 ranks, warm", rank,
             {"MOEPLAN_CACHE_DIR": str(Path(folder) / "cache")}),
            ("groups --rank 12345 --json, 16,384 ranks, cold", rank, no_cache),
            ("search tiny-cpu-8 --top 2", [*moeplan, "search", str(TINY), "--top", "2"], no_cache),
        ]
        print(f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}, "
              f"{args.runs} pairs each, medians")
        for name, command, env in cases:
            runs = max(1, args.runs // 3) if name.startswith("search") else args.runs
            if args.baseline is None:
                other, label, tree_b = sympy, "import sympy", ROOT
            else:
                other, label, tree_b = command, "baseline", args.baseline.resolve()
            got = paired(command, other, runs, ROOT, tree_b, env)
            print(f"{name:52s} {got['a_s']:7.3f} s   {label} {got['b_s']:7.3f} s   "
                  f"ratio {got['ratio']:.3f}")


if __name__ == "__main__":
    main()

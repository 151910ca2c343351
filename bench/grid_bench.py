"""How fast `planner.layout.grid` answers at 1,024 / 16,384 / 131,072 ranks.

One rank's view is rank arithmetic (no enumeration), so it should stay flat as N grows; the full
listing of every group kind is linear in N. Peak memory is the Python heap peak (tracemalloc)
while building the full listing. Run: `.venv/bin/python bench/grid_bench.py`.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.layout.grid import Grid  # noqa: E402
from planner.layout.spec import GridSpec  # noqa: E402

# V4-Pro-shaped layouts (TP1, CP2, EP64, 384 experts) scaled by data parallelism.
LAYOUTS = [
    GridSpec(1024, cp=2, pp=8, ep=64, num_experts=384),
    GridSpec(16384, cp=2, pp=16, ep=64, num_experts=384),
    GridSpec(131072, cp=2, pp=16, ep=64, num_experts=384),
]
VIEWS_SAMPLED = 200


def time_views(grid: Grid, *, with_formulas: bool) -> float:
    """Median seconds for one rank's full view (coordinates, experts, every group) over random ranks."""
    rng = random.Random(0)
    ranks = [rng.randrange(grid.spec.world_size) for _ in range(VIEWS_SAMPLED)]
    times = []
    for rank in ranks:
        start = time.perf_counter()
        view = grid.rank_view(rank, with_formulas=with_formulas)
        view.groups  # noqa: B018 - materialise every group containing the rank
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_coordinates(grid: Grid) -> float:
    """Median seconds for a rank's coordinates and its group index in every token kind.

    This is the O(number of axes) part; a full view also materialises each group's ranks,
    which costs the group's size (intra_dist_opt alone spans N/I ranks).
    """
    rng = random.Random(1)
    tokens = [(layout, token) for layout in (grid.dense, grid.expert)
              for token in ("tp", "cp", "dp", "pp", "ep", "dp-cp", "tp-ep", "tp-ep-pp")
              if all(name in layout.axes for name in token.split("-"))]
    times = []
    for _ in range(VIEWS_SAMPLED):
        rank = rng.randrange(grid.spec.world_size)
        start = time.perf_counter()
        grid.dense.coordinates(rank)
        grid.expert.coordinates(rank)
        for layout, token in tokens:
            layout.group_index(token, rank)
            layout.position_in_group(token, rank)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_listing(grid: Grid) -> tuple[float, int]:
    start = time.perf_counter()
    listing = grid.all_groups()
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(g) for groups in listing.values() for g in groups)


def peak_listing_bytes(spec: GridSpec) -> int:
    tracemalloc.start()
    Grid(spec).all_groups()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def main() -> None:
    Grid(LAYOUTS[0]).formulas(0)  # import sympy once, outside the timings
    header = (f"{'ranks':>8}  {'layout':<28}  {'kinds':>5}  {'coords':>8}  {'view':>9}  "
              f"{'view+sympy':>10}  "
              f"{'full listing':>12}  {'ranks listed':>12}  {'peak heap':>10}")
    print(header)
    print("-" * len(header))
    for spec in LAYOUTS:
        grid = Grid(spec)
        coords = time_coordinates(grid)
        view = time_views(grid, with_formulas=False)
        view_formulas = time_views(grid, with_formulas=True)
        listing, listed = time_listing(grid)
        peak = peak_listing_bytes(spec)
        layout = f"CP{spec.cp} PP{spec.pp} EP{spec.ep} DP{spec.dp} EDP{spec.edp}"
        print(f"{spec.world_size:>8}  {layout:<28}  {len(grid.kinds):>5}  {coords * 1e6:>6.1f}µs  "
              f"{view * 1e3:>7.3f}ms  {view_formulas * 1e3:>8.2f}ms  {listing:>11.3f}s  "
              f"{listed:>12,}  {peak / 2**20:>7.1f}MiB")


if __name__ == "__main__":
    main()

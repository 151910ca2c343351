"""Bounded least squares of the step-time model's efficiency factors on measured runs.

The residual of a run is log(predicted / measured): a 10 % miss weighs the same on a 2 s and a
20 s step; misses beyond 5 % weigh linearly (Huber), so one run the model cannot explain does
not pull every factor. Levenberg–Marquardt over the chosen factors with a numerical Jacobian, every
step projected back into the factors' bounds (planner/calibrate/factors.py), each factor pulled
toward its default by a prior (PRIOR_WIDTH), from the defaults and, when the stack-level term is
fitted, from a ladder of its levels (STACK_STARTS); no numpy (the planner never needs it). A
factor whose column is zero on every run (no run exercises it, e.g. the scale-out bandwidth when
every run fits in one NVLink domain) is left at its value and reported as not fitted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from planner.calibrate.factors import applies, current, factor, with_factors
from planner.config.schema import Config
from planner.estimate import estimate

# How a run's measured figure is predicted: the step time, or one MoE layer's forward+backward.
METRICS: dict[str, Callable[[Config], float]] = {
    "step_s": lambda cfg: estimate(cfg, exact=False).step_time_s,
    "layer_s": lambda cfg: estimate(cfg).moe_layer_seconds(),
}


@dataclass(frozen=True)
class Run:
    """One measured run: its config, the measured figure and which figure it is."""

    name: str
    cfg: Config
    measured: float
    metric: str = "step_s"

    def predict(self, values: dict[str, float]) -> float:
        return METRICS[self.metric](with_factors(self.cfg, values))


@dataclass
class FitResult:
    """Fitted values, which factors the runs identified, and per-run predictions."""

    values: dict[str, float]
    defaults: dict[str, float]
    fitted: dict[str, bool]
    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)


# Residuals beyond this (log) size count linearly, not squared (Huber's loss): one run whose miss
# the model cannot explain (a stack feature it lacks) does not drag every factor after it. 5 %:
# published rows of one stack already disagree by more than that where the model has no term for
# the difference (GB300 runs the same layout about 20 % faster than GB200, and the catalog gives
# both the same peaks), and a squared loss lets such a pair pull a shared factor to neither.
HUBER = 0.05


def _robust(r: float) -> float:
    """A residual whose square is Huber's loss (times 2) at HUBER."""
    a = abs(r)
    return r if a <= HUBER else math.copysign(math.sqrt(2 * HUBER * a - HUBER * HUBER), r)


# Each factor is pulled back toward its default: moving it by PRIOR_WIDTH of its default (or of a
# tenth of its range, for a default of 0) costs as much as one run missed by HUBER. The defaults
# were fitted on the published figures docs/estimate.md names, so a factor a few runs identify only
# weakly (one run that exercises it far more than the rest, or two factors that trade against each
# other) stays near them instead of jumping to what fits those runs' noise.
PRIOR_WIDTH = 0.5
# The stack-level term is there to absorb what the bounded factors cannot: no pull toward 1.
UNPULLED = frozenset({"stack_factor"})


def _prior_scale(default: float, low: float, high: float) -> float:
    return PRIOR_WIDTH * (default if default > 0 else (high - low) / 10)


def _residuals(runs: Sequence[Run], values: dict[str, float],
               prior: dict[str, tuple[float, float]] | None = None) -> list[float]:
    """Each run's (Huber) log miss, then one prior residual per fitted factor."""
    out = [_robust(math.log(run.predict(values) / run.measured)) for run in runs]
    return out + [HUBER * (values[n] - d) / scale for n, (d, scale) in (prior or {}).items()]


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (tiny dense systems)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-300:
            continue
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] if abs(m[i][i]) > 1e-300 else 0.0 for i in range(n)]


# The stack-level term scales the whole GPU side, so a slow stack's miss can sit on it or on the
# host terms: the overlap of host and GPU time makes the model piecewise in its factors, and a
# descent from the defaults can settle in the wrong basin (four AWS EFA runs: the host terms soak
# up the miss at stack_factor 1.4, cost 0.037, where 2.3 fits the same runs at 0.016). When the
# stack-level term is fitted, the fit also starts from a ladder of stack levels across its range
# (the other factors at their defaults), takes each EXPLORE steps down, and carries on from the
# end that costs least (prior included).
STACK_LEVEL = "stack_factor"
STACK_STARTS = (0.7, 1.4, 2.0, 2.8)
EXPLORE = 6


def fit(runs: Sequence[Run], names: Sequence[str], *, iterations: int = 25,
        start: dict[str, float] | None = None, use_prior: bool = True) -> FitResult:
    """Fit the named factors to the runs (all runs share the fitted values)."""
    # A family-scoped factor (gemm_fp8@hopper) starts from, and is pulled toward, the value of a
    # run it applies to; the first run's GPU may be of another family.
    defaults = {n: current(next((r.cfg for r in runs if applies(r.cfg, n)), runs[0].cfg), n)
                for n in names}
    bounds = {n: (factor(n).low, factor(n).high) for n in names}
    before = [run.predict({}) for run in runs]
    prior = ({n: (defaults[n], _prior_scale(defaults[n], *bounds[n])) for n in names
              if n not in UNPULLED} if use_prior else None)
    starts = [{**defaults, **(start or {})}]
    if STACK_LEVEL in names and not (start and STACK_LEVEL in start):
        low, high = bounds[STACK_LEVEL]
        starts += [{**starts[0], STACK_LEVEL: min(high, max(low, level))} for level in STACK_STARTS]
    if len(starts) == 1:
        values, _, fitted = _descend(runs, names, starts[0], bounds, prior, iterations)
    else:
        # Every start descends a few steps (enough to settle into its basin); the cheapest end
        # goes on for the rest of the iterations.
        ends = [_descend(runs, names, values, bounds, prior, min(iterations, EXPLORE))
                for values in starts]
        values = min(ends, key=lambda end: end[1])[0]
        fitted = {n: any(end[2][n] for end in ends) for n in names}
        if iterations > EXPLORE:
            values, _, moved = _descend(runs, names, values, bounds, prior, iterations - EXPLORE)
            fitted = {n: fitted[n] or moved[n] for n in names}
    after = [run.predict(values) for run in runs]
    return FitResult(values, defaults, fitted, before, after)


def _descend(runs: Sequence[Run], names: Sequence[str], values: dict[str, float],
             bounds: dict[str, tuple[float, float]], prior: dict[str, tuple[float, float]] | None,
             iterations: int) -> tuple[dict[str, float], float, dict[str, bool]]:
    """Levenberg–Marquardt from `values`: the end, its cost, and which factors the runs moved."""
    res = _residuals(runs, values, prior)
    cost = sum(r * r for r in res)
    damping, fitted = 1e-2, dict.fromkeys(names, False)
    for _ in range(iterations):
        jac: list[list[float]] = []
        for n in names:
            low, high = bounds[n]
            step = max(abs(values[n]) * 0.05, (high - low) * 0.005)
            trial = dict(values)
            trial[n] = values[n] + step if values[n] + step <= high else values[n] - step
            moved = _residuals(runs, trial, prior)
            jac.append([(m - r) / (trial[n] - values[n]) for m, r in zip(moved, res, strict=True)])
        for n, col in zip(names, jac, strict=True):
            span = (bounds[n][1] - bounds[n][0]) * 0.005
            fitted[n] = fitted[n] or any(abs(c) * span > 1e-6 for c in col[:len(runs)])
        live = [i for i, n in enumerate(names) if fitted[n]]
        if not live:
            break
        # Scale each column by its factor's range so the damping treats all alike.
        scale = [bounds[names[i]][1] - bounds[names[i]][0] for i in live]
        jt = [[jac[i][r] * s for r in range(len(res))] for i, s in zip(live, scale, strict=True)]
        jtj = [[sum(a * b for a, b in zip(x, y, strict=True)) for y in jt] for x in jt]
        jtr = [-sum(a * b for a, b in zip(x, res, strict=True)) for x in jt]
        improved = False
        for _ in range(8):
            a = [[jtj[i][j] + (damping * (jtj[i][i] + 1e-9) if i == j else 0.0)
                  for j in range(len(live))] for i in range(len(live))]
            delta = _solve(a, jtr)
            trial = dict(values)
            for i, d, s in zip(live, delta, scale, strict=True):
                low, high = bounds[names[i]]
                trial[names[i]] = min(high, max(low, values[names[i]] + d * s))
            trial_res = _residuals(runs, trial, prior)
            trial_cost = sum(r * r for r in trial_res)
            if trial_cost < cost:
                values, res, cost, improved = trial, trial_res, trial_cost, True
                damping = max(damping / 3, 1e-6)
                break
            damping *= 4
        if not improved or cost < 1e-10:
            break
    return values, cost, fitted

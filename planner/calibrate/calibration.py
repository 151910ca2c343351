"""One calibration: logs and configs in; per-run figures, fitted factors and a profile out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.accounting import BudgetError
from planner.calibrate.factors import BY_NAME, current
from planner.calibrate.fit import Run, fit
from planner.calibrate.megatron_log import LogError, MeasuredLog, parse_log
from planner.calibrate.memory_lines import memory_by_rank, reserved_by_rank
from planner.calibrate.profile import dump_profile
from planner.calibrate.source import config_for_log
from planner.config.gpus import GPUS
from planner.config.loader import InvalidConfig, UnreadableConfig, read_lines
from planner.config.schema import Config

CANDIDATES = ("stack_factor", "host_us_per_launch", "host_us_per_expert", "host_us_per_microbatch",
              "gemm_bf16", "gemm_fp8", "hbm", "intra_node", "inter_node", "attention",
              "collective_latency_us")
# A fitted factor this close (share of its range) to a bound ended there: the runs want it past
# what is physical, so the model lacks a term for what these runs spend.
AT_BOUND = 1e-3
# A run the fit still misses by more than this is one the shared factors cannot reproduce beside
# the others: what sets its config apart is priced wrong (or not at all). 15 %: the accuracy a
# calibration is held to (docs/estimate.md, "Four runs of one stack").
UNEXPLAINED = 0.15
# At most this many of the fields that set such a run apart are named (the first, in the config's
# field order).
APART_SHOWN = 8


class CalibrationError(ValueError):
    """What stops a calibration, with its exit code (1 bad log or config, 2 unreadable input)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def with_gpu(cfg: Config, name: str) -> Config:
    """The config on another catalog GPU (its unset cluster figures filled from that entry)."""
    data = cfg.model_dump(exclude_unset=True)
    data.setdefault("cluster", {})["gpu"] = name
    return Config.model_validate(data, strict=False)


# Sensitivities are ranked to two significant figures: two factors the runs move alike (on a
# host-bound run, the stack-level term and the host time per launch both scale nearly the whole
# step) are a tie, which CANDIDATES' order breaks in favour of the stack-level term, the one with
# no pull toward its default, instead of a last-digit difference that a refit of the defaults flips.
def _ranking(sensitivity: float) -> float:
    return float(f"{sensitivity:.2g}")


def _sensitivity(runs: list[Run], name: str) -> float:
    """How much the runs' predictions move (log) when the factor moves 10 % of its range."""
    f = BY_NAME[name]
    base = current(runs[0].cfg, name)
    step = (f.high - f.low) * 0.1
    trial = base + step if base + step <= f.high else base - step
    return max(abs(math.log(r.predict({name: trial}) / r.predict({}))) for r in runs)


@dataclass
class CalibrationResult:
    logs: list[MeasuredLog]
    runs: list[Run]
    values: dict[str, float]
    defaults: dict[str, float]
    why: dict[str, str]
    before: list[float]
    after: list[float]
    memory: list[dict[str, tuple[float, float, float, float]]]
    stack: dict[str, Any]
    identified_by: dict[str, list[str]] = field(default_factory=dict)
    pinned: frozenset[str] = frozenset()
    unexplained: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        runs = []
        for log, run, b, a, mem in zip(self.logs, self.runs, self.before, self.after, self.memory,
                                       strict=True):
            runs.append({"log": log.path, "measured_step_s": run.measured,
                         "predicted_step_s_before": b, "predicted_step_s_after": a,
                         "measured_tflops_per_gpu": log.tflops_per_gpu,
                         "measured_peak_memory_bytes": {k: v[0] for k, v in mem.items()},
                         "predicted_peak_memory_bytes": {k: v[1] for k, v in mem.items()},
                         "predicted_device_memory_bytes": {k: v[3] for k, v in mem.items()},
                         "memory_by_rank": mem,
                         "reserved_by_rank": reserved_by_rank(log, mem),
                         "notes": log.notes})
        factors = {n: {"value": self.values[n], "default": self.defaults[n],
                       "fitted": n not in self.why, "why": self.why.get(n, ""),
                       "low": BY_NAME[n].low, "high": BY_NAME[n].high,
                       "at_bound": self.at_bound(n), "pinned": n in self.pinned,
                       "missing_term": self.missing_term(n),
                       "identified_by": self.identified_by.get(n, [])} for n in self.defaults}
        return {"runs": runs, "factors": factors, "unexplained_runs": self.unexplained,
                "stack": self.stack}

    def at_bound(self, name: str) -> str:
        """"low" or "high" when a fitted factor ended at that bound, else ""."""
        return "" if name in self.why else bound_side(name, self.values[name])

    def missing_term(self, name: str) -> str:
        """What a fitted factor the runs push against its bound says (`missing_term`), else ""."""
        return missing_term(name, self.values[name]) if name in self.pinned else ""

    def profile_yaml(self) -> str:
        return dump_profile(self.stack, {n: v for n, v in self.values.items() if n not in self.why})


def bound_side(name: str, value: float) -> str:
    """"low" or "high" when a fitted value ended at that bound of its factor, else ""."""
    f = BY_NAME[name]
    span = (f.high - f.low) * AT_BOUND
    return "low" if value <= f.low + span else "high" if value >= f.high - span else ""


def missing_term(name: str, value: float) -> str:
    """What a factor the runs push against its bound says, "" inside its bounds. At the high
    bound the runs spend time no term of the model prices (a missing term, named by the factor
    that tried to absorb it); at the low bound the model charges them time they do not spend (a
    term over-counts, or a factor fitted beside it overshoots)."""
    side = bound_side(name, value)
    if not side:
        return ""
    f = BY_NAME[name]
    if side == "high":
        return (f"{name} ended at its high bound {f.high:g} ({f.what}): these runs spend time "
                "the model has no term for; stack_factor absorbs the rest, but the term is missing")
    return (f"{name} ended at its low bound {f.low:g} ({f.what}): these runs ask for less; the "
            "model charges them time they do not spend (a term over-counts, or a factor fitted "
            "beside it overshoots)")


@dataclass
class RunsFit:
    """A calibration of measured runs: every candidate factor's value, why each one not fitted
    was left (`why`), each run's prediction before and after, the runs that identified each
    fitted factor (those whose prediction moves with it), and the fitted factors held at a bound
    the runs push against (`pinned`)."""

    values: dict[str, float]
    why: dict[str, str]
    before: list[float]
    after: list[float]
    identified: dict[str, list[str]]
    pinned: frozenset[str]
    unexplained: list[dict[str, Any]] = field(default_factory=list)


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config dump as dotted field names (`moe.moe_router_fusion`) and their values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def unexplained_runs(runs: list[Run], after: list[float]) -> list[dict[str, Any]]:
    """Runs the fitted factors still miss by more than UNEXPLAINED, each with the config fields it
    alone sets apart from every other run (its value there differs from each of theirs): no
    shared factor can move one run apart from the rest, so the term missing or mispriced is that
    of one of these fields (a feature the others run with or without, a different layout)."""
    flats = [_flat(r.cfg.model_dump(mode="json")) for r in runs]
    out = []
    for i, (run, predicted) in enumerate(zip(runs, after, strict=True)):
        miss = predicted / run.measured - 1
        if abs(miss) <= UNEXPLAINED:
            continue
        apart = [k for k, v in flats[i].items() if len(runs) > 1 and all(
            other.get(k) != v for j, other in enumerate(flats) if j != i)]
        out.append({"run": run.name, "error": miss, "apart_in": {
            k: flats[i][k] for k in apart[:APART_SHOWN]}, "apart_fields": len(apart)})
    return out


def apart_text(run: dict[str, Any]) -> str:
    """An unexplained run's fields and values that set it apart (`unexplained_runs`), as words:
    `moe.moe_router_fusion False, ...` ("" when none)."""
    return ", ".join(f"{k} {v}" for k, v in run["apart_in"].items())


def _miss(runs: list[Run], values: dict[str, float]) -> float:
    """The runs' squared log misses (no prior): what the data alone asks of the factors."""
    return sum(math.log(r.predict(values) / r.measured) ** 2 for r in runs)


def _pinned(runs: list[Run], values: dict[str, float], chosen: list[str]) -> frozenset[str]:
    """Fitted factors at a bound that the runs push against: stepping 1 % of the range back
    inside makes the runs' miss worse, so their optimum lies past the bound. A factor merely
    left at a default that is its bound (nothing asked it to move) is not pinned."""
    fitted = {n: values[n] for n in chosen}
    base, out = _miss(runs, fitted), set()
    for n in chosen:
        side = bound_side(n, values[n])
        if not side:
            continue
        f = BY_NAME[n]
        inward = (f.high - f.low) * 0.01 * (1 if side == "low" else -1)
        if _miss(runs, {**fitted, n: values[n] + inward}) > base * (1 + 1e-6) + 1e-12:
            out.add(n)
    return frozenset(out)


def calibrate_runs(runs: list[Run]) -> RunsFit:
    """The calibration of measured runs, whatever they were read from (a log for `moeplan
    calibrate`; a published table in bench/calibrate_stack.py). Raises BudgetError when a run has
    no estimate."""
    sens = {n: _sensitivity(runs, n) for n in CANDIDATES}
    ranked = [n for n in sorted(CANDIDATES, key=lambda n: -_ranking(sens[n])) if sens[n] > 1e-4]
    # Runs the model cannot tell apart (the same layout measured again: one Primus job logged three
    # times) give one equation between them, so they identify one factor, not one each.
    distinct = len({f"{r.predict({}):.9g}" for r in runs})
    chosen = ranked[:distinct]
    why = {n: ("no run exercises it" if sens[n] <= 1e-4 else
               f"fewer distinct runs ({distinct}) than exercised factors: the {distinct} most sensitive "
               "are fitted") for n in CANDIDATES if n not in chosen}
    result = fit(runs, chosen) if chosen else None
    values = {n: current(runs[0].cfg, n) for n in CANDIDATES}
    if result:
        values.update(result.values)
        for n, ok in result.fitted.items():
            if not ok:
                why[n] = "no run exercises it"
    live = [n for n in chosen if n not in why]
    before = [r.predict({}) for r in runs]
    after = [r.predict({n: values[n] for n in chosen}) for r in runs]
    identified = {n: [r.name for r in runs if _sensitivity([r], n) > 1e-4] for n in chosen}
    return RunsFit(values, why, before, after, identified, _pinned(runs, values, live),
                   unexplained_runs(runs, after))


def run_calibration(paths: list[Path], configs: list[Path], gpu: str | None) -> CalibrationResult:
    logs, runs = [], []
    if gpu is not None and gpu not in GPUS:
        raise CalibrationError(f"--gpu {gpu}: not in the GPU catalog ({', '.join(GPUS)})", 2)
    for i, path in enumerate(paths):
        try:
            log = parse_log(read_lines(path, "log"), str(path))  # streamed, a line at a time
        except UnreadableConfig as exc:
            raise CalibrationError(str(exc).replace("YAML", "log"), 2) from None
        except LogError as exc:
            raise CalibrationError(str(exc)) from None
        source = configs[i] if len(configs) > 1 else (configs[0] if configs else None)
        try:
            cfg = config_for_log(log, source)
        except LogError as exc:
            raise CalibrationError(str(exc), 2) from None
        except UnreadableConfig as exc:
            raise CalibrationError(str(exc), 2) from None
        except InvalidConfig as exc:
            rebuilt = "" if source else " (rebuilt from the log's argument dump; pass --config CONFIG)"
            raise CalibrationError(f"{source or path}: invalid config{rebuilt}: " + "; ".join(
                f"{f.code} {f.path}: {f.message}" for f in exc.findings)) from None
        name = log.gpu or gpu or (cfg.cluster.gpu if cfg.cluster.gpu_named else None)
        if name is None:
            raise CalibrationError(f"{path}: the log does not name its GPU and neither --gpu nor "
                                   "cluster.gpu does: pass --gpu NAME (e.g. --gpu H100)")
        if name != cfg.cluster.gpu or not cfg.cluster.gpu_named:  # the run's card, named
            cfg = with_gpu(cfg, name)
        logs.append(log)
        runs.append(Run(str(path), cfg, log.step_s))
    try:
        fitted = calibrate_runs(runs)
    except BudgetError as exc:
        raise CalibrationError(f"no estimate for a run's config: {exc}") from None
    values, why = fitted.values, fitted.why
    fitted_cfgs = [r.cfg for r in runs]
    memory = [memory_by_rank(c, log) for c, log in zip(fitted_cfgs, logs, strict=True)]
    stack = {"gpu": runs[0].cfg.cluster.gpu, "megatron": next((lg.version for lg in logs if lg.version),
                                                               "not in the logs"),
             "logs": [str(p) for p in paths]}
    return CalibrationResult(logs, runs, values, {n: current(runs[0].cfg, n) for n in CANDIDATES},
                             why, fitted.before, fitted.after, memory, stack, fitted.identified,
                             fitted.pinned, fitted.unexplained)

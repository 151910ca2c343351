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
                       "at_bound": self.at_bound(n), "missing_term": self.missing_term(n),
                       "identified_by": self.identified_by.get(n, [])} for n in self.defaults}
        return {"runs": runs, "factors": factors, "stack": self.stack}

    def at_bound(self, name: str) -> str:
        """"low" or "high" when a fitted factor ended at that bound, else ""."""
        if name in self.why:
            return ""
        f, value = BY_NAME[name], self.values[name]
        span = (f.high - f.low) * AT_BOUND
        return "low" if value <= f.low + span else "high" if value >= f.high - span else ""

    def missing_term(self, name: str) -> str:
        """What a factor at its bound says: the runs spend time (or save it) that no term of the
        model prices, named by the factor that tried to absorb it."""
        side = self.at_bound(name)
        if not side:
            return ""
        f = BY_NAME[name]
        bound = f.high if side == "high" else f.low
        return (f"{name} ended at its {side} bound {bound:g} ({f.what}): these runs spend time "
                "the model has no term for; stack_factor absorbs the rest, but the term is missing")

    def profile_yaml(self) -> str:
        return dump_profile(self.stack, {n: v for n, v in self.values.items() if n not in self.why})


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
        sens = {n: _sensitivity(runs, n) for n in CANDIDATES}
    except BudgetError as exc:
        raise CalibrationError(f"no estimate for a run's config: {exc}") from None
    ranked = [n for n in sorted(CANDIDATES, key=lambda n: -sens[n]) if sens[n] > 1e-4]
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
    before = [r.predict({}) for r in runs]
    after = [r.predict({n: values[n] for n in chosen}) for r in runs]
    fitted_cfgs = [r.cfg for r in runs]
    memory = [memory_by_rank(c, log) for c, log in zip(fitted_cfgs, logs, strict=True)]
    stack = {"gpu": runs[0].cfg.cluster.gpu, "megatron": next((lg.version for lg in logs if lg.version),
                                                               "not in the logs"),
             "logs": [str(p) for p in paths]}
    identified = {n: [r.name for r in runs if _sensitivity([r], n) > 1e-4] for n in chosen}
    return CalibrationResult(logs, runs, values, {n: current(runs[0].cfg, n) for n in CANDIDATES},
                             why, before, after, memory, stack, identified)

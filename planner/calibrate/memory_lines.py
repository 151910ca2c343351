"""A Megatron log's memory lines beside the memory budget: each logged rank's `max allocated`
against the allocated peak of its stage (`peak_memory_bytes`), its `max reserved` against that
peak times cluster.allocator_reserved_ratio, and the device total (`device_memory_bytes`: the
reserved bytes plus the CUDA context and NCCL's buffers, which no log line reports), for
`moeplan calibrate` and `moeplan estimate --measured`."""

from __future__ import annotations

from typing import Any

from planner.accounting import BudgetError, budget_grid, budgets
from planner.calibrate.megatron_log import MeasuredLog
from planner.config.schema import Config
from planner.summary import stage_memory


def memory_by_rank(cfg: Config, log: MeasuredLog) -> dict[str, tuple[float, float, float, float]]:
    """Per logged rank: (max allocated, predicted allocated peak of its stage, predicted reserved
    bytes, predicted device total), bytes; empty when the log has no memory line or the layout
    cannot be budgeted."""
    if not log.memory_mb:
        return {}
    try:
        stages = stage_memory(budgets(cfg))
        grid = budget_grid(cfg)
    except BudgetError:
        return {}
    ratio = cfg.cluster.allocator_reserved_ratio
    out = {}
    for rank, measured in log.peak_memory_bytes.items():
        stage = next((s for s in range(cfg.parallel.pp) if rank in grid.stage_ranks(s)), None)
        if stage is not None:
            peak = stages[stage].peak
            out[str(rank)] = (measured, peak, peak * ratio, stages[stage].device)
    return out


def reserved_by_rank(log: MeasuredLog, mem: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, float]]:
    """Per logged rank: (max reserved as the log prints it, predicted reserved), bytes."""
    return {rank: (log.memory_mb[int(rank)]["max_reserved"] * 2**20, figures[2])
            for rank, figures in mem.items() if "max_reserved" in log.memory_mb.get(int(rank), {})}


def memory_report(cfg: Config, log: MeasuredLog) -> list[dict[str, Any]]:
    """One row per logged rank: measured and predicted allocated and reserved bytes, their
    ratios, and the predicted device total."""
    mem = memory_by_rank(cfg, log)
    reserved = reserved_by_rank(log, mem)
    rows = []
    for rank, (measured, peak, _, device) in sorted(mem.items(), key=lambda kv: int(kv[0])):
        row: dict[str, Any] = {"rank": int(rank), "max_allocated_bytes": measured,
                               "predicted_peak_bytes": peak, "allocated_ratio": peak / measured,
                               "predicted_device_bytes": device}
        if rank in reserved:
            row |= {"max_reserved_bytes": reserved[rank][0], "predicted_reserved_bytes": reserved[rank][1],
                    "reserved_ratio": reserved[rank][1] / reserved[rank][0]}
        rows.append(row)
    return rows

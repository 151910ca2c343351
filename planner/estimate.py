"""The step-time estimate of one config: the time page evaluated for every stage's first rank,
the slowest stage taken as the step, and the figures published tables use (tokens/s/GPU,
Megatron's TFLOP/s/GPU, MFU with its denominator named).

Placement for time: a collective's bytes inside one NVLink domain (cluster.nvlink_domain GPUs,
a node on HGX systems, a rack on NVL72) travel over NVLink, the rest over the scale-out network;
the topology facts are therefore computed with the NVLink domain as the "node".

The pipeline page of the formula book (planner/budget/pipeline.py) then puts each stage's bubble
in front of and behind its busy time, over the other stages' chunk times; the slowest stage's step
is the step time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from planner.accounting import (
    COLLECTIVES,
    Accounting,
    Budget,
    budget_grid,
    chunk_times,
    is_dualpipe,
    pipeline_page,
    pipeline_step,
)
from planner.config.routing import routing_imbalance
from planner.config.schema import Config
from planner.layout.nodes import rank_places

COMPUTE_PARTS = ("time_attention_gemm_s", "time_attention_core_s", "time_moe_gemm_s",
                 "time_dense_gemm_s", "time_head_gemm_s", "time_non_gemm_s")
# Parts only some models have, listed where their book writes them: DSA's core on Megatron's
# default backend (planner/budget/sparse_attention_time.py), often the largest part of its step.
OPTIONAL_COMPUTE_PARTS = ("time_dsa_core_s",)
STEP_PARTS = ("time_compute_s", "time_exposed_comm_s", "time_bubble_s", "time_optimizer_s")
# What the step time, the stage rows and the headline figures read (the float estimate's book).
TIME_TARGETS = ("time_busy_s", "time_optimizer_s", "time_microbatch_s", *COMPUTE_PARTS,
                "time_compute_s", "time_exposed_comm_s", "flops_per_step", "flops_per_token",
                "tokens_per_step",
                *(f"time_{entry.name}_{phase}{suffix}" for entry in COLLECTIVES.values()
                  for phase in entry.phases for suffix in ("", "_exposed")))


@dataclass
class Estimate:
    """One config's estimate: the headline figures and, per stage, its evaluated environment."""

    cfg: Config
    step_time_s: float
    slowest_stage: int
    ranks: list[int]  # the rank each stage is evaluated for (its first)
    globals: dict[str, Any] = field(repr=False)
    acc: Accounting = field(repr=False)
    # Per stage: the evaluation it shares with stages that read alike, its own facts, and its
    # pipeline page (bubble and step); and the chunk times every page reads.
    parts: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = field(repr=False)
    chunk_times: dict[str, Any] = field(repr=False)

    @cached_property
    def envs(self) -> list[dict[str, Any]]:
        """Each stage's every quantity and fact (made on first use)."""
        return [{**shared, **own, **self.chunk_times, **page} for shared, own, page in self.parts]

    def page_values(self, name: str) -> list[Any]:
        """One pipeline-page quantity (e.g. time_stage_step_s) of every stage."""
        return [page[name] for _, _, page in self.parts]

    @cached_property
    def stages(self) -> list[dict[str, Any]]:
        """Each stage's row: its step, compute parts and exposed communication (made on first use:
        search ranks thousands of estimates by their step time alone)."""
        return [_stage_row(s, rank, env) for s, (rank, env) in enumerate(zip(self.ranks, self.envs,
                                                                              strict=True))]

    @property
    def tokens_per_step(self) -> int:
        return int(self.globals["tokens_per_step"])

    @property
    def tflops_per_gpu(self) -> float:
        """Megatron's model FLOPs of a step per GPU and second, in TFLOP/s."""
        n = self.cfg.parallel.world_size
        return float(self.globals["flops_per_step"]) / self.step_time_s / n / 1e12

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_step / self.step_time_s / self.cfg.parallel.world_size

    def as_json(self) -> dict[str, Any]:
        cfg, tflops = self.cfg, self.tflops_per_gpu
        peak, precision = ((cfg.cluster.peak_fp8_tflops, "FP8") if cfg.training.fp8
                           else (cfg.cluster.peak_bf16_tflops, "BF16"))
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "tflops_per_gpu": tflops,
            "flops_per_token": float(self.globals["flops_per_token"]),
            "mfu": {"value": tflops / float(peak or 1),
                    "denominator": f"dense {precision} peak, {peak:g} TFLOP/s per GPU "
                                   f"({cfg.cluster.gpu_label})"},
            "breakdown": {"slowest_stage": self.slowest_stage, "stages": self.stages,
                          "efficiency": {**cfg.cluster.efficiency.model_dump(),
                                         "routing_imbalance": routing_imbalance(cfg)},
                          "nvlink_domain": cfg.cluster.nvlink_domain},
        }

    def moe_layer_seconds(self, stage: int = 0) -> float:
        """The MoE layers of a stage alone, forward + backward over the step: expert GEMMs, their
        elementwise work (router, permutes, activations), their fixed host costs and the exposed
        EP exchanges — what
        Megatron-LM's moe_perf benchmark times for a one-layer proxy
        (tests/functional_tests/test_cases/common/moe_perf)."""
        env, row = self.envs[stage], self.stages[stage]
        return float(env["time_moe_gemm_s"] + env["time_moe_non_gemm_s"]
                     + env["time_moe_kernel_gpu_s"] + env["time_moe_fixed_s"]) + sum(
            v for k, v in row["exposed_comm_parts_s"].items() if k.startswith("ep_"))

    def explain(self, name: str) -> Budget | None:
        """The named quantity on the slowest stage (or a global one), formula and values."""
        env = self.envs[self.slowest_stage]
        page = pipeline_page(self.cfg.parallel.pp, self.slowest_stage, self.acc.split.vpp > 1,
                             is_dualpipe(self.cfg.overlap.pipeline_schedule))
        for q in (*self.acc.book.quantities, *page):
            if q.name == name or q.ident == name:
                scope = "all ranks" if q.level == "global" else f"stage {self.slowest_stage}"
                return self.acc.budget(q, env, scope, None if q.level == "global"
                                       else self.slowest_stage)
        return None


def estimate(cfg: Config, *, exact: bool = True) -> Estimate:
    """Evaluate the formula book for the first rank of each stage; raises BudgetError.

    `exact=False` evaluates in floats and only the time page's quantities (and what they read):
    `moeplan search` ranks with it and re-evaluates exactly what it prints (the figures then
    equal `moeplan estimate`'s); its `envs` hold no memory figures."""
    acc = Accounting(cfg, None if exact else TIME_TARGETS, exact=exact)
    grid = budget_grid(cfg)
    domain = rank_places(cfg, nvlink=True)  # NVLink domains, as the launcher places ranks
    pp = cfg.parallel.pp
    ranks = [grid.stage_ranks(s)[0] for s in range(pp)]
    placed = [acc.placed(grid, s, ranks[s], domain) for s in range(pp)]
    times = chunk_times(acc, [shared for shared, _ in placed])
    parts, steps = [], []
    for s, (shared, own) in enumerate(placed):
        page = pipeline_step(acc, s, times, shared)
        parts.append((shared, own, page))
        steps.append(float(page["time_stage_step_s"]))
    slowest = max(range(len(steps)), key=steps.__getitem__)
    return Estimate(cfg, steps[slowest], slowest, ranks, acc.globals, acc, parts, times)


# (row label, time quantity, its exposed part) of every collective phase, in table order.
_COMM_TIMES = tuple((f"{entry.name}.{phase}", f"time_{entry.name}_{phase}",
                     f"time_{entry.name}_{phase}_exposed")
                    for entry in COLLECTIVES.values() for phase in entry.phases)


def _stage_row(stage: int, rank: int, env: dict[str, Any]) -> dict[str, Any]:
    comm: dict[str, float] = {}
    for label, key, exposed_key in _COMM_TIMES:
        exposed = env.get(exposed_key, env.get(key))
        if exposed:
            comm[label] = float(exposed)
    return {"stage": stage, "rank": rank,
            "compute_parts_s": {part.removeprefix("time_").removesuffix("_s"): float(env[part])
                                for part in (*COMPUTE_PARTS, *OPTIONAL_COMPUTE_PARTS)
                                if part in COMPUTE_PARTS or part in env},
            "exposed_comm_parts_s": comm,
            **{part.removeprefix("time_"): float(env[part]) for part in STEP_PARTS},
            "step_s": float(env["time_stage_step_s"])}

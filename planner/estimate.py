"""The step-time estimate of one config: the time page evaluated for every stage's first rank,
the slowest stage taken as the step, and the figures published tables use (tokens/s/GPU,
Megatron's TFLOP/s/GPU, MFU with its denominator named).

Placement for time: a collective's bytes inside one NVLink domain (cluster.nvlink_domain GPUs,
a node on HGX systems, a rack on NVL72) travel over NVLink, the rest over the scale-out network;
the topology facts are therefore computed with the NVLink domain as the "node".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.accounting import COLLECTIVES, Accounting, Budget, budget_grid
from planner.schema import Config

COMPUTE_PARTS = ("time_attention_gemm_s", "time_attention_core_s", "time_moe_gemm_s",
                 "time_dense_gemm_s", "time_head_gemm_s", "time_non_gemm_s")
STEP_PARTS = ("time_compute_s", "time_exposed_comm_s", "time_bubble_s", "time_optimizer_s")


@dataclass
class Estimate:
    """One config's estimate: the headline figures and, per stage, its evaluated environment."""

    cfg: Config
    step_time_s: float
    slowest_stage: int
    stages: list[dict[str, Any]]
    envs: list[dict[str, Any]] = field(repr=False)
    globals: dict[str, Any] = field(repr=False)
    acc: Accounting = field(repr=False)

    @property
    def tokens_per_step(self) -> int:
        return int(self.globals["tokens_per_step"])

    def as_json(self) -> dict[str, Any]:
        cfg, n = self.cfg, self.cfg.parallel.world_size or 1
        tflops = float(self.globals["flops_per_step"]) / self.step_time_s / n / 1e12
        peak, precision = ((cfg.cluster.peak_fp8_tflops, "FP8") if cfg.training.fp8
                           else (cfg.cluster.peak_bf16_tflops, "BF16"))
        eff = cfg.cluster.efficiency
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_gpu": self.tokens_per_step / self.step_time_s / n,
            "tflops_per_gpu": tflops,
            "flops_per_token": float(self.globals["flops_per_token"]),
            "mfu": {"value": tflops / float(peak or 1),
                    "denominator": f"dense {precision} peak, {peak:g} TFLOP/s per GPU "
                                   f"({cfg.cluster.gpu or 'H100 (default)'})"},
            "breakdown": {"slowest_stage": self.slowest_stage, "stages": self.stages,
                          "efficiency": eff.model_dump(), "nvlink_domain": cfg.cluster.nvlink_domain},
        }

    def explain(self, name: str) -> Budget | None:
        """The named quantity on the slowest stage (or a global one), formula and values."""
        env = self.envs[self.slowest_stage]
        for q in self.acc.book.quantities:
            if q.name == name or q.ident == name:
                scope = "all ranks" if q.level == "global" else f"stage {self.slowest_stage}"
                return self.acc.budget(q, env, scope, None if q.level == "global"
                                       else self.slowest_stage)
        return None


def estimate(cfg: Config) -> Estimate:
    """Evaluate the formula book for the first rank of each stage; raises BudgetError."""
    acc = Accounting(cfg)
    grid = budget_grid(cfg)
    domain = cfg.cluster.nvlink_domain or cfg.cluster.gpus_per_node or 1
    envs, stages = [], []
    for s in range(cfg.parallel.pp):
        rank = grid.stage_ranks(s)[0]
        env = acc.placed_env(grid, s, rank, domain)
        envs.append(env)
        stages.append(_stage_row(s, rank, env))
    slowest = max(range(len(stages)), key=lambda s: stages[s]["step_s"])
    return Estimate(cfg, stages[slowest]["step_s"], slowest, stages, envs, acc.globals, acc)


def _stage_row(stage: int, rank: int, env: dict[str, Any]) -> dict[str, Any]:
    comm: dict[str, float] = {}
    for entry in COLLECTIVES.values():
        for phase in entry.phases:
            key = f"time_{entry.name}_{phase}"
            exposed = env.get(f"{key}_exposed", env.get(key))
            if exposed:
                comm[f"{entry.name}.{phase}"] = float(exposed)
    return {"stage": stage, "rank": rank,
            "compute_parts_s": {part.removeprefix("time_").removesuffix("_s"): float(env[part])
                          for part in COMPUTE_PARTS},
            "exposed_comm_parts_s": comm,
            **{part.removeprefix("time_"): float(env[part]) for part in STEP_PARTS},
            "step_s": float(env["time_stage_step_s"])}

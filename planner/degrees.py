"""The layout degrees and every size derived from them, in one place.

Megatron lays the same N ranks out twice (Megatron-LM dev@d48bd6be megatron/core/parallel_state.py
initialize_model_parallel): a dense grid N = TP·CP·DP·PP·GTP for attention and an expert grid
N = ETP·EP·EDP·PP·EGTP for the routed experts. DP, EDP, the model sizes, experts per rank and the
sizes of the groups built from them are all products or quotients of the same few degrees; this
module is their one owner (in the spirit of torchtitan's `ParallelDims`). The schema, the rule
facts, the grid, the layout summary and the plan read them here; the formula book's `layout` page
(`dense_dp`, `expert_dp`, …) is the explained twin a test keeps equal to it.

A layout whose world size is not a multiple of a model size still has a `Degrees`: `problems`
says what does not divide (rules PAR001/PAR002 report it to the user), and DP/EDP are then the
floor quotients; consumers that need them exact (the grid, the rule facts) check first.
No pydantic, no torch: `moeplan check` and the grid import this on start-up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Degrees:
    """The degrees in (world size, TP, CP, PP, EP, ETP, GTP, EGTP, routed experts E); the sizes
    every consumer needs out, as named properties."""

    world_size: int
    tp: int = 1
    cp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1
    gtp: int = 1
    egtp: int = 1
    num_experts: int = 0

    @classmethod
    def from_config(cls, cfg: Any) -> Degrees:
        """A validated Config's degrees (the schema resolved world size and ETP)."""
        p = cfg.parallel
        return cls(
            world_size=p.world_size, tp=p.tp, cp=p.cp, pp=p.pp, ep=p.ep,
            etp=p.etp, gtp=p.gtp, egtp=p.egtp, num_experts=cfg.model.num_experts,
        )

    # ----------------------------------------------------------------- model sizes
    @property
    def smallest_world(self) -> int:
        """The least world size both grids tile (DP = 1 on the larger model size): the
        lcm of TP·CP·PP·GTP and ETP·EP·PP·EGTP, whatever world_size holds."""
        return math.lcm(self.dense_model_size, self.expert_model_size)

    @property
    def dense_model_size(self) -> int:
        """TP·CP·PP·GTP: the ranks one dense weight replica spans (GTP peers hold shards of it)."""
        return self.tp * self.cp * self.pp * self.gtp

    @property
    def expert_model_size(self) -> int:
        """ETP·EP·PP·EGTP: the ranks one full set of expert shards spans; CP is never in it."""
        return self.etp * self.ep * self.pp * self.egtp

    @property
    def dense_divides(self) -> bool:
        """The dense grid tiles the world: DP is a whole number."""
        return self.dense_model_size > 0 and self.world_size % self.dense_model_size == 0

    @property
    def expert_divides(self) -> bool:
        """The expert grid tiles the world: EDP is a whole number."""
        return self.expert_model_size > 0 and self.world_size % self.expert_model_size == 0

    @property
    def divides(self) -> bool:
        """Both grids tile the world; otherwise DP or EDP is a fraction and no group exists."""
        return self.dense_divides and self.expert_divides

    def problems(self, also: Mapping[str, int] | None = None) -> list[str]:
        """What does not divide, one sentence each; empty when both grids tile the world.

        `also` names further counts that must be positive with the degrees (the grid adds its
        distributed-optimizer instances), reported in the same sentence.
        """
        named = {"world_size": self.world_size, "tp": self.tp, "cp": self.cp, "pp": self.pp,
                 "ep": self.ep, "etp": self.etp, "gtp": self.gtp, "egtp": self.egtp, **(also or {})}
        bad = [f"{k}={v}" for k, v in named.items() if not isinstance(v, int) or v < 1]
        if bad:
            return [f"parallel degrees must be positive integers: {', '.join(bad)}"]
        out = []
        if not self.dense_divides:
            out.append(f"world_size {self.world_size} is not divisible by TP·PP·CP·GTP = "
                       f"{self.tp}·{self.pp}·{self.cp}·{self.gtp} = {self.dense_model_size}")
        if not self.expert_divides:
            out.append(f"world_size {self.world_size} is not divisible by ETP·EP·PP·EGTP = "
                       f"{self.etp}·{self.ep}·{self.pp}·{self.egtp} = {self.expert_model_size}")
        return out

    # ----------------------------------------------------------------- expert grad buffer
    @property
    def expert_grad_buffer(self) -> bool:
        """Routed experts get their own grad buffer (reduced over expt_dp) only when the expert
        grid differs from the dense one: EP > 1, ETP != TP or EGTP != GTP. Otherwise their
        parameters carry allreduce=True and share the dense buffer over dp_cp (Megatron-LM
        main@d98e8a64 megatron/core/extensions/transformer_engine.py TELinear.__init__
        use_expert_pgs; dev@d48bd6be tests EP > 1 alone, the same split whenever ETP = TP and
        GTP = EGTP = 1)."""
        return self.ep > 1 or self.etp != self.tp or self.egtp != self.gtp

    # ----------------------------------------------------------------- data-parallel sizes
    @property
    def dp(self) -> int:
        """D_a = N / (TP·CP·PP·GTP): dense weight replicas; EP never enters the dense grid.
        Whole only when `dense_divides`."""
        return self.world_size // self.dense_model_size

    @property
    def edp(self) -> int:
        """D_e = N / (ETP·EP·PP·EGTP): expert weight replicas. Whole only when `expert_divides`."""
        return self.world_size // self.expert_model_size

    @property
    def ranks_per_stage(self) -> int:
        """N / PP: the ranks holding one pipeline stage."""
        return self.world_size // self.pp

    @property
    def experts_per_rank(self) -> int | None:
        """E / EP routed experts per EP rank and MoE layer (Megatron-LM dev@d48bd6be
        megatron/core/transformer/moe/moe_layer.py BaseMoELayer.__init__); None when E does not
        split into equal contiguous blocks (rule PAR003)."""
        if self.num_experts <= 0 or self.ep <= 0 or self.num_experts % self.ep:
            return None
        return self.num_experts // self.ep

    # ----------------------------------------------------------------- group sizes
    @property
    def dp_cp_size(self) -> int:
        """DP·CP: dense gradients reduce over dp_cp, since CP ranks hold the same parameters."""
        return self.dp * self.cp

    @property
    def tp_ep_size(self) -> int:
        """ETP·EP: the token dispatcher's expert domain (tp_ep)."""
        return self.etp * self.ep

    @property
    def tp_cp_size(self) -> int:
        """TP·CP: the group the sequence aux loss counts tokens over."""
        return self.tp * self.cp

    @property
    def tp_dp_cp_size(self) -> int:
        """TP·GTP·DP·CP: expert-bias token counts and the global aux loss reduce over tp_dp_cp."""
        return self.tp * self.gtp * self.dp * self.cp

"""The efficiency factors a calibration may fit, their bounds, and which runs exercise each.

Each factor is one field of `cluster.efficiency` (planner/config/schema.py EfficiencySection).
The bounds keep a fit physical: a share stays a share, a latency stays non-negative and below
what any published run shows. A factor a set of runs does not exercise (its prediction does not
move when the factor does) stays at its default, and the fit says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.config.gpus import gpu
from planner.config.schema import Config


@dataclass(frozen=True)
class Factor:
    """One fittable efficiency field, its bounds and what it prices."""

    name: str
    low: float
    high: float
    what: str


FACTORS: tuple[Factor, ...] = (
    # The GEMM shares are the shape curve's large-shape asymptote, which no finite GEMM reaches:
    # bounded by the peak itself, as a card whose curve saturates late has its asymptote above
    # what its largest GEMMs run at (MI355X: 0.861 BF16, 0.895 FP8 at half-dimension 792, where
    # its 8,192 cube runs at 0.63; planner/config/gpus.py).
    Factor("gemm_bf16", 0.3, 1.0, "share of the BF16 peak large GEMMs reach"),
    Factor("gemm_fp8", 0.2, 1.0, "share of the FP8 peak large GEMMs reach"),
    Factor("attention", 0.2, 0.9, "share of the BF16 peak core attention reaches"),
    Factor("hbm", 0.4, 0.95, "share of the HBM bandwidth streaming kernels reach"),
    Factor("dispatch_alltoall", 0.2, 1.0, "share of the bandwidth the alltoall dispatcher reaches"),
    Factor("dispatch_deepep", 0.2, 1.0, "share of the collective bandwidth DeepEP reaches"),
    Factor("dispatch_latency_us_deepep", 0.0, 2000.0, "DeepEP's fixed cost per dispatch call"),
    Factor("permute_unfused", 1.0, 10.0, "cost of an unfused permutation over a fused one"),
    Factor("intra_node", 0.3, 1.0, "share of the NVLink bandwidth collectives reach"),
    Factor("inter_node", 0.3, 1.0, "share of the scale-out bandwidth collectives reach"),
    Factor("overlap", 0.05, 1.0, "share of an overlapped collective hidden behind compute"),
    Factor("non_gemm_passes", 0.5, 6.0, "HBM passes over the elementwise bytes"),
    Factor("non_gemm_ns_per_token_block", 0.0, 2000.0, "latency per token and block"),
    Factor("host_us_per_launch", 1.0, 200.0, "host time to issue one kernel"),
    Factor("host_launch_scale", 0.5, 4.0, "the host CPU's time per op over the reference x86 host's"),
    Factor("stack_factor", 0.5, 5.0, "the stack's GPU work over the model's"),
    Factor("host_us_per_block", 0.0, 20000.0, "host launch time per block and microbatch"),
    Factor("host_us_per_expert", 0.0, 5000.0, "host launch time per local expert and MoE layer"),
    Factor("host_us_per_microbatch", 0.0, 50000.0, "host time per microbatch and chunk"),
    Factor("step_fixed_ms", 0.0, 5000.0, "fixed cost per optimizer step"),
    Factor("collective_latency_us", 0.0, 200.0, "latency of one collective call"),
    Factor("gemm_half_dim", 0.0, 2048.0, "GEMM dimension at half the large-shape efficiency"),
)
BY_NAME = {f.name: f for f in FACTORS}


def factor(name: str) -> Factor:
    """The factor a (possibly family-scoped) name fits."""
    return BY_NAME[split_name(name)[0]]


def split_name(name: str) -> tuple[str, str]:
    """`gemm_fp8@blackwell` -> ("gemm_fp8", "blackwell"): a factor fitted for one GPU family."""
    field_name, _, family = name.partition("@")
    return field_name, family


def applies(cfg: Config, name: str) -> bool:
    """Whether a (possibly family-scoped) factor applies to this config's GPU: its architecture
    family (`gemm_fp8@blackwell`) or its host CPU family (`host_launch_scale@grace`)."""
    _, family = split_name(name)
    card = gpu(cfg.cluster.gpu)
    return not family or family in (card.family, card.host)


def with_factors(cfg: Config, values: dict[str, float]) -> Config:
    """`cfg` with these efficiency fields replaced (no other field changes); a family-scoped
    factor (`gemm_fp8@blackwell`) only on that family's GPUs."""
    update = {split_name(n)[0]: v for n, v in values.items() if applies(cfg, n)}
    if not update:
        return cfg
    eff = cfg.cluster.efficiency.model_copy(update=update)
    return cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"efficiency": eff})})


def current(cfg: Config, name: str) -> float:
    """The value the config's step-time model uses for a factor (the schema filled in the card's)."""
    return float(getattr(cfg.cluster.efficiency, split_name(name)[0]))

"""What the busiest EP rank carries over the mean when the router routes as it is, not forced.

`efficiency.routing_imbalance` (the busiest rank's routed rows over the mean) scales, on the time
page, the busiest rank's routed GEMMs, its permutes and activations and the routed-row exchanges,
and, when the config states it, the rows page's received rows (the memory budget's hot rank, which
holds many layers' activations while the busiest rank changes from layer to layer). Left unset,
the time page takes the router's default:

* forced balance (`moe_router_force_load_balancing`, Megatron-LM dev@d48bd6be
  megatron/core/transformer/moe/router.py TopKRouter.routing, moe_utils.py RandomSTE: the logits
  are replaced by fresh standard normals per rank and call, so each token's top-k is a uniformly
  random k-subset of the experts, and of the selected groups' experts under group-limited
  routing): every expert gets its mean load in expectation, but each layer waits for the busiest
  of the EP ranks, whose rows are the expected maximum of EP counts (`forced_imbalance`);
* Sinkhorn (moe_utils.sinkhorn normalises the scores to equal expert marginals before top-k): 1;
* every other router (auxiliary losses, expert bias, group-limited, hash layers, no balancing):
  NATURAL, read off the one published pair of the same runs with and without forced balance —
  Megatron-MoE-ModelZoo best_practice/Qwen3/readme.md @c1ad0b5c, Qwen3-235B-A22B (aux loss, 128
  experts top-8, EP8) on 256 H100 at 16k to 128k tokens: 295/237, 335/277, 368/320, 389/357
  TFLOP/s/GPU forced/dropless. 1.5 is the value with which the step-time model reproduces those
  four ratios within 1.2 % (bench/heldout.yaml rows `zoo-qwen3-235b-long-*-dropless`). No per-rank measurement
  was found for the expert-bias, group-limited or hash routers; they take the same value, which
  the estimate's efficiency line states.
"""

from __future__ import annotations

import math
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.config.schema import Config

NATURAL = 1.5
BALANCED = 1.0


def routing_imbalance(cfg: Config) -> float:
    """efficiency.routing_imbalance as the config states it, else this router's default (see the
    module doc)."""
    stated = cfg.cluster.efficiency.routing_imbalance
    if stated is not None:
        return stated
    moe = cfg.moe
    if moe.moe_router_force_load_balancing:
        return forced_imbalance(cfg)
    if moe.moe_router_load_balancing_type == "sinkhorn":
        return BALANCED
    return NATURAL


def forced_imbalance(cfg: Config) -> float:
    """The busiest EP rank's routed rows over the mean under forced balance: the expected maximum
    of the EP ranks' counts of one microbatch's routing. The EP group's tokens (EP·b·S/(TP·CP)
    with sequence parallelism, the rows page's ep_group_tokens) pick their experts independently,
    so a rank's count has mean μ = T·k·L/E and variance σ² = T·Var(X), X the picks one token puts
    on the rank's L experts: k drawn from E without repeats, hypergeometric (the rows page's
    recv_rows_var). The counts sum to T·k, so they are correlated −1/(EP − 1), and in the normal
    approximation the largest of EP such counts is μ + σ·c(EP)·√(EP/(EP − 1)), c(n) the expected
    maximum of n independent standard normals (`expected_max_normal`). Group-limited routing
    (moe_utils.py group_limited_topk) concentrates a token's picks in its selected groups, which
    raises Var(X): simulated through Megatron's selection with random logits, 13–59 % above the
    hypergeometric for DeepSeek-V3's 8 groups of 32 (top-4) at 8 to 64 experts per rank, and a
    two-stage draw (random groups, then random experts of them) overstates it as far again; the
    hypergeometric is kept, a lower bound that moves the busiest rank's rows by under 1 %."""
    par, model = cfg.parallel, cfg.model
    ep, experts, k = par.ep, model.num_experts or 0, model.moe_router_topk
    if ep < 2 or experts < ep or not k:
        return BALANCED
    seq_ranks = (par.tp if par.sequence_parallel else 1) * par.cp
    tokens = ep * cfg.training.micro_batch_size * cfg.training.seq_length / seq_ranks
    local = experts // ep
    mean = tokens * k * local / experts
    sigma = math.sqrt(tokens * _hypergeometric_variance(experts, local, k))
    return 1 + sigma * expected_max_normal(ep) * math.sqrt(ep / (ep - 1)) / mean


def _hypergeometric_variance(population: int, marked: int, draws: int) -> float:
    """Variance of the marked items among `draws` taken without repeats from `population`."""
    if population < 2:
        return 0.0
    share = marked / population
    return draws * share * (1 - share) * (population - draws) / (population - 1)


@cache
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals], ∫ x·n·φ(x)·Φ(x)^(n−1) dx by Simpson's rule on
    [−10, 10] (the integrand is below 1e−20 beyond): 0.5642 for 2, 1.4236 for 8, 2.0697 for 32."""
    steps, low, high = 4000, -10.0, 10.0
    width = (high - low) / steps
    total = 0.0
    for i in range(steps + 1):
        x = low + i * width
        density = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        below = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        value = x * n * density * below ** (n - 1)
        total += value * (1 if i in (0, steps) else 4 if i % 2 else 2)
    return total * width / 3

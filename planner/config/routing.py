"""What the busiest EP rank carries over the mean when the router routes as it is, not forced.

`efficiency.routing_imbalance` (the busiest rank's routed rows over the mean) scales, on the time
page, the busiest rank's routed GEMMs, its permutes and activations and the routed-row exchanges,
and, when the config states it, the rows page's received rows (the memory budget's hot rank, which
holds many layers' activations while the busiest rank changes from layer to layer). Left unset,
the time page takes the router's default:

* forced balance (`moe_router_force_load_balancing`, Megatron-LM dev@d48bd6be
  megatron/core/transformer/moe/router.py TopKRouter.routing: random logits, so every expert gets
  its mean load in expectation) and Sinkhorn (moe_utils.sinkhorn normalises the scores to equal
  expert marginals before top-k): 1;
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
    if moe.moe_router_force_load_balancing or moe.moe_router_load_balancing_type == "sinkhorn":
        return BALANCED
    return NATURAL

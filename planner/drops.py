"""Which token→expert assignments compete for capacity: the facts that decide capacity drops.

With a capacity factor Megatron drops in the router, before any dispatch, over the rank's own
router input (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_utils.py
apply_router_token_dropping: capacity = ceil(n·k/E · factor) from the local num_tokens, then a
top-c per expert by probs or position). The competing set is therefore the rank's local token
rows: b samples' slices of b·S/(CP·TP_seq) rows each, cut by the CP partition. Two layouts drop the
same assignments exactly when they slice the batch alike; EP, ETP and PP never enter (the drop is
decided before the EP exchange), DP only when b > 1 (it decides which samples share a
microbatch). `moeplan check` (MOE033) and `moeplan reshard-plan` read this.
"""

from __future__ import annotations

from typing import Any

from planner.config.schema import Config


def drop_competition(cfg: Config) -> dict[str, Any] | None:
    """The slicing that decides capacity drops, or None when the config is dropless."""
    moe, par, tr = cfg.moe, cfg.parallel, cfg.training
    if moe.moe_expert_capacity_factor is None:
        return None
    tp_seq = par.tp if par.sequence_parallel else 1
    facts: dict[str, Any] = {
        "local_tokens": tr.micro_batch_size * tr.seq_length // max(par.cp * tp_seq, 1),
        "micro_batch_size": tr.micro_batch_size, "cp": par.cp,
        "cp_partition_mode": par.cp_partition_mode if par.cp > 1 else None, "tp_seq": tp_seq,
        "capacity_factor": moe.moe_expert_capacity_factor, "drop_policy": moe.moe_token_drop_policy,
    }
    if tr.micro_batch_size > 1:
        facts["dp"] = cfg.degrees.dp
    return facts


def drop_difference(old: Config, new: Config) -> dict[str, Any] | None:
    """None when neither layout drops; else whether both drop the same assignments, and why not."""
    before, after = drop_competition(old), drop_competition(new)
    if before is None and after is None:
        return None
    if before is None or after is None:
        which = "old" if after is None else "new"
        return {"same": False, "old": before, "new": after,
                "why": f"only the {which} layout drops (capacity factor set there)"}
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    why = ("the same local slicing: the same assignments drop" if not changed else
           "different drops: " + ", ".join(f"{k} {before.get(k)} → {after.get(k)}" for k in changed))
    return {"same": not changed, "old": before, "new": after, "why": why}

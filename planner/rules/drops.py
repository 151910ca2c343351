"""MOE033: capacity drops depend on how the layout slices the batch (planner/drops.py)."""

from __future__ import annotations

from collections.abc import Iterator

from planner.drops import drop_competition
from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import dev

SOURCE = dev("core/transformer/moe/moe_utils.py", "apply_router_token_dropping")


@rule(
    "MOE033", "info", "capacity dropping is decided per rank: drops change with CP, TP·SP and b",
    source=SOURCE,
    why="""With a capacity factor the router drops assignments over the rank's own tokens
    (capacity ceil(n·k/E · factor) from its local n rows), before the EP exchange. Which
    assignments compete is the rank's slice of the batch: changing CP, the CP partition, TP with
    sequence parallelism or micro_batch_size (DP too when b > 1) changes which drop, so two such
    layouts do not train the same model step for step; EP, ETP and PP do not change it. A
    dropless run is layout-invariant. `moeplan reshard-plan` says whether two layouts drop alike.""",
    bad="moe: {moe_expert_capacity_factor: 1.0}",
    good="moe: {}",
)
def drops_follow_the_slicing(f: Facts) -> Iterator[Violation]:
    facts = drop_competition(f.cfg)
    if facts is not None:
        yield Violation("moe.moe_expert_capacity_factor",
                        f"capacity {facts['capacity_factor']} drops within each rank's "
                        f"{facts['local_tokens']} local token rows (b·S/(CP·TP_seq) = "
                        f"{facts['micro_batch_size']}·S/({facts['cp']}·{facts['tp_seq']})): another "
                        "CP, TP·SP or micro_batch_size drops other assignments",
                        "compare layouts only at the same slicing (moeplan reshard-plan says), or "
                        "run dropless (unset moe_expert_capacity_factor)")


RULES = (drops_follow_the_slicing,)

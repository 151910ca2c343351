"""BAT030: variable-length THD packing's lengths, as training.packed_lengths gives them."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts

SCHEDULER = ("Megatron-LM dev@d48bd6be megatron/core/datasets/data_schedule.py "
             "DpBalancedScheduler.get_groups_and_subsamples")


@rule(
    "BAT030", "error", "packed microbatches fit micro_batch_size · seq_length tokens",
    source=SCHEDULER,
    why="""A packing scheduler fills each microbatch with whole sequences up to its token capacity
    (micro_batch_size · seq_length per data-parallel rank); a packed length above it cannot
    occur, and the budgets, which take the max or the mean of training.packed_lengths, would be
    computed for a microbatch Megatron never builds.""",
    bad="training: {seq_length: 256, packed_lengths: [200, 300]}",
    good="training: {seq_length: 256, packed_lengths: [200, 256]}",
)
def packed_lengths_fit(f: Facts) -> Iterator[Violation]:
    lengths = f.train.packed_lengths or []
    capacity = f.train.micro_batch_size * f.train.seq_length
    over = [n for n in lengths if n > capacity]
    if over:
        yield Violation("training.packed_lengths", f"{len(over)} packed lengths above "
                        f"micro_batch_size·seq_length = {capacity} (largest {max(over)})",
                        f"give packed lengths of at most {capacity} tokens, or raise seq_length")


RULES = (packed_lengths_fit,)

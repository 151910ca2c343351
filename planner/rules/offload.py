"""OFL: fine-grained activation offloading where moeplan cannot count what leaves the GPU."""

from __future__ import annotations

from collections.abc import Iterator

from planner.config.offload_groups import unmodelled_offload
from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import dev

OFFLOAD = dev("core/pipeline_parallel/fine_grained_activation_offload.py",
              "PipelineOffloadManager.post_warmup_callback")


@rule(
    "OFL001", "error", "activation offloading is counted only where moeplan knows the saved tensors",
    source=OFFLOAD,
    why="""The memory page moves the tensors each offload group saves to the host (standard and
    MLA attention, the MoE layer's norm, FC1 and activation). Under per-layer CUDA graphs (whose
    captured groups Megatron delays or turns off), full recompute (whose recomputed blocks run
    their groups again in backward), or attention kinds whose saved tensors moeplan does not
    list per group (DeepSeek-V4 attention, gated DeltaNet layers, output gates, DSA, per-layer
    q/k norms), the figure would be a guess, so the memory verdict is refused instead.""",
    bad="overlap: {fine_grained_activation_offloading: true, offload_modules: [expert_fc1], "
        "recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1}",
    good="overlap: {fine_grained_activation_offloading: true, offload_modules: [expert_fc1]}",
)
def offload_is_counted(f: Facts) -> Iterator[Violation]:
    why = unmodelled_offload(f.cfg)
    if why is not None:
        yield Violation("overlap.offload_modules",
                        f"fine-grained activation offloading {why}: moeplan does not count what it "
                        "moves to the host, so the memory verdict would be wrong",
                        "drop overlap.fine_grained_activation_offloading for the plan (the memory "
                        "figure is then an upper bound), or offload only modules moeplan counts "
                        "(mlp_norm, expert_fc1, moe_act) without CUDA graphs or full recompute")


RULES = (offload_is_counted,)

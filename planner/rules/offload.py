"""OFL: host offloads — activation offloading where moeplan cannot count what leaves the GPU, and
the offloads whose host traffic the step time does not price."""

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


OPTIMIZER_OFFLOAD = dev("core/optimizer/cpu_offloading/hybrid_optimizer.py", "HybridDeviceOptimizer")


def _unpriced_offloads(f: Facts) -> list[tuple[str, str]]:
    """The host offloads of this config: (field, the traffic the time page leaves out)."""
    found = []
    if f.ovl.fine_grained_activation_offloading and f.ovl.offload_modules:
        found.append(("overlap.fine_grained_activation_offloading",
                      "fine-grained activation offloading's host-side work (its per-group hooks, "
                      "events and stream waits, and the host link's sharing with other GPUs; the "
                      "copies themselves are priced at the GPU's host link: time_offload_exposed_s)"))
    tr = f.cfg.training
    if tr.optimizer_cpu_offload and tr.optimizer_offload_fraction > 0:
        found.append(("training.optimizer_cpu_offload",
                      f"optimizer CPU offload ({tr.optimizer_offload_fraction:g} of the optimizer step "
                      "run on the host CPU, with its grads copied down and parameters copied back)"))
    return found


@rule(
    "OFL002", "warning", "the step time leaves out the offloads' host-side work",
    source=OPTIMIZER_OFFLOAD,
    why="""The memory page moves what the offloads put on the host. The time page prices the
    activation copies at the GPU's host link beside the compute they overlap
    (time_offload_exposed_s), but not the offload's own host-side work (per-group hooks, events
    and stream waits, which Megatron's CI runs show can cost more than the copies) nor a host
    link shared by several GPUs; and it has no CPU optimizer: the offloaded share of the
    optimizer step runs on the CPU (Megatron's HybridDeviceOptimizer), usually far slower than
    on the GPU. The step estimate, and `search`'s ranking, leave those out.""",
    bad="training: {use_distributed_optimizer: true, use_precision_aware_optimizer: true, "
        "optimizer_cpu_offload: true, optimizer_offload_fraction: 0.5}",
    good="training: {use_distributed_optimizer: true, use_precision_aware_optimizer: true}",
)
def offloads_are_not_timed(f: Facts) -> Iterator[Violation]:
    found = _unpriced_offloads(f)
    if found:
        yield Violation(found[0][0], f"the step-time estimate leaves out "
                        f"{'; and '.join(what for _, what in found)}",
                        "read the estimate as a lower bound, or calibrate on a measured run with the "
                        "offload (`moeplan estimate --measured LOG`, `moeplan calibrate LOG`); ignore "
                        "OFL002 to accept it")


RULES = (offload_is_counted, offloads_are_not_timed)

"""Time page terms of Megatron-FSDP's own kernels beyond its collectives' bytes: what its hooks and
buffers launch per microbatch and per step under `optim_grads_params`, at the host's time per launch.

Megatron-FSDP (Megatron-LM dev@d48bd6be megatron/core/distributed/fsdp/src/megatron_fsdp/) groups
the parameters into buckets: one per FSDP unit module and group (megatron/core/distributed/fsdp/
mcore_fsdp_adapter.py FullyShardedDataParallel.__init__ makes every TransformerLayer a unit under
optim_grads_params; param_and_grad_buffer.py _get_parameter_groups splits a unit's parameters into
its dense and its expert group, `".experts." in name`), the parameters outside any unit (embedding,
final norm, output layer) in a group of their own. Per microbatch:

* forward: each bucket is all-gathered before its module runs (megatron_fsdp.py
  MegatronFSDP._register_fsdp_hooks, _pre_forward_param_unshard; param_and_grad_buffer.py
  AllGatherPipeline.async_bucket_gather: one all_gather_into_tensor), and a unit's buckets are
  released after its forward;
* backward: each unit's buckets are gathered again (_pre_backward_param_unshard); each bucket's
  gradient is reduce-scattered and the reduced shard added into the sharded main grad
  (GradReducePipeline._bucket_group_gradient_reduce: reduce_scatter_tensor, `local_grad +=
  reduced_grad`); without gradient accumulation fusion each parameter's gradient is first copied
  into its bucket (_grad_acc: `param.main_grad.copy_(param.grad)`), one kernel per tensor.

Per step the optimizer's updated fp32 main weights are copied into the model's weight shards, one
copy_ per parameter tensor with a shard on this rank (MegatronFSDP.install_optimized_model_weights,
param_and_grad_buffer.py copy_main_weights_to_model_weights).

Left out: the gradient pre-scale (a mul_ per bucket only where the reduction cannot fold it: bf16
communication without --average-in-collective; gradient_reduce_preprocessing), the Python of the
hooks themselves beyond their launches, and the other strategies' buckets (optim_grads and optim
reduce per bucket too, but their buckets are sized by the bucket size, not by units).
"""

from __future__ import annotations

from planner.budget.expr import Book
from planner.budget.optimizer_time import param_tensor_counts
from planner.budget.variant import Variant


def priced(v: Variant) -> bool:
    """Megatron-FSDP with fully sharded parameters: the strategy whose buckets follow the units."""
    return v.fsdp == "optim_grads_params"


def _write_buckets(book: Book, v: Variant) -> None:
    add = book.add
    dense, expert = param_tensor_counts(v)
    add("time_fsdp_dense_tensors", dense, "count", "time",
        "Megatron-FSDP: dense parameter tensors of the stage on this rank")
    add("time_fsdp_expert_tensors", expert, "count", "time",
        "Megatron-FSDP: routed-expert parameter tensors of the stage on this rank")
    add("time_fsdp_unit_buckets", "blocks + L_mtp + L_moe * Min(experts_per_rank, 1)", "count",
        "time", "Megatron-FSDP: buckets of the stage's FSDP units (each transformer layer's dense "
        "group, and its expert group in a MoE layer; _get_parameter_groups)")
    add("time_fsdp_buckets", "time_fsdp_unit_buckets + Min(has_embedding + has_output, 1)",
        "count", "time", "Megatron-FSDP: every bucket of the stage (the units', and one for the "
        "parameters outside any unit: embedding, final norm, output layer)")


def write_host(book: Book, v: Variant) -> tuple[str, str]:
    """Host time per microbatch of Megatron-FSDP's launches, forward and backward: the names of
    the two rows (empty where the strategy is not priced)."""
    if not priced(v):
        return "", ""
    add = book.add
    _write_buckets(book, v)
    add("time_fsdp_fwd_launches", "time_fsdp_buckets", "kernels", "time",
        "Megatron-FSDP, per microbatch forward: one all-gather per bucket (AllGatherPipeline."
        "async_bucket_gather)")
    copy = " + (time_fsdp_dense_tensors + time_fsdp_expert_tensors)" if v.fsdp_grad_copy else ""
    add("time_fsdp_bwd_launches", f"time_fsdp_unit_buckets + 2 * time_fsdp_buckets{copy}",
        "kernels", "time", "Megatron-FSDP, per microbatch backward: each unit's buckets gathered "
        "again, each bucket's reduce-scatter and the add of its reduced shard into the main grad"
        + (", and each parameter's gradient copied into its bucket (no gradient accumulation "
           "fusion: _grad_acc)" if v.fsdp_grad_copy else ""))
    fwd = add("time_fsdp_host_fwd_s", "time_launch_s * time_fsdp_fwd_launches", "s", "time",
              "Megatron-FSDP: host time of its forward launches per microbatch")
    bwd = add("time_fsdp_host_bwd_s", "time_launch_s * time_fsdp_bwd_launches", "s", "time",
              "Megatron-FSDP: host time of its backward launches per microbatch")
    return fwd, bwd


def write_step(book: Book, v: Variant) -> list[str]:
    """Megatron-FSDP's per-step copy of the main weights into the model's shards: the host's
    launches beyond the copies' HBM time (the optimizer's stream already counts the bytes)."""
    if not priced(v):
        return []
    add = book.add
    add("time_fsdp_weight_copy_launches", "time_fsdp_dense_tensors / dense_opt_shards"
        " + time_fsdp_expert_tensors / expert_opt_shards + time_fsdp_buckets", "kernels", "time",
        "Megatron-FSDP: copies of the updated main weights into the model's shards per step, one "
        "per tensor with a shard on this rank (each bucket's tensors split over its shards, one "
        "tensor per bucket on two; copy_main_weights_to_model_weights)")
    return [add("time_fsdp_weight_copy_s", "Max(time_fsdp_weight_copy_launches * time_launch_s"
                " - (dense_shard_params + expert_shard_params) * (4 + p) / time_hbm_rate, 0)", "s",
                "time", "Megatron-FSDP: the host's launches of the main-weight copies beyond their "
                "HBM time, every step (MegatronFSDP.install_optimized_model_weights)")]

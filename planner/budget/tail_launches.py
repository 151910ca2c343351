"""Time page terms of the launches a microbatch issues outside its transformer blocks that no
per-layer CUDA graph captures: the gradient hooks of Megatron's DDP and the multi-token-prediction
heads. Both are size-independent kernel counts, so they weigh on small models (hidden 512 to 2,048,
where the host's launches set the step) and vanish on large ones.

* Gradient hooks (Megatron-LM dev@d48bd6be megatron/core/distributed/distributed_data_parallel.py
  DistributedDataParallel._make_backward_post_hook): autograd calls one hook per parameter tensor
  each microbatch backward, and the hook adds the fresh gradient into the fp32 main grad
  (`param.main_grad.add_(param.grad.data)`), one kernel per tensor, unless the weight-gradient
  GEMM already accumulated into it (`grad_added_to_main_grad`: a linear's weight under
  gradient_accumulation_fusion, Transformer Engine's `fuse_wgrad_accumulation` and Megatron's own
  LinearWithGradAccumulationAndAsyncCommunication alike). Norm weights, biases and the router's
  weight are added every microbatch either way. A per-layer CUDA graph returns its parameters'
  gradients to autograd (Transformer Engine transformer_engine/pytorch/graph.py
  make_graphed_callables, Graphed.backward returns a gradient per module parameter), so the hooks
  run outside the graph, one launch per tensor as without graphs; only a full-iteration graph
  captures them. Megatron-FSDP adds its own per-tensor copies instead (planner/budget/
  fsdp_time.py), so none are counted there. A hook is one Python call around one bare op, with
  none of the module set-up and allocations the calibrated host time per launch
  (efficiency.host_us_per_launch) holds around a module's kernels: it is priced at the measured
  time of one bare PyTorch op on the reference host (planner/config/gpus.py HOSTS, 13.48 µs on
  the DGX H100's Xeon) times the GPU's host scale. Counted at the calibrated figure instead, a run
  with 128 local experts per layer and no fusion (5,263 hooks a microbatch) would gain 0.26 s a
  microbatch, nearly four times the bare ops' time.
* Multi-token prediction (Megatron-LM main@d98e8a64, the commit of Megatron's CI cases, megatron/
  core/transformer/multi_token_prediction.py): Megatron's Transformer Engine CUDA graphs capture an
  MTP layer's transformer layer only (megatron/core/transformer/cuda_graphs.py
  TECudaGraphHelper._discover_layers, each layer's `mtp_model_layer`), which the blocks count; its
  own embedding, norms, projection, output head, loss and the loss's bookkeeping run as PyTorch
  ops (MTP_HEAD below). dev@d48bd6be rolls the ids and the loss mask in one call and skips the
  labels' clone: a few kernels fewer, not counted apart.
"""

from __future__ import annotations

from planner.budget.expr import Book
from planner.budget.optimizer_time import param_tensor_counts
from planner.budget.variant import Variant
from planner.config.gpus import HOSTS, REFERENCE_HOST

# Kernels of one MTP layer's forward beyond its transformer layer, per microbatch, context
# parallelism 1 (Megatron-LM main@d98e8a64 megatron/core/transformer/multi_token_prediction.py
# MultiTokenPredictionLayer._get_embeddings, MultiTokenPredictionLayer._concat_embeddings,
# process_mtp_loss, _compute_mtp_acceptance_counts, roll_tensor), as (kernels autograd
# differentiates, kernels it records no backward for, what):
MTP_HEAD: tuple[tuple[int, int, str], ...] = (
    (0, 6, "roll_tensor of the input ids and the position ids "
           "(MultiTokenPredictionLayer._get_embeddings): torch.roll, the vacated slot's fill_ and "
           "the rolled sum, three each, on integer tensors"),
    (1, 0, "the embedding of the rolled ids (as the model's own embedding)"),
    (5, 0, "enorm, hnorm, their concatenation, eh_proj's GEMM (_concat_embeddings) and the "
           "final_layernorm (_postprocess)"),
    (11, 0, "the output layer's GEMM and the vocab-parallel cross entropy (process_mtp_loss; as "
            "the model's own head, its norm counted above)"),
    (0, 6, "roll_tensor of the labels and the loss mask (process_mtp_loss)"),
    (3, 0, "the loss mask's product, the loss scale's product and the division by the token "
           "count (MTPLossAutoScaler's input)"),
    (0, 7, "the logged loss: its sum, the count's test, cast and product, the clamps and the "
           "division"),
    (0, 10, "_compute_mtp_acceptance_counts under torch.no_grad: the logits' argmax, the "
            "labels' and mask's transposes made contiguous, the mask's cast, the comparison, the "
            "and, the two sums and their casts"),
    (0, 3, "MTPLossLoggingHelper.save_metrics_to_tracker: the three tracker adds"),
)
# Under tensor parallelism: eh_proj's output gathered over the TP group and scattered back to the
# sequence-parallel region (two collectives), and the acceptance count's argmax over the
# vocab-sharded logits (_vocab_parallel_argmax: the local max, two all-gathers, two stacks, the
# argmax, the gather and the index arithmetic's two: nine where one argmax is one).
MTP_HEAD_TP = (2, 8)  # (differentiated, without backward)
# Once per microbatch on the stage with MTP layers: the labels' clone and the loss mask's sum
# (process_mtp_loss, before its loop over the MTP layers).
MTP_PRELUDE_NOGRAD = 2


def _linear_weights(v: Variant) -> str:
    """Linear weight tensors of the stage on this rank: those whose gradient a fused weight-gradient
    GEMM accumulates into the main grad under gradient_accumulation_fusion (param_tensor_counts'
    linears without their biases: attention's projections, each MLP's two, the output layer's and
    each MTP layer's eh_proj)."""
    attention = (5 if v.mla_q_lora else 4) if v.attention == "mla" else 2
    return (f"blocks * {attention} + L_moe * Min(I_s, 1) * 2 + L_dense * 2"
            " + L_moe * experts_per_rank * 2 + has_output_weight + L_mtp")


def write_counts(book: Book, v: Variant) -> str:
    """The tail's kernel counts per microbatch; returns the name of the count the GPU runs (forward
    and backward, CUDA graphs or not), for the per-kernel GPU cost."""
    add = book.add
    grad, nograd = (sum(g for g, _, _ in MTP_HEAD), sum(n for _, n, _ in MTP_HEAD))
    if v.tp:
        grad, nograd = grad + MTP_HEAD_TP[0], nograd + MTP_HEAD_TP[1]
    add("time_mtp_head_grad_launches", f"L_mtp * {grad}", "kernels", "time",
        "per microbatch forward, the MTP layers' kernels beyond their transformer layers that "
        "autograd differentiates: " + "; ".join(w for g, _, w in MTP_HEAD if g)
        + ("; eh_proj's gather and scatter over the TP group" if v.tp else ""))
    add("time_mtp_head_nograd_launches", f"L_mtp * {nograd} + Min(L_mtp, 1) * {MTP_PRELUDE_NOGRAD}",
        "kernels", "time", "per microbatch forward, the MTP layers' kernels with no backward: "
        + "; ".join(w for _, n, w in MTP_HEAD if n)
        + ("; the acceptance count's argmax over vocab-sharded logits" if v.tp else "")
        + f"; once, the labels' clone and the loss mask's sum ({MTP_PRELUDE_NOGRAD})")
    dense, expert = param_tensor_counts(v)
    fused = f" - ({_linear_weights(v)})" if not v.wgrad_unfused else ""
    hooks = "0" if v.fsdp else f"({dense}) + ({expert}){fused}"
    add("time_grad_hook_launches", hooks, "kernels", "time",
        "per microbatch backward, the DDP gradient hooks' adds into the main grads: one per "
        "parameter tensor of the stage" + (" (gradient_accumulation_fusion off)"
                                            if v.wgrad_unfused else
                                            " whose gradient no fused weight-gradient GEMM "
                                            "accumulated (norms, biases, router, embedding)")
        + ("; none under Megatron-FSDP (planner/budget/fsdp_time.py)" if v.fsdp else ""))
    return add("time_tail_kernels", "3 * time_mtp_head_grad_launches + time_mtp_head_nograd_launches"
               " + time_grad_hook_launches", "kernels", "time",
               "per microbatch, the tail's kernels the GPU runs: the MTP heads' forward and the "
               "backward's two per differentiated kernel, and the gradient hooks' adds")


def write_host(book: Book) -> tuple[str, str]:
    """Host time per microbatch of the tail's launches, forward and backward (none under a
    full-iteration CUDA graph, which captures them)."""
    add = book.add
    bare = HOSTS[REFERENCE_HOST].bare_op_s
    add("time_bare_op_s", f"host_scale * {bare.numerator} / {bare.denominator} + t_unbound", "s",
        "time", "host time of one bare PyTorch op on this GPU's host CPU: the reference host's "
        "measured torch.nn.Linear forward (planner/config/gpus.py HOSTS) times the host scale, "
        "and an unbound rank's measured extra per op")
    fwd = add("time_tail_host_fwd_s", "time_launch_s * (time_mtp_head_grad_launches"
              " + time_mtp_head_nograd_launches) * (1 - graph_full)", "s", "time",
              "host time of the MTP heads' forward launches per microbatch (no per-layer CUDA "
              "graph captures them)")
    bwd = add("time_tail_host_bwd_s", "(time_launch_s * 2 * time_mtp_head_grad_launches"
              " + time_bare_op_s * time_grad_hook_launches) * (1 - graph_full)", "s", "time",
              "host time per microbatch backward of the MTP heads' two per differentiated kernel, "
              "and the DDP gradient hooks' adds at a bare op each (outside per-layer CUDA graphs: "
              "the graphs return their parameters' gradients to autograd)")
    return fwd, bwd

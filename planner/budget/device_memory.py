"""Page 4, the allocator's peak beyond the stored tensors, and the device total.

`peak_memory_bytes` is what Megatron's log prints as `max allocated` (torch.cuda.max_memory_allocated:
tensors the caching allocator hands out). Besides the persistent state and stored activations of
planner/budget/memory.py it holds:

* the loss's logits: the output layer's [s·b, V/TP] logits in the training dtype and the fp32 copy
  the cross entropy makes of them (Megatron-LM dev@d48bd6be megatron/core/tensor_parallel/
  cross_entropy.py VocabParallelCrossEntropy.calculate_logits_max casts them, the softmax is
  computed in place and saved for backward; megatron/core/fusions/fused_cross_entropy.py, the
  `native` fused path, does the same inside jit-fused functions). Transformer Engine's fused cross
  entropy (`te`, megatron/core/models/common/language_module/language_module.py
  compute_language_model_loss) computes the gradient into the logits in forward and keeps no fp32
  copy; the `linear` path (gpt_model.py GPTModel.fuse_linear_cross_entropy) never forms the whole
  logits;
* unfused attention's s × s scores (attention_backend unfused, or transformer_impl local, whose
  megatron/core/transformer/dot_product_attention.py DotProductAttention.forward keeps the softmax
  output, the dropout mask and the dropped probabilities for backward and fills the raw scores
  into a persistent global buffer);
* the GEMM workspaces: PyTorch's cuBLAS workspace of the compute stream (32 MiB on compute
  capability 9.0 and later, 8.125 MiB before: PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp
  getChosenWorkspaceSize) and Transformer Engine's (transformer_engine/pytorch/cpp_extensions/gemm.py
  get_cublas_workspace_size_bytes, 32 MiB on Hopper and later, 4 MiB before, one per stream of its
  multi-stream grouped GEMM, four by default: get_num_compute_streams).

Not counted: the caching allocator's rounding of each block to 512 bytes (under 512 B a tensor),
HybridEP's communication buffers, cuDNN's workspaces.

The device total adds what the allocator does not report as allocated: its reserved but unused
slack (cluster.allocator_reserved_ratio, the median `max reserved` / `max allocated` of the
measured logs docs/budgets.md names), the CUDA context (cluster.cuda_context_gib), DeepEP's
NVLink and RDMA buffers under the flex dispatcher's deepep backend (planner/config/deepep_buffers.py)
and NCCL's
buffers: one set per ring communicator the rank moves data in (NCCL src/init.cc DEFAULT_BUFFSIZE
4 MiB for Simple, DEFAULT_LL128_BUFFSIZE 4,915,200 B and DEFAULT_LL_BUFFSIZE 524,288 B per channel
and connection) and, for point-to-point traffic (the all-to-all and pipeline sends), a Simple buffer
on each of two channels per peer (NCCL_NCHANNELS_PER_NET_PEER's default).
"""

from __future__ import annotations

from planner.budget.expr import Book
from planner.budget.variant import Variant

# NCCL src/init.cc: Simple (1 << 22), LL128 (120 elements · 640 threads · 8 steps · 8 B) and LL
# (8 lines · 512 threads · 8 steps · 16 B) buffers of one channel and connection.
NCCL_RING_BYTES_PER_CHANNEL = (1 << 22) + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16
NCCL_P2P_CHANNELS_PER_PEER = 2
WORKSPACE_BYTES = 32 * 2**20
# Before compute capability 9.0 (Ampere): PyTorch's default CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8"
# (two 4 MiB and eight 16 KiB chunks) and Transformer Engine's 4 MiB.
TORCH_WORKSPACE_BYTES_PRE_HOPPER = (4096 * 2 + 16 * 8) * 1024
TE_WORKSPACE_BYTES_PRE_HOPPER = 4 * 2**20
TE_GROUPED_GEMM_STREAMS = 4


def _logit_bytes(v: Variant) -> tuple[str, str]:
    """Bytes per logit element kept for backward by the cross-entropy path, and why."""
    return {
        "unfused": ("4", "the fp32 softmax the unfused vocab-parallel cross entropy saves"),
        "native": ("4", "the fp32 softmax the fused native cross entropy saves"),
        "te": ("p", "the logits, into which Transformer Engine's cross entropy writes the gradient"),
        "linear": ("0", "none: the fused linear cross entropy never forms the whole logits"),
    }[v.ce_impl]


def logits_stored(v: Variant) -> str:
    """act_output's per-token logits term (the main head and each MTP head)."""
    return f"TP_seq * V_pad / TP * {_logit_bytes(v)[0]}"


def write_attention_scores(book: Book, v: Variant) -> str:
    """Unfused attention's stored scores per block ("" when the kernel keeps none)."""
    if not (v.attn_scores and v.attention in ("standard", "mla")):
        return ""
    add = book.add
    add("attn_score_elements", "b * heads / TP * S * S / CP", "count", "memory",
        "per microbatch and block: s x s attention scores of the rank's heads")
    stored = "p + 1 + p" if v.attention_dropout else "p"
    add("act_attn_scores_per_block", f"attn_score_elements * ({stored})", "bytes", "memory",
        "per microbatch: unfused attention keeps the softmax output"
        + (", the attention-dropout mask (bool) and the dropped probabilities"
           if v.attention_dropout else "") + " for backward")
    add("attn_scores_transient_bytes", "attn_score_elements * p", "bytes", "memory",
        "one block's raw scores before the softmax (Megatron's local attention keeps them in a "
        "persistent global buffer)")
    return "act_attn_scores_per_block"


def write_allocator_extras(book: Book, v: Variant) -> str:
    """The allocator's terms beyond planner/budget/memory.py's parts; returns what peak adds."""
    add = book.add
    per, why = _logit_bytes(v)
    extra = "p" if v.ce_impl in ("unfused", "native") else "0"
    add("loss_logit_bytes_per_element", per, "bytes", "memory",
        f"per logit element kept for backward: {why}")
    add("loss_transient_bytes", f"has_output * tokens_per_rank * TP_seq * V_pad / TP * {extra}",
        "bytes", "memory",
        "per microbatch, one head at a time: the output layer's logits in training precision "
        "beside the fp32 copy the cross entropy makes in forward (in backward the same bytes: "
        "the gradient cast back to training precision beside the fp32 softmax)"
        if extra != "0" else "no whole logits beside the stored ones on this cross-entropy path")
    transients = ["comm_buffer_bytes", "loss_transient_bytes"]
    for transient in ("attn_scores_transient_bytes", "dsa_transient_bytes"):
        if transient in book.levels:
            transients.append(transient)
    add("transient_extra_bytes", f"Max({', '.join(transients)}) - comm_buffer_bytes", "bytes",
        "memory", "the largest transient of the step beyond one layer's communication buffers "
        "(they do not coexist): the loss's logits or unfused attention's raw scores")
    streams = 1 + (TE_GROUPED_GEMM_STREAMS if v.grouped_gemm else 0) if v.te else 0
    whose = ("PyTorch's cuBLAS workspace" + (", Transformer Engine's" if v.te else "")
             + (f" and one per stream of its grouped GEMM ({TE_GROUPED_GEMM_STREAMS})"
                if v.te and v.grouped_gemm else ""))
    if v.large_workspaces:
        add("workspace_bytes", f"{WORKSPACE_BYTES} * {1 + streams}", "bytes", "memory",
            "GEMM workspaces, 32 MiB each: " + whose)
    else:
        add("workspace_bytes", f"{TORCH_WORKSPACE_BYTES_PRE_HOPPER} + {TE_WORKSPACE_BYTES_PRE_HOPPER} * "
            f"{streams}", "bytes", "memory", "GEMM workspaces before compute capability 9.0: "
            "PyTorch's cuBLAS workspace of 8.125 MiB" + (", 4 MiB each for " + whose.split(", ", 1)[1]
                                                          if v.te else ""))
    return "transient_extra_bytes + workspace_bytes"


def _ring_groups(v: Variant) -> list[str]:
    """The ring communicators a rank moves data in during a step."""
    groups = {"tp": v.tp, "cp": v.cp, "dp_cp": v.dp_cp, "expt_dp": v.edp and v.expert_buffer,
              "expt_tp": v.etp}
    return [name for name, used in groups.items() if used]


def write_device_total(book: Book, v: Variant) -> None:
    """The busiest rank's device total: allocated peak, reserved slack, CUDA context, NCCL."""
    add = book.add
    rings = _ring_groups(v)
    add("nccl_ring_groups", str(len(rings)), "count", "memory",
        "ring communicators the rank moves data in: " + (", ".join(rings) or "none"))
    peers = []
    if v.ep and v.dispatcher in ("alltoall",):
        peers.append("EP * ETP - 1" if v.etp else "EP - 1")
    if v.pp:
        peers.append("Min(PP - 1, 2)")
    add("nccl_p2p_peers", " + ".join(peers) or "0", "count", "memory",
        "point-to-point peers: the EP all-to-all's other ranks and the pipeline neighbours")
    add("nccl_buffer_bytes", f"nccl_ring_groups * nccl_channels * {NCCL_RING_BYTES_PER_CHANNEL}"
        f" + nccl_p2p_peers * {NCCL_P2P_CHANNELS_PER_PEER} * {1 << 22}", "bytes", "memory",
        "NCCL's buffers outside the PyTorch allocator: Simple, LL128 and LL per channel of each "
        "ring communicator, a 4 MiB Simple buffer per p2p channel and peer (NCCL's defaults)")
    add("cuda_context_bytes", "context_gib * 1073741824", "bytes", "memory",
        "CUDA context and loaded kernels (cluster.cuda_context_gib)")
    add("reserved_slack_bytes", "ceiling(hot_rank_memory_peak_bytes * (reserved_ratio - 1))", "bytes",
        "memory", "reserved but unallocated blocks of the caching allocator at the peak "
        "(cluster.allocator_reserved_ratio)")
    total = "hot_rank_memory_peak_bytes + reserved_slack_bytes + cuda_context_bytes + nccl_buffer_bytes"
    if v.dispatcher == "flex" and v.flex_backend == "deepep":
        add("deepep_buffer_bytes", "deepep_nvl_bytes + deepep_rdma_bytes", "bytes", "memory",
            "DeepEP's communication buffers for the EP group, outside the PyTorch allocator: the "
            "NVLink buffer (cudaMalloc) and, across nodes, the RDMA buffer (NVSHMEM), sized by "
            "DeepEP's hints (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/fused_a2a.py "
            "get_buffer)")
        total += " + deepep_buffer_bytes"
    if v.rl:
        total = write_rl_colocation(book, v, total)
    add("device_memory_bytes", total, "bytes", "memory",
        "device total of the busiest EP rank: allocated peak, reserved slack, CUDA context, NCCL"
        + ("; with the colocated RL engine, the larger of the training and rollout phases" if v.rl else ""))
    add("device_memory_utilization", "device_memory_bytes / gpu_memory_bytes", "share", "memory",
        "device total over GPU memory (MEM002 above 1 - cluster.memory_margin, MEM001 above 100 %)")


def write_rl_colocation(book: Book, v: Variant, training: str) -> str:
    """An RL inference engine on the same GPUs (slime's --colocate with --sglang-mem-fraction-
    static, verl's rollout.gpu_memory_utilization): SGLang and vLLM size their static pool
    (weights and KV cache) as that share of the GPU's whole memory. In the training phase the
    engine holds its pool, or only its own CUDA context when it releases the pool (slime
    --offload-rollout, torch_memory_saver; verl free_cache_engine); in the rollout phase training
    holds its weights, grads and optimizer states, or only its context and NCCL buffers when it
    offloads them (slime --offload-train; verl param_offload / optimizer_offload). The device
    total is the larger phase."""
    add = book.add
    add("rl_engine_bytes", "rl_engine_fraction * gpu_memory_bytes", "bytes", "memory",
        "the inference engine's static pool (weights and KV cache): its share of the GPU")
    add("rl_engine_in_training_bytes",
        "cuda_context_bytes" if "rollout" in v.rl else "rl_engine_bytes", "bytes", "memory",
        "what the engine holds while training runs: "
        + ("its CUDA context (the pool is released)" if "rollout" in v.rl else "its whole pool"))
    kept = "cuda_context_bytes + nccl_buffer_bytes"
    if "train" not in v.rl:
        kept = "weight_bytes + grad_bytes + optimizer_bytes + buffer_bytes + " + kept
    add("rl_training_in_rollout_bytes", kept, "bytes", "memory",
        "what training holds while the engine generates: "
        + ("its CUDA context and NCCL buffers (weights, grads and optimizer states offloaded)"
           if "train" in v.rl else "its weights, grads, optimizer states, CUDA context and NCCL"))
    add("rl_training_phase_bytes", f"{training} + rl_engine_in_training_bytes", "bytes", "memory",
        "device total of the training phase: training's own and the engine's share")
    add("rl_rollout_phase_bytes", "rl_engine_bytes + rl_training_in_rollout_bytes", "bytes", "memory",
        "device total of the rollout phase: the engine's pool and what training keeps")
    return "Max(rl_training_phase_bytes, rl_rollout_phase_bytes)"

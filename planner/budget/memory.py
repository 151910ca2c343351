"""Page 4, memory per rank and stage: the parameter buffers of page 2, fp32 main grads, optimizer
states (sharded over dp_cp / expt_dp with the distributed optimizer), MoE-aware activations of the
chunks live at the pipeline schedule's peak, recompute, and communication buffers.

What is counted: every parameter and persistent buffer the model holds, main grads, optimizer
states, stored activations and the transient dispatch/pipeline buffers of one layer. Weight and
grad buffers are padded as the distributed optimizer pads them (one buffer per kind and stage, its
end at a multiple of lcm(shards, 128) elements), so every shard and byte count is whole. What is
not: allocator fragmentation, CUDA context and library workspaces, NCCL internal buffers, the fp32
copy of probabilities in fused kernels, temporary GEMM workspaces, checkpoint I/O buffers, the
64-element alignment of each parameter in its buffer, and the extra padded buckets that
overlap_grad_reduce (first stage) or one buffer per VPP chunk add (under lcm(shards, 128) elements
each).
Activations follow a flash-attention model (no s² score matrix is stored) and count each stored
tensor once; SwiGLU is assumed for every MLP.
"""

from __future__ import annotations

from planner.budget.expr import Book
from planner.budget.symbols import Variant

PAGE = "memory"

OPTIMIZER_BYTES = {"adam": ("8", "Adam m and v in fp32"), "sgd": ("4", "fp32 momentum"),
                   "muon": ("4", "fp32 momentum (Muon)")}


def _act_parts(v: Variant) -> dict[str, tuple[str, str]]:
    """Stored activation widths; selective recompute drops the tensors it recomputes."""
    mods = v.recompute_modules
    norm = "h" if "layernorm" in mods else "2 * h"
    up = "mla_up_proj" in mods
    attention = {
        "standard": f"({norm} + 2 * heads * d + 2 * groups * d) * p + heads * 4",
        "mla": f"({norm} + 2 * q_lora + 2 * (kv_lora + qk_rope)"
               + ("" if up else " + 2 * heads * (d + qk_rope) + heads * d") + " + heads * d) * p"
               " + heads * 4",
        "dsv4_hybrid": f"({norm} + 2 * q_lora" + ("" if up else " + heads * d")
                       + " + 2 * d + heads * d + o_groups * o_lora) * p + heads * 4",
    }[v.attention]
    act = "2 * I / ETP" if "moe_act" in mods else "3 * I / ETP"
    shared = "0" if "shared_experts" in mods else ("2 * I_s" if "moe_act" in mods else "3 * I_s")
    return {
        "act_attention_per_block": (f"tokens_per_rank * ({attention})",
                                    "norm in/out, q, k, v, core output, softmax statistics (fp32)"),
        "act_router_per_layer": ("tokens_per_rank * E * (4 + 4 + 1)",
                                 "router logits and probs in fp32, bool routing map"),
        "act_shared_per_layer": (f"tokens_per_rank * {shared} * p",
                                 "shared-expert FC1 output and activation"),
        "act_routed_per_layer": (f"expert_gemm_rows * (h + {act} + 1) * p + assignments_per_rank * 8",
                                 "MoE-aware: expert inputs are the GEMM rows (n·k·ETP), not n; "
                                 "FC1 in/out, FC2 in, probs, int64 permutation map"),
        "act_dense_mlp_per_layer": ("tokens_per_rank * 2 * h * p" if "mlp" in mods else
                                    f"tokens_per_rank * ({norm} + 3 * f) * p",
                                    "dense SwiGLU MLP block"),
    }


def write(book: Book, v: Variant) -> None:
    add = book.add
    buffers = "(dense_buffer_params + expert_buffer_params)"
    add("weight_bytes", f"{buffers} * p", "bytes", "memory",
        "parameter buffers in training precision (padded like the grad buffers)")
    add("grad_bytes", f"{buffers} * bytes_grad", "bytes", "memory",
        "fp32 main-grad buffers (padded, not sharded by the distributed optimizer)")
    opt, opt_doc = OPTIMIZER_BYTES[v.optimizer]
    if v.master_copy:
        opt, opt_doc = f"4 + {opt}", f"fp32 master weights + {opt_doc}"
    add("optimizer_bytes_per_param", opt, "bytes", "memory", opt_doc)
    add("optimizer_bytes", "optimizer_bytes_per_param * (dense_shard_params + expert_shard_params)",
        "bytes", "memory",
        "optimizer states, sharded over dp_cp / expt_dp with the distributed optimizer")
    add("buffer_bytes", "bias_routers * E * (4 + 8) + L_hash * V_pad * k * 4", "bytes", "memory",
        "expert bias (fp32) and token counts (int64); hash tables tid2eid [V_pad, k] int32")
    for name, (formula, doc) in _act_parts(v).items():
        add(name, formula, "bytes", "memory", f"per microbatch: {doc}")
    moe = ("tokens_per_rank * 2 * h * p" if "moe" in v.recompute_modules else
           f"tokens_per_rank * {'h' if 'layernorm' in v.recompute_modules else '2 * h'} * p"
           " + act_router_per_layer + act_shared_per_layer + act_routed_per_layer")
    add("act_moe_per_layer", moe, "bytes", "memory", "per microbatch: one MoE layer")
    per_block = "act_attention_per_block"
    if v.mhc:
        add("act_mhc_per_block", "2 * tokens_per_rank * n_hc * h * p", "bytes", "memory",
            "per microbatch: the widened residual stream entering both sub-layers")
        per_block += " + act_mhc_per_block"
    layers = f"blocks * ({per_block}) + moe_layers * act_moe_per_layer" \
             " + L_dense * act_dense_mlp_per_layer"
    if v.attention == "dsv4_hybrid":
        add("act_csa_per_layer", "tokens_per_rank * ((4 * d + idx_heads * idx_dim + idx_heads"
            " + 4 * idx_dim) * p + idx_topk * 4)", "bytes", "memory",
            "per microbatch: CSA compressor, indexer scores and int32 top-k indices")
        add("act_hca_per_layer", "tokens_per_rank * 2 * d * p", "bytes", "memory",
            "per microbatch: HCA compressor")
        layers += " + L_csa * act_csa_per_layer + L_hca * act_hca_per_layer"
    add("act_layers_per_microbatch", layers, "bytes", "memory",
        "all blocks of the stage for one microbatch, nothing recomputed")
    add("layer_input_bytes", "tokens_per_rank * n_hc * h * p", "bytes", "memory",
        "a block's input, what full recompute keeps")
    _add_recompute(book, v)
    add("act_embedding", "has_embedding * tokens_per_rank * (h * p + 8)", "bytes", "memory",
        "per microbatch: embedding output and token ids")
    add("act_output", "(has_output + L_mtp) * tokens_per_rank * (h * p + TP_seq * V_pad / TP * 4)",
        "bytes", "memory",
        "per microbatch: output-layer input and fp32 logits (main head and each MTP head); the "
        "logits cover the whole sequence (gathered from the TP_seq shards) and V_pad / TP of the "
        "vocabulary")
    add("act_per_microbatch", "act_stored_layers + act_embedding + act_output", "bytes", "memory",
        "stored activations of one microbatch on this stage")
    add("in_flight_microbatches", "live_passes / VPP", "count", "memory",
        "chunk passes held at the activation peak, in microbatch equivalents (1F1B: min(m, PP - s);"
        " interleaved: warm-up passes + 1)")
    add("activation_bytes", "act_live_peak + recompute_working_bytes", "bytes", "memory",
        "peak stored activations: the live chunks at the schedule's peak, plus recompute's block")
    buffers = {"alltoall": "2 * dispatch_send_bytes",
               "allgather": "allgather_dispatch_rows * (2 * h * p + E * p + E)",
               "flex": "2 * ncclep_recv_rows * h * p" if v.ncclep else "2 * flex_dispatch_send_bytes",
               }[v.dispatcher]
    if v.pp:
        buffers += " + 2 * pp_activation_bytes"
    add("comm_buffer_bytes", buffers, "bytes", "memory",
        "transient buffers of one layer: permuted send + combine output (AllGather: gathered "
        "hidden, probs, map and the full output; NCCL EP: its receive and combine buffers of "
        "ncclep_recv_rows each), pipeline send/recv")
    add("peak_memory_bytes", "weight_bytes + grad_bytes + optimizer_bytes + buffer_bytes"
        " + activation_bytes + comm_buffer_bytes", "bytes", "memory", "estimated peak per rank")
    add("gpu_memory_bytes", "mem_gib * 1073741824", "bytes", "memory", "cluster.gpu_memory_gib")
    add("memory_utilization", "peak_memory_bytes / gpu_memory_bytes", "share", "memory",
        "peak over GPU memory (MEM002 above 80 %, MEM001 above 100 %)")


def _add_recompute(book: Book, v: Variant) -> None:
    add, avg = book.add, "act_layers_per_microbatch / Max(blocks, 1)"
    whole = "whole bytes, the average block rounded up"
    if v.recompute != "full":
        add("act_stored_layers", "act_layers_per_microbatch", "bytes", "memory",
            "per microbatch: block activations kept for backward")
        add("recompute_working_bytes", "0", "bytes", "memory", "no full recompute")
        return
    if v.recompute_method == "block":
        add("recomputed_blocks", "blocks_recomputed", "count", "memory",
            "block method: the first N_r decoder blocks of each chunk are recomputed (MTP not)")
        add("act_stored_layers", f"ceiling((blocks - recomputed_blocks) * {avg})"
            " + recomputed_blocks * layer_input_bytes", "bytes", "memory",
            f"per microbatch: other blocks keep everything (average block; {whole})")
        add("recompute_working_bytes", f"Min(recomputed_blocks, 1) * ceiling({avg})", "bytes",
            "memory", f"one block re-materialised during its backward ({whole})")
        return
    add("act_stored_layers", "ceiling(blocks / N_r) * layer_input_bytes", "bytes", "memory",
        "uniform method: one input per group of N_r blocks")
    add("recompute_working_bytes", f"ceiling(Min(N_r, blocks) * {avg})", "bytes", "memory",
        f"one group of N_r blocks re-materialised during backward (average block; {whole})")

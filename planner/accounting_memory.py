"""Formulas for memory per rank and stage: parameters (routed experts / EP / ETP, shared expert / TP,
V4 CSA/HCA attention, norms, router, mHC, embedding, output, MTP), fp32 main grads, optimizer
states (sharded over dp_cp / expt_dp with the distributed optimizer), MoE-aware activations times
in-flight microbatches, recompute, and communication buffers.

What is counted: every parameter and persistent buffer the model holds, main grads, optimizer
states, stored activations and the transient dispatch/pipeline buffers of one layer. What is not:
allocator fragmentation, CUDA context and library workspaces, NCCL internal buffers, the fp32
copy of probabilities in fused kernels, temporary GEMM workspaces and checkpoint I/O buffers.
Activations follow a flash-attention model (no s² score matrix is stored) and count each stored
tensor once; SwiGLU is assumed for every MLP.
"""

from __future__ import annotations

from planner.accounting_expr import Book
from planner.accounting_symbols import Variant

ATTENTION_PARAMS = {
    "standard": "2 * h * d * (heads + groups) / (TP * GTP)",
    "mla": "({q} + kv_lora * (h + 2 * heads * d + 1) + h * qk_rope + heads * d * h) / (TP * GTP)",
    "dsv4_hybrid": "(h * q_lora + q_lora + q_lora * heads * d + h * d + d + o_lora * heads * d"
                   " + h * o_groups * o_lora + heads) / (TP * GTP)",
}
MLA_Q = {True: "q_lora * (h + heads * (d + qk_rope) + 1)", False: "h * heads * (d + qk_rope)"}
OPTIMIZER_BYTES = {"adam": ("8", "Adam m and v in fp32"), "sgd": ("4", "fp32 momentum"),
                   "muon": ("4", "fp32 momentum (Muon)")}


def add_params(book: Book, v: Variant) -> None:
    """Parameter counts on one rank of a stage, and the buffers/shards the grad steps need."""
    add = book.add
    add("routed_params_per_layer", "experts_per_rank * 3 * h * I / (ETP * EGTP)", "params", "memory",
        "routed SwiGLU experts on this rank (W1, W3: h x I/ETP, W2: I/ETP x h)")
    add("routed_weight_bytes_per_layer", "routed_params_per_layer * p", "bytes", "memory",
        "routed expert weights per MoE layer")
    add("routed_weight_bytes_per_stage", "routed_weight_bytes_per_layer * moe_layers", "bytes",
        "memory", "routed expert weights of every MoE layer on the stage")
    add("shared_params_per_layer", "3 * h * I_s / (TP * GTP)", "params", "memory",
        "shared expert, dense TP layout")
    add("router_params_per_layer", "E * h", "params", "memory", "gating matrix (replicated over TP)")
    add("norm_params_per_block", "2 * h", "params", "memory", "two RMSNorms per block")
    attention = ATTENTION_PARAMS[v.attention].replace("{q}", MLA_Q[v.mla_q_lora])
    add("attention_params_per_block", attention, "params", "memory",
        f"{v.attention} attention projections on this rank")
    mixers = "attention_params_per_block + norm_params_per_block"
    if v.mhc:
        add("mhc_params_per_block", "2 * ((2 + n_hc) * n_hc * n_hc * h + (2 + n_hc) * n_hc + 3)",
            "params", "memory", "mHC pre/post/combination weights of both sub-layers")
        mixers += " + mhc_params_per_block"
    extra = ""
    if v.attention == "dsv4_hybrid":
        add("csa_params_per_layer", "(4 * d * h + csa_ratio * 2 * d + d + idx_heads * idx_dim * q_lora"
            " + idx_heads * h + 4 * idx_dim * h + csa_ratio * 2 * idx_dim + idx_dim) / (TP * GTP)",
            "params", "memory", "CSA compressor (overlapping, 2x width) + lightning indexer")
        add("hca_params_per_layer", "(2 * d * h + hca_ratio * d + d) / (TP * GTP)", "params",
            "memory", "HCA compressor")
        extra = " + L_csa * csa_params_per_layer + L_hca * hca_params_per_layer"
    add("dense_mlp_params_per_layer", "3 * h * f / (TP * GTP)", "params", "memory",
        "dense SwiGLU MLP of a non-MoE block")
    add("embedding_params", "V * h / TP", "params", "memory", "word embedding (or output) shard")
    add("final_params", "h + n_hc * n_hc * h + n_hc + 1" if v.mhc else "h", "params", "memory",
        "final norm" + (" + mHC head" if v.mhc else ""))
    add("mtp_extra_params_per_layer", "2 * h * h / TP + 3 * h", "params", "memory",
        "MTP e/h projections and norms (its block is counted with the blocks)")
    add("dense_params_on_rank",
        f"blocks * ({mixers}){extra} + moe_layers * (shared_params_per_layer"
        " + router_params_per_layer) + L_dense * dense_mlp_params_per_layer"
        " + (has_embedding + has_mtp_embedding + has_output_weight) * embedding_params"
        " + has_output * final_params + L_mtp * mtp_extra_params_per_layer",
        "params", "memory", "parameters reduced over dp_cp")
    add("expert_params_on_rank", "moe_layers * routed_params_per_layer", "params", "memory",
        "routed-expert parameters reduced over expt_dp")
    add("params_on_rank", "dense_params_on_rank + expert_params_on_rank", "params", "memory",
        "all parameters on this rank")
    add("bias_routers", "moe_layers - L_hash" if v.expert_bias else "0", "count", "memory",
        "routers with an expert bias (hash layers have none)")
    add("bytes_grad", "4", "bytes", "memory", "fp32 main grads (Megatron's default for bf16/fp16)")
    shard = v.dist_opt
    add("dense_opt_shards", "dp_cp_size / I_opt" if shard else "1", "ranks", "memory",
        "dense optimizer shards (distributed optimizer over dp_cp, per instance)")
    add("expert_opt_shards", "expert_dp / I_opt" if shard else "1", "ranks", "memory",
        "expert optimizer shards (distributed optimizer over expt_dp, per instance)")
    for kind in ("dense", "expert"):
        add(f"{kind}_shard_params", f"ceiling({kind}_params_on_rank / {kind}_opt_shards)",
            "params", "memory", f"{kind} parameters whose optimizer state this rank owns (the "
            "grad buffer is padded to a multiple of the shards)")


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


def add_memory(book: Book, v: Variant) -> None:
    add = book.add
    add("weight_bytes", "params_on_rank * p", "bytes", "memory", "parameters in training precision")
    add("grad_bytes", "params_on_rank * bytes_grad", "bytes", "memory",
        "fp32 main-grad buffers (not sharded by the distributed optimizer)")
    opt, opt_doc = OPTIMIZER_BYTES[v.optimizer]
    if v.master_copy:
        opt, opt_doc = f"4 + {opt}", f"fp32 master weights + {opt_doc}"
    add("optimizer_bytes_per_param", opt, "bytes", "memory", opt_doc)
    add("optimizer_bytes", "optimizer_bytes_per_param * (dense_shard_params + expert_shard_params)",
        "bytes", "memory",
        "optimizer states, sharded over dp_cp / expt_dp with the distributed optimizer")
    add("buffer_bytes", "bias_routers * E * (4 + 8) + L_hash * V * k * 8", "bytes", "memory",
        "expert bias (fp32) and token counts (int64); hash tables tid2eid [V, k] int64")
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
    add("act_output", "(has_output + L_mtp) * tokens_per_rank * (h * p + V * 4)", "bytes", "memory",
        "per microbatch: output-layer input and fp32 logits (main head and each MTP head)")
    add("act_per_microbatch", "act_stored_layers + act_embedding + act_output", "bytes", "memory",
        "stored activations of one microbatch on this stage")
    if v.interleaved:
        flight = "Min(microbatches * VPP, 2 * (PP - s - 1) + (VPP - 1) * PP + 1) / VPP"
        doc = "interleaved 1F1B: warm-up chunks + 1, in microbatch equivalents"
    else:
        flight, doc = "Min(microbatches, PP - s)", "1F1B: stage s holds PP - s microbatches"
    add("in_flight_microbatches", flight, "count", "memory", doc)
    add("activation_bytes", "act_per_microbatch * in_flight_microbatches + recompute_working_bytes",
        "bytes", "memory", "peak stored activations")
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
    if v.recompute != "full":
        add("act_stored_layers", "act_layers_per_microbatch", "bytes", "memory",
            "per microbatch: block activations kept for backward")
        add("recompute_working_bytes", "0", "bytes", "memory", "no full recompute")
        return
    if v.recompute_method == "block":
        add("recomputed_blocks", "Min(N_r * VPP, blocks)", "count", "memory",
            "block method: the first N_r blocks of each chunk are recomputed")
        add("act_stored_layers", f"(blocks - recomputed_blocks) * {avg}"
            " + recomputed_blocks * layer_input_bytes", "bytes", "memory",
            "per microbatch: other blocks keep everything (average block)")
        add("recompute_working_bytes", f"Min(recomputed_blocks, 1) * {avg}", "bytes", "memory",
            "one block re-materialised during its backward")
        return
    add("act_stored_layers", "ceiling(blocks / N_r) * layer_input_bytes", "bytes", "memory",
        "uniform method: one input per group of N_r blocks")
    add("recompute_working_bytes", f"Min(N_r, blocks) * {avg}", "bytes", "memory",
        "one group of N_r blocks re-materialised during backward (average block)")

"""Page 4, memory per rank and stage: the parameter buffers of page 2, fp32 main grads, optimizer
states (sharded over dp_cp / expt_dp with the distributed optimizer or Megatron-FSDP, which also
shards grads and weights by its strategy), the whole weights GTP/EGTP and Megatron-FSDP gather for
the block in use and the next, MoE-aware activations of the chunks live at the pipeline schedule's
peak, recompute, and communication buffers.

What is counted: every parameter and persistent buffer the model holds (under FP8 also
Transformer Engine's cached FP8 weights, or the FP8 parameters of fp8_param_gather), main grads,
optimizer states, stored activations and the transient dispatch/pipeline buffers of one layer. Weight and
grad buffers are padded as the distributed optimizer pads them (one buffer per kind and stage, its
end at a multiple of lcm(shards, 128) elements), so every shard and byte count is whole. What is
not here: the loss's logits, unfused attention's scores, GEMM workspaces and the device total
(reserved slack, CUDA context, NCCL buffers) are planner/budget/device_memory.py's; left out: the fp32
copy of probabilities in fused kernels, checkpoint I/O buffers, the
64-element alignment of each parameter in its buffer, and the extra padded buckets that
overlap_grad_reduce (first stage) or one buffer per VPP chunk add (under lcm(shards, 128) elements
each).
Activations follow a flash-attention model unless the attention backend is unfused (then the s²
scores are device_memory.py's) and count each stored tensor once; MLPs are SwiGLU (3 matrices)
or, with swiglu false, two matrices.
"""

from __future__ import annotations

from planner.budget.device_memory import (
    logits_stored,
    write_allocator_extras,
    write_attention_scores,
    write_device_total,
)
from planner.budget.expr import Book
from planner.budget.layer_kinds import kinds_of
from planner.budget.offload import write_offload, write_offload_peak
from planner.budget.variant import Variant, routed_width

PAGE = "memory"

OPTIMIZER_BYTES = {"adam": ("8", "Adam m and v in fp32"), "sgd": ("4", "fp32 momentum"),
                   "muon": ("4", "fp32 momentum (Muon)")}


# Transient dispatcher buffers of one MoE layer per flex backend (Megatron-LM dev@d48bd6be
# megatron/core/transformer/moe/token_dispatcher.py): DeepEP receives one row per token and rank,
# permutes it locally and un-permutes the expert outputs back to those rows before combine;
# HybridEP returns the permuted (padded) expert rows directly and combines from the expert outputs;
# NCCL EP (picked by `Variant.ncclep`) fills a static [ncclep_recv_rows, h] receive buffer and
# re-expands the expert outputs to it before combine (zero-copy is off in dev: _NCCLEPManager
# bootstraps with zero_copy=False and refuses moe_ncclep_use_symm_mem, so FC2 outputs are not
# written into the communication buffer as the DeepSeek-V4 Megatron write-up describes).
FLEX_BUFFERS = {
    "deepep": "2 * flex_dedup_send_bytes",
    # DeepEP v2 (dev only): the ElasticBuffer dispatch receives one row per token and rank and
    # combine sends the per-rank sums back, like DeepEP (_DeepepV2Manager.dispatch / combine)
    "deepepv2": "2 * flex_dedup_send_bytes",
    "hybridep": "(expert_gemm_rows + tokens_per_rank) * h * p",
}


def _act_parts(v: Variant) -> dict[str, tuple[str, str]]:
    """Stored activation widths; selective recompute drops the tensors it recomputes."""
    mods = v.recompute_modules
    norm = "h" if "layernorm" in mods else "2 * h"
    up = "mla_up_proj" in mods
    # Fewer query groups than TP: each rank takes its one group's key and value out of the
    # all-gathered QKV output (Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py
    # SelfAttention.get_query_key_value_tensors), so core attention keeps a whole group per rank,
    # TP·d per token of the rank's share, not groups·d.
    kv = "Max(groups, TP)" if v.qkv_gather else "groups"
    attention = {
        "standard": f"({norm} + 2 * heads * d + 2 * {kv} * d) * p + heads * 4",
        "mla": f"({norm} + " + ("2 * q_lora + 2 * (kv_lora + qk_rope)" if v.mla_norms
                                 else "q_lora + kv_lora + qk_rope")
               + ("" if up else " + 2 * heads * (d_qk + qk_rope) + heads * d_v") + " + heads * d_v) * p"
               " + heads * 4",
        "dsv4_hybrid": f"({norm} + 2 * q_lora" + ("" if up else " + heads * d")
                       + " + 2 * d + heads * d + o_groups * o_lora) * p + heads * 4",
    }[v.attention]
    if v.attention == "mla" and v.has("dsa"):
        attention = _absorbed_mla(v, norm, up)
    # FC1's output (2x wide under SwiGLU) and the activation's output; moe_act recompute drops the
    # latter (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/experts.py TEGroupedMLP).
    fc1, kept = ("2", "3") if v.swiglu else ("", "2")
    act = (f"{fc1} * I / ETP" if fc1 else "I / ETP") if "moe_act" in mods else f"{kept} * I / ETP"
    shared = "0" if "shared_experts" in mods else (
        (f"{fc1} * I_s" if fc1 else "I_s") if "moe_act" in mods else f"{kept} * I_s")
    w = routed_width(v)
    rows = "gemm_rows_padded" if v.quant_pad else "expert_gemm_rows"
    parts = {
        "act_attention_per_block": (f"tokens_per_rank * ({attention})",
                                    "absorbed MLA (DSA): norm in/out, q/kv latents, the absorbed "
                                    "query's non-rotary copy, core output (the DSA core's tensors "
                                    "are act_dsa_core_per_layer)" if v.attention == "mla"
                                    and v.has("dsa") else
                                    "norm in/out, q, k, v, core output, softmax statistics (fp32)"),
        # Megatron-LM dev@d48bd6be megatron/core/transformer/moe/router.py TopKRouter.gating:
        # logits in moe_router_dtype (fp64 doubles them; unset keeps the input dtype, counted
        # here as fp32, as the fp32 scores of the routing functions are)
        "act_router_per_layer": ("tokens_per_rank * E * (8 + 8 + 1)" if v.router_fp64 else
                                 "tokens_per_rank * E * (4 + 4 + 1)",
                                 f"router logits and probs in {'fp64' if v.router_fp64 else 'fp32'}, "
                                 "bool routing map"),
        "act_shared_per_layer": (f"tokens_per_rank * {shared} * p",
                                 "shared-expert FC1 output and activation"),
        "act_routed_per_layer": (f"{rows} * ({w} + {act} + 1) * p + assignments_per_rank * 8",
                                 "MoE-aware: expert inputs are the GEMM rows (n·k·ETP), not n; "
                                 "FC1 in/out, FC2 in, probs, int64 permutation map"),
        "act_dense_mlp_per_layer": ("tokens_per_rank * 2 * h * p" if "mlp" in mods else
                                    f"tokens_per_rank * ({norm} + {kept} * f) * p",
                                    f"dense {'SwiGLU' if v.swiglu else 'non-gated'} MLP block"),
    }
    if v.qk_norm:
        # Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py
        # SelfAttention.get_query_key_value_tensors: q_layernorm / k_layernorm keep their inputs.
        parts["act_qk_norm_per_block"] = (f"tokens_per_rank * (heads + {kv}) * d * p",
                                          "qk_layernorm: the q and k the norms keep for backward")
    if v.dropout:
        # Megatron-LM dev@d48bd6be megatron/core/fusions/fused_bias_dropout.py
        # _bias_dropout_add_func: torch dropout keeps a bool mask (1 byte per element) for
        # backward, once after attention and once after the MLP. Attention dropout runs inside the
        # flash kernel, which regenerates its mask from the RNG state and stores none.
        parts["act_dropout_per_block"] = ("tokens_per_rank * 2 * h",
                                          "hidden_dropout: the bool masks of both bias-dropout-adds")
    if v.latent:
        # Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_layer.py MoELayer.postprocess:
        # fc2_latent_proj keeps its input (the combined latent rows) for its weight gradient;
        # fc1_latent_proj's input is the pre-MLP norm output, already stored for the router.
        parts["act_latent_per_layer"] = ("tokens_per_rank * h_moe * p",
                                         "latent MoE: the combined latent rows fc2_latent_proj keeps")
    return parts


def _absorbed_mla(v: Variant, norm: str, up: bool) -> str:
    """DSA's attention block is MLA with matrix absorption (Megatron-LM dev@d48bd6be
    megatron/core/models/gpt/experimental_attention_variant_module_specs.py
    get_dsa_module_spec_for_backend: AbsorbedMLASelfAttention, its input norm unfused). Per token
    it keeps the norm's input and output, the q norm's input and the q up-projection's input, the
    kv norm's input (a view of the down-projection's [kv_lora + qk_rope] output, as the MLA
    record counts it), the einsum's copy of the non-rotary query heads [heads·d_qk] that absorbs
    the K up-projection, and linear_proj's input [heads·d_v]; no per-head K or V exists and the
    core's statistics are the DSA kind's (planner/budget/layer_kinds.py). mla_up_proj recompute
    (experimental_attention_variant/absorbed_mla.py get_query_key_value_tensors,
    CheckpointWithoutOutput) drops the query copy and keeps the checkpoint's inputs instead: the
    latent key and its rotary part, gathered over TP-SP."""
    latent = "2 * q_lora + kv_lora + qk_rope" if v.mla_norms else "q_lora"
    stored = "TP_seq * (kv_lora + qk_rope)" if up else "heads * d_qk"
    return f"({norm} + {latent} + {stored} + heads * d_v) * p"


# DualPipe (an estimate only: Megatron-LM has none, rule V4030) holds two pipeline stages'
# parameters per rank and PP + 1 microbatches of a stage's activations at its peak (DeepSeek-V3
# technical report, arXiv 2412.19437, Table 2: parameters 2x, activations PP + 1 against 1F1B's
# PP); the grads and optimizer states of both stages' parameters come with them.
DUALPIPE_COPIES = "2"
DUALPIPE_ACTIVATIONS = "(PP + 1) * act_per_microbatch"


def write(book: Book, v: Variant) -> None:
    add = book.add
    weights, grads = _weight_and_grad_terms(book, v)
    if v.dualpipe:
        weights, grads = f"{DUALPIPE_COPIES} * ({weights})", f"{DUALPIPE_COPIES} * ({grads})"
    add("weight_bytes", weights, "bytes", "memory",
        "parameter buffers in training precision (padded like the grad buffers; sharded by "
        "Megatron-FSDP optim_grads_params), plus gathered weights in use"
        + ("; DualPipe: two stages' worth per rank" if v.dualpipe else ""))
    add("grad_bytes", grads, "bytes", "memory",
        "main-grad buffers (padded; sharded only by Megatron-FSDP optim_grads / "
        "optim_grads_params), plus whole wgrads awaiting their reduce-scatter")
    opt, opt_doc = OPTIMIZER_BYTES[v.optimizer]
    if v.master_copy:
        opt, opt_doc = f"4 + {opt}", f"fp32 master weights + {opt_doc}"
    if v.precision_aware:
        opt, opt_doc = _precision_aware(v)
    add("optimizer_bytes_per_param", opt, "bytes", "memory", opt_doc)
    states = "optimizer_bytes_per_param * (dense_shard_params + expert_shard_params)"
    if v.dualpipe:
        states = f"{DUALPIPE_COPIES} * {states}"
    add("optimizer_bytes", f"opt_gpu_share * {states}" if v.optimizer_offload else states,
        "bytes", "memory",
        "optimizer states, sharded over dp_cp / expt_dp with the distributed optimizer"
        + ("; optimizer_cpu_offload keeps optimizer_offload_fraction of them on the CPU (Megatron-LM "
           "dev@d48bd6be megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py "
           "HybridDeviceOptimizer)" if v.optimizer_offload else ""))
    glob = " + moe_layers * (E + 1) * 4" if v.global_aux else ""
    add("buffer_bytes", f"bias_routers * E * (4 + 8) + L_hash * V_pad * k * 4{glob}", "bytes", "memory",
        "expert bias (fp32) and token counts (int64); hash tables tid2eid [V_pad, k] int32"
        + ("; global aux loss: fp32 token counts [E] and step count kept across microbatches"
           if v.global_aux else ""))
    for name, (formula, doc) in _act_parts(v).items():
        add(name, formula, "bytes", "memory", f"per microbatch: {doc}")
    moe = ("tokens_per_rank * 2 * h * p" if "moe" in v.recompute_modules else
           f"tokens_per_rank * {'h' if 'layernorm' in v.recompute_modules else '2 * h'} * p"
           " + act_router_per_layer + act_shared_per_layer + act_routed_per_layer"
           + (" + act_latent_per_layer" if v.latent else ""))
    add("act_moe_per_layer", moe, "bytes", "memory", "per microbatch: one MoE layer")
    per_block = "act_attention_per_block"
    write_attention_scores(book, v)
    for extra in ("act_qk_norm_per_block", "act_dropout_per_block", "act_attn_scores_per_block"):
        if extra in book.levels:
            per_block += f" + {extra}"
    if v.mhc:
        add("act_mhc_per_block", "2 * tokens_per_rank * n_hc * h * p", "bytes", "memory",
            "per microbatch: the widened residual stream entering both sub-layers")
        per_block += " + act_mhc_per_block"
    layers = f"blocks * ({per_block}) + moe_layers * act_moe_per_layer" \
             " + L_dense * act_dense_mlp_per_layer"
    layers += "".join(kind.activations(book, v, per_block) for kind in kinds_of(v))
    if v.mixer_only and v.dropout:  # a mixer-only block keeps one dropout mask, not two
        layers += " - L_nomlp * tokens_per_rank * h"
    add("act_layers_per_microbatch", layers, "bytes", "memory",
        "all blocks of the stage for one microbatch, nothing recomputed")
    add("layer_input_bytes", "tokens_per_rank * n_hc * h * p", "bytes", "memory",
        "a block's input, what full recompute keeps")
    _add_recompute(book, v)
    add("act_embedding", "has_embedding * tokens_per_rank * (h * p + 8)", "bytes", "memory",
        "per microbatch: embedding output and token ids")
    add("act_output", f"(has_output + L_mtp) * tokens_per_rank * (h * p + {logits_stored(v)})",
        "bytes", "memory",
        "per microbatch: output-layer input and the logits the cross entropy keeps (main head and "
        "each MTP head); the logits cover the whole sequence (gathered from the TP_seq shards) and "
        "V_pad / TP of the vocabulary")
    add("act_per_microbatch", "act_stored_layers + act_embedding + act_output", "bytes", "memory",
        "stored activations of one microbatch on this stage")
    add("in_flight_microbatches", "PP + 1" if v.dualpipe else "live_passes / VPP", "count", "memory",
        "chunk passes held at the activation peak, in microbatch equivalents (1F1B: min(m, PP - s);"
        " interleaved: warm-up passes + 1" + ("; DualPipe: PP + 1, DeepSeek-V3 report Table 2)"
                                             if v.dualpipe else ")"))
    offloading = "act_offloaded_per_microbatch" in book.levels
    live = DUALPIPE_ACTIVATIONS if v.dualpipe else "act_live_peak"
    add("activation_bytes", f"{live} + recompute_working_bytes"
        + (f" + {write_offload_peak(book)}" if offloading else ""), "bytes", "memory",
        "peak stored activations: the live chunks at the schedule's peak"
        + (" (DualPipe: PP + 1 microbatches of the stage, an estimate Megatron cannot run)"
           if v.dualpipe else "") + ", plus recompute's block"
        + ("; with activation offloading, plus the offloaded bytes kept on the GPU" if offloading else ""))
    w = routed_width(v)
    rows = "gemm_rows_padded" if v.quant_pad else "expert_gemm_rows"
    buffers = {"alltoall": "2 * dispatch_send_bytes",
               "allgather": f"allgather_dispatch_rows * (2 * {w} * p + E * p + E)",
               "flex": f"2 * ncclep_recv_rows * {w} * p" if v.ncclep else
               FLEX_BUFFERS.get(v.flex_backend, FLEX_BUFFERS["deepep"])
               .replace("expert_gemm_rows", rows).replace(" h ", f" {w} "),
               }[v.dispatcher]
    if v.ncclep_zero_copy:
        buffers = zero_copy_buffers(v)
    if v.pp:
        buffers += " + 2 * pp_activation_bytes"
    add("comm_buffer_bytes", buffers, "bytes", "memory",
        "transient buffers of one layer: permuted send + combine output (AllGather: gathered "
        "hidden, probs, map and the full output; DeepEP: the de-duplicated received rows and the "
        "per-rank sums combine sends back; HybridEP: the expert outputs and the combined tokens; "
        "NCCL EP: its receive and combine buffers of ncclep_recv_rows each), pipeline send/recv"
        + ("; NCCL EP keeps both: Megatron dev bootstraps it with zero_copy=False and refuses "
           "moe_ncclep_use_symm_mem, so FC2 outputs are not written straight into the "
           "communication buffer as the DeepSeek-V4 Megatron write-up describes"
           if v.ncclep and not v.ncclep_zero_copy else "")
        + ("; NCCL EP zero-copy (main's moe_ncclep_zero_copy): two persistent bf16 symmetric "
           "buffers of ncclep_recv_rows that FC2 writes into" if v.ncclep_zero_copy else ""))
    peak = ("weight_bytes + grad_bytes + optimizer_bytes + buffer_bytes + activation_bytes"
            " + comm_buffer_bytes + " + write_allocator_extras(book, v))
    if v.virtual_experts:
        mats = v.mlp_matrices
        add("vex_slot_bytes", "ceiling(in_flight_microbatches * moe_layers * vex_slots"
            f" * vex_expert_weight_bytes) + vex_slots * {mats} * h * I * bytes_grad", "bytes", "memory",
            "virtual experts: replica weights in the temporary slots of every MoE layer, kept for "
            "the backward of each microbatch in flight, and one replica's fp32 gradient before it "
            "returns (predicted only; Megatron-LM PR #7450, not in dev)")
        peak += " + vex_slot_bytes"
    add("peak_memory_bytes", peak, "bytes", "memory",
        "estimated peak per rank: what Megatron's log prints as max allocated")
    _add_hot_rank_memory(book, v)
    add("gpu_memory_bytes", "mem_gib * 1073741824", "bytes", "memory", "cluster.gpu_memory_gib")
    add("memory_utilization", "peak_memory_bytes / gpu_memory_bytes", "share", "memory",
        "allocated peak over GPU memory (the verdicts judge device_memory_utilization)")
    write_device_total(book, v)


def _precision_aware(v: Variant) -> tuple[str, str]:
    """Bytes per parameter of the precision-aware optimizer's states (symbols.precision_aware_bytes
    picks them from the dtypes): master weights (none for fp32 parameters; a bf16 parameter's fp32
    master kept as its 16-bit remainder), exp_avg and exp_avg_sq."""
    master, avg, avg_sq = v.precision_aware
    parts = [part for part in (master, avg, avg_sq) if part != "0"]
    doc = (f"precision-aware optimizer: master weights {master} B, exp_avg {avg} B, "
           f"exp_avg_sq {avg_sq} B per parameter")
    return " + ".join(parts), doc


def _weight_and_grad_terms(book: Book, v: Variant) -> tuple[str, str]:
    """Persistent weight and grad buffers, and the transient whole copies that Megatron-FSDP
    (optim_grads_params) and GTP/EGTP keep while a block runs.

    Megatron-FSDP shards the model weights (optim_grads_params) and the grads (optim_grads and
    optim_grads_params) over dp_cp / expt_dp (Megatron-LM dev@d48bd6be megatron/core/distributed/
    fsdp/src/megatron_fsdp/param_and_grad_buffer.py ParamAndGradBuffer.
    _init_each_parameter_group_buffers); the optimizer's shards are the distributed optimizer's.
    Both gather one unit ahead of its use: the unit in use and one prefetched unit are whole at
    once (GTP's one-block-ahead prefetch chain, Megatron-LM main@d98e8a64 megatron/core/
    tensor_parallel/generalized_tensor_parallelism.py; FSDP's all-gather prefetch), and one
    unit's whole wgrad waits for its reduce-scatter. A unit is the average block of the stage.
    """
    add = book.add
    full = "(dense_buffer_params + expert_buffer_params)"
    # frozen parameters sit outside the DDP buffers, as plain tensors (training_modes.py)
    held = "(frozen_params_on_rank + dense_buffer_params + expert_buffer_params)" \
        if v.freeze or v.lora or v.tower else full
    shard = "(dense_shard_params + expert_shard_params)"
    weights = f"{shard if v.fsdp == 'optim_grads_params' else held} * p"
    grads = f"{shard if v.fsdp in ('optim_grads', 'optim_grads_params') else full} * bytes_grad"
    if v.fp8_weights and not v.fsdp:
        weights = f"({held} - fp8_params_on_rank) * p + fp8_weight_bytes"
        _add_fp8_weights(book, v)
    unit = []
    if v.gtp:
        unit.append("GTP * ceiling(dense_sliced_params / Max(blocks, 1))")
    if v.egtp:
        unit.append("EGTP * routed_params_per_layer * Min(moe_layers, 1)")
    if unit:
        add("gtp_unit_params", " + ".join(unit), "params", "memory",
            "whole (rematerialised) weights of one block: the average dense GTP block plus one "
            "MoE layer's EGTP experts")
        add("gtp_materialised_bytes", "2 * gtp_unit_params * p", "bytes", "memory",
            "GTP/EGTP weights whole at once: the block in use and the next block's prefetch "
            "(exact for the grouped experts' one-block-ahead chain; an upper bound for dense "
            "weights, which prefetch one weight ahead)")
        add("gtp_wgrad_bytes", "gtp_unit_params * p", "bytes", "memory",
            "one block's whole wgrad before its GTP/EGTP reduce-scatter")
        weights += " + gtp_materialised_bytes"
        grads += " + gtp_wgrad_bytes"
    if v.fsdp == "optim_grads_params":
        add("fsdp_unit_params", "ceiling(params_on_rank / Max(blocks, 1))", "params", "memory",
            "parameters of one average block on the stage (a Megatron-FSDP unit)")
        add("fsdp_gathered_bytes", "2 * fsdp_unit_params * p", "bytes", "memory",
            "Megatron-FSDP units whole at once: the block in use and one prefetched")
        weights += " + fsdp_gathered_bytes"
    if v.fsdp in ("optim_grads", "optim_grads_params"):
        add("fsdp_grad_unit_bytes", "ceiling(params_on_rank / Max(blocks, 1)) * bytes_grad",
            "bytes", "memory", "one block's whole grads before the Megatron-FSDP reduce-scatter")
        grads += " + fsdp_grad_unit_bytes"
    return weights, grads


# Bytes of Transformer Engine's quantised copy of one FP8 weight, both usages (rowwise for the
# forward GEMM, columnwise for the data gradient): tensor scaling on Hopper keeps the FP8 data and
# its transpose, on Blackwell one copy serves both; blockwise keeps rowwise and columnwise data
# (its fp32 scale per 128x128 block, 8 bytes per 16,384 weights, is left out); mxfp8 keeps
# rowwise and columnwise data and one E8M0 scale per 32 elements for each.
FP8_COPY_BYTES = {("tensor", True): ("2", "FP8 data and its transpose (Hopper)"),
                  ("tensor", False): ("1", "FP8 data, read in either layout (Blackwell)"),
                  ("blockwise", False): ("2", "rowwise and columnwise FP8 data"),
                  ("mxfp8", False): ("2 + 2 / 32", "rowwise and columnwise FP8 data with an "
                                     "E8M0 scale per 32 elements each")}


def _add_fp8_weights(book: Book, v: Variant) -> None:
    """FP8 weights as Transformer Engine and Megatron hold them.

    Without fp8_param_gather a weight stays a training-precision parameter and TE quantises it
    into a workspace it caches across microbatches (Megatron passes is_first_microbatch unless
    disable_parameter_transpose_cache: Megatron-LM dev@d48bd6be megatron/core/extensions/
    transformer_engine.py TELinear.forward; TE's TransformerEngineBaseModule.
    get_weight_workspace): the parameter and the copy both stay. With it the FP8 tensor is the
    parameter: its rowwise data is the uint8 DDP param buffer (mxfp8: the weights keep their own
    storage and gather through the grad buffer; param_and_grad_buffer.py
    _ParamAndGradBuffer.__init__), the other usage stays with TE, and no training-precision
    copy exists. The distributed optimizer's fp32 main params are unchanged. Megatron's own
    estimate (megatron/training/theoretical_memory_usage.py) counts no FP8 copies.
    """
    copy, doc = FP8_COPY_BYTES[(v.fp8_weights, v.fp8_transpose)]
    book.add("fp8_copy_bytes_per_param", copy, "bytes", "memory",
             f"TE's quantised weight ({v.fp8_weights} scaling): {doc}")
    if v.fp8_param_gather:
        book.add("fp8_weight_bytes", "fp8_params_on_rank * fp8_copy_bytes_per_param", "bytes",
                 "memory", "fp8_param_gather: the FP8 weights are the parameters (rowwise data "
                 "in the param buffer, the other usage with TE); no training-precision copy")
    else:
        book.add("fp8_weight_bytes", "fp8_params_on_rank * (p + fp8_copy_bytes_per_param)",
                 "bytes", "memory", "FP8 weights without fp8_param_gather: the training-precision "
                 "parameter and TE's cached quantised copy")


def _add_recompute(book: Book, v: Variant) -> None:
    add, avg = book.add, "act_layers_per_microbatch / Max(blocks, 1)"
    whole = "whole bytes, the average block rounded up"
    if v.recompute != "full" and v.offload:
        # the offload groups' tensors wait on the host, not the GPU
        offloaded = write_offload(book, v)
        add("act_stored_layers", f"act_layers_per_microbatch - {offloaded}", "bytes", "memory",
            "per microbatch: block activations kept on the GPU for backward (fine-grained "
            "activation offloading moves the offload groups' tensors to the host)")
        add("recompute_working_bytes", "0", "bytes", "memory", "no full recompute")
        return
    if v.recompute != "full":
        add("act_stored_layers", "act_layers_per_microbatch", "bytes", "memory",
            "per microbatch: block activations kept for backward")
        if "act_dsa_core_inputs_per_layer" in book.levels:
            # the checkpointed DSA core (selective core_attn) is re-run in its layer's backward
            add("recompute_working_bytes", "Min(blocks, 1) * act_dsa_core_per_layer", "bytes",
                "memory", "one DSA layer's sparse-attention core re-materialised during its "
                "backward (selective core_attn recompute)")
            return
        add("recompute_working_bytes", "0", "bytes", "memory", "no full recompute")
        return
    if v.recompute_method == "block" and v.hybrid_stack:
        # megatron/core/recompute.py checkpointed_forward, block method over a HybridStack: the
        # first N_r pattern symbols of each chunk keep their input, the others everything (MTP
        # depths are not recomputed under the block method)
        symbol = "act_layers_per_microbatch / Max(L_pattern, 1)"
        add("act_stored_layers", f"ceiling((L_pattern - symbols_recomputed) * {symbol})"
            " + symbols_recomputed * layer_input_bytes", "bytes", "memory",
            "per microbatch, block method over a hybrid stack: the first N_r pattern layers of "
            f"each chunk keep their input, the others everything (average pattern layer; {whole})")
        add("recompute_working_bytes", f"Min(symbols_recomputed, 1) * ceiling({symbol})", "bytes",
            "memory", f"one pattern layer re-materialised during its backward ({whole})")
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
    if v.hybrid_stack:
        # Megatron-LM dev@d48bd6be megatron/core/models/hybrid/hybrid_block.py HybridStack.forward
        # checkpoints through megatron/core/recompute.py checkpointed_forward over its own layers:
        # one per pattern symbol, so N_r counts symbols, not moeplan's blocks (Mamba stacks and
        # DeepSeek-V4). An MTP depth sits outside the stack: megatron/core/transformer/
        # multi_token_prediction.py MultiTokenPredictionLayer._checkpointed_forward checkpoints
        # it whole (N_r must be 1), one input per depth.
        layers = "L_pattern"
        add("act_stored_layers", "ceiling(L_pattern / N_r) * layer_input_bytes", "bytes", "memory",
            "uniform method, hybrid stack: one input per group of N_r pattern layers (a block is "
            "two: its mixer's or attention's layer and its MLP's or MoE's; an MTP depth one)")
        add("recompute_working_bytes", f"ceiling(Min(N_r, {layers}) * act_layers_per_microbatch"
            f" / Max({layers}, 1))", "bytes", "memory", "one group of N_r pattern layers "
            f"re-materialised during backward (average pattern layer; {whole})")
        return
    add("act_stored_layers", "ceiling(blocks / N_r) * layer_input_bytes", "bytes", "memory",
        "uniform method: one input per group of N_r blocks")
    add("recompute_working_bytes", f"ceiling(Min(N_r, blocks) * {avg})", "bytes", "memory",
        f"one group of N_r blocks re-materialised during backward (average block; {whole})")


# --- NCCL EP's zero-copy buffers (Megatron-LM main@d98e8a64
# megatron/core/transformer/moe/token_dispatcher.py _NCCLEPManager._ensure_bootstrap): two
# persistent symmetric-memory buffers [recv_capacity, hidden] in bf16 whatever the training dtype
# (the combine's FC2 output and the dispatch-backward grad), shared by every MoE layer; under
# fp8/fp4 also the received probs [recv_capacity] in fp32. FC2 writes straight into them, so no
# other receive or combine copy exists.
def zero_copy_buffers(v: Variant) -> str:
    w = routed_width(v)
    return f"2 * ncclep_recv_rows * {w} * 2" + (" + ncclep_recv_rows * 4" if v.quant_pad else "")


# --- the busiest rank's memory (its received rows at the stated quantile)


def _hot_moe_layers_stored(v: Variant) -> tuple[str, str]:
    """How many MoE layers hold their routed activations at the peak, and why."""
    if v.recompute == "full" and v.recompute_method != "block":
        return "Min(moe_layers, N_r)", "uniform full recompute: one group of N_r blocks re-run"
    if "moe" in v.recompute_modules:
        return "Min(moe_layers, 1)", "selective moe recompute: one MoE layer re-run at a time"
    return ("ceiling(in_flight_microbatches) * moe_layers",
            "every MoE layer of the microbatches in flight (an upper bound: the busiest rank may "
            "differ from layer to layer)")


def _add_hot_rank_memory(book: Book, v: Variant) -> None:
    """The busiest rank's peak: its routed activations (and HybridEP's expert-output buffer) at
    hot_gemm_rows instead of the expected expert_gemm_rows; the send side (n·k rows) is exact."""
    add = book.add
    rows = "gemm_rows_padded" if v.quant_pad else "expert_gemm_rows"
    add("act_routed_bytes_per_row", f"(act_routed_per_layer - assignments_per_rank * 8) / Max({rows}, 1)",
        "bytes", "memory", "stored routed-activation bytes per grouped-GEMM row (FC1 in/out, FC2 in, "
        "probs)")
    add("hot_act_extra_per_layer", f"ceiling(Max(hot_gemm_rows - {rows}, 0) * act_routed_bytes_per_row)",
        "bytes", "memory", "per microbatch: what one MoE layer's routed activations add on the "
        "busiest rank at the stated quantile")
    stored, why = _hot_moe_layers_stored(v)
    add("hot_moe_layers_stored", stored, "count", "memory",
        f"MoE layers whose routed activations are held at the peak: {why}")
    extra, what = "hot_moe_layers_stored * hot_act_extra_per_layer", "its stored routed activations"
    if v.dispatcher == "flex" and v.flex_backend == "hybridep":
        extra += f" + Max(hot_gemm_rows - {rows}, 0) * {routed_width(v)} * p"
        what += " and HybridEP's expert-output buffer"
    add("hot_rank_extra_bytes", extra, "bytes", "memory",
        f"what the busiest rank holds beyond the expected peak at the stated quantile: {what}")
    add("hot_rank_memory_peak_bytes", "peak_memory_bytes + hot_rank_extra_bytes", "bytes", "memory",
        "estimated peak of the busiest EP rank (hot_recv_rows_quantile received rows a layer)")

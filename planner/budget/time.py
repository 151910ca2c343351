"""Page 7, step time: what one rank of a stage spends per optimizer step, as named formulas.

The model is analytical and calibrated, not measured: GEMMs take their Megatron FLOPs (the flops
page; recompute's extra forwards included) at the catalog peak times a GEMM efficiency and the
GEMM's shape efficiency (m, n, k, tile quantisation); core
attention at the BF16 peak times an attention efficiency; every collective of the collectives table
takes its per-step wire bytes of this rank (the comm page), the intra-NVLink-domain part over
NVLink and the rest over the scale-out network, each at its bandwidth times a communication
efficiency, the slower of the two setting its time. A collective whose table entry names an
overlap flag that the config sets is hidden behind compute up to `eff_overlap` of itself (never
more than the compute there is); the rest is exposed. The optimizer step streams the rank's
weights, grads and optimizer state through HBM once, plus a fixed cost per step. Fixed host
costs (launches per block, per local expert, per microbatch and model chunk, less what CUDA graphs
capture) add to the compute: Megatron's dropless MoE layers wait on the host every layer. Each
collective call also pays a latency. The pipeline bubble and the stage's step need
the other stages' chunk times, so they are the pipeline page (planner/budget/pipeline.py),
evaluated after this page on every stage (and on the stages' first and last model chunks alone).

Work per rank: a microbatch of b·S tokens of one replica is spread over its TP·CP ranks (dense
layers by TP and CP, routed experts over the EP group, whose ranks each carry the same share of
assignments under balanced routing), so each rank computes the stage's FLOPs of b·S/(TP·CP)
tokens; `imbalance` scales the routed-expert share for the busiest rank.
"""

from __future__ import annotations

from planner.budget import fsdp_time, optimizer_time, tail_launches
from planner.budget.collectives import TABLE
from planner.budget.expr import Book, ident
from planner.budget.hardware import overlap_symbol
from planner.budget.layer_kinds import (
    CORE,
    KERNEL,
    WEIGHTS,
    attention_blocks,
    kind_sum,
    kinds_of,
    stage_sum,
)
from planner.budget.sparse_attention_time import (
    has_indexer,
    write_dsa_core_time,
    write_indexer_counts,
    write_indexer_time,
)
from planner.budget.variant import Variant

PAGE = "time"
GPU_WORK = ("time_gpu_s", "time_attention_gemm_s + time_attention_core_s + time_moe_gemm_s"
            " + time_dense_gemm_s + time_head_gemm_s + time_non_gemm_s + time_kernel_gpu_s", "s",
            "time", "the GPU's own work of the step: GEMMs, attention, memory-bound kernels and "
            "each kernel's fixed GPU-side cost")

# Selective recompute modules whose forward the backward re-runs, per layer kind they cover
# (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py recompute_modules).
SELECTIVE = {"core_attn": "attention_core", "moe": "moe", "mlp": "dense"}


def write(book: Book, v: Variant) -> None:
    add = book.add
    add("time_tokens_per_rank", "b * S / (TP * CP)", "tokens", "time",
        "tokens of one microbatch whose compute one rank carries (dense by TP·CP, experts "
        "balanced over the EP group)")
    add("time_gemm_rate",
        "(1 - fp8) * peak_bf16 * eff_gemm_bf16 + fp8 * peak_fp8 * eff_gemm_fp8 * eff_fp8_recipe",
        "FLOP/s", "time", "reached GEMM rate of the linear layers (FP8 peak under FP8, at the "
        "recipe's share)")
    add("time_bf16_rate", "peak_bf16 * eff_gemm_bf16", "FLOP/s", "time",
        "reached BF16 GEMM rate (the output layer stays BF16 under FP8)")
    add("time_attention_rate", "peak_bf16 * eff_attention * eff_attention_variant", "FLOP/s", "time",
        "reached rate of core (flash) attention: the standard kernel's share, times the "
        "config's variant's (MLA; DeepSeek-V4's sparse kernels)")
    if has_indexer(v):
        write_indexer_counts(book, v)
    _kinds(book, v)
    _shapes(book, v)
    _compute(book, v)
    if has_indexer(v):
        write_indexer_time(book, v)
    if v.has("dsa"):  # DSA's core is no flash kernel: planner/budget/sparse_attention_time.py
        write_dsa_core_time(book, v, attention_blocks(v))
    _launch_counts(book, v)
    _kernel_gpu(book, v)
    name, formula, *rest = GPU_WORK
    add(name, formula + (" + time_indexer_s" if has_indexer(v) else "")
        + (" + time_dsa_core_s" if v.has("dsa") else ""), *rest)
    _fixed_costs(book, v)
    add("time_compute_s", "stack_factor * (time_gpu_s + time_fixed_s)", "s", "time",
        "all compute of the step, with the host time the GPU waits for, times the stack's factor "
        "(efficiency.stack_factor: 1 unless `moeplan calibrate` fits a stack the terms do not "
        "explain)")
    exchanges: dict[str, list[str]] = {"fwd": [], "bwd": []}
    exposed = _communication(book, v, exchanges) + optimizer_time.write_offload(book, v)
    add("time_exposed_comm_s", " + ".join(exposed) or "0", "s", "time",
        "communication left on the critical path per step (every collective of the table"
        + (", and activation offloading's host-link copies" if v.offload else "") + ")")
    _host_behind_exchanges(book, exchanges)
    add("time_busy_s", "time_compute_s + time_exposed_comm_s - time_host_behind_exchanges_s",
        "s", "time", "compute and exposed communication of all microbatches of the step, less "
        "the host time the token exchanges hide")
    add("time_microbatch_s", "time_busy_s / microbatches", "s", "time",
        "one microbatch through every model chunk of the stage, forward and backward: the "
        "pipeline's unit of work (the pipeline page, planner/budget/pipeline.py, sums other "
        "stages' chunks of it into the bubble)")
    extra = "".join(f" + {term}" for term in optimizer_time.write(book, v, _dim_eff)
                    + fsdp_time.write_step(book, v))
    add("time_optimizer_s", "(weight_bytes + grad_bytes + 2 * optimizer_bytes) / (bw_hbm * eff_hbm)"
        " + t_step_fixed" + extra, "s", "time", "optimizer step: read grads and state, write state "
        "and weights once (HBM), plus the fixed cost of a step (optimizer launches, gradient-sync "
        "set-up, logging)" + (" and what planner/budget/optimizer_time.py prices (Muon's "
        "orthogonalisation, the weight-hash check)" if extra else ""))


def _kinds(book: Book, v: Variant) -> None:
    """Forward FLOPs per token by kind, and the extra forward FLOPs recompute runs again."""
    add = book.add
    fx = v.mlp_matrices
    kinds = kinds_of(v)
    for kind in kinds:  # the kinds' own kernels (V4's sparse and compressed ones, DSA's)
        kind.kernels(book)
    # The core attention as its kernels run it, against the flops page's count of it (window and
    # chunked layers count as full there, DSA as dense MLA; V4's CSA count adds its indexer's
    # scoring, which the time page prices apart): the projections are what remains.
    core, core_rc = stage_sum(v, KERNEL), stage_sum(v, KERNEL, "_recomputed")
    counted, counted_adds = kind_sum(v, CORE, "blocks", lambda kind: kind.count)
    counted_core_rc = stage_sum(v, CORE, "_recomputed")
    if counted == core:
        linear = " - ".join(["stage_attention_fwd_flops_per_token - time_attention_core_fwd_flops",
                             *counted_adds])
    else:  # a sum of kinds' rows (Mamba's beside softmax) is taken off whole
        taken = " + ".join([counted, *counted_adds])
        linear = f"stage_attention_fwd_flops_per_token - {f'({taken})' if ' + ' in taken else taken}"
    notes = list(dict.fromkeys(kind.kernel_note for kind in kinds if kind.kernel_note))
    add("time_attention_core_fwd_flops", core, "FLOP", "time",
        "core attention of the stage per token (V4: CSA's sparse, HCA's compressed and the window "
        "kernels; DSA: none, its dense core is time_dsa_core_s"
        + "".join(f"; {note}" for note in notes) + ")")
    add("time_attention_linear_fwd_flops", linear, "FLOP", "time",
        "attention projections of the stage per token")
    add("time_shared_fwd_flops", f"L_moe * 2 * {fx} * I_s * h", "FLOP", "time",
        "shared experts of the stage per token (their own GEMMs: every token, dense TP layout)")
    add("time_routed_fwd_flops", "stage_moe_fwd_flops_per_token - time_shared_fwd_flops", "FLOP",
        "time", "routed experts of the stage per token (k grouped-GEMM rows per token)")
    moe_rc = "L_moe_recomputed * flops_moe_mlp_fwd_per_token"
    extra = {"attention_core": core_rc, "moe": moe_rc,
             "dense": "L_dense_recomputed * flops_dense_mlp_fwd_per_token"}
    # selective core_attn re-runs attention's core only: a Mamba-2 layer checkpoints nothing
    # (Megatron-LM dev@d48bd6be megatron/core/ssm/mamba_mixer.py MambaMixer.forward)
    core_attn = ("time_attention_core_fwd_flops - L_mamba * flops_mamba_scan_fwd_per_token"
                 if v.has("mamba") else "time_attention_core_fwd_flops")
    whole = {"attention_core": core_attn,
             "moe": "stage_moe_fwd_flops_per_token", "dense": "stage_dense_fwd_flops_per_token"}
    selective = v.recompute_modules if v.recompute == "selective" else frozenset()
    for module, kind in SELECTIVE.items():
        if module in selective:
            extra[kind] = whole[kind]
    # Megatron-LM dev@d48bd6be megatron/core/transformer/multi_latent_attention.py
    # MLASelfAttention.get_query_key_value_tensors qkv_up_proj_and_rope_apply: mla_up_proj re-runs
    # the q and kv up projections (and RoPE) of every block.
    up = "0"
    if "mla_up_proj" in selective and v.attention == "mla":
        q_in = "q_lora" if v.mla_q_lora else "h"
        up = f"blocks * 2 * ({q_in} * heads * (d_qk + qk_rope) + kv_lora * heads * (d_qk + d_v))"
    add("time_recompute_mla_up_flops", up, "FLOP", "time",
        "MLA q and kv up projections selective recompute (mla_up_proj) runs again per token")
    add("time_recompute_attention_core_flops", extra["attention_core"], "FLOP", "time",
        "core attention forward recompute runs again per token")
    add("time_recompute_attention_linear_flops",
        f"stage_recompute_fwd_flops_per_token - {moe_rc}"
        f" - L_dense_recomputed * flops_dense_mlp_fwd_per_token - ({counted_core_rc})"
        " + time_recompute_mla_up_flops", "FLOP", "time",
        "attention projections recompute runs again per token (full, or MLA up projections)")
    # Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_layer.py MoELayer: with
    # "shared_experts" the shared expert's forward is checkpointed and re-run in backward.
    shared_rc = ("time_shared_fwd_flops" if "shared_experts" in selective and "moe" not in selective
                 else "0")
    add("time_recompute_moe_flops", extra["moe"], "FLOP", "time",
        "MoE MLP forward recompute runs again per token")
    add("time_recompute_routed_flops",
        "time_recompute_moe_flops * time_routed_fwd_flops / Max(stage_moe_fwd_flops_per_token, 1)",
        "FLOP", "time", "the routed experts' share of it")
    add("time_recompute_shared_flops", f"time_recompute_moe_flops - time_recompute_routed_flops"
        f" + {shared_rc}", "FLOP", "time",
        "the shared experts' share, or all of them again with selective shared_experts")
    add("time_recompute_dense_flops", extra["dense"], "FLOP", "time",
        "dense MLP forward recompute runs again per token")
    _weights(book, v)
    _elementwise(book, v, selective)


def _weights(book: Book, v: Variant) -> None:
    """The rank's local weights per kind (params page), what a GEMM pass must stream from HBM."""
    add = book.add
    add("time_attention_params", stage_sum(v, WEIGHTS), "params", "time",
        "attention projection weights of the stage on this rank")
    add("time_routed_params", "moe_layers * routed_params_per_layer", "params", "time",
        "routed expert weights of the stage on this rank (E/EP local experts per layer)")
    add("time_shared_params", "moe_layers * shared_params_per_layer", "params", "time",
        "shared expert weights of the stage on this rank")
    add("time_dense_params", "L_dense * dense_mlp_params_per_layer", "params", "time",
        "dense MLP weights of the stage on this rank")
    add("time_head_params", "(has_output + L_mtp) * embedding_params", "params", "time",
        "output-layer weight shard the stage's logits (model and MTP) read")
    add("time_weight_read_bytes", "(1 - fp8) * p + fp8", "bytes", "time",
        "bytes per weight a forward or data-gradient GEMM reads (the FP8 copy under FP8)")
    if v.wgrad_unfused:
        # Megatron-LM dev@d48bd6be megatron/core/distributed/distributed_data_parallel.py
        # _make_backward_post_hook: without the fusion the GEMM writes param.grad in the
        # parameters' dtype and the hook runs param.main_grad.add_(param.grad.data), its own
        # memory-bound kernel after the GEMM (read the grad and the main grad, write the main grad).
        add("time_wgrad_rw_bytes", "p", "bytes", "time",
            "bytes per weight a weight-gradient GEMM moves without gradient accumulation fusion: "
            "it writes a fresh gradient in the parameters' dtype")
        add("time_grad_add_bytes", "p + 2 * bytes_grad", "bytes", "time",
            "bytes per weight the DDP hook's main_grad.add_(grad) moves per microbatch without "
            "gradient accumulation fusion: read the gradient and the main grad, write the main "
            "grad (distributed_data_parallel.py _make_backward_post_hook)")
    else:
        add("time_wgrad_rw_bytes", "2 * bytes_grad", "bytes", "time",
            "bytes per weight a weight-gradient GEMM moves: gradient accumulation fusion reads "
            "and writes the main grad once (Megatron-LM dev@d48bd6be megatron/training/"
            "arguments.py --no-gradient-accumulation-fusion: on by default)")
    add("time_hbm_rate", "bw_hbm * eff_hbm", "B/s", "time", "reached HBM bandwidth")


def _elementwise(book: Book, v: Variant, selective: frozenset[str]) -> None:
    """Memory-bound work outside the GEMMs, as elements per token moved through HBM (forward)."""
    add = book.add
    attention = {"standard": "(heads + 2 * groups) * d",
                 "mla": "heads * (2 * d_qk + 2 * qk_rope + d_v)",
                 "dsv4_hybrid": "heads * d + 2 * d"}[v.attention]
    # post-sublayer norms and an MoE layer's branch norms (layer_kinds.py POST_NORMS, MOE_BRANCH):
    # each reads and writes h
    extra_norms = (" + blocks * 4 * h" if "post_norms" in v.kinds else "") + (
        " + L_moe * 6 * h" if "moe_branch" in v.kinds else "")
    add("time_ew_norm_elements", "blocks * (10 * h" + (" + 4 * n_hc * h" if v.mhc else "") + ")"
        + extra_norms,
        "elements", "time", "norms and residual adds per token: two norms (read and write h) "
        "and two residual adds (read 2h, write h) per block" + (", mHC mixing" if v.mhc else ""))
    # window layers with their own query heads (planner/budget/layer_kinds.py WINDOW_HEADS)
    window = " + L_window * 2 * (heads_w - heads) * d" if "window_heads" in v.kinds else ""
    # value heads of their own width, window layers' own KV groups (layer_kinds.py VALUE_DIM,
    # WINDOW_KV): V is d_v wide, the window layers read and write their own K and V
    own = (" + blocks * 2 * groups * (d_v - d)" if "value_dim" in v.kinds else "") + (
        " + L_window * 2 * (heads * (d_w - d) + groups_w * (d_w + dv_w) - groups * (d + d_v))"
        if "window_kv" in v.kinds else "")
    # q and k norms (qk_layernorm): each reads and writes its heads once more; the QKV all-gather
    # below the query groups concatenates every rank's slice into the full width for all S rows
    # of the rank, TP times its own share (QK_NORM_LAUNCHES, QKV_GATHER_LAUNCHES)
    qk_norm = " + blocks * 2 * (heads + groups) * d" if v.qk_norm else ""
    gather = " + blocks * 2 * TP * (heads + 2 * groups) * d" if v.qkv_gather else ""
    add("time_ew_attention_elements", f"blocks * 2 * {attention}{window}{own}{qk_norm}{gather}",
        "elements", "time",
        "query, key and value heads read and written once outside the GEMMs (RoPE, concatenation)"
        + (", the q and k norms" if qk_norm else "")
        + (", the gathered QKV's concatenation over TP" if gather else ""))
    rope = ""
    if v.rope_unfused:
        # MLA rotates only its positional parts: q's qk_rope per head and the one shared k_pos_emb
        # (Megatron-LM dev@d48bd6be megatron/core/transformer/multi_latent_attention.py
        # MLASelfAttention.get_query_key_value_tensors, apply_rotary_pos_emb on q_pos_emb, k_pos_emb)
        rotated = "(heads + 1) * qk_rope" if v.attention == "mla" else "(heads + groups) * d"
        add("time_ew_rope_unfused_elements", f"blocks * 10 * {rotated}"
            + (" + L_window * 10 * (heads_w - heads) * d" if "window_heads" in v.kinds else "")
            + (" + L_window * 10 * (heads * (d_w - d) + groups_w * d_w - groups * d)"
               if "window_kv" in v.kinds else ""), "elements", "time", ROPE_UNFUSED_DOC)
        rope = " + time_ew_rope_unfused_elements"
    add("time_ew_router_elements", "L_moe * (h + 4 * E)", "elements", "time",
        "router per token: read h for the gate, the E logits through softmax/sigmoid and top-k")
    act = f"{'3' if v.swiglu else '2'}"
    add("time_ew_act_elements", f"L_moe * {act} * (imbalance * k * I + I_s)", "elements", "time",
        "expert activation functions: read FC1's output, write FC2's input, for the k routed "
        "copies (the busiest rank's: times routing_imbalance) and the shared expert")
    add("time_ew_dense_act_elements", f"L_dense * {act} * f", "elements", "time",
        "dense MLP activation functions")
    clamp = ""
    if v.moe_act_clamp:
        add("time_ew_act_clamp_elements", "L_moe * 8 * imbalance * k * I", "elements", "time",
            ACT_CLAMP_DOC)
        clamp = " + time_ew_act_clamp_elements"
    # Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py: the alltoall
    # dispatcher permutes the k copies before the exchange and sorts them by local expert after
    # it when a rank holds more than one (and the reverse in combine); DeepEP receives each
    # token once per rank and permutes once
    # (_DeepepManager.get_permuted_hidden_states_by_experts); HybridEP's dispatch kernel writes
    # the rows in expert order itself (_HybridEPManager.get_permuted_hidden_states_by_experts
    # returns the dispatch output as is), and so does NCCL EP's (Transformer Engine's ep_dispatch
    # permutes to expert-major order inside the exchange; _NCCLEPManager.
    # get_permuted_hidden_states_by_experts only narrows the receive buffer to its valid rows), so
    # no separate permutation reads them again.
    copies = "1"
    if v.ep and v.dispatcher == "alltoall":
        copies = "1 + Min(experts_per_rank - 1, 1)"
    elif v.ep and v.flex_backend in ("hybridep", "ncclep"):
        copies = "0"
    add("time_permute_copies", copies, "count", "time",
        "permutations of the k routed copies per direction (dispatch and combine)")
    add("time_ew_permute_elements", "L_moe * 2 * time_permute_copies * 2 * imbalance * k * h_moe"
        " * (permute_fused + (1 - permute_fused) * eff_permute_unfused)", "elements", "time",
        "permute and unpermute: each permutation reads and writes k rows of the token (the "
        "busiest rank's: times routing_imbalance), in dispatch and in combine; unfused permutes "
        "(moe_permute_fusion off) cost more passes")
    # Transformer Engine fuses the FP8 cast of a norm's output into the norm (LayerNormLinear:
    # QKV / MLA down and up projections, dense fc1), so only the other FP8 GEMM inputs are cast
    # by a kernel of their own: attention's output projection, the routed experts' fc1 (permuted
    # rows) and fc2 (activation output), the shared expert and the dense fc2.
    output_proj = {"standard": "heads * d", "mla": "heads * d_v", "dsv4_hybrid": "heads * d"}
    add("time_ew_fp8_cast_moe_elements", "fp8 * 2 * L_moe * (k * (h_moe + I) + I_s + h * Min(I_s, 1))",
        "elements", "time", "the MoE layers' share of the FP8 casts below (the routed experts' fc1 "
        "and fc2 inputs, the shared expert's): kernels of the MoE layer, which its time counts")
    add("time_ew_fp8_cast_elements", f"fp8 * 2 * (blocks * {output_proj[v.attention]}"
        + window.replace(" * 2 * ", " * ")
        + (" + blocks * heads * (d_v - d)" if "value_dim" in v.kinds else "")
        + (" + L_window * heads * (dv_w - d_v)" if "window_kv" in v.kinds else "")
        + " + L_dense * f) + time_ew_fp8_cast_moe_elements", "elements", "time",
        "FP8 casts of the FP8 GEMM inputs no norm produces, per token (read BF16, write the FP8 "
        "copy and its transpose: two BF16 elements' worth); casts of norm outputs are fused into "
        "the norm; the backward's gradient casts are in non_gemm_passes; 0 in BF16")
    bias = ""
    if v.bias:
        # Megatron-LM dev@d48bd6be megatron/core/transformer/moe/experts.py TEGroupedMLP: fc2 is
        # built with skip_bias_add=True and its bias is added by TEGroupedMLP._apply_bias, scaled
        # by each row's routing probability, outside the GEMM: per local expert `t + b * p`
        # (write b·p, read it and t, write the sum), then torch.cat of the experts' pieces (read
        # and write once more), six h-wide passes over every routed row.
        add("time_ew_expert_bias_elements", "L_moe * 6 * imbalance * k * h_moe", "elements",
            "time", "routed experts' fc2 bias, added unfused and scaled by the routing "
            "probability per local expert (TEGroupedMLP._apply_bias): b·p written, t and b·p "
            "read, the sum written, then concatenated (read and write), per routed row")
        bias = " + time_ew_expert_bias_elements"
    add("time_ew_fwd_elements", "time_ew_norm_elements + time_ew_attention_elements"
        " + time_ew_router_elements + time_ew_act_elements + time_ew_dense_act_elements"
        " + time_ew_permute_elements + time_ew_fp8_cast_elements" + bias + rope + clamp,
        "elements", "time", "elementwise elements of one forward of the stage per token")
    rc = []
    if "moe" in selective:
        rc.append("time_ew_router_elements + time_ew_act_elements + time_ew_permute_elements"
                  + bias + clamp)
    elif "moe_act" in selective:
        rc.append(f"L_moe * {act} * k * I" + clamp)
    if "mlp" in selective:
        rc.append("time_ew_dense_act_elements")
    if "layernorm" in selective:
        rc.append("blocks * 4 * h")
    if "mhc" in selective and v.mhc:
        rc.append("blocks * 4 * n_hc * h")
    full = "blocks_recomputed * time_ew_fwd_elements / Max(blocks, 1)"
    add("time_ew_recompute_elements", " + ".join([full, *rc]), "elements", "time",
        "elementwise work recompute runs again per token: recomputed blocks' forward"
        + (", and selective " + ", ".join(m for m in ("moe", "moe_act", "mlp", "layernorm", "mhc")
                                          if m in selective) if rc else ""))


def _gemm(book: Book, name: str, flops: str, rc_flops: str, params: str, rate: str,
          what: str, scale: str = "", grad_add: bool = False) -> None:
    """One kind's GEMM time per step: each pass at the slower of its FLOPs and its HBM bytes.

    Per microbatch the forward, the data gradient and recompute's forward read the kind's local
    weights; the weight gradient reads and writes its main grad (without gradient accumulation
    fusion, `grad_add`: writes a fresh gradient, then a kernel of its own adds it into the main
    grad). Recompute re-runs a share of the forward, priced at the forward's roofline in
    proportion to its FLOPs."""
    add, t = book.add, "time_tokens_per_rank"
    fwd = add(f"time_{name}_fwd_pass_s", f"Max({t} * {flops}{scale} / ({rate}),"
              f" {params} * time_weight_read_bytes / time_hbm_rate)", "s", "time",
              f"{what}: one forward (or data-gradient) pass of a microbatch, FLOPs or weight "
              "reads, whichever is slower")
    wgrad = add(f"time_{name}_wgrad_pass_s", f"Max({t} * {flops}{scale} / ({rate}),"
                f" {params} * time_wgrad_rw_bytes / time_hbm_rate)", "s", "time",
                f"{what}: one weight-gradient pass, FLOPs or main-grad read and write")
    add_grad = f" + {params} * time_grad_add_bytes / time_hbm_rate" if grad_add else ""
    add(f"time_{name}_s", f"microbatches * (2 * {fwd} + {wgrad}"
        f" + {fwd} * {rc_flops} / Max({flops}, 1){add_grad})", "s", "time",
        f"{what}: forward, data and weight gradients and recompute of every microbatch"
        + (", and the main-grad add of each weight gradient" if grad_add else ""))


# Unfused attention (attention_backend unfused or local, transformer_impl local): Megatron-LM
# dev@d48bd6be megatron/core/transformer/dot_product_attention.py DotProductAttention.forward
# materialises the [b, heads/TP, sq, sk] scores. Forward: torch.baddbmm writes them, the fused
# scale-mask-softmax (megatron/core/fusions/fused_softmax.py FusedScaleMaskSoftmax, its CUDA kernel
# up to sk 4096) reads them and writes the probabilities, torch.bmm with V reads those: 4 passes.
# Backward: bmm's gradient writes the probabilities' gradient and reads the probabilities for V's,
# the softmax backward reads both and writes the scores' gradient, baddbmm's gradients for q and k
# read it twice: 7 passes. Attention dropout (p > 0) reads the probabilities and writes its mask
# (one byte) and the dropped copy, and its backward reads the mask and the gradient and writes
# one. Recompute of the core repeats the forward's passes. Flash and cuDNN kernels keep the scores
# on chip and make none of these passes.
UNFUSED_SCORE_PASSES = (4, 7)
# The flops page counts the core over the causal half of the keys; baddbmm and bmm multiply every
# query by every key and the softmax masks the upper triangle afterwards: twice that work.
UNFUSED_CAUSAL_SHARE = 2


def _unfused_scores(book: Book, v: Variant) -> str:
    """The unfused core's HBM time over its scores, as an addend (empty for fused kernels)."""
    if not (v.attn_scores and v.attention in ("standard", "mla")):
        return ""
    fwd, bwd = UNFUSED_SCORE_PASSES
    drop = " + 2 * p + 1" if v.attention_dropout else ""
    book.add("time_attention_scores_bytes", f"({fwd} * p{drop}) * (1 + time_recompute_attention_"
             "core_flops / Max(time_attention_core_fwd_flops, 1))"
             f" + {bwd} * p{drop}", "bytes", "time",
             "per score element of a block and microbatch: unfused attention's HBM traffic over the "
             "s x s scores (forward 4 passes, backward 7, attention dropout's mask and copy; "
             "recompute repeats the forward's)")
    return (" + microbatches * blocks * attn_score_elements * time_attention_scores_bytes"
            " / time_hbm_rate")


def _compute(book: Book, v: Variant) -> None:
    add = book.add
    per_step = "microbatches * time_tokens_per_rank"
    _gemm(book, "attention_gemm", "time_attention_linear_fwd_flops",
          "time_recompute_attention_linear_flops", "time_attention_params",
          "time_gemm_rate * time_attention_shape_eff", "attention projections",
          grad_add=v.wgrad_unfused)
    scores = _unfused_scores(book, v)
    full = f" * {UNFUSED_CAUSAL_SHARE}" if scores else ""
    add("time_attention_core_s", f"{per_step} * (3 * time_attention_core_fwd_flops"
        f" + time_recompute_attention_core_flops){full} / time_attention_rate" + scores, "s", "time",
        "core attention: forward, backward (Megatron's 3x) and recompute"
        + (", its products over every key (unfused: the causal mask applies after them), and "
           "its passes over the s x s scores" if scores else ""))
    _gemm(book, "routed_gemm", "time_routed_fwd_flops", "time_recompute_routed_flops",
          "time_routed_params", "time_gemm_rate * time_routed_shape_eff",
          "routed experts of the busiest rank",
          " * imbalance", grad_add=v.wgrad_unfused)
    _gemm(book, "shared_gemm", "time_shared_fwd_flops", "time_recompute_shared_flops",
          "time_shared_params", "time_gemm_rate * time_shared_shape_eff", "shared experts",
          grad_add=v.wgrad_unfused)
    add("time_moe_gemm_s", "time_routed_gemm_s + time_shared_gemm_s", "s", "time",
        "MoE MLPs (routed and shared experts), recompute included")
    _gemm(book, "dense_gemm", "stage_dense_fwd_flops_per_token", "time_recompute_dense_flops",
          "time_dense_params", "time_gemm_rate * time_dense_shape_eff", "dense MLPs",
          grad_add=v.wgrad_unfused)
    _gemm(book, "head_gemm", "stage_head_fwd_flops_per_token", "0", "time_head_params",
          "time_bf16_rate * time_head_shape_eff", "logits and MTP projections (BF16)",
          grad_add=v.wgrad_unfused)
    ncclep = _ncclep_copies(book, v, per_step)
    add("time_non_gemm_s", f"{per_step} * ((time_ew_fwd_elements * non_gemm_passes"
        " + time_ew_recompute_elements * non_gemm_passes / 3) * 2 / time_hbm_rate"
        f" + (blocks + blocks_recomputed / 3) * t_non_gemm){ncclep}", "s", "time",
        "work outside GEMMs and attention: the forward's elementwise elements (BF16, 2 bytes) "
        "through HBM non_gemm_passes times over forward and backward (a third again for "
        "recomputed work), plus a fixed latency per token and block"
        + ("; NCCL EP's copies of the expert rows into its exchange buffers" if ncclep else ""))
    bias = " + time_ew_expert_bias_elements" if v.bias else ""
    clamp = " + time_ew_act_clamp_elements" if v.moe_act_clamp else ""
    add("time_moe_non_gemm_s", f"{per_step} * (time_ew_router_elements + time_ew_act_elements"
        f" + time_ew_permute_elements + time_ew_fp8_cast_moe_elements{bias}{clamp})"
        f" * non_gemm_passes * 2 / time_hbm_rate{ncclep}",
        "s", "time", "the MoE layers' share of it (router, permutes, expert activations, the "
        "experts' FP8 casts and, with linear biases, the experts' fc2 bias), "
        "without recompute")


def _ncclep_copies(book: Book, v: Variant, per_step: str) -> str:
    """NCCL EP's copies of the rank's expert rows into the exchange's buffers, as an addend of the
    non-GEMM time ("" for other dispatchers). The expert outputs reach the combine buffer by a
    copy (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py
    _NCCLEPManager.get_restored_hidden_states_by_experts re-expands them into the static receive
    buffer; main's default path stages them into symmetric memory), and in backward Transformer
    Engine's staged path (the default, the one zero-copy replaces) copies FC1's input gradients
    for the dispatch's backward the same way. moe_ncclep_zero_copy (main) has the experts write
    both straight into symmetric buffers (main@d98e8a64 _NCCLEPManager.get_expert_zero_copy_buffers,
    TransformerConfig.moe_ncclep_zero_copy: "saving one copy"), but the backward one under
    overlap_moe_expert_parallel_comm, whose schedule hands the dispatch's backward a plain clone
    (one extra copy per dispatch-backward, main's warning). Each copy reads and writes the rows
    once; the forward one repeats where recompute re-runs the MoE layer."""
    if not v.ncclep:
        return ""
    if v.ncclep_zero_copy:
        copies, again = "on_overlap_moe_expert_parallel_comm", "0"
    else:
        copies = "2"
        again = "L_moe_recomputed" + (" + L_moe" if v.recompute == "selective"
                                      and "moe" in v.recompute_modules else "")
    book.add("time_ncclep_copies", copies, "count", "time",
             "copies of the rank's expert rows per MoE layer and microbatch into NCCL EP's "
             "buffers: the expert outputs for combine, FC1's input gradients for the dispatch's "
             "backward (none with moe_ncclep_zero_copy, but the backward's under EP overlap)")
    book.add("time_ncclep_copy_s", f"{per_step} * (L_moe * time_ncclep_copies + {again})"
             " * 2 * imbalance * k * h_moe * 2 / time_hbm_rate", "s", "time",
             "NCCL EP's copies into its exchange buffers: each reads and writes the rank's k "
             "routed rows per token (the busiest rank's: times routing_imbalance) in BF16, and "
             "recompute repeats the forward's")
    return " + time_ncclep_copy_s"


# --- GEMM shapes and fixed costs ---------------------------------------------------

def _dim_eff(d: str) -> str:
    """One GEMM dimension's share of the large-shape efficiency: d / (d + gemm_half), times the
    tile quantisation d / (ceil(d / gemm_tile) · gemm_tile) (a partial tile costs a whole one)."""
    return (f"({d}) / (({d}) + gemm_half) * ({d}) / (ceiling(({d}) / gemm_tile) * gemm_tile)")


# (kind, m, n, k, what) of each GEMM kind: m the rows one GEMM sees per microbatch (a TP group's
# linears see their whole CP-local sequence; a routed expert its own rows), n its output columns
# on this rank, k the reduction.
GEMM_SHAPES: tuple[tuple[str, str, str, str, str], ...] = (
    ("attention", "b * S / CP", "h / TP", "h", "attention projections"),
    ("routed", "Max(local_expert_rows, 1)", "I / ETP", "h_moe", "one routed expert's GEMM"),
    ("shared", "b * S / CP", "Max(I_s, 1) / TP", "h", "shared expert"),
    ("dense", "b * S / CP", "Max(f, 1) / TP", "h", "dense MLP"),
    ("head", "b * S / CP", "V_pad / TP", "h", "output layer"),
)


def _shapes(book: Book, v: Variant) -> None:
    """Each GEMM kind's shape efficiency: the product of its three dimensions' shares, so a
    skinny or small GEMM (few rows per expert, a narrow expert, expert TP) runs below a square
    one. Megatron's grouped GEMM runs one GEMM per local expert."""
    for kind, m, n, k, what in GEMM_SHAPES:
        book.add(f"time_{kind}_shape_eff", f"{_dim_eff(m)} * {_dim_eff(n)} * {_dim_eff(k)}",
                 "share", "time", f"{what}: shape efficiency of an m·n·k = ({m})·({n})·({k}) GEMM "
                 "(per dimension d / (d + gemm_half) after quantisation to gemm_tile)")


# Kernels one block's forward launches per microbatch, by the part of a block a CUDA graph can
# capture (hardware.GRAPH_PARTS), counted call site by call site in Megatron's modules with
# Transformer Engine (Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py;
# megatron/core/transformer/moe/moe_layer.py MoELayer.forward; megatron/core/transformer/moe/
# router.py; megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher;
# megatron/core/transformer/moe/experts.py TEGroupedMLP.forward). Each entry: (kernels, what
# launches them). The backward
# launches two kernels per forward one (data and weight gradient of a GEMM, one backward kernel
# per elementwise op and collective), so a block's forward and backward launch three times these.
ATTENTION_LAUNCHES: tuple[tuple[str, str], ...] = (
    ("2", "input norm and QKV GEMM (TE LayerNormLinear)"),
    ("2", "fused RoPE on q and k"),
    ("1", "core attention (one fused kernel)"),
    ("1", "output projection GEMM"),
    ("1", "bias-dropout-add into the residual"),
    ("fp8", "FP8 cast of the output projection's input (norm outputs are cast inside the norm)"),
)
# RoPE by Megatron's unfused path: --no-rope-fusion, MLA with plain RoPE, or YaRN with a
# concentration factor other than 1 on standard attention (planner/budget/hardware.py
# rope_unfused): Megatron-LM dev@d48bd6be megatron/core/models/common/embeddings/rope_utils.py
# _apply_rotary_pos_emb_bshd rotates q and k in PyTorch ops. Per tensor t it builds cos and sin of
# the position table (torch.cos / torch.sin, the product with the factor, the cast to t's dtype:
# six kernels on a table of d per position), then t·cos (read t, write t), _rotate_half (the
# negated half: read and write half of t; torch.cat: read and write t), its product with sin (read,
# write), the sum (read both, write) and the concatenation with the unrotated rest (read, write):
# twelve passes over t where the fused kernel reads and writes it once, so ten more, and twelve
# kernels where the fused path launches one. The position tables (d per position, not per head)
# are left out of the bytes: under 1 % of them.
ROPE_UNFUSED_DOC = ("RoPE by Megatron's unfused path (--no-rope-fusion, MLA with plain RoPE, or "
                    "YaRN's concentration factor other than 1): ten "
                    "more passes over the rotated q and k heads than the fused kernel's one read "
                    "and write (t·cos, the rotated half's negation and concatenation, ·sin, the "
                    "sum and the concatenation with the unrotated rest; rope_utils.py "
                    "_apply_rotary_pos_emb_bshd)")
ROPE_UNFUSED_LAUNCHES = ("24", "unfused RoPE on q and k, twelve kernels each: cos and sin "
                         "of the position table with their factor and cast, t·cos, the negated "
                         "half, its concatenation, ·sin, the sum, the concatenation with the rest")
# Of those, the position table's six per tensor have no autograd node (the table needs no grad).
ROPE_UNFUSED_NOGRAD = 12
# Unfused core attention (attention_backend unfused or local, transformer_impl local: the same
# variant as UNFUSED_SCORE_PASSES below): Megatron-LM dev@d48bd6be megatron/core/transformer/
# dot_product_attention.py DotProductAttention.forward launches torch.baddbmm (the scores), the fused
# scale-mask-softmax, torch.bmm with V and the context's permute made contiguous, and with attention
# dropout its dropout: four or five kernels where a flash kernel is one.
UNFUSED_CORE_LAUNCHES = 4
UNFUSED_CORE_DOC = ("core attention unfused: baddbmm scores, the fused scale-mask-softmax, bmm with "
                    "V, the context made contiguous{} (DotProductAttention.forward)")
MLA_LAUNCHES = ("6", "MLA: q and kv down projections, the kv norm, the up projection, the k/v "
                "split and the RoPE concatenation")
TP_LAUNCHES = ("2", "sequence-parallel all-gather before and reduce-scatter after the TP linears")
# Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py
# SelfAttention.get_query_key_value_tensors: with qk_layernorm (Qwen3, OLMoE, MiniMax-M2) the query
# and the key heads each pass their own norm module (q_layernorm, k_layernorm: TENorm) after the
# split, two kernels; with fewer query groups than TP the QKV output is all-gathered along its last
# dimension (megatron/core/tensor_parallel/mappings.py _gather_along_last_dim: the collective into
# one buffer, then torch.cat of the ranks' slices into the last dimension), two more.
QK_NORM_LAUNCHES = ("2", "q and k norms (qk_layernorm: q_layernorm and k_layernorm after the split)")
QKV_GATHER_LAUNCHES = ("2", "the QKV output's all-gather over TP and the concatenation of the "
                       "ranks' slices along the last dimension (fewer query groups than TP)")
# The router part of a MoE layer's forward: `router_launches` (planner/budget/hardware.py
# router_launch_count), Nsight Systems' count on DeepSeek-V3's router scaled by the router's own
# features.
ROUTER_LAUNCHES: tuple[tuple[str, str], ...] = (
    ("router_launches", "router: gate GEMM, scores, top-k, routing map and, as the router has "
     "them, group-limited selection, expert bias, auxiliary loss, Sinkhorn iterations"),
)
PREPROCESS_LAUNCHES: tuple[tuple[str, str], ...] = (
    ("3", "preprocessing: tokens per expert, routing map to indices, the counts' copy to the host "
          "(the dropless sync)"),
)
EXPERT_LAUNCHES: tuple[tuple[str, str], ...] = (
    ("1", "pre-MLP norm"),
    ("2 * time_permute_launches", "permute before dispatch and unpermute after combine"),
    ("2", "dispatch and combine exchanges"),
    ("experts_per_rank * (2 + 2 * fp8)", "per local expert: fc1 and fc2 GEMMs, and under FP8 the "
     "quantisation of each GEMM's input (TE GroupedLinear runs one GEMM per expert)"),
    ("1", "expert activation"),
    ("3 * Min(I_s, 1)", "shared expert: fc1, activation, fc2"),
    ("1", "bias-dropout-add into the residual"),
)
# TP collectives inside a MoE layer. The routed experts' rows are moved over expt_tp, not TP
# (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py
# MoEAlltoAllTokenDispatcher: tp_group is pg_collection.expt_tp): with ETP > 1 dispatch_postprocess
# all-gathers the received tokens and their probabilities over it and token_combine
# reduce-scatters the expert output, three collectives; with ETP = 1 none. Only the shared expert,
# a TP-split MLP, gathers its sequence-parallel input and scatters its output over TP.
SHARED_TP_LAUNCHES = ("2 * Min(I_s, 1)", "shared expert: sequence-parallel all-gather before fc1 "
                      "and reduce-scatter after fc2 over TP")
EXPERT_TP_LAUNCHES = ("3", "expert-TP all-gathers of the received tokens and probabilities, and "
                      "the reduce-scatter before the combine (ETP > 1)")
# Megatron-LM dev@d48bd6be megatron/core/fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl
# (the routed experts' fused bias-activation under --quick-geglu, TEGroupedMLP.forward): with a clamp
# value the FC1 output is split in its two halves, each clamped by a PyTorch op (read and write I),
# the halves concatenated again (read and write 2I), and the offset made a device tensor (a host to
# device copy), before the fused activation kernel: four more kernels, eight more elements per
# routed row. Backward: each clamp's gradient (one kernel each); the concatenation and the copy
# have none. SwiGLU's clamp runs inside its fused kernel (fused_bias_swiglu.py) and costs nothing.
ACT_CLAMP_DOC = ("routed experts' clamped quick-GELU GLU: the two clamps of FC1's halves (read and "
                 "write I each) and their concatenation (read and write 2I) before the fused "
                 "activation, per routed row (the busiest rank's: times routing_imbalance; "
                 "fused_bias_geglu.py weighted_bias_quick_geglu_impl)")
ACT_CLAMP_LAUNCHES = ("4", "clamped quick-GELU GLU: two clamps, their concatenation and the "
                      "offset's copy to the device (weighted_bias_quick_geglu_impl)")
# Of those, the concatenation and the copy issue no backward kernel: counted as three without one,
# so the backward's two per kernel give the clamps' two.
ACT_CLAMP_NOGRAD = 3
# Megatron-LM dev@d48bd6be megatron/core/transformer/moe/experts.py TEGroupedMLP._apply_bias: with
# linear biases, fc2's bias is added outside the grouped GEMM by a Python loop over the local experts
# (a multiply and an add each), then one torch.cat.
EXPERT_BIAS_LAUNCHES = ("2 * experts_per_rank + 1", "experts' fc2 bias, per local expert b·p and "
                        "its add, then the concatenation (TEGroupedMLP._apply_bias)")
DENSE_LAUNCHES: tuple[tuple[str, str], ...] = (
    ("2", "pre-MLP norm and fc1 (TE LayerNormLinear)"), ("1", "activation"), ("1", "fc2 GEMM"),
    ("1", "bias-dropout-add into the residual"),
)
# The ends of the model: the embedding lookup (Megatron-LM dev@d48bd6be
# megatron/core/models/common/embeddings/language_model_embedding.py), and on the last stage
# the final norm, the output GEMM and the loss (megatron/core/tensor_parallel/cross_entropy.py
# VocabParallelCrossEntropy.forward: the logits' max, its subtraction, exp, sum, log, the
# target's gather and masking, and the loss's mean: about ten kernels).
EMBEDDING_LAUNCHES = 1
OUTPUT_LAUNCHES = 12
# Host dispatches the backward pays per forward kernel that has one. The backward does not run the
# modules' Python: PyTorch's autograd engine walks the graph the forward recorded, one node per
# differentiable forward op (PyTorch torch/csrc/autograd/engine.cpp Engine::evaluate_function), and
# each node issues its gradient kernels: a GEMM's data and weight gradients (Transformer Engine's
# linears are one autograd.Function each whose backward issues both: transformer_engine/pytorch/
# module/linear.py _Linear.backward), an elementwise op's input gradient and its casts. Two per
# forward kernel, each at the forward's host time per kernel. A kernel autograd records no node for
# issues none: integer bookkeeping and what runs under torch.no_grad (NOGRAD_MOE).
BACKWARD_DISPATCHES = 2
# A MoE layer's forward kernels outside CUDA graphs that have no backward: the preprocessing's, and
# the router's under torch.no_grad (hardware.router_nograd_launch_count).
NOGRAD_MOE = ("time_launches_preprocess * (1 - graph_preprocess)"
              " + router_nograd_launches * (1 - graph_router)")
# Launches after a MoE layer's dropless sync before the GPU has work again: the permute and the
# dispatch (the GPU idles while the host issues them).
SYNC_RESTART_LAUNCHES = 2
# The forward launches selective recompute repeats, per module, as a share of a block's
# forward-and-backward launches (a forward is about a third of them), and the layer count it
# applies to (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py
# recompute_modules).
RECOMPUTE_LAUNCHES: dict[str, tuple[str, str]] = {
    "core_attn": ("1/30", "blocks"), "layernorm": ("1/30", "blocks"), "mla_up_proj": ("1/30", "blocks"),
    "mhc": ("1/30", "blocks"), "moe_act": ("1/60", "L_moe"), "shared_experts": ("1/30", "L_moe"),
    "mlp": ("7/60", "L_dense"), "moe": ("1/5", "L_moe"),
}


def expert_activation_launches(v: Variant) -> tuple[str, str]:
    """The routed experts' activation with the routing probabilities applied to it (Megatron-LM
    dev@d48bd6be megatron/core/transformer/moe/experts.py TEGroupedMLP.forward bias_act_func;
    megatron/core/transformer/mlp.py MLP.forward, each local expert of SequentialMLP): a gated
    (SwiGLU, quick-GELU) activation is one fused kernel that takes the probabilities
    (weighted_bias_swiglu_impl, weighted_bias_quick_geglu_impl); any other runs unfused, as the
    fused bias-activation path takes no per-token scale: the activation, its product with the
    probabilities and the cast back, three kernels. Without grouped GEMM (SequentialMLP.forward)
    every local expert runs its own, and their outputs are concatenated."""
    act = 1 if v.swiglu else 3
    if v.grouped_gemm:
        return str(act), ("expert activation" + ("" if v.swiglu else ": the activation, the "
                          "probabilities' product and the cast back (no fused path takes them)"))
    return (f"experts_per_rank * {act} + Min(experts_per_rank - 1, 1)",
            "expert activation per local expert (SequentialMLP" + ("" if v.swiglu else "; the "
            "activation, the probabilities' product and the cast back") + "), and the "
            "concatenation of the experts' outputs")


def allgather_launches(v: Variant) -> tuple[tuple[str, str], tuple[str, str]]:
    """The allgather dispatcher's kernels beyond the generic list's hidden-state exchanges and
    permutes (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py
    MoEAllGatherTokenDispatcher): (its index bookkeeping, which autograd records no node for; the
    rest). token_dispatch gathers the routing map (under torch.no_grad) and the probabilities as
    well as the hidden states over TP x EP; dispatch_postprocess makes the local experts' slices of
    the map and of the probabilities contiguous, then their transposes, and masked_select picks the
    local probabilities (a nonzero, whose size the host waits for, and the gather); token_combine
    casts the expert output to the probabilities' fp32 and back around its reduce-scatter."""
    gathered = 1 if (v.tp or v.ep) else 0
    return ((f"{gathered} + 3", "allgather dispatcher: the routing map's gather over TP x EP, the "
             "local map's slice and its transpose made contiguous, masked_select's nonzero"),
            (f"{3 * gathered} + 3", "allgather dispatcher: the probabilities' gather, their "
             "slice and transpose made contiguous, masked_select's gather, and the combine's "
             "casts to fp32 and back"))


def _count(entries: tuple[tuple[str, str], ...]) -> str:
    return " + ".join(f"({n})" for n, _ in entries)


def _launch_counts(book: Book, v: Variant) -> None:
    """Kernels per block forward, by capturable part (see ATTENTION_LAUNCHES and the rest)."""
    add = book.add
    attention = list(ATTENTION_LAUNCHES) + ([MLA_LAUNCHES] if v.attention == "mla" else []) + (
        [TP_LAUNCHES] if v.tp else []) + ([QK_NORM_LAUNCHES] if v.qk_norm else []) + (
        [QKV_GATHER_LAUNCHES] if v.qkv_gather else [])
    if v.rope_unfused:
        attention = [ROPE_UNFUSED_LAUNCHES if what.startswith("fused RoPE") else (n, what)
                     for n, what in attention]
    if v.attn_scores and v.attention in ("standard", "mla"):
        drop = int(v.attention_dropout)
        core = (str(UNFUSED_CORE_LAUNCHES + drop),
                UNFUSED_CORE_DOC.format(", the attention dropout" if drop else ""))
        attention = [core if what.startswith("core attention") else (n, what) for n, what in attention]
    router = list(ROUTER_LAUNCHES)
    gathers = list(allgather_launches(v)) if v.dispatcher == "allgather" else []
    preprocess = list(PREPROCESS_LAUNCHES) + (
        [("1", "token counts exchanged over the EP group")] if v.ep and v.dispatcher == "alltoall"
        else []) + gathers[:1]
    experts = [expert_activation_launches(v) if what == "expert activation" else (n, what)
               for n, what in EXPERT_LAUNCHES] + ([SHARED_TP_LAUNCHES] if v.tp else []) + (
        [EXPERT_TP_LAUNCHES] if v.etp and v.dispatcher == "alltoall" else []) + (
        [EXPERT_BIAS_LAUNCHES] if v.bias else []) + ([ACT_CLAMP_LAUNCHES] if v.moe_act_clamp else []) + (
        gathers[1:])
    dense = list(DENSE_LAUNCHES) + ([TP_LAUNCHES] if v.tp else [])
    # Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_utils.py: the fused permute is
    # one Transformer Engine kernel; the unfused one builds the index (mask transpose, arange,
    # masked_select) and gathers the rows, about five kernels, and so does its unpermute.
    add("time_permute_launches", "Max(time_permute_copies, 1) * (permute_fused"
        " + 5 * (1 - permute_fused))", "count", "time",
        "permutation kernels per direction: one fused, about five unfused (HybridEP's dispatch "
        "permutes inside its own kernel, which is still a launch)")
    # Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_layer.py
    # TransformerLayer._get_submodules_under_cudagraphs (Transformer Engine's graphs) and
    # MoETransformerLayer._forward_mlp_router (the local implementation's router graph): a graph
    # stopping after the MoE router also holds the pre-MLP norm and, unless it overlaps the token
    # exchange (moe_shared_expert_overlap), the shared expert, which the experts part counts.
    shared = "0" if v.shared_overlap else "3 * Min(I_s, 1)"
    add("time_launches_router_graph_also", f"1 + {shared}", "kernels", "time",
        "kernels of the experts part a router CUDA graph captures with the router: the pre-MLP "
        "norm" + ("" if v.shared_overlap else ", and the shared expert's fc1, activation and fc2"))
    for name, entries, what in (("attention", attention, "attention part"),
                                ("router", router, "MoE router"),
                                ("preprocess", preprocess, "MoE preprocessing"),
                                ("experts", experts, "MoE experts with dispatch and combine"),
                                ("dense", dense, "dense MLP")):
        add(f"time_launches_{name}", _count(tuple(entries)), "kernels", "time",
            f"kernels the {what} of one block launches per microbatch forward: "
            + "; ".join(f"{n} {w}" for n, w in entries))


def _router_graph_also(n: str) -> str:
    """The experts part's launches a router graph holds (time_launches_router_graph_also, or in
    bare ops time_host_units_router_graph_also: `n` names which), off the experts part's eager
    count when the router is graphed and the experts are not."""
    return f" - graph_router * (1 - graph_experts) * {n}_router_graph_also"


# The launches above by the kind of call that issues them, for their host cost: a GEMM that is one
# Transformer Engine module call costs host_module_op bare ops (planner/config/gpus.py
# HOST_MODULE_OP, measured; under FP8 HOST_MODULE_FP8 times that, measured), every other launch one
# (a PyTorch op, a fused kernel behind one autograd.Function, a launch a module issues from its own
# C++: no published measurement separates these from a bare op). The module GEMMs per block part:
# attention's QKV LayerNormLinear and output projection (Megatron-LM dev@d48bd6be
# megatron/core/transformer/attention.py SelfAttention linear_qkv, linear_proj), MLA's q and kv down
# projections and its up projection (multi_latent_attention.py MLASelfAttention, as MLA_LAUNCHES
# counts them); the experts' two GroupedLinear calls (moe/experts.py TEGroupedMLP linear_fc1,
# linear_fc2), or each local expert's two linears without grouped GEMM (SequentialMLP), and the
# shared expert's fc1 and fc2; the dense MLP's fc1 and fc2 (mlp.py MLP); the output layer.
def _host_kinds(book: Book, v: Variant) -> None:
    """Module GEMM calls of each part (see above), and the parts' forward launches in bare ops."""
    add = book.add
    shared = " + 2 * Min(I_s, 1)"
    modules = {
        "attention": ("2 + 3" if v.attention == "mla" else "2",
                      "QKV and output projection" + (", MLA's down and up projections"
                                                     if v.attention == "mla" else "")),
        "experts": (("2" if v.grouped_gemm else "2 * experts_per_rank") + shared,
                    ("the two GroupedLinear calls" if v.grouped_gemm
                     else "each local expert's two linears") + ", the shared expert's fc1 and fc2"),
        "dense": ("2", "fc1 and fc2"),
    }
    # The blocks of each part that run their module calls in FP8: all of them under training.fp8
    # but those training.first_last_layers_bf16 keeps in BF16 (the part's units are per block, so
    # the share prices each part's BF16 blocks exactly).
    fp8_blocks = {"attention": ("blocks", "L_bf16"), "experts": ("L_moe", "L_moe_bf16"),
                  "dense": ("L_dense", "L_dense_bf16")}
    for part, (count, what) in modules.items():
        add(f"time_modules_{part}", count, "calls", "time",
            f"Transformer Engine module GEMM calls of the {part} part per block forward: {what}")
        share = "fp8"
        if v.bf16_layers:
            total, kept = fp8_blocks[part]
            share = f"fp8 * ({total} - {kept}) / Max({total}, 1)"
        add(f"time_module_op_{part}", f"host_module_op * (1 + (host_module_fp8 - 1) * {share})",
            "ops", "time", f"host time of one module GEMM call of the {part} part in bare ops: "
            "host_module_op, times host_module_fp8 for the FP8 blocks' calls"
            + (" (the blocks first_last_layers_bf16 keeps in BF16 at the BF16 price)"
               if v.bf16_layers else ""))
        add(f"time_host_units_{part}", f"time_launches_{part} + (time_module_op_{part} - 1)"
            f" * time_modules_{part}", "ops", "time", f"the {part} part's forward launches "
            f"priced in bare PyTorch ops: each module GEMM call at time_module_op_{part}, the rest "
            "at one")
    for part in ("router", "preprocess"):
        add(f"time_host_units_{part}", f"time_launches_{part}", "ops", "time",
            f"the {part} part's forward launches in bare ops (PyTorch ops and fused kernels "
            "called from Python)")
    shared = "" if v.shared_overlap else " + (time_module_op_experts - 1) * 2 * Min(I_s, 1)"
    add("time_host_units_router_graph_also", f"time_launches_router_graph_also{shared}", "ops",
        "time", "the launches a router CUDA graph takes off the experts part, in bare ops (the "
        "shared expert's fc1 and fc2 module calls at time_module_op_experts)")
    add("time_host_units_fwd", _forward_kernels(graphs=True, units=True), "ops", "time",
        "the stage's forward launches per microbatch outside CUDA graphs in bare ops (the output "
        "layer's GEMM one module call at host_module_op)")


def _forward_kernels(graphs: bool, units: bool = False) -> str:
    """Kernels one microbatch's forward of the stage launches: every part's (graphs False), or
    those outside CUDA graphs (graphs True)."""
    def part(flag: str) -> str:
        return f" * (1 - {flag})" if graphs else ""
    n = "time_host_units" if units else "time_launches"
    output = f"({OUTPUT_LAUNCHES} + (host_module_op - 1))" if units else f"{OUTPUT_LAUNCHES}"
    also = _router_graph_also(n) if graphs else ""
    return (f"blocks * {n}_attention{part('graph_attn')} + L_moe * ("
            f"{n}_router{part('graph_router')} + {n}_preprocess"
            f"{part('graph_preprocess')} + {n}_experts{part('graph_experts')}{also})"
            f" + L_dense * {n}_dense{part('graph_dense')}"
            f" + (has_embedding * {EMBEDDING_LAUNCHES} + has_output * {output})"
            f"{part('graph_full')}")


# Each kernel's fixed GPU-side cost (efficiency.gpu_us_per_kernel): what a kernel takes on the GPU
# beyond its FLOPs and bytes (its launch latency on the device, the fill and drain of its blocks, a
# small kernel's tail), paid whether or not the host keeps ahead and whether or not a CUDA graph
# issued it. The default, 7 µs, is a published H100 figure: Meta's auto-parallel planner prices
# every memory-bound operator at no less than 7 µs on H100 (meta-pytorch/autoparallel
# autoparallel/cost_models/compute_estimation.py compute_read_write_time, kernel_launch_overhead;
# its pull request #146: "empirically obtained by minimizing the runtime over a set of examples on
# H100 GPUs ... operators cost at least 7us to run"). Here it is added to each counted kernel,
# not taken as a floor: most counted kernels move far less than 7 µs of bytes (a router op on
# [tokens, experts] at MBS 1), so the floor and the sum differ mainly on GEMMs, whose own ramp
# the shape curve (gemm_half_dim) already prices — on them this term counts it a second time.
# A CUDA graph replaces the host's launches, not the kernels: the GPU still runs them one after
# another, so graphs leave this term as it is (the small GPU-side gap a graph trims between two
# kernels is not modelled).


def _kernel_gpu(book: Book, v: Variant) -> None:
    """Each kernel's fixed GPU-side cost (t_kernel_gpu, see above): every forward kernel, its
    backward's BACKWARD_DISPATCHES and recompute's repeats, CUDA graphs or not."""
    add = book.add
    selective = v.recompute_modules if v.recompute == "selective" else frozenset()
    rc = ["blocks_recomputed / 3"] + [f"{share} * {count}" for module, (share, count)
                                      in RECOMPUTE_LAUNCHES.items() if module in selective]
    add("time_recompute_launch_blocks", " + ".join(rc), "blocks", "time",
        "blocks' worth of launches recompute repeats per microbatch: a recomputed block's "
        "forward, and each selective module's forward share (memory-bound modules cost their "
        "launches however few bytes they move)")
    add("time_kernels_fwd_all", _forward_kernels(graphs=False), "kernels", "time",
        "kernels the stage's forward launches per microbatch, inside CUDA graphs or not")
    tail = tail_launches.write_counts(book, v)
    add("time_kernel_gpu_s", f"microbatches * t_kernel_gpu * (time_kernels_fwd_all * ("
        f"1 + {BACKWARD_DISPATCHES} + time_recompute_launch_blocks * 3 / Max(blocks, 1))"
        f" + {tail})", "s",
        "time", "GPU time the step's kernels cost beyond their work: t_kernel_gpu per kernel, "
        f"each forward kernel, its backward's {BACKWARD_DISPATCHES} and recompute's repeats, "
        "and the tail's outside the blocks (planner/budget/tail_launches.py)")
    add("time_moe_kernel_gpu_s", f"microbatches * t_kernel_gpu * (1 + {BACKWARD_DISPATCHES})"
        " * L_moe * (time_launches_router + time_launches_preprocess + time_launches_experts)",
        "s", "time", "the MoE layers' share of it, without recompute")


def _fixed_costs(book: Book, v: Variant) -> None:
    """Host time the GPU waits for. The host issues every kernel (t_launch each on the reference
    x86 host: Python, PyTorch's dispatcher and the CUDA launch; a Transformer Engine module's GEMM
    host_module_op times that, _host_kinds; host_scale times that on the GPU's own host CPU, and
    an unbound rank's measured extra per op on top) and the backward's from the autograd engine
    (BACKWARD_DISPATCHES per forward kernel with a node); the GPU runs them as they come. When
    the host issues a stretch of kernels slower than the GPU runs them, the GPU waits for the
    difference. Megatron's
    dropless MoE layers copy the token counts per expert to the host in forward (the host cannot
    run ahead across that), so each forward and each backward of a microbatch is priced as
    max(host, GPU) over its stage-average work, plus the launches after each sync the GPU idles
    for. CUDA graphs replace their part's launches with one graph launch."""
    add = book.add
    add("time_launches_fwd", _forward_kernels(graphs=True), "kernels", "time",
        "kernels the stage's forward launches per microbatch outside CUDA graphs, the "
        f"embedding's ({EMBEDDING_LAUNCHES}) and the output layer and loss's ({OUTPUT_LAUNCHES}) "
        "included (overlap."
        "cuda_graph_impl and cuda_graph_scope: attn, moe_router, moe_preprocess, mlp / moe; "
        "full_iteration, or the scope full_iteration, captures all)")
    add("time_launch_s", "host_scale * t_launch + t_unbound", "s", "time",
        "host time to issue one bare op from Python on this GPU's host CPU: the reference x86 "
        "host's calibrated figure times the host CPU's time per op over the reference's "
        "(planner/config/gpus.py HOSTS), and on a rank not bound to its GPU's NUMA node the "
        "host's measured extra per bare op")
    _graph_replays(book, v)
    _host_kinds(book, v)
    add("time_host_fwd_s", "time_launch_s * (time_host_units_fwd + time_graph_replay_fwd_launches)"
        " + t_host_block * blocks / 3", "s",
        "time", "host time to issue one microbatch's forward of the stage (its CUDA graphs' "
        "replays included)")
    rope_nograd = (f" + blocks * {ROPE_UNFUSED_NOGRAD} * (1 - graph_attn)" if v.rope_unfused
                   else "") + (f" + L_moe * {ACT_CLAMP_NOGRAD} * (1 - graph_experts)"
                               if v.moe_act_clamp else "")
    add("time_launches_nograd", f"L_moe * ({NOGRAD_MOE}){rope_nograd}", "kernels", "time",
        "forward kernels of the stage autograd records no node for, so its backward issues none: "
        "each MoE layer's preprocessing (integer token counts and indices, their copy to the host) "
        "and the router's kernels under torch.no_grad (Sinkhorn's iterations)"
        + ("; unfused RoPE's cos and sin of the position table" if v.rope_unfused else "")
        + ("; the clamped GLU's concatenation and offset copy, and one clamp's share"
           if v.moe_act_clamp else ""))
    add("time_host_bwd_s", f"{BACKWARD_DISPATCHES} * time_launch_s * (time_host_units_fwd"
        " - time_launches_nograd) + time_launch_s * time_graph_replay_bwd_launches"
        " + 2 * t_host_block * blocks / 3 + time_recompute_launch_blocks * 3"
        " * time_host_fwd_s / Max(blocks, 1)", "s", "time",
        f"host time to issue its backward: {BACKWARD_DISPATCHES} kernels per forward kernel that "
        "autograd records a node for (a GEMM's data and weight gradients), none for the rest, and "
        "recompute's forwards")
    add("time_sync_restart_s", f"L_moe * {SYNC_RESTART_LAUNCHES} * time_launch_s * (1 - graph_full)",
        "s", "time", "per microbatch, the GPU idles after each MoE layer's dropless sync while the "
        "host issues the permute and the dispatch")
    add("time_host_experts_s", "(L_moe + L_moe_recomputed / 3) * experts_per_rank"
        " * t_host_expert * (1 - graph_experts)", "s", "time",
        "a stack's own extra host time per local expert and microbatch beyond the counted "
        "launches (efficiency.host_us_per_expert, 0 unless calibrated)")
    fsdp_fwd, fsdp_bwd = (f" + {n}" if n else "" for n in fsdp_time.write_host(book, v))
    tail_fwd, tail_bwd = tail_launches.write_host(book)
    tail_fwd += _graph_sync_wait(book, v)
    fsdp_note = (" (Megatron-FSDP's bucket and gradient launches included: "
                 "planner/budget/fsdp_time.py)" if fsdp_fwd else "")
    tail_note = ("; the launches outside the blocks no per-layer graph captures included "
                 "(planner/budget/tail_launches.py)")
    add("time_host_excess_fwd_s", f"Max(time_host_fwd_s{fsdp_fwd} + {tail_fwd}"
        " - time_gpu_s / (3 * microbatches), 0)", "s", "time", "per microbatch, the forward's "
        "host time beyond its GPU work (a forward is a third of it)" + tail_note + fsdp_note)
    add("time_host_excess_bwd_s", f"Max(time_host_bwd_s{fsdp_bwd} + {tail_bwd}"
        " - 2 * time_gpu_s / (3 * microbatches), 0)", "s", "time", "per microbatch, the "
        "backward's host time beyond its GPU work (two thirds of it)" + tail_note + fsdp_note)
    add("time_host_exposed_s", "time_host_excess_fwd_s + time_host_excess_bwd_s"
        " + time_sync_restart_s", "s", "time", "per microbatch, the host time the GPU waits for: "
        "forward and backward each at max(host, GPU), plus the sync restarts")
    moe_host = (f"(L_moe * time_launch_s * ((1 + {BACKWARD_DISPATCHES}) * (time_host_units_router"
                " * (1 - graph_router)"
                " + time_host_units_preprocess * (1 - graph_preprocess) + time_host_units_experts"
                f" * (1 - graph_experts){_router_graph_also('time_host_units')}) - {BACKWARD_DISPATCHES}"
                f" * ({NOGRAD_MOE}"
                + (f" + {ACT_CLAMP_NOGRAD} * (1 - graph_experts)" if v.moe_act_clamp else "")
                + ")))")
    moe_gpu = "(time_moe_gemm_s + time_moe_non_gemm_s + time_moe_kernel_gpu_s) / microbatches"
    add("time_moe_fixed_s", f"microbatches * (Max({moe_host} - {moe_gpu}, 0) + time_sync_restart_s"
        " + time_host_experts_s)", "s", "time",
        "the MoE layers' share of the host time the GPU waits for (their launches against their "
        "own GPU work, and the sync restarts): what a one-layer benchmark's forward + backward "
        "includes")
    add("time_fixed_s", "microbatches * (time_host_exposed_s + time_host_experts_s"
        " + chunks * t_host_microbatch * (1 - graph_full))", "s", "time",
        "host time the GPU waits for over the step: each microbatch's exposed launches and "
        "sync restarts, and a stack's own costs per local expert and per microbatch and chunk "
        "(efficiency.host_us_per_expert, host_us_per_microbatch: 0 unless calibrated); more "
        "tokens per microbatch amortise them")


# A CUDA-graphed block's replay, per microbatch, as the host issues it: Megatron calls one graphed
# callable per layer and microbatch (Megatron-LM dev@d48bd6be megatron/core/transformer/module.py
# GraphableMegatronModule._te_cuda_graph_replay, self.cuda_graphs[cg_index]; the local
# implementation's CudaGraphManager is one per TransformerLayer too, transformer_layer.py
# TransformerLayer.__init__). Transformer Engine's Graphed.forward (transformer_engine/pytorch/
# graph.py make_graphed_callables) copies each user input whose storage differs from the captured
# one into the static input (the layer's hidden states, a fresh tensor: 1) and replays the forward
# graph (1); Graphed.backward copies each output gradient into the static one and replays the
# backward graph. A graph over the whole layer has one output (the hidden states); one that stops
# after the MoE router or its preprocessing returns the hidden states, the probabilities and the
# residual, and the shared expert's output when it is not overlapped (transformer_layer.py
# _te_cuda_graph_replay_impl), each with a gradient.
GRAPH_REPLAY_FWD = 2


def _graph_replays(book: Book, v: Variant) -> None:
    """Launches of the stage's CUDA-graph replays per microbatch, forward and backward."""
    add = book.add
    moe_graphed = "Max(graph_attn, graph_router, graph_preprocess, graph_experts)"
    partial = "(1 - graph_experts) * Max(graph_router, graph_preprocess)"
    shared = "0" if v.shared_overlap else "Min(I_s, 1)"
    add("time_graph_replays", f"(L_dense * Max(graph_attn, graph_dense) + L_moe * {moe_graphed})"
        " * (1 - graph_full)", "graphs", "time",
        "graphed layers of the stage replayed per microbatch (one graphed callable per layer; "
        "none per layer under full_iteration, whose one graph holds the whole step)")
    add("time_graph_replay_fwd_launches", f"{GRAPH_REPLAY_FWD} * time_graph_replays", "kernels",
        "time", "per microbatch forward, the host's work of the graph replays: each layer's input "
        "copied into the graph's static input and the graph launched")
    add("time_graph_replay_bwd_launches", f"2 * time_graph_replays + L_moe * {partial}"
        f" * (1 - graph_full) * (2 + {shared})", "kernels", "time",
        "per microbatch backward, the graph replays: each output gradient copied into the "
        "graph's static one and the backward graph launched (a graph that stops after the MoE "
        "router returns the hidden states, the probabilities, the residual and the un-overlapped "
        "shared expert's output)")


# A router CUDA graph ends right before the MoE layer's dropless sync: Megatron's alltoall
# dispatcher with EP or expert TP over one rank copies the token counts to the host at
# "before_ep_alltoall" under a moe_preprocess (or whole-layer) graph and synchronises there
# (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py
# MoEAlltoAllTokenDispatcher.__init__ cuda_dtoh_point, cuda_sync_point). Eager, the host issues
# the layer's attention, router and preprocessing kernels one by one and reaches the sync with the
# GPU a kernel behind; graphed, it replays them in one call and then waits at the sync for the GPU
# to run all of them, while the host has nothing to issue. So per MoE layer forward the graphed
# part's GPU time is spent with the host idle, on top of the host's own launches: its kernels'
# fixed GPU time (t_kernel_gpu each) and the attention's forward work, less what the host still
# issues between the graph and the sync (the eager preprocessing, the permute). On a GPU-bound
# pass the max against the GPU's own work leaves it hidden. (Added after Megatron's CI case
# gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph was seen 2x slower than estimated.)
def _graph_sync_wait(book: Book, v: Variant) -> str:
    """The host's wait at each MoE layer's sync for the GPU to run the router graph (see above),
    per microbatch forward: " + name", or "" where the dispatcher does not sync there."""
    if v.dispatcher != "alltoall" or not (v.ep or v.etp):
        return ""
    add = book.add
    add("time_graph_sync_gpu_s", "t_kernel_gpu * (time_launches_attention * graph_attn"
        " + time_launches_router + time_launches_preprocess * graph_preprocess"
        " + time_launches_router_graph_also) + graph_attn * (time_attention_gemm_s"
        " + time_attention_core_s) / (3 * microbatches * Max(blocks, 1))", "s", "time",
        "GPU time of one MoE layer's router CUDA graph per forward: its kernels' fixed GPU time "
        "and, with the attention in it, the attention's forward work")
    return " + " + add(
        "time_graph_sync_wait_s", "L_moe * graph_router * (1 - graph_experts) * (1 - graph_full)"
        " * Max(time_graph_sync_gpu_s - time_launch_s * ((1 - graph_preprocess)"
        " * time_launches_preprocess + time_permute_launches), 0)", "s", "time",
        "per microbatch forward, the host waiting at each MoE layer's dropless sync for the GPU "
        "to run the layer's router graph, beyond what it issues between the graph and the sync")


def fx_share(v: Variant) -> str:
    """The shared expert's fc1 share of its FLOPs: every MLP matrix but the down (FC2) one."""
    return f"{v.mlp_matrices - 1}/{v.mlp_matrices}"


# Collectives that run once per layer and microbatch (TP/SP, EP, ETP, CP, GTP weight gathers) and
# the pipeline's P2P (once per model chunk and microbatch); the rest run once per step.
# The token dispatcher's own exchanges (dispatch and combine of the hidden rows): each call also
# pays the dispatcher's fixed set-up (efficiency.dispatch_latency_us_*: DeepEP's notify and
# layout kernels run before every dispatch).
TOKEN_EXCHANGES = ("ep_dispatch_hidden", "ep_combine_hidden")
PER_LAYER = ("ep_", "etp_", "ag_", "tp_sp_", "tp_linear", "tp_qkv", "cp_", "gtp_weight", "egtp_weight")


def _sm_bound(name: str, phase: str) -> str:
    """A token exchange's time at the dispatcher's own copy rate (DeepEP's SMs; 0 for the rest):
    all its bytes, NVLink and scale-out, pass through those SMs."""
    return (f"(step_{name}_{phase}_intra_node_bytes + step_{name}_{phase}_inter_node_bytes)"
            " * inv_dispatch_sm_rate")


# Megatron-LM dev@d48bd6be megatron/core/model_parallel_config.py, the field that flag sets ("Delay
# the weight gradient computation to improve batch-level communication overlapping"): under the
# batch-level EP overlap the experts' weight gradient is held back and runs while the dispatch's
# backward all-to-all is in flight, so that exchange hides, beyond the EP overlap's share, behind
# the routed weight-gradient GEMMs (at most their time).
DELAYED_WGRAD_HIDES = "ep_dispatch_hidden"


# Context parallelism's KV exchange: Megatron-LM dev@d48bd6be megatron/core/transformer/
# transformer_config.py cp_comm_type: "p2p" exchanges KV chunks in a ring, async, overlapped with
# attention compute; "all_gather" gathers the whole KV first and cannot be overlapped.
CP_RING = "cp_kv_gather"


def _cp_ring_hidden(name: str) -> str:
    """The part of the CP KV exchange a ring hides: each chunk's transfer runs under the previous
    chunk's attention, so at most the core attention's time (times eff_overlap) is hidden."""
    return f"cp_ring * Min(eff_overlap * {name}, time_attention_core_s)"


def _cp_ring_paced(name: str, phase: str) -> str:
    """The KV bytes the CP ring moves at the scale-out rate: all of them once the ring crosses a
    node. Each ring step's attention waits for the chunk its previous rank sends, and each rank
    forwards the chunk it received one step earlier (Transformer Engine's
    transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py
    AttnFuncWithCPAndKVP2P, which Megatron's cp_comm_type p2p runs), so the slowest edge paces every
    step of every rank: a ring with one edge in eight off the node still moves its chunks at the
    scale-out rate, not an eighth of them. An all_gather CP exchange is one NCCL collective and
    keeps the per-edge split."""
    return (f"Max(step_{name}_{phase}_inter_node_bytes, cp_ring * Min(cp_nodes - 1, 1)"
            f" * step_{name}_{phase}_wire_bytes)")


def _calls(name: str) -> str:
    """Calls of one collective phase per step on this rank."""
    if name.startswith(PER_LAYER):
        return "microbatches * blocks"
    return "microbatches * chunks" if name == "pp_activation" else "1"


# The data-parallel buffers' once-per-step collectives and the one microbatch pass each can hide
# behind on the first pipeline stage. Megatron-LM dev@d48bd6be megatron/core/pipeline_parallel/
# schedules.py forward_backward_pipelining_without_interleaving (enable_grad_sync; the schedule
# without pipelining and the interleaved one alike): every microbatch but the last runs under
# no_sync, so the grad reduce starts, bucket by bucket, only during the LAST microbatch's backward;
# the parameter all-gather of the distributed optimizer runs bucket by bucket ahead of the FIRST
# microbatch's forward (megatron/core/distributed/distributed_data_parallel.py forward pre-hooks).
# The bucket whose grads finish last (the first layers) is reduced after the backward, and the
# first gathered bucket is waited for before any forward: one bucket of each is exposed. Buckets
# hold max(40M, 1M x DP) parameters (DistributedDataParallel.__init__ bucket_size); stages after
# the first reduce one bucket off the critical path (bucketing off for pp_rank > 0), hidden
# behind the step's compute as before.
DDP_WINDOWS = {
    "dense_grad_reduce": ("dense_grad_params", "the last microbatch's backward"),
    "expert_grad_reduce": ("expert_grad_params", "the last microbatch's backward"),
    "dense_param_gather": ("dense_grad_params", "the first microbatch's forward"),
    "expert_param_gather": ("expert_grad_params", "the first microbatch's forward"),
}


def _ddp_hidden(book: Book, name: str, flag: str | None, t: str) -> str:
    """The part of a data-parallel buffer collective its overlap flag hides (see DDP_WINDOWS):
    on the first stage all its buckets but one, at most the one microbatch pass it runs beside."""
    params, _ = DDP_WINDOWS[name]
    if "time_ddp_bucket_params" not in book.levels:
        book.add("time_ddp_bucket_params", "Max(40000000, 1000000 * dense_dp)", "params", "time",
                 "parameters per data-parallel bucket under overlap_grad_reduce: Megatron's "
                 "default max(40M, 1M x DP)")
        book.add("time_ddp_bwd_window_s", "2 * time_compute_s / (3 * microbatches)", "s", "time",
                 "the last microbatch's backward (two thirds of a microbatch's compute): the "
                 "only pass the grad reduce overlaps")
        book.add("time_ddp_fwd_window_s", "time_compute_s / (3 * microbatches)", "s", "time",
                 "the first microbatch's forward: the only pass the parameter all-gather overlaps")
    buckets = book.add(f"time_ddp_buckets_{ident(name)}",
                       f"ceiling(Max({params}, 1) / time_ddp_bucket_params)", "count", "time",
                       f"buckets of {name}'s buffer on the first stage (one is exposed)")
    window = "time_ddp_bwd_window_s" if "grad" in name.split("_")[1] else "time_ddp_fwd_window_s"
    on = overlap_symbol(flag) if flag else "0"
    return (f"{on} * (is_first_stage * Min(eff_overlap * {t} * (1 - 1 / {buckets}), {window})"
            f" + (1 - is_first_stage) * Min(eff_overlap * {t}, time_compute_s))")


def _communication(book: Book, v: Variant, exchanges: dict[str, list[str]]) -> list[str]:
    """One time per collective and phase the comm page priced; exposed per its overlap flag. The
    token exchanges' exposed times are also listed in `exchanges` by the pass the GPU runs them
    in (a recomputed layer's in the backward)."""
    add, exposed = book.add, []
    for entry in TABLE.values():
        for phase in entry.phases:
            base = f"step.{entry.name}.{phase}"
            if ident(f"{base}.intra_node_bytes") not in book.levels:
                continue
            inter = f"step_{ident(entry.name)}_{phase}_inter_node_bytes"
            if entry.name == CP_RING:
                inter = _cp_ring_paced(ident(entry.name), phase)
            name = add(f"time.{entry.name}.{phase}",
                       f"Max(step_{ident(entry.name)}_{phase}_intra_node_bytes / (bw_nvlink * eff_intra),"
                       f" {inter} / (bw_scale_out * eff_inter)"
                       + (f", {_sm_bound(ident(entry.name), phase)}" if entry.name in TOKEN_EXCHANGES
                          else "") + ")"
                       + (" * imbalance / eff_dispatch" if entry.routed_rows else "")
                       + (" + microbatches * blocks * t_dispatch * Min(step_"
                          f"{ident(entry.name)}_{phase}_intra_node_bytes + step_{ident(entry.name)}_"
                          f"{phase}_inter_node_bytes, 1)" if entry.name in TOKEN_EXCHANGES else "")
                       + f" + {_calls(entry.name)} * t_coll * Min(step_{ident(entry.name)}_{phase}"
                       "_intra_node_bytes + " f"step_{ident(entry.name)}_{phase}_inter_node_bytes, 1)",
                       "s", "time", f"{entry.name} {phase}: NVLink-domain bytes over NVLink, the rest "
                       "over the scale-out network" + (" (under a p2p ring that crosses a node, "
                       "every byte: its slowest edge paces each step)" if entry.name == CP_RING
                       else "") + ", the slower setting the time, plus one latency "
                       f"per call ({_calls(entry.name)} calls: the alpha-beta model, so small "
                       "messages reach less than the link's bandwidth)")
            hidden, why = [], []
            if entry.name in DDP_WINDOWS:
                hidden.append(_ddp_hidden(book, entry.name, entry.overlap, name))
                why.append(f"{entry.overlap}, bucket by bucket, in {DDP_WINDOWS[entry.name][1]}")
            elif entry.overlap:
                hidden.append(f"{overlap_symbol(entry.overlap)} * Min(eff_overlap * {name}, "
                              "time_compute_s)")
                why.append(entry.overlap)
            if entry.shared_expert_part and v.shared_overlap and phase != "recompute":
                # One shared-expert GEMM per exchange and pass; OVL001 forbids running both
                # overlaps, so at most one hidden term is non-zero.
                share = fx_share(v) if entry.shared_expert_part == "fc1" else f"1 - {fx_share(v)}"
                passes = ("time_shared_gemm_fwd_pass_s" if phase == "fwd" else
                          "(time_shared_gemm_fwd_pass_s + time_shared_gemm_wgrad_pass_s)")
                hidden.append(f"Min(eff_overlap * {name}, microbatches * ({share}) * {passes})")
                why.append(f"the shared expert's {entry.shared_expert_part} under "
                           "overlap.moe_shared_expert_overlap")
            if entry.name == DELAYED_WGRAD_HIDES and phase == "bwd":
                hidden.append(f"delay_wgrad * Min((1 - eff_overlap) * {name}, microbatches"
                              " * time_routed_gemm_wgrad_pass_s)")
                why.append("the experts' delayed weight gradient under overlap.delay_wgrad_compute")
            if entry.name == CP_RING:
                hidden.append(_cp_ring_hidden(name))
                why.append("the KV ring under parallel.cp_comm_type p2p or a2a+p2p")
            if hidden:
                name = add(f"time.{entry.name}.{phase}.exposed", f"{name} - " + " - ".join(hidden),
                           "s", "time", f"the part not hidden behind compute ({'; '.join(why)})")
            exposed.append(name)
            if entry.name in TOKEN_EXCHANGES:
                exchanges["fwd" if phase == "fwd" else "bwd"].append(name)
    return exposed


# The token dispatcher issues its exchanges on the compute stream between a MoE layer's
# preprocessing and its experts, and the combine between the experts and the next block
# (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_layer.py MoELayer.forward:
# dispatch, then routed_experts_compute, then combine; token_dispatcher.py
# MoEAlltoAllTokenDispatcher.token_dispatch's all_to_all and MoEFlexTokenDispatcher's fused
# dispatch, neither on a side stream unless overlap_moe_expert_parallel_comm). The host does not
# wait for an exchange to finish: once it has issued one (after the dropless sync, which
# time_sync_restart_s prices), it goes on issuing the experts' kernels while the GPU runs the
# exchange. So on a host-bound pass an exposed exchange is GPU time the host's issuing overlaps,
# not time added after it: each pass costs max(host, GPU work + its exchanges), not
# max(host, GPU work) + its exchanges. Under overlap_moe_expert_parallel_comm the exchanges run on
# a communication stream against another microbatch's compute; what stays exposed there is the
# compute stream waiting on that stream's event, a wait on the GPU the host does not share, so the
# same credit holds for the exposed part (the schedule's own extra host synchronisation, which
# Megatron-LM's GB200 write-up names as its cost there, is not priced). Term added
# after reading Megatron-LM's GB200 write-up rows (docs/discussions/deepseek-v3-gb200-optimization,
# roadmap: DeepEP's slower exchanges made the host-bound DeepEP row 8 % slower than the AlltoAll
# row in this model, 4.8 % faster as measured).


def _host_behind_exchanges(book: Book, exchanges: dict[str, list[str]]) -> None:
    """Host time the token exchanges hide (see above), per pass: the pass's host excess over its
    GPU work (the rows time_host_exposed_s sums, Megatron-FSDP's launches included), at most its
    exposed exchanges."""
    fwd = " + ".join(exchanges["fwd"]) or "0"
    bwd = " + ".join(exchanges["bwd"]) or "0"
    book.add("time_host_behind_exchanges_s", "microbatches * (Min(stack_factor"
             " * time_host_excess_fwd_s, (" + fwd + ") / microbatches)"
             " + Min(stack_factor * time_host_excess_bwd_s, (" + bwd + ") / microbatches))", "s",
             "time",
             "host time the GPU's token exchanges hide: on a host-bound pass the host issues the "
             "experts while the GPU runs the dispatch and combine, so each pass's host excess over "
             "its GPU work is cut by its exposed exchanges, down to 0")

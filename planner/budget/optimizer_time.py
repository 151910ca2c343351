"""Time page terms of the host and the optimizer step beyond its HBM stream: Muon's Newton-Schulz
orthogonalisation, the per-step host check of `--check-weight-hash-across-dp-replicas-interval`,
fine-grained activation offloading's copies over the host link, `--log-num-zeros-in-grad`'s
per-tensor count in every optimizer step, `--log-params-norm`'s parameter norm after it, and the
mixed-precision optimizer's per-tensor copy of the updated main parameters back into the model's.

Muon (Megatron-LM dev@d48bd6be megatron/core/optimizer/emerging_optimizers.py
TensorParallelMuon.orthogonalize, which calls emerging_optimizers' newton_schulz_tp) updates every
2-D weight that is not an embedding or the output layer (emerging_optimizers.py
_is_nonlinear_or_embedding; layer_wise_optimizer.py is_managed_by_layer_wise_optimizer): per
matrix, in a Python loop, decoupled weight decay, the momentum's lerp, a Frobenius normalisation,
num_ns_steps Newton-Schulz steps of three GEMMs each (X·Xᵀ, b·A + c·A·A, a·X + B·X, in BF16 under
Megatron's default --muon-fp32-matmul-prec medium) on the matrix turned so its rows are the smaller
side, the scale and the update. For an m x n matrix with m <= n one step is 4·m²·n + 2·m³ FLOPs.
Megatron's default --muon-tp-mode blockwise runs it on each rank's own TP shard (duplicated gathers
the whole matrix first, and every TP rank runs it), and the default split_qkv runs the fused QKV
matrix as its q, k and v parts. The layer-wise distributed optimizer
(--use-distributed-optimizer with Muon) gives each DP rank whole matrices of its own: dense ones
over dp_cp, expert ones over expt_dp (LayerWiseDistributedOptimizer.shard_params). The host issues
every kernel of that loop, so the step takes the slower of its host time and its GPU time.

The weight hash (megatron/core/utils.py check_param_hashes_across_dp_replicas, called by
megatron/training/training.py post_training_step_callbacks every N iterations): each parameter is
copied to the host (`.to("cpu")`), widened to fp32 and SHA-1-hashed by the rank's one host core.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from planner.budget.expr import Book, Number, Symbol, exact, normalize
from planner.budget.variant import Variant, routed_width
from planner.config.gpus import HOSTS, gpu
from planner.config.schema import Config

GIGA = 10**9

OPTIMIZER_SYMBOLS: tuple[Symbol, ...] = (
    Symbol("muon_tp_div", "what Muon's Newton-Schulz divides a TP-sliced side by: TP, or 1 under "
           "training.muon_tp_mode duplicated (the matrix gathered whole)"),
    Symbol("muon_etp_div", "the same for the ETP-sliced expert matrices: ETP, or 1 under duplicated"),
    Symbol("ns_steps", "Newton-Schulz steps per Muon matrix (training.muon_num_ns_steps; "
           "Megatron's --muon-num-ns-steps, default 5)"),
    Symbol("hash_per_step", "weight-hash checks per iteration: 1 / training."
           "check_weight_hash_across_dp_replicas_interval (0 when unset)"),
    Symbol("sha1_rate", "bytes per second one host core SHA-1-hashes (the GPU's host CPU: "
           "planner/config/gpus.py HOSTS, sha1_cycles_per_byte at clock_ghz)"),
    Symbol("bw_host_link", "GPU-to-host link bandwidth, one direction, B/s (PCIe generation x16, "
           "or Grace's NVLink-C2C: the GPU catalog's host_link_gb_s)"),
)

# Kernels one Muon matrix's update launches (OrthogonalizedOptimizer.step and newton_schulz, as
# emerging_optimizers runs them under Megatron's defaults: decoupled weight decay, no Nesterov,
# precision "medium"): p.add_ (weight decay), exp_avg.lerp_, the normalisation (norm, clamp,
# divide), the BF16 cast, three GEMMs per step, the FP32 cast, the two scale multiplies and the
# update's p.add_. The split QKV matrix runs its three parts each through the normalisation,
# casts, steps and scales (and a copy of each strided part), then one torch.cat.
MUON_FIXED_LAUNCHES = "10"
MUON_PART_LAUNCHES = "8"  # normalisation 3, casts 2, scales 2, the part's contiguous copy 1
MUON_QKV_LAUNCHES = f"3 + 3 * ({MUON_PART_LAUNCHES} + 3 * ns_steps) + 1"
# HBM bytes per element of a Muon matrix outside the GEMMs (fp32 main parameter and momentum):
# weight decay 8, lerp 12, normalisation 12, the two casts 12, the two scales 16, the update 12.
MUON_EW_BYTES = "72"


def optimizer_values(cfg: Config) -> dict[str, Number]:
    """The inputs of this module's rows."""
    tr, card = cfg.training, gpu(cfg.cluster.gpu)
    interval = tr.check_weight_hash_across_dp_replicas_interval
    host = HOSTS[card.host]
    whole = tr.muon_tp_mode == "duplicated"
    return {
        "muon_tp_div": 1 if whole else cfg.parallel.tp,
        "muon_etp_div": 1 if whole else cfg.degrees.etp,
        "ns_steps": tr.muon_num_ns_steps,
        "hash_per_step": normalize(Fraction(1, interval)) if interval else 0,
        "sha1_rate": normalize(exact(host.clock_ghz) * GIGA / exact(host.sha1_cycles_per_byte)),
        "bw_host_link": exact(card.host_link_gb_s) * GIGA,
    }


def _muon_matrices(v: Variant) -> list[tuple[str, str, str, str, str, str]]:
    """(name, rows, cols, count on the stage, launches each, group) of every matrix Muon updates,
    as Newton-Schulz sees it: the rank's TP / ETP shard under --muon-tp-mode blockwise (Megatron's
    default) and distributed, the whole matrix under duplicated (muon_tp_div, muon_etp_div)."""
    w, fc1 = routed_width(v), v.mlp_matrices - 1
    one = MUON_FIXED_LAUNCHES + " + 3 * ns_steps"
    rows: list[tuple[str, str, str, str, str, str]] = []
    if v.attention == "mla":
        if v.mla_q_lora:
            rows += [("q_down", "q_lora", "h", "blocks", one, "dense"),
                     ("q_up", "heads * (d_qk + qk_rope) / muon_tp_div", "q_lora", "blocks", one, "dense")]
        else:
            rows.append(("q_proj", "heads * (d_qk + qk_rope) / muon_tp_div", "h", "blocks", one, "dense"))
        rows += [("kv_down", "kv_lora + qk_rope", "h", "blocks", one, "dense"),
                 ("kv_up", "heads * (d_qk + d_v) / muon_tp_div", "kv_lora", "blocks", one, "dense"),
                 ("attn_proj", "h", "heads * d_v / muon_tp_div", "blocks", one, "dense")]
    else:
        # the QKV launches are counted once, on the q part
        rows += [("q", "heads * d / muon_tp_div", "h", "blocks", MUON_QKV_LAUNCHES, "dense"),
                 ("kv", "groups * d / muon_tp_div", "h", "2 * blocks", "0", "dense"),
                 ("attn_proj", "h", "heads * d / muon_tp_div", "blocks", one, "dense")]
    rows += [("router", "E", "h", "L_moe", one, "dense"),
             ("expert_fc1", f"{fc1} * I / muon_etp_div", w, "L_moe * experts_per_rank", one, "expert"),
             ("expert_fc2", w, "I / muon_etp_div", "L_moe * experts_per_rank", one, "expert"),
             ("shared_fc1", f"{fc1} * I_s / muon_tp_div", "h", "L_moe * Min(I_s, 1)", one, "dense"),
             ("shared_fc2", "h", "I_s / muon_tp_div", "L_moe * Min(I_s, 1)", one, "dense"),
             ("dense_fc1", f"{fc1} * f / muon_tp_div", "h", "L_dense", one, "dense"),
             ("dense_fc2", "h", "f / muon_tp_div", "L_dense", one, "dense"),
             ("mtp_eh_proj", "h / muon_tp_div", "2 * h", "L_mtp", one, "dense")]
    return rows


def _write_muon(book: Book, v: Variant, dim_eff: Callable[[str], str]) -> str:
    """Muon's orthogonalisation of the stage's matrices on this rank: GPU and host time."""
    add = book.add
    gpu_terms, launch_terms, elements = [], [], []
    for name, rows, cols, count, launches, group in _muon_matrices(v):
        shards = f"{group}_opt_shards"
        n = add(f"time_muon_{name}_matrices", f"{count} / {shards}", "count", "time",
                f"Muon: {name} matrices ({rows} x {cols}) this rank orthogonalises "
                f"({group} ones split over {shards} under the layer-wise distributed optimizer)")
        small = add(f"time_muon_{name}_small", f"Min({rows}, {cols})", "elements", "time",
                    f"Muon: the {name} matrix's smaller side (Newton-Schulz turns it to the rows)")
        large = add(f"time_muon_{name}_large", f"Max({rows}, {cols})", "elements", "time",
                    f"Muon: the {name} matrix's larger side")
        es = add(f"time_muon_{name}_small_eff", dim_eff(f"Max({small}, 1)"), "share", "time",
                 f"Muon: the {name} GEMMs' shape share along the smaller side")
        el = add(f"time_muon_{name}_large_eff", dim_eff(f"Max({large}, 1)"), "share", "time",
                 f"Muon: the {name} GEMMs' shape share along the larger side")
        t = add(f"time_muon_{name}_ns_s", f"ns_steps * (4 * {small} * {small} * {large}"
                f" / (time_bf16_rate * {es} * {es} * {el}) + 2 * {small} * {small} * {small}"
                f" / (time_bf16_rate * {es} * {es} * {es}))", "s", "time",
                f"Muon: one {name} matrix's Newton-Schulz steps on the GPU (per step X·Xᵀ and B·X, "
                "2·m²·n FLOPs each, and A·A, 2·m³, m the smaller side; BF16 at each GEMM's shape "
                "efficiency)")
        gpu_terms.append(f"{n} * {t}")
        elements.append(f"{n} * {rows} * {cols}")
        if launches != "0":
            launch_terms.append(f"{n} * ({launches})")
    add("time_muon_elements", " + ".join(elements), "params", "time",
        "Muon: elements of the matrices this rank orthogonalises")
    add("time_muon_gpu_s", " + ".join(gpu_terms) + f" + time_muon_elements * {MUON_EW_BYTES}"
        " / time_hbm_rate", "s", "time", "Muon: the GPU's work of one step: the Newton-Schulz "
        f"GEMMs, and {MUON_EW_BYTES} bytes per element through HBM for the weight decay, momentum, "
        "normalisation, casts, scales and update")
    add("time_muon_launches", " + ".join(launch_terms), "kernels", "time",
        f"Muon: kernels the host issues for it, {MUON_FIXED_LAUNCHES} + 3 · ns_steps per matrix "
        "(the split QKV matrix: each part's own normalisation, casts, steps and scales)")
    return add("time_muon_s", "Max(time_muon_launches * time_launch_s, time_muon_gpu_s)", "s",
               "time", "Muon's orthogonalisation per step: the host issues every kernel of its "
               "per-matrix loop, so the slower of that and the GPU's work")


def _write_weight_hash(book: Book) -> str:
    """The weight-hash check's host time per step."""
    add = book.add
    add("time_weight_hash_check_s", "params_on_rank * (p / bw_host_link + 4 / sha1_rate)", "s",
        "time", "one weight-hash check on this rank: every parameter copied to the host (p bytes "
        "over the host link) and hashed as fp32 (4 bytes at one host core's SHA-1 rate); the fp32 "
        "widening and the per-tensor copies' set-up are left out")
    return add("time_weight_hash_s", "hash_per_step * time_weight_hash_check_s", "s", "time",
               "the weight-hash check per step (training.check_weight_hash_across_dp_replicas_"
               "interval: once every N iterations)")


def write_offload(book: Book, v: Variant) -> list[str]:
    """Fine-grained activation offloading's copies over the host link, and the part of them the
    compute they run beside does not hide (Megatron-LM dev@d48bd6be
    megatron/core/pipeline_parallel/fine_grained_activation_offload.py: each offload group's D2H
    copy runs on the manager's d2h_stream after the group's forward (bulk_offload_group), its H2D
    reload on h2d_stream when the backward reaches the group (bulk_reload), and the backward's
    stream waits for it). Returns the exposed term's name, or nothing without offloading."""
    if not v.offload:
        return []
    add = book.add
    add("time_offload_copy_s", "microbatches * offload_host_per_microbatch / bw_host_link", "s",
        "time", "fine-grained activation offloading: one direction's copies of the step over the "
        "GPU's host link (every microbatch's offload groups; the reloads move the same bytes back)")
    return [add("time_offload_exposed_s", "Max(time_offload_copy_s - time_compute_s / 3, 0)"
                " + Max(time_offload_copy_s - 2 * time_compute_s / 3, 0)", "s", "time",
                "fine-grained activation offloading: the D2H copies beyond the forward compute "
                "they run beside, and the H2D reloads beyond the backward's (the host link's "
                "sharing with other GPUs and the offload's own host-side work are left out)")]


# Kernels count_zeros_fp32 launches per parameter tensor (Megatron-LM dev@d48bd6be
# megatron/core/optimizer/clip_grads.py count_zeros_fp32, a Python loop over the optimizer's
# parameters): torch.count_nonzero (a compare and a sum), `grad.numel() - count` and the running
# total's add.
COUNT_ZEROS_LAUNCHES = "4"


def param_tensor_counts(v: Variant) -> tuple[str, str]:
    """Parameter tensors of the stage on one rank, (dense, expert), as Megatron's modules hold them
    (a norm is a weight, and a bias under LayerNorm; a linear its weight, and a bias under
    add_bias_linear): what a per-tensor loop over the optimizer's parameters visits."""
    norm = "2" if v.layernorm else "1"
    bias = 1 if v.bias else 0
    if v.attention == "mla":
        linears = 5 if v.mla_q_lora else 4
        latent_norms = (2 if v.mla_q_lora else 1) if v.mla_norms else 0
        attention = f"{linears + bias * linears} + {latent_norms} * {norm}"
    else:
        attention = f"{2 + 2 * bias + int(v.qkv_bias)}" + (f" + 2 * {norm}" if v.qk_norm else "")
    mlp = f"{2 + 2 * bias}"
    dense = (f"blocks * ({attention} + 2 * {norm}) + L_moe * ({1 + bias} + Min(I_s, 1) * {mlp}"
             f"{' + Min(I_s, 1)' if v.shared_gate else ''}) + L_dense * {mlp}"
             f" + has_embedding * {2 if v.learned_positions else 1} + has_output_weight"
             f" + has_output * {norm} + L_mtp * (1 + 3 * {norm})")
    return dense, f"L_moe * experts_per_rank * {mlp}"


def _write_param_tensors(book: Book, v: Variant) -> str:
    """The parameter tensors of the stage on this rank and those its optimizer holds (the
    distributed optimizer's are the main-parameter shards this rank owns, a tensor split between
    two shards on both): what the optimizer's per-tensor Python loops visit."""
    add = book.add
    dense, expert = param_tensor_counts(v)
    add("time_dense_param_tensors", dense, "count", "time",
        "dense parameter tensors of the stage on this rank (norm weights and biases, linears' "
        "weights and biases, the router, embeddings and output)")
    add("time_expert_param_tensors", expert, "count", "time",
        "routed-expert parameter tensors of the stage on this rank (fc1 and fc2 per local expert)")
    return add("time_optimizer_param_tensors", "time_dense_param_tensors / dense_opt_shards"
               " + Min(dense_opt_shards - 1, 1) + time_expert_param_tensors / expert_opt_shards"
               " + Min(expert_opt_shards - 1, 1)", "count", "time",
               "parameter tensors this rank's optimizer holds: every one of the stage, or under the "
               "distributed optimizer each buffer's shard, one tensor shared with the next shard")


def _write_count_zeros(book: Book) -> str:
    """`--log-num-zeros-in-grad`: the optimizer's step counts each gradient's zeros, tensor by
    tensor (MegatronOptimizer.count_zeros over get_parameters: the optimizer's own tensors)."""
    add = book.add
    add("time_count_zeros_tensors", "time_optimizer_param_tensors", "count", "time",
        "tensors count_zeros_fp32 visits on this rank: its optimizer's parameters")
    return add("time_count_zeros_s", f"Max({COUNT_ZEROS_LAUNCHES} * time_count_zeros_tensors"
               " * time_launch_s, (dense_shard_params + expert_shard_params) * 4 / time_hbm_rate)",
               "s", "time", "log_num_zeros_in_grad, every step: the count's "
               f"{COUNT_ZEROS_LAUNCHES} kernels per tensor at the host's time per launch (count_"
               "nonzero, the subtraction, the running total), or reading every fp32 main grad "
               "once, whichever is slower")


def write(book: Book, v: Variant, dim_eff: Callable[[str], str]) -> list[str]:
    """The rows of the terms the config has; returns their names, which the optimizer step adds."""
    terms = []
    if v.optimizer == "muon":
        terms.append(_write_muon(book, v, dim_eff))
    if v.weight_hash:
        terms.append(_write_weight_hash(book))
    if v.count_zeros or v.param_copy_loop or v.params_norm:
        _write_param_tensors(book, v)
    if v.count_zeros:
        terms.append(_write_count_zeros(book))
    if v.param_copy_loop:
        terms.append(_write_param_copy(book))
    if v.params_norm:
        terms.append(_write_params_norm(book, v))
    return terms


# Megatron-LM dev@d48bd6be megatron/core/optimizer/optimizer.py MixedPrecisionOptimizer.__init__
# leaves _dummy_overflow_buf None under bf16 ("we don't have multi-tensor apply"), so
# Float16OptimizerWithFloat16Params._copy_main_params_to_model_params (through
# _multi_tensor_copy_this_to_that) copies each updated fp32 main parameter into its model parameter
# with its own copy_ every step; DistributedOptimizer._copy_main_params_to_model_params
# (distrib_optimizer.py, copy_group_params) does the same per main-parameter shard under bf16 and
# fp16. Muon and the layer-wise optimizer wrap each child in the same Float16 optimizer. Not under
# the precision-aware optimizer (its fused Adam writes the model weights itself), Megatron-FSDP
# (MegatronFSDP copies per bucket) or the CPU-offloaded optimizer; under fp8_param_gather the FP8
# weights are quantised in one batch (quantize_param_shard) and the loop over the rest (norms,
# router, embeddings) is left out.
def _write_param_copy(book: Book) -> str:
    """The mixed-precision step's copy of the main parameters into the model's, one kernel per
    tensor: the host's issue time beyond the copies' own HBM time (which the optimizer's stream
    already counts: the fp32 read and the weight write)."""
    return book.add(
        "time_param_copy_s", "Max(time_optimizer_param_tensors * time_launch_s"
        " - (dense_shard_params + expert_shard_params) * (4 + p) / time_hbm_rate, 0)", "s", "time",
        "the bf16 optimizer's copy of each updated fp32 main parameter (or shard) into the model's, "
        "every step (Float16OptimizerWithFloat16Params / DistributedOptimizer "
        "_copy_main_params_to_model_params: one copy_ per tensor): the host's launches beyond the "
        "copies' HBM time")


# Kernels and collectives of Megatron-LM dev@d48bd6be megatron/training/utils/common_utils.py
# calc_params_l2_norm, which megatron/training/training.py train calls after every step under
# --log-params-norm (the main parameters are read where the optimizer keeps them, so no fp32 copy
# is made). Each multi_tensor_applier(multi_tensor_l2norm) call: the zeroed per-block output, one
# launch per 320 chunks of 65,536 elements (a launch also takes at most 110 tensors) and the
# cleanup that sums the blocks. Unsharded main parameters, 7 besides the calls and the reduction:
# the dummy overflow flag's host copy, the dense call's square, the empty sharded norm's zeros, its
# all-reduce and add, the expert call's square (zeros when the rank holds no expert) and .item(),
# a copy to the host and a sync. Sharded (distributed optimizer), 8: the flag, the empty dense
# norm's zeros, the flag again, the shard's call's square, the all-reduce and add, the expert
# norm's zeros and .item(). The reduction then sums dense and expert norms over the model-parallel
# group: an add and one all-reduce when the expert group is the same ranks, else an all-reduce of
# each and an add (the groups differ when EP > 1 or ETP != TP).
L2NORM_CALL = "(2 + Max(ceiling({tensors} / 110), ceiling({params} / (320 * 65536))))"
PARAMS_NORM_FIXED = {False: "7", True: "8"}  # launches outside the l2norm calls and the reduction


def _write_params_norm(book: Book, v: Variant) -> str:
    """`--log-params-norm`'s calc_params_l2_norm after every step: its kernels and collectives at
    the host's time per launch (the per-parameter Python loop that sorts the tensors is left out)."""
    add = book.add
    dense = L2NORM_CALL.format(tensors="time_dense_param_tensors / dense_opt_shards",
                               params="dense_shard_params")
    expert = L2NORM_CALL.format(tensors="time_expert_param_tensors / expert_opt_shards",
                                params="expert_shard_params")
    if v.fsdp:
        # calc_dtensor_params_l2_norm: two zeros and .item(); per DTensor placement (dense and
        # expert) the call, its square, the all-reduce over the sharded mesh dim and the add
        count, what = (f"3 + {dense} + 3 + Min(time_expert_param_tensors, 1) * ({expert} + 3)",
                       "each DTensor placement's local shards")
    else:
        # 0 when the dense and expert model-parallel groups are one (EP 1 and ETP = TP), else 1
        split = "Min(EP * Max(ETP, TP) / Min(ETP, TP) - 1, 1)"
        calls = (L2NORM_CALL.format(tensors="time_optimizer_param_tensors",
                                    params="(dense_shard_params + expert_shard_params)")
                 if v.dist_opt else f"{dense} + Min(time_expert_param_tensors, 1) * {expert}")
        count = f"{PARAMS_NORM_FIXED[v.dist_opt]} + {calls} + 2 + {split}"
        what = "the shard this rank owns" if v.dist_opt else "dense and expert apart"
    add("time_params_norm_launches", count, "kernels", "time",
        "calc_params_l2_norm's kernels and collectives per step: the multi-tensor L2 norms of the "
        f"main parameters ({what}), their squares and sums, the all-reduces over the "
        "data-parallel and model-parallel groups, and the .item() that copies the norm to the host")
    return add("time_params_norm_s", "time_params_norm_launches * time_launch_s", "s", "time",
               "log_params_norm, every step: calc_params_l2_norm's launches at the host's time per "
               "launch")

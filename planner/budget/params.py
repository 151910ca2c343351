"""Page 2, parameters: what one rank of a stage holds (routed experts / EP / ETP, shared expert /
TP, V4 CSA/HCA attention, norms, router, mHC, embedding, output, MTP), and the grad/param buffers
and optimizer shards the distributed optimizer builds from them (Megatron-LM dev@d48bd6be
megatron/core/distributed/param_and_grad_buffer.py, megatron/core/optimizer/distrib_optimizer.py).
"""

from __future__ import annotations

from planner.budget.expr import Book
from planner.budget.layer_kinds import kinds_of
from planner.budget.training_modes import trainable
from planner.budget.variant import Variant, routed_width

PAGE = "params"

ATTENTION_PARAMS = {
    "standard": "2 * h * d * (heads + groups) / (TP * GTP)",
    "mla": "({q} + kv_lora * (h + heads * (d_qk + d_v){kv_norm}) + h * qk_rope + heads * d_v * h)"
           " / (TP * GTP)",
    "dsv4_hybrid": "(h * q_lora + q_lora + q_lora * heads * d + h * d + d + o_lora * heads * d"
                   " + h * o_groups * o_lora + heads) / (TP * GTP)",
}
# add_bias_linear: one bias per linear. Column-parallel biases are split over TP, the row-parallel
# output projection's bias is whole on every rank (Megatron-LM dev@d48bd6be
# megatron/core/tensor_parallel/layers.py ColumnParallelLinear / RowParallelLinear.__init__).
ATTENTION_BIAS = {
    "standard": "(heads + 2 * groups) * d / TP + h",
    "mla": "q_lora + heads * (d_qk + qk_rope) / TP + kv_lora + qk_rope + heads * (d_qk + d_v) / TP + h",
}


def _mlp_kind(v: Variant) -> str:
    return "SwiGLU" if v.swiglu else "non-gated"


def _fc1_width(v: Variant, width: str) -> str:
    """FC1's output: gate and up halves under SwiGLU, one matrix otherwise."""
    return f"2 * {width}" if v.swiglu else width


def _fc1_bias(v: Variant, width: str) -> str:
    return f"({_fc1_width(v, width)})"


MLA_Q = {True: "q_lora * (h + heads * (d_qk + qk_rope){q_norm})", False: "h * heads * (d_qk + qk_rope)"}
def write(book: Book, v: Variant) -> None:
    """Parameter counts on one rank of a stage, and the buffers/shards the grad steps need."""
    add, w = book.add, routed_width(v)
    mats = v.mlp_matrices
    # training.first_last_layers_bf16: those blocks are built outside TE's FP8 context (Megatron-LM
    # dev@d48bd6be megatron/core/fp8_utils.py get_fp8_context returns nullcontext for them)
    blocks, moe_layers, dense = (("(blocks - L_bf16)", "(moe_layers - L_moe_bf16)",
                                  "(L_dense - L_dense_bf16)") if v.bf16_layers
                                 else ("blocks", "moe_layers", "L_dense"))
    routed = f"experts_per_rank * {mats} * {w} * I / (ETP * EGTP)"
    if v.bias:
        routed += f" + experts_per_rank * ({_fc1_bias(v, 'I')} / ETP + {w})"
    add("routed_params_per_layer", routed, "params", "memory",
        f"routed {_mlp_kind(v)} experts on this rank (FC1: {w} x {_fc1_width(v, 'I')}/ETP, "
        f"FC2: I/ETP x {w})" + (", their biases (FC2's whole on every ETP rank)" if v.bias else ""))
    add("routed_weight_bytes_per_layer", "routed_params_per_layer * p", "bytes", "memory",
        "routed expert weights per MoE layer")
    add("routed_weight_bytes_per_stage", "routed_weight_bytes_per_layer * moe_layers", "bytes",
        "memory", "routed expert weights of every MoE layer on the stage")
    add("shared_params_per_layer", f"{mats} * h * I_s / (TP * GTP)"
        + (f" + {_fc1_bias(v, 'I_s')} / TP + Min(I_s, 1) * h" if v.bias else ""), "params", "memory",
        "shared expert, dense TP layout" + (", with biases" if v.bias else ""))
    # add_bias_linear biases the router too (Megatron-LM dev@d48bd6be megatron/core/transformer/
    # moe/router.py Router.__init__: bias [E], whole on every TP rank).
    # LongCat-Flash's zero-computation experts are rows of its router (LongcatFlashTopkRouter's
    # classifier scores E + Z experts) and hold nothing else.
    rows = "(E + Z)" if v.zero_experts else "E"
    add("router_params_per_layer", f"{rows} * h + {rows}" if v.bias else f"{rows} * h", "params",
        "memory", "gating matrix" + (" and its bias" if v.bias else "") + " (replicated over TP)"
        + (", its rows scoring the routed and the zero-computation experts" if v.zero_experts
           else ""))
    moe_dense = "shared_params_per_layer + router_params_per_layer"
    if v.shared_gate:
        # Megatron-LM dev@d48bd6be megatron/core/transformer/moe/shared_experts.py
        # SharedExpertMLP.__init__: gate_weight [1, h], whole on every TP rank.
        add("shared_gate_params_per_layer", "h", "params", "memory",
            "shared-expert gate weight [1, h] (replicated over TP)")
        moe_dense += " + shared_gate_params_per_layer"
    if v.latent:
        # Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_layer.py MoELayer.__init__:
        # fc1_latent_proj (h → latent) and fc2_latent_proj (latent → h), TELinear in "duplicated"
        # mode: whole on every TP rank, dense (not expert) parameters.
        add("latent_proj_params_per_layer", "2 * h * h_moe", "params", "memory",
            "latent MoE projections h → latent and latent → h (replicated over TP)")
        moe_dense += " + latent_proj_params_per_layer"
    add("norm_params_per_block", "4 * h" if v.layernorm else "2 * h", "params", "memory",
        "two LayerNorms (weight + bias) per block" if v.layernorm else "two RMSNorms per block")
    # MLA's q/kv latent norms exist only with qk_layernorm (Megatron-LM dev@d48bd6be
    # megatron/core/models/gpt/gpt_layer_specs.py: the up projections fuse a layer norm then).
    norm_term = (" + 2" if v.layernorm else " + 1") if v.mla_norms else ""
    attention = (ATTENTION_PARAMS[v.attention].replace("{q}", MLA_Q[v.mla_q_lora])
                 .replace("{q_norm}", norm_term).replace("{kv_norm}", norm_term))
    add("attention_params_per_block", attention, "params", "memory",
        f"{v.attention} attention projections on this rank")
    # One block's terms: the attention side (what a kind with a mixer of its own replaces) and
    # the block's norms and mHC weights, which every block keeps.
    attention_side = ["attention_params_per_block"]
    kinds = kinds_of(v)
    attention_side += [kind.block_params(book, v) for kind in kinds if kind.beside_norms]
    if v.bias:
        add("attention_bias_params_per_block", ATTENTION_BIAS.get(v.attention, "0"), "params",
            "memory", "add_bias_linear: attention biases (column-parallel ones split over TP, the "
            "output projection's whole on every TP rank)")
        attention_side.append(" + attention_bias_params_per_block")
    elif v.qkv_bias:
        # Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py SelfAttention.__init__:
        # add_qkv_bias biases linear_qkv (column-parallel, split over TP) and nothing else.
        add("attention_bias_params_per_block", "(heads + 2 * groups) * d / TP", "params", "memory",
            "add_qkv_bias: the fused QKV projection's bias (split over TP)")
        attention_side.append(" + attention_bias_params_per_block")
    attention_side += [kind.block_params(book, v) for kind in kinds if not kind.beside_norms]
    mixers = attention_side[0] + " + norm_params_per_block" + "".join(attention_side[1:])
    if v.mhc:
        add("mhc_params_per_block", "2 * ((2 + n_hc) * n_hc * n_hc * h + (2 + n_hc) * n_hc + 3)",
            "params", "memory", "mHC pre/post/combination weights of both sub-layers")
        mixers += " + mhc_params_per_block"
    extra = "".join(kind.layer_params(book, v, "".join(attention_side)) for kind in kinds)
    add("dense_mlp_params_per_layer", f"{mats} * h * f / (TP * GTP)"
        + (f" + {_fc1_bias(v, 'f')} / TP + h" if v.bias else ""), "params", "memory",
        f"dense {_mlp_kind(v)} MLP of a non-MoE block" + (", with biases" if v.bias else ""))
    add("embedding_params", "V_pad * h / TP", "params", "memory",
        "word embedding (or output) shard over the padded vocabulary")
    positions = ""
    if v.learned_positions:
        # Megatron-LM dev@d48bd6be megatron/core/models/common/embeddings/
        # language_model_embedding.py LanguageModelEmbedding.__init__: learned_absolute adds a
        # torch.nn.Embedding(max_sequence_length, h), whole on every TP rank, on the embedding stage.
        add("position_embedding_params", "pos_rows * h", "params", "memory",
            "learned absolute position table [max_position_embeddings, h] (replicated over TP)")
        positions = " + has_embedding * position_embedding_params"
    final_norm = "2 * h" if v.layernorm else "h"
    mhc_head = " + n_hc * n_hc * h + n_hc + 1" if v.mhc else ""
    add("final_params", final_norm + mhc_head, "params", "memory",
        "final norm" + (" + mHC head" if v.mhc else ""))
    # Megatron-LM dev@d48bd6be megatron/core/transformer/multi_token_prediction.py
    # MultiTokenPredictionLayer.__init__: enorm, hnorm, the e/h projections, a final norm and,
    # with mHC, its own output contraction head (hc_head_fn [n, n·h], hc_head_base [n], scale).
    mtp_norms = "6 * h" if v.layernorm else "3 * h"
    add("mtp_extra_params_per_layer", f"2 * h * h / TP + {mtp_norms}{mhc_head}", "params", "memory",
        "MTP e/h projections and norms" + (" and mHC head" if v.mhc else "")
        + " (its block is counted with the blocks)")
    add("dense_params_on_rank",
        f"blocks * ({mixers}){extra} + moe_layers * ({moe_dense})"
        " + L_dense * dense_mlp_params_per_layer"
        " + (has_embedding + has_mtp_embedding + has_output_weight) * embedding_params"
        " + has_output * final_params + L_mtp * mtp_extra_params_per_layer" + positions
        + _mixer_only_norm(v), "params", "memory", "parameters reduced over dp_cp")
    add("expert_params_on_rank", "moe_layers * routed_params_per_layer", "params", "memory",
        "routed-expert parameters reduced over expt_dp")
    add("params_on_rank", "dense_params_on_rank + expert_params_on_rank", "params", "memory",
        "all parameters on this rank")
    add("bias_routers", "moe_layers - L_hash" if v.expert_bias else "0", "count", "memory",
        "routers with an expert bias (hash layers have none)")
    if v.gtp or v.muon_tp:
        add("dense_sliced_params", f"blocks * attention_params_per_block{extra}"
            " + moe_layers * shared_params_per_layer + L_dense * dense_mlp_params_per_layer",
            "params", "memory", "dense weight matrices sliced over TP·GTP (attention, CSA/HCA, "
            "shared expert, dense MLP): what GTP rematerialises and Muon's TP gather moves")
        add("dense_replicated_params", "dense_params_on_rank - dense_sliced_params", "params",
            "memory", "dense parameters GTP does not slice (norms, router, mHC, embedding, output, "
            "MTP projections): their grads are all-reduced over gtp_remat")
    if v.fsdp:
        add("bytes_grad", "p", "bytes", "memory", "Megatron-FSDP main grads in the parameters' "
            "dtype (Megatron-LM dev@d48bd6be megatron/training/arguments.py "
            "--megatron-fsdp-main-grads-dtype, default auto)")
    elif v.grads_fp32:
        add("bytes_grad", "4", "bytes", "memory", "fp32 main grads (accumulate_allreduce_grads_in_fp32, "
            "Megatron's default under bf16)")
    else:
        # Megatron-LM dev@d48bd6be megatron/core/distributed/param_and_grad_buffer.py: the grad
        # buffer takes the parameters' dtype unless grad_reduce_in_fp32 (fp16's default, bf16 with
        # grad_reduce_in_bf16 or main_grads_dtype bf16).
        add("bytes_grad", "p", "bytes", "memory", "main grads in the parameters' dtype (no "
            "accumulate_allreduce_grads_in_fp32)")
    shard = v.dist_opt
    by = "Megatron-FSDP" if v.fsdp else "distributed optimizer"
    add("dense_opt_shards", "dp_cp_size / I_opt" if shard else "1", "ranks", "memory",
        f"dense optimizer shards ({by} over dp_cp, per instance)")
    add("expert_opt_shards", "expert_dp / I_opt" if shard else "1", "ranks", "memory",
        f"expert optimizer shards ({by} over expt_dp, per instance)")
    _add_grad_buffer_members(book, v)
    for kind in ("dense", "expert"):
        add(f"{kind}_buffer_params", f"ceiling({kind}_grad_params / pad_{kind}) * pad_{kind}",
            "params", "memory", f"{kind} grad/param buffer: the parameters, the end padded to a "
            f"multiple of pad_{kind} so the distributed optimizer's shards are whole")
        add(f"{kind}_shard_params", f"{kind}_buffer_params / {kind}_opt_shards",
            "params", "memory", f"{kind} buffer elements whose optimizer state this rank owns "
            "(the first shards hold parameters only; padding sits at the buffer's end)")
    _add_tp_replicated(book, v, mtp_norms, mhc_head)
    if v.fp8_weights:
        _add_fp8_params(book, v)


def _mixer_only_norm(v: Variant) -> str:
    """A hybrid model's mixer-only block (Megatron-LM dev@d48bd6be megatron/core/models/hybrid/
    hybrid_block.py HybridStack: one layer per pattern symbol) has its mixer's norm only, not the
    pre-MLP norm a block's two norms count."""
    if not v.mixer_only:
        return ""
    return " - L_nomlp * " + ("2 * h" if v.layernorm else "h")


def _add_grad_buffer_members(book: Book, v: Variant) -> None:
    """Which parameters each grad buffer holds. Routed experts get a buffer of their own only when
    the expert grid differs from the dense one (`Degrees.expert_grad_buffer`: EP > 1, ETP != TP or
    EGTP != GTP; Megatron-LM main@d98e8a64 megatron/core/extensions/transformer_engine.py
    TELinear.__init__ use_expert_pgs, megatron/core/distributed/distributed_data_parallel.py
    DistributedDataParallel.__init__ groups buffers by `not param.allreduce`); otherwise they sit
    in the dense buffer, reduced with it over dp_cp. Frozen groups and LoRA's frozen base are
    not in them (planner/budget/training_modes.py trainable)."""
    dense, expert = ("dense_params_on_rank", "expert_params_on_rank")
    if v.freeze or v.lora or v.tower:
        dense, expert = trainable(book, v)
    if v.expert_buffer:
        book.add("dense_grad_params", dense, "params", "memory",
                 "parameters in the dense grad buffer (reduced over dp_cp)")
        book.add("expert_grad_params", expert, "params", "memory",
                 "parameters in the expert grad buffer (reduced over expt_dp): the expert grid "
                 "differs from the dense one (EP > 1, ETP != TP or EGTP != GTP)")
        return
    book.add("dense_grad_params", f"{dense} + {expert}", "params",
             "memory", "parameters in the dense grad buffer: with EP 1, ETP = TP and EGTP = GTP "
             "the routed experts carry allreduce=True and share it")
    book.add("expert_grad_params", "0", "params", "memory",
             "no expert grad buffer: EP 1, ETP = TP, EGTP = GTP (the experts are in the dense one)")


# The weight matrices of the attention projections alone (no fused norms, biases or sinks).
ATTENTION_LINEAR = {
    **ATTENTION_PARAMS,
    "dsv4_hybrid": "(h * q_lora + q_lora * heads * d + h * d + o_lora * heads * d"
                   " + h * o_groups * o_lora) / (TP * GTP)",
}


def _add_fp8_params(book: Book, v: Variant) -> None:
    """The weights Transformer Engine quantises under FP8: the GEMM weights of its linear layers
    (attention projections, shared and dense MLPs, latent projections, MTP's e/h projection,
    the routed experts' grouped GEMMs). Biases, norms, the router, the embedding and the output
    layer stay in the training precision (Megatron-LM dev@d48bd6be megatron/core/transformer/
    transformer_config.py fp8_param: "primarily the weights of GEMMs"; the output layer is
    Megatron's own ColumnParallelLinear, not a TE module). V4's CSA/HCA compressors and the
    indexer's weight projection are built outside FP8 (megatron/core/transformer/
    experimental_attention_variant/csa.py get_fp8_disabled_context); the indexer's q projection,
    which is FP8, is counted with them in the training precision (approximate)."""
    add, w = book.add, routed_width(v)
    mats = v.mlp_matrices
    # training.first_last_layers_bf16: those blocks are built outside TE's FP8 context (Megatron-LM
    # dev@d48bd6be megatron/core/fp8_utils.py get_fp8_context returns nullcontext for them)
    blocks, moe_layers, dense = (("(blocks - L_bf16)", "(moe_layers - L_moe_bf16)",
                                  "(L_dense - L_dense_bf16)") if v.bf16_layers
                                 else ("blocks", "moe_layers", "L_dense"))
    attention = ATTENTION_LINEAR[v.attention].replace("{q}", MLA_Q[v.mla_q_lora]).replace(
        "{q_norm}", "").replace("{kv_norm}", "")
    moe = f"{mats} * h * I_s / (TP * GTP)" + (" + 2 * h * h_moe" if v.latent else "")
    mixers = f"{blocks} * {attention}"
    if v.has("mamba"):
        # a Mamba-2 layer's GEMMs are in_proj and out_proj (TE linears); conv1d, dt_bias, A_log,
        # D and the gated norm stay in the training precision (Megatron-LM dev@d48bd6be
        # megatron/core/ssm/mamba_mixer.py MambaMixer.__init__)
        mixers = (f"(blocks - L_mamba) * {attention} + L_mamba * (h * (2 * mb_din + 2 * mb_g * mb_n"
                  " + mb_nh) + mb_din * h) / TP")
    if v.has("kda"):
        # a KDA layer's GEMMs: q, k, v, o, beta and the low-rank decay and gate (f_a, g_a whole on
        # every TP rank); its convolutions, dt_bias, A_log and norm stay in the training precision
        mixers = (f"(blocks - L_kda) * {attention} + L_kda * ((h * (4 * kda_d + kda_nh)"
                  " + 2 * kda_dh * kda_d) / TP + 2 * h * kda_dh)")
    add("dense_fp8_params_on_rank", f"{mixers} + {moe_layers} * ({moe})"
        f" + {dense} * {mats} * h * f / (TP * GTP) + L_mtp * 2 * h * h / TP", "params", "memory",
        "dense GEMM weights quantised to FP8 (attention projections" + (", Mamba-2 in/out "
        "projections" if v.has("mamba") else "") + ", shared expert"
        + (", latent projections" if v.latent else "") + ", dense MLP, MTP e/h projection)")
    add("expert_fp8_params_on_rank", f"{moe_layers} * experts_per_rank * {mats} * {w} * I"
        " / (ETP * EGTP)", "params", "memory", "routed-expert GEMM weights quantised to FP8"
        + ("; the BF16 blocks' stay in the training precision" if v.bf16_layers else ""))
    add("fp8_params_on_rank", "dense_fp8_params_on_rank + expert_fp8_params_on_rank", "params",
        "memory", "all weights of the rank Transformer Engine quantises to FP8")


MLA_DUPLICATED = {True: "h * q_lora + q_lora + h * (kv_lora + qk_rope) + kv_lora",
                  False: "h * (kv_lora + qk_rope) + kv_lora"}


def _add_tp_replicated(book: Book, v: Variant, mtp_norms: str, mhc_head: str) -> None:
    """Parameters every TP rank holds whole but trains on its own sequence shard under sequence
    parallelism, so their grads are partial sums over TP (Megatron-LM dev@d48bd6be
    megatron/core/distributed/finalize_model_grads.py _allreduce_non_tensor_model_parallel_grads
    reduces every parameter marked `sequence_parallel`: norms, the router, MLA's duplicated down
    projections and their norms, mHC weights)."""
    per_block = "norm_params_per_block" + (" + mhc_params_per_block" if v.mhc else "")
    kinds = kinds_of(v)
    per_block += "".join(kind.replicated_block(v) for kind in kinds if kind.beside_norms)
    dense_mlp = ""
    if v.bias:
        # Row-parallel biases are whole on every TP rank and marked sequence_parallel (Megatron-LM
        # dev@d48bd6be megatron/core/tensor_parallel/layers.py RowParallelLinear.__init__): the
        # attention output's, the dense MLP's and the shared expert's FC2, and MLA's down
        # projections' (duplicated).
        per_block += " + h" + (" + q_lora + kv_lora + qk_rope" if v.attention == "mla" else "")
        dense_mlp = " + L_dense * h"
    if v.attention == "mla":
        duplicated = MLA_DUPLICATED[v.mla_q_lora]
        if not v.mla_norms:
            duplicated = duplicated.replace(" + q_lora + ", " + ").removesuffix(" + kv_lora")
        elif v.layernorm:  # the latent norms' biases
            duplicated = duplicated.replace(" + q_lora + ", " + 2 * q_lora + ").replace(
                " + kv_lora", " + 2 * kv_lora")
        book.add("mla_duplicated_params_per_block", duplicated, "params", "memory",
                 "MLA down projections (duplicated over TP) and the q/kv norms after them")
        per_block += " + mla_duplicated_params_per_block"
    moe = ("(router_params_per_layer + latent_proj_params_per_layer)" if v.latent
           else "router_params_per_layer")
    if v.shared_gate:
        moe = f"({moe} + shared_gate_params_per_layer)"
    if v.bias:
        moe = f"({moe} + Min(I_s, 1) * h)"
    per_block += "".join(kind.replicated_block(v) for kind in kinds if not kind.beside_norms)
    dense_mlp += "".join(kind.tp_replicated_layers(v) for kind in kinds)
    book.add("tp_replicated_params_on_rank",
             f"blocks * ({per_block}) + moe_layers * {moe}{dense_mlp}"
             " + has_output * final_params + L_mtp * "
             + (f"({mtp_norms}{mhc_head})" if v.mhc else mtp_norms) + _mixer_only_norm(v),
             "params", "memory",
             "parameters replicated over TP whose grads sequence parallelism leaves partial"
             + (" (latent MoE's projections are duplicated over TP: Megatron-LM dev@d48bd6be "
                "megatron/core/transformer/moe/moe_layer.py)" if v.latent else ""))

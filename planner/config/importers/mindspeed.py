"""MindSpeed-LLM launches (Ascend/MindSpeed-LLM's pretrain_gpt.py over Megatron-LM with MindSpeed's
patches), read as MindSpeed-LLM hands them to Megatron-Core.

Its own arguments (Ascend/MindSpeed-LLM@c77308a1 mindspeed_llm/features_manager/, mindspeed_llm/
training/arguments.py) are modelled where they set what a Megatron argument sets:
`--first-k-dense-replace K` makes layer i (0-based) MoE where i >= K and i % moe_layer_freq == 0
(mindspeed_llm/core/transformer/transformer_block.py _transformer_block_build_layers; K = -1, like
moe_layer_freq -1, leaves every layer MoE); `--n-shared-experts N` sets the shared expert width to N x
moe_ffn_hidden_size (features_manager/moe/shared_expert.py); `--noop-layers` at the end of the stack
are identity layers that only pad the last pipeline stage (features_manager/pipeline_parallel/
noop_layers.py), so the model has that many fewer layers and the last stage that many fewer;
`--moe-token-dispatcher-type alltoall_seq` is MindSpeed's all-to-all over the sequence-parallel
split (the alltoall dispatcher's traffic); `--context-parallel-algo` names the CP exchange
(ulysses_cp_algo: all-to-all, megatron_cp_algo: ring, hybrid_cp_algo: both); `--seq-aux` is the
sequence-level auxiliary loss; `--rope-scaling-*` are YaRN's settings under MindSpeed's names. Its
kernel switches are named and not carried; its schedules and offloads are carried, for `check` to
name (planner/config/data/entry_parser_arguments.txt [mindspeed]).
"""

from __future__ import annotations

from planner.config.importers.assemble import FrontEnd
from planner.config.importers.megatron_args import Argument, Unmapped, parse_command
from planner.config.layout_strings import IMPORTED, layout_string

ENTRIES = ("pretrain_gpt.py", "posttrain_gpt.py")
# MindSpeed-LLM arguments that are kernels, data handling or checkpoint conversion: no effect on the
# model or its memory as moeplan counts it
NEUTRAL = ("use_fused_rmsnorm", "use_fused_swiglu", "use_fused_rotary_pos_emb", "moe_permutation_async_comm",
           "gemm_gradient_accumulation_fusion", "no_shared_storage", "use_ascend_coc", "coc_fused_kernel",
           "mla_fa_without_pad", "handler_name", "enable_hf2mg_convert", "model_type_hf", "norm_topk_prob",
           "tokenizer_name_or_path", "beta_fast", "beta_slow", "rope_scaling_mscale",
           "rope_scaling_mscale_all_dim", "use_mcore_models",
           # features_manager/moe/moe_router.py: the router's gating and top-k softmax in fp32 (numerics)
           "router_gating_in_fp32", "topk_softmax_in_fp32",
           # Ascend/MindSpeed@028de58c mindspeed/features_manager/fusions/fused_moe_permute.py (a kernel)
           # and transformer/flash_attention/fusion_attention_feature.py --shape-order (the fused
           # attention's tensor layout)
           "use_fused_moe_token_permute_and_unpermute", "shape_order",
           # Qwen3-Next (features_manager/models/mamba.py, models/module.py, transformer/qwen3_next_
           # attention): the DeltaNet's chunk size and expansion (1: no extra width) and Triton kernel,
           # RMSNorm weights kept in fp32, separate q/k/v projections instead of one fused one (the same
           # weights), and memory/chunk_loss.py's loss mode (default: the whole loss at once)
           "mamba_chunk_size", "mamba_expand", "use_triton_gdn", "rmsnorm_weight_in_fp32",
           "no_enable_linear_qkv")
# mindspeed_llm/tasks/models/spec/qwen3_next_spec.py layer_spec: CustomQwen3NextGatedDeltaNetAttention on
# the linear layers (every --full-attention-interval-th layer full attention), whose convolution has
# --mamba-d-conv taps, and CustomQwen3NextSelfAttention, whose q_proj doubles for a sigmoid output gate
# (qwen3_next_full_attention.py): Megatron dev's gated_delta_net and --attention-output-gate.
QWEN3_NEXT_SPEC = "mindspeed_llm.tasks.models.spec.qwen3_next_spec"
MINIMAX_SPEC = "mindspeed_llm.tasks.models.spec.minimax_spec"
MARKERS = ("first_k_dense_replace", "n_shared_experts", "noop_layers", "context_parallel_algo",
           "use_fused_rmsnorm", "handler_name", "schedules_method", "moe_permutation_async_comm")
_CP_ALGO = {"ulysses_cp_algo": "a2a", "megatron_cp_algo": "p2p", "hybrid_cp_algo": "a2a+p2p"}
_ROPE = {"--rope-scaling-type": "--rope-type", "--rope-scaling-factor": "--rotary-scaling-factor",
         "--rope-scaling-original-max-position-embeddings": "--original-max-position-embeddings"}


def _name(flag: str) -> str:
    return flag[2:].replace("-", "_")


def is_mindspeed(entry: str, argv: list[str]) -> bool:
    return entry.rsplit("/", 1)[-1] in ENTRIES and any(
        w.startswith("--") and _name(w.partition("=")[0]) in MARKERS for w in argv)


def _int(values: tuple[str, ...]) -> int | None:
    return int(values[0]) if len(values) == 1 and values[0].lstrip("-").isdigit() else None


def mindspeed_front_end(front: FrontEnd) -> FrontEnd:
    arguments = parse_command(front.argv).arguments
    given = {a.flag: a.values for a in arguments}
    argv: list[str] = []
    neutral: list[str] = []
    read: list[str] = []
    layers, freq = _int(given.get("--num-layers", ())), _int(given.get("--moe-layer-freq", ("1",)))
    noop = [int(v) for v in ",".join(given.get("--noop-layers", ())).split(",") if v.strip().isdigit()]
    pp = _int(given.get("--pipeline-model-parallel-size", ("1",))) or 1
    dense_first = (_int(given.get("--first-k-dense-replace", ())) or 0) > 0
    no_cp = (_int(given.get("--context-parallel-size", ("1",))) or 1) == 1
    for arg in arguments:
        name = _name(arg.flag)
        if name in NEUTRAL:
            neutral.append(arg.flag)
            continue
        if arg.flag in _ROPE:
            argv += Argument(_ROPE[arg.flag], arg.values).words
            read.append(f"{arg.flag} as {_ROPE[arg.flag]}")
        elif name == "moe_token_dispatcher_type" and arg.values == ("alltoall_seq",):
            argv += [arg.flag, "alltoall"]
            read.append("alltoall_seq as alltoall")
        elif name == "context_parallel_algo" and no_cp:
            neutral.append(" ".join(arg.words))  # no context parallelism: no exchange to name
        elif name == "context_parallel_algo" and arg.values[:1] and arg.values[0] in _CP_ALGO:
            argv += ["--cp-comm-type", _CP_ALGO[arg.values[0]]]
            read.append(f"--context-parallel-algo {arg.values[0]} as a {_CP_ALGO[arg.values[0]]} exchange")
        elif name == "moe_router_load_balancing_type" and arg.values == ("pai_megatron_aux_loss",):
            # mindspeed_llm/tasks/models/common/pai_megatron.py pai_megatron_aux_loss: softmax before the
            # top-k (topk_softmax_with_capacity, use_pre_softmax) and Megatron's switch auxiliary loss
            argv += [arg.flag, "aux_loss"] + ([] if "--moe-router-pre-softmax" in given
                                              else ["--moe-router-pre-softmax"])
            read.append("pai_megatron_aux_loss as aux_loss with --moe-router-pre-softmax")
        elif name == "seq_aux":
            argv += ["--moe-router-load-balancing-type", "seq_aux_loss"]
            read.append("--seq-aux as --moe-router-load-balancing-type seq_aux_loss")
        elif name == "shared_expert_gate" and given.get("--shared-expert-gate-output-dimension",
                                                          ("1",)) == ("1",):
            # features_manager/moe/shared_expert.py: a sigmoid gate of one output on the shared
            # expert, Megatron's --moe-shared-expert-gate (SharedExpertMLP's gate_weight of 1 x hidden)
            argv += ["--moe-shared-expert-gate"]
            read.append("--shared-expert-gate as --moe-shared-expert-gate")
        elif name == "shared_expert_gate_output_dimension" and arg.values == ("1",):
            continue
        elif name == "n_shared_experts":
            width = _int(given.get("--moe-ffn-hidden-size", ())) or _int(given.get("--ffn-hidden-size", ()))
            count = _int(arg.values)
            if width and count and "--moe-shared-expert-intermediate-size" not in given:
                argv += ["--moe-shared-expert-intermediate-size", str(count * width)]
                read.append(f"--n-shared-experts {count} as a shared expert of {count} x {width}")
        elif name == "first_k_dense_replace":
            dense = _int(arg.values)
            if layers and freq and dense is not None and dense > 0:
                real = layers - len(noop)
                pattern = [1 if i >= dense and i % freq == 0 else 0 for i in range(real)]
                argv += ["--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]"]
                read.append(f"--first-k-dense-replace {dense}: the first {dense} layers dense")
        elif name == "noop_layers":
            continue
        elif (name == "num_layers" and noop) or (name == "moe_layer_freq" and dense_first):
            continue  # rewritten above / below
        elif name == "spec" and arg.values[:1] == (QWEN3_NEXT_SPEC,):
            interval = given.get("--full-attention-interval", ("4",))
            conv = given.get("--mamba-d-conv", ("4",))
            argv += ["--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq",
                     *interval, "--linear-conv-kernel-dim", *conv, "--attention-output-gate"]
            read.append(f"--spec {QWEN3_NEXT_SPEC} as Megatron's gated_delta_net (every {interval[0]}th "
                        f"layer gated attention, a {conv[0]}-tap convolution)")
        elif name == "spec" and arg.values[:1] == (MINIMAX_SPEC,):
            # tasks/models/transformer/minimax_attention.py MinimaxAttention: q and k layer norms over
            # kv_channels x heads (and x groups), not per head
            if "--qk-layernorm" in given:
                front.fields["model.qk_layernorm_per_layer"] = True
                read.append(f"--spec {MINIMAX_SPEC}: q and k normalised over all heads at once")
        elif name in ("full_attention_interval", "mamba_d_conv"):
            continue  # read with the spec above
        elif name == "partial_rotary_factor":
            argv += ["--rotary-percent", *arg.values]
            read.append("--partial-rotary-factor as --rotary-percent")
        elif name == "add_rmsnorm_offset":
            # models/module.py: RMSNorm scales by (1 + weight), Megatron's zero-centered gamma
            argv += ["--apply-layernorm-1p"]
            read.append("--add-rmsnorm-offset as --apply-layernorm-1p")
        elif name == "loss_compute_mode" and arg.values == ("default",) or (
                name == "loss_chunk_size" and given.get("--loss-compute-mode", ("default",)) == ("default",)):
            neutral.append(" ".join(arg.words))  # memory/chunk_loss.py: the whole loss at once, as Megatron
        elif name == "spec" and arg.values[:1] and arg.values[0].startswith("mindspeed_llm."):
            neutral.append(" ".join(arg.words))  # MindSpeed's spec of the same Megatron-Core GPT layers
        else:
            argv += arg.words
    if noop and layers:
        real = layers - len(noop)
        argv += ["--num-layers", str(real)]
        per_chunk = _int(given.get("--num-layers-per-virtual-pipeline-stage", ()))
        chunks = layers // per_chunk if per_chunk and layers % per_chunk == 0 else pp
        trailing = noop == list(range(real, layers))
        if trailing and chunks == pp and pp > 1 and layers % pp == 0:
            argv += ["--decoder-last-pipeline-num-layers", str(layers // pp - len(noop))]
            read.append(f"--noop-layers {','.join(map(str, noop))}: {real} layers, the last stage "
                        f"{layers // pp - len(noop)}")
        elif pp > 1 and layers % chunks == 0 and chunks % pp == 0 and all(0 <= n < layers for n in noop):
            # the identity layers keep their slots of the even split (of pp x vpp chunks): each chunk
            # holds its slots less the identity ones, Megatron's --pipeline-model-parallel-layout
            size = layers // chunks
            counts = [size - sum(1 for n in set(noop) if k * size <= n < (k + 1) * size)
                      for k in range(chunks)]
            mtp = _int(given.get("--mtp-num-layers", ("0",))) or 0
            drop = {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"}
            argv = [w for a in parse_command(argv).arguments if a.flag not in drop for w in a.words]
            argv += ["--pipeline-model-parallel-layout", layout_string(counts, mtp, IMPORTED)]
            read.append(f"--noop-layers {','.join(map(str, noop))}: {real} layers over {chunks} chunks of "
                        f"{size} slots less the identity ones ({counts})")
        elif pp == 1:
            read.append(f"--noop-layers {','.join(map(str, noop))}: {real} layers (one stage)")
        else:
            front.notes.append(Unmapped("--noop-layers", ",".join(map(str, noop)), f"identity layers that do "
                                        f"not fit an even split of {layers} slots over {chunks} chunks: not "
                                        "modelled; the layer count is read without them", error=True))
    front.argv = argv
    front.form = f"MindSpeed-LLM launch ({front.entry})"
    if read:
        front.notes.append(Unmapped("(MindSpeed-LLM)", "; ".join(read), "MindSpeed-LLM's arguments read "
                                    "as the Megatron arguments they stand for"))
    if neutral:
        front.notes.append(Unmapped("(MindSpeed-LLM kernels)", " ".join(neutral), "MindSpeed's fused "
                                    "kernels, data handling and checkpoint conversion: not carried (no "
                                    "effect on the model or its memory as counted)"))
    return front

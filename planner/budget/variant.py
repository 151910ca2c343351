"""`Variant`: the structural choices (dispatcher, capacity mode, optimizer, recompute, the layer
kinds present ...) that pick which formula applies; equal variants share one cached formula book.
planner/budget/symbols.py variant_of reads one from a config."""

from __future__ import annotations

from dataclasses import dataclass

# The base mixer of each attention family but standard's (planner/budget/layer_kinds.py records
# them; tests/unit/budget/test_layer_kinds.py holds the two in step).
FAMILY_BASES: dict[str, str] = {"v4_window": "dsv4_hybrid", "mla": "mla"}


@dataclass(frozen=True)
class Variant:
    """Structural choices that select formulas; equal variants share one cached formula book."""
    dispatcher: str
    capacity: str  # "dropless" | "drop" | "pad"
    ep: bool  # EP > 1
    etp: bool  # ETP > 1
    tp_ep: bool  # ETP·EP > 1
    dp_cp: bool  # dense replica group > 1
    edp: bool  # expert replica group > 1
    tp_dp_cp: bool
    pp: bool
    dist_opt: bool
    instances: bool
    # The layer kinds present (planner/budget/layer_kinds.py: one record per name); the attention
    # family and every per-kind choice are read from them
    kinds: frozenset[str]
    mhc: bool
    per_token_loss: bool
    expert_bias: bool
    optimizer: str
    master_copy: bool  # low-precision params keep an fp32 master copy in the optimizer
    recompute: str | None
    recompute_method: str | None
    recompute_modules: frozenset[str]
    mla_q_lora: bool
    aux_counts: str  # load-balancing type whose token counts are all-reduced over tp_cp, or ""
    ncclep: bool = False  # flex dispatcher with the NCCL EP backend (static receive buffers)
    latent: bool = False  # latent MoE: routed rows and routed experts at moe_latent_size
    cp: bool = False  # CP > 1: the kinds' context-parallel exchanges are issued
    fsdp: str = ""  # Megatron-FSDP sharding strategy (data_parallel_sharding_strategy), "" without
    # Megatron-FSDP without gradient accumulation fusion: each gradient copied into its bucket
    fsdp_grad_copy: bool = False
    gtp: bool = False  # GTP > 1: dense weights rematerialised over gtp_remat
    egtp: bool = False  # EGTP > 1: routed-expert weights rematerialised over expt_gtp_remat
    # Muon's tp_mode duplicated with TP or ETP > 1: TP shards of each matrix gathered for Newton-Schulz
    muon_tp: bool = False
    # --check-weight-hash-across-dp-replicas-interval: the host hashes every parameter each N steps
    weight_hash: bool = False
    # --log-num-zeros-in-grad: every optimizer step counts each gradient tensor's zeros
    count_zeros: bool = False
    # the mixed-precision optimizer copies each updated main parameter into the model's with its
    # own kernel (bf16, or the distributed optimizer's shards; not precision-aware, FSDP, offload,
    # fp8_param_gather)
    param_copy_loop: bool = False
    params_norm: bool = False  # --log-params-norm: calc_params_l2_norm after every step
    tp: bool = False  # TP > 1: attention, shared-expert and dense-MLP linears are TP-sharded
    sp: bool = False  # sequence parallelism (with TP > 1)
    # standard attention with fewer query groups than TP: Megatron all-gathers the QKV output over
    # TP (SelfAttention.get_query_key_value_tensors)
    qkv_gather: bool = False
    shared_overlap: bool = False  # moe_shared_expert_overlap: the shared expert's own AG/RS
    dualpipe: bool = False  # overlap.pipeline_schedule dualpipe with PP > 1 (estimate only: V4030)
    global_aux: bool = False  # global_aux_loss balancing (coefficient > 0)
    flex_backend: str = ""  # the flex dispatcher's backend (the schema fills in deepep), "" otherwise
    quant_pad: bool = False  # fp8/fp4: each local expert's rows padded to a multiple of q_align
    virtual_experts: bool = False  # temporary expert replicas (weights moved, grads returned)
    layernorm: bool = False  # normalization LayerNorm (weight + bias) instead of RMSNorm (weight)
    swiglu: bool = True  # SwiGLU MLPs (3 matrices, FC1 2x wide); False: 2 matrices, FC1 1x wide
    bias: bool = False  # add_bias_linear: every linear layer has a bias
    dropout: bool = False  # hidden_dropout > 0: both bias-dropout-adds keep a mask per block
    shared_gate: bool = False  # moe_shared_expert_gate: a [1, h] sigmoid gate on the shared expert
    zero_experts: bool = False  # moe_zero_experts > 0: the router scores Z identity experts too
    router_fp64: bool = False  # moe_router_dtype fp64: router logits and probs in 8 bytes
    mla_norms: bool = True  # MLA's q/kv latent norms (qk_layernorm); False: plain up projections
    # FP8 weights (training.fp8): "" without; else how TE stores a quantised weight: "tensor"
    # (delayed / tensorwise: one scale per tensor), "blockwise" (128x128 block scales), "mxfp8"
    fp8_weights: str = ""
    fp8_transpose: bool = False  # tensor-scaled FP8 on Hopper: a transposed copy for backward
    fp8_param_gather: bool = False  # training.fp8_param_gather: FP8 weights are the parameters
    # ---- learned position table, optimizer state dtypes, grad buffer
    learned_positions: bool = False  # position_embedding_type learned_absolute: a [rows, h] table
    grads_fp32: bool = True  # grad buffers in fp32 (accumulate_allreduce_grads_in_fp32), else p
    # The precision-aware optimizer's bytes per parameter (master, exp_avg, exp_avg_sq), "" without
    precision_aware: tuple[str, str, str] | tuple[()] = ()
    optimizer_offload: bool = False  # optimizer_cpu_offload: a share of the states on the CPU
    qkv_bias: bool = False  # add_qkv_bias without add_bias_linear, standard attention: QKV bias only
    # --- routed experts in a grad buffer of their own (Degrees.expert_grad_buffer)
    expert_buffer: bool = True
    ncclep_zero_copy: bool = False  # main's moe_ncclep_zero_copy: persistent bf16 symmetric buffers
    packed_basis: str = ""  # "" fixed S; "max" / "mean" of training.packed_lengths (THD packing)
    # Current MoE architectures (gpt-oss, GLM-4.5, MiniMax-M2)
    quick_geglu: bool = False  # gated MLPs by --quick-geglu (Megatron's FLOPs figure counts 2 GEMMs)
    # ---- the fine-grained activation offload groups counted
    offload: frozenset[str] = frozenset()
    # hybrid models: some blocks are a mixer alone (no MLP layer, one norm: mixer_only_layers)
    mixer_only: bool = False
    # Megatron's HybridStack (a Mamba stack, DeepSeek-V4): full recompute counts its pattern layers,
    # not blocks
    hybrid_stack: bool = False
    # The allocator's peak: unfused attention keeps the s x s scores ("" flash / fused kernels);
    # the loss's cross-entropy path ("unfused", "native", "te", "linear"); Transformer Engine's
    # GEMM workspaces (transformer_impl transformer_engine) and its grouped-GEMM streams.
    attn_scores: bool = False
    attention_dropout: bool = False
    ce_impl: str = "unfused"
    te: bool = True
    grouped_gemm: bool = False
    # Compute capability 9.0 or later (Hopper, Blackwell): the GEMM workspaces' larger size.
    large_workspaces: bool = True
    # What trains: frozen parameter groups ("dense", "experts") and the LoRA targets (empty without)
    freeze: frozenset[str] = frozenset()
    lora: frozenset[str] = frozenset()
    # An RL inference engine on the same GPUs: "" without; else which sides release their memory
    # in the other's phase ("train", "rollout", both or neither, as "train+rollout" / "none")
    rl: str = ""
    # An encoder tower on the first stage (training.frozen_tower_params / trained_tower_params)
    tower: bool = False
    # FP8 with the first/last N decoder blocks kept in BF16: their GEMM weights have no FP8 copy
    bf16_layers: bool = False
    # Standard attention rotated by YaRN with a concentration factor other than 1: Megatron applies
    # RoPE by its unfused PyTorch path (planner/budget/hardware.py rope_unfused)
    rope_unfused: bool = False
    # Routed experts' gated quick-GELU clamped (--quick-geglu with --activation-func-clamp-value):
    # the clamp runs as PyTorch ops before the fused activation (time.py ACT_CLAMP_LAUNCHES)
    moe_act_clamp: bool = False
    # training.gradient_accumulation_fusion off: the weight-gradient GEMMs write a fresh gradient
    # and the DDP hook adds it into the main grad per microbatch (time.py time_grad_add_bytes)
    wgrad_unfused: bool = False

    def has(self, kind: str) -> bool:
        """The layer kind `kind` is present (some layer runs it, or every attention layer has it)."""
        return kind in self.kinds

    @property
    def attention(self) -> str:
        """The attention family of the kinds present: "standard", "mla" or "dsv4_hybrid"."""
        return next((family for base, family in FAMILY_BASES.items() if base in self.kinds),
                    "standard")

    @property
    def qk_norm(self) -> bool:
        """q and k norms on standard attention, per head or over all heads of the layer."""
        return self.has("qk_norm") or self.has("qk_norm_layer")

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP: gate, up and down under SwiGLU (FC1 twice as wide), FC1 and
        FC2 otherwise."""
        return 3 if self.swiglu else 2


def routed_width(v: Variant) -> str:
    """The symbol for the width of routed token rows: `h_moe` under latent MoE, else `h` (so the
    formulas of a config without latent MoE read exactly as before)."""
    return "h_moe" if v.latent else "h"

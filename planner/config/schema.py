"""The config schema: one pydantic model per YAML section, Megatron-LM argument names in snake_case.

`Config` is the validated, *resolved* job description (presets merged, defaults derived), the single
input of the rule catalog, the grid, the budgets and the compiled plan.
"""



import math
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from planner.config.dsa_share import computes_topk
from planner.config.gpus import DEFAULT_GPU, GPUS, HOSTS
from planner.config.gpus import gpu as gpu_entry
from planner.config.hybrid_pattern import SEGMENT_BREAK, PatternError, read_hybrid_pattern
from planner.config.layer_freq import parse_layer_freq
from planner.config.megatron_releases import DEFAULT_VERSION
from planner.config.presets import PRESETS
from planner.degrees import Degrees
from planner.memo import HashedOnce, HeldByIdentity, Memo, section_key

PosInt = Annotated[int, Field(ge=1)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]

DEFAULT_ORDER = "tp-cp-ep-dp-pp"
VOCAB_DIVISOR = 128  # Megatron's default make_vocab_size_divisible_by
# moeplan lists every layer, rank and expert, so their counts get a ceiling far above any real job.
MAX_LAYERS = 100_000
# DeepSeek-V4: compress ratio 4 is CSA (overlapping compressor + lightning indexer), 0 a window-only
# layer, any other HCA (Megatron-LM dev@d48bd6be megatron/core/transformer/
# experimental_attention_variant/deepseek_v4_hybrid_attention.py).
DSV4_CSA_RATIO = 4
MAX_RANKS = 1 << 20
MAX_EXPERTS = 1 << 16  # the plan lists each rank's experts
# Megatron's defaults for fields that only mean something under a switch; `Config` fills them in
# when that switch is on (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py
# TransformerConfig.moe_flex_dispatcher_backend and TransformerConfig.fp8_recipe). `fp8: true` alone
# has always meant the e4m3 format (Megatron's --fp8-format has no default: naming it turns FP8 on).
DEFAULT_FLEX_BACKEND = "deepep"
DEFAULT_FP8_RECIPE = "delayed"
DEFAULT_FP8_FORMAT = "e4m3"
RankCount = Annotated[int, Field(ge=1, le=MAX_RANKS)]
GPU_NAMES = tuple(GPUS)


class Section(BaseModel):
    """Strict, closed section: unknown keys and wrong YAML types are config errors, not coercions;
    every float is finite (`.inf`/`.nan` would only fail later, inside a budget)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True, frozen=True,
                              allow_inf_nan=False)


def _alias(*names: str) -> Any:
    return Field(default=None, validation_alias=AliasChoices(*names))


def _derived(*names: str) -> Any:
    """A field a validator fills in when the user leaves it unset: None goes in, a validated Config
    never holds it (its own section's validator fills it, or Config / ClusterSection does).

    Typed as the resolved value (pydantic types a `validate_default` default as Any), so readers need
    no fallback; a value filled in this way stays out of `model_fields_set`, so
    `model_dump(exclude_unset=True)` is still what the user wrote (calibrate.with_gpu re-resolves a
    config on another card from it)."""
    return Field(None, validate_default=True, validation_alias=AliasChoices(*names) if names else None)


def _unset_passes(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """None stays None for the enclosing section to fill in (Config._resolve, ClusterSection._from_gpu)."""
    return None if value is None else handler(value)


# What an unset size is, from the model fields validated before it (the schema declares those first).
_SIZES: dict[str, Any] = {
    "num_query_groups": lambda m: m["num_attention_heads"],
    "kv_channels": lambda m: max(1, m["hidden_size"] // m["num_attention_heads"]),
    "ffn_hidden_size": lambda m: 4 * m["hidden_size"],
    "moe_ffn_hidden_size": lambda m: m["ffn_hidden_size"],
    "moe_shared_expert_intermediate_size": lambda m: 0,
    "qk_head_dim": lambda m: m["kv_channels"],
    "v_head_dim": lambda m: m["kv_channels"],
}


class ModelSection(Section):
    preset: Literal["deepseek-v4-pro", "deepseek-v4-flash", "deepseek-v3", "qwen3-30b-a3b",
                    "qwen3-235b-a22b", "mixtral-8x7b",
                    # current MoE architectures
                    "gpt-oss-20b", "gpt-oss-120b", "glm-4.5", "glm-4.5-air", "minimax-m2",
                    "llama-4-scout", "llama-4-maverick", "qwen3-next-80b-a3b",
                    "deepseek-v3.2"] | None = None
    num_layers: Annotated[int, Field(ge=1, le=MAX_LAYERS)]
    hidden_size: PosInt
    num_attention_heads: PosInt
    num_query_groups: PosInt = _derived()  # unset: num_attention_heads (no GQA)
    kv_channels: PosInt = _derived()  # unset: hidden_size / num_attention_heads
    ffn_hidden_size: PosInt = _derived()  # unset: 4 x hidden_size
    vocab_size: PosInt
    max_position_embeddings: PosInt | None = None
    # moeplan's runtime rotates q/k (RoPE); Megatron's own default is a learned table, which MTP
    # refuses (Megatron-LM dev@d48bd6be megatron/training/arguments.py validate_args).
    position_embedding_type: Literal["learned_absolute", "rope", "yarn", "mrope", "relative", "none"] = "rope"
    hidden_dropout: Annotated[float, Field(ge=0, le=1)] = 0.1
    attention_dropout: Annotated[float, Field(ge=0, le=1)] = 0.1
    qk_layernorm: bool = False
    num_experts: Annotated[int, Field(ge=1, le=MAX_EXPERTS)]
    moe_router_topk: PosInt = 2
    moe_ffn_hidden_size: PosInt = _derived()  # unset: ffn_hidden_size
    moe_shared_expert_intermediate_size: NonNegInt = _derived()  # unset: 0, no shared expert
    # An int N (every N-th layer MoE), a 0/1 list, or Megatron's string form "([0]*3+[1]*58)".
    moe_layer_freq: PosInt | list[Literal[0, 1]] = 1
    moe_n_hash_layers: NonNegInt = 0
    mtp_num_layers: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = 0
    mtp_loss_scaling_factor: NonNegFloat = 0.1
    untie_embeddings_and_output_weights: bool = False
    add_bias_linear: bool = False
    moe_router_score_function: Literal["softmax", "sigmoid", "sqrtsoftplus"] = "softmax"
    moe_router_topk_scaling_factor: PosFloat | None = None
    moe_router_enable_expert_bias: bool = False
    moe_router_bias_update_rate: NonNegFloat = 1e-3
    moe_router_num_groups: PosInt | None = None
    moe_router_group_topk: PosInt | None = None
    moe_router_pre_softmax: bool = False
    swiglu_limit: PosFloat | None = None
    norm_epsilon: PosFloat = 1e-6
    attention_variant: Literal["standard", "mla", "dsv4_hybrid"] = "standard"
    q_lora_rank: PosInt | None = None
    kv_lora_rank: PosInt | None = None
    qk_pos_emb_head_dim: NonNegInt = 0
    # MLA head dims, as Megatron's MLATransformerConfig: q/k heads are qk_head_dim (no RoPE) +
    # qk_pos_emb_head_dim (RoPE) wide, v heads v_head_dim (Megatron-LM dev@d48bd6be
    # megatron/core/transformer/multi_latent_attention.py MultiLatentAttention.__init__). Unset,
    # both fall back to kv_channels.
    multi_latent_attention: bool | None = None
    qk_head_dim: PosInt = _derived()
    v_head_dim: PosInt = _derived()
    group_query_attention: bool | None = None
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    swiglu: bool = True
    make_vocab_size_divisible_by: PosInt = VOCAB_DIVISOR
    moe_router_dtype: Literal["fp32", "fp64"] | None = None
    moe_shared_expert_gate: bool = False
    # LongCat-Flash (Hugging Face LongcatFlashMoE; no Megatron argument, `emit megatron` refuses
    # both): moe_zero_experts zero-computation experts beside the routed ones, each an identity that
    # returns its token times its routing weight, so they add only router rows ((E + Z) x h); and
    # the shortcut MoE (moe_shortcut): each MoE layer's block reads that layer's MLP input and adds
    # its output after the next layer's MLP, the layers paired as [MoE + dense MLP, dense MLP]
    # (the same parameters, FLOPs and stored tensors as the shared-expert layout moeplan prices).
    moe_zero_experts: NonNegInt = 0
    moe_shortcut: bool = False
    # RoPE / YaRN, named as Megatron's arguments. Numerics only: rotary embeddings hold no parameters
    # and no activation memory that moeplan budgets; the runtime's attention rotates by rotary_base.
    # DSv4 attention rotates window-only layers by rotary_base (plain RoPE) and CSA/HCA layers by
    # csa_compress_rotary_base with YaRN: rotary_scaling_factor over original_max_position_embeddings,
    # beta_fast 32 / beta_slow 1 fixed (Megatron-LM dev@d48bd6be megatron/core/transformer/
    # experimental_attention_variant/deepseek_v4_hybrid_attention.py, MLATransformerConfig defaults).
    # rope_type None keeps Megatron's default (yarn for MLA); 'yarn' needs an MLA attention variant.
    rope_type: Literal["rope", "yarn"] | None = None
    rotary_base: PosInt = 10000
    rotary_scaling_factor: PosFloat = 1.0
    original_max_position_embeddings: PosInt = 4096
    csa_compress_rotary_base: PosFloat = 40000.0
    o_groups: PosInt | None = None
    o_lora_rank: PosInt | None = None
    csa_window_size: PosInt | None = None
    index_n_heads: PosInt | None = None
    index_head_dim: PosInt | None = None
    index_topk: PosInt | None = None
    compress_ratios: list[NonNegInt] | None = None
    enable_hyper_connections: bool = False
    num_residual_streams: PosInt = 1
    mhc_sinkhorn_iterations: PosInt = 20
    # ---- position embeddings and vocabulary as launch scripts give them.
    # --rotary-percent: the share of each head's dimensions RoPE rotates (numerics only: no
    # parameters, no stored activations; Megatron-LM dev@d48bd6be megatron/core/models/gpt/
    # gpt_model.py GPTModel.__init__ passes it to RotaryEmbedding).
    rotary_percent: Annotated[float, Field(gt=0, le=1)] = 1.0
    # --padded-vocab-size: the embedding and output rows as given, instead of vocab_size rounded up
    # (Megatron-LM dev@d48bd6be megatron/core/tokenizers/utils/build_tokenizer.py
    # _set_padded_vocab_size pads only when it is unset).
    padded_vocab_size: PosInt | None = None
    # --add-qkv-bias: a bias on the fused QKV projection alone (Qwen2; Megatron-LM dev@d48bd6be
    # megatron/core/transformer/attention.py SelfAttention.__init__: bias=add_bias_linear or
    # add_qkv_bias); MLA's projections ignore it.
    add_qkv_bias: bool = False
    # ---- Current MoE architectures (gpt-oss, GLM-4.5, MiniMax-M2): fields named as Megatron-LM
    # dev@d48bd6be megatron/core/transformer/transformer_config.py TransformerConfig (and its
    # arguments). softmax_type 'learnable' gives every attention layer one sink logit per head
    # (megatron/core/transformer/dot_product_attention.py DotProductAttention.softmax_offset);
    # 'off-by-one' adds a fixed zero logit, no parameter.
    softmax_type: Literal["vanilla", "off-by-one", "learnable"] = "vanilla"
    # Sliding-window attention: window_size (left, right) keys, e.g. [128, 0]; window_attn_skip_freq
    # N makes every N-th layer (1-based) full attention, a 1/0 list marks window layers with 1
    # (megatron/core/transformer/utils.py is_layer_window_attention). Unset: every layer windowed.
    window_size: Annotated[list[NonNegInt], Field(min_length=2, max_length=2)] | None = None
    window_attn_skip_freq: PosInt | list[Literal[0, 1]] | None = None
    # The sliding-window layers' own query-head count (Laguna-XS.2 and Step-3.5-Flash give them
    # more heads than their full-attention layers, the same KV groups and head dim). No Megatron
    # argument: Megatron-LM builds one num_attention_heads for every layer; Megatron-Bridge's
    # Step35DecoderLayer overrides it per sliding layer (stepfun/step35_provider.py), so `emit
    # megatron` refuses it. Unset: the window layers have num_attention_heads.
    window_num_attention_heads: PosInt | None = None
    # The sliding-window layers' own KV groups (MiMo-V2-Flash: 8 on its window layers, 4 on its
    # full ones) and the full layers' softmax where only the window layers carry learnable sinks
    # (full_attention_softmax_type vanilla beside softmax_type learnable). No Megatron argument:
    # Megatron-LM builds one num_query_groups and one softmax_type for every layer; Megatron-Bridge's
    # MiMoV2FlashSelfAttention / MiMoV2FlashTEDotProductAttention switch them per layer
    # (mimo_v2_flash/modeling_mimo_v2_flash.py), so `emit megatron` refuses them. With standard
    # attention, a v_head_dim apart from kv_channels gives the value heads their own width (the
    # same module's asymmetric V). Unset: the model's num_query_groups and softmax_type.
    window_num_query_groups: PosInt | None = None
    full_attention_softmax_type: Literal["vanilla"] | None = None
    # Gemma-4 (Hugging Face Gemma4TextAttention / Gemma4TextDecoderLayer; Megatron-LM builds none
    # of it, `emit megatron` refuses it): the window layers' own q/k and value head width
    # (window_kv_channels: 256 beside the full layers' 512), full-attention layers whose V is
    # their K (attention_k_eq_v: no v rows), norms on the attention and MLP outputs
    # (post_sublayer_norms), and an MoE layer's own norms on its shared branch's output and the
    # experts' input and output with the router's input and per-expert scales (moe_branch_norms).
    window_kv_channels: PosInt | None = None
    attention_k_eq_v: bool = False
    # MiniMax-M3's block-sparse attention (Hugging Face MiniMaxM3VLIndexer; no Megatron argument,
    # `emit megatron` refuses it): on the layers marked 1, a lightning indexer of index_n_heads
    # heads of index_head_dim (one shared key) scores every causal key, and the attention reads the
    # index_topk_blocks blocks of index_block_size keys it picks.
    index_sparse_layers: list[Literal[0, 1]] | None = None
    index_block_size: PosInt | None = None
    index_topk_blocks: PosInt | None = None
    post_sublayer_norms: bool = False
    moe_branch_norms: bool = False
    # --quick-geglu: gated MLP with x·sigmoid(1.702x) (megatron/training/argument_utils.py
    # core_transformer_config_from_args: gated_linear_unit, quick_gelu; it refuses --swiglu with it);
    # glu_linear_offset is added to the linear half (gpt-oss: 1.0), clamped by swiglu_limit.
    quick_geglu: bool = False
    glu_linear_offset: float = 0.0
    # --squared-relu: non-gated MLPs with relu(x)² (Nemotron-H, Nemotron-3); the shapes, FLOPs and
    # stored tensors of a non-gated MLP (Megatron-LM dev@d48bd6be megatron/training/arguments.py
    # core_transformer_config_from_args asserts `not args.swiglu` with it).
    squared_relu: bool = False
    # MiniMax-M2 normalises q and k over all heads of the layer at once (one RMSNorm of heads·d and
    # one of groups·d) instead of per head. Megatron has no such norm (its qk_layernorm is per head:
    # megatron/core/transformer/attention.py SelfAttention.__init__), hence no Megatron name:
    # moeplan budgets it and `emit megatron` refuses it (EMT010).
    qk_layernorm_per_layer: bool = False
    # Llama 4: --no-rope-freq N skips RoPE on every N-th layer (1-based), a 1/0 list marks NoPE
    # layers with 1 (TransformerConfig.no_rope_freq); --qk-l2-norm normalises q and k by their L2
    # norm, no parameters (megatron/core/transformer/attention.py SelfAttention: L2Norm).
    no_rope_freq: PosInt | list[Literal[0, 1]] | None = None
    qk_l2_norm: bool = False
    # Llama 4's chunked attention on its RoPE layers: a query reads only the keys of its own
    # attention_chunk_size-token chunk (Hugging Face's name; Megatron has none: at seq_length <=
    # attention_chunk_size it is plain causal attention, beyond it `emit megatron` refuses, EMT010).
    attention_chunk_size: PosInt | None = None
    # Qwen3-Next: gated DeltaNet linear attention (Megatron's experimental_attention_variant
    # gated_delta_net, written by `emit megatron` when linear_attention_freq is set) on every layer
    # but each linear_attention_freq-th (1-based; a list marks linear layers with 1), whose
    # standard attention is gated (attention_output_gate: a sigmoid gate of heads·d fused into the
    # q/k/v projection). Dims and defaults as TransformerConfig's linear_* fields
    # (megatron/core/ssm/gated_delta_net/common.py _GDNBase.__init__).
    linear_attention_freq: PosInt | list[Literal[0, 1]] | None = None
    linear_conv_kernel_dim: PosInt = 4
    linear_key_head_dim: PosInt = 128
    linear_value_head_dim: PosInt = 128
    linear_num_key_heads: PosInt = 16
    linear_num_value_heads: PosInt = 32
    attention_output_gate: bool = False
    # Step-3.5-Flash's per-head gate: one sigmoid scalar per attention head, its rows appended to
    # linear_qkv (Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py
    # SelfAttention.__init__); Megatron refuses it beside attention_output_gate.
    head_wise_attn_gate: bool = False
    # DeepSeek-V3.2's DSA (Megatron's experimental_attention_variant dsa): MLA whose queries attend
    # the index_topk keys a lightning indexer picks. Written with attention_variant mla and the
    # indexer fields index_n_heads / index_head_dim / index_topk (Megatron's --dsa-indexer-*).
    dsa: bool = False
    # DSA top-k shared across layers (GLM-5.2): with dsa_indexer_topk_freq > 1 only every freq-th
    # layer after the offset computes its own top-k and builds an indexer; the layers between reuse
    # the last one's picks (`dsa_computes_topk`; Megatron-LM dev@d48bd6be megatron/core/transformer/
    # experimental_attention_variant/dsa.py is_dsa_skip_topk_layer). Megatron's names and defaults.
    dsa_indexer_topk_freq: PosInt = 1
    dsa_indexer_skip_topk_offset: NonNegInt = 0
    # A hybrid model's Mamba-2 mixer layers (Megatron-LM dev@d48bd6be megatron/core/ssm/
    # mamba_mixer.py MambaMixer, `M` in --hybrid-layer-pattern): 1 per decoder block whose mixer is
    # Mamba-2 instead of attention (planner/config/hybrid_pattern.py reads a pattern into it). Dims
    # named and defaulted as TransformerConfig's mamba_* fields; unset mamba_num_heads means
    # hidden_size * 2 // mamba_head_dim heads (MambaMixer's expand=2).
    mamba_layers: list[Literal[0, 1]] | None = None
    # Megatron's --hybrid-layer-pattern as written (one symbol per Megatron layer, `/` before each
    # MTP depth; no `|`: the pipeline split is parallel.pipeline_model_parallel_layout's): it fills
    # num_layers (blocks), mamba_layers, mixer_only_layers, moe_layer_freq and mtp_num_layers (or
    # DeepSeek-V4's compress_ratios) once, in `_hybrid_pattern`; a field written beside it must agree.
    hybrid_layer_pattern: str | None = None
    # 1 per decoder block of a hybrid model that is its mixer alone: the pattern puts the next
    # mixer right after it (Nemotron-3's `M*`), so the block has no MLP layer and one norm.
    mixer_only_layers: list[Literal[0, 1]] | None = None
    mamba_state_dim: PosInt = 128
    mamba_head_dim: PosInt = 64
    mamba_num_groups: PosInt = 8
    mamba_num_heads: PosInt | None = None
    # Kimi-Linear's Kimi Delta Attention (KDA): 1 per decoder layer whose mixer is KDA instead of
    # the model's MLA (transformers modeling_kimi_linear.py KimiLinearDeltaAttention; Megatron-LM
    # dev has no KDA layer, so `emit megatron` refuses it, EMT010). Heads and head width as
    # KimiLinearConfig's linear_num_heads / linear_head_dim (q, k and v alike); the short
    # convolution's taps are linear_conv_kernel_dim.
    kda_layers: list[Literal[0, 1]] | None = None
    kda_num_heads: PosInt = 32
    kda_head_dim: PosInt = 128

    @field_validator("moe_layer_freq", "window_attn_skip_freq", "no_rope_freq", "linear_attention_freq",
                     mode="before")
    @classmethod
    def _megatron_freq(cls, value: Any) -> Any:
        """Megatron's string spellings: "N" or a list expression such as "([0]*3+[1]*58)"."""
        return parse_layer_freq(value) if isinstance(value, str) else value

    @field_validator(*_SIZES, mode="wrap")
    @classmethod
    def _sizes(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        """Megatron's defaults for the head and FFN sizes (Megatron-LM dev@d48bd6be
        megatron/training/arguments.py validate_args: ffn_hidden_size 4h, kv_channels h / heads;
        megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__:
        num_query_groups = heads, moe_ffn_hidden_size = ffn_hidden_size), from the fields declared
        above them."""
        if value is not None:
            return handler(value)
        try:
            derived = _SIZES[str(info.field_name)](info.data)
        except KeyError:  # a field it derives from is invalid: that error is the one to show
            return None
        return None if derived is None else handler(derived)  # None: derived from one left None

    @field_validator("head_wise_attn_gate")
    @classmethod
    def _one_attention_gate(cls, value: bool, info: ValidationInfo) -> bool:
        """Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py
        TransformerConfig.__post_init__: the two gates' linear_qkv row layouts are incompatible."""
        if value and info.data.get("attention_output_gate"):
            raise PydanticCustomError(
                "two_attention_gates",
                "model.attention_output_gate is true as well: Megatron takes one attention gate "
                "(their linear_qkv row layouts are incompatible)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _quick_geglu(cls, data: Any) -> Any:
        """--quick-geglu replaces SwiGLU (Megatron asserts `not args.swiglu` with it), so it turns
        moeplan's swiglu default off; swiglu: true written beside it is refused."""
        if not isinstance(data, dict) or data.get("quick_geglu") is not True:
            return data
        if data.get("swiglu") is True:
            raise PydanticCustomError(
                "quick_geglu_swiglu",
                "model.quick_geglu and model.swiglu are both true: Megatron takes one gated "
                "activation (drop swiglu)")
        return {**data, "swiglu": False}

    @model_validator(mode="before")
    @classmethod
    def _hybrid_pattern(cls, data: Any) -> Any:
        """Megatron's pattern read once into the block fields the pages read (planner/config/
        hybrid_pattern.py); what it cannot pair, or a field that says otherwise, is refused."""
        if not isinstance(data, dict) or not isinstance(data.get("hybrid_layer_pattern"), str):
            return data
        pattern = data["hybrid_layer_pattern"]
        if SEGMENT_BREAK in pattern:
            raise PydanticCustomError(
                "hybrid_pattern_segments", "model.hybrid_layer_pattern {pattern!r} holds pipeline "
                "segments ('|'): write the model's pattern here and the split in "
                "parallel.pipeline_model_parallel_layout", {"pattern": pattern})
        try:
            decoded = read_hybrid_pattern(pattern)
        except PatternError as exc:
            raise PydanticCustomError("hybrid_pattern", "model.hybrid_layer_pattern {pattern!r}: "
                                      "{why}", {"pattern": pattern, "why": str(exc)}) from None
        fields: dict[str, Any] = {"num_layers": decoded["num_layers"], "moe_layer_freq": decoded["moe"],
                                  "mtp_num_layers": decoded["mtp_num_layers"]}
        if "mamba_layers" in decoded:
            fields |= {"mamba_layers": decoded["mamba_layers"],
                       "mixer_only_layers": decoded["mixer_only_layers"]}
        else:  # W/C/H layers are DeepSeek-V4 attention: never read as standard attention
            fields |= {"compress_ratios": decoded["compress_ratios"], "attention_variant": "dsv4_hybrid"}
        for name, value in fields.items():
            given = data.get(name)
            if name == "moe_layer_freq" and isinstance(given, (int, str)):
                given = parse_layer_freq(given) if isinstance(given, str) else given
                given = [1 if i % given == 0 else 0 for i in range(len(value))] if isinstance(
                    given, int) else given
            if given is not None and given != value:
                raise PydanticCustomError(
                    "hybrid_pattern_conflict", "model.{field} {given} contradicts "
                    "model.hybrid_layer_pattern, which gives {value}: drop one of them",
                    {"field": name, "given": str(given), "value": str(value)})
        return {**data, **fields}

    @model_validator(mode="before")
    @classmethod
    def _squared_relu(cls, data: Any) -> Any:
        """--squared-relu is a non-gated activation: it turns moeplan's swiglu default off; swiglu:
        true beside it is refused, as Megatron asserts."""
        if not isinstance(data, dict) or data.get("squared_relu") is not True:
            return data
        if data.get("swiglu") is True or data.get("quick_geglu") is True:
            raise PydanticCustomError(
                "squared_relu_gated", "model.squared_relu with a gated activation (swiglu or "
                "quick_geglu): Megatron takes one activation (drop the gated one)")
        return {**data, "swiglu": False}

    @model_validator(mode="before")
    @classmethod
    def _latent_attention(cls, data: Any) -> Any:
        """multi_latent_attention: true is Megatron's spelling of attention_variant mla (DSv4's
        hybrid attention is MLA-based too); a contradiction is refused, not resolved."""
        if not isinstance(data, dict) or not isinstance(data.get("multi_latent_attention"), bool):
            return data
        mla, variant = data["multi_latent_attention"], data.get("attention_variant")
        if mla and variant is None:
            return {**data, "attention_variant": "mla"}
        if (mla and variant == "standard") or (not mla and variant in ("mla", "dsv4_hybrid")):
            raise PydanticCustomError(
                "attention_conflict",
                "multi_latent_attention {mla} contradicts attention_variant {variant}",
                {"mla": str(mla).lower(), "variant": variant},
            )
        return data

    @model_validator(mode="after")
    def _derive(self) -> "ModelSection":
        if self.attention_variant == "mla" and self.kv_lora_rank is None:
            raise PydanticCustomError(
                "mla_kv_lora_missing",
                "attention_variant mla needs model.kv_lora_rank (Megatron's MLA compresses K/V "
                "through it; without it the KV path has no size)",
            )
        if (self.group_query_attention is False and self.attention_variant == "standard"
                and self.num_query_groups != self.num_attention_heads):
            raise PydanticCustomError(
                "gqa_conflict",
                "group_query_attention false but num_query_groups {groups} differs from "
                "num_attention_heads {heads}",
                {"groups": self.num_query_groups, "heads": self.num_attention_heads},
            )
        if self.dsa and (self.attention_variant != "mla" or None in (
                self.index_n_heads, self.index_head_dim, self.index_topk)):
            raise PydanticCustomError(
                "dsa_fields", "model.dsa needs attention_variant mla and model.index_n_heads, "
                "index_head_dim and index_topk (Megatron's DSA is MLA with a lightning indexer)")
        if self.dsa_indexer_topk_freq > 1 and not self.dsa:
            raise PydanticCustomError(
                "dsa_topk_share", "model.dsa_indexer_topk_freq {freq} shares DSA top-k across "
                "layers but model.dsa is false; set model.dsa: true or dsa_indexer_topk_freq: 1",
                {"freq": self.dsa_indexer_topk_freq})
        if self.dsa_indexer_topk_freq > 1 and any(self.mamba_layers or []):
            # Megatron's hybrid stack numbers every pattern symbol as a layer, moeplan's count
            # numbers decoder blocks: the shared layers would differ
            raise PydanticCustomError(
                "dsa_topk_share_hybrid", "model.dsa_indexer_topk_freq {freq} with Mamba layers: "
                "moeplan does not model DSA top-k sharing in a hybrid stack; set "
                "dsa_indexer_topk_freq: 1", {"freq": self.dsa_indexer_topk_freq})
        if self.qk_layernorm_per_layer and not self.qk_layernorm:
            raise PydanticCustomError(
                "qk_norm_scope", "model.qk_layernorm_per_layer needs model.qk_layernorm: true")
        pattern = self.moe_layer_freq  # Megatron-LM dev@d48bd6be megatron/core/models/gpt/
        # gpt_layer_specs.py get_gpt_decoder_layer_specs asserts one entry per layer
        if isinstance(pattern, list) and len(pattern) != self.num_layers:
            raise PydanticCustomError(
                "moe_pattern_length",
                "model.moe_layer_freq lists {found} layers, the model has {layers}: give one 1 "
                "(MoE) or 0 (dense) per layer",
                {"found": len(pattern), "layers": self.num_layers})
        skip = self.window_attn_skip_freq
        if isinstance(skip, list) and len(skip) != self.num_layers:
            raise PydanticCustomError(
                "window_pattern_length",
                "model.window_attn_skip_freq lists {found} layers, the model has {layers}: give "
                "one 1 (window) or 0 (full) per layer",
                {"found": len(skip), "layers": self.num_layers})
        if self.window_num_attention_heads is not None:
            self._check_window_heads()
        if self.index_sparse_layers is not None:
            self._check_index_sparse()
        if self.mamba_layers is not None or self.mixer_only_layers is not None:
            self._check_mamba()
        if self.kda_layers is not None:
            self._check_kda()
        derived = {
            # Megatron's GQA switch concerns standard attention; MLA and DSv4 attention ignore it.
            "group_query_attention": (
                self.group_query_attention if self.group_query_attention is not None
                else self.attention_variant == "standard"
                and self.num_query_groups != self.num_attention_heads),
            "multi_latent_attention": self.attention_variant in ("mla", "dsv4_hybrid"),
        }
        for key, value in derived.items():
            object.__setattr__(self, key, value)
        return self

    @property
    def mhc_expansion(self) -> int:
        """Width multiplier of the residual stream (1 when mHC is off)."""
        return self.num_residual_streams if self.enable_hyper_connections else 1

    @property
    def gated_mlp(self) -> bool:
        """Megatron's gated_linear_unit: SwiGLU or quick-GEGLU (FC1 twice as wide)."""
        return self.swiglu or self.quick_geglu

    @property
    def mamba_heads(self) -> int:
        """Mamba-2 heads (MambaMixer.__init__: mamba_num_heads, else d_inner // mamba_head_dim
        with d_inner = expand (2) * hidden_size)."""
        return self.mamba_num_heads or 2 * self.hidden_size // self.mamba_head_dim

    @property
    def mamba_d_inner(self) -> int:
        """Mamba-2 inner width: heads * head dim (MambaMixer.__init__)."""
        return self.mamba_heads * self.mamba_head_dim

    def _check_mamba(self) -> None:
        """What MambaMixer.__init__ asserts of its dims, and what moeplan does not model beside it
        (refused by name, never priced as something else)."""
        for name, given in (("mamba_layers", self.mamba_layers),
                            ("mixer_only_layers", self.mixer_only_layers)):
            if given is not None and len(given) != self.num_layers:
                raise PydanticCustomError(
                    "mamba_pattern_length", "model.{field} lists {found} layers, the model has "
                    "{layers}: give one 1 or 0 per decoder layer",
                    {"field": name, "found": len(given), "layers": self.num_layers})
        if 1 not in (self.mamba_layers or []) + (self.mixer_only_layers or []):
            return
        if self.enable_hyper_connections:
            raise PydanticCustomError(
                "mamba_mhc", "model.mamba_layers or mixer_only_layers with "
                "enable_hyper_connections: moeplan models mHC on DeepSeek-V4 stacks only")
        if self.mamba_num_heads is None and (2 * self.hidden_size) % self.mamba_head_dim:
            raise PydanticCustomError(
                "mamba_head_dim", "model.mamba_head_dim {dim} does not divide d_inner {inner} "
                "(2 * hidden_size): set mamba_num_heads or a dividing head dim",
                {"dim": self.mamba_head_dim, "inner": 2 * self.hidden_size})
        if self.mamba_heads % self.mamba_num_groups:
            raise PydanticCustomError(
                "mamba_groups", "model.mamba_num_groups {groups} does not divide the {heads} "
                "Mamba heads (MambaMixer asserts nheads % ngroups == 0)",
                {"groups": self.mamba_num_groups, "heads": self.mamba_heads})
        if self.attention_variant != "standard":
            raise PydanticCustomError(
                "mamba_attention", "model.mamba_layers with attention_variant {variant}: moeplan "
                "models Mamba-2 beside standard attention (`*`) only",
                {"variant": self.attention_variant})
        if self.mtp_num_layers and not self.is_moe_layer(self.num_layers - 1):
            raise PydanticCustomError(
                "mamba_mtp", "model.mtp_num_layers {mtp} in a hybrid model whose last decoder block "
                "is not MoE: moeplan models a hybrid MTP depth as attention then MoE (`*E`, "
                "Nemotron-3-Super's), after a MoE block", {"mtp": self.mtp_num_layers})
        others = [name for name, on in (
            ("linear_attention_freq", self.linear_attention_freq is not None),
            ("window_size", self.window_size is not None),
            ("attention_chunk_size", self.attention_chunk_size is not None)) if on]
        if others:
            raise PydanticCustomError(
                "mamba_mixers", "model.mamba_layers beside model.{field}: moeplan models a hybrid "
                "stack of Mamba-2 and full attention layers only", {"field": others[0]})

    def _check_kda(self) -> None:
        """KDA layers sit among MLA layers (Kimi-Linear's stack), one 0/1 per decoder layer; moeplan
        models them beside no other mixer kind."""
        flags = self.kda_layers or []
        if self.attention_variant != "mla" or len(flags) != self.num_layers:
            raise PydanticCustomError(
                "kda_layers", "model.kda_layers needs attention_variant mla (Kimi-Linear's KDA "
                "layers sit among MLA layers) and one 0/1 per decoder layer ({layers}; found "
                "{found})", {"layers": self.num_layers, "found": len(flags)})
        others = [name for name, on in (
            ("dsa", self.dsa), ("linear_attention_freq", self.linear_attention_freq is not None),
            ("mamba_layers", self.mamba_layers is not None)) if on]
        if others:
            raise PydanticCustomError(
                "kda_mixers", "model.kda_layers beside model.{field}: moeplan models KDA among "
                "plain MLA layers only", {"field": others[0]})

    def _check_index_sparse(self) -> None:
        """Block-sparse layers need standard attention, one flag per layer, and the indexer's
        sizes."""
        flags = self.index_sparse_layers or []
        missing = [name for name in ("index_n_heads", "index_head_dim", "index_block_size",
                                     "index_topk_blocks") if getattr(self, name) is None]
        if self.attention_variant != "standard" or len(flags) != self.num_layers or missing \
                or self.window_size is not None or self.attention_chunk_size is not None:
            raise PydanticCustomError(
                "index_sparse_fields", "model.index_sparse_layers needs standard attention without "
                "windows or chunks, one 0/1 per layer ({layers}; found {found}) and "
                "model.index_n_heads, index_head_dim, index_block_size and index_topk_blocks"
                "{missing}", {"layers": self.num_layers, "found": len(flags),
                              "missing": f" (missing: {', '.join(missing)})" if missing else ""})

    def _check_window_heads(self) -> None:
        """The window layers' own head count needs window layers of standard attention and whole
        query groups (the KV groups are the model's)."""
        heads = self.window_num_attention_heads
        if self.window_size is None or self.attention_variant != "standard":
            raise PydanticCustomError(
                "window_heads_without_window", "model.window_num_attention_heads {heads} needs "
                "sliding-window layers of standard attention (model.window_size); remove it or set "
                "the window", {"heads": heads})
        groups = self.num_query_groups
        if heads is not None and heads % groups:
            raise PydanticCustomError(
                "window_heads_groups", "model.window_num_attention_heads {heads} is not a multiple "
                "of the {groups} query groups its window layers share with the others",
                {"heads": heads, "groups": groups})

    def is_window_layer(self, layer: int) -> bool:
        """Sliding-window attention on 0-based `layer`, as Megatron's is_layer_window_attention
        decides it for layer number layer + 1."""
        if self.window_size is None:
            return False
        skip = self.window_attn_skip_freq
        if skip is None:
            return True
        if isinstance(skip, int):
            return (layer + 1) % skip != 0
        return layer < len(skip) and skip[layer] == 1

    def no_rope_layers(self) -> list[int] | None:
        """no_rope_freq as TransformerConfig.__post_init__ holds it: one 0/1 per layer (1 = NoPE),
        an int N expanded; None without it."""
        if self.no_rope_freq is None:
            return None
        return [int(not self.is_rope_layer(layer)) for layer in range(self.num_layers)]

    def dsa_computes_topk(self, layer: int) -> bool:
        """The 0-based `layer` (MTP layers numbered from num_layers on) builds its own DSA indexer
        and computes its top-k; False on a layer that reuses an earlier layer's (Megatron-LM
        dev@d48bd6be megatron/core/transformer/experimental_attention_variant/dsa.py
        is_dsa_skip_topk_layer on the 1-based layer number, an MTP depth's counted after
        num_layers as DSAttention.__init__ counts it). Without DSA no layer has an indexer."""
        return self.dsa and computes_topk(layer, self.dsa_indexer_topk_freq,
                                          self.dsa_indexer_skip_topk_offset)

    def is_rope_layer(self, layer: int) -> bool:
        """RoPE on 0-based `layer` (Megatron's no_rope_freq: N skips layer numbers divisible by N)."""
        skip = self.no_rope_freq
        if skip is None:
            return True
        if isinstance(skip, int):
            return (layer + 1) % skip != 0
        return not (layer < len(skip) and skip[layer] == 1)

    def is_linear_attention_layer(self, layer: int) -> bool:
        """Gated DeltaNet on 0-based `layer` (Megatron-LM dev@d48bd6be megatron/training/training.py
        num_floating_point_operations: an int N makes layer numbers divisible by N standard)."""
        freq = self.linear_attention_freq
        if freq is None:
            return False
        if isinstance(freq, int):
            return (layer + 1) % freq != 0
        return layer < len(freq) and freq[layer] == 1

    def is_chunked_layer(self, layer: int) -> bool:
        """Chunked attention on 0-based `layer`: Llama 4 chunks its RoPE layers' attention."""
        return self.attention_chunk_size is not None and self.is_rope_layer(layer)

    @property
    def layer_mixers(self) -> tuple[str, ...]:
        """The token-mixer kind of every decoder and MTP layer (0-based; MTP layers numbered from
        num_layers on, as Megatron's num_floating_point_operations numbers them), resolved once
        per model shape for the budget pages (planner/budget/layer_kinds.py holds one record per
        name). A gated DeltaNet layer is not also a window or chunked one; window and chunked
        attention are decoder-layer choices (MTP layers attend in full). Remembered by the
        section's values, not on the instance: model_copy(update=...) must not keep a stale
        sequence."""
        return _LAYER_MIXERS.get(section_key(self), self._all_mixers)

    def _all_mixers(self) -> tuple[str, ...]:
        return tuple(self._mixer(layer) for layer in range(self.num_layers + self.mtp_num_layers))

    def _mixer(self, layer: int) -> str:
        mamba = self.mamba_layers or []
        if layer < len(mamba) and mamba[layer] == 1:
            return "mamba"
        if self.attention_variant == "dsv4_hybrid":
            ratios = self.compress_ratios or []
            ratio = ratios[layer] if layer < len(ratios) else 0
            return "v4_window" if ratio == 0 else "v4_csa" if ratio == DSV4_CSA_RATIO else "v4_hca"
        kda = self.kda_layers or []
        if layer < len(kda) and kda[layer] == 1:
            return "kda"
        if self.attention_variant == "mla":
            return "mla"
        if self.is_linear_attention_layer(layer):
            return "gdn"
        sparse = self.index_sparse_layers or []
        if layer < len(sparse) and sparse[layer] == 1:
            return "block_sparse"
        if layer < self.num_layers and self.is_window_layer(layer):
            return "window"
        if layer < self.num_layers and self.is_chunked_layer(layer):
            return "chunked"
        return "softmax"

    def has_mlp(self, layer: int) -> bool:
        """The 0-based decoder block has an MLP layer (not a hybrid model's mixer-only block)."""
        alone = self.mixer_only_layers or []
        return not (layer < len(alone) and alone[layer] == 1)

    def is_moe_layer(self, layer: int) -> bool:
        """Megatron's moe_layer_freq: an int N makes every N-th layer MoE; a list is a 0/1 pattern.
        A mixer-only block has no MLP, MoE or dense."""
        if not self.has_mlp(layer):
            return False
        if isinstance(self.moe_layer_freq, int):
            return layer % self.moe_layer_freq == 0
        return layer < len(self.moe_layer_freq) and self.moe_layer_freq[layer] == 1


# One model shape's mixer per layer (ModelSection.layer_mixers), keyed on the section's values.
_LAYER_MIXERS: Memo[HashedOnce, tuple[str, ...]] = Memo("layer mixers", 256)
_DEGREES: HeldByIdentity[Degrees] = HeldByIdentity(4)  # Config.degrees


class ParallelSection(Section):
    world_size: RankCount = _derived()  # unset: cluster.nodes x gpus_per_node (Config._resolve)
    tp: PosInt = Field(1, validation_alias=AliasChoices("tp", "tensor_model_parallel_size"))
    cp: PosInt = Field(1, validation_alias=AliasChoices("cp", "context_parallel_size"))
    pp: PosInt = Field(1, validation_alias=AliasChoices("pp", "pipeline_model_parallel_size"))
    vpp: PosInt | None = _alias(
        "vpp", "virtual_pipeline_model_parallel_size", "num_virtual_stages_per_pipeline_rank"
    )
    ep: PosInt = Field(1, validation_alias=AliasChoices("ep", "expert_model_parallel_size"))
    etp: PosInt = _derived("etp", "expert_tensor_parallel_size")  # unset: tp, as Megatron
    gtp: PosInt = Field(1, validation_alias=AliasChoices("gtp", "gtp_remat_size"))
    egtp: PosInt = Field(1, validation_alias=AliasChoices("egtp", "expert_gtp_remat_size"))
    gtp_remat_num_sequence_shards: PosInt | None = None
    order: str = DEFAULT_ORDER
    sequence_parallel: bool = False
    hierarchical_context_parallel_sizes: list[PosInt] | None = None
    cp_comm_type: Literal["p2p", "all_gather", "a2a", "a2a+p2p"] = "p2p"
    cp_partition_mode: Literal["zigzag", "contiguous"] = "zigzag"
    dynamic_context_parallel: bool = False
    hybrid_context_parallel: bool = False
    decoder_first_pipeline_num_layers: PosInt | None = None
    decoder_last_pipeline_num_layers: PosInt | None = None
    num_layers_per_virtual_pipeline_stage: PosInt | None = None
    pipeline_model_parallel_layout: str | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    microbatch_group_size_per_vp_stage: PosInt | None = None
    embedding_ranks_rule: Literal["gpt", "core"] = "gpt"

    @field_validator("world_size", mode="wrap")
    @classmethod
    def _world_from_cluster(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _unset_passes(value, handler)

    @field_validator("etp", mode="wrap")
    @classmethod
    def _etp(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        """Megatron's ETP defaults to the TP size (Megatron-LM dev@d48bd6be
        megatron/training/arguments.py validate_args: expert_tensor_parallel_size)."""
        if value is None:
            return info.data.get("tp")  # None only when tp is itself invalid
        return handler(value)


class LoraSection(Section):
    """LoRA adapters over a frozen base (Megatron-Bridge src/megatron/bridge/peft/lora.py LoRA:
    `dim` is the rank, `target_modules` the linear names it wraps, its defaults)."""

    dim: PosInt = 32
    alpha: PosFloat = 32
    target_modules: list[Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]] = Field(
        default_factory=lambda: ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], min_length=1)


class RlColocationSection(Section):
    """An inference engine colocated with training on the same GPUs, as slime (`--colocate`,
    `--sglang-mem-fraction-static`, `--offload-train`, `--offload-rollout`) and verl
    (`rollout.gpu_memory_utilization`, the actor's param/optimizer offload, `free_cache_engine`)
    launch it: the engine takes `engine_memory_fraction` of the GPU's memory for its weights and
    KV cache; each side may release its memory while the other phase runs."""

    engine_memory_fraction: Annotated[float, Field(gt=0, lt=1)]
    offload_train: bool = True  # training's params, grads and optimizer leave the GPU in rollout
    offload_rollout: bool = True  # the engine's weights and KV cache leave the GPU in training


class TrainingSection(Section):
    seq_length: PosInt
    micro_batch_size: PosInt = 1
    global_batch_size: PosInt | None = None
    qkv_format: Literal["sbhd", "bshd", "thd"] = "sbhd"
    sequence_packing_scheduler: Literal["dp_balanced", "default_dynamic_cp"] | None = None
    variable_seq_lengths: bool = False
    optimizer: Literal["adam", "sgd", "muon"] = "adam"
    # Muon's Newton-Schulz iterations per weight matrix (Megatron-LM dev@d48bd6be
    # megatron/training/arguments.py --muon-num-ns-steps, default 5): the time page prices them.
    muon_num_ns_steps: PosInt = 5
    # --muon-tp-mode (default blockwise): blockwise orthogonalises each TP rank's own shard,
    # duplicated gathers the whole matrix to every TP rank first, distributed shards the iteration
    # and all-reduces X·Xᵀ each step (emerging_optimizers.py TensorParallelMuon.orthogonalize).
    muon_tp_mode: Literal["blockwise", "duplicated", "distributed"] = "blockwise"
    # Megatron's --check-weight-hash-across-dp-replicas-interval: every N iterations each rank
    # copies its parameters to the host and hashes them (megatron/core/utils.py
    # check_param_hashes_across_dp_replicas); the time page prices it per step.
    check_weight_hash_across_dp_replicas_interval: PosInt | None = None
    # Megatron's --log-num-zeros-in-grad: every optimizer step counts the zeros of each gradient
    # tensor (megatron/core/optimizer/clip_grads.py count_zeros_fp32); the time page prices it.
    log_num_zeros_in_grad: bool = False
    # Megatron's --log-params-norm: after every step megatron/training/training.py train calls
    # calc_params_l2_norm (megatron/training/utils/common_utils.py); the time page prices it.
    log_params_norm: bool = False
    # Megatron's --no-gradient-accumulation-fusion turns it off (Megatron-LM dev@d48bd6be
    # megatron/training/arguments.py, dest gradient_accumulation_fusion, on by default): each
    # weight-gradient GEMM then writes a fresh gradient and the DDP hook adds it into the main grad
    # per microbatch (megatron/core/distributed/distributed_data_parallel.py
    # _make_backward_post_hook: param.main_grad.add_(param.grad.data)); the time page prices the add.
    gradient_accumulation_fusion: bool = True
    # Megatron's --no-rope-fusion turns it off (Megatron-LM dev@d48bd6be megatron/training/arguments.py,
    # dest apply_rope_fusion, on by default): RoPE then runs by its PyTorch path (megatron/core/models/
    # common/embeddings/rope_utils.py apply_rotary_pos_emb); the time page prices its kernels.
    # Unset: off where Megatron has no fused path (Config._resolve, rope_fusion_refused), else on.
    apply_rope_fusion: bool = _derived()
    use_distributed_optimizer: bool = False
    num_distributed_optimizer_instances: PosInt = 1
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    fp8: bool = False
    # Megatron's --fp8-format (setting it turns fp8 on) and --fp8-recipe (Megatron-LM dev@d48bd6be
    # megatron/core/transformer/transformer_config.py TransformerConfig.fp8 / fp8_recipe). Under FP8,
    # Config fills in e4m3 and Megatron's delayed recipe when unset.
    fp8_format: Literal["e4m3", "hybrid"] | None = None
    fp8_recipe: Literal["tensorwise", "delayed", "blockwise", "mxfp8"] | None = None
    # Megatron's --fp8-param-gather: the GEMM weights live in FP8 and the distributed optimizer's
    # parameter all-gather moves them in FP8 (Megatron-LM dev@d48bd6be megatron/training/
    # arguments.py; TransformerConfig.fp8_param).
    fp8_param_gather: bool = False
    fp4: bool = False
    calculate_per_token_loss: bool = False
    average_in_collective: bool = Field(
        False, validation_alias=AliasChoices("average_in_collective", "ddp_average_in_collective")
    )
    ckpt_format: Literal["torch_dist", "torch", "torch_dcp", "fsdp_dtensor"] = "torch_dist"
    use_megatron_fsdp: bool = False
    # --- variable-length THD packing. The tokens of each packed microbatch
    # (a sample of the distribution, or just its largest); the budgets take their max (memory-safe,
    # the default) or their mean (typical step time), as packed_length_basis says.
    packed_lengths: list[PosInt] | None = None
    packed_length_basis: Literal["max", "mean"] = "max"
    # Megatron-FSDP: what is sharded over dp_cp / expt_dp (Megatron-LM dev@d48bd6be
    # megatron/training/arguments.py --data-parallel-sharding-strategy, default optim_grads_params).
    data_parallel_sharding_strategy: Literal["no_shard", "optim", "optim_grads",
                                             "optim_grads_params"] = "optim_grads_params"
    use_torch_fsdp2: bool = False
    lr: PosFloat = 1e-4
    adam_beta1: NonNegFloat = 0.9
    adam_beta2: NonNegFloat = 0.95
    adam_eps: PosFloat = 1e-8
    weight_decay: NonNegFloat = 0.1
    seed: NonNegInt = 1234
    # ---- optimizer state dtypes, the gradient-buffer dtype and optimizer CPU offload, named as
    # Megatron's arguments (Megatron-LM dev@d48bd6be
    # megatron/training/arguments.py _add_training_args / the precision-aware optimizer group;
    # megatron/core/optimizer/optimizer_config.py OptimizerConfig). The state dtypes other than fp32
    # need use_precision_aware_optimizer (OptimizerConfig.__post_init__ asserts it).
    use_precision_aware_optimizer: bool = False
    main_grads_dtype: Literal["fp32", "bf16"] = "fp32"
    main_params_dtype: Literal["fp32", "fp16"] = "fp32"
    exp_avg_dtype: Literal["fp32", "fp16", "bf16", "fp8"] = "fp32"
    exp_avg_sq_dtype: Literal["fp32", "fp16", "bf16", "fp8"] = "fp32"
    # Megatron's store_true switch; what it resolves to is `grads_in_fp32` (validate_args turns it on
    # under bf16 with fp32 main grads and off with grad_reduce_in_bf16).
    accumulate_allreduce_grads_in_fp32: bool = False
    grad_reduce_in_bf16: bool = False
    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: Annotated[float, Field(ge=0, le=1)] = 1.0
    # The allocator's peak (planner/budget/memory.py): the attention kernel (unfused and local keep
    # the s x s scores), the layer implementation (local: Megatron's own unfused attention) and
    # the loss's cross-entropy path (Megatron-LM dev@d48bd6be megatron/core/transformer/
    # transformer_config.py attention_backend, transformer_impl; megatron/core/
    # model_parallel_config.py cross_entropy_loss_fusion, cross_entropy_fusion_impl).
    attention_backend: Literal["auto", "flash", "fused", "unfused", "local"] = "auto"
    transformer_impl: Literal["transformer_engine", "local"] = "transformer_engine"
    cross_entropy_loss_fusion: bool = False
    cross_entropy_fusion_impl: Literal["native", "te", "linear"] = "native"
    # What trains (planner/budget/training_modes.py): parameter groups frozen (no main grads, no
    # optimizer states: Megatron's DDP buffers hold only parameters that require grad), or LoRA
    # adapters over a frozen base as Megatron-Bridge's PEFT builds them
    # (src/megatron/bridge/peft/lora.py LoRA; peft/utils.py ParallelLinearAdapter).
    freeze: list[Literal["dense", "experts"]] = Field(default_factory=list)
    lora: LoraSection | None = None
    # An RL post-training job whose inference engine shares the GPUs (planner/budget/
    # device_memory.py write_rl_colocation).
    rl_colocation: RlColocationSection | None = None
    # Under an FP8 or FP4 recipe, the first and last N decoder layers built and run outside
    # Transformer Engine's quantisation, in BF16 (Megatron-LM dev@d48bd6be megatron/core/fp8_utils.py
    # is_first_last_bf16_layer; TransformerConfig.first_last_layers_bf16 and its two counts).
    first_last_layers_bf16: bool = False
    num_layers_at_start_in_bf16: NonNegInt = 1
    num_layers_at_end_in_bf16: NonNegInt = 1
    # An encoder tower (vision or audio) beside the text decoder, as Megatron-Bridge trains
    # Qwen3-VL (src/megatron/bridge/models/qwen_vl/modelling_qwen3_vl/model.py Qwen3VLModel: built
    # on the first pipeline stage, its linears split over TP): the parameters its freeze options
    # leave frozen (weights only) and those that train (in the dense grad buffer, with optimizer
    # states). freeze_vision_model alone keeps the mergers training; with freeze_vision_projection
    # the whole tower is frozen.
    frozen_tower_params: NonNegInt = 0
    trained_tower_params: NonNegInt = 0

    @field_validator("apply_rope_fusion", mode="wrap")
    @classmethod
    def _rope_fusion(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _unset_passes(value, handler)  # Config._resolve fills it from the model

    @model_validator(mode="after")
    def _precision_aware_optimizer(self) -> "TrainingSection":
        """Megatron-LM dev@d48bd6be megatron/core/optimizer/optimizer_config.py
        OptimizerConfig.__post_init__ and megatron/training/arguments.py validate_args."""
        lowered = [name for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                                     "exp_avg_sq_dtype") if getattr(self, name) != "fp32"]
        if lowered and not self.use_precision_aware_optimizer:
            raise PydanticCustomError(
                "state_dtype_without_precision_aware",
                "training.{name} {value} needs training.use_precision_aware_optimizer: true (Megatron "
                "keeps every optimizer state in fp32 otherwise)",
                {"name": lowered[0], "value": getattr(self, lowered[0])})
        sharded = self.use_distributed_optimizer or self.use_megatron_fsdp  # FSDP turns it on
        if self.use_precision_aware_optimizer and (self.optimizer != "adam" or not sharded):
            raise PydanticCustomError(
                "precision_aware_needs_distopt",
                "training.use_precision_aware_optimizer needs optimizer adam and "
                "use_distributed_optimizer: true (Megatron's OptimizerConfig asserts both)")
        if self.optimizer_cpu_offload and not self.use_precision_aware_optimizer:
            raise PydanticCustomError(
                "offload_needs_precision_aware",
                "training.optimizer_cpu_offload needs training.use_precision_aware_optimizer: true "
                "(Megatron's validate_args: the hybrid device optimizer reuses its code path)")
        if self.accumulate_allreduce_grads_in_fp32 and self.main_grads_dtype != "fp32":
            raise PydanticCustomError(
                "fp32_accumulation_with_bf16_grads",
                "training.accumulate_allreduce_grads_in_fp32 with main_grads_dtype {dtype}: Megatron "
                "allows only fp32 main grads with it", {"dtype": self.main_grads_dtype})
        return self

    @property
    def grads_in_fp32(self) -> bool:
        """Whether the gradient buffers are fp32 (else the parameters' dtype): Megatron's
        accumulate_allreduce_grads_in_fp32 after validate_args (Megatron-LM dev@d48bd6be
        megatron/training/arguments.py; megatron/training/training.py get_model passes it as
        DistributedDataParallelConfig.grad_reduce_in_fp32)."""
        if self.precision == "bf16":
            return not self.grad_reduce_in_bf16 and self.main_grads_dtype == "fp32"
        return self.accumulate_allreduce_grads_in_fp32 or self.precision == "fp32"

    @model_validator(mode="before")
    @classmethod
    def _fp8_format_enables_fp8(cls, data: Any) -> Any:
        """Megatron turns FP8 on by naming its format; `fp8: true` alone keeps meaning e4m3."""
        if not isinstance(data, dict) or data.get("fp8_format") is None:
            return data
        if data.get("fp8") is False:
            raise PydanticCustomError(
                "fp8_conflict", "training.fp8_format {fmt} but training.fp8 is false: drop one",
                {"fmt": data["fp8_format"]})
        return {**data, "fp8": True}

    @model_validator(mode="after")
    def _fp8_recipe_needs_fp8(self) -> "TrainingSection":
        if self.fp8_recipe is not None and not self.fp8:
            raise PydanticCustomError(
                "fp8_recipe_without_fp8",
                "training.fp8_recipe {recipe} without FP8: set training.fp8_format (e4m3 or hybrid)",
                {"recipe": self.fp8_recipe})
        return self


class MoeSection(Section):
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "flex"] = "alltoall"
    # Under flex, Config fills in Megatron's deepep when unset (DEFAULT_FLEX_BACKEND).
    # deepepv2 (DeepEP v2's ElasticBuffer) exists only on Megatron-LM dev (planner/config/megatron_branch.py).
    moe_flex_dispatcher_backend: Literal["deepep", "deepepv2", "hybridep", "ncclep"] | None = None
    moe_expert_capacity_factor: PosFloat | None = None
    moe_expert_rank_capacity_factor: PosFloat | None = None
    moe_pad_expert_input_to_capacity: bool = False
    moe_token_drop_policy: Literal["probs", "position"] = "probs"
    moe_router_load_balancing_type: Literal[
        "aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"
    ] = "aux_loss"
    moe_aux_loss_coeff: NonNegFloat = 0.0
    moe_router_force_load_balancing: bool = False
    moe_virtual_experts: bool = False
    moe_latent_size: PosInt | None = None
    moe_apply_probs_on_input: bool = False
    moe_grouped_gemm: bool = True
    moe_permute_fusion: bool = False
    # Transformer Engine's fused router kernels (--moe-router-fusion): fewer launches per router
    moe_router_fusion: bool = False
    moe_tid2eid_source: str | None = None
    # --- NCCL EP's zero-copy path, Megatron-LM main only (TransformerConfig.
    # moe_ncclep_zero_copy): FC2 outputs and FC1 input grads written into symmetric-memory buffers.
    moe_ncclep_zero_copy: bool = False


# ---- Megatron's allowed offload_modules (TransformerConfig.__post_init__'s
# allowed_modules), in the order a layer's forward runs them.
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1",
                   "moe_act", "fused_group_mlp")
OffloadModule = Literal["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1",
                        "moe_act", "fused_group_mlp"]


class OverlapSection(Section):
    # --- the pipeline schedule asked for. dualpipe (the DeepSeek-V4 trainer's,
    # adapted for mHC) is in no Megatron-LM branch: V4030 says so and the budgets time 1F1B.
    pipeline_schedule: Literal["1f1b", "dualpipe"] = "1f1b"
    overlap_moe_expert_parallel_comm: bool = False
    moe_shared_expert_overlap: bool = False
    delay_wgrad_compute: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    # Megatron's --no-overlap-p2p-communication turns it off (Megatron-LM dev@d48bd6be
    # megatron/training/arguments.py, dest overlap_p2p_comm, on by default): the interleaved
    # schedule posts each chunk's pipeline send/recv and waits for it after the next chunk's
    # compute (megatron/core/pipeline_parallel/schedules.py
    # forward_backward_pipelining_with_interleaving). validate_args turns it off without virtual
    # stages, so it hides nothing under plain 1F1B.
    overlap_p2p_comm: bool = True
    recompute_granularity: Literal["full", "selective"] | None = None
    recompute_method: Literal["uniform", "block"] | None = None
    # 0 is legal under `block` (Megatron recomputes no block: TransformerBlock._checkpointed_forward);
    # under `uniform` it never ends Megatron's loop, which OVL009 refuses
    recompute_num_layers: NonNegInt | None = None
    recompute_modules: list[str] | None = None
    cuda_graph_impl: Literal["none", "local", "transformer_engine", "full_iteration"] = "none"
    cuda_graph_scope: list[str] = Field(default_factory=list)
    # --- step-time model: Megatron's --tp-comm-overlap (Transformer Engine's userbuffers
    # overlap of the TP/SP all-gathers and reduce-scatters with the linears' GEMMs).
    tp_comm_overlap: bool = False
    # ---- fine-grained activation offloading, named as Megatron's
    # arguments (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py
    # TransformerConfig, parsed from it by megatron/training/arguments.py): the saved inputs of the
    # named modules go to pinned host memory after their forward and come back for their backward
    # (megatron/core/pipeline_parallel/fine_grained_activation_offload.py).
    fine_grained_activation_offloading: bool = False
    offload_modules: list[OffloadModule] = Field(default_factory=list)
    min_offloaded_tensor_size: NonNegInt = 1024 * 1024  # elements; smaller tensors stay on the GPU
    delta_offload_bytes_across_pp_ranks: NonNegInt = 0  # pipeline rank r keeps r times this on the GPU
    activation_offload_fraction: Annotated[float, Field(ge=0, le=1)] = 1.0
    fine_grained_offloading_max_inflight_offloads: NonNegInt | None = None

    @model_validator(mode="after")
    def _activation_offloading(self) -> "OverlapSection":
        """What TransformerConfig.__post_init__ asserts of the offload settings (Megatron-LM
        dev@d48bd6be megatron/core/transformer/transformer_config.py, the
        `if self.fine_grained_activation_offloading:` block)."""
        if not self.fine_grained_activation_offloading:
            return self
        mods = set(self.offload_modules)
        if not mods:
            raise PydanticCustomError(
                "offload_without_modules",
                "overlap.fine_grained_activation_offloading needs overlap.offload_modules (one or more of "
                "{choices}); Megatron asserts a non-empty list", {"choices": ", ".join(OFFLOAD_MODULES)})
        if "attn_proj" in mods and "core_attn" not in mods:
            raise PydanticCustomError(
                "attn_proj_without_core_attn",
                "overlap.offload_modules has attn_proj without core_attn: attn_proj's input is core "
                "attention's output, which core attention's backward needs; add core_attn")
        inside_moe = sorted(mods & {"moe_act", "expert_fc1", "fused_group_mlp"})
        if self.recompute_granularity == "selective" and "moe" in (self.recompute_modules or []) \
                and inside_moe:
            raise PydanticCustomError(
                "offload_inside_recomputed_moe",
                "overlap.offload_modules {modules} with 'moe' in overlap.recompute_modules: the MoE "
                "layer is recomputed whole, so Megatron refuses offloading inside it; drop one",
                {"modules": inside_moe})
        if self.recompute_granularity == "selective" and "mhc" in (self.recompute_modules or []) \
                and mods & {"attn_norm", "mlp_norm"}:
            raise PydanticCustomError(
                "offload_norms_with_mhc_recompute",
                "overlap.offload_modules {modules} with 'mhc' in overlap.recompute_modules: Megatron "
                "refuses them together (the mHC recompute replays those norms before the offload's "
                "backward chunk exists); drop them or the mhc recompute",
                {"modules": sorted(mods & {"attn_norm", "mlp_norm"})})
        if "fused_group_mlp" in mods:
            raise PydanticCustomError(
                "fused_group_mlp_needs_op_fuser",
                "overlap.offload_modules fused_group_mlp needs Megatron's use_transformer_engine_op_fuser "
                "(its fused grouped MLP), which moeplan does not model; offload expert_fc1 and moe_act "
                "instead")
        return self


Share = Annotated[float, Field(gt=0, le=1)]


class EfficiencySection(Section):
    """The step-time model's efficiency factors (`moeplan estimate`). Defaults are calibrated on
    four public Megatron MoE measurements (docs/estimate.md lists them); every estimate prints
    the values it used. Fractions of the catalog peaks, except routing_imbalance (>= 1)."""

    gemm_bf16: Share = _derived()  # share of the BF16 peak GEMMs reach; unset: the GPU catalog's
    gemm_fp8: Share = _derived()  # share of the FP8 peak FP8 GEMMs reach; unset: the GPU catalog's
    # share of the BF16 peak core (flash) attention reaches; unset: the GPU catalog's (0.5 but
    # where a card's kernels were measured)
    attention: Share = _derived()
    intra_node: Share = 0.85  # share of the NVLink bandwidth a collective reaches
    inter_node: Share = 0.9  # share of the scale-out bandwidth a collective reaches
    hbm: Share = 0.8  # share of the HBM bandwidth streaming work (weights, elementwise) reaches
    overlap: Share = 0.5  # share of an overlapped collective hidden behind compute (at most all)
    # busiest rank's expert load / mean; unset: by the router (planner/config/routing.py: 1 under
    # forced balance or Sinkhorn, the published natural-routing figure otherwise)
    routing_imbalance: Annotated[float, Field(ge=1)] | None = None
    # --- the quantile of the busiest EP rank's received rows that the
    # hot-rank rows, bytes and memory budgets state (uniform routing's spread, on top of the
    # routing_imbalance expectation).
    routing_quantile: Annotated[float, Field(gt=0.5, lt=1)] = 0.999
    # Fixed latency per token and transformer block outside the GEMMs and attention (kernel
    # launches, host syncs), forward and backward together; their bytes are counted separately.
    non_gemm_ns_per_token_block: NonNegFloat = 2.9
    # HBM passes over the forward's elementwise bytes (norms, router, permutes, activations) in
    # forward and backward together (fitted; fused backward kernels reuse what forward saved).
    non_gemm_passes: PosFloat = 3.0
    permute_unfused: Annotated[float, Field(ge=1)] = 3.0  # unfused permute / fused permute cost
    # Share of the collective bandwidth each token dispatcher's EP exchange reaches.
    dispatch_alltoall: Share = 0.94
    dispatch_deepep: Share = 1.0
    dispatch_hybridep: Share = 1.0
    # --- step-time model terms (planner/budget/time.py). Fixed costs: host time to launch
    # one transformer block's forward and backward kernels per microbatch outside CUDA graphs, per
    # microbatch and model chunk (schedule, P2P set-up, loss), and per optimizer step.
    host_us_per_block: NonNegFloat = 0.0
    # Host time to issue one counted kernel as a bare PyTorch op (the time page counts the kernels
    # of each block part: planner/budget/time.py ATTENTION_LAUNCHES and the rest; a Transformer
    # Engine module's GEMM costs planner/config/gpus.py HOST_MODULE_OP of these, measured);
    # calibrated, docs/estimate.md.
    host_us_per_launch: NonNegFloat = 48.3
    # GPU time each kernel costs beyond its FLOPs and bytes, graph or not: a published H100 figure
    # (Meta's auto-parallel cost model, 7 µs; planner/budget/time.py _kernel_gpu cites it).
    gpu_us_per_kernel: NonNegFloat = 7.0
    # The GPU's host CPU's time per op over the x86 host host_us_per_launch is calibrated for, on a
    # NUMA-bound rank; unset = the GPU catalog's host (planner/config/gpus.py HOSTS: 1 on x86,
    # Grace's fitted). An unbound rank pays the host's measured extra per bare op on top.
    host_launch_scale: PosFloat = _derived()
    # A stack's own extra host time per local expert and MoE layer, and per microbatch and model
    # chunk, beyond the counted launches: 0 unless `moeplan calibrate` fits them to a stack.
    host_us_per_expert: NonNegFloat = 0.0
    host_us_per_microbatch: NonNegFloat = 0.0
    # The stack's GPU work over what the model prices (1: the model's kernels as they are). A slow
    # stack (another vendor's kernels, an old container) that no bounded factor explains is
    # absorbed here by `moeplan calibrate`, and the calibration says so.
    stack_factor: PosFloat = 1.0
    step_fixed_ms: NonNegFloat = 0.0
    # GEMM shape curve: a GEMM dimension d reaches d / (d + gemm_half_dim) of the large-shape
    # efficiency, after tile quantisation to gemm_tile; unset = the GPU catalog's figures.
    gemm_half_dim: NonNegFloat = _derived()
    gemm_tile: PosInt = 128
    # Latency of one collective call (alpha of the alpha-beta model: small messages reach less
    # than the link's bandwidth), inside the NVLink domain and across the scale-out network.
    collective_latency_us: NonNegFloat = 0.0
    # Fixed set-up per token dispatch or combine call of each dispatcher (besides its bytes).
    dispatch_latency_us_alltoall: NonNegFloat = 0.0
    dispatch_latency_us_deepep: NonNegFloat = 0.0
    dispatch_latency_us_hybridep: NonNegFloat = 0.0
    # Core attention kernels other than the standard one: MLA (192/128 head dims), DeepSeek-V4's
    # sparse CSA/HCA attention with its indexer, as shares of eff_attention.
    attention_mla: Share = 1.0
    attention_sparse: Share = 1.0
    # --- DeepEP's SM-bound exchange: DeepEP's normal kernels copy the rows with the SMs
    # Megatron gives them (moe_flex_dispatcher_num_sms, 20 when unset: token_dispatcher.py
    # _DeepepManager.__init__), so an exchange runs at no more than SMs x the rate one SM moves.
    # Per SM: 4096 tokens x 7168 hidden, top-8 of 32 experts on 8 H100 at 20 SMs, dispatch 1.00 ms
    # and combine 1.16 ms for 290 MB to the other ranks each (tile-ai/tilescale
    # examples/distributed/deepseek_deepep/deepep.md @4704282a, DeepEP's own row): 13.4 GB/s.
    deepep_num_sms: PosInt = 20
    deepep_gb_s_per_sm: PosFloat = 13.4

    @field_validator("gemm_bf16", "gemm_fp8", "attention", "gemm_half_dim", "host_launch_scale",
                     mode="wrap")
    @classmethod
    def _from_card(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _unset_passes(value, handler)  # ClusterSection._from_gpu fills them from the card


class ClusterSection(Section):
    """The machines. `gpu` names a catalog entry (planner/config/gpus.py) whose figures fill every field
    left unset; without `gpu` they are an H100's (moeplan's defaults before the catalog), in nodes
    of 8 GPUs that form their own NVLink domain."""

    nodes: RankCount = _derived()  # unset: world_size / gpus_per_node rounded up (Config._resolve)
    gpu: Literal[GPU_NAMES] = DEFAULT_GPU  # type: ignore[valid-type]
    gpus_per_node: RankCount | None = None
    # GPUs that share one NVLink domain: a node (8) on HGX systems, 72 on NVL72 racks.
    nvlink_domain: RankCount | None = None
    gpu_memory_gib: PosFloat | None = None
    intra_node_bandwidth_gb_s: PosFloat | None = None  # NVLink per GPU, one direction
    inter_node_bandwidth_gb_s: PosFloat | None = None  # scale-out per GPU, one direction
    peak_bf16_tflops: PosFloat | None = None  # dense
    peak_fp8_tflops: PosFloat | None = None  # dense
    hbm_bandwidth_tb_s: PosFloat | None = None
    efficiency: EfficiencySection = Field(default_factory=EfficiencySection)
    # Step-time model: a `moeplan calibrate` profile whose fitted factors replace the
    # efficiency defaults in estimate, search, budget and report (path relative to the cwd).
    calibration: str | None = None
    # --- where ranks run (planner/layout/nodes.py). block: torchrun and Slurm's
    # default fill node after node; cyclic: Slurm --distribution=cyclic, rank r on node r % nodes;
    # rank_nodes: an explicit node index per rank (a hostfile's order), which wins over both.
    rank_distribution: Literal["block", "cyclic"] = "block"
    rank_nodes: list[Annotated[int, Field(ge=0)]] | None = None
    # Device memory beyond the allocator's `max allocated` (planner/budget/memory.py
    # write_device_total): the caching allocator's reserved/allocated ratio, the CUDA context,
    # the channels NCCL opens per communicator; memory_margin is the share of the GPU that MEM002
    # and search keep free of the device total.
    allocator_reserved_ratio: Annotated[float, Field(ge=1, le=2)] = 1.04
    cuda_context_gib: Annotated[float, Field(ge=0, le=16)] = 0.5
    nccl_channels: Annotated[int, Field(ge=1, le=64)] = 16
    memory_margin: Annotated[float, Field(ge=0, lt=1)] = 0.08
    # Whether each rank's process is bound to its GPU's NUMA node (numactl, as mlperf-common's
    # bindpcie does; production launchers do). Unbound, a rank's kernels are issued at the host's
    # measured per-op time (planner/config/gpus.py HOSTS), not the calibrated efficiency figure.
    host_numa_binding: bool = True

    @field_validator("nodes", mode="wrap")
    @classmethod
    def _nodes_from_world(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return _unset_passes(value, handler)

    @model_validator(mode="before")
    @classmethod
    def _null_gpu(cls, data: Any) -> Any:
        """`gpu: null` names no card, as leaving it out does."""
        if isinstance(data, dict) and "gpu" in data and data["gpu"] is None:
            return {k: v for k, v in data.items() if k != "gpu"}
        return data

    @model_validator(mode="after")
    def _from_gpu(self) -> "ClusterSection":
        card, named = gpu_entry(self.gpu), self.gpu_named
        filled = {
            "gpus_per_node": card.gpus_per_node if named else 8,
            "gpu_memory_gib": float(card.memory_gib), "intra_node_bandwidth_gb_s": float(card.nvlink_gb_s),
            "inter_node_bandwidth_gb_s": float(card.scale_out_gb_s),
            "peak_bf16_tflops": float(card.bf16_tflops),
            # None on a card without FP8 (Ampere): CLU005 refuses FP8 training there.
            "peak_fp8_tflops": None if card.fp8_tflops is None else float(card.fp8_tflops),
            "hbm_bandwidth_tb_s": float(card.hbm_tb_s),
        }
        for key, value in filled.items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        # The step-time model's card figures (FP8 GEMM share, GEMM shape curve) where efficiency
        # leaves them unset.
        if self.efficiency.gemm_fp8 is None:
            object.__setattr__(self.efficiency, "gemm_fp8", card.gemm_fp8_eff)
        if self.efficiency.gemm_bf16 is None:
            object.__setattr__(self.efficiency, "gemm_bf16", card.gemm_bf16_eff)
        if self.efficiency.attention is None:
            object.__setattr__(self.efficiency, "attention", card.attention_eff)
        if self.efficiency.gemm_half_dim is None:
            object.__setattr__(self.efficiency, "gemm_half_dim", card.gemm_half_dim)
        if self.efficiency.host_launch_scale is None:
            object.__setattr__(self.efficiency, "host_launch_scale", HOSTS[card.host].launch_scale)
        if self.nvlink_domain is None:
            domain = card.nvlink_domain if named else self.gpus_per_node
            object.__setattr__(self, "nvlink_domain", max(domain, self.gpus_per_node or 1))
        if self.nvlink_domain % (self.gpus_per_node or 1):
            raise PydanticCustomError(
                "nvlink_domain_nodes",
                "cluster.nvlink_domain {domain} is not a whole number of nodes of {per_node} GPUs: "
                "set it to a multiple of cluster.gpus_per_node",
                {"domain": self.nvlink_domain, "per_node": self.gpus_per_node},
            )
        return self


    @property
    def gpu_named(self) -> bool:
        """Whether the config names its card (else it is DEFAULT_GPU, in nodes of 8)."""
        return "gpu" in self.model_fields_set

    @property
    def gpu_label(self) -> str:
        """The card as reports name it: `H100 (default)` when the config names none."""
        return self.gpu if self.gpu_named else f"{self.gpu} (default)"


class LaunchSection(Section):
    job_name: str = "moeplan"
    partition: str | None = None
    account: str | None = None
    time: str = "01:00:00"
    container_image: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    extra_sbatch: list[str] = Field(default_factory=list)
    output_dir: str = "logs"
    cpus_per_task: PosInt | None = None
    master_port: Annotated[int, Field(ge=1, le=65535)] = 29500
    steps: PosInt = 2
    check_reference: bool = True
    # Megatron arguments moeplan does not model (data, tokenizer, LR schedule ...), appended verbatim
    # (each word shell-quoted) to the emitted launch: e.g. ["--data-path", "/d/x", "--lr-decay-style",
    # "cosine"]. Flags moeplan emits itself are refused (rule EMT001).
    megatron_extra_args: list[str] = Field(default_factory=list)
    # --- the entry script the imported launch ran, written by `import
    # megatron` when megatron_extra_args carry arguments of that script's own parser
    # (planner/config/entry_parsers.py: Pai-Megatron-Patch's get_patch_args, ModelOpt's
    # add_modelopt_args), so ARG003 names the parser that accepts them. `emit` still writes
    # Megatron-LM's entry.
    megatron_entry: str | None = None


class MegatronSection(Section):
    # Which Megatron-LM the job runs on: a release (core_r0.14.0), a NeMo container (25.09,
    # nemo:25.09), a branch or a commit (planner/config/megatron_releases.py). It selects the rules
    # whose behaviour changed between versions and the known-bad ranges (rules VER001-VER003); the
    # default is dev@d48bd6be, the commit every other rule cites.
    version: str = DEFAULT_VERSION


def rope_fusion_refused(model: "ModelSection") -> str:
    """Why Megatron cannot fuse this model's RoPE ("" when it can): MLA fuses YaRN RoPE only
    (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py
    MLATransformerConfig.__post_init__, "apply_rope_fusion for MLA only works with YARN RoPE"), and
    DSA has no fused RoPE (TransformerConfig.__post_init__, "RoPE fusion is not supported for
    DSAttention")."""
    if model.dsa:
        return "DSA attention (model.dsa)"
    if model.attention_variant == "mla" and model.rope_type == "rope":
        return "MLA with plain RoPE (model.rope_type rope)"
    return ""


class Config(Section):
    model: ModelSection
    parallel: ParallelSection
    training: TrainingSection
    moe: MoeSection = Field(default_factory=MoeSection)
    overlap: OverlapSection = Field(default_factory=OverlapSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    launch: LaunchSection = Field(default_factory=LaunchSection)
    megatron: MegatronSection = Field(default_factory=MegatronSection)
    ignore: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """Fill model fields from the named preset; whatever the user wrote wins."""
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            return data
        preset = data["model"].get("preset")
        if preset is None or preset not in PRESETS:
            return data
        return {**data, "model": {**PRESETS[preset], **data["model"]}}

    @model_validator(mode="after")
    def _window_heads_priced(self) -> "Config":
        """What moeplan does not price for window layers of their own head count, KV groups or
        sinks, or for value heads of their own width: the unfused kernel's score matrices, the
        offloaded attention tensors, adapters on the attention projections (each sized by one
        head count and one head width)."""
        m = self.model
        self._per_layer_attention_checked()
        own = [name for name, on in (
            ("model.window_num_attention_heads", m.window_num_attention_heads is not None),
            ("model.window_num_query_groups", m.window_num_query_groups is not None),
            ("model.v_head_dim", m.attention_variant == "standard"
             and m.v_head_dim != m.kv_channels),
            ("model.window_kv_channels", m.window_kv_channels is not None),
            ("model.attention_k_eq_v", m.attention_k_eq_v)) if on]
        if not own:
            return self
        tr, named = self.training, []
        if own != ["model.window_num_attention_heads"] and self.parallel.cp > 1:
            named.append(f"parallel.cp {self.parallel.cp} (Megatron-Bridge's "
                         "MiMoV2FlashModelProvider.provide asserts context_parallel_size <= 1)")
        if tr.attention_backend in ("unfused", "local") or tr.transformer_impl == "local":
            named.append("training.attention_backend/transformer_impl (unfused attention scores)")
        offloaded = {"qkv_linear", "core_attn", "attn_proj"} & set(self.overlap.offload_modules)
        if offloaded:
            named.append(f"overlap.offload_modules {sorted(offloaded)}")
        if tr.lora is not None and {"linear_qkv", "linear_proj"} & set(tr.lora.target_modules):
            named.append("training.lora.target_modules on the attention projections")
        if named:
            raise PydanticCustomError(
                "window_heads_not_priced", "{own} beside {named}: moeplan sizes those with one "
                "head count and width for every layer; leave them out",
                {"own": " and ".join(own), "named": "; ".join(named)})
        return self

    @model_validator(mode="after")
    def _kda_priced(self) -> "Config":
        """What moeplan does not price for KDA layers: context parallelism (Megatron has no KDA
        layer, so no CP exchange of its states exists to follow), attention-module offloading
        and adapters on the attention projections (both sized for MLA's tensors)."""
        if not any(self.model.kda_layers or []):
            return self
        named = []
        if self.parallel.cp > 1:
            named.append(f"parallel.cp {self.parallel.cp}")
        offloaded = {"qkv_linear", "core_attn", "attn_proj"} & set(self.overlap.offload_modules)
        if offloaded:
            named.append(f"overlap.offload_modules {sorted(offloaded)}")
        if self.training.lora is not None and {"linear_qkv", "linear_proj"} & set(
                self.training.lora.target_modules):
            named.append("training.lora.target_modules on the attention projections")
        if named:
            raise PydanticCustomError(
                "kda_not_priced", "model.kda_layers beside {named}: moeplan does not price KDA "
                "layers there (Megatron-LM has no KDA layer to follow); leave them out",
                {"named": "; ".join(named)})
        return self

    def _per_layer_attention_checked(self) -> None:
        """Window layers' own KV groups and sinks, and value heads of their own width, need
        standard attention of softmax and window layers only, whole query groups, and none of
        the features moeplan sizes with one KV width (the output gates, per-layer q/k norms, the
        window layers' own head count)."""
        m = self.model
        value = m.attention_variant == "standard" and m.v_head_dim != m.kv_channels
        groups_w = m.window_num_query_groups
        gemma = [name for name, on in (
            ("model.window_kv_channels", m.window_kv_channels is not None),
            ("model.attention_k_eq_v", m.attention_k_eq_v),
            ("model.post_sublayer_norms", m.post_sublayer_norms),
            ("model.moe_branch_norms", m.moe_branch_norms)) if on]
        if groups_w is None and not value and m.full_attention_softmax_type is None and not gemma:
            return
        field = ("model.window_num_query_groups" if groups_w is not None
                 else "model.v_head_dim" if value else gemma[0] if gemma
                 else "model.full_attention_softmax_type")
        if m.moe_branch_norms and not (m.num_experts and m.moe_shared_expert_intermediate_size):
            raise PydanticCustomError(
                "moe_branch_without_shared", "model.moe_branch_norms needs MoE layers with a "
                "shared expert (model.num_experts, moe_shared_expert_intermediate_size): its norms "
                "sit on the shared branch and the experts; remove it", {})
        mixers = set(m.layer_mixers) - {"softmax", "window"}
        needs_window = (groups_w is not None or m.full_attention_softmax_type is not None
                        or m.window_kv_channels is not None)
        if m.attention_variant != "standard" or mixers or (needs_window and m.window_size is None):
            raise PydanticCustomError(
                "per_layer_attention_layers", "{field} needs standard attention of full"
                "{window} layers only (found {found}); remove it",
                {"field": field, "window": " and sliding-window" if needs_window else " or window",
                 "found": ", ".join(sorted(mixers)) or ("no model.window_size" if needs_window
                                                        else m.attention_variant)})
        others = [name for name, on in (
            ("model.attention_output_gate", m.attention_output_gate),
            ("model.head_wise_attn_gate", m.head_wise_attn_gate),
            ("model.qk_layernorm_per_layer", m.qk_layernorm_per_layer),
            ("model.window_num_attention_heads", m.window_num_attention_heads is not None)) if on]
        if others and (groups_w is not None or value or m.window_kv_channels is not None
                       or m.attention_k_eq_v):
            raise PydanticCustomError(
                "per_layer_attention_features", "{field} beside {others}: moeplan sizes those "
                "with one KV group count and one value width; leave one out",
                {"field": field, "others": ", ".join(others)})
        if groups_w is not None and m.num_attention_heads % groups_w:
            raise PydanticCustomError(
                "window_groups_heads", "model.window_num_query_groups {groups} does not divide "
                "the {heads} query heads of the window layers",
                {"groups": groups_w, "heads": m.num_attention_heads})
        if m.full_attention_softmax_type is not None and m.softmax_type != "learnable":
            raise PydanticCustomError(
                "full_softmax_without_sinks", "model.full_attention_softmax_type "
                "{full} needs model.softmax_type learnable (the window layers' sinks); remove it",
                {"full": m.full_attention_softmax_type})

    @model_validator(mode="after")
    def _lora_targets_counted(self) -> "Config":
        """DeepSeek-V4's attention has no linear_qkv and a grouped output projection whose adapters
        moeplan does not count (planner/budget/training_modes.py): refuse rather than guess."""
        lora = self.training.lora
        if lora is not None and self.model.attention_variant == "dsv4_hybrid":
            named = sorted({"linear_qkv", "linear_proj"} & set(lora.target_modules))
            if named:
                raise PydanticCustomError(
                    "lora_target_not_counted",
                    "training.lora.target_modules {named} on DeepSeek-V4 attention: moeplan does not "
                    "count adapters on its projections; target linear_fc1 and linear_fc2 only",
                    {"named": ", ".join(named)})
        return self

    @model_validator(mode="after")
    def _resolve(self) -> "Config":
        """Derive what needs two sections: world size and nodes (from each other and the cluster's
        GPUs per node), flex-backend and FP8 defaults.

        Each default is filled in here once, so no reader re-derives it; a default that only means
        something under a switch (the flex backend, the FP8 format and recipe) is filled in only when
        that switch is on, so the other configs keep None (nothing to choose). world_size and nodes
        are None here only when the user left them unset (their sections pass None through)."""
        par, cluster, moe, training = self.parallel, self.cluster, self.moe, self.training
        world: int | None = par.world_size
        nodes: int | None = cluster.nodes
        if world is None:
            if nodes is None:
                raise PydanticCustomError(
                    "world_size_missing",
                    "parallel.world_size is not set and cannot be derived: give parallel.world_size "
                    "or cluster.nodes (world size = nodes x gpus_per_node)",
                )
            world = nodes * cluster.gpus_per_node
            if world > MAX_RANKS:
                raise PydanticCustomError(
                    "world_size_too_large",
                    "cluster.nodes x gpus_per_node = {world} ranks, above moeplan's limit of {limit}",
                    {"world": world, "limit": MAX_RANKS},
                )
        object.__setattr__(par, "world_size", world)
        if moe.moe_token_dispatcher_type == "flex" and moe.moe_flex_dispatcher_backend is None:
            object.__setattr__(moe, "moe_flex_dispatcher_backend", DEFAULT_FLEX_BACKEND)
        if training.fp8 and training.fp8_format is None:
            object.__setattr__(training, "fp8_format", DEFAULT_FP8_FORMAT)
        if training.fp8 and training.fp8_recipe is None:
            object.__setattr__(training, "fp8_recipe", DEFAULT_FP8_RECIPE)
        refused = rope_fusion_refused(self.model)
        if training.apply_rope_fusion is None:
            object.__setattr__(training, "apply_rope_fusion", not refused)
        elif training.apply_rope_fusion and refused:
            raise PydanticCustomError(
                "rope_fusion_refused",
                "training.apply_rope_fusion true with {what}: Megatron has no fused RoPE there and "
                "refuses it; set training.apply_rope_fusion false (--no-rope-fusion)", {"what": refused})
        if nodes is None:
            object.__setattr__(cluster, "nodes", math.ceil(world / cluster.gpus_per_node))
        padded = self.model.padded_vocab_size
        if padded is not None and (padded % par.tp or padded < self.model.vocab_size):
            # Megatron-LM dev@d48bd6be megatron/core/tensor_parallel/layers.py
            # VocabParallelEmbedding.__init__ splits the rows evenly over TP (VocabUtility).
            raise PydanticCustomError(
                "padded_vocab",
                "model.padded_vocab_size {padded} must be a multiple of tp {tp} and at least "
                "model.vocab_size {vocab}", {"padded": padded, "tp": par.tp, "vocab": self.model.vocab_size})
        return self

    @model_validator(mode="after")
    def _bf16_layers(self) -> "Config":
        """Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py
        TransformerConfig.__post_init__ under FP8: delayed scaling cannot keep layers in BF16, and
        each count is at most num_layers // PP. A hybrid stack counts pattern symbols there
        (megatron/core/models/hybrid/hybrid_block.py HybridStack builds each symbol under
        get_fp8_context with its own index), which moeplan's per-block FP8 weights do not follow."""
        tr, model = self.training, self.model
        if not tr.first_last_layers_bf16 or not (tr.fp8 or tr.fp4):
            return self
        if tr.fp8 and tr.fp8_recipe == "delayed":
            raise PydanticCustomError(
                "bf16_layers_delayed",
                "training.first_last_layers_bf16 with training.fp8_recipe delayed: Megatron's delayed "
                "scaling cannot keep layers in BF16; choose tensorwise, blockwise or mxfp8", {})
        most = model.num_layers // self.parallel.pp
        for name in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
            if getattr(tr, name) > most:
                raise PydanticCustomError(
                    "bf16_layers_count",
                    "training.{name} {count} is above num_layers // pp = {most}: Megatron refuses it; "
                    "choose at most {most}", {"name": name, "count": getattr(tr, name), "most": most})
        if model.attention_variant == "dsv4_hybrid" or model.mamba_layers or model.mixer_only_layers:
            raise PydanticCustomError(
                "bf16_layers_hybrid",
                "training.first_last_layers_bf16 on a hybrid layer pattern: Megatron counts the "
                "pattern's symbols there, which moeplan does not model; drop it", {})
        return self

    # The layout degrees have one owner (planner/degrees.py); the grid owns the groups.
    @property
    def degrees(self) -> Degrees:
        """This config's layout degrees and the sizes derived from them (DP, EDP, model sizes);
        the last few configs' kept with them (a config is frozen; budgeting one asks dozens of
        times)."""
        return _DEGREES.get(self, Degrees.from_config)

    @property
    def dp(self) -> int:
        """Replicate data-parallel size D_a (DP = world / (TP·PP·CP) in Megatron-LM dev@d48bd6be
        megatron/training/arguments.py validate_args; GTP on main divides it further); fractional
        layouts are a rule finding."""
        return self.degrees.dp

    @property
    def edp(self) -> int:
        """Expert data-parallel size N/(ETP·EP·PP·EGTP); CP never enters the expert grid."""
        return self.degrees.edp

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding and output layer: the vocabulary rounded up to a multiple of
        model.make_vocab_size_divisible_by (default 128) times the TP size (Megatron-LM
        dev@d48bd6be megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding);
        the padded logits take part in the softmax."""
        if self.model.padded_vocab_size is not None:  # --padded-vocab-size: used as given
            return self.model.padded_vocab_size
        divisor = self.model.make_vocab_size_divisible_by * self.parallel.tp
        return -(-self.model.vocab_size // divisor) * divisor

    @property
    def global_batch_size(self) -> int:
        """Megatron's default global batch is micro_batch_size x replicate DP."""
        return self.training.global_batch_size or self.training.micro_batch_size * self.dp

    @property
    def batch_replicas(self) -> int:
        """D_batch = D_a·GTP/q_s: ranks reading distinct samples; GTP sequence shards split one
        sample over q_s ranks of the GTP axis (Megatron-LM main@d98e8a64 get_batch_parallel_size).
        CP, EP and ETP add none."""
        gtp, shards = self.parallel.gtp, self.parallel.gtp_remat_num_sequence_shards or 1
        if gtp % shards:  # q_s must divide R (rule GTP001); until it does, count no sharding
            shards = 1
        return self.dp * gtp // shards

    @property
    def batch_unit(self) -> int:
        """Samples one microbatch round consumes: micro_batch_size · D_batch."""
        return self.training.micro_batch_size * self.batch_replicas

    @property
    def microbatches(self) -> int:
        """m = B / (b · D_batch); with no GTP this is Megatron's B / (b · DP) (Megatron-LM
        dev@d48bd6be megatron/core/num_microbatches_calculator.py ConstantNumMicroBatchesCalculator)."""
        return self.global_batch_size // self.batch_unit


def field_choices(dotted: str) -> tuple[str, ...]:
    """The values a config field (`section.name`) takes when it is a choice (a Literal), else (): an
    imported value outside them is named, not written into the field (rule ARG005 says so)."""
    section, _, name = dotted.partition(".")
    owner = Config.model_fields.get(section)
    fields = getattr(owner.annotation, "model_fields", {}) if owner is not None else {}
    info = fields.get(name)
    if info is None:
        return ()
    found: list[str] = []
    for part in (info.annotation, *get_args(info.annotation)):
        if get_origin(part) is Literal:
            found += [v for v in get_args(part) if isinstance(v, str)]
    return tuple(found)

"""Hugging Face `config.json` → moeplan `model` fields, named as Megatron-LM's arguments.

A model published on Hugging Face describes itself in a config.json; this module reads one and
returns the `model` section that builds the same network in Megatron-LM dev@d48bd6be (argument
names from megatron/training/arguments.py and the TransformerConfig / MLATransformerConfig fields
of megatron/core/transformer/transformer_config.py). Architectures: DeepSeek-V2/V3 (Kimi-K2 uses
the V3 architecture) and V3.2, Qwen2-MoE/Qwen3-MoE/Qwen3-Next, Mixtral, gpt-oss, GLM-4.5,
MiniMax-M2, Llama 4. Routing semantics follow Megatron-LM
dev@d48bd6be megatron/core/transformer/moe/moe_utils.py topk_routing_with_score_function.

Pure data in, data out (no torch, no file writing): an unreadable file is `HfConfigUnreadable`
(usage, exit 2), an unmappable one `HfConfigUnmappable` with one finding per problem (exit 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.config.dsa_share import computes_topk, share_of
from planner.config.importers.hf_families import BY_ARCHITECTURE, Family, family_of
from planner.config.schema import MAX_LAYERS
from planner.files.json_input import read_json
from planner.files.reading import UnreadableInput
from planner.findings import Finding

SOURCE = "planner/config/importers/hf_config.py::map_hf_config"
CODE = "CFG007"
# MLATransformerConfig's YaRN defaults (Megatron-LM dev@d48bd6be transformer_config.py): values
# equal to these need no argument; --mscale/--mscale-all-dim exist on the command line, the betas
# do not (only --yarn-beta-* of standard attention's YaRN).
MLA_MSCALE_DEFAULTS = {"mscale": 1.0, "mscale_all_dim": 0.0}
_MLA_BETA_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0}


def sigmoid_renormalised_note(key: str = "norm_topk_prob") -> str:
    """The note for a config that keeps sigmoid top-k weights un-renormalised: Megatron
    renormalises them always (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_utils.py
    topk_routing_with_score_function)."""
    return (f"{key} false with sigmoid scoring: Megatron always renormalises the top-k sigmoid "
            "scores (routing weights differ)")


class HfConfigUnreadable(Exception):
    """The file is missing, unreadable or not a JSON object (a usage error, exit 2)."""


class HfConfigUnmappable(Exception):
    """The JSON was read but cannot be mapped (unknown architecture, missing or bad keys)."""

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__("; ".join(f.line() for f in findings))
        self.findings = findings


@dataclass(frozen=True)
class HfMapping:
    """The mapped model section, Megatron arguments moeplan does not model (passed through to the
    launch verbatim) and notes on what the mapping approximates or leaves out."""

    architecture: str
    model: dict[str, Any]
    megatron_extra_args: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    moe: dict[str, Any] = field(default_factory=dict)  # `moe` fields the routing needs (Llama 4)
    family: str = ""  # the Hugging Face model_type record it was mapped through
    bridge: str = ""  # the Megatron-Bridge bridge that trains the family (or that none does)


def read_hf_json(path: str | Path) -> dict[str, Any]:
    """The config.json as a dict; anything that is not a readable JSON object is HfConfigUnreadable."""
    try:
        # transformers reads config.json with Python's json, which takes Infinity and NaN
        # (Nemotron-3's "time_step_limit": [0.0, Infinity]); _Reader refuses them where mapped.
        data = read_json(path, "hf_config", constants=True)
    except UnreadableInput as exc:
        raise HfConfigUnreadable(f"{exc}; expected a Hugging Face config.json") from None
    if not isinstance(data, dict):
        raise HfConfigUnreadable(f"{path}: a config.json is a JSON object, got {type(data).__name__}")
    return data


@dataclass
class _Reader:
    """Typed access to the HF keys; collects one finding per missing or mistyped key. A key whose
    target field the YAML already writes is not needed (the YAML wins anyway)."""

    hf: Mapping[str, Any]
    architecture: str
    where: str
    provided: Mapping[str, Any]
    findings: list[Finding] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    moe: dict[str, Any] = field(default_factory=dict)

    def _problem(self, key: str, message: str, fix: str) -> None:
        self.findings.append(Finding(CODE, "error", f"{self.where}.{key}", message, fix, SOURCE))

    def _get(self, key: str, target: str | None, default: Any, kind: str,
             check: Callable[[Any], bool]) -> Any:
        if target is not None and target in self.provided:
            return self.provided[target]
        value = self.hf.get(key, default)
        if value is None and default is _REQUIRED:  # stated null: no value, as when absent
            value = _REQUIRED
        if value is _REQUIRED:
            written = f", or write model.{target} in the YAML" if target else ""
            self._problem(key, f"{self.architecture} needs '{key}', which this config.json lacks",
                          f"add '{key}' from the model's published config.json{written}")
            return None
        if value is None or check(value):
            return value
        self._problem(key, f"'{key}' must be {kind}, got {value!r:.40}",
                      f"fix '{key}' in the config.json")
        return None

    def count(self, key: str, target: str | None = None, default: Any = None) -> Any:
        return self._get(key, target, default, "a non-negative 64-bit integer",
                         lambda v: isinstance(v, int) and not isinstance(v, bool)
                         and 0 <= v <= _INT_LIMIT)

    def number(self, key: str, target: str | None = None, default: Any = None) -> Any:
        return self._get(key, target, default, "a finite number",
                         lambda v: isinstance(v, int | float) and not isinstance(v, bool)
                         and math.isfinite(v) and abs(v) <= _INT_LIMIT)

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, None, default, "true or false", lambda v: isinstance(v, bool))
        return default if value is None else value

    def text(self, key: str, default: str) -> str:
        value = self._get(key, None, default, "a string", lambda v: isinstance(v, str))
        return default if value is None else value

    def unsupported(self, key: str, value: Any, why: str) -> None:
        self._problem(key, f"{key} = {value!r:.40}: {why}",
                      "write the model section by hand (moeplan cannot express this model exactly)")


_REQUIRED = object()
_INT_LIMIT = 2**63 - 1  # what Megatron's sizes fit in (the loader's limit too)


def _whole(value: Any) -> Any:
    """rope_theta is written as 1000000.0 in JSON; Megatron's --rotary-base is an integer."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _listable(layers: Any) -> bool:
    """A layer count the per-layer pattern can be written for (the schema refuses larger ones)."""
    return _positive(layers) and layers <= MAX_LAYERS


def _every_nth(flags: list[int], marked: int) -> int | None:
    """N >= 2 when exactly every N-th layer (1-based) is `marked`, else None: N can only be the
    first marked layer's number, so one comparison decides (a 100,000-layer list stays linear)."""
    first = next((i for i, flag in enumerate(flags) if flag == marked), None)
    if first is None or first < 1:
        return None
    n = first + 1
    return n if all((flag == marked) == ((i + 1) % n == 0) for i, flag in enumerate(flags)) else None


def _moe_pattern(flags: list[int]) -> int | list[int]:
    """Megatron's moe_layer_freq: 1 when every layer is MoE, else the 0/1 list per layer."""
    return 1 if flags and all(flags) else flags


def _common(r: _Reader, *, eps: float, theta: float,
            sizes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Fields every supported architecture shares: a pre-norm RMSNorm decoder with SwiGLU MLPs,
    rotary positions, no dropout and no linear biases in the MLPs. `sizes` holds the Hugging Face
    config class's defaults for the model sizes; without it they are required."""
    act = r.text("hidden_act", "silu")
    if act != "silu":
        r.unsupported("hidden_act", act, "moeplan maps SiLU-gated MLPs (Megatron --swiglu) only")
    size = (lambda key: sizes.get(key, _REQUIRED)) if sizes else (lambda key: _REQUIRED)
    # transformers 5 writes rope_theta inside rope_parameters (GLM-5's file has no other).
    nested = r.hf.get("rope_parameters")
    if isinstance(nested, Mapping) and "rope_theta" in nested:
        theta = nested["rope_theta"]
    return {
        "num_layers": r.count("num_hidden_layers", "num_layers", size("num_hidden_layers")),
        "hidden_size": r.count("hidden_size", "hidden_size", size("hidden_size")),
        "num_attention_heads": r.count("num_attention_heads", "num_attention_heads",
                                       size("num_attention_heads")),
        "vocab_size": r.count("vocab_size", "vocab_size", size("vocab_size")),
        "max_position_embeddings": r.count("max_position_embeddings", "max_position_embeddings",
                                           sizes.get("max_position_embeddings") if sizes else None),
        "normalization": "RMSNorm",
        "norm_epsilon": r.number("rms_norm_eps", "norm_epsilon", eps),
        "swiglu": True,
        "position_embedding_type": "rope",
        "rotary_base": _whole(r.number("rope_theta", "rotary_base", theta)),
        "untie_embeddings_and_output_weights": not r.flag("tie_word_embeddings", False),
        "hidden_dropout": 0.0,
        "attention_dropout": r.number("attention_dropout", "attention_dropout", 0.0),
        "add_bias_linear": False,
    }


def _gqa(r: _Reader, model: dict[str, Any], default_kv_heads: int | None,
         default_head_dim: int | None = None) -> None:
    """Standard attention's head layout: kv_channels = head_dim (default hidden / heads unless
    the config class names another), GQA when fewer KV heads."""
    heads, hidden = model["num_attention_heads"], model["hidden_size"]
    sizes = _positive(heads) and _positive(hidden)
    head_dim = default_head_dim or (hidden // heads if sizes else None)
    model["kv_channels"] = r.count("head_dim", "kv_channels", head_dim)
    kv_heads = r.count("num_key_value_heads", "num_query_groups", default_kv_heads or heads)
    if _positive(kv_heads) and _positive(heads) and kv_heads < heads:
        model["group_query_attention"] = True
        model["num_query_groups"] = kv_heads


def _rope_scaling(r: _Reader) -> Any:
    """The config's RoPE scaling: rope_scaling, or what transformers 5 keeps of it inside
    rope_parameters beside rope_theta when it re-saves a file (a rope_type other than "default",
    or multimodal sections)."""
    scaling = r.hf.get("rope_scaling")
    nested = r.hf.get("rope_parameters")
    if scaling or not isinstance(nested, Mapping):
        return scaling
    if nested.get("rope_type", "default") == "default" and "mrope_section" not in nested:
        return None
    return {key: value for key, value in nested.items() if key != "rope_theta"}


# Standard attention's YaRN as Megatron-LM dev@d48bd6be builds it for a GPT model
# (megatron/training/argument_utils.py _apply_yarn_config_from_args): --rotary-scaling-factor,
# and --yarn-original-max-position-embeddings / --yarn-beta-fast / --yarn-beta-slow /
# --[no-]yarn-correction-range-round-to-int with these defaults (YarnRotaryEmbedding's).
_STANDARD_YARN_DEFAULTS = {"original_max_position_embeddings": 4096, "beta_fast": 32.0,
                           "beta_slow": 1.0}


def _standard_rope(r: _Reader, model: dict[str, Any]) -> None:
    """Standard attention's RoPE scaling: YaRN maps to --position-embedding-type yarn; multimodal
    sections and other kinds (llama3, linear, dynamic) are noted as numerics moeplan leaves out."""
    scaling = _rope_scaling(r)
    key = "rope_scaling" if r.hf.get("rope_scaling") else "rope_parameters"
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
    if isinstance(scaling, dict) and "mrope_section" in scaling:
        r.notes.append(f"{key} mrope_section {scaling['mrope_section']!r:.40}: multimodal "
                       "RoPE (Megatron --position-embedding-type mrope --mrope-section) rotates "
                       "text tokens as plain RoPE; numerics only, no parameter or memory figure")
    elif kind == "yarn":
        _standard_yarn(r, model, key, scaling)
    elif scaling:
        r.notes.append(f"{key} {scaling!r:.80} is not mapped for standard attention (RoPE "
                       "numerics only; no parameter or memory figure changes): add Megatron's "
                       "--position-embedding-type yarn arguments by hand if you train with it")


class YarnUnmappable(ValueError):
    """A YaRN setting of a config moeplan cannot carry: the key (under the scaling object), its
    value and why."""

    def __init__(self, key: str, value: Any, why: str) -> None:
        super().__init__(f"YaRN {key} = {value!r:.40}: {why}")
        self.key, self.value, self.why = key, value, why


def standard_yarn(scaling: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """YaRN on standard attention, as (model fields, Megatron arguments, notes): the factor is a
    model field (it sets the concentration factor that keeps RoPE off Transformer Engine's fused
    kernel, so it changes the step time); the other YaRN settings are numerics only and travel as
    Megatron arguments where they differ from Megatron's defaults. transformers' `truncate: false`
    (gpt-oss) is Megatron's --no-yarn-correction-range-round-to-int; an explicit attention_factor
    has no Megatron spelling on standard attention (Megatron derives it from --mscale /
    --mscale-all-dim). Both Hugging Face readers (the family records and the no-record path) map
    it here."""
    for name in ["factor", *_STANDARD_YARN_DEFAULTS, "attention_factor"]:
        value = scaling.get(name)
        if name in scaling and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise YarnUnmappable(name, value, "expected a number")
    factor = float(scaling.get("factor", 1.0))
    if factor <= 0:
        raise YarnUnmappable("factor", factor, "expected a positive YaRN factor")
    args: list[str] = []
    for name, default in _STANDARD_YARN_DEFAULTS.items():
        value = scaling.get(name, default)
        if value != default:
            args += [f"--yarn-{name.replace('_', '-')}", str(value)]
    if scaling.get("truncate", True) is False:
        args.append("--no-yarn-correction-range-round-to-int")
    notes = [f"YaRN attention_factor = {scaling['attention_factor']} has no Megatron argument on "
             "standard attention (its YaRN derives the factor from --mscale and --mscale-all-dim); "
             "numerics only"] if "attention_factor" in scaling else []
    return {"position_embedding_type": "yarn", "rotary_scaling_factor": factor}, args, notes


def _standard_yarn(r: _Reader, model: dict[str, Any], key: str, scaling: dict[str, Any]) -> None:
    try:
        fields, args, notes = standard_yarn(scaling)
    except YarnUnmappable as bad:
        r.unsupported(f"{key}.{bad.key}", bad.value, bad.why)
        return
    model.update(fields)
    r.extra_args += args
    r.notes += notes


def _mla_rope(r: _Reader, model: dict[str, Any]) -> None:
    """YaRN of the DeepSeek family → MLATransformerConfig's rope_type / rotary_scaling_factor /
    original_max_position_embeddings; mscale values other than Megatron's defaults pass through.
    transformers 5 re-saves the scaling inside rope_parameters (beside rope_theta) and drops
    rope_scaling: Kimi-K2.5's file carries its YaRN only there."""
    scaling = _rope_scaling(r)
    if not scaling:
        model["rope_type"] = "rope"
        return
    if not isinstance(scaling, dict):
        r.unsupported("rope_scaling", scaling, "expected an object or null")
        return
    kind = scaling.get("type", scaling.get("rope_type"))
    if kind != "yarn":
        r.unsupported("rope_scaling", kind, "moeplan maps YaRN ('yarn') or no scaling for MLA")
        return
    numbers = {"factor": 1.0, **MLA_MSCALE_DEFAULTS, **_MLA_BETA_DEFAULTS}
    bad = [key for key in [*numbers, "original_max_position_embeddings"] if key in scaling
           and (not isinstance(scaling[key], int | float) or isinstance(scaling[key], bool))]
    if bad:
        r.unsupported(f"rope_scaling.{bad[0]}", scaling[bad[0]], "expected a number")
        return
    model["rope_type"] = "yarn"
    model["rotary_scaling_factor"] = float(scaling.get("factor", 1.0))
    model["original_max_position_embeddings"] = scaling.get("original_max_position_embeddings", 4096)
    for key, default in MLA_MSCALE_DEFAULTS.items():
        value = scaling.get(key, default)
        if value != default:
            r.extra_args += [f"--{key.replace('_', '-')}", str(value)]
    for key, default in _MLA_BETA_DEFAULTS.items():
        if scaling.get(key, default) != default:
            r.notes.append(f"rope_scaling.{key} = {scaling[key]} differs from Megatron's MLA "
                           f"default {default:g}, which no Megatron argument changes (YaRN "
                           "numerics only)")


# The router and layer-pattern keys a DeepSeek config.json may omit, defaulted as its own Hugging
# Face config class and modeling do (never from the other family): transformers
# src/transformers/models/deepseek_v2/configuration_deepseek_v2.py DeepseekV2Config (topk_method
# greedy, norm_topk_prob false, routed_scaling_factor 1.0, no groups, first_k_dense_replace 0, two
# shared experts; modeling_deepseek_v2.py scores with a softmax) and
# src/transformers/models/deepseek_v3/configuration_deepseek_v3.py DeepseekV3Config (n_group 8,
# topk_group 4, norm_topk_prob true, routed_scaling_factor 2.5, first_k_dense_replace 3, one
# shared expert; modeling_deepseek_v3.py DeepseekV3TopkRouter always scores with a sigmoid and an
# e_score_correction_bias, i.e. noaux_tc). Both default q_lora_rank to 1536 (null in the file
# means no query compression) and rope_theta to 10000, and know no MTP layer
# (num_nextn_predict_layers absent: none) and no moe_layer_freq (1).
_DEEPSEEK_ROUTER_DEFAULTS = {
    "DeepseekV2ForCausalLM": {"scoring_func": "softmax", "topk_method": "greedy",
                              "norm_topk_prob": False, "routed_scaling_factor": 1.0, "n_group": 1,
                              "topk_group": 1, "first_k_dense_replace": 0, "n_shared_experts": 2,
                              "q_lora_rank": 1536, "max_position_embeddings": 2048},
    "DeepseekV3ForCausalLM": {"scoring_func": "sigmoid", "topk_method": "noaux_tc",
                              "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 8,
                              "topk_group": 4, "first_k_dense_replace": 3, "n_shared_experts": 1,
                              "q_lora_rank": 1536, "max_position_embeddings": 4096},
}


def _deepseek(r: _Reader) -> dict[str, Any]:
    """DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (Kimi-K2 too): MLA, first-k dense layers,
    shared experts, softmax (V2) or sigmoid + expert-bias (V3) routing, optional MTP."""
    d = _DEEPSEEK_ROUTER_DEFAULTS[r.architecture]
    model = _common(r, eps=1e-6, theta=10000.0,
                    sizes={"max_position_embeddings": d["max_position_embeddings"]})
    moe_ffn = r.count("moe_intermediate_size", "moe_ffn_hidden_size", _REQUIRED)
    shared = r.count("n_shared_experts", None, d["n_shared_experts"]) or 0
    model.update({
        "multi_latent_attention": True,
        # null: no query compression; absent: the config class's 1536
        "q_lora_rank": r.count("q_lora_rank", "q_lora_rank", d["q_lora_rank"]),
        "kv_lora_rank": r.count("kv_lora_rank", "kv_lora_rank", _REQUIRED),
        "qk_head_dim": r.count("qk_nope_head_dim", "qk_head_dim", _REQUIRED),
        "qk_pos_emb_head_dim": r.count("qk_rope_head_dim", "qk_pos_emb_head_dim", _REQUIRED),
        "v_head_dim": r.count("v_head_dim", "v_head_dim", _REQUIRED),
        # Megatron's MLA normalises the q and kv latents (HF q_a_layernorm / kv_a_layernorm) in the
        # up-projections' fused norm when qk_layernorm is set (Megatron-LM dev@d48bd6be
        # megatron/core/models/gpt/gpt_layer_specs.py get_gpt_layer_with_transformer_engine_submodules).
        "qk_layernorm": True,
        "ffn_hidden_size": r.count("intermediate_size", "ffn_hidden_size", _REQUIRED),
        "num_experts": r.count("n_routed_experts", "num_experts", _REQUIRED),
        "moe_router_topk": r.count("num_experts_per_tok", "moe_router_topk", _REQUIRED),
        "moe_ffn_hidden_size": moe_ffn,
        "moe_shared_expert_intermediate_size": shared * moe_ffn if shared and moe_ffn else None,
        "mtp_num_layers": r.count("num_nextn_predict_layers", "mtp_num_layers", 0),
        # DeepSeek's HF MoEGate scores in fp32 (V3 casts the gate's inputs and weight to float32).
        "moe_router_dtype": "fp32",
    })
    first_dense = r.count("first_k_dense_replace", None, d["first_k_dense_replace"]) or 0
    every = r.count("moe_layer_freq", None, 1) or 1
    layers = model["num_layers"]
    if _listable(layers) and "moe_layer_freq" not in r.provided:
        model["moe_layer_freq"] = _moe_pattern(
            [int(i >= first_dense and i % every == 0) for i in range(layers)])
    _deepseek_router(r, model)
    _mla_rope(r, model)
    if r.flag("attention_bias", False):
        model["add_qkv_bias"] = True
        r.notes.append("attention_bias: HF also biases the output projection; Megatron's "
                       "--add-qkv-bias covers the q/kv projections only, and MLA's projections "
                       "take no QKV bias")
    return model


def _deepseek_router(r: _Reader, model: dict[str, Any]) -> None:
    """scoring_func / norm_topk_prob / routed_scaling_factor / topk_method / n_group → Megatron's
    router arguments. Softmax: HF V2 scales un-normalised top-k softmax scores, which is Megatron's
    pre-softmax path; with norm_topk_prob the top-k renormalised softmax equals a softmax over the
    top-k logits (Megatron's default post-softmax). Sigmoid: Megatron renormalises top-k scores."""
    d = _DEEPSEEK_ROUTER_DEFAULTS[r.architecture]
    scoring = r.text("scoring_func", d["scoring_func"])
    normalise = r.flag("norm_topk_prob", d["norm_topk_prob"])
    scale = r.number("routed_scaling_factor", "moe_router_topk_scaling_factor",
                     d["routed_scaling_factor"])
    method = r.text("topk_method", d["topk_method"])
    if scoring == "softmax":
        model["moe_router_score_function"] = "softmax"
        model["moe_router_pre_softmax"] = not normalise
        if not normalise and scale not in (None, 1, 1.0):
            model["moe_router_topk_scaling_factor"] = float(scale)
    elif scoring == "sigmoid":
        model["moe_router_score_function"] = "sigmoid"
        if scale not in (None, 1, 1.0):
            model["moe_router_topk_scaling_factor"] = float(scale)
        if not normalise:
            r.notes.append(sigmoid_renormalised_note())
    else:
        r.unsupported("scoring_func", scoring, "moeplan maps 'softmax' and 'sigmoid' scoring")
    if method == "noaux_tc":
        model["moe_router_enable_expert_bias"] = True
    groups, group_topk = r.count("n_group", None, d["n_group"]), r.count("topk_group", None,
                                                                       d["topk_group"])
    if method in ("group_limited_greedy", "noaux_tc") and groups and groups > 1:
        model["moe_router_num_groups"] = groups
        model["moe_router_group_topk"] = group_topk
        if method == "group_limited_greedy":
            r.notes.append("topk_method group_limited_greedy ranks groups by their best expert; "
                           "Megatron's group-limited routing ranks them by the sum of their top "
                           "(topk / group_topk) scores (routing choice only, no size change)")


def _qwen_moe(r: _Reader, *, qwen3: bool, defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Qwen2MoeForCausalLM / Qwen3MoeForCausalLM: GQA, softmax top-k routing, MoE every
    decoder_sparse_step-th layer except mlp_only_layers; Qwen2-MoE adds a gated shared expert and
    q/k/v biases, Qwen3-MoE q/k RMSNorm."""
    d = defaults or {}

    def need(key: str) -> Any:
        return d.get(key, _REQUIRED)  # the config class's default, else required

    model = _common(r, eps=d.get("rms_norm_eps", 1e-6), theta=d.get("rope_theta", 10000.0),
                    sizes=d or None)
    experts = ("num_local_experts" if "num_experts" not in r.hf and "num_local_experts" in r.hf
               else "num_experts")
    _gqa(r, model, d.get("num_key_value_heads"), d.get("head_dim"))
    _standard_rope(r, model)
    model.update({
        "qk_layernorm": qwen3,
        "ffn_hidden_size": r.count("intermediate_size", "ffn_hidden_size", need("intermediate_size")),
        # transformers 5 writes the expert count as num_local_experts (Qwen3MoeConfig's
        # attribute_map reads num_experts from it): a re-serialised file holds that name
        "num_experts": r.count(experts, "num_experts", need("num_experts")),
        "moe_router_topk": r.count("num_experts_per_tok", "moe_router_topk",
                                   need("num_experts_per_tok")),
        "moe_ffn_hidden_size": r.count("moe_intermediate_size", "moe_ffn_hidden_size",
                                       need("moe_intermediate_size")),
        "moe_router_score_function": "softmax",
        # norm_topk_prob renormalises the top-k of a full softmax = Megatron's post-softmax;
        # without it the weights are the full softmax's top-k = Megatron's pre-softmax.
        "moe_router_pre_softmax": not r.flag("norm_topk_prob", d.get("norm_topk_prob", False)),
    })
    step = r.count("decoder_sparse_step", None, 1) or 1
    dense_only = r.hf.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or not all(isinstance(i, int) for i in dense_only):
        r.unsupported("mlp_only_layers", dense_only, "expected a list of layer indices")
        dense_only = []
    layers = model["num_layers"]
    if _listable(layers) and "moe_layer_freq" not in r.provided:
        model["moe_layer_freq"] = _moe_pattern(
            [int(i not in dense_only and (i + 1) % step == 0) for i in range(layers)])
    if r.flag("use_sliding_window", False):
        r.unsupported("use_sliding_window", True, "sliding-window attention is not modelled")
    if qwen3 and r.flag("attention_bias", False):
        model["add_qkv_bias"] = True
    if not qwen3 or "shared_expert_intermediate_size" in d:  # Qwen2-MoE, Qwen3-Next
        shared = r.count("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size",
                         need("shared_expert_intermediate_size"))
        model["moe_shared_expert_intermediate_size"] = shared
        model["moe_shared_expert_gate"] = bool(shared)
    if not qwen3:
        model["add_qkv_bias"] = True  # Qwen2 attention always biases q, k and v
    return model


def _mixtral(r: _Reader) -> dict[str, Any]:
    """MixtralForCausalLM: GQA, every layer MoE, softmax top-k renormalised (= Megatron's
    post-softmax), no shared expert, no dense FFN."""
    model = _common(r, eps=1e-5, theta=1e6)
    _gqa(r, model, 8)
    _standard_rope(r, model)
    ffn = r.count("intermediate_size", "ffn_hidden_size", _REQUIRED)
    model.update({
        "qk_layernorm": False,
        "ffn_hidden_size": ffn,
        "num_experts": r.count("num_local_experts", "num_experts", _REQUIRED),
        "moe_router_topk": r.count("num_experts_per_tok", "moe_router_topk", _REQUIRED),
        "moe_ffn_hidden_size": ffn,
        "moe_layer_freq": 1,
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": False,
    })
    window = r.hf.get("sliding_window")
    if window is not None:
        r.unsupported("sliding_window", window, "sliding-window attention is not modelled (moeplan "
                      "would budget full attention); use a config.json with sliding_window null "
                      "to accept full-attention figures")
    return model


# ---- Current MoE architectures (gpt-oss, GLM-4.5, MiniMax-M2): each reader defaults an omitted
# key as that model's Hugging Face config class does (transformers src/transformers/models/<model>/
# configuration_<model>.py, cited per reader) or refuses it by name.

# transformers src/transformers/models/gpt_oss/configuration_gpt_oss.py GptOssConfig: the defaults
# are gpt-oss-120b's (default_theta 150000; layer_types alternate sliding / full from layer 0).
_GPT_OSS_DEFAULTS = {"num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64,
                     "vocab_size": 201088, "max_position_embeddings": 131072,
                     "rms_norm_eps": 1e-5, "rope_theta": 150000.0, "num_local_experts": 128,
                     "num_experts_per_tok": 4, "intermediate_size": 2880, "head_dim": 64,
                     "num_key_value_heads": 8, "sliding_window": 128, "swiglu_limit": 7.0,
                     "swiglu_alpha": 1.702, "attention_bias": True}
# Megatron's quick_gelu is x·sigmoid(1.702·x) (Megatron-LM dev@d48bd6be
# megatron/core/fusions/fused_bias_geglu.py quick_gelu); gpt-oss's GLU adds 1 to its linear half.
_QUICK_GELU_ALPHA, _GPT_OSS_GLU_OFFSET = 1.702, 1.0


def _window_pattern(r: _Reader, layers: Any, sliding: Any) -> dict[str, Any]:
    """HF layer_types → Megatron's window_attn_skip_freq: None when every layer slides, N when every
    N-th layer (1-based) is full, else the 1/0 list (1 = window)."""
    types = r.hf.get("layer_types")
    if types is None and _listable(layers):
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    known = ("sliding_attention", "full_attention")
    if not isinstance(types, list) or not all(t in known for t in types):
        r.unsupported("layer_types", types, "expected a list of 'sliding_attention' / "
                      "'full_attention'")
        return {}
    flags = [int(t == "sliding_attention") for t in types]
    if sliding is None or not any(flags):
        return {}
    period = _every_nth(flags, 0)
    # A YAML that writes its own num_layers keeps a periodic pattern; any other length mismatch
    # has no per-layer answer.
    regular = all(flags) or (period is not None and "num_layers" in r.provided)
    if _listable(layers) and len(types) != layers and not regular:
        r.unsupported("layer_types", f"{len(types)} entries", f"num_hidden_layers is {layers}")
        return {}
    # HF's sliding window W holds the query and the W - 1 keys before it (transformers
    # src/transformers/masking_utils.py sliding_window_overlay: kv_idx > q_idx - W); Megatron's
    # window (left, right) reads left keys before the query (megatron/core/transformer/
    # dot_product_attention.py, Transformer Engine's window_size).
    model: dict[str, Any] = {"window_size": [sliding - 1, 0]}
    if not all(flags) and "window_attn_skip_freq" not in r.provided:
        model["window_attn_skip_freq"] = period or flags
    return model


def _gpt_oss(r: _Reader) -> dict[str, Any]:
    """GptOssForCausalLM: GQA attention with learnable sinks and q/k/v/o biases, alternating
    sliding-window and full layers, every layer MoE with a biased router, top-k softmax over the
    chosen logits (Megatron's post-softmax), experts with biases and the clamped GLU
    (Megatron --quick-geglu --glu-linear-offset 1 --activation-func-clamp-value)."""
    d = _GPT_OSS_DEFAULTS
    model = _common(r, eps=d["rms_norm_eps"], theta=d["rope_theta"], sizes=d)
    _gqa(r, model, d["num_key_value_heads"], d["head_dim"])
    _standard_rope(r, model)
    alpha = r.number("swiglu_alpha", None, d["swiglu_alpha"])
    if alpha is not None and alpha != _QUICK_GELU_ALPHA:
        r.unsupported("swiglu_alpha", alpha, f"Megatron's quick-GEGLU fixes the gain at "
                      f"{_QUICK_GELU_ALPHA}")
    if not r.flag("attention_bias", d["attention_bias"]):
        r.unsupported("attention_bias", False, "Megatron's add_bias_linear biases every linear "
                      "layer; gpt-oss without attention biases has no Megatron spelling")
    ffn = r.count("intermediate_size", "moe_ffn_hidden_size", d["intermediate_size"])
    sliding = r.count("sliding_window", None, d["sliding_window"])
    if sliding == 0:
        r.unsupported("sliding_window", 0, "expected a positive window or null")
        sliding = None
    model.update({
        "swiglu": False, "quick_geglu": True, "glu_linear_offset": _GPT_OSS_GLU_OFFSET,
        "swiglu_limit": r.number("swiglu_limit", "swiglu_limit", d["swiglu_limit"]),
        "add_bias_linear": True, "softmax_type": "learnable", "qk_layernorm": False,
        "ffn_hidden_size": ffn, "moe_ffn_hidden_size": ffn,
        "num_experts": r.count("num_local_experts", "num_experts", d["num_local_experts"]),
        "moe_router_topk": r.count("num_experts_per_tok", "moe_router_topk",
                                   d["num_experts_per_tok"]),
        "moe_layer_freq": 1, "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": False,
    })
    model.update(_window_pattern(r, model["num_layers"], sliding))
    return model


# transformers src/transformers/models/glm4_moe/configuration_glm4_moe.py Glm4MoeConfig.__init__
# (GLM-4.5-Air's sizes). head_dim is no argument there: modeling_glm4_moe.py Glm4MoeAttention reads
# getattr(config, "head_dim", hidden_size // num_attention_heads); num_nextn_predict_layers is not
# either (the HF model builds no MTP layer), so an omitted one is none.
_GLM4_MOE_DEFAULTS = {"num_hidden_layers": 46, "hidden_size": 4096, "num_attention_heads": 96,
                      "vocab_size": 151552, "max_position_embeddings": 131072,
                      "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "intermediate_size": 10944,
                      "num_key_value_heads": 8, "partial_rotary_factor": 0.5,
                      "moe_intermediate_size": 1408, "num_experts_per_tok": 8,
                      "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0,
                      "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
                      "norm_topk_prob": True, "use_qk_norm": False, "attention_bias": False}


def _glm4_moe(r: _Reader) -> dict[str, Any]:
    """Glm4MoeForCausalLM (GLM-4.5, GLM-4.5-Air): GQA with q/k/v biases (no output bias: Megatron's
    --add-qkv-bias), optional per-head q/k RMSNorm, partial rotary, first-k dense layers, a shared
    expert, sigmoid routing with an expert-score correction bias (Megatron's expert bias), grouped
    top-k, fp32 router (modeling_glm4_moe.py Glm4MoeTopkRouter casts to float32), MTP layers."""
    d = _GLM4_MOE_DEFAULTS
    model = _common(r, eps=d["rms_norm_eps"], theta=d["rope_theta"], sizes=d)
    _gqa(r, model, d["num_key_value_heads"])
    _standard_rope(r, model)
    moe_ffn = r.count("moe_intermediate_size", "moe_ffn_hidden_size", d["moe_intermediate_size"])
    shared = r.count("n_shared_experts", None, d["n_shared_experts"]) or 0
    partial = r.number("partial_rotary_factor", "rotary_percent", d["partial_rotary_factor"])
    if partial is not None and not 0 < partial <= 1:
        r.unsupported("partial_rotary_factor", partial, "expected a share in (0, 1]")
    model.update({
        "qk_layernorm": r.flag("use_qk_norm", d["use_qk_norm"]),
        "add_qkv_bias": r.flag("attention_bias", d["attention_bias"]),
        "rotary_percent": float(partial) if partial is not None else None,
        "ffn_hidden_size": r.count("intermediate_size", "ffn_hidden_size", d["intermediate_size"]),
        "num_experts": r.count("n_routed_experts", "num_experts", d["n_routed_experts"]),
        "moe_router_topk": r.count("num_experts_per_tok", "moe_router_topk",
                                   d["num_experts_per_tok"]),
        "moe_ffn_hidden_size": moe_ffn,
        "moe_shared_expert_intermediate_size": shared * moe_ffn if shared and moe_ffn else None,
        "mtp_num_layers": r.count("num_nextn_predict_layers", "mtp_num_layers", 0),
        "moe_router_dtype": "fp32", "moe_router_score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
    })
    scale = r.number("routed_scaling_factor", "moe_router_topk_scaling_factor",
                     d["routed_scaling_factor"])
    if scale not in (None, 1, 1.0):
        model["moe_router_topk_scaling_factor"] = float(scale)
    if not r.flag("norm_topk_prob", d["norm_topk_prob"]):
        r.notes.append(sigmoid_renormalised_note())
    groups, group_topk = r.count("n_group", None, d["n_group"]), r.count("topk_group", None,
                                                                       d["topk_group"])
    if groups and groups > 1:
        model["moe_router_num_groups"], model["moe_router_group_topk"] = groups, group_topk
    first_dense = r.count("first_k_dense_replace", None, d["first_k_dense_replace"]) or 0
    layers = model["num_layers"]
    if _listable(layers) and "moe_layer_freq" not in r.provided:
        model["moe_layer_freq"] = _moe_pattern([int(i >= first_dense) for i in range(layers)])
    return model


# transformers src/transformers/models/minimax_m2/configuration_minimax_m2.py MiniMaxM2Config
# (default_theta 5e6; rotary_dim defaults to head_dim // 2). Its modeling_minimax_m2.py fixes the
# rest: q/k RMSNorm over all heads of the layer, sigmoid router scores with an
# e_score_correction_bias, top-k renormalised, no shared expert and no MTP module.
_MINIMAX_M2_DEFAULTS = {"num_hidden_layers": 62, "hidden_size": 3072, "num_attention_heads": 48,
                        "vocab_size": 200064, "max_position_embeddings": 196608,
                        "rms_norm_eps": 1e-6, "rope_theta": 5000000.0, "intermediate_size": 1536,
                        "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": 256,
                        "num_experts_per_tok": 8}


def _minimax_m2(r: _Reader) -> dict[str, Any]:
    """MiniMaxM2ForCausalLM: GQA full attention with per-layer q/k RMSNorm and partial rotary
    (rotary_dim of head_dim), every layer MoE with sigmoid scores and an expert bias."""
    d = _MINIMAX_M2_DEFAULTS
    model = _common(r, eps=d["rms_norm_eps"], theta=d["rope_theta"], sizes=d)
    _gqa(r, model, d["num_key_value_heads"], d["head_dim"])
    _standard_rope(r, model)
    head_dim = model["kv_channels"]
    rotary = r.count("rotary_dim", None, head_dim // 2 if _positive(head_dim) else None)
    if _positive(head_dim) and _positive(rotary) and rotary <= head_dim:
        model["rotary_percent"] = rotary / head_dim
    elif rotary is not None:
        r.unsupported("rotary_dim", rotary, f"expected 1 .. head_dim ({head_dim})")
    ffn = r.count("intermediate_size", "moe_ffn_hidden_size", d["intermediate_size"])
    if r.flag("use_mtp", False):
        r.notes.append("use_mtp: Hugging Face's MiniMax-M2 builds no MTP module (none is imported); "
                       "set model.mtp_num_layers to train some")
    # Keys HF's MiniMax-M2 modeling ignores but the published config.json states: what they say
    # must be what that modeling builds.
    for key, built in (("scoring_func", "sigmoid"), ("qk_norm_type", "per_layer"),
                       ("use_routing_bias", True), ("use_qk_norm", True)):
        if r.hf.get(key, built) != built:
            r.unsupported(key, r.hf[key], f"Hugging Face's MiniMax-M2 builds {key} = {built!r}")
    types = r.hf.get("attn_type_list")
    if isinstance(types, list) and any(t != 1 for t in types):
        r.unsupported("attn_type_list", types, "linear-attention layers (0) are MiniMax-01/M1's, "
                      "not MiniMax-M2's (every layer full attention)")
    if r.count("shared_intermediate_size", None, 0):
        r.unsupported("shared_intermediate_size", r.hf["shared_intermediate_size"],
                      "Hugging Face's MiniMax-M2 builds no shared expert")
    model.update({
        "qk_layernorm": True, "qk_layernorm_per_layer": True,
        "ffn_hidden_size": ffn, "moe_ffn_hidden_size": ffn,
        "num_experts": r.count("num_local_experts", "num_experts", d["num_local_experts"]),
        "moe_router_topk": r.count("num_experts_per_tok", "moe_router_topk",
                                   d["num_experts_per_tok"]),
        "moe_layer_freq": 1, "moe_router_score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
    })
    return model


# transformers src/transformers/models/llama4/configuration_llama4.py Llama4TextConfig (Scout's
# sizes; default_theta 500000): moe_layers from interleave_moe_layer_step, no_rope_layers (1 = RoPE)
# from no_rope_layer_interval, attention_chunk_size 8192 on the RoPE layers.
_LLAMA4_DEFAULTS = {"num_hidden_layers": 48, "hidden_size": 5120, "num_attention_heads": 40,
                    "vocab_size": 202048, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                    "rope_theta": 500000.0, "intermediate_size": 8192,
                    "intermediate_size_mlp": 16384, "num_key_value_heads": 8, "head_dim": 128,
                    "num_experts_per_tok": 1, "num_local_experts": 16,
                    "interleave_moe_layer_step": 1, "use_qk_norm": True,
                    "no_rope_layer_interval": 4, "attention_chunk_size": 8192,
                    "attention_bias": False}


def _layer_list(r: _Reader, key: str) -> list[int] | None:
    """A per-layer 0/1 list or index list the config.json states, checked."""
    value = r.hf.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                              for i in value):
        r.unsupported(key, value, "expected a list of integers")
        return None
    return value


def _llama4(r: _Reader) -> dict[str, Any]:
    """Llama4ForConditionalGeneration (its text_config) / Llama4ForCausalLM: GQA attention, RoPE
    except every no_rope_layer_interval-th layer (Megatron --no-rope-freq), L2 q/k norm on
    (--qk-l2-norm), chunked attention on the RoPE layers, MoE layers every
    interleave_moe_layer_step-th layer with a top-1 sigmoid router whose score scales the expert's
    input (--moe-apply-probs-on-input) plus a shared expert, dense layers intermediate_size_mlp
    wide."""
    d = _LLAMA4_DEFAULTS
    model = _common(r, eps=d["rms_norm_eps"], theta=d["rope_theta"], sizes=d)
    _gqa(r, model, d["num_key_value_heads"], d["head_dim"])
    _standard_rope(r, model)
    if r.flag("attention_bias", d["attention_bias"]):
        r.unsupported("attention_bias", True, "Llama 4 biases q/k/v/o only; Megatron's biases "
                      "cover q/k/v (--add-qkv-bias) or every linear layer")
    ffn = r.count("intermediate_size", "moe_ffn_hidden_size", d["intermediate_size"])
    model.update({
        "qk_layernorm": False, "qk_l2_norm": r.flag("use_qk_norm", d["use_qk_norm"]),
        "ffn_hidden_size": r.count("intermediate_size_mlp", "ffn_hidden_size",
                                   d["intermediate_size_mlp"]),
        "moe_ffn_hidden_size": ffn, "moe_shared_expert_intermediate_size": ffn,
        "num_experts": r.count("num_local_experts", "num_experts", d["num_local_experts"]),
        "moe_router_topk": r.count("num_experts_per_tok", "moe_router_topk", d["num_experts_per_tok"]),
        "moe_router_score_function": "sigmoid",
        "attention_chunk_size": r.count("attention_chunk_size", "attention_chunk_size",
                                        d["attention_chunk_size"]),
    })
    if model["moe_router_topk"] not in (None, 1):
        r.unsupported("num_experts_per_tok", model["moe_router_topk"], "Megatron scales the expert "
                      "input by the router score (--moe-apply-probs-on-input) for top-1 only")
    r.moe["moe_apply_probs_on_input"] = True
    layers = model["num_layers"]
    if not _listable(layers):
        return model
    step = r.count("interleave_moe_layer_step", None, d["interleave_moe_layer_step"]) or 1
    moe_layers = _layer_list(r, "moe_layers")
    if moe_layers is None:
        moe_layers = list(range(step - 1, layers, step))
    if "moe_layer_freq" not in r.provided:
        model["moe_layer_freq"] = _moe_pattern([int(i in moe_layers) for i in range(layers)])
    interval = r.count("no_rope_layer_interval", None, d["no_rope_layer_interval"])
    rope = _layer_list(r, "no_rope_layers")  # HF: 1 = the layer uses RoPE
    if rope is None and _positive(interval):
        rope = [int((i + 1) % interval != 0) for i in range(layers)]
    if not rope or all(rope) or "no_rope_freq" in r.provided:
        return model
    nope = [1 - flag for flag in rope]
    period = _every_nth(nope, 1)
    period = period if period and len(nope) % period == 0 else None
    # A YAML that writes its own num_layers keeps a periodic pattern (as for gpt-oss's windows).
    if len(rope) != layers and not (period and "num_layers" in r.provided):
        r.unsupported("no_rope_layers", f"{len(rope)} entries", f"num_hidden_layers is {layers}")
        return model
    model["no_rope_freq"] = period or nope
    return model


# transformers src/transformers/models/qwen3_next/configuration_qwen3_next.py Qwen3NextConfig
# (partial_rotary_factor 0.25; layer_types from full_attention_interval 4: every 4th layer full
# attention, the others gated DeltaNet); rope_theta is PreTrainedConfig's default 10000.
_QWEN3_NEXT_DEFAULTS = {"num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 16,
                        "vocab_size": 151936, "max_position_embeddings": 32768,
                        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "intermediate_size": 5632,
                        "num_key_value_heads": 2, "head_dim": 256, "linear_conv_kernel_dim": 4,
                        "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                        "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                        "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                        "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": True,
                        "partial_rotary_factor": 0.25, "full_attention_interval": 4}
_LINEAR_DIMS = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                "linear_num_key_heads", "linear_num_value_heads")


def _qwen3_next(r: _Reader) -> dict[str, Any]:
    """Qwen3NextForCausalLM: Qwen3-MoE's routing with a gated shared expert, gated full attention
    (q_proj also yields the sigmoid output gate: Megatron's attention_output_gate) with q/k RMSNorm
    and partial rotary on every full_attention_interval-th layer, gated DeltaNet on the others
    (Megatron's experimental_attention_variant gated_delta_net with its linear_* dims)."""
    d = _QWEN3_NEXT_DEFAULTS
    model = _qwen_moe(r, qwen3=True, defaults=d)
    if r.hf.get("mtp_num_hidden_layers"):  # Qwen3.5: transformers builds no MTP layer
        r.notes.append(f"mtp_num_hidden_layers {r.hf['mtp_num_hidden_layers']!r:.10}: the MTP "
                       "layer(s) are not imported (transformers builds none); set "
                       "model.mtp_num_layers to train them")
    model["attention_output_gate"] = True
    partial = r.number("partial_rotary_factor", "rotary_percent", d["partial_rotary_factor"])
    if partial is not None and not 0 < partial <= 1:
        r.unsupported("partial_rotary_factor", partial, "expected a share in (0, 1]")
    elif partial is not None:
        model["rotary_percent"] = float(partial)
    for key in _LINEAR_DIMS:
        model[key] = r.count(key, key, d[key])
    layers = model["num_layers"]
    types = r.hf.get("layer_types")
    if types is None and _listable(layers):
        interval = r.count("full_attention_interval", None, d["full_attention_interval"]) or 1
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or not all(t in ("linear_attention", "full_attention")
                                              for t in types):
        r.unsupported("layer_types", types, "expected 'linear_attention' / 'full_attention' per layer")
        return model
    flags = [int(t == "linear_attention") for t in types]
    period = _every_nth(flags, 0)
    if _listable(layers) and len(flags) != layers and not (period and "num_layers" in r.provided):
        r.unsupported("layer_types", f"{len(flags)} entries", f"num_hidden_layers is {layers}")
    elif any(flags) and "linear_attention_freq" not in r.provided:
        model["linear_attention_freq"] = period or flags
    return model


_DEEPSEEK_ROUTER_DEFAULTS["DeepseekV32ForCausalLM"] = _DEEPSEEK_ROUTER_DEFAULTS["DeepseekV3ForCausalLM"]


def _deepseek_v32(r: _Reader) -> dict[str, Any]:
    """DeepseekV32ForCausalLM (deepseek-ai/DeepSeek-V3.2-Exp): the DeepSeek-V3 architecture plus the
    lightning indexer of DSA (index_n_heads, index_head_dim, index_topk: Megatron's
    --dsa-indexer-*). transformers ships no config class for it, so an omitted indexer key is
    refused by name, and the rest defaults as DeepseekV3Config."""
    model = _deepseek(r)
    model.update({
        "dsa": True,
        "index_n_heads": r.count("index_n_heads", "index_n_heads", _REQUIRED),
        "index_head_dim": r.count("index_head_dim", "index_head_dim", _REQUIRED),
        "index_topk": r.count("index_topk", "index_topk", _REQUIRED),
    })
    return model


# transformers src/transformers/models/deepseek_v4/configuration_deepseek_v4.py DeepseekV4Config
# (V4-Flash's sizes; layer_types from the legacy compress_ratios 0/4/128 = sliding / CSA / HCA,
# mlp_layer_types from num_hash_layers, qk_rope_head_dim = head_dim x partial_rotary_factor).
_DEEPSEEK_V4_DEFAULTS = {"num_hidden_layers": 43, "hidden_size": 4096, "num_attention_heads": 64,
                         "vocab_size": 129280, "max_position_embeddings": 1048576,
                         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "num_key_value_heads": 1,
                         "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024,
                         "moe_intermediate_size": 2048, "n_routed_experts": 256,
                         "n_shared_experts": 1, "num_experts_per_tok": 6,
                         "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5,
                         "compress_rope_theta": 160000.0, "hc_mult": 4, "hc_sinkhorn_iters": 20,
                         "hc_eps": 1e-6, "num_hash_layers": 3, "swiglu_limit": 10.0,
                         "sliding_window": 128, "o_groups": 8, "o_lora_rank": 1024,
                         "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
                         "num_nextn_predict_layers": 1}
# Megatron's DSv4 ratios (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py
# TransformerConfig.__post_init__: "csa_compress_ratios must be 0, 4, or 128"); transformers'
# layer_types spell them by name, with compress_rates giving CSA's and HCA's.
_V4_LAYER_TYPES = {"sliding_attention": None, "compressed_sparse_attention": 4,
                   "heavily_compressed_attention": 128}
_V4_RATIOS = (0, 4, 128)


def _v4_ratios(r: _Reader, layers: Any, mtp: Any) -> list[int] | None:
    """The per-layer compress ratios, MTP layers included (Megatron indexes the list past the
    decoder for its MTP layers; the released files end with the MTP layer's 0)."""
    ratios = r.hf.get("compress_ratios")
    if ratios is None and isinstance(r.hf.get("layer_types"), list):
        rates = r.hf.get("compress_rates") or {}
        if not isinstance(rates, dict):
            r.unsupported("compress_rates", rates, "expected an object of layer type -> ratio")
            return None
        named = {kind: rates.get(kind, ratio) or 0 for kind, ratio in _V4_LAYER_TYPES.items()}
        unknown = [t for t in r.hf["layer_types"] if t not in named]
        if unknown:
            r.unsupported("layer_types", unknown[0], f"DeepSeek-V4 layers are {', '.join(named)}")
            return None
        ratios = [named[t] for t in r.hf["layer_types"]]
    if ratios is None:
        r.unsupported("compress_ratios", None, "a DeepSeek-V4 config.json names each layer's "
                      "compression (compress_ratios or layer_types); without it the layer program "
                      "is the config class's guess, not this model's")
        return None
    if not isinstance(ratios, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                               for x in ratios):
        r.unsupported("compress_ratios", ratios, "expected a list of integers")
        return None
    wrong = sorted({x for x in ratios if x not in _V4_RATIOS})
    if wrong:
        r.unsupported("compress_ratios", wrong, "Megatron's DeepSeek-V4 attention takes 0 (window "
                      "only), 4 (CSA) or 128 (HCA)")
        return None
    if not (_listable(layers) and isinstance(mtp, int)):
        return ratios
    if len(ratios) < layers:
        r.unsupported("compress_ratios", f"{len(ratios)} entries", f"num_hidden_layers is {layers}")
        return None
    if len(ratios) < layers + mtp:  # MTP layers compress nothing (the released files' last 0)
        r.notes.append(f"compress_ratios lists {len(ratios)} layers: the {mtp} MTP layer(s) are "
                       "given ratio 0 (window only), as the released DeepSeek-V4 files write them")
        ratios = ratios + [0] * (layers + mtp - len(ratios))
    return ratios


def _v4_hash_layers(r: _Reader, layers: Any) -> Any:
    """num_hash_layers, or the leading hash_moe entries of mlp_layer_types (Megatron hashes the
    first moe_n_hash_layers layers only)."""
    kinds = r.hf.get("mlp_layer_types")
    if kinds is None:
        return r.count("num_hash_layers", "moe_n_hash_layers", _DEEPSEEK_V4_DEFAULTS["num_hash_layers"])
    if not isinstance(kinds, list) or any(k not in ("hash_moe", "moe") for k in kinds):
        r.unsupported("mlp_layer_types", kinds, "expected 'hash_moe' / 'moe' per layer")
        return None
    leading = next((i for i, k in enumerate(kinds) if k != "hash_moe"), len(kinds))
    if "hash_moe" in kinds[leading:]:
        r.unsupported("mlp_layer_types", kinds, "Megatron hash-routes the first moe_n_hash_layers "
                      "layers only (--moe-n-hash-layers), not hash layers after a routed one")
        return None
    return leading


def _deepseek_v4(r: _Reader) -> dict[str, Any]:
    """DeepseekV4ForCausalLM (V4-Pro, V4-Flash): Megatron's dsv4_hybrid attention (one shared
    512-wide K/V head, low-rank q, grouped low-rank output, a sliding window on every layer plus
    CSA (ratio 4, with the lightning indexer) or HCA (ratio 128) compression per layer), every
    layer MoE with a shared expert, hash routing on the first layers, sqrt-softplus scores with
    an expert bias, mHC residual streams, MTP. Names as Megatron-LM dev@d48bd6be
    megatron/training/arguments.py (--experimental-attention-variant dsv4_hybrid)."""
    d = _DEEPSEEK_V4_DEFAULTS
    model = _common(r, eps=d["rms_norm_eps"], theta=d["rope_theta"], sizes=d)
    head_dim = r.count("head_dim", "kv_channels", d["head_dim"])
    rope = r.count("qk_rope_head_dim", "qk_pos_emb_head_dim", d["qk_rope_head_dim"])
    kv_heads = r.count("num_key_value_heads", "num_query_groups", d["num_key_value_heads"])
    if kv_heads not in (None, 1):
        r.unsupported("num_key_value_heads", kv_heads, "DeepSeek-V4 attention shares one K/V head")
    if r.flag("attention_bias", False):
        r.unsupported("attention_bias", True, "Megatron's DeepSeek-V4 attention has no biases")
    moe_ffn = r.count("moe_intermediate_size", "moe_ffn_hidden_size", d["moe_intermediate_size"])
    shared = r.count("n_shared_experts", None, d["n_shared_experts"]) or 0
    mtp = r.count("num_nextn_predict_layers", "mtp_num_layers", d["num_nextn_predict_layers"])
    hc = r.count("hc_mult", "num_residual_streams", d["hc_mult"])
    scoring = r.text("scoring_func", d["scoring_func"])
    if scoring not in ("sqrtsoftplus", "sigmoid", "softmax"):
        r.unsupported("scoring_func", scoring, "Megatron scores experts by softmax, sigmoid or "
                      "sqrtsoftplus")
    if not r.flag("norm_topk_prob", True):
        r.notes.append("norm_topk_prob false: Megatron renormalises the top-k scores of a "
                       "sqrtsoftplus/sigmoid router (routing weights differ)")
    if r.number("hc_eps", None, d["hc_eps"]) not in (None, d["hc_eps"]):
        r.notes.append(f"hc_eps {r.hf['hc_eps']} differs from Megatron's mHC epsilon 1e-6, which "
                       "no argument changes (Sinkhorn numerics only)")
    model.update({
        "attention_variant": "dsv4_hybrid", "qk_layernorm": True,
        "num_query_groups": kv_heads, "kv_channels": head_dim, "qk_pos_emb_head_dim": rope,
        # Megatron derives the K/V latent as the non-rotary head part (head_dim - rope).
        "kv_lora_rank": head_dim - rope if _positive(head_dim) and _positive(rope)
        and rope < head_dim else None,
        "q_lora_rank": r.count("q_lora_rank", "q_lora_rank", d["q_lora_rank"]),
        "o_groups": r.count("o_groups", "o_groups", d["o_groups"]),
        "o_lora_rank": r.count("o_lora_rank", "o_lora_rank", d["o_lora_rank"]),
        "csa_window_size": r.count("sliding_window", "csa_window_size", d["sliding_window"]),
        "index_n_heads": r.count("index_n_heads", "index_n_heads", d["index_n_heads"]),
        "index_head_dim": r.count("index_head_dim", "index_head_dim", d["index_head_dim"]),
        "index_topk": r.count("index_topk", "index_topk", d["index_topk"]),
        # No dense layer: transformers reads intermediate_size as moe_intermediate_size.
        "ffn_hidden_size": moe_ffn, "moe_ffn_hidden_size": moe_ffn,
        "num_experts": r.count("n_routed_experts", "num_experts", d["n_routed_experts"]),
        "moe_router_topk": r.count("num_experts_per_tok", "moe_router_topk",
                                   d["num_experts_per_tok"]),
        "moe_shared_expert_intermediate_size": shared * moe_ffn if shared and moe_ffn else None,
        "moe_n_hash_layers": _v4_hash_layers(r, model["num_layers"]),
        "mtp_num_layers": mtp,
        "enable_hyper_connections": bool(hc and hc > 1),
        "num_residual_streams": hc,
        "mhc_sinkhorn_iterations": r.count("hc_sinkhorn_iters", "mhc_sinkhorn_iterations",
                                           d["hc_sinkhorn_iters"]),
        "moe_router_score_function": scoring,
        "moe_router_enable_expert_bias": r.text("topk_method", "noaux_tc") == "noaux_tc",
        "swiglu_limit": r.number("swiglu_limit", "swiglu_limit", d["swiglu_limit"]),
        "csa_compress_rotary_base": r.number("compress_rope_theta", "csa_compress_rotary_base",
                                             d["compress_rope_theta"]),
        "compress_ratios": _v4_ratios(r, model["num_layers"], mtp),
    })
    if model["csa_compress_rotary_base"] is not None:
        model["csa_compress_rotary_base"] = float(model["csa_compress_rotary_base"])
    scale = r.number("routed_scaling_factor", "moe_router_topk_scaling_factor",
                     d["routed_scaling_factor"])
    if scale not in (None, 1, 1.0):
        model["moe_router_topk_scaling_factor"] = float(scale)
    if "n_group" in r.hf and r.hf["n_group"] not in (None, 1):
        r.unsupported("n_group", r.hf["n_group"], "DeepSeek-V4 routes without expert groups")
    _mla_rope(r, model)
    return model


# transformers src/transformers/models/glm4_moe_lite/configuration_glm4_moe_lite.py Glm4MoeLiteConfig
# (GLM-4.7-Flash's sizes): n_group 1, routed_scaling_factor 1.8, one shared expert, q_lora_rank 768;
# its modeling_glm4_moe_lite.py Glm4MoeLiteTopkRouter scores with a sigmoid and an
# e_score_correction_bias (noaux_tc) in fp32; mlp_layer_types defaults to one dense layer.
_DEEPSEEK_ROUTER_DEFAULTS["Glm4MoeLiteForCausalLM"] = {
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "routed_scaling_factor": 1.8, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "n_shared_experts": 1, "q_lora_rank": 768, "max_position_embeddings": 202752}


def _glm4_moe_lite(r: _Reader) -> dict[str, Any]:
    """Glm4MoeLiteForCausalLM (GLM-4.7-Flash): the DeepSeek-V3 stack (MLA with q/kv latents,
    dense then MoE layers, a shared expert, sigmoid routing with an expert bias, MTP), its dense
    layers named by mlp_layer_types ('dense' / 'sparse') when the file lists them."""
    model = _deepseek(r)
    partial = r.number("partial_rotary_factor", None, 1.0)
    if partial not in (None, 1, 1.0):
        r.unsupported("partial_rotary_factor", partial, "MLA rotates all qk_rope_head_dim dims")
    kinds = r.hf.get("mlp_layer_types")
    if kinds is not None and "moe_layer_freq" not in r.provided:
        if not isinstance(kinds, list) or any(k not in ("dense", "sparse") for k in kinds):
            r.unsupported("mlp_layer_types", kinds, "expected 'dense' / 'sparse' per layer")
        elif _listable(model["num_layers"]) and len(kinds) != model["num_layers"]:
            r.unsupported("mlp_layer_types", f"{len(kinds)} entries",
                          f"num_hidden_layers is {model['num_layers']}")
        else:
            model["moe_layer_freq"] = _moe_pattern([int(k == "sparse") for k in kinds])
    return model


# transformers src/transformers/models/glm_moe_dsa/configuration_glm_moe_dsa.py GlmMoeDsaConfig
# (GLM-5's sizes): sigmoid router with an expert bias, first_k_dense_replace 3, one shared expert,
# routed_scaling_factor 2.5, q_lora_rank 2048, the indexer's 32 heads of 128 keeping 2048 keys.
_DEEPSEEK_ROUTER_DEFAULTS["GlmMoeDsaForCausalLM"] = {
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 3,
    "n_shared_experts": 1, "q_lora_rank": 2048, "max_position_embeddings": 202752}
_GLM_DSA_INDEXER = {"index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048}


def _glm_moe_dsa(r: _Reader) -> dict[str, Any]:
    """GlmMoeDsaForCausalLM (GLM-5, GLM-5.1, GLM-5.2): GLM-4.7-Flash's DeepSeek-V3 stack with DSA,
    a lightning indexer (modeling_glm_moe_dsa.py GlmMoeDsaIndexer: wq_b from the q latent, wk, a
    LayerNorm'd key, weights_proj), as DeepSeek-V3.2's (Megatron --dsa-indexer-*). GLM-5.2's
    indexer_types 'shared' layers build no indexer and reuse the last 'full' layer's top-k:
    Megatron's --dsa-indexer-topk-freq / --dsa-indexer-skip-topk-offset, when one pair gives
    exactly those layers (planner/config/dsa_share.py), else refused naming the key."""
    model = _glm4_moe_lite(r)
    model["dsa"] = True
    for key, default in _GLM_DSA_INDEXER.items():
        model[key] = r.count(key, key, default)
    # transformers 5.25's GlmMoeDsaConfig writes 'indexed_attention' on every layer (the DSA
    # attention with its indexer), the earlier files 'full_attention': the same layer
    kinds = r.hf.get("layer_types")
    allowed = ("full_attention", "indexed_attention", "deepseek_sparse_attention")
    if kinds is not None and (not isinstance(kinds, list) or any(k not in allowed for k in kinds)):
        r.unsupported("layer_types", kinds, "moeplan prices DSA attention ("
                      + " or ".join(repr(a) for a in allowed) + ") on every layer")
    share = _glm_indexer_share(r, model["num_layers"])
    if share is not None and share[0] > 1:
        model["dsa_indexer_topk_freq"], model["dsa_indexer_skip_topk_offset"] = share
        computing = sum(computes_topk(i, *share) for i in range(model["num_layers"]))
        r.notes.append(f"DSA top-k shared across layers: {computing} of {model['num_layers']} "
                       f"layers build an indexer and compute their top-k, the others reuse the "
                       f"last one's (Megatron --dsa-indexer-topk-freq {share[0]} "
                       f"--dsa-indexer-skip-topk-offset {share[1]}); every pipeline stage must "
                       "start on a computing layer (ARC012)")
    return model


def _glm_indexer_pattern(r: _Reader, layers: int) -> tuple[str, Any, list[bool] | None]:
    """(key, value, per-layer 'full') of the indexer program as GlmMoeDsaConfig.__post_init__
    resolves it: indexer_types, else index_topk_pattern ('F'/'S' per layer, or a list), else
    index_topk_freq with index_skip_topk_offset (its default 2); None where it is malformed."""
    for key in ("indexer_types", "index_topk_pattern"):
        value = r.hf.get(key)
        if value is None:
            continue
        names = ([{"F": "full", "S": "shared"}.get(c) for c in value] if isinstance(value, str)
                 else value if isinstance(value, list) else None)
        if names is None or len(names) != layers or any(n not in ("full", "shared") for n in names):
            return key, value, None
        return key, value, [n == "full" for n in names]
    freq, offset = r.hf.get("index_topk_freq", 1), r.hf.get("index_skip_topk_offset", 2)
    if not all(isinstance(x, int) and not isinstance(x, bool) and abs(x) <= _INT_LIMIT
               for x in (freq, offset)):
        return "index_topk_freq", [freq, offset], None
    freq = max(freq, 1)
    return ("index_topk_freq", f"{freq} with index_skip_topk_offset {offset}",
            [max(i - offset + 1, 0) % freq == 0 for i in range(layers)])


def _glm_indexer_share(r: _Reader, layers: Any) -> tuple[int, int] | None:
    """Megatron's (dsa_indexer_topk_freq, dsa_indexer_skip_topk_offset) for the file's indexer
    program, the file's own index_topk_freq / index_skip_topk_offset first; None (and a finding
    naming the key) where no pair gives the same 'full' layers."""
    if not _listable(layers):
        return None
    key, value, full = _glm_indexer_pattern(r, layers)
    if full is None:
        r.unsupported(key, value, "expected integers (with index_skip_topk_offset)"
                      if key == "index_topk_freq" else
                      f"expected 'full' / 'shared' on each of the {layers} layers")
        return None
    prefer = (r.hf.get("index_topk_freq"), r.hf.get("index_skip_topk_offset"))
    share = share_of(full, prefer if all(isinstance(x, int) and not isinstance(x, bool)
                                         for x in prefer) else None)  # type: ignore[arg-type]
    if share is None:
        shown = ",".join(str(i) for i, f in enumerate(full) if f)
        r.unsupported(key, value, f"its 'full' layers ({shown}) are not every n-th layer after an "
                      "offset, which is all Megatron's --dsa-indexer-topk-freq / "
                      "--dsa-indexer-skip-topk-offset can express (dsa.py is_dsa_skip_topk_layer)")
    return share


# transformers src/transformers/models/nemotron_h/configuration_nemotron_h.py NemotronHConfig and
# Megatron-LM dev@d48bd6be megatron/core/ssm/mamba_mixer.py MambaMixer: Megatron's Mamba-2 mixer has
# a conv1d of width 4 with a bias, no projection biases, and scans in chunks of 128 (the figures
# moeplan's record prices); the MoE router scores with a sigmoid and a correction bias in fp32
# (modeling_nemotron_h.py NemotronHTopkRouter), as Megatron-Bridge's provider configures Megatron.
_NEMOTRON_H_FIXED = {"conv_kernel": 4, "chunk_size": 128, "use_conv_bias": True,
                     "mamba_proj_bias": False, "attention_bias": False, "mlp_bias": False,
                     "n_group": 1, "topk_group": 1}


# transformers configuration_nemotron_h.py NemotronHConfig._pattern_to_list and
# configuration_utils.py _LEGACY_LAYER_TYPE_REMAP: each block type's --hybrid-layer-pattern symbol
_NEMOTRON_BLOCKS = {"linear_attention": "M", "mamba": "M", "full_attention": "*",
                    "attention": "*", "moe": "E", "mlp": "-"}


def _nemotron_pattern(r: _Reader, keys: tuple[str, ...]) -> tuple[str | None, str]:
    """The layer program in Megatron's symbols from the first of `keys` the file states: the
    released files' pattern string, or transformers 5's block-type list (which it writes on
    re-saving); None (and the key) when it is neither."""
    key = next((k for k in keys if r.hf.get(k) is not None), keys[0])
    value = r.hf.get(key)
    if isinstance(value, list) and value and all(b in _NEMOTRON_BLOCKS for b in value
                                                 if isinstance(b, str)) \
            and all(isinstance(b, str) for b in value):
        value = "".join(_NEMOTRON_BLOCKS[b] for b in value)
    if not isinstance(value, str) or not value or set(value) - set("M*E-"):
        return None, key
    return value, key


def _nemotron_h(r: _Reader) -> dict[str, Any]:
    """NemotronHForCausalLM (Nemotron-3 Nano / Super): Megatron's hybrid stack, its layer program
    the file's hybrid_override_pattern (M Mamba-2, * attention, E MoE, - dense MLP) written as
    --hybrid-layer-pattern, with one '/*E' MTP depth per num_nextn_predict_layers; squared-ReLU
    MLPs, no position embedding."""
    pattern, key = _nemotron_pattern(r, ("hybrid_override_pattern", "layers_block_type",
                                         "layer_types"))
    if pattern is None:
        r.unsupported(key, r.hf.get(key), "expected a string of M, *, E and - (Megatron's "
                      "--hybrid-layer-pattern symbols) or a list of "
                      + ", ".join(sorted(_NEMOTRON_BLOCKS)))
    # transformers 5 derives num_hidden_layers from the block list, which is then the only count
    listed = key != "hybrid_override_pattern" and pattern is not None
    layers = r.count("num_hidden_layers", None, len(pattern) if listed else _REQUIRED)
    if pattern is not None and isinstance(layers, int) and len(pattern) != layers and not listed:
        r.unsupported(key, f"{len(pattern)} symbols", f"num_hidden_layers is {layers}")
    mtp, mtp_key = _nemotron_pattern(r, ("mtp_hybrid_override_pattern", "mtp_layers_block_type"))
    if mtp is None and r.hf.get(mtp_key) is not None:
        r.unsupported(mtp_key, r.hf.get(mtp_key), "expected an MTP depth's blocks as the layers'")
    for key, fixed in _NEMOTRON_H_FIXED.items():
        value = r.hf.get(key, fixed)
        if value != fixed:
            r.unsupported(key, value, f"Megatron's hybrid model fixes {key} at {fixed!r}")
    act = r.text("mlp_hidden_act", "relu2")
    if act != "relu2":
        r.unsupported("mlp_hidden_act", act, "Megatron's hybrid MLPs here are squared ReLU")
    if r.flag("norm_topk_prob", True) is not True:
        r.unsupported("norm_topk_prob", False, "Megatron's sigmoid router renormalises the top-k")
    depths = r.count("num_nextn_predict_layers", "mtp_num_layers", 0) or 0
    shared = r.count("n_shared_experts", None, 1)
    shared_size = r.count("moe_shared_expert_intermediate_size", None, _REQUIRED)
    model: dict[str, Any] = {
        "hidden_size": r.count("hidden_size", "hidden_size", _REQUIRED),
        "num_attention_heads": r.count("num_attention_heads", "num_attention_heads", _REQUIRED),
        "vocab_size": r.count("vocab_size", "vocab_size", _REQUIRED),
        "max_position_embeddings": r.count("max_position_embeddings", "max_position_embeddings", None),
        "position_embedding_type": "none",
        "normalization": "RMSNorm",
        "norm_epsilon": r.number("layer_norm_epsilon", "norm_epsilon", 1e-5),
        "squared_relu": True,
        "untie_embeddings_and_output_weights": not r.flag("tie_word_embeddings", False),
        "hidden_dropout": r.number("hidden_dropout", "hidden_dropout", 0.0),
        "attention_dropout": r.number("attention_dropout", "attention_dropout", 0.0),
        "add_bias_linear": False,
        "mamba_num_heads": r.count("mamba_num_heads", "mamba_num_heads", _REQUIRED),
        "mamba_head_dim": r.count("mamba_head_dim", "mamba_head_dim", _REQUIRED),
        "mamba_state_dim": r.count("ssm_state_size", "mamba_state_dim", _REQUIRED),
        "mamba_num_groups": r.count("n_groups", "mamba_num_groups", _REQUIRED),
        "ffn_hidden_size": r.count("intermediate_size", "ffn_hidden_size", _REQUIRED),
        "num_experts": r.count("n_routed_experts", "num_experts", _REQUIRED),
        "moe_router_topk": r.count("num_experts_per_tok", "moe_router_topk", _REQUIRED),
        "moe_ffn_hidden_size": r.count("moe_intermediate_size", "moe_ffn_hidden_size", _REQUIRED),
        "moe_router_score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
        "moe_router_topk_scaling_factor": r.number("routed_scaling_factor",
                                                   "moe_router_topk_scaling_factor", 1.0),
        "moe_router_dtype": "fp32",
    }
    if isinstance(shared, int) and isinstance(shared_size, int) and shared:
        model["moe_shared_expert_intermediate_size"] = shared * shared_size
    _gqa(r, model, None)
    if pattern is not None:
        model["hybrid_layer_pattern"] = pattern + f"/{mtp or '*E'}" * depths
    # Latent MoE (Nemotron-3 Super): the routed experts run at moe_latent_size between a
    # hidden -> latent and a latent -> hidden projection (transformers modeling_nemotron_h.py
    # NemotronHMoE fc1_latent_proj / fc2_latent_proj; Megatron-LM dev@d48bd6be
    # megatron/core/transformer/moe/moe_layer.py MoELayer, --moe-latent-size).
    latent = r.count("moe_latent_size", None, None)
    if latent is not None:
        r.moe["moe_latent_size"] = latent
    return model


# transformers 5.25 src/transformers/models/kimi_linear/configuration_kimi_linear.py
# KimiLinearConfig: its defaults, and the names its attribute_map reads the published file's keys
# under (num_experts, num_experts_per_token, num_shared_experts, num_expert_group,
# moe_renormalize, model_max_length); the file nests the KDA dims and the layer lists in
# linear_attn_config (1-based layer numbers), which win over the flat linear_* keys.
_KIMI_LINEAR_DEFAULTS = {"num_hidden_layers": 27, "hidden_size": 2304, "num_attention_heads": 32,
                         "vocab_size": 163840, "max_position_embeddings": 1048576}
_KIMI_LINEAR_KEYS = {  # moeplan field: (KimiLinearConfig's key, its spelling in the file, default)
    "num_experts": ("num_local_experts", "num_experts", 256),
    "moe_router_topk": ("num_experts_per_tok", "num_experts_per_token", 8),
    "n_shared": ("n_shared_experts", "num_shared_experts", 1),
    "n_group": ("n_group", "num_expert_group", 1),
}
_KIMI_KDA_DIMS = (("kda_head_dim", "head_dim", "linear_head_dim", 128),
                  ("kda_num_heads", "num_heads", "linear_num_heads", 32),
                  ("linear_conv_kernel_dim", "short_conv_kernel_size", "linear_conv_kernel_dim", 4))


def _kimi_key(r: _Reader, own: str, spelt: str, target: str | None, default: Any) -> Any:
    """A KimiLinearConfig count under its own name or the file's attribute_map spelling."""
    return r.count(spelt if spelt in r.hf or own not in r.hf else own, target, default)


def _kimi_layer_types(r: _Reader, layers: Any, nested: Mapping[str, Any]) -> list[str] | None:
    """KimiLinearConfig.__post_init__'s layer_types: the file's own, else linear_attn_config's
    1-based full_attn_layers and kda_layers (a layer in neither is built as KDA: transformers
    builds full attention only where it says "full_attention"), else full attention on every
    0-based index i > 0 divisible by 4."""
    types = r.hf.get("layer_types")
    if types is None and _listable(layers):
        if "full_attn_layers" in nested and "kda_layers" in nested:
            full = nested["full_attn_layers"]
            if not isinstance(full, list) or not all(
                    isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= layers for i in full):
                r.unsupported("linear_attn_config.full_attn_layers", full,
                              f"expected 1-based layer numbers up to {layers}")
                return None
            types = ["full_attention" if i + 1 in full else "linear_attention" for i in range(layers)]
        else:
            types = ["full_attention" if i and i % 4 == 0 else "linear_attention"
                     for i in range(layers)]
    if not isinstance(types, list) or not all(isinstance(t, str | None) for t in types):
        r.unsupported("layer_types", types, "expected one 'full_attention' / 'linear_attention' "
                      "per layer")
        return None
    if _listable(layers) and len(types) != layers:
        r.unsupported("layer_types", f"{len(types)} entries", f"num_hidden_layers is {layers}")
        return None
    return types


def _kimi_linear(r: _Reader) -> dict[str, Any]:
    """KimiLinearForCausalLM (moonshotai/Kimi-Linear-48B-A3B): Kimi Delta Attention layers
    (model.kda_layers) among NoPE MLA layers without query compression, DeepSeek-V3's MoE (sigmoid
    router with an expert bias, shared experts, first_k_dense_replace dense layers). Megatron-LM
    has no KDA layer: moeplan plans it and `emit megatron` refuses it."""
    model = _common(r, eps=1e-5, theta=10000.0, sizes=_KIMI_LINEAR_DEFAULTS)
    _kimi_beyond_transformers(r)
    if "model_max_length" in r.hf:  # KimiLinearConfig's attribute_map: max_position_embeddings
        model["max_position_embeddings"] = r.count("model_max_length", "max_position_embeddings")
    nested = r.hf.get("linear_attn_config") or {}
    if not isinstance(nested, Mapping):
        r.unsupported("linear_attn_config", nested, "expected an object")
        nested = {}
    keys = {name: _kimi_key(r, own, spelt, None if name in ("n_shared", "n_group") else name,
                            default) for name, (own, spelt, default) in _KIMI_LINEAR_KEYS.items()}
    moe_ffn = r.count("moe_intermediate_size", "moe_ffn_hidden_size", 1024)
    shared = keys["n_shared"] or 0
    # KimiLinearAttention (modeling_kimi_linear.py): DeepSeek-V2's MLA "with NoPE": the rope part
    # of the key keeps its width but no rotary embedding is applied
    model.update({
        "multi_latent_attention": True, "position_embedding_type": "none",
        "q_lora_rank": r.count("q_lora_rank", "q_lora_rank", None),
        "kv_lora_rank": r.count("kv_lora_rank", "kv_lora_rank", 512),
        "qk_head_dim": r.count("qk_nope_head_dim", "qk_head_dim", 128),
        "qk_pos_emb_head_dim": r.count("qk_rope_head_dim", "qk_pos_emb_head_dim", 64),
        "v_head_dim": r.count("v_head_dim", "v_head_dim", 128),
        "qk_layernorm": True,  # the kv latent's norm (kv_a_layernorm), as DeepSeek's
        "ffn_hidden_size": r.count("intermediate_size", "ffn_hidden_size", 9216),
        "num_experts": keys["num_experts"], "moe_router_topk": keys["moe_router_topk"],
        "moe_ffn_hidden_size": moe_ffn,
        "moe_shared_expert_intermediate_size": shared * moe_ffn if shared and moe_ffn else None,
        "moe_router_dtype": "fp32",  # KimiLinearTopkRouter scores in fp32
        "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
    })
    scale = r.number("routed_scaling_factor", "moe_router_topk_scaling_factor", 2.446)
    if scale not in (None, 1, 1.0):
        model["moe_router_topk_scaling_factor"] = float(scale)
    renorm = "moe_renormalize" if "moe_renormalize" in r.hf else "norm_topk_prob"
    if not r.flag(renorm, True):
        r.notes.append(sigmoid_renormalised_note(renorm))
    groups = keys["n_group"]
    if groups and groups > 1:
        model["moe_router_num_groups"] = groups
        model["moe_router_group_topk"] = r.count("topk_group", None, 1)
    for name, key, flat, default in _KIMI_KDA_DIMS:
        model[name] = _kimi_nested(r, nested, key, flat, name, default)
    # the per-layer lists follow the file's own depth; a YAML that writes fewer layers keeps
    # the first num_layers of them
    layers = model["num_layers"]
    own = r.hf.get("num_hidden_layers", _KIMI_LINEAR_DEFAULTS["num_hidden_layers"])
    depth = own if _listable(own) else layers
    types = _kimi_layer_types(r, depth, nested)
    mlp = r.hf.get("mlp_layer_types")
    if mlp is None and _listable(depth):
        first = r.count("first_k_dense_replace", None, 1) or 0
        mlp = ["dense" if i < first else "sparse" for i in range(depth)]
    if not isinstance(mlp, list) or not all(t in ("dense", "sparse") for t in mlp) or (
            _listable(depth) and len(mlp) != depth):
        r.unsupported("mlp_layer_types", mlp, "expected 'dense' / 'sparse' per layer")
        mlp = None
    if _listable(layers) and _listable(depth) and layers > depth:
        r.unsupported("num_hidden_layers", own, f"the YAML's num_layers {layers} is deeper than "
                      "the file's layer lists")
        return model
    keep = layers if _listable(layers) else None  # an unusable num_layers is its own finding
    if types is not None and "kda_layers" not in r.provided:
        model["kda_layers"] = [int(t != "full_attention") for t in types][:keep]
    if mlp is not None and "moe_layer_freq" not in r.provided:
        model["moe_layer_freq"] = _moe_pattern([int(t == "sparse") for t in mlp][:keep])
    r.notes.append("Megatron-Bridge: NVIDIA-NeMo/Megatron-Bridge@067f987d has no bridge for "
                   "kimi_linear; the fork michal2409/Megatron-Bridge@269a192c trains it with "
                   "KimiLinearBridge (src/megatron/bridge/models/kimi/kimi_linear_bridge.py) and "
                   "its own KDA layer spec (kimi_linear_spec.py), not Megatron-LM's arguments")
    return model


# Keys of later Kimi stacks (Kimi-K3's text_config is model_type kimi_linear too) that change the
# network, which transformers 5.25's KimiLinear ignores and builds without: counting its build
# would count another model than the checkpoint's.
_KIMI_BEYOND = {
    "mla_use_output_gate": "a sigmoid output gate on the MLA layers",
    "routed_expert_hidden_size": "routed experts behind a latent projection",
    "latent_moe_use_norm": "a norm inside the latent MoE projection",
    "attn_res_block_size": "attention residuals across blocks",
}


def _kimi_beyond_transformers(r: _Reader) -> None:
    """Refuse, by key, what makes the file another network than transformers 5.25's KimiLinear
    (KimiLinearConfig has no such field, so transformers builds the model without it)."""
    for key, what in _KIMI_BEYOND.items():
        value = r.hf.get(key)
        if value not in (None, False, 0):
            r.unsupported(key, value, f"{what}: transformers 5.25's KimiLinearForCausalLM builds "
                          "none (KimiLinearConfig has no such field) and moeplan has no layer kind "
                          "for it")
    nested = r.hf.get("linear_attn_config")
    if isinstance(nested, Mapping) and nested.get("use_full_rank_gate"):
        r.unsupported("linear_attn_config.use_full_rank_gate", nested["use_full_rank_gate"],
                      "a full-rank KDA decay gate: transformers 5.25's KimiLinearForgetGate is "
                      "low-rank (f_a, f_b) and moeplan's KDA record counts that one")


def _kimi_nested(r: _Reader, nested: Mapping[str, Any], key: str, flat: str, field: str,
                 default: int) -> Any:
    """A KDA dim as KimiLinearConfig reads it: linear_attn_config's key, else the flat linear_*
    key, else the class default."""
    if key in nested:
        value = nested[key]
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        r.unsupported(f"linear_attn_config.{key}", value, "expected a positive integer")
        return None
    return r.count(flat, field, default)


ARCHITECTURES: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "KimiLinearForCausalLM": _kimi_linear,
    "NemotronHForCausalLM": _nemotron_h,
    "DeepseekV4ForCausalLM": _deepseek_v4,
    "Glm4MoeLiteForCausalLM": _glm4_moe_lite,
    "GlmMoeDsaForCausalLM": _glm_moe_dsa,
    "DeepseekV32ForCausalLM": _deepseek_v32,
    "Qwen3NextForCausalLM": _qwen3_next,
    "Llama4ForConditionalGeneration": _llama4,
    "Llama4ForCausalLM": _llama4,
    "GptOssForCausalLM": _gpt_oss,
    "MiniMaxM2ForCausalLM": _minimax_m2,
    "Glm4MoeForCausalLM": _glm4_moe,
    "DeepseekV2ForCausalLM": _deepseek,
    "DeepseekV3ForCausalLM": _deepseek,
    "Qwen2MoeForCausalLM": lambda r: _qwen_moe(r, qwen3=False),
    "Qwen3MoeForCausalLM": lambda r: _qwen_moe(r, qwen3=True),
    "MixtralForCausalLM": _mixtral,
}


def _unknown_architecture(found: Any, model_type: Any, where: str) -> Finding:
    supported = ", ".join(BY_ARCHITECTURE)
    fix = f"supported: {supported}; otherwise write the model section by hand"
    return Finding(CODE, "error", f"{where}.architectures",
                   f"architectures {found!r:.80} (model_type {model_type!r:.40}) names no "
                   "family moeplan can map", fix, SOURCE)


def map_hf_config(hf: Mapping[str, Any], *, where: str = "model.hf_config",
                  provided: Mapping[str, Any] | None = None) -> HfMapping:
    """The moeplan model fields for this config.json, found through its family record
    (planner/config/importers/hf_families.py). `provided` holds the fields the YAML writes
    itself: keys feeding only those are not required. Raises HfConfigUnmappable."""
    names = hf.get("architectures")
    family = family_of(names, hf.get("model_type"))
    if family is None:
        raise HfConfigUnmappable([_unknown_architecture(names, hf.get("model_type"), where)])
    named = [n for n in names if isinstance(n, str) and n in BY_ARCHITECTURE] if isinstance(
        names, list) else []
    text, where = _text_config(hf, family, where)
    reader = _Reader(text, family.reader, where, provided or {})
    for tower in family.towers:
        if hf.get(tower) is not None:
            reader.notes.append(f"{tower}: this tower is left out of the budget (moeplan plans the "
                                "text decoder; the model card's total counts the tower too); to "
                                "budget it on the first stage as Megatron-Bridge trains it, set "
                                "training.frozen_tower_params / training.trained_tower_params")
    model = ARCHITECTURES[family.reader](reader)
    if reader.findings:
        raise HfConfigUnmappable(reader.findings)
    return HfMapping(
        architecture=named[0] if named else family.architectures[0],
        model={key: value for key, value in model.items() if value is not None},
        megatron_extra_args=tuple(reader.extra_args),
        notes=tuple(reader.notes),
        moe=dict(reader.moe),
        family=family.model_type,
        bridge=family.bridge_line(),
    )


def _text_config(hf: Mapping[str, Any], family: Family, where: str) -> tuple[Mapping[str, Any], str]:
    """The decoder's own keys: a multimodal wrapper nests them under its text_config key
    (transformers configuration_llama4.py Llama4Config: an absent text_config is
    Llama4TextConfig()'s defaults; configuration_kimi_k25.py Kimi_K25Config: a deepseek_v3 one)."""
    if family.text_config is None:
        return hf, where
    text = hf.get(family.text_config)
    stack = dict(text) if isinstance(text, Mapping) else {}
    stack.update({key: hf[key] for key in family.wrapper_keys if key in hf})
    return stack, f"{where}.{family.text_config}"


def apply_hf_config(data: dict[str, Any], base_dir: Path | None) -> tuple[dict[str, Any],
                                                                         list[Finding]]:
    """The loader's hook for `model: {hf_config: PATH}` (PATH relative to the YAML file's folder;
    the config.json's contents as a mapping work too): fill the model section from the HF config.
    Fields the YAML writes win, as with presets (a preset fills only what both leave open);
    arguments moeplan does not model join launch.megatron_extra_args unless the YAML lists them.
    Returns the data and the findings; an unreadable file raises HfConfigUnreadable."""
    model = data.get("model")
    if not isinstance(model, dict) or "hf_config" not in model:
        return data, []
    source = model["hf_config"]
    own = {key: value for key, value in model.items() if key != "hf_config"}
    if isinstance(source, str):
        path = Path(source) if base_dir is None else base_dir / source
        try:
            hf = read_hf_json(path)
        except HfConfigUnreadable as exc:
            raise HfConfigUnreadable(f"model.hf_config: {exc}") from None
    elif isinstance(source, dict):
        hf = source
    else:
        return data, [Finding(CODE, "error", "model.hf_config",
                              f"must be a path to a Hugging Face config.json, got {source!r:.40}",
                              "give model.hf_config: path/to/config.json (relative to the YAML)",
                              SOURCE)]
    try:
        mapping = map_hf_config(hf, provided=own)
    except HfConfigUnmappable as exc:
        return data, exc.findings
    resolved = {**data, "model": {**mapping.model, **own}}
    if mapping.moe and isinstance(data.get("moe", {}), dict):  # the YAML's moe fields win
        resolved["moe"] = {**mapping.moe, **data.get("moe", {})}
    launch = data.get("launch", {})
    if mapping.megatron_extra_args and isinstance(launch, dict):
        written = launch.get("megatron_extra_args") or []
        if isinstance(written, list):
            flags = [arg for arg in mapping.megatron_extra_args if arg.startswith("--")]
            if not any(flag in written for flag in flags):
                resolved["launch"] = {**launch, "megatron_extra_args": [
                    *written, *mapping.megatron_extra_args]}
    return resolved, []

"""Hugging Face `config.json` → moeplan `model` fields, named as Megatron-LM's arguments.

A model published on Hugging Face describes itself in a config.json; this module reads one and
returns the `model` section that builds the same network in Megatron-LM dev@d48bd6be (argument
names from megatron/training/arguments.py and the TransformerConfig / MLATransformerConfig fields
of megatron/core/transformer/transformer_config.py). Architectures: DeepSeek-V2/V3 (Kimi-K2 uses
the V3 architecture), Qwen2-MoE/Qwen3-MoE, Mixtral. Routing semantics follow Megatron-LM
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

from planner.config.schema import MAX_LAYERS
from planner.files.json_input import read_json
from planner.files.reading import UnreadableInput
from planner.findings import Finding

SOURCE = "planner/config/importers/hf_config.py::map_hf_config"
CODE = "CFG007"
# MLATransformerConfig's YaRN defaults (Megatron-LM dev@d48bd6be transformer_config.py): values
# equal to these need no argument; --mscale/--mscale-all-dim exist on the command line, the betas
# do not (only --yarn-beta-* of standard attention's YaRN).
_MLA_MSCALE_DEFAULTS = {"mscale": 1.0, "mscale_all_dim": 0.0}
_MLA_BETA_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0}


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


def read_hf_json(path: str | Path) -> dict[str, Any]:
    """The config.json as a dict; anything that is not a readable JSON object is HfConfigUnreadable."""
    try:
        data = read_json(path, "hf_config")
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

    def _problem(self, key: str, message: str, fix: str) -> None:
        self.findings.append(Finding(CODE, "error", f"{self.where}.{key}", message, fix, SOURCE))

    def _get(self, key: str, target: str | None, default: Any, kind: str,
             check: Callable[[Any], bool]) -> Any:
        if target is not None and target in self.provided:
            return self.provided[target]
        value = self.hf.get(key, default)
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


def _moe_pattern(flags: list[int]) -> int | list[int]:
    """Megatron's moe_layer_freq: 1 when every layer is MoE, else the 0/1 list per layer."""
    return 1 if flags and all(flags) else flags


def _common(r: _Reader, *, eps: float, theta: float) -> dict[str, Any]:
    """Fields every supported architecture shares: a pre-norm RMSNorm decoder with SwiGLU MLPs,
    rotary positions, no dropout and no linear biases in the MLPs."""
    act = r.text("hidden_act", "silu")
    if act != "silu":
        r.unsupported("hidden_act", act, "moeplan maps SiLU-gated MLPs (Megatron --swiglu) only")
    return {
        "num_layers": r.count("num_hidden_layers", "num_layers", _REQUIRED),
        "hidden_size": r.count("hidden_size", "hidden_size", _REQUIRED),
        "num_attention_heads": r.count("num_attention_heads", "num_attention_heads", _REQUIRED),
        "vocab_size": r.count("vocab_size", "vocab_size", _REQUIRED),
        "max_position_embeddings": r.count("max_position_embeddings", "max_position_embeddings"),
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


def _gqa(r: _Reader, model: dict[str, Any], default_kv_heads: int | None) -> None:
    """Standard attention's head layout: kv_channels = head_dim, GQA when fewer KV heads."""
    heads, hidden = model["num_attention_heads"], model["hidden_size"]
    sizes = _positive(heads) and _positive(hidden)
    model["kv_channels"] = r.count("head_dim", "kv_channels", hidden // heads if sizes else None)
    kv_heads = r.count("num_key_value_heads", "num_query_groups", default_kv_heads or heads)
    if _positive(kv_heads) and _positive(heads) and kv_heads < heads:
        model["group_query_attention"] = True
        model["num_query_groups"] = kv_heads


def _no_rope_scaling(r: _Reader) -> None:
    scaling = r.hf.get("rope_scaling")
    if scaling:
        r.notes.append(f"rope_scaling {scaling!r:.80} is not mapped for standard attention (RoPE "
                       "numerics only; no parameter or memory figure changes): add Megatron's "
                       "--position-embedding-type yarn arguments by hand if you train with it")


def _mla_rope(r: _Reader, model: dict[str, Any]) -> None:
    """YaRN of the DeepSeek family → MLATransformerConfig's rope_type / rotary_scaling_factor /
    original_max_position_embeddings; mscale values other than Megatron's defaults pass through."""
    scaling = r.hf.get("rope_scaling")
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
    numbers = {"factor": 1.0, **_MLA_MSCALE_DEFAULTS, **_MLA_BETA_DEFAULTS}
    bad = [key for key in [*numbers, "original_max_position_embeddings"] if key in scaling
           and (not isinstance(scaling[key], int | float) or isinstance(scaling[key], bool))]
    if bad:
        r.unsupported(f"rope_scaling.{bad[0]}", scaling[bad[0]], "expected a number")
        return
    model["rope_type"] = "yarn"
    model["rotary_scaling_factor"] = float(scaling.get("factor", 1.0))
    model["original_max_position_embeddings"] = scaling.get("original_max_position_embeddings", 4096)
    for key, default in _MLA_MSCALE_DEFAULTS.items():
        value = scaling.get(key, default)
        if value != default:
            r.extra_args += [f"--{key.replace('_', '-')}", str(value)]
    for key, default in _MLA_BETA_DEFAULTS.items():
        if scaling.get(key, default) != default:
            r.notes.append(f"rope_scaling.{key} = {scaling[key]} differs from Megatron's MLA "
                           f"default {default:g}, which no Megatron argument changes (YaRN "
                           "numerics only)")


def _deepseek(r: _Reader) -> dict[str, Any]:
    """DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (Kimi-K2 too): MLA, first-k dense layers,
    shared experts, softmax (V2) or sigmoid + expert-bias (V3) routing, optional MTP."""
    model = _common(r, eps=1e-6, theta=10000.0)
    moe_ffn = r.count("moe_intermediate_size", "moe_ffn_hidden_size", _REQUIRED)
    shared = r.count("n_shared_experts", None, 0) or 0
    model.update({
        "multi_latent_attention": True,
        "q_lora_rank": r.count("q_lora_rank", "q_lora_rank"),  # null: no query compression
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
    first_dense = r.count("first_k_dense_replace", None, 0) or 0
    every = r.count("moe_layer_freq", None, 1) or 1
    layers = model["num_layers"]
    if _listable(layers) and "moe_layer_freq" not in r.provided:
        model["moe_layer_freq"] = _moe_pattern(
            [int(i >= first_dense and i % every == 0) for i in range(layers)])
    _deepseek_router(r, model)
    _mla_rope(r, model)
    if r.flag("attention_bias", False):
        r.extra_args.append("--add-qkv-bias")
        r.notes.append("attention_bias: HF also biases the output projection; Megatron's "
                       "--add-qkv-bias covers the q/kv projections only (a few vectors per layer)")
    return model


def _deepseek_router(r: _Reader, model: dict[str, Any]) -> None:
    """scoring_func / norm_topk_prob / routed_scaling_factor / topk_method / n_group → Megatron's
    router arguments. Softmax: HF V2 scales un-normalised top-k softmax scores, which is Megatron's
    pre-softmax path; with norm_topk_prob the top-k renormalised softmax equals a softmax over the
    top-k logits (Megatron's default post-softmax). Sigmoid: Megatron renormalises top-k scores."""
    scoring = r.text("scoring_func", "softmax")
    normalise = r.flag("norm_topk_prob", False)
    scale = r.number("routed_scaling_factor", "moe_router_topk_scaling_factor", 1.0)
    method = r.text("topk_method", "greedy")
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
            r.notes.append("norm_topk_prob false with sigmoid scoring: Megatron always "
                           "renormalises the top-k sigmoid scores (routing weights differ)")
    else:
        r.unsupported("scoring_func", scoring, "moeplan maps 'softmax' and 'sigmoid' scoring")
    if method == "noaux_tc":
        model["moe_router_enable_expert_bias"] = True
    groups, group_topk = r.count("n_group", None, 1), r.count("topk_group", None, 1)
    if method in ("group_limited_greedy", "noaux_tc") and groups and groups > 1:
        model["moe_router_num_groups"] = groups
        model["moe_router_group_topk"] = group_topk
        if method == "group_limited_greedy":
            r.notes.append("topk_method group_limited_greedy ranks groups by their best expert; "
                           "Megatron's group-limited routing ranks them by the sum of their top "
                           "(topk / group_topk) scores (routing choice only, no size change)")


def _qwen_moe(r: _Reader, *, qwen3: bool) -> dict[str, Any]:
    """Qwen2MoeForCausalLM / Qwen3MoeForCausalLM: GQA, softmax top-k routing, MoE every
    decoder_sparse_step-th layer except mlp_only_layers; Qwen2-MoE adds a gated shared expert and
    q/k/v biases, Qwen3-MoE q/k RMSNorm."""
    model = _common(r, eps=1e-6, theta=10000.0)
    _gqa(r, model, None)
    _no_rope_scaling(r)
    model.update({
        "qk_layernorm": qwen3,
        "ffn_hidden_size": r.count("intermediate_size", "ffn_hidden_size", _REQUIRED),
        "num_experts": r.count("num_experts", "num_experts", _REQUIRED),
        "moe_router_topk": r.count("num_experts_per_tok", "moe_router_topk", _REQUIRED),
        "moe_ffn_hidden_size": r.count("moe_intermediate_size", "moe_ffn_hidden_size", _REQUIRED),
        "moe_router_score_function": "softmax",
        # norm_topk_prob renormalises the top-k of a full softmax = Megatron's post-softmax;
        # without it the weights are the full softmax's top-k = Megatron's pre-softmax.
        "moe_router_pre_softmax": not r.flag("norm_topk_prob", False),
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
    if qwen3:
        if r.flag("attention_bias", False):
            r.extra_args.append("--add-qkv-bias")
    else:
        shared = r.count("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size",
                       _REQUIRED)
        model["moe_shared_expert_intermediate_size"] = shared
        model["moe_shared_expert_gate"] = bool(shared)
        r.extra_args.append("--add-qkv-bias")  # Qwen2 attention always biases q, k and v
        r.notes.append("Qwen2 q/k/v biases pass through as --add-qkv-bias; moeplan does not "
                       "count them (3 vectors per layer)")
    return model


def _mixtral(r: _Reader) -> dict[str, Any]:
    """MixtralForCausalLM: GQA, every layer MoE, softmax top-k renormalised (= Megatron's
    post-softmax), no shared expert, no dense FFN."""
    model = _common(r, eps=1e-5, theta=1e6)
    _gqa(r, model, 8)
    _no_rope_scaling(r)
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


ARCHITECTURES: dict[str, Callable[[_Reader], dict[str, Any]]] = {
    "DeepseekV2ForCausalLM": _deepseek,
    "DeepseekV3ForCausalLM": _deepseek,
    "Qwen2MoeForCausalLM": lambda r: _qwen_moe(r, qwen3=False),
    "Qwen3MoeForCausalLM": lambda r: _qwen_moe(r, qwen3=True),
    "MixtralForCausalLM": _mixtral,
}


def _unknown_architecture(found: Any, where: str) -> Finding:
    supported = ", ".join(ARCHITECTURES)
    v4 = any("V4" in str(name) for name in found) if isinstance(found, list) else False
    fix = ("use model.preset deepseek-v4-pro or deepseek-v4-flash: the DeepSeek-V4 config.json "
           "format is not documented well enough to map" if v4 else
           f"supported: {supported}; otherwise write the model section by hand")
    return Finding(CODE, "error", f"{where}.architectures",
                   f"architectures {found!r:.80} names no architecture moeplan can map", fix, SOURCE)


def map_hf_config(hf: Mapping[str, Any], *, where: str = "model.hf_config",
                  provided: Mapping[str, Any] | None = None) -> HfMapping:
    """The moeplan model fields for this config.json. `provided` holds the fields the YAML writes
    itself: keys feeding only those are not required. Raises HfConfigUnmappable."""
    names = hf.get("architectures")
    known = [n for n in names if isinstance(n, str) and n in ARCHITECTURES] if isinstance(
        names, list) else []
    if not known:
        raise HfConfigUnmappable([_unknown_architecture(names, where)])
    reader = _Reader(hf, known[0], where, provided or {})
    model = ARCHITECTURES[known[0]](reader)
    if reader.findings:
        raise HfConfigUnmappable(reader.findings)
    return HfMapping(
        architecture=known[0],
        model={key: value for key, value in model.items() if value is not None},
        megatron_extra_args=tuple(reader.extra_args),
        notes=tuple(reader.notes),
    )


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
    launch = data.get("launch", {})
    if mapping.megatron_extra_args and isinstance(launch, dict):
        written = launch.get("megatron_extra_args") or []
        if isinstance(written, list):
            flags = [arg for arg in mapping.megatron_extra_args if arg.startswith("--")]
            if not any(flag in written for flag in flags):
                resolved["launch"] = {**launch, "megatron_extra_args": [
                    *written, *mapping.megatron_extra_args]}
    return resolved, []

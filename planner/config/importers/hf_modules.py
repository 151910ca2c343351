"""Which moeplan layer kinds a transformers model is made of, read off its modules' classes and
shapes: the no-record path of `import hf` (planner/commands/hf_meta.py builds the model on the meta
device) maps a model_type moeplan has no family record for onto the model section when every
decoder layer is a known kind, and names the first module that is not.

Known kinds, each as Megatron builds it: softmax attention with q/k/v/o projections
(Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py SelfAttention.__init__: heads,
query groups and head dim from the projection shapes; q/k RMSNorm per head, or over every head
at once (OLMoE's, MiniMax-M2's: model.qk_layernorm_per_layer); q/k/v biases; an output gate
per head or per channel; sinks; window layers' own heads, KV groups and widths), multi-latent
attention (its latents and head widths from the shapes); a SwiGLU MLP (gate/up/down); a routed MoE
block (a router of N x hidden, N experts of one SwiGLU size, fused or listed; a shared expert,
gated or not; a correction bias); the two pre-norms of a layer, or sandwich norms. Anything else
(an extra norm, a per-layer scalar, a second attention, a fused QKV, a linear-attention mixer) is
refused with its class and layer index: moeplan would price a different model. What the shapes do
not say (router scoring, RoPE only on window layers, the gate's activation) is read off the
modules' forward code where it is unambiguous, else noted or refused. Duck-typed over torch modules
(`named_children`, `named_parameters`, `.shape`), so this module imports no torch.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from planner.config.importers.hf_config import (
    MLA_MSCALE_DEFAULTS,
    sigmoid_renormalised_note,
    standard_yarn,
)

# transformers' config keys for the experts a token is routed to, in the order families use them
# (Mixtral/Qwen/DeepSeek, ERNIE-4.5, Bailing, Gemma-4 and others).
TOPK_KEYS = ("num_experts_per_tok", "moe_k", "moe_topk", "top_k", "num_experts_per_token",
             "moe_router_topk", "top_k_experts")
_ATTENTION = ("self_attn", "attention", "attn")
_MLP = ("mlp", "feed_forward", "block_sparse_moe", "ffn", "moe")
_NORMS = ("input_layernorm", "post_attention_layernorm")
_SHARED = ("shared_expert", "shared_experts", "shared_mlp")
_ROUTER = ("gate", "router")
# the router's correction bias: a parameter in some families (ERNIE-4.5's moe_statics), a buffer
# in Megatron (TopKRouter's expert_bias), so it is named, not counted
_EXPERT_BIAS = "e_score_correction_bias"


class Unpriced(Exception):
    """A module moeplan has no layer kind for: its path, class, layer index and why."""

    def __init__(self, layer: int | None, path: str, module: Any, why: str) -> None:
        self.layer, self.path, self.cls, self.why = layer, path, type(module).__name__, why
        self.where = "outside the decoder layers" if layer is None else f"layer {layer}"
        super().__init__(f"{self.where}: {path} ({self.cls}) {why}")

    def extended(self, more: str) -> Unpriced:
        """The same refusal with `more` said after it (what else the layer holds unpriced)."""
        self.why += more
        self.args = (f"{self.where}: {self.path} ({self.cls}) {self.why}",)
        return self


@dataclass(frozen=True)
class Attention:
    heads: int
    groups: int
    head_dim: int
    qkv_bias: bool
    qk_norm: bool
    gate: str = ""  # "head": one sigmoid gate per head; "element": one per head channel
    sinks: bool = False  # one learnable sink logit per head (Megatron softmax_type learnable)
    v_dim: int = 0  # the value heads' width where it is not head_dim (MiMo-V2-Flash), else 0
    k_eq_v: bool = False  # no v projection: V is K (Gemma-4's full-attention layers)
    indexer: tuple[int, int] = (0, 0)  # a block-sparse lightning indexer's (heads, width), MiniMax-M3
    # multi-latent attention's (q latent or 0, kv latent, q/k head dim without and with RoPE,
    # value head dim); all 0 for attention with q/k/v projections
    mla: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
    gate_act: str = ""  # the gate's activation as its forward calls it: "sigmoid", "softplus"
    rope_window_only: bool = False  # its forward rotates q/k on sliding-window layers only
    norm_after_rope: bool = False  # its forward normalises q/k after rotating them (HunYuan's)
    latent_scale: bool = False  # its forward scales MLA's latents (LongCat-Flash's mla_scale_*)
    # its q/k norms span the whole projection (every head at once: OLMoE's, MiniMax-M2's)
    qk_norm_layer: bool = False


@dataclass(frozen=True)
class Moe:
    experts: int
    size: int
    shared: int
    shared_gate: bool
    expert_bias: bool  # the router carries a correction bias (aux-loss-free balancing)
    score: str = ""  # "sigmoid" / "softmax" as the router's own code scores, "" when unclear
    branch_norms: bool = False  # Gemma-4: norms on each branch, the router's own scales
    zero: int = 0  # zero-computation (identity) experts the router also scores (LongCat-Flash)


@dataclass(frozen=True)
class Layer:
    attention: Attention
    ffn: int | None  # the dense SwiGLU MLP's size, None in an MoE layer
    moe: Moe | None
    post_norms: bool = False  # norms on the attention and MLP outputs too (Gemma's)


@dataclass
class ModelRead:
    """The decoder as moeplan's kinds: one entry per layer, the embedding and output layer."""

    vocab: int
    hidden: int
    tied: bool
    layers: list[Layer]
    bias_params: int = 0  # correction-bias parameters transformers counts and Megatron buffers
    shortcut: bool = False  # LongCat-Flash's paired layers: the MoE output added one layer later
    layer_bias: list[int] = field(default_factory=list)  # the same, layer by layer
    notes: list[str] = field(default_factory=list)


def attr(config: Any, key: str) -> Any:
    """A config value, None where the config has none or holds it per layer (transformers 5's
    heterogeneous configs raise on a global read of a per-layer value)."""
    try:
        return getattr(config, key, None)
    except Exception:
        return None


def _params(module: Any) -> dict[str, Any]:
    return dict(module.named_parameters(recurse=False))


def _children(module: Any) -> Iterator[tuple[str, Any]]:
    """The children that hold parameters (activations, rotary tables and dropouts hold none)."""
    for name, child in module.named_children():
        if any(True for _ in child.parameters()):
            yield name, child


def _shape(tensor: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in tensor.shape)


def _linear(module: Any, layer: int | None, path: str) -> tuple[int, int, bool]:
    """(in, out, bias) of a plain linear layer (a weight of out x in, an optional bias of out)."""
    params = _params(module)
    weight = params.get("weight")
    if weight is None or len(_shape(weight)) != 2 or set(params) - {"weight", "bias"} \
            or any(True for _ in _children(module)):
        raise Unpriced(layer, path, module, "is not a plain linear projection")
    out, inp = _shape(weight)
    return inp, out, "bias" in params


def _norm(module: Any, size: int, layer: int | None, path: str) -> None:
    params = _params(module)
    if "Norm" not in type(module).__name__ or set(params) != {"weight"} \
            or _shape(params["weight"]) != (size,):
        raise Unpriced(layer, path, module, f"is not an RMSNorm of {size}")


_MLP_PARTS = ({"gate_proj", "up_proj", "down_proj"}, {"gate_up_proj", "down_proj"})


def _swiglu(module: Any, hidden: int, layer: int | None, path: str) -> int:
    """The size of a gate/up/down MLP without biases (Megatron --swiglu; gate and up may be one
    fused projection of twice the size)."""
    parts = dict(_children(module))
    if set(parts) not in _MLP_PARTS or _params(module):
        raise Unpriced(layer, path, module, "is not a gate/up/down SwiGLU MLP")
    shapes = {name: _linear(child, layer, f"{path}.{name}") for name, child in parts.items()}
    if "gate_up_proj" in shapes:  # one [2 x size, hidden] projection: the same parameters
        inp, out, bias = shapes.pop("gate_up_proj")
        shapes["gate_proj"] = shapes["up_proj"] = (inp, out // 2 if out % 2 == 0 else -1, bias)
    size = shapes["gate_proj"][1]
    if shapes["gate_proj"] != (hidden, size, False) or shapes["up_proj"] != (hidden, size, False) \
            or shapes["down_proj"] != (size, hidden, False) or size < 1:
        raise Unpriced(layer, path, module, f"has projections {shapes} (expected hidden {hidden} "
                       "-> size -> hidden without biases)")
    return size


_QK_NORMS = ("q_norm", "k_norm")
_QK_NORMS_AFTER = ("query_layernorm", "key_layernorm")  # HunYuan's names (applied after RoPE)
_GATES = ("g_proj", "gate_proj")  # an output gate's projection (Step-3.5 / Laguna, AFMoE)
_ATTENTION_PARTS = {"q_proj", "k_proj", "v_proj", "o_proj", *_QK_NORMS, *_QK_NORMS_AFTER, *_GATES, "v_norm",
                    "indexer"}


_MLA_PARTS = {"q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa",
              "kv_a_layernorm", "kv_b_proj", "o_proj"}


def _mla(module: Any, hidden: int, heads: int, layer: int, path: str) -> Attention:
    """Multi-latent attention as Megatron's MLASelfAttention builds it (Megatron-LM dev@d48bd6be
    megatron/core/transformer/multi_latent_attention.py MLASelfAttention): a query
    latent (q_a_proj, its norm, q_b_proj) or a plain q_proj, the KV latent with the shared RoPE
    key (kv_a_proj_with_mqa, its norm, kv_b_proj) and o_proj; every width read off the shapes."""
    parts = dict(_children(module))
    extra = sorted(set(_params(module)) | (set(parts) - _MLA_PARTS))
    query = set(parts) & {"q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj"}
    if query not in ({"q_proj"}, {"q_a_proj", "q_a_layernorm", "q_b_proj"}) or not {
            "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"} <= set(parts):
        raise Unpriced(layer, path, module, "is not multi-latent attention as Megatron builds it"
                       + (f" (it also holds {', '.join(extra)})" if extra else ""))
    projections = {name: _linear(parts[name], layer, f"{path}.{name}") for name in parts
                   if name in _MLA_PARTS and not name.endswith("layernorm")}
    if any(bias for _, _, bias in projections.values()):
        raise Unpriced(layer, path, module, "biases its projections (Megatron's MLA takes none)")
    kv_rank = _shape(dict(parts["kv_a_layernorm"].named_parameters()).get("weight", _NO_WEIGHT))
    latent = kv_rank[0] if len(kv_rank) == 1 else 0
    q_rank = projections["q_a_proj"][1] if "q_a_proj" in projections else 0
    if q_rank:
        _norm(parts["q_a_layernorm"], q_rank, layer, f"{path}.q_a_layernorm")
    _norm(parts["kv_a_layernorm"], latent, layer, f"{path}.kv_a_layernorm")
    q_out = projections["q_b_proj" if q_rank else "q_proj"][1]
    rope = projections["kv_a_proj_with_mqa"][1] - latent
    o_in, o_out, _ = projections["o_proj"]
    v_dim = o_in // heads
    nope = projections["kv_b_proj"][1] // heads - v_dim
    if rope < 1 or nope < 1 or o_in % heads or o_out != hidden \
            or q_out != heads * (nope + rope) or projections["kv_b_proj"][0] != latent \
            or projections["kv_b_proj"][1] != heads * (nope + v_dim):
        raise Unpriced(layer, path, module, f"has widths no {heads}-head multi-latent attention "
                       "has (q, kv latent, RoPE key, value and output projections disagree)")
    if extra:
        raise Unpriced(layer, path, module, f"is multi-latent attention ({heads} heads, q latent "
                       f"{q_rank}, kv latent {latent}, q/k head {nope} + RoPE {rope}, value head "
                       f"{v_dim}) with parts Megatron's MLA does not build: "
                       + "; ".join(_mla_extra(module, name, hidden, heads, v_dim) for name in extra))
    return Attention(heads, heads, nope + rope, False, True, mla=(q_rank, latent, nope, rope,
                                                                   v_dim),
                     latent_scale="mla_scale" in _forward_code(module))


# A DeepSeek-V3.2 DSA lightning indexer's parts (HF DeepseekV32Indexer / HYV4Indexer)
_DSA_INDEXER = {"wq_b", "wk", "k_norm", "weights_proj"}


def _mla_extra(module: Any, name: str, hidden: int, heads: int, v_dim: int) -> str:
    """What one part of an MLA module beyond Megatron's MLASelfAttention is, read off its shape:
    an output gate, learnable sinks, a DSA indexer; else its class."""
    own = _params(module)
    if name in own:
        shape = _shape(own[name])
        if name == "sinks" and shape == (heads,):
            return ("sinks: one learnable sink logit per head, which neither Megatron's MLA nor its "
                    "DSA attention takes (softmax_type learnable is DotProductAttention's)")
        return f"{name}: a {shape} parameter of its own"
    child = dict(module.named_children())[name]
    cls = type(child).__name__
    if name in _GATES:
        width = _shape(_params(child).get("weight", _NO_WEIGHT))
        kind = {(heads * v_dim, hidden): f"one per value channel ({heads} x {v_dim})",
                (heads, hidden): f"one per head ({heads})"}.get(width)
        if kind:
            # Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py
            # MLATransformerConfig.__post_init__ raises on attention_output_gate
            return (f"{name} ({cls}): an output gate, {kind}, on the attention output, which "
                    "Megatron's MLA refuses (MLATransformerConfig: output gate not supported "
                    "for MLA)")
    if name == "indexer" and {n for n, _ in _children(child)} == _DSA_INDEXER:
        return (f"indexer ({cls}): a DeepSeek-V3.2 DSA lightning indexer, which moeplan prices "
                "(model.dsa) on its family records but this path does not read off modules")
    return f"{name} ({cls})"


def _layer_extra(child: Any, hidden: int) -> str:
    """What a decoder layer's part outside attention, MLP and norms is, where its shape says:
    hyper-connections (HY-V4's, DeepSeek-V4's), else its class."""
    cls = type(child).__name__
    shapes = [_shape(p) for p in child.parameters() if len(_shape(p)) == 2]
    if "HyperConnection" in cls and len(shapes) == 1 and shapes[0][1] % hidden == 0:
        rows, streams = shapes[0][0], shapes[0][1] // hidden
        mix = ("pre and post mixes only, no residual mix between streams" if rows == 2 * streams
               else f"{rows} mixes")
        return (f"({cls}): hyper-connections of {streams} residual streams with {mix} "
                f"(a mapping of {rows} x {streams}·hidden), where Megatron's mHC (megatron/core/transformer/"
                f"hyper_connection.py HyperConnectionModule) maps {streams}·hidden to "
                f"{streams * streams + 2 * streams} with a Sinkhorn-projected residual mix")
    return f"({cls})"


class _NoWeight:
    shape = ()


_NO_WEIGHT = _NoWeight()


def _attention(module: Any, hidden: int, heads: int, head_dim: int | None, layer: int,
               path: str) -> Attention:
    """Softmax attention as Megatron's SelfAttention builds it: q/k/v/o projections, optional
    per-head q/k RMSNorm, an optional output gate (g_proj: one per head = head_wise_attn_gate,
    one per channel = attention_output_gate) and optional per-head sinks; or multi-latent
    attention (`_mla`)."""
    parts = dict(_children(module))
    own = _params(module)
    if "kv_a_proj_with_mqa" in parts:
        return _mla(module, hidden, heads, layer, path)
    if set(own) - {"sinks"} or not {"q_proj", "k_proj", "o_proj"} <= set(parts) \
            or set(parts) - _ATTENTION_PARTS or "v_norm" in parts and _params(parts["v_norm"]):
        extra = sorted((set(own) - {"sinks"}) | (set(parts) - _ATTENTION_PARTS))
        raise Unpriced(layer, path, module, "is not softmax attention with q/k/v/o projections"
                       + (f" (it also holds {', '.join(extra)})" if extra else ""))
    q_in, q_out, q_bias = _linear(parts["q_proj"], layer, f"{path}.q_proj")
    if head_dim is None:  # the config names none per layer: the query's width per head
        head_dim = q_out // heads if q_out % heads == 0 else q_out
    _, k_out, k_bias = _linear(parts["k_proj"], layer, f"{path}.k_proj")
    k_eq_v = "v_proj" not in parts  # V is K (Gemma-4's attention_k_eq_v layers)
    _, v_out, v_bias = (k_out, k_out, k_bias) if k_eq_v else _linear(parts["v_proj"], layer,
                                                                    f"{path}.v_proj")
    o_in, o_out, o_bias = _linear(parts["o_proj"], layer, f"{path}.o_proj")
    if _own_heads(heads, head_dim, q_out, k_out, v_out, o_in):
        # a head count of the layer's own: read here, placed (or refused) by model_section
        heads = q_out // head_dim
    v_dim = _value_width(heads, head_dim, q_out, k_out, v_out, o_in)
    if v_dim:
        # value heads of their own width: read here, placed by model_section (model.v_head_dim)
        v_out, o_in = k_out, q_out  # the q/k shapes checked below, the value width kept apart
    if q_out != heads * head_dim or k_out != v_out or k_out % head_dim or o_in != q_out \
            or q_in != hidden or o_out != hidden:
        raise Unpriced(layer, path, module, f"has q {q_out}, k {k_out}, v {v_out}, o {o_in} -> "
                       f"{o_out} wide: not {heads} heads of {head_dim} with whole KV groups"
                       + _shape_why(heads, head_dim, q_out, k_out, v_out, o_in))
    if o_bias or len({q_bias, k_bias, v_bias}) != 1:
        raise Unpriced(layer, path, module, "biases some of q/k/v/o but not as Megatron's "
                       "add_qkv_bias (q, k and v alike, no output bias)")
    norms = [name for name in (*_QK_NORMS, *_QK_NORMS_AFTER) if name in parts]
    if len(norms) == 1 or len(norms) > 2:
        raise Unpriced(layer, path, module, f"normalises {' and '.join(norms)}: not q and k alike")
    whole = _whole_width_norms(parts, norms, head_dim, q_out, k_out)
    widths = (q_out, k_out) if whole else (head_dim, head_dim)  # q's norm first, then k's
    for name, width in zip(norms, widths[:len(norms)], strict=True):
        _norm(parts[name], width, layer, f"{path}.{name}")
    gate = ""
    gates = [name for name in _GATES if name in parts]
    if len(gates) > 1:
        raise Unpriced(layer, path, module, "holds two output gates (g_proj, gate_proj)")
    for name in gates:
        g_in, g_out, g_bias = _linear(parts[name], layer, f"{path}.{name}")
        gate = {heads: "head", heads * head_dim: "element"}.get(g_out, "") if (
            g_in == hidden and not g_bias) else ""
        if not gate:
            raise Unpriced(layer, f"{path}.{name}", parts[name], f"gates {g_out} outputs: "
                           f"neither one per head ({heads}) nor one per channel")
    indexer = _indexer(parts["indexer"], hidden, layer, f"{path}.indexer") \
        if "indexer" in parts else (0, 0)
    sinks = "sinks" in own
    if sinks and _shape(own["sinks"]) != (heads,):
        raise Unpriced(layer, path, module, f"holds sinks of {_shape(own['sinks'])}, not one per "
                       "head")
    code = _forward_code(module)
    gate_act = next((name for name in ("softplus", "sigmoid") if f"{name}(" in code), "") \
        if gate else ""
    rope_at = code.find("apply_rotary_pos_emb(")
    norm_at = min((code.find(f"self.{name}(") for name in norms if f"self.{name}(" in code),
                  default=-1)
    return Attention(heads, k_out // head_dim, head_dim, q_bias, bool(norms), gate, sinks, v_dim,
                     k_eq_v, indexer, gate_act=gate_act, rope_window_only=_rope_window_only(code),
                     norm_after_rope=0 <= rope_at < norm_at, qk_norm_layer=whole)


def _whole_width_norms(parts: Mapping[str, Any], norms: list[str], head_dim: int, q_out: int,
                       k_out: int) -> bool:
    """Whether the q and k norms span the whole q and k projections (every head at once: OLMoE's
    q_norm of hidden_size and k_norm of KV heads x head_dim, MiniMax-M2's) rather than one head;
    moeplan's model.qk_layernorm_per_layer, which Megatron does not build. A norm as wide as one
    head is read per head, as Megatron's qk_layernorm (where q is one head wide, both agree)."""
    if len(norms) != 2 or q_out == head_dim:
        return False
    widths = [_shape(_params(parts[name]).get("weight", _NO_WEIGHT)) for name in norms]
    return widths == [(q_out,), (k_out,)]


def _forward_code(module: Any) -> str:
    """The source of the module class's forward ("" where it cannot be read)."""
    try:
        return inspect.getsource(type(module).forward)
    except (AttributeError, OSError, TypeError):
        return ""


# the conditions under which a forward rotates q and k on its sliding-window layers only
_WINDOW_ONLY = ("if self.is_local_attention", "if self.is_sliding", "if self.sliding_window")


def _rope_window_only(code: str) -> bool:
    """Whether the forward applies RoPE under a sliding-window-only condition (AFMoE's
    `if self.is_local_attention:` before apply_rotary_pos_emb: its full layers take no position
    embedding), read off the line before the call."""
    lines = code.splitlines()
    for index, line in enumerate(lines):
        if "= apply_rotary_pos_emb(" not in line:
            continue
        depth = len(line) - len(line.lstrip())
        for above in reversed(lines[max(0, index - 3):index]):  # the block the call sits in
            if len(above) - len(above.lstrip()) < depth:
                return above.strip().startswith(_WINDOW_ONLY)
    return False


def _indexer(module: Any, hidden: int, layer: int, path: str) -> tuple[int, int]:
    """(heads, width) of a block-sparse lightning indexer (MiniMax-M3's): a q projection of
    heads x width, one shared key of the width, q/k RMSNorms of the width, nothing else."""
    parts = dict(_children(module))
    if set(parts) != {"q_proj", "k_proj", "q_norm", "k_norm"} or _params(module):
        raise Unpriced(layer, path, module, "is not a lightning indexer of q/k projections and "
                       "q/k norms")
    q_in, q_out, q_bias = _linear(parts["q_proj"], layer, f"{path}.q_proj")
    k_in, width, k_bias = _linear(parts["k_proj"], layer, f"{path}.k_proj")
    if q_in != hidden or k_in != hidden or q_bias or k_bias or q_out % width:
        raise Unpriced(layer, path, module, f"has q {q_out} and k {width} wide: not heads of one "
                       "width with a shared key")
    for name in ("q_norm", "k_norm"):
        _norm(parts[name], width, layer, f"{path}.{name}")
    return q_out // width, width


def _own_heads(heads: int, head_dim: int, q_out: int, k_out: int, v_out: int, o_in: int) -> bool:
    """Whether the widths are whole heads of head_dim, but more or fewer query heads than the
    config names: a head count of the layer's own (Laguna's and Step-3.5's sliding layers)."""
    return (q_out == o_in and q_out % head_dim == 0 and q_out != heads * head_dim
            and k_out == v_out and k_out % head_dim == 0)


def _value_width(heads: int, head_dim: int, q_out: int, k_out: int, v_out: int, o_in: int) -> int:
    """The value heads' width where it stands apart from the q/k head_dim (MiMo-V2-Flash: whole
    KV groups of head_dim keys, values of their own width, o_proj reading heads of it), else 0."""
    groups = k_out // head_dim if k_out % head_dim == 0 else 0
    if _own_heads(heads, head_dim, q_out, k_out, v_out, o_in) or not groups or v_out == k_out \
            or q_out != heads * head_dim or v_out % groups or o_in != heads * (v_out // groups):
        return 0
    return v_out // groups


def _shape_why(heads: int, head_dim: int, q_out: int, k_out: int, v_out: int, o_in: int) -> str:
    """What the projection widths say instead, where they say one thing: a head count of the
    layer's own or a value head dim apart from the q/k one. Megatron-LM dev@d48bd6be
    megatron/core/transformer/attention.py SelfAttention.__init__ builds every layer from one
    num_attention_heads and gives q, k and v one kv_channels, so neither is a Megatron argument."""
    if _own_heads(heads, head_dim, q_out, k_out, v_out, o_in):
        return (f" ({q_out // head_dim} query heads where the config names {heads}: a head count "
                "of this layer's own, which Megatron-LM builds with one num_attention_heads for "
                "every layer)")
    width = _value_width(heads, head_dim, q_out, k_out, v_out, o_in)
    if width:
        return (f" ({k_out // head_dim} KV heads with values of {width} beside q/k heads of "
                f"{head_dim}, o_proj reading {heads} x {width}: a value head dim apart "
                "from the q/k one, which Megatron-LM's SelfAttention does not build)")
    return ""


def _experts(module: Any, hidden: int, count: int, layer: int, path: str) -> int:
    """The one SwiGLU size of `count` experts: listed MLPs or fused gate_up/down tensors."""
    listed = list(module.named_children())
    if listed and len(listed) == count and not _params(module):
        sizes = {_swiglu(child, hidden, layer, f"{path}.{name}") for name, child in listed}
        if len(sizes) == 1:
            return sizes.pop()
        raise Unpriced(layer, path, module, f"lists experts of sizes {sorted(sizes)}")
    params = _params(module)
    if set(params) == {"gate_up_proj", "down_proj"}:
        pairs = {"gate_up": params["gate_up_proj"].numel(), "down": params["down_proj"].numel()}
        fused = 2
    elif set(params) == {"gate_proj", "up_proj", "down_proj"}:
        pairs = {"gate_up": params["gate_proj"].numel() + params["up_proj"].numel(),
                 "down": params["down_proj"].numel()}
        fused = 2
    else:
        raise Unpriced(layer, path, module, "holds " + (", ".join(sorted(params)) or "no tensors")
                       + ": not SwiGLU experts (gate_up_proj and down_proj, without biases)")
    size, rest = divmod(pairs["down"], count * hidden)
    if rest or pairs["gate_up"] != fused * count * hidden * size \
            or any(_shape(p)[0] != count for p in params.values()):
        raise Unpriced(layer, path, module, f"holds {pairs} elements: not {count} SwiGLU experts "
                       f"of one size at hidden {hidden}")
    return size


def _router(module: Any, hidden: int, layer: int, path: str) -> tuple[int, int]:
    """(experts, correction-bias parameters) of a router: a weight of experts x hidden and an
    optional correction bias, itself or in a child (ERNIE-4.5's moe_statics)."""
    children = dict(_children(module))
    if not _params(module) and len(children) == 1 and set(children) <= {"gate", "wg",
                                                                        "classifier"}:
        # a router holding its projection (AFMoE's gate, HunYuan's wg, LongCat-Flash's classifier)
        [(name, module)] = children.items()
        path = f"{path}.{name}"
    weight = _params(module).get("weight")
    named = dict(module.named_parameters())
    if weight is None or len(_shape(weight)) != 2 or _shape(weight)[1] != hidden:
        raise Unpriced(layer, path, module, f"is not a router of experts x {hidden}")
    experts = _shape(weight)[0]
    extra = {name: p for name, p in named.items() if name not in ("weight",)}
    if any(not name.endswith(_EXPERT_BIAS) or p.numel() != experts for name, p in extra.items()):
        raise Unpriced(layer, path, module, "holds " + ", ".join(sorted(extra))
                       + f" beyond its weight and a correction bias of {experts}")
    return experts, sum(p.numel() for p in extra.values())


def _scaled_router(module: Any, hidden: int, layer: int, path: str) -> int:
    """The experts of Gemma-4's router: a projection of experts x hidden, a weightless input
    norm, an input scale [hidden] and per-expert scales [experts]."""
    parts = dict(_children(module))
    own = _params(module)
    proj = parts.get("proj")
    experts = _linear(proj, layer, f"{path}.proj")[1] if proj is not None else 0
    if set(parts) - {"proj", "norm"} or "norm" in parts and _params(parts["norm"]) or not experts \
            or {name: _shape(p) for name, p in own.items()} != {
                "scale": (hidden,), "per_expert_scale": (experts,)}:
        raise Unpriced(layer, path, module, "is not a router of a projection, a weightless norm, "
                       "an input scale and per-expert scales")
    return experts


# the MLP's pre-norm and the output norm of sandwich-norm layers (their post_attention_layernorm
# then norms the attention's output): Gemma's names, AFMoE's
_SANDWICH = (("pre_feedforward_layernorm", "post_feedforward_layernorm"),
             ("pre_mlp_layernorm", "post_mlp_layernorm"))
_BRANCH_NORMS = {"post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                 "pre_feedforward_layernorm_2"}


def _branch_moe(parts: Mapping[str, Any], shared: int, hidden: int, layer: int,
                path: str) -> Moe:
    """Gemma-4's MoE block, its router and experts children of the decoder layer beside the
    dense MLP (the shared branch) and three norms of their own."""
    experts = _scaled_router(parts["router"], hidden, layer, f"{path}.router")
    size = _experts(parts["experts"], hidden, experts, layer, f"{path}.experts")
    for name in sorted(_BRANCH_NORMS):
        _norm(parts[name], hidden, layer, f"{path}.{name}")
    return Moe(experts, size, shared, False, False, _score(parts["router"]), True)


def _moe(module: Any, hidden: int, layer: int, path: str) -> tuple[Moe, int]:
    parts = dict(_children(module))
    routers = [name for name in _ROUTER if name in parts]
    if "experts" not in parts or len(routers) != 1:
        raise Unpriced(layer, path, module, "is neither a SwiGLU MLP nor an MoE block with one "
                       "router and its experts")
    experts, bias = _router(parts[routers[0]], hidden, layer, f"{path}.{routers[0]}")
    bias_buffer = any(name.endswith(_EXPERT_BIAS) for name, _ in module.named_buffers())
    zero = _zero_experts(module, parts["experts"], experts)
    experts -= zero
    size = _experts(parts["experts"], hidden, experts, layer, f"{path}.experts")
    shared = 0
    gate = False
    for name, child in parts.items():
        if name in (routers[0], "experts"):
            continue
        if name in _SHARED:
            shared = _swiglu(child, hidden, layer, f"{path}.{name}")
        elif name == "shared_expert_gate" and _linear(child, layer, f"{path}.{name}") == (
                hidden, 1, False):
            gate = True
        else:
            raise Unpriced(layer, f"{path}.{name}", child, "is a part of the MoE block moeplan "
                           "has no kind for")
    own = _params(module)
    if set(own) == {"expert_bias"} and _shape(own["expert_bias"]) == (experts,):
        bias += experts  # AFMoE keeps the correction bias on the block, a parameter
    elif own:
        raise Unpriced(layer, path, module, "holds " + ", ".join(sorted(own)))
    score = _score(parts[routers[0]], module)
    return Moe(experts, size, shared, gate, bool(bias) or bias_buffer, score, zero=zero), bias


def _zero_experts(block: Any, experts: Any, rows: int) -> int:
    """The router rows beyond the experts that compute: LongCat-Flash's zero-computation
    (identity) experts, which its MoE block's forward names (`zero_expert_num`) and its fused
    expert tensors leave out; 0 where the forward names none."""
    own = [_shape(p) for p in _params(experts).values()]
    if "zero_expert" not in _forward_code(block) or not own or len({s[0] for s in own}) != 1:
        return 0
    computing = own[0][0]
    return rows - computing if 0 < computing < rows else 0


def _score(*modules: Any) -> str:
    """How the router scores, read off its classes' forward code (the config rarely says): the
    one of sigmoid and softmax the router's (else the MoE block's) forward calls, else ""."""
    for module in modules:
        try:
            code = inspect.getsource(type(module).forward)
        except (OSError, TypeError):
            continue
        found = [name for name in ("sigmoid", "softmax") if f"{name}(" in code]
        if len(found) == 1:
            return found[0]
    return ""


def read_layer(module: Any, index: int, hidden: int, heads: int, head_dim: int | None,
               path: str) -> tuple[Layer, int]:
    """One decoder layer as moeplan's kinds, and its correction-bias parameters; Unpriced names
    the first part that is no known kind, and what else of the layer has none."""
    if _params(module):
        raise Unpriced(index, path, module, "holds " + ", ".join(sorted(_params(module)))
                       + " of its own (a per-layer scale moeplan does not model)")
    children = dict(_children(module))
    # Gemma's sandwich norms (post_attention_layernorm is then a post-norm, pre_feedforward the
    # MLP's pre-norm): two more norms per layer; Gemma-4's MoE block beside the dense MLP
    post_names = next((pair for pair in _SANDWICH if set(pair) <= set(children)), ())
    post = bool(post_names)
    branch = {"router", "experts"} | _BRANCH_NORMS
    gemma_moe = branch <= set(children)
    known = {*post_names, *_ATTENTION, *_MLP, *_NORMS, *(branch if gemma_moe else ())}
    unknown = [name for name in children if name not in known]
    try:
        attention, ffn, moe, bias, norms = _read_parts(children, post_names, branch, gemma_moe,
                                                       index, hidden, heads, head_dim, path)
    except Unpriced as exc:
        others: dict[str, list[str]] = {}  # one description for the parts it fits alike
        for name in unknown:
            if f"{path}.{name}" != exc.path:
                others.setdefault(_layer_extra(children[name], hidden), []).append(name)
        others_said = [f"{' and '.join(names)} {what}" for what, names in others.items()]
        raise exc.extended(f"; the layer also holds {'; '.join(others_said)}" if others else "") \
            from None
    if gemma_moe and ffn is not None:
        moe, ffn = _branch_moe(children, ffn, hidden, index, path), None
    if attention is None or (ffn is None and moe is None) or sorted(norms) != sorted(_NORMS):
        raise Unpriced(index, path, module, "lacks " + ", ".join(
            [w for w, missing in (("attention", attention is None),
                                  ("an MLP or MoE block", ffn is None and moe is None),
                                  ("its two pre-norms", sorted(norms) != sorted(_NORMS)))
             if missing]))
    return Layer(attention, ffn, moe, post), bias


def _read_parts(children: Mapping[str, Any], post_names: tuple[str, ...], branch: set[str],
                gemma_moe: bool, index: int, hidden: int, heads: int, head_dim: int | None,
                path: str) -> tuple[Attention | None, int | None, Moe | None, int, list[str]]:
    """A decoder layer's attention, dense MLP size, MoE block, correction-bias parameters and
    pre-norm names, child by child; Unpriced names the first part that is no known kind."""
    attention: Attention | None = None
    ffn: int | None = None
    moe: Moe | None = None
    bias = 0
    norms: list[str] = []
    for name, child in children.items():
        where = f"{path}.{name}"
        if name in post_names:
            _norm(child, hidden, index, where)
            continue
        if gemma_moe and name in branch:
            continue  # read below, with the dense MLP it sits beside
        if name in _ATTENTION and attention is None:
            attention = _attention(child, hidden, heads, head_dim, index, where)
        elif name in _MLP and ffn is None and moe is None:
            parts = {n for n, _ in _children(child)}
            if parts in _MLP_PARTS:
                ffn = _swiglu(child, hidden, index, where)
            else:
                moe, bias = _moe(child, hidden, index, where)
        elif name in _NORMS:
            _norm(child, hidden, index, where)
            norms.append(name)
        else:
            raise Unpriced(index, where, child, "is no part of a pre-norm attention + MLP layer "
                           "(moeplan has no layer kind for it)")
    return attention, ffn, moe, bias, norms


_PAIR = {"self_attn", "mlps", "input_layernorm", "post_attention_layernorm", "mlp"}
# the order LongCat-Flash's layer forward calls its parts in: the MoE block on the first MLP's
# input, the first MLP, the second attention and MLP, then the MoE output added (the shortcut)
_PAIR_ORDER = ("self.self_attn[0](", "self.mlp(", "self.mlps[0](", "self.self_attn[1](",
               "self.mlps[1](", "shortcut_mlp_output\n")


def _is_shortcut_pair(module: Any) -> bool:
    """Whether a decoder layer is LongCat-Flash's pair of sub-layers sharing one MoE block: two
    attentions, two dense MLPs, two pairs of norms (lists of 2) and the block."""
    children = dict(_children(module))
    return set(children) == _PAIR and all(
        len(list(children[name].children())) == 2 for name in _PAIR - {"mlp"})


def _shortcut_pair(module: Any, index: int, hidden: int, heads: int, head_dim: int | None,
                   path: str) -> tuple[list[Layer], int]:
    """LongCat-Flash's decoder layer as two of moeplan's layers (Hugging Face
    LongcatFlashDecoderLayer.forward): the first its attention with the MoE block and the first
    dense MLP, which both read the same normed input (the shared-expert layout: the same
    parameters, FLOPs and stored tensors; the block's output is added after the second sub-layer
    instead, which model.moe_shortcut names), the second its attention with the second MLP."""
    if _params(module):
        raise Unpriced(index, path, module, "holds " + ", ".join(sorted(_params(module))))
    code = _forward_code(module).replace("shortcut_mlp_output = self.mlp(", "self.mlp(")
    at = [code.find(call) for call in _PAIR_ORDER]
    if any(i < 0 for i in at) or at != sorted(at):
        raise Unpriced(index, path, module, "pairs two attentions and two MLPs with one MoE block "
                       "in an order moeplan does not know (LongCat-Flash's shortcut MoE)")
    parts = {name: list(child.children()) for name, child in _children(module) if name != "mlp"}
    moe, bias = _moe(module.mlp, hidden, index, f"{path}.mlp")
    layers: list[Layer] = []
    for i in (0, 1):
        for name in _NORMS:
            _norm(parts[name][i], hidden, index, f"{path}.{name}.{i}")
        attention = _attention(parts["self_attn"][i], hidden, heads, head_dim, index,
                               f"{path}.self_attn.{i}")
        size = _swiglu(parts["mlps"][i], hidden, index, f"{path}.mlps.{i}")
        if moe.shared:
            raise Unpriced(index, f"{path}.mlp", module.mlp, "holds a shared expert beside the "
                           "paired dense MLPs")
        layers.append(Layer(attention, None, dataclasses.replace(moe, shared=size)) if i == 0
                      else Layer(attention, size, None))
    return layers, bias


def read_model(model: Any, layers: list[tuple[str, Any]], text: Any,
               is_tower: Any) -> ModelRead:
    """The text stack of a transformers model built on the meta device: `layers` its decoder
    layers with their paths, `text` its text config (heads, head_dim), `is_tower` the test for a
    vision/audio parameter name. Unpriced names the first module with no kind."""
    embed = model.get_input_embeddings()
    vocab, hidden = _shape(embed.weight)
    heads = attr(text, "num_attention_heads")
    if heads is None:  # transformers 5's per-layer value (Step-3.5's sliding layers): layer 0's
        try:
            heads = text.per_layer_config[0].num_attention_heads
        except Exception:
            heads = None
    heads = heads if isinstance(heads, int) and heads > 0 else 0
    head_dim = attr(text, "head_dim")
    head_dim = head_dim if isinstance(head_dim, int) and head_dim > 0 else None
    if not heads:
        raise Unpriced(None, "config", text, "names no num_attention_heads")
    read: list[Layer] = []
    biases: list[int] = []
    per_layer = getattr(text, "per_layer_config", None)
    for index, (path, layer) in enumerate(layers):
        try:  # transformers 5's per-layer head width (Gemma-4's full layers: global_head_dim)
            own = per_layer[index].head_dim if per_layer is not None else head_dim
        except Exception:
            own = head_dim
        own = own if isinstance(own, int) and own > 0 else head_dim
        if _is_shortcut_pair(layer):
            pair, extra = _shortcut_pair(layer, index, hidden, heads, own, path)
            read += pair
            biases.append(extra)
            continue
        kinds, extra = read_layer(layer, index, hidden, heads, own, path)
        read.append(kinds)
        biases.append(extra)
    output = model.get_output_embeddings()
    # a bare text model (no head class in transformers) is tied or not as its config says, as
    # planner/commands/hf_meta.py adds the untied output layer to transformers' count
    tied = output.weight is embed.weight if output is not None else \
        attr(text, "tie_word_embeddings") is not False
    inside = {f"{path}." for path, _ in layers}
    known = {id(embed.weight)} | ({id(output.weight)} if output is not None else set())
    finals = 0
    for name, param in model.named_parameters():
        if is_tower(name) or any(name.startswith(p) for p in inside) or id(param) in known:
            continue
        if param.dim() == 1 and _shape(param) == (hidden,) and finals == 0:
            finals += 1  # the final norm
            continue
        owner = name.rsplit(".", 1)[0]
        raise Unpriced(None, name, model.get_submodule(owner),
                       f"{_shape(param)} is no embedding, output layer or final norm")
    return ModelRead(vocab, hidden, tied, read, sum(biases), layer_bias=biases,
                     shortcut=len(read) == 2 * len(layers))


def _one_attention(read: ModelRead, windows: Mapping[str, Any]) -> tuple[Attention, dict[str, Any]]:
    """The decoder's one attention (its full layers'), and what its sliding-window layers have
    of their own, one for all of them: a query-head count (Laguna-XS.2, Step-3.5-Flash:
    model.window_num_attention_heads), KV groups and sinks (MiMo-V2-Flash:
    model.window_num_query_groups, full_attention_softmax_type vanilla); any other difference
    between layers is refused naming the layer."""
    flags = windows.get("window_attn_skip_freq", [1] * len(read.layers)) if windows \
        else [0] * len(read.layers)
    sparse = [int(layer.attention.indexer != (0, 0)) for layer in read.layers]
    indexers = {layer.attention.indexer for layer in read.layers} - {(0, 0)}
    if any(sparse) and (windows or len(indexers) > 1):
        raise ValueError("the block-sparse layers' indexers differ, or sit beside sliding-window "
                         "layers: moeplan prices one indexer on full-attention layers")
    if any(sparse):  # one attention once the indexer is set apart (index_sparse_layers)
        read = dataclasses.replace(read, layers=[dataclasses.replace(
            layer, attention=dataclasses.replace(layer.attention, indexer=(0, 0)))
            for layer in read.layers])
    full = [layer.attention for layer, flag in zip(read.layers, flags, strict=True) if not flag]
    window = [layer.attention for layer, flag in zip(read.layers, flags, strict=True) if flag]
    base = (full or window)[0]
    first = next(i for i, layer in enumerate(read.layers) if layer.attention == base)
    own_window = window[0] if full and window else base
    for index, (layer, flag) in enumerate(zip(read.layers, flags, strict=True)):
        own = layer.attention
        if own == base or (flag and own == own_window and own == dataclasses.replace(
                base, heads=own.heads, groups=own.groups, sinks=own.sinks or base.sinks,
                head_dim=own.head_dim, k_eq_v=own.k_eq_v and base.k_eq_v)):
            continue
        why = (f" ({own.heads} query heads where the other layers have {base.heads}: moeplan "
               "prices a head count of its own on sliding-window layers only, one for all of "
               "them)" if own == dataclasses.replace(base, heads=own.heads) else
               " (moeplan prices query heads, KV groups and sinks of their own on "
               "sliding-window layers only, one set for all of them)" if flag and own ==
               dataclasses.replace(base, heads=own.heads, groups=own.groups, sinks=own.sinks,
                                   head_dim=own.head_dim, k_eq_v=own.k_eq_v) else "")
        raise ValueError(f"layer {index}'s attention {own} differs from layer {first}'s "
                         f"{base}{why}: moeplan's model section holds one attention")
    extra: dict[str, Any] = {}
    if own_window.heads != base.heads:
        extra["window_num_attention_heads"] = own_window.heads
    if own_window.groups != base.groups:
        extra["window_num_query_groups"] = own_window.groups
    if own_window.sinks and not base.sinks:
        extra.update(softmax_type="learnable", full_attention_softmax_type="vanilla")
    if own_window.head_dim != base.head_dim:
        extra["window_kv_channels"] = own_window.head_dim
    if any(sparse):
        heads, width = indexers.pop()
        extra.update(index_sparse_layers=sparse, index_n_heads=heads, index_head_dim=width)
    if base.k_eq_v:
        if own_window.k_eq_v and own_window is not base:
            raise ValueError("the sliding-window layers' V is their K as the full layers' is: "
                             "moeplan prices attention_k_eq_v on full-attention layers only")
        extra["attention_k_eq_v"] = True
        if own_window is not base and not {"window_num_query_groups", "window_kv_channels"} & set(
                extra):  # the window layers keep their V: their KV shape, stated, gives it back
            extra["window_num_query_groups"] = own_window.groups
    return base, extra


def _windows(text: Any, layers: int) -> dict[str, Any]:
    """Sliding-window attention from the config's layer_types (the modules are the same for a
    window and full attention): Megatron's window_size (left keys before the query: HF's window
    W holds the query and W - 1 keys) and window_attn_skip_freq (1 = window, 0 = full)."""
    types = attr(text, "layer_types")
    window = attr(text, "sliding_window")
    if not isinstance(types, list) or len(types) != layers \
            or not isinstance(window, int) or window < 1:
        return {}
    flags = [int(t == "sliding_attention") for t in types]
    if not any(flags):
        return {}
    if not all(t in ("sliding_attention", "full_attention") for t in types):
        raise ValueError(f"layer_types lists {sorted(set(types))}: moeplan maps sliding and full "
                         "softmax attention from the config, no other mixer")
    model: dict[str, Any] = {"window_size": [window - 1, 0]}
    if not all(flags):
        model["window_attn_skip_freq"] = flags
    return model


def _mla_rope(rope: Any, notes: list[str]) -> dict[str, Any]:
    """MLA's RoPE (Megatron's MLATransformerConfig defaults to YaRN: the plain rope is named):
    YaRN's factor and original context from the config's rope_parameters, else plain RoPE."""
    rope = rope if isinstance(rope, Mapping) else {}
    if rope.get("rope_type") != "yarn":
        return {"rope_type": "rope"}
    factor, original = rope.get("factor"), rope.get("original_max_position_embeddings")
    if not isinstance(factor, int | float) or isinstance(factor, bool) or factor <= 0 \
            or not isinstance(original, int) or original < 1:
        raise ValueError(f"YaRN rope_parameters {dict(rope)!r:.80} name no factor and original "
                         "context moeplan can carry")
    betas = {key: rope[key] for key, default in (("beta_fast", 32.0), ("beta_slow", 1.0))
             if key in rope and rope[key] != default}
    if betas:
        notes.append(f"YaRN {betas} differ from Megatron's MLA defaults (32, 1), which no Megatron "
                     "argument changes (RoPE numerics only, no parameter or byte)")
    return {"rope_type": "yarn", "rotary_scaling_factor": float(factor),
            "original_max_position_embeddings": original}


def rope_arguments(model: Mapping[str, Any], text: Any) -> list[str]:
    """The Megatron arguments a YaRN mapping needs beyond the model fields: standard attention's
    YaRN settings apart from Megatron's defaults (hf_config.standard_yarn), or MLA's --mscale /
    --mscale-all-dim apart from its defaults (the table the record path's reader passes on the
    same way)."""
    rope = attr(text, "rope_parameters")
    if not isinstance(rope, Mapping):
        return []
    if model.get("position_embedding_type") == "yarn" and not model.get("multi_latent_attention"):
        return standard_yarn(rope)[1]
    if model.get("rope_type") != "yarn":
        return []
    args: list[str] = []
    for key, default in MLA_MSCALE_DEFAULTS.items():
        value = rope.get(key, default)
        if isinstance(value, int | float) and not isinstance(value, bool) and value != default:
            args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def topk(text: Any) -> tuple[str, int] | None:
    """The config key and value of the experts each token is routed to."""
    for key in TOPK_KEYS:
        value = attr(text, key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return key, value
    return None


def model_section(read: ModelRead, text: Any) -> tuple[dict[str, Any], list[str], list[str]]:
    """moeplan's model fields for a decoder whose layers all map to known kinds, the notes on what
    the modules do not say (router scoring, RoPE base: read from the config or assumed) and the
    warnings on what Megatron trains differently. Raises ValueError naming the layer where one
    model section cannot hold the decoder, or the missing top-k."""
    notes: list[str] = []
    warnings: list[str] = []
    windows = _windows(text, len(read.layers))
    att, window_own = _one_attention(read, windows)
    moes = {layer.moe for layer in read.layers if layer.moe is not None}
    ffns = {layer.ffn for layer in read.layers if layer.ffn is not None}
    if len(moes) > 1 or len(ffns) > 1:
        raise ValueError(f"the layers hold {len(moes)} MoE shapes and {len(ffns)} dense MLP sizes: "
                         "moeplan's model section holds one of each")
    model: dict[str, Any] = {
        "num_layers": len(read.layers), "hidden_size": read.hidden, "vocab_size": read.vocab,
        "num_attention_heads": att.heads, "kv_channels": att.head_dim,
        "normalization": "RMSNorm", "swiglu": True, "position_embedding_type": "rope",
        "untie_embeddings_and_output_weights": not read.tied, "add_bias_linear": False,
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "qk_layernorm": att.qk_norm,
    }
    if att.mla != (0, 0, 0, 0, 0):
        if windows:
            raise ValueError("multi-latent attention beside sliding-window layers: moeplan "
                             "prices MLA on full-attention layers only")
        del model["kv_channels"]
        q_rank, latent, nope, rope_dim, v_dim = att.mla
        model.update(multi_latent_attention=True, kv_lora_rank=latent, qk_head_dim=nope,
                     qk_pos_emb_head_dim=rope_dim, v_head_dim=v_dim, **(
                         {"q_lora_rank": q_rank} if q_rank else {}))
        model.update(_mla_rope(attr(text, "rope_parameters"), notes))
    elif att.groups != att.heads:
        model.update(group_query_attention=True, num_query_groups=att.groups)
    if att.qkv_bias:
        model["add_qkv_bias"] = True
    if att.gate:
        model["head_wise_attn_gate" if att.gate == "head" else "attention_output_gate"] = True
    if att.qk_norm_layer:
        model["qk_layernorm_per_layer"] = True
        warnings.append("the q/k norms span every head of the layer at once (one RMSNorm of heads x "
                        "head_dim on q, one of KV heads x head_dim on k), as "
                        "model.qk_layernorm_per_layer prices them; Megatron's qk_layernorm "
                        "normalises each head (the same FLOPs and bytes, (heads + KV heads) x "
                        "head_dim parameters instead of 2 x head_dim; emit megatron refuses it)")
    if att.latent_scale:
        warnings.append("the forward scales the q and kv latents (mla_scale_q_lora / "
                        "mla_scale_kv_lora); Megatron's MLA does not (numerics only, no parameter, "
                        "FLOP or byte)")
    if att.norm_after_rope:
        warnings.append("the q/k norms run after RoPE in the checkpoint's forward; Megatron's "
                        "qk_layernorm runs before it (the same parameters, FLOPs and bytes; not "
                        "the same numerics)")
    if att.gate and att.gate_act != "sigmoid":
        warnings.append("the attention output gate is "
                        + ("a softplus" if att.gate_act == "softplus" else "no sigmoid call")
                        + " in the checkpoint's forward; Megatron's gate is a sigmoid (the same "
                        "parameters, FLOPs and bytes; not the same numerics)")
    if att.sinks:
        model["softmax_type"] = "learnable"
    model.update(windows)
    model.update(window_own)
    if att.rope_window_only and "window_attn_skip_freq" in windows:
        # RoPE on the sliding-window layers only: Megatron's no_rope_freq, 1 = no position
        # embedding, on the full-attention layers (window_attn_skip_freq 0)
        model["no_rope_freq"] = [1 - flag for flag in windows["window_attn_skip_freq"]]
    elif att.rope_window_only:
        raise ValueError("the attention rotates q/k on sliding-window layers only, and the config "
                         "names no full-attention layer apart: moeplan cannot place the RoPE")
    if "index_sparse_layers" in model:  # the block size and picks the modules do not say
        for key in ("index_block_size", "index_topk_blocks"):
            value = attr(text, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"the block-sparse layers' {key} is not set in the config")
            model[key] = value
    if att.v_dim:
        model["v_head_dim"] = att.v_dim
    posts = {layer.post_norms for layer in read.layers}
    if posts == {True}:
        model["post_sublayer_norms"] = True
    elif len(posts) > 1:
        raise ValueError("some layers have norms on their attention and MLP outputs and some do "
                         "not: moeplan's model section holds one layer shape")
    eps = attr(text, "rms_norm_eps")
    if isinstance(eps, float):
        model["norm_epsilon"] = eps
    rope = attr(text, "rope_parameters")
    rope = rope if isinstance(rope, Mapping) else {}
    theta = rope.get("rope_theta")
    if isinstance(theta, int | float) and math.isfinite(theta) and float(theta).is_integer() \
            and theta >= 1:
        model["rotary_base"] = int(theta)
    partial = rope.get("partial_rotary_factor")
    if isinstance(partial, int | float) and 0 < partial < 1:
        model["rotary_percent"] = partial
    if rope.get("rope_type") == "yarn" and att.mla == (0, 0, 0, 0, 0):
        fields, _, yarn_notes = standard_yarn(rope)  # its arguments: rope_arguments
        model.update(fields)
        notes += yarn_notes
    elif rope.get("rope_type", "default") not in ("default", None) or any(
            isinstance(value, Mapping) for value in rope.values()):
        notes.append(f"RoPE parameters {dict(rope)!r:.120} are not carried over beyond the base "
                     "and rotary share (positions change numerics, not the budget)")
    act = attr(text, "hidden_act")
    gelu = attr(text, "hidden_activation")
    if gelu in ("gelu_pytorch_tanh", "gelu") and act is None:
        warnings.append(f"hidden_activation {gelu!r}: the gated MLPs are priced as SwiGLU (the same "
                        "parameters, GEMMs and stored tensors); Megatron's --swiglu would train "
                        "SiLU instead of GELU (Megatron-Bridge's Gemma providers set "
                        "activation_func to GELU with gated_linear_unit)")
    elif gelu not in (None, "silu"):
        raise ValueError(f"hidden_activation {gelu!r:.30}: the gate/up/down MLPs map to gated "
                         "SiLU or GELU only")
    if act not in (None, "silu"):
        raise ValueError(f"hidden_act {act!r:.30}: the gate/up/down MLPs map to Megatron's SwiGLU "
                         "(SiLU) only")
    rotary = attr(text, "rotary_dim")
    if isinstance(rotary, int) and 0 < rotary < att.head_dim:
        model["rotary_percent"] = rotary / att.head_dim
    if att.mla != (0, 0, 0, 0, 0):  # MLA rotates its own RoPE head dim, no share of the head
        model.pop("rotary_percent", None)
    if ffns:
        model["ffn_hidden_size"] = ffns.pop()
    if moes:
        moe = moes.pop()
        flags = [int(layer.moe is not None) for layer in read.layers]
        model.update(num_experts=moe.experts, moe_ffn_hidden_size=moe.size,
                     moe_layer_freq=1 if all(flags) else flags)
        model.setdefault("ffn_hidden_size", moe.size)
        if moe.branch_norms:
            model["moe_branch_norms"] = True
        if moe.zero:
            model["moe_zero_experts"] = moe.zero
            warnings.append(
                f"{moe.zero} zero-computation experts beside the {moe.experts} routed ones "
                "(model.moe_zero_experts): a token's top-k picks that land on them cost nothing, "
                "so its activated parameters and expert compute depend on the routing. moeplan "
                "prices the static upper bound, every pick a computing expert (top-k x one "
                "expert's parameters, as transformers' meta build counts the activated share of "
                "the routed experts); the routing-dependent share (LongCat-Flash's model card: "
                "18.6B-31.3B activated, about 27B on average) is not priced, so expert FLOPs, "
                "the dispatch and the step time are upper bounds")
        if read.shortcut:
            model["moe_shortcut"] = True
            warnings.append(
                "the MoE block of each layer pair (model.moe_shortcut) reads the first "
                "sub-layer's MLP input and adds its output after the second sub-layer "
                "(LongCat-Flash's shortcut MoE), priced as the shared-expert layout with the "
                "first dense MLP as the shared expert (the same parameters, FLOPs and stored "
                "tensors); its overlap of dispatch with the second sub-layer is not modelled, "
                "and a pipeline stage boundary inside a pair cuts the shortcut (keep stages to "
                "even layer counts)")
        if moe.shared:
            model["moe_shared_expert_intermediate_size"] = moe.shared
            if moe.shared_gate:
                model["moe_shared_expert_gate"] = True
        routed = topk(text)
        if routed is None:
            raise ValueError("the MoE layers route to a number of experts the config names under "
                             f"none of {', '.join(TOPK_KEYS)}")
        model["moe_router_topk"] = routed[1]
        scale = attr(text, "routed_scaling_factor")
        # AFMoE's, Laguna's and Step-3.5's names for it (each multiplies the routed output)
        for name in ("route_scale", "moe_routed_scaling_factor", "moe_router_scaling_factor"):
            scale = attr(text, name) if scale is None else scale
        if isinstance(scale, int | float) and not isinstance(scale, bool) and scale > 0:
            model["moe_router_topk_scaling_factor"] = float(scale)
        score = attr(text, "scoring_func")
        if score not in ("softmax", "sigmoid"):
            score = moe.score or "softmax"
            notes.append("router scoring: the config names no scoring_func; "
                         + (f"the router's forward scores with {score}" if moe.score else
                            "its forward names neither sigmoid nor softmax alone, softmax assumed")
                         + " (it changes no parameter, FLOP or byte of the budget)")
        model["moe_router_score_function"] = score
        _topk_normalisation(attr(text, "norm_topk_prob"), score, model, notes)
        if moe.expert_bias and score == "sigmoid":
            model["moe_router_enable_expert_bias"] = True
        elif moe.expert_bias:
            # Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py
            # TransformerConfig.__post_init__: expert bias with sigmoid or sqrtsoftplus scores only
            warnings.append("the router adds a correction bias to softmax scores (aux-loss-free "
                            "balancing); Megatron's expert bias takes sigmoid or sqrtsoftplus "
                            "scores only, so the plan routes without it (the budget is the same; "
                            "the routing is not the checkpoint's)")
    unread = unread_keys(text)
    if unread:
        warnings.append("config keys the module mapping does not read (numerics moeplan does not "
                        "carry into the launch; check them against Megatron's arguments): "
                        + ", ".join(f"{key}={value!r:.24}" for key, value in unread))
    return model, notes, warnings


def _topk_normalisation(normalise: Any, score: str, model: dict[str, Any], notes: list[str]) -> None:
    """norm_topk_prob → Megatron's router: a softmax whose top-k is not renormalised is Megatron's
    pre-softmax path (a renormalised one equals its default softmax over the top-k logits);
    Megatron renormalises sigmoid top-k scores always (Megatron-LM dev@d48bd6be
    megatron/core/transformer/moe/moe_utils.py topk_routing_with_score_function). Routing weights
    only: no parameter, FLOP or byte changes."""
    if normalise is False and score == "softmax":
        model["moe_router_pre_softmax"] = True
    elif normalise is False:
        notes.append(sigmoid_renormalised_note())
    elif normalise is None:
        notes.append("the config names no norm_topk_prob: the top-k routing weights are taken as "
                     "renormalised, Megatron's default (routing weights only, not the budget)")


# Keys the mapping reads, and those that change neither the network nor its training numerics.
_READ = {"hidden_act", "rms_norm_eps", "rope_parameters", "rope_theta", "layer_types",
         "sliding_window", "scoring_func", "routed_scaling_factor", "route_scale",
         "moe_routed_scaling_factor", "moe_router_scaling_factor", "rotary_dim",
         "head_dim",
         "tie_word_embeddings", "router_aux_loss_coef", "initializer_range", "transformers_version",
         "model_type", "dtype", "torch_dtype", "_name_or_path", "use_cache", "return_dict",
         "output_hidden_states", "output_attentions", "output_router_logits", "problem_type",
         "is_encoder_decoder", "chunk_size_feed_forward", "architectures", "attention_dropout",
         "hidden_dropout", "max_position_embeddings", "norm_topk_prob", "hidden_activation",
         "attention_k_eq_v", "enable_moe_block", "index_block_size", "index_topk_blocks",
         *TOPK_KEYS}


def unread_keys(text: Any) -> list[tuple[str, Any]]:
    """The text config's set keys the mapping neither reads nor can ignore: a float, a string or
    a true flag (sizes and layer indices are integers the module shapes and the count already
    check)."""
    try:
        items = dict(text.to_dict()).items()
    except Exception:
        return []
    return sorted((key, value) for key, value in items
                  if key not in _READ and not key.endswith("_token_id")
                  and (value is True or isinstance(value, str) and value
                       or isinstance(value, float) and value != 0.0))

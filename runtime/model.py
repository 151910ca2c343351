"""A small V4-shaped decoder: embedding → [RMSNorm → causal attention → RMSNorm → MoE/MLP] × L →
RMSNorm → output head → cross-entropy, plus D multi-token-prediction (MTP) depths.

MTP depth d (Megatron's MultiTokenPredictionLayer, DeepSeek-V3 §2.2) predicts the token d+2
places ahead: it RMS-normalises the embedding of the ids shifted left by d+1 and the previous
depth's output (depth 0: the main model's output after its final norm, which Megatron's decoder
block applies before the MTP block sees it), projects their concatenation 2h → h, runs one
transformer block whose FFN is a normal (learned-router) MoE layer with layer id L + d, applies its
own final norm and the shared output head. Shifts are taken on whole sequences before any CP
split; positions shifted past the end see token id 0 and their loss is masked.

Hidden states are Megatron-shaped `[s, b, h]`; token ids are `[b, s]`. Under context parallelism a
rank holds only some positions of each packed sequence (`TokenSlice`): attention gathers K/V of the
whole sequence over the `cp` group (an autograd all-gather, so backward reduce-scatters), and the
causal mask compares *global* positions, which makes the contiguous and zigzag CP layouts one code
path. The single-process reference builds this same class with one slice covering everything and
its own MoE block, so every dense weight and every dense line of math is shared.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from runtime.activation import MLPActivation
from runtime.comm import CommGroup, Ledger, all_gather_v
from runtime.init import DEFAULT_INIT_STD, init_tensor
from runtime.plan_io import flagged_layers, required
from runtime.precision import widened
from runtime.recompute import NO_RECOMPUTE, run_blocks
from runtime.tensor_parallel import TensorParallel, vocab_parallel_embedding

if TYPE_CHECKING:  # runtime/mamba.py loads only for hybrid plans
    from runtime.mamba import MambaSpec


@dataclass(frozen=True)
class TokenSlice:
    """The global positions of a sequence that one CP rank holds, in its local row order.

    Contiguous CP: rank c holds [c·S/CP, (c+1)·S/CP). Zigzag (Megatron's load-balanced default)
    cuts S into 2·CP chunks and rank c holds chunks c and 2·CP−1−c.
    """

    positions: tuple[int, ...]

    @classmethod
    def for_cp_rank(cls, seq_length: int, cp_size: int, cp_rank: int, mode: str) -> TokenSlice:
        if cp_size == 1:
            return cls(tuple(range(seq_length)))
        if mode == "zigzag":
            chunk = seq_length // (2 * cp_size)
            first = range(cp_rank * chunk, (cp_rank + 1) * chunk)
            mirror = 2 * cp_size - 1 - cp_rank
            second = range(mirror * chunk, (mirror + 1) * chunk)
            return cls(tuple(first) + tuple(second))
        chunk = seq_length // cp_size
        return cls(tuple(range(cp_rank * chunk, (cp_rank + 1) * chunk)))

    def index(self, device: torch.device | None = None) -> torch.Tensor:
        return torch.tensor(self.positions, dtype=torch.long, device=device)

    def __len__(self) -> int:
        return len(self.positions)


def cp_slices(seq_length: int, cp_size: int, mode: str) -> list[TokenSlice]:
    """Every CP rank's slice, in CP-group order (the order of the K/V all-gather)."""
    return [TokenSlice.for_cp_rank(seq_length, cp_size, c, mode) for c in range(cp_size)]


@dataclass(frozen=True)
class DecoderSpec:
    """The model shape the plan's config describes (whole logical weights; a TP rank's modules
    keep their shard, runtime/tensor_parallel.py)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int  # padded: rows of the embedding, the head and tid2eid
    untied_head: bool
    norm_epsilon: float
    moe_layers: tuple[int, ...]
    hash_layers: tuple[int, ...]
    init_std: float
    mtp_num_layers: int
    mtp_loss_scale: float  # Megatron's mtp_loss_scaling_factor
    rotary_base: float
    activation: MLPActivation = MLPActivation()
    # Megatron's add_bias_linear (every linear layer: QKV, the output projection, dense FC1/FC2)
    # and add_qkv_bias (QKV alone; megatron/core/transformer/attention.py SelfAttention.__init__).
    add_bias_linear: bool = False
    add_qkv_bias: bool = False
    # gpt-oss's attention: softmax_type (learnable sinks: one logit per head, Megatron's
    # DotProductAttention.softmax_offset; off-by-one: a fixed zero logit) and sliding windows
    # (window_size's left part; window_attn_skip_freq picks the layers, as
    # megatron/core/transformer/utils.py is_layer_window_attention does).
    softmax_type: str = "vanilla"
    window_left: int | None = None
    window_skip: int | tuple[int, ...] | None = None
    # A hybrid stack (model.mamba_layers, model.mixer_only_layers): the blocks whose mixer is
    # Mamba-2 instead of attention, the blocks that are their mixer alone (no FFN and its norm),
    # and the mixers' dims (None when no block is Mamba).
    mamba_layers: tuple[int, ...] = ()
    mixer_only_layers: tuple[int, ...] = ()
    mamba: MambaSpec | None = None
    # position_embedding_type 'none' (Nemotron-3's attention): no rotary embedding at all.
    rope: bool = True

    def is_window_layer(self, layer_id: int) -> bool:
        """is_layer_window_attention for Megatron's layer number layer_id + 1."""
        if self.window_left is None:
            return False
        if self.window_skip is None:
            return True
        if isinstance(self.window_skip, int):
            return (layer_id + 1) % self.window_skip != 0
        return layer_id < len(self.window_skip) and bool(self.window_skip[layer_id])

    @classmethod
    def from_config(cls, model: dict[str, Any], moe_layers: list[int], hash_layers: list[int],
                    padded_vocab_size: int) -> DecoderSpec:
        """`padded_vocab_size` (the plan's) sizes the embedding, the head and the hash tables, as
        Megatron pads the vocabulary; token ids stay below the real vocab_size."""
        def value(key: str) -> Any:
            return required(model, key, "config.model")

        mamba_layers = flagged_layers(value("mamba_layers"))
        return cls(
            num_layers=int(value("num_layers")),
            hidden_size=int(value("hidden_size")),
            num_heads=int(value("num_attention_heads")),
            num_query_groups=int(value("num_query_groups")),
            head_dim=int(value("kv_channels")),
            ffn_hidden_size=int(value("ffn_hidden_size")),
            vocab_size=padded_vocab_size,
            untied_head=bool(value("untie_embeddings_and_output_weights")),
            norm_epsilon=float(value("norm_epsilon")),
            moe_layers=tuple(moe_layers),
            hash_layers=tuple(hash_layers),
            # Not a config field (the schema has none): Megatron's init_method_std default.
            init_std=DEFAULT_INIT_STD,
            mtp_num_layers=int(value("mtp_num_layers")),
            mtp_loss_scale=float(value("mtp_loss_scaling_factor")),
            rotary_base=float(value("rotary_base")),
            activation=MLPActivation.from_config(model),
            add_bias_linear=bool(value("add_bias_linear")),
            add_qkv_bias=bool(value("add_qkv_bias")),
            softmax_type=str(value("softmax_type")),
            window_left=None if value("window_size") is None else int(value("window_size")[0]),
            window_skip=_window_skip(value("window_attn_skip_freq")),
            mamba_layers=mamba_layers,
            mixer_only_layers=flagged_layers(value("mixer_only_layers")),
            mamba=_mamba_spec(model) if mamba_layers else None,
            rope=value("position_embedding_type") != "none",
        )

    @property
    def output_std(self) -> float:
        """Residual-branch output projections start at std/sqrt(2·L) (Megatron's scaled init)."""
        return self.init_std / math.sqrt(2.0 * self.num_layers)


def _mamba_spec(model: dict[str, Any]) -> MambaSpec:
    from runtime.mamba import MambaSpec

    return MambaSpec.from_config(model)


def _window_skip(skip: Any) -> int | tuple[int, ...] | None:
    return skip if skip is None or isinstance(skip, int) else tuple(int(flag) for flag in skip)


def _bias(width: int, wanted: bool, dtype: torch.dtype) -> torch.nn.Parameter | None:
    """A linear layer's bias, zero at the start as Megatron's linear layers initialise it."""
    return torch.nn.Parameter(torch.zeros(width, dtype=dtype)) if wanted else None


def _add_bias(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x if bias is None else x + bias


class RMSNorm(torch.nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(size, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """In fp32 inside, the input's dtype out (Transformer Engine's RMSNorm under bf16)."""
        wide = widened(x)
        out = wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (out * widened(self.weight)).to(x.dtype)


def rotary(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half RoPE with frequencies base^(-i/half) on x [s, b, heads, d] at the given global
    positions [s]."""
    half = x.shape[-1] // 2
    freqs = base ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.to(torch.float32)[:, None] * freqs[None, :]
    cos = angles.cos()[:, None, None, :].to(x.dtype)
    sin = angles.sin()[:, None, None, :].to(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


class CausalAttention(torch.nn.Module):
    """Grouped-query causal attention; K/V of the whole sequence gathered over CP."""

    def __init__(self, spec: DecoderSpec, layer_id: int, seed: int, dtype: torch.dtype,
                 cp: CommGroup, ledger: Ledger | None,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        tp = tp or TensorParallel.none()
        h, d = spec.hidden_size, spec.head_dim
        self.spec, self.cp, self.ledger, self.tp = spec, cp, ledger, tp
        # SelfAttention.__init__: heads and query groups split over TP, each rank's query heads
        # with the groups they read (QKV column-parallel, the output projection row-parallel).
        self.heads, self.groups = spec.num_heads // tp.size, spec.num_query_groups // tp.size
        std = spec.init_std

        def weight(name: str, shape: tuple[int, int], dim: int, scale: float) -> torch.nn.Parameter:
            full = init_tensor(seed, (layer_id, "attention", name), shape, scale, dtype)
            return torch.nn.Parameter(tp.shard(full, dim))

        self.wq = weight("wq", (h, spec.num_heads * d), 1, std)
        self.wk = weight("wk", (h, spec.num_query_groups * d), 1, std)
        self.wv = weight("wv", (h, spec.num_query_groups * d), 1, std)
        self.wo = weight("wo", (spec.num_heads * d, h), 0, spec.output_std)
        qkv_bias = spec.add_bias_linear or spec.add_qkv_bias
        self.bq = _bias(self.heads * d, qkv_bias, dtype)
        self.bk = _bias(self.groups * d, qkv_bias, dtype)
        self.bv = _bias(self.groups * d, qkv_bias, dtype)
        self.bo = _bias(h, spec.add_bias_linear, dtype)  # whole: added after the TP sum
        self.window_left = spec.window_left if spec.is_window_layer(layer_id) else None
        if spec.softmax_type == "learnable":  # drawn like Megatron's init_method does it
            full = init_tensor(seed, (layer_id, "attention", "softmax_offset"),
                               (spec.num_heads,), std, dtype)
            self.softmax_offset = torch.nn.Parameter(tp.shard(full, 0))
        else:
            self.softmax_offset = None

    def forward(self, x: torch.Tensor, local: torch.Tensor, gathered: torch.Tensor) -> torch.Tensor:
        """x [s_local, b, h] ([s_local/TP, b, h] under sequence parallelism); `local`/`gathered`
        are the global positions of the CP rank's rows and of the rows after the CP gather."""
        spec = self.spec
        q, k, v = self.tp.column_linear(x, self.wq, self.wk, self.wv)
        s, b, _ = q.shape
        d, groups, heads = spec.head_dim, self.groups, self.heads
        q = _add_bias(q, self.bq).view(s, b, heads, d)
        k = _add_bias(k, self.bk).view(s, b, groups, d)
        if spec.rope:
            q, k = rotary(q, local, spec.rotary_base), rotary(k, local, spec.rotary_base)
        v = _add_bias(v, self.bv).view(s, b, groups, d)
        kv = torch.cat([k, v], dim=-1)
        if self.cp.active:
            kv = all_gather_v(kv, self.cp, [s] * self.cp.size, self.ledger, "cp_kv_gather")
        k, v = kv[..., :d], kv[..., d:]
        repeat = heads // groups
        q = q.permute(1, 2, 0, 3)  # [b, heads, s, d]
        k = k.repeat_interleave(repeat, dim=2).permute(1, 2, 0, 3)
        v = v.repeat_interleave(repeat, dim=2).permute(1, 2, 0, 3)
        allowed = local[:, None] >= gathered[None, :]
        if self.window_left is not None:  # keys at most window_left positions back
            allowed = allowed & (local[:, None] - gathered[None, :] <= self.window_left)
        if spec.softmax_type == "vanilla":
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        else:
            out = sink_attention(q, k, v, allowed, self.softmax_offset)
        out = self.tp.row_output(out.permute(2, 0, 1, 3).reshape(s, b, heads * d) @ self.wo)
        return out if self.bo is None else out + self.bo


def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                   offset: torch.Tensor | None) -> torch.Tensor:
    """softmax([q·kᵀ/√d, sink]) without the sink column, times v: one extra logit per head in
    the denominator (Megatron-LM dev@d48bd6be megatron/core/fusions/fused_softmax.py SoftmaxOne;
    `offset` None is off-by-one's fixed zero logit). q, k, v [b, heads, s, d]."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    b, heads, s, _ = scores.shape
    sink = (scores.new_zeros(heads) if offset is None else offset.to(scores.dtype))
    sink = sink.view(1, heads, 1, 1).expand(b, heads, s, 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1] @ v


class DenseMLP(torch.nn.Module):
    """Feed-forward for layers that are not MoE (moe_layer_freq), with the model's activation
    (W3 only when gated) and add_bias_linear's biases; under TP FC1 (and W3) column-parallel, FC2
    row-parallel (Megatron-LM dev@d48bd6be megatron/core/tensor_parallel/layers.py
    ColumnParallelLinear, RowParallelLinear)."""

    def __init__(self, spec: DecoderSpec, layer_id: int, seed: int, dtype: torch.dtype,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.tp = tp = tp or TensorParallel.none()
        h, f = spec.hidden_size, spec.ffn_hidden_size
        self.activation = spec.activation
        gated = self.activation.gated

        def weight(name: str, shape: tuple[int, int], dim: int, std: float) -> torch.nn.Parameter:
            full = init_tensor(seed, (layer_id, "mlp", name), shape, std, dtype)
            return torch.nn.Parameter(tp.shard(full, dim))

        self.w1 = weight("w1", (h, f), 1, spec.init_std)
        if gated:
            self.w3 = weight("w3", (h, f), 1, spec.init_std)
        self.w2 = weight("w2", (f, h), 0, spec.output_std)
        self.b1 = _bias(f // tp.size, spec.add_bias_linear, dtype)
        self.b3 = _bias(f // tp.size, spec.add_bias_linear and gated, dtype)
        self.b2 = _bias(h, spec.add_bias_linear, dtype)  # whole: added after the TP sum

    def forward(self, x: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        if not self.activation.gated:
            (gate,) = self.tp.column_linear(x, self.w1)
            hidden = self.activation.plain(_add_bias(gate, self.b1))
        else:
            gate, up = self.tp.column_linear(x, self.w1, self.w3)
            hidden = self.activation.glu(_add_bias(gate, self.b1), _add_bias(up, self.b3), None)
        out = self.tp.row_output(hidden @ self.w2)
        return out if self.b2 is None else out + self.b2


# (layer_id, is_hash_layer) -> the MoE block of that layer: forward(hidden [s,b,h], ids [b,s]).
MoEFactory = Callable[[int, bool], torch.nn.Module]


class DecoderLayer(torch.nn.Module):
    """One block: a pre-norm mixer (attention, or a hybrid stack's Mamba-2) and a pre-norm FFN.

    A hybrid model's Megatron layers (megatron/core/models/hybrid: `M`, `*`, `E`, `-`, each its own
    pre-norm residual layer) pair up into these blocks; a mixer-only block (the pattern's next
    symbol is another mixer) has no FFN and no second norm."""

    def __init__(self, spec: DecoderSpec, layer_id: int, seed: int, dtype: torch.dtype,
                 cp: CommGroup, ledger: Ledger | None, moe_factory: MoEFactory,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.is_moe = layer_id in spec.moe_layers
        self.input_norm = RMSNorm(spec.hidden_size, spec.norm_epsilon, dtype)
        if layer_id in spec.mamba_layers and spec.mamba is not None:
            from runtime.mamba import MambaMixer

            self.mamba: torch.nn.Module | None = MambaMixer(
                spec.mamba, layer_id, seed, spec.init_std, spec.output_std, dtype, tp)
        else:
            self.mamba = None
            self.attention = CausalAttention(spec, layer_id, seed, dtype, cp, ledger, tp)
        self.ffn: torch.nn.Module | None = None
        if layer_id not in spec.mixer_only_layers:
            self.ffn_norm = RMSNorm(spec.hidden_size, spec.norm_epsilon, dtype)
            self.ffn = (moe_factory(layer_id, layer_id in spec.hash_layers) if self.is_moe
                        else DenseMLP(spec, layer_id, seed, dtype, tp))

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor | None, local: torch.Tensor,
                gathered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One pre-norm block: (the new residual stream, the FFN/MoE output alone; zeros for a
        mixer-only block)."""
        normed = self.input_norm(hidden)
        mixed = (self.mamba(normed) if self.mamba is not None
                 else self.attention(normed, local, gathered))
        hidden = hidden + mixed
        if self.ffn is None:
            return hidden, torch.zeros_like(hidden)
        ffn_out = self.ffn(self.ffn_norm(hidden), input_ids)
        return hidden + ffn_out, ffn_out


class MTPLayer(torch.nn.Module):
    """One MTP depth around its transformer block (built by the caller: layer id L + depth)."""

    def __init__(self, spec: DecoderSpec, depth: int, seed: int, dtype: torch.dtype,
                 block: DecoderLayer, tp: TensorParallel | None = None) -> None:
        super().__init__()
        h = spec.hidden_size
        self.depth = depth
        self.tp = tp = tp or TensorParallel.none()
        self.enorm = RMSNorm(h, spec.norm_epsilon, dtype)
        self.hnorm = RMSNorm(h, spec.norm_epsilon, dtype)
        # column-parallel under TP: this rank's h/TP output columns
        self.eh_proj = torch.nn.Parameter(tp.shard(init_tensor(
            seed, (block.layer_id, "mtp", "eh_proj"), (2 * h, h), spec.init_std, dtype), 1))
        self.block = block
        self.final_norm = RMSNorm(h, spec.norm_epsilon, dtype)

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor, input_ids: torch.Tensor,
                local: torch.Tensor, gathered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: the previous depth's output [s, b, h]; embedded: the shifted ids' embedding.
        Returns (this depth's normalised output, its MoE output alone)."""
        (joined,) = self.tp.column_linear(
            torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1), self.eh_proj)
        joined = self.tp.mtp_projection_output(joined)
        out, ffn_out = self.block(joined, input_ids, local, gathered)
        return self.final_norm(out), ffn_out


def run_mtp(layers: list[MTPLayer], hidden: torch.Tensor, embedding: torch.Tensor,
            head: torch.Tensor, mtp_ids: list[torch.Tensor], local: torch.Tensor,
            gathered: torch.Tensor, moe_outputs: dict[int, torch.Tensor] | None,
            tp: TensorParallel | None = None) -> list[torch.Tensor]:
    """Every MTP depth after the main model's normalised output → logits per depth (this TP
    rank's vocabulary columns). The MoE outputs are recorded into `moe_outputs` (keyed by layer
    id) when it is given."""
    tp = tp or TensorParallel.none()
    logits = []
    for layer, ids in zip(layers, mtp_ids, strict=True):
        embedded = vocab_parallel_embedding(ids, embedding, tp)
        block_ids = ids[:, tp.sequence_rows(ids.shape[1])]
        hidden, ffn_out = layer(hidden, embedded, block_ids, local, gathered)
        if moe_outputs is not None and layer.block.is_moe:
            moe_outputs[layer.block.layer_id] = ffn_out.detach().clone()
        logits.append(tp.column_linear(hidden, head.t())[0])
    return logits


@dataclass(frozen=True)
class MTPTargets:
    """What MTP depth d needs of a microbatch, all [b, s]: ids shifted by d+1, labels shifted by
    d+1 and the mask of positions whose shifted label exists."""

    ids: list[torch.Tensor]
    labels: list[torch.Tensor]
    masks: list[torch.Tensor]

    @classmethod
    def of(cls, ids: torch.Tensor, labels: torch.Tensor, depths: int) -> MTPTargets:
        """From whole sequences [b, S] (before any CP split)."""
        valid = torch.ones_like(labels, dtype=torch.bool)
        shifted = [(shift_left(ids, d + 1), shift_left(labels, d + 1), shift_left(valid, d + 1))
                   for d in range(depths)]
        return cls([i for i, _, _ in shifted], [lab for _, lab, _ in shifted],
                   [mask for _, _, mask in shifted])

    def select(self, index: torch.Tensor, device: torch.device | None = None) -> MTPTargets:
        """The positions `index` (a CP rank's slice) of every tensor."""
        def pick(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
            return [t[:, index].to(device) for t in tensors]
        return MTPTargets(pick(self.ids), pick(self.labels), pick(self.masks))


def shift_left(tensor: torch.Tensor, shift: int) -> torch.Tensor:
    """Roll [b, S] left by `shift` along the sequence, filling the vacated end with zeros."""
    out = torch.zeros_like(tensor)
    if shift < tensor.shape[1]:
        out[:, :tensor.shape[1] - shift] = tensor[:, shift:]
    return out


def mtp_loss(logits: list[torch.Tensor], targets: MTPTargets, scale: float, per_token: bool,
             losses_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, list[float]]:
    """The MTP term one rank adds to its main loss, and each depth's masked mean loss.

    Like Megatron's process_mtp_loss: each depth's masked loss sum is divided by the rank's own
    count of valid shifted positions (at least 1), the depths are averaged and scaled by
    `scale`. With per-token loss the term is a sum like the main loss: each depth's normalised
    loss is multiplied back by the rank's token count, so the final 1/N gives it the same weight.
    """
    term = logits[0].new_zeros(())
    means = []
    for depth_logits, labels, mask in zip(logits, targets.labels, targets.masks, strict=True):
        losses = (losses_of or token_losses)(depth_logits, labels) * mask
        count = max(int(mask.sum()), 1)
        normalised = losses.sum() / count
        means.append(float(normalised.detach()))
        term = term + (normalised * labels.numel() if per_token else normalised)
    return term * (scale / len(logits)), means


class Decoder(torch.nn.Module):
    """The whole model of one rank (PP = 1: every layer, the embedding, the head, MTP)."""

    def __init__(self, spec: DecoderSpec, seed: int, dtype: torch.dtype, cp: CommGroup,
                 ledger: Ledger | None, moe_factory: MoEFactory,
                 tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.tp = tp = tp or TensorParallel.none()
        # Vocab-parallel: each TP rank holds its 1/TP of the (padded) vocabulary's rows of the
        # embedding and of the output layer (VocabParallelEmbedding, ColumnParallelLinear).
        self.embedding = torch.nn.Parameter(tp.shard(init_tensor(
            seed, ("embedding", "word"), (spec.vocab_size, spec.hidden_size), spec.init_std,
            dtype), 0))
        self.layers = torch.nn.ModuleList(
            DecoderLayer(spec, layer, seed, dtype, cp, ledger, moe_factory, tp)
            for layer in range(spec.num_layers)
        )
        self.final_norm = RMSNorm(spec.hidden_size, spec.norm_epsilon, dtype)
        self.head = (
            torch.nn.Parameter(tp.shard(init_tensor(
                seed, ("output_head",), (spec.vocab_size, spec.hidden_size), spec.init_std,
                dtype), 0))
            if spec.untied_head else None
        )
        self.mtp = torch.nn.ModuleList(
            MTPLayer(spec, depth, seed, dtype,
                     DecoderLayer(spec, spec.num_layers + depth, seed, dtype, cp, ledger,
                                  moe_factory, tp), tp)
            for depth in range(spec.mtp_num_layers)
        )
        # Filled during forward when `record_moe_outputs` is set: layer id -> MoE output [s,b,h].
        self.record_moe_outputs = False
        self.moe_outputs: dict[int, torch.Tensor] = {}
        self.recompute = NO_RECOMPUTE  # the trainer sets the plan's (runtime/recompute.py)

    def forward(self, input_ids: torch.Tensor, local: torch.Tensor, gathered: torch.Tensor,
                mtp_ids: list[torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """input_ids [b, s_local] at global positions `local` → (logits [s_local, b, vocab],
        the logits of every MTP depth, fed the shifted ids `mtp_ids`)."""
        hidden = vocab_parallel_embedding(input_ids, self.embedding, self.tp)
        self.moe_outputs = {}
        # Under sequence parallelism the blocks' residual stream (and the MoE layers' token ids)
        # hold this TP rank's share of the sequence.
        block_ids = input_ids[:, self.tp.sequence_rows(input_ids.shape[1])]
        hidden, ffn_outs = run_blocks(list(self.layers), hidden, block_ids, local, gathered,
                                      self.recompute)
        for layer, ffn_out in zip(self.layers, ffn_outs, strict=True):
            if self.record_moe_outputs and layer.is_moe:
                self.moe_outputs[layer.layer_id] = ffn_out.detach().clone()
        head = self.head if self.head is not None else self.embedding
        hidden = self.final_norm(hidden)
        mtp_logits = run_mtp(list(self.mtp), hidden, self.embedding, head, mtp_ids or [], local,
                             gathered, self.moe_outputs if self.record_moe_outputs else None,
                             self.tp)
        (logits,) = self.tp.column_linear(hidden, head.t())  # the vocab-parallel output layer
        return logits, mtp_logits

    def layer(self, layer_id: int) -> DecoderLayer:
        """A decoder layer, or the block of MTP depth layer_id − L."""
        if layer_id >= self.spec.num_layers:
            return self.mtp[layer_id - self.spec.num_layers].block  # type: ignore[return-value]
        return self.layers[layer_id]  # type: ignore[return-value]

    def decoder_layers(self) -> list[DecoderLayer]:
        """Every transformer block, MTP blocks last."""
        return list(self.layers) + [mtp.block for mtp in self.mtp]  # type: ignore[misc]


def ffn_parameter(name: str, num_layers: int) -> tuple[int, str] | None:
    """`layers.<L>.ffn.<rest>` or `mtp.<d>.block.ffn.<rest>` → (layer id, rest); else None."""
    parts = name.split(".")
    if len(parts) > 3 and parts[0] == "layers" and parts[2] == "ffn":
        return int(parts[1]), ".".join(parts[3:])
    if len(parts) > 4 and parts[0] == "mtp" and parts[2] == "block" and parts[3] == "ffn":
        return num_layers + int(parts[1]), ".".join(parts[4:])
    return None


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy [b, s] from logits [s, b, vocab] and labels [b, s]."""
    flat = logits.transpose(0, 1).reshape(-1, logits.shape[-1])
    return F.cross_entropy(flat.float(), labels.reshape(-1), reduction="none").view(labels.shape)


# A TP-split parameter's last two name parts → the dim its TP shards cut (QKV, FC1/W3 and their
# biases by output column; the output projection and FC2 by input row; sinks by head).
_ATTENTION_SPLITS = {"wq": 1, "wk": 1, "wv": 1, "bq": 0, "bk": 0, "bv": 0, "wo": 0,
                     "softmax_offset": 0}
_MLP_SPLITS = {"w1": 1, "w3": 1, "b1": 0, "b3": 0, "w2": 0}
_MAMBA_SPLITS = {"in_proj": 1, "conv1d_weight": 0, "conv1d_bias": 0, "dt_bias": 0, "A_log": 0,
                 "D": 0, "norm_weight": 0, "out_proj": 0}


def tensor_parallel_split(spec: DecoderSpec, name: str) -> tuple[int, tuple[int, ...] | None] | None:
    """How a dense parameter (named as the single-process `Decoder` names it) is split over TP:
    (dim, packed segments or None); None for a weight every TP rank holds whole (norms, the
    row-parallel biases, MoE blocks' router and latent projections). The routed experts follow
    the plan's ETP instead (MoELayer.local_view)."""
    if name in ("embedding", "head"):
        return 0, None
    parts = name.split(".")
    owner, leaf = (parts[-2], parts[-1]) if len(parts) > 1 else ("", name)
    if owner == "attention" and leaf in _ATTENTION_SPLITS:
        return _ATTENTION_SPLITS[leaf], None
    if owner in ("ffn", "shared_expert") and leaf in _MLP_SPLITS:  # dense MLP, SharedExpertMLP
        return _MLP_SPLITS[leaf], None
    if leaf == "eh_proj":  # MTP's column-parallel projection
        return 1, None
    if owner == "mamba" and leaf in _MAMBA_SPLITS and spec.mamba is not None:
        segments = {"in_proj": spec.mamba.in_proj_segments,
                    "conv1d_weight": spec.mamba.conv_segments,
                    "conv1d_bias": spec.mamba.conv_segments}.get(leaf)
        return _MAMBA_SPLITS[leaf], segments
    return None

"""Per-layer attention kinds of the current MoE architectures (gpt-oss's alternating sliding-window
and full attention): which layers are windowed and how many keys a windowed query reads, the
inputs of the window terms on the flops and time pages.

Megatron-LM dev@d48bd6be megatron/core/transformer/utils.py is_layer_window_attention decides a
layer's kind from window_size and window_attn_skip_freq (model.is_window_layer follows it);
megatron/training/training.py num_floating_point_operations has no window term (it counts every
layer's core attention over the whole causal sequence), so the window's own count is moeplan's,
stated on the flops page.
"""

from __future__ import annotations

from collections.abc import Iterable

from planner.budget.expr import Number, Symbol
from planner.config.schema import Config, ModelSection

WINDOW_SYMBOLS: tuple[Symbol, ...] = (
    Symbol("window_keys", "keys a causal sliding-window query reads at most: window_size's left "
           "part + itself (the causal mask hides the right part; 0 without a window)"),
    Symbol("L_model_window", "sliding-window attention layers of the whole model (decoder layers; "
           "MTP layers counted full)"),
)

WINDOW_STAGE_SYMBOLS: tuple[tuple[str, str], ...] = (
    ("L_window", "sliding-window attention layers on the stage (decoder layers)"),
    ("L_window_recomputed", "sliding-window attention layers among blocks_recomputed"),
)


def window_layers(model: ModelSection, layers: Iterable[int]) -> int:
    """How many of the 0-based `layers` are sliding-window attention (MTP layers, numbered from
    num_layers, are not)."""
    return sum(1 for layer in layers if layer < model.num_layers and model.is_window_layer(layer))


def window_values(cfg: Config) -> dict[str, Number]:
    m = cfg.model
    return {"window_keys": m.window_size[0] + 1 if m.window_size else 0,
            "L_model_window": window_layers(m, range(m.num_layers))}


def window_core(blocks: str, windowed: str) -> str:
    """The time page's core attention FLOPs per token of `blocks` of which `windowed` are
    sliding-window layers (the flops page's window rows)."""
    return (f"({blocks} - {windowed}) * flops_attention_core_fwd_per_token"
            f" + {windowed} * flops_attention_window_core_fwd_per_token")

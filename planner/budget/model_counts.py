"""Whole-model layer counts, as Megatron's FLOPs formula counts them (inputs of the flops page).

The per-stage counts (planner/budget/symbols.py) say what one stage runs; the model's FLOPs per
token need the totals, counted the way Megatron-LM dev@d48bd6be megatron/training/training.py
num_floating_point_operations counts them: MTP layers are MoE exactly when the last decoder layer
is, and DeepSeek-V4 attention layers are bucketed by their compress ratio (0, 4, 128) over the
decoder and MTP layers together.
"""

from __future__ import annotations

from typing import Any

from planner.budget.expr import Number, Symbol
from planner.config.schema import Config
from planner.memo import Memo, section_key

HCA_RATIO = 128  # the only non-CSA compress ratio Megatron's FLOPs formula counts

MODEL_SYMBOLS: tuple[Symbol, ...] = (
    Symbol("L_model", "transformer blocks of the whole model (decoder layers + MTP layers)"),
    Symbol("L_model_moe", "MoE blocks of the whole model (MTP layers count as MoE when the last "
           "decoder layer is MoE, as Megatron's FLOPs formula counts them)"),
    Symbol("L_model_dense", "dense-MLP blocks of the whole model (the same rule; a hybrid model's "
           "mixer-only blocks have none)"),
    Symbol("L_model_mtp", "MTP layers of the whole model (mtp_num_layers)"),
    Symbol("L_model_csa", "DeepSeek-V4 blocks with compress ratio 4 (CSA), MTP included"),
    Symbol("L_model_hca", "DeepSeek-V4 blocks with compress ratio 128 (HCA), MTP included"),
)


_COUNTED: Memo[tuple[Any, ...], dict[str, Number]] = Memo("model layer counts", 256)


def model_values(cfg: Config) -> dict[str, Number]:
    """The whole-model counts of `MODEL_SYMBOLS` for this config, remembered per model (search's
    candidates share the user's)."""
    return dict(_COUNTED.get(section_key(cfg.model), _model_values, cfg))


def _model_values(cfg: Config) -> dict[str, Number]:
    m = cfg.model
    moe = sum(1 for layer in range(m.num_layers) if m.is_moe_layer(layer))
    last_moe = int(m.is_moe_layer(m.num_layers - 1))
    alone = sum(1 for layer in range(m.num_layers) if not m.has_mlp(layer))
    mtp = m.mtp_num_layers
    ratios = list(m.compress_ratios or []) if m.attention_variant == "dsv4_hybrid" else []
    return {
        "L_model": m.num_layers + mtp,
        "L_model_moe": moe + last_moe * mtp,
        "L_model_dense": m.num_layers - moe - alone + (1 - last_moe) * mtp,
        "L_model_mtp": mtp,
        "L_model_csa": ratios.count(4),
        "L_model_hca": ratios.count(HCA_RATIO),
    }

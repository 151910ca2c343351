"""The model's size: total, MTP, activated-per-token and embedding parameters.

No second parameter count: the formula book's params page is evaluated for the whole model on one
rank (every parallel degree 1, one pipeline stage holding every layer), so the figures are the
same formulas that budget each rank's weights. Plain rational arithmetic, no sympy (`moeplan check`
prints them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.accounting import Accounting, BudgetError
from planner.config.schema import Config
from planner.layout.pipeline import SplitError

_TARGETS = ("dense_params_on_rank", "expert_params_on_rank", "routed_params_per_layer",
            "embedding_params", "moe_layers")


@dataclass(frozen=True)
class ModelSize:
    """Parameter counts of the whole model (not of one rank)."""

    total_params: int       # without the MTP block(s)
    mtp_params: int         # what the MTP block(s) add (their embedding/output are shared)
    active_params: int      # per token: every non-routed parameter + top-k routed experts, no MTP
    embedding_params: int   # input embedding + output layer (one matrix when tied)
    routed_expert_params: int  # all routed experts of all MoE layers, no MTP

    def as_json(self) -> dict[str, Any]:
        return {"total_params": self.total_params, "active_params": self.active_params,
                "mtp_params": self.mtp_params, "embedding_params": self.embedding_params,
                "routed_expert_params": self.routed_expert_params}


def whole_model(cfg: Config, mtp: bool = True) -> Config:
    """The same model on one rank: every degree 1, one stage, no layout string."""
    # the block fields carry what a hybrid pattern said (a pattern's MTP part would fight mtp=False)
    model = cfg.model.model_dump(exclude={"preset", "hybrid_layer_pattern"})
    if not mtp:
        model["mtp_num_layers"] = 0
        ratios = model.get("compress_ratios")
        if ratios is not None:
            model["compress_ratios"] = ratios[:cfg.model.num_layers]
    return Config.model_validate({
        "model": model, "parallel": {"world_size": 1},
        "training": {"seq_length": cfg.training.seq_length, "micro_batch_size": 1},
        "moe": {"moe_latent_size": cfg.moe.moe_latent_size},
    })


def _params(cfg: Config) -> dict[str, Any]:
    """The params page's quantities for the one stage of a whole-model config."""
    return Accounting(cfg, _TARGETS).stage_env(0)


def model_size(cfg: Config) -> ModelSize | None:
    """The model's parameter counts, or None when the model has no whole-model split (another
    finding says why)."""
    try:
        full, main = _params(whole_model(cfg)), _params(whole_model(cfg, mtp=False))
    except (BudgetError, SplitError, ValueError, ZeroDivisionError):
        return None
    m = cfg.model
    routed = main["expert_params_on_rank"]
    total = main["dense_params_on_rank"] + routed
    with_mtp = full["dense_params_on_rank"] + full["expert_params_on_rank"]
    # Every routed expert has the same shape, so k of E of them are k/E of the routed parameters.
    active = main["dense_params_on_rank"] + routed * m.moe_router_topk // m.num_experts
    tables = 2 if m.untie_embeddings_and_output_weights else 1
    return ModelSize(int(total), int(with_mtp - total), int(active),
                     int(tables * main["embedding_params"]), int(routed))

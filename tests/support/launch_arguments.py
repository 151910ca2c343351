"""The small MoE model the launch-argument tests import, count and emit: one Megatron launch line
(`LINE`) and the same model as a moeplan config (`build`), 2 ranks at EP 2, bf16."""

from __future__ import annotations

import copy
from typing import Any

from planner.accounting import budgets
from planner.config.importers.megatron_args import import_arguments
from planner.config.loader import parse_config
from planner.config.schema import Config

H, SEQ = 64, 32
MODEL = {"num_layers": 2, "hidden_size": H, "num_attention_heads": 4, "ffn_hidden_size": 128,
         "vocab_size": 1000, "num_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 32,
         "hidden_dropout": 0.0, "attention_dropout": 0.0}
LINE = ("pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 "
        "--vocab-size 1000 --num-experts 4 --moe-router-topk 2 --seq-length 32 --max-position-embeddings 32 "
        "--swiglu --normalization RMSNorm --disable-bias-linear --bf16 ")


def build(model: dict[str, Any] | None = None, **sections: dict[str, Any]) -> Config:
    data: dict[str, Any] = {"model": {**MODEL, **(model or {})}, "parallel": {"world_size": 2, "ep": 2},
                            "training": {"seq_length": SEQ, "micro_batch_size": 1, "global_batch_size": 2,
                                         "precision": "bf16", "use_distributed_optimizer": True}}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **copy.deepcopy(values)}
    return parse_config(data)


def stage0(cfg: Config) -> dict[str, Any]:
    return {b.name: b.value for b in budgets(cfg) if b.stage in (None, 0)}


def imported(extra: str) -> dict[str, dict[str, Any]]:
    return import_arguments(LINE + extra, world_size=2).data

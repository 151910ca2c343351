"""FP8 weights in memory and in the DP parameter all-gather, with and without fp8_param_gather,
each against a hand derivation on a tiny model, plus the rule, the emitter and the importer.

The model: 2 MoE blocks, h 8, 2 heads of d 4 (no GQA: 2 groups), 4 routed experts of I 4 (SwiGLU),
no shared expert, vocab 16; 4 ranks, EP 2, the distributed optimizer, bf16 (p = 2).
  attention GEMM weights per block  2·h·d·(heads + groups) = 2·8·4·4 = 256 → 2 blocks: 512
  routed experts per rank and layer  2 experts · 3 · h · I = 2·3·8·4 = 192 → 2 layers: 384
  the rank's dense and expert parameters (1,640 and 384: embedding, output, norms, router and the
  above) are read from the budget; only the FP8 parts are derived here.
  buffers: dense 1,640 → 1,664 (pad lcm(4 shards, 128) = 128); expert 384 (pad 128).
"""

from __future__ import annotations

from typing import Any

import pytest

from planner.accounting import budgets
from planner.config.importers.megatron_args import import_arguments
from planner.config.schema import Config
from planner.emit.megatron import megatron_arguments
from planner.rules import run_rules

FP8_DENSE, FP8_EXPERT = 512, 384
FP8 = FP8_DENSE + FP8_EXPERT  # 896
DENSE, EXPERT = 1640, 384
BUFFER = 1664 + 384  # both padded buffers, one bf16 buffer each without fp8_param_gather


def tiny(training: dict[str, Any] | None = None, cluster: dict[str, Any] | None = None) -> Config:
    return Config.model_validate(
        {"model": {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "vocab_size": 16,
                   "num_experts": 4, "moe_ffn_hidden_size": 4, "ffn_hidden_size": 12},
         "parallel": {"world_size": 4, "ep": 2},
         "training": {"seq_length": 8, "use_distributed_optimizer": True, **(training or {})},
         "cluster": cluster or {}}, strict=False)


def values(cfg: Config) -> dict[str, Any]:
    return {b.name: b.value for b in budgets(cfg, stage=0)}


def test_the_tiny_model_has_the_counts_the_derivations_use() -> None:
    v = values(tiny({"fp8_format": "e4m3"}))
    assert (v["dense_params_on_rank"], v["expert_params_on_rank"]) == (DENSE, EXPERT)
    assert (v["dense_fp8_params_on_rank"], v["expert_fp8_params_on_rank"]) == (FP8_DENSE, FP8_EXPERT)
    assert v["dense_buffer_params"] + v["expert_buffer_params"] == BUFFER


def test_without_fp8_the_weights_are_the_bf16_buffers() -> None:
    v = values(tiny())
    assert "fp8_weight_bytes" not in v
    assert v["weight_bytes"] == BUFFER * 2 == 4096


@pytest.mark.parametrize(("training", "gpu", "copy", "weights"), [
    # Hopper, tensor scaling: FP8 data + transpose (2 B) next to the bf16 parameter (2 B):
    # (2048 − 896)·2 + 896·(2 + 2) = 2304 + 3584
    ({"fp8_format": "e4m3"}, "H100", 2, 2304 + 896 * 4),
    # fp8_param_gather: the FP8 data is the parameter (1 B in the uint8 buffer) + transpose (1 B)
    ({"fp8_format": "e4m3", "fp8_param_gather": True}, "H100", 2, 2304 + 896 * 2),
    # Blackwell reads one FP8 copy in either layout: 1 B next to the parameter, or alone
    ({"fp8_format": "e4m3", "fp8_recipe": "tensorwise"}, "B200", 1, 2304 + 896 * 3),
    ({"fp8_format": "e4m3", "fp8_recipe": "tensorwise", "fp8_param_gather": True}, "B200", 1,
     2304 + 896),
    # blockwise: rowwise and columnwise data on either GPU (block scales left out)
    ({"fp8_format": "e4m3", "fp8_recipe": "blockwise"}, "B200", 2, 2304 + 896 * 4),
    # mxfp8: both usages with an E8M0 scale per 32 elements: 2 + 2/32 = 33/16 B
    ({"fp8_format": "e4m3", "fp8_recipe": "mxfp8"}, "B200", "33/16", 2304 + 896 * 2 + 896 * 33 // 16),
    ({"fp8_format": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True}, "B200", "33/16",
     2304 + 896 * 33 // 16),
])
def test_fp8_weight_bytes_per_recipe(training: dict[str, Any], gpu: str, copy: Any,
                                     weights: int) -> None:
    v = values(tiny(training, {"gpu": gpu}))
    assert str(v["fp8_copy_bytes_per_param"]) == str(copy)
    assert v["weight_bytes"] == weights


def test_fp8_param_gather_saves_the_training_precision_copy_exactly() -> None:
    """The only difference fp8_param_gather makes to memory: p bytes per FP8 weight."""
    off = values(tiny({"fp8_format": "e4m3"}))
    on = values(tiny({"fp8_format": "e4m3", "fp8_param_gather": True}))
    assert off["peak_memory_bytes"] - on["peak_memory_bytes"] == FP8 * 2
    assert (off["grad_bytes"], off["optimizer_bytes"]) == (on["grad_bytes"], on["optimizer_bytes"])


def test_param_gather_moves_fp8_weights_at_one_byte() -> None:
    """Two buffers per kind under fp8_param_gather, each padded to 128:
    dense: FP8 512 → 512 at 1 B, the rest 1,640 − 512 = 1,128 → 1,152 at 2 B: 512 + 2,304 = 2,816
    bytes whole, 2,816 / 4 shards = 704 sent; experts: 384 FP8 at 1 B, nothing else: 384 whole,
    384 / 2 shards = 192 sent. Without it: 1,664·2 / 4 = 832 and 384·2 / 2 = 384."""
    off = values(tiny({"fp8_format": "e4m3"}))
    on = values(tiny({"fp8_format": "e4m3", "fp8_param_gather": True}))
    gather = "step.{}_param_gather.fwd.{}_bytes"
    assert [off[gather.format(k, "send")] for k in ("dense", "expert")] == [832, 384]
    assert [on[gather.format(k, "send")] for k in ("dense", "expert")] == [704, 192]
    assert [on[gather.format(k, "recv")] for k in ("dense", "expert")] == [2816, 384]


def test_mxfp8_gathers_bf16_through_the_grad_buffer() -> None:
    """mxfp8 weights are gathered as bf16 (2 B): the same bytes as without FP8."""
    on = values(tiny({"fp8_format": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True},
                     {"gpu": "B200"}))
    assert on["fp8_gather_bytes_per_param"] == 2
    assert on["step.dense_param_gather.fwd.send_bytes"] == 832


def codes(training: dict[str, Any]) -> set[str]:
    return {f.code for f in run_rules(tiny(training))}


def test_fp8_param_gather_needs_fp8_and_the_distributed_optimizer() -> None:
    assert "DOP008" not in codes({"fp8_format": "e4m3", "fp8_param_gather": True})
    bad = [f for f in run_rules(tiny({"fp8_param_gather": True, "use_distributed_optimizer": False}))
           if f.code == "DOP008"]
    assert sorted(f.path for f in bad) == ["training.fp8_param_gather",
                                          "training.use_distributed_optimizer"]


def test_fp8_param_gather_is_emitted_and_read_back() -> None:
    assert "--fp8-param-gather" in megatron_arguments(
        tiny({"fp8_format": "e4m3", "fp8_param_gather": True})).as_dict()
    assert "--fp8-param-gather" not in megatron_arguments(tiny({"fp8_format": "e4m3"})).as_dict()
    imported = import_arguments("python pretrain_gpt.py --fp8-format e4m3 --fp8-param-gather")
    assert imported.data["training"]["fp8_param_gather"] is True


# --- training.first_last_layers_bf16: Megatron builds the first and last N decoder layers outside
# TE's FP8 context (Megatron-LM dev@d48bd6be megatron/core/fp8_utils.py is_first_last_bf16_layer).
# Block 0 in BF16: its attention 256 and its 192 expert weights leave the FP8 counts.
BF16_FIRST = {"fp8_format": "e4m3", "fp8_recipe": "tensorwise", "first_last_layers_bf16": True,
              "num_layers_at_end_in_bf16": 0}


def test_bf16_first_layer_keeps_its_weights_out_of_fp8() -> None:
    v = values(tiny(BF16_FIRST))
    assert (v["dense_fp8_params_on_rank"], v["expert_fp8_params_on_rank"]) == (256, 192)
    # Hopper tensorwise: 448 FP8 weights at 2 + 2 B, the other 2048 − 448 at 2 B
    assert v["weight_bytes"] == (2048 - 448) * 2 + 448 * 4 == 4992
    both = values(tiny({**BF16_FIRST, "num_layers_at_end_in_bf16": 1}))
    assert both["fp8_params_on_rank"] == 0 and both["weight_bytes"] == 2048 * 2


def test_bf16_first_layer_in_the_fp8_param_gather() -> None:
    """dense: FP8 256 → 256 at 1 B, the rest 1,640 − 256 = 1,384 → 1,408 at 2 B: 3,072 whole,
    768 sent of 4 shards; experts: 192 → 256 at 1 B and 192 → 256 at 2 B: 768 whole, 384 sent."""
    v = values(tiny({**BF16_FIRST, "fp8_param_gather": True}))
    gather = "step.{}_param_gather.fwd.{}_bytes"
    assert [v[gather.format(k, "recv")] for k in ("dense", "expert")] == [3072, 768]
    assert [v[gather.format(k, "send")] for k in ("dense", "expert")] == [768, 384]


def test_bf16_layers_refused_where_megatron_refuses_them() -> None:
    from pydantic import ValidationError

    for training, words in (({"fp8_format": "e4m3", "first_last_layers_bf16": True}, "delayed"),
                            ({**BF16_FIRST, "num_layers_at_start_in_bf16": 3}, "num_layers // pp = 2")):
        with pytest.raises(ValidationError, match=words):
            tiny(training)
    # without FP8 or FP4 the switch changes nothing (Megatron checks it only under FP8)
    assert values(tiny({"first_last_layers_bf16": True}))["weight_bytes"] == 4096


def test_bf16_layers_are_emitted_and_read_back() -> None:
    args = megatron_arguments(tiny({**BF16_FIRST})).as_dict()
    assert "--first-last-layers-bf16" in args and args["--num-layers-at-end-in-bf16"] == ("0",)
    assert "--num-layers-at-start-in-bf16" not in args  # Megatron's default, 1
    imported = import_arguments("python pretrain_gpt.py --fp8-format e4m3 --fp8-recipe tensorwise "
                                "--first-last-layers-bf16 --num-layers-at-end-in-bf16 0")
    training = imported.data["training"]
    assert training["first_last_layers_bf16"] is True and training["num_layers_at_end_in_bf16"] == 0

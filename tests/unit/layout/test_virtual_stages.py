"""Virtual pipeline stages from --num-layers-per-virtual-pipeline-stage with the account-for flags,
as Megatron-LM dev@d48bd6be megatron/training/arguments.py validate_args derives them (the
num_layers_per_virtual_pipeline_stage branch): num_layers + 1 per account-for flag, split over PP,
then over the layers per virtual stage; uneven pipelines need --num-virtual-stages-per-pipeline-rank.

The case is the Megatron-MoE-ModelZoo Qwen3-235B-A22B H100 best practice (yanring/Megatron-MoE-ModelZoo
best_practice/qwen3/run_h100_235b.sh @bff12290 with model_configs/benchmarking/Qwen3-235B-A22B.yaml
@1ed4179f): TP 2, PP 8, VPP 4, EP 32 on 32 nodes, 94 layers + embedding + loss = 96 slots, 12 per
stage, 3 per virtual stage, the DeepEP dispatcher and the batch-level EP overlap.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from planner.config.loader import parse_config
from planner.layout.pipeline import SplitError, stage_split
from planner.rules import run_rules
from tests.support.megatron_judge import case_of, register, verdict

QWEN3_235B: dict[str, Any] = {
    "model": {"num_layers": 94, "hidden_size": 4096, "ffn_hidden_size": 12288, "num_attention_heads": 64,
              "kv_channels": 128, "num_query_groups": 4, "qk_layernorm": True, "vocab_size": 151936,
              "make_vocab_size_divisible_by": 1187, "max_position_embeddings": 40960,
              "untie_embeddings_and_output_weights": True, "num_experts": 128, "moe_router_topk": 8,
              "moe_ffn_hidden_size": 1536, "moe_router_dtype": "fp32", "rotary_base": 1000000,
              "hidden_dropout": 0.0, "attention_dropout": 0.0, "norm_epsilon": 1e-6},
    "parallel": {"world_size": 256, "tp": 2, "pp": 8, "ep": 32, "etp": 1, "sequence_parallel": True,
                 "num_layers_per_virtual_pipeline_stage": 3,
                 "account_for_embedding_in_pipeline_split": True,
                 "account_for_loss_in_pipeline_split": True},
    "training": {"seq_length": 4096, "micro_batch_size": 1, "global_batch_size": 2048,
                 "use_distributed_optimizer": True},
    "moe": {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep",
            "moe_aux_loss_coeff": 1e-3, "moe_grouped_gemm": True},  # permute fusion: TE only
    "overlap": {"overlap_moe_expert_parallel_comm": True, "overlap_grad_reduce": True,
                "overlap_param_gather": True, "recompute_granularity": "selective",
                "recompute_modules": ["moe_act", "layernorm"]},
    "cluster": {"nodes": 32, "gpus_per_node": 8, "gpu": "H100"},
}


def qwen(**parallel: Any) -> dict[str, Any]:
    data = copy.deepcopy(QWEN3_235B)
    data["parallel"].update(parallel)
    data["parallel"] = {k: v for k, v in data["parallel"].items() if v is not None}
    return data


def test_account_for_slots_give_megatrons_vpp():
    """96 slots / PP 8 = 12 per stage, / 3 per virtual stage = VPP 4; the embedding takes a slot of
    the first virtual stage and the loss one of the last (2 layers each, 3 elsewhere)."""
    split = stage_split(parse_config(qwen()))
    assert split.vpp == 4 and len(split.chunks) == 32
    counts = [len(chunk.layers) for chunk in split.chunks]
    assert counts[0] == 2 and counts[-1] == 2 and set(counts[1:-1]) == {3} and sum(counts) == 94
    codes = {f.code for f in run_rules(parse_config(qwen()))}
    assert not {"PIP001", "OVL003"} & codes, codes


@pytest.mark.parametrize(("changes", "fragment"), [
    # 94 + 1 = 95 slots do not split over 8 stages: Megatron's assertion, and its advice
    ({"account_for_loss_in_pipeline_split": None}, "--num-virtual-stages-per-pipeline-rank"),
    # 12 per stage, 5 per virtual stage: not a divisor
    ({"num_layers_per_virtual_pipeline_stage": 5}, "by num_layers_per_virtual_pipeline_stage=5"),
    # uneven first/last stages: Megatron asks for the VPP degree itself
    ({"decoder_first_pipeline_num_layers": 10}, "asks for --num-virtual-stages-per-pipeline-rank"),
    # two spellings of the virtual degree at once
    ({"vpp": 4}, "no more than one of --num-layers-per-virtual-pipeline-stage"),
    ({"pipeline_model_parallel_layout": "Et*11|(t*12|)*6t*11L"}, "no more than one of"),
    # TransformerConfig.__post_init__: first/last stage counts exclude the account-for flags
    ({"num_layers_per_virtual_pipeline_stage": None, "vpp": 4, "decoder_first_pipeline_num_layers": 8},
     "refuses them together"),
])
def test_megatrons_refusals_are_named(changes: dict[str, Any], fragment: str):
    with pytest.raises(SplitError) as caught:
        stage_split(parse_config(qwen(**changes)))
    # PIP001 alone: the EP overlap asked for virtual stages, so no OVL003 follows the failed split
    assert "OVL003" not in {f.code for f in run_rules(parse_config(qwen(**changes)))}
    text = f"{caught.value.message} ({caught.value.fix})"
    assert fragment in text, text
    assert "vpp=" not in caught.value.message  # no degree moeplan invented


ORACLE_QWEN = "virtual stages: Qwen3-235B-A22B ModelZoo H100, account-for + layers per VP stage"
register(ORACLE_QWEN, case_of(parse_config({**qwen(), "ignore": ["MEM001", "MEM002"]}), ORACLE_QWEN))


def test_megatron_derives_the_same_virtual_stages():
    """Megatron's parser on the emitted arguments (--num-layers-per-virtual-pipeline-stage 3 with
    both account-for flags) derives VPP 4 and builds the same layers per virtual stage."""
    result = verdict(ORACLE_QWEN)
    assert result.verdict == "pass", (result.message, result.location, result.mismatches)


ORACLE_UNEVEN = "virtual stages: Qwen3-235B-A22B, first/last stage counts with VPP 2"
UNEVEN = qwen(num_layers_per_virtual_pipeline_stage=None, account_for_embedding_in_pipeline_split=None,
              account_for_loss_in_pipeline_split=None, vpp=2, decoder_first_pipeline_num_layers=10,
              decoder_last_pipeline_num_layers=12)
register(ORACLE_UNEVEN, case_of(parse_config({**UNEVEN, "ignore": ["MEM001", "MEM002"]}), ORACLE_UNEVEN))


def test_uneven_pipeline_with_virtual_stages_per_rank():
    """--decoder-first/last-pipeline-num-layers with --num-virtual-stages-per-pipeline-rank:
    TransformerConfig.__post_init__ (uneven PP) wants each of them, and the middle stages' layers,
    divisible by VPP; 94 - 10 - 12 = 72 layers over 6 middle stages, 12 each. Megatron builds the
    same chunks (5 / 6 / 6 layers per virtual stage)."""
    split = stage_split(parse_config(UNEVEN))
    assert split.vpp == 2
    assert [len(c.layers) for c in split.chunks if c.stage in (0, 1, 7)] == [5, 6, 6, 5, 6, 6]
    result = verdict(ORACLE_UNEVEN)
    assert result.verdict == "pass", (result.message, result.location, result.mismatches)

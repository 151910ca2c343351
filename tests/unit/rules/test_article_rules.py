"""Rules the source article's last items asked for, each by a hand-made case: virtual experts'
dispatcher, backend and overlap (article §27; Megatron-LM PR #7450, open, not in main@d98e8a64
or dev@d48bd6be) and GTP sequence sharding's packing-scheduler exclusion (article §22/§26;
Megatron-LM dev@d48bd6be megatron/core/datasets/data_schedule.py:407 DefaultDynamicCPScheduler)."""

from __future__ import annotations

from typing import Any

from planner.config.loader import parse_config
from planner.rules import run_rules
from planner.rules.example_base import example_config_data, merge
from tests.support.megatron_lines import megatron_line
from tests.support.oracle import megatron_lm_dir

HYBRIDEP = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}


def _codes(overlay: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in run_rules(parse_config(merge(example_config_data(""), overlay)))]


def test_virtual_experts_run_on_flex_hybridep_only():
    assert _codes({"moe": {"moe_virtual_experts": True, **HYBRIDEP}}) == []
    assert _codes({"moe": {"moe_virtual_experts": True}}) == [("VEX006", "moe.moe_token_dispatcher_type")]
    deepep = {**HYBRIDEP, "moe_flex_dispatcher_backend": "deepep"}
    assert _codes({"moe": {"moe_virtual_experts": True, **deepep}}) == [
        ("VEX007", "moe.moe_flex_dispatcher_backend")]


def test_virtual_experts_warn_under_batch_level_ep_overlap():
    overlay = {"moe": {"moe_virtual_experts": True, **HYBRIDEP}, "parallel": {"pp": 1},
               "overlap": {"overlap_moe_expert_parallel_comm": True}}
    assert _codes(overlay) == [("VEX008", "overlap.overlap_moe_expert_parallel_comm")]


def test_sequence_shards_exclude_the_dynamic_cp_scheduler_only():
    sharded = {"parallel": {"gtp": 4, "gtp_remat_num_sequence_shards": 2}}
    dynamic = merge(sharded, {"training": {"sequence_packing_scheduler": "default_dynamic_cp"}})
    assert ("GTP009", "training.sequence_packing_scheduler") in _codes(dynamic)
    balanced = merge(sharded, {"training": {"sequence_packing_scheduler": "dp_balanced"}})
    assert "GTP009" not in [code for code, _ in _codes(balanced)]
    unsharded = {"parallel": {"gtp": 4}, "training": {"sequence_packing_scheduler": "default_dynamic_cp"}}
    assert "GTP009" not in [code for code, _ in _codes(unsharded)]


def test_cited_line():
    assert "class DefaultDynamicCPScheduler(DpBalancedScheduler):" in megatron_line(
        "core/datasets/data_schedule.py", 407)


# ----------------------------------------------------------------------------- not in Megatron
# Article §23, §30, §31: DualPipe for mHC, the V4 trainer's Muon gradient all-to-all and MXFP4 QAT.

V4 = {"model": {"attention_variant": "dsv4_hybrid", "compress_ratios": [0, 4, 128, 4]}}


def test_what_megatron_lacks_is_said_as_information():
    mhc = {"model": {"enable_hyper_connections": True}, "parallel": {"pp": 2},
           "overlap": {"pipeline_schedule": "dualpipe"}}
    assert ("V4030", "overlap.pipeline_schedule") in _codes(mhc)
    assert "V4030" not in [c for c, _ in _codes({"model": {"enable_hyper_connections": True}})]
    assert ("V4031", "training.optimizer") in _codes(merge(V4, {"training": {"optimizer": "muon"}}))
    assert ("V4032", "training.fp4") in _codes(merge(V4, {"training": {"fp4": True}}))
    found = run_rules(parse_config(merge(example_config_data(""), merge(mhc, V4))))
    assert {f.code: f.severity for f in found if f.code.startswith("V403")} == {"V4030": "error"}


def test_megatron_dev_has_no_dualpipe_mxfp4_or_muon_all_to_all():
    # the oracle's source, searched: megatron/core/transformer/transformer_config.py:718 offers
    # fp4_recipe nvfp4 or custom only; LayerWiseDistributedOptimizer (layer_wise_optimizer.py:105)
    # has no all-to-all; nothing is named DualPipe
    assert "fp4_recipe: Optional[Literal['nvfp4', 'custom']]" in megatron_line(
        "core/transformer/transformer_config.py", 718)
    assert "class LayerWiseDistributedOptimizer(ChainedOptimizer):" in megatron_line(
        "core/optimizer/layer_wise_optimizer.py", 105)
    root, _ = megatron_lm_dir()
    assert root is not None  # megatron_line above skips without a checkout
    for path in ("core/optimizer/layer_wise_optimizer.py", "core/optimizer/emerging_optimizers.py"):
        assert "all_to_all" not in (root / "megatron" / path).read_text(encoding="utf-8")
    schedules = (root / "megatron" / "core/pipeline_parallel/schedules.py").read_text(encoding="utf-8")
    assert "dualpipe" not in schedules.lower()

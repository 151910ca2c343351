"""Article §28: with capacity dropping the layout decides which assignments drop. Megatron-LM
dev@d48bd6be megatron/core/transformer/moe/moe_utils.py:944 apply_router_token_dropping sizes the
capacity from the router's local num_tokens (:942) before any dispatch, so the rank's slice of the
batch is the competing set: CP, TP·SP and b change it, EP does not. `moeplan check` says so
(MOE033, info) and `moeplan reshard-plan` compares two layouts. Hand-derived on the rule
examples' base (seq_length 256, b 1, 8 ranks, PP 2, EP 4)."""

from __future__ import annotations

from typing import Any

from planner.config.loader import parse_config
from planner.reshard import reshard_plan
from planner.rules import run_rules
from planner.rules.example_base import example_config_data, merge
from tests.support.megatron_lines import megatron_line

DROP = {"moe": {"moe_expert_capacity_factor": 1.0}}


def _cfg(overlay: dict[str, Any]) -> Any:
    return parse_config(merge(example_config_data(""), merge(DROP, overlay)))


def test_check_says_drops_follow_the_slicing():
    [finding] = [f for f in run_rules(_cfg({})) if f.code == "MOE033"]
    assert finding.severity == "info" and "256 local token rows" in finding.message
    dropless = parse_config(example_config_data(""))
    assert "MOE033" not in [f.code for f in run_rules(dropless)]


def test_reshard_plan_compares_the_competing_sets():
    # EP 4 → EP 2: the router still drops over the same 256 rows a rank → the same drops
    same = reshard_plan(_cfg({}), _cfg({"parallel": {"ep": 2}}))["drops"]
    assert same["same"] and same["why"].startswith("the same local slicing")
    # CP 1 → 2 (DP 4 → 2): 128 rows a rank, cut zigzag → other assignments drop
    other = reshard_plan(_cfg({}), _cfg({"parallel": {"cp": 2}}))["drops"]
    assert not other["same"]
    assert "local_tokens 256 → 128" in other["why"] and "cp 1 → 2" in other["why"]
    assert reshard_plan(parse_config(example_config_data("")), parse_config(example_config_data("")))[
        "drops"] is None


def test_cited_lines():
    utils = "core/transformer/moe/moe_utils.py"
    assert "num_tokens, num_experts = routing_probs.shape" in megatron_line(utils, 942)
    assert "expert_capacity = get_capacity(" in megatron_line(utils, 944)

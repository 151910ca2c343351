"""The rule catalog: every rule fails on its bad example and passes on its good one, plus hand-derived
cases (grids, batches, the worked V4-Pro layout), the ignore list, and `moeplan rules`."""

from __future__ import annotations

import copy
import importlib
import json
import pkgutil
import re
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import planner.rules as rules_pkg
from planner.cli import app
from planner.config.loader import InvalidConfig, load_config, parse_config, parse_yaml
from planner.findings import Finding
from planner.layout.pipeline import stage_split
from planner.layout.spec import grid_spec_from_config, layout_problems
from planner.rules import CATALOG, CODES, Rule, find_rule, run_rules
from planner.rules.example_base import EXAMPLE_BASE_YAML, example_config_data, merge
from tests.support.base_configs import MINIMAL_V4
from tests.support.paths import EXAMPLES

CHECKED = [r for r in CATALOG if r.check is not None]
DOCUMENTED = [r for r in CATALOG if r.check is None]
# Megatron-LM at a named commit (path + function), the DeepSeek-V4 write-up, an open Megatron PR,
# moeplan's own model or code; several joined by "; " when the rule says what each of them does.
_ONE_SOURCE = (r"(Megatron-LM (dev@d48bd6be|main@d98e8a64) megatron/\S+\.py [\w.]+"
               r"|the DeepSeek-V4 Megatron write-up|Megatron-LM PR #\d+, .+|moeplan's model of .+"
               r"|planner/\S+\.py\S* ?.*)")
SOURCE = re.compile(rf"{_ONE_SOURCE}(; {_ONE_SOURCE})*")
FAMILIES = {"CFG", "PAR", "BAT", "PIP", "V4", "MOE", "OVL", "GTP", "DOP", "VEX", "ARC", "CLU", "MEM", "ARG",
            "IGN", "OFL", "VER"}

runner = CliRunner()


def findings_for(data: dict[str, Any]) -> list[Finding]:
    return run_rules(parse_config(data))


def codes_for(data: dict[str, Any]) -> list[str]:
    return [f.code for f in findings_for(data)]


def base() -> dict[str, Any]:
    return example_config_data("")


def with_overlay(overlay: dict[str, Any]) -> dict[str, Any]:
    return merge(base(), overlay)


# ----------------------------------------------------------------------------- every rule


@pytest.mark.parametrize("entry", CHECKED, ids=lambda r: r.code)
def test_bad_example_triggers_the_rule(entry: Rule):
    found = [f for f in findings_for(example_config_data(entry.bad)) if f.code == entry.code]
    assert found, f"{entry.code}: bad example does not trigger it"
    for finding in found:
        assert finding.severity == entry.severity and finding.source == entry.source
        assert finding.path and finding.message and finding.fix
        assert "{" not in finding.message and "None" not in finding.message


@pytest.mark.parametrize("entry", CHECKED, ids=lambda r: r.code)
def test_good_example_is_a_valid_config(entry: Rule):
    found = findings_for(example_config_data(entry.good))
    assert entry.code not in [f.code for f in found]
    assert [f.line() for f in found if f.severity == "error"] == []


@pytest.mark.parametrize("entry", DOCUMENTED, ids=lambda r: r.code)
def test_loader_codes_are_documented_with_whole_file_examples(entry: Rule):
    with pytest.raises(InvalidConfig) as bad:  # CFG008 is found while parsing, before the tree is built
        parse_config(*parse_yaml(entry.bad))
    assert entry.code in [f.code for f in bad.value.findings]
    data, positions, duplicates = parse_yaml(entry.good)
    parse_config(data, positions, duplicates)


def test_the_example_base_is_clean():
    assert findings_for(base()) == []
    assert yaml.safe_load(EXAMPLE_BASE_YAML) == base()


@pytest.mark.parametrize("entry", CATALOG, ids=lambda r: r.code)
def test_every_entry_is_documented(entry: Rule):
    assert re.fullmatch(r"[A-Z][A-Z0-9]*\d{3}", entry.code) and entry.family in FAMILIES
    assert entry.severity in {"error", "warning", "info"}
    assert entry.title and len(entry.why) > 40 and entry.bad and entry.good and entry.bad != entry.good
    assert SOURCE.fullmatch(entry.source), entry.source


def test_codes_are_unique_and_every_rule_unit_is_in_the_catalog():
    assert len(CODES) == len(CATALOG) == len(set(CODES))
    in_modules = set()
    for module_info in pkgutil.iter_modules(rules_pkg.__path__):
        module = importlib.import_module(f"planner.rules.{module_info.name}")
        in_modules.update(v.code for v in vars(module).values() if isinstance(v, Rule))
        in_modules.update(v.code for value in vars(module).values() if isinstance(value, tuple)
                          for v in value if isinstance(v, Rule))
    assert in_modules == set(CODES)


def test_the_issue_rule_list_has_one_code_per_rule():
    # The issue's list, rule by rule (each is a separate code); `moeplan rules CODE` explains each.
    required = """PAR001 PAR002 PAR003 PAR004 PAR005 PAR006 PAR007 PAR008 PAR009 PAR010 PAR011
        BAT001 BAT002 BAT003 PIP001 PIP002 PIP003 V4001 V4002 V4003 V4004 V4005 V4006 V4007 V4008
        OVL001 OVL002 OVL003 OVL004 OVL005 MOE001 MOE002 MOE003 MOE004 MOE005 MOE006 MOE007
        MOE008 MOE009 MOE010 VEX001 VEX002 VEX003 VEX004 VEX005 GTP001 GTP002 GTP003 GTP004
        GTP005 GTP006 DOP001 DOP002 DOP003 CFG001 CFG002 CFG003 CFG004 CFG005 CFG006""".split()
    assert set(required) <= set(CODES)


# ----------------------------------------------------------------------------- hand-derived cases


def test_bundled_examples_have_no_errors_and_the_worked_example_no_findings():
    for path in sorted(EXAMPLES.glob("*.yaml")):
        errors = [f.line() for f in run_rules(load_config(path)) if f.severity == "error"]
        assert errors == [], path.name
    assert run_rules(load_config(EXAMPLES / "deepseek-v4-pro-1024.yaml")) == []


def test_minimal_v4_file_of_the_issue_tells_what_to_add():
    # 61 blocks do not split over PP 8; V4 attention with CP 2 needs a packing scheduler and the
    # contiguous partition; the 3 hash layers want a tid2eid source. DP/EDP fine. (No PIP004: V4
    # attention runs on Megatron's hybrid entry, where the layer pattern carries the split.)
    found = findings_for(copy.deepcopy(MINIMAL_V4))
    assert sorted(f.code for f in found) == ["PIP001", "V4002", "V4003", "V4006"]
    split = next(f for f in found if f.code == "PIP001")
    assert "61" in split.message and "8" in split.message


def test_worked_layout_with_pp_dp_order_is_rejected():
    # N/TP/CP/EP/ETP/PP = 1024/1/2/64/1/8 gives DP 1024/16 = 64 != EDP 1024/512 = 2.
    data = copy.deepcopy(MINIMAL_V4)
    data["parallel"]["order"] = "tp-cp-ep-pp-dp"
    order = [f for f in findings_for(data) if f.code == "PAR010"]
    assert len(order) == 1 and "DP 64 != EDP 2" in order[0].message


def test_small_pp_dp_example_of_the_reference():
    # 8 ranks, TP2 CP2 EP2 ETP1 PP2: DP = 8/(2·2·2) = 1, EDP = 8/(1·2·2) = 2.
    data = with_overlay({"parallel": {"tp": 2, "cp": 2, "ep": 2, "etp": 1, "pp": 2,
                                      "sequence_parallel": True, "order": "tp-cp-ep-pp-dp"},
                         "training": {"global_batch_size": 8}})
    order = [f for f in findings_for(data) if f.code == "PAR010"]
    assert len(order) == 1 and "DP 1 != EDP 2" in order[0].message
    data["parallel"]["order"] = "tp-cp-ep-dp-pp"
    assert codes_for(data) == []


def test_messages_name_the_actual_values():
    data = with_overlay({"model": {"num_experts": 384, "moe_router_topk": 6},
                         "parallel": {"world_size": 56, "ep": 7}})
    # 384 % 7 = 6; 56 % (1·7·2) = 0 so the expert grid is fine.
    found = {f.code: f for f in findings_for(data)}
    assert "num_experts 384" in found["PAR003"].message and "ep 7" in found["PAR003"].message
    assert "e.g. 4, 6, 8" in found["PAR003"].fix  # the divisors of 384 nearest to 7
    assert "PAR002" not in found


def test_fractional_grids_skip_dependent_rules_without_crashing():
    # 1000 ranks: DP = 1000/16 and EDP = 1000/1024 are fractions; batch, order, optimizer and
    # schedule rules that need them stay silent.
    data = copy.deepcopy(MINIMAL_V4)
    data["parallel"].update(world_size=1000, order="tp-cp-ep-pp-dp", vpp=2)
    data["training"].update(use_distributed_optimizer=True, num_distributed_optimizer_instances=2)
    found = set(codes_for(data))
    assert {"PAR001", "PAR002"} <= found
    assert not found & {"BAT002", "BAT003", "PAR009", "PAR010", "PAR011", "DOP001", "DOP002"}


def test_interleaved_schedule_microbatch_remainder():
    # PP 2, VPP 2, DP 4: global 20 → m = 5, 5 % 2 = 1 < PP → bubbles; global 24 → m = 6 is fine.
    data = with_overlay({"parallel": {"vpp": 2}, "training": {"global_batch_size": 20}})
    found = [f for f in findings_for(data) if f.code == "BAT003"]
    assert len(found) == 1 and "remainder 1 < pp 2" in found[0].message
    data["training"]["global_batch_size"] = 24
    assert "BAT003" not in codes_for(data)


def test_microbatch_count_uses_attention_dp_not_edp():
    # m = B / (b · DP) = 4096 / (1 · 64) = 64; a global batch of 4096 + 32 is not a multiple of 64.
    data = copy.deepcopy(MINIMAL_V4)
    data["training"]["global_batch_size"] = 4096 + 32
    found = [f for f in findings_for(data) if f.code == "BAT002"]
    assert len(found) == 1 and "1·64·1 = 64" in found[0].message and "4096 or 4160" in found[0].fix


def test_hash_layers_must_fit_the_first_layout_stage():
    # The V4-Pro example puts 6 decoders on the embedding stage; a layout with only 2 there
    # cannot hold the 3 hash layers.
    cfg = load_config(EXAMPLES / "deepseek-v4-pro-1024.yaml").model_dump(mode="json", exclude_none=True)
    cfg["parallel"]["pipeline_model_parallel_layout"] = "Et*2|t*9|(t*8|)*5t*10mL"
    found = [f for f in findings_for(cfg) if f.code == "PIP003"]
    assert len(found) == 1 and "holds 2 decoder layer(s)" in found[0].message


def test_suggested_layout_reproduces_the_planned_split():
    data = with_overlay({"model": {"num_layers": 6, "moe_n_hash_layers": 2, "mtp_num_layers": 1},
                         "parallel": {"decoder_first_pipeline_num_layers": 2},
                         "moe": {"moe_tid2eid_source": "checkpoint"}})
    finding = next(f for f in findings_for(data) if f.code == "PIP004")
    layout = re.search(r'layout: "([^"]+)"', finding.fix).group(1)
    assert layout == "Et*2|t*4mL"
    with_layout = merge(data, {"parallel": {"pipeline_model_parallel_layout": layout,
                                            "decoder_first_pipeline_num_layers": None}})
    assert codes_for(with_layout) == []
    before, after = stage_split(parse_config(data)), stage_split(parse_config(with_layout))
    assert [s.layers for s in before.stages] == [s.layers for s in after.stages]
    assert [s.mtp_layers for s in before.stages] == [s.mtp_layers for s in after.stages]


# ----------------------------------------------------------------------------- ignore


def test_ignore_silences_codes_case_insensitively():
    data = with_overlay({"parallel": {"tp": 2}})
    assert "PAR008" in codes_for(data)
    data["ignore"] = ["par008"]
    assert codes_for(data) == []


def test_unknown_code_in_ignore_is_a_warning_with_a_suggestion():
    data = with_overlay({"ignore": ["PAR0088", "MOE005"]})
    found = findings_for(data)
    assert [(f.code, f.severity, f.path) for f in found] == [("IGN001", "warning", "ignore.0")]
    assert "PAR0088" in found[0].message and "PAR008" in found[0].fix
    data["ignore"].append("IGN001")
    assert findings_for(data) == []


# ----------------------------------------------------------------------------- rules vs the grid

_DEGREES = st.sampled_from([1, 2, 4])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=st.sampled_from([4, 8, 16, 24, 32]), tp=_DEGREES, cp=_DEGREES, pp=_DEGREES,
       ep=_DEGREES, etp=_DEGREES, gtp=st.sampled_from([1, 2]), egtp=st.sampled_from([1, 2]),
       instances=st.sampled_from([1, 2, 3]),
       order=st.sampled_from(["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-pp-cp-ep-dp", "tp-cp-dp-pp"]))
def test_grid_builds_exactly_when_the_layout_rules_pass(world, tp, cp, pp, ep, etp, gtp, egtp,
                                                          instances, order):
    """No PAR/DOP/GTP layout error ⇔ the grid reports no problem building the groups."""
    data = with_overlay({
        "model": {"num_layers": 8},
        "parallel": {"world_size": world, "tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp,
                     "gtp": gtp, "egtp": egtp, "order": order, "sequence_parallel": tp > 1},
        "training": {"use_distributed_optimizer": True,
                     "num_distributed_optimizer_instances": instances},
    })
    cfg = parse_config(data)
    layout_codes = {"PAR001", "PAR002", "PAR009", "PAR010", "PAR011", "PAR013", "DOP001", "DOP002",
                    "GTP008"}
    rule_errors = {f.code for f in run_rules(cfg) if f.code in layout_codes}
    assert bool(rule_errors) == bool(layout_problems(grid_spec_from_config(cfg))), rule_errors


# ----------------------------------------------------------------------------- moeplan rules


def test_rules_lists_the_catalog():
    result = runner.invoke(app, ["rules"], terminal_width=200)
    assert result.exit_code == 0
    for entry in CATALOG:
        assert entry.code in result.output


def test_tp_without_sp_is_refused_only_with_moe_layers():
    """MoELayer.forward raises on TP > 1 without SP in training; a dense model's layers do not."""
    moe = with_overlay({"parallel": {"tp": 2, "sequence_parallel": False}})
    dense = with_overlay({"parallel": {"tp": 2, "sequence_parallel": False},
                          "model": {"moe_layer_freq": [0] * moe["model"].get("num_layers", 0)}})
    assert "PAR008" in codes_for(moe) and "PAR008" not in codes_for(dense)


def test_rules_json_lists_every_field():
    result = runner.invoke(app, ["rules", "--json"])
    listed = json.loads(result.stdout)
    assert [r["code"] for r in listed] == list(CODES)
    assert set(listed[0]) >= {"code", "severity", "title", "source", "why", "bad", "good"}


def test_rules_explains_one_rule():
    result = runner.invoke(app, ["rules", "par008"], terminal_width=200)
    entry = find_rule("PAR008")
    assert result.exit_code == 0
    for text in (entry.code, entry.title, entry.source, "Why", "Bad", "Good", "sequence_parallel: true"):
        assert text in result.output
    one = json.loads(runner.invoke(app, ["rules", "PAR008", "--json"]).stdout)
    assert one == entry.as_dict()


def test_rules_unknown_code_is_a_usage_error_with_suggestions():
    result = runner.invoke(app, ["rules", "PAR01"])
    assert result.exit_code == 2
    assert "did you mean PAR010" in result.output
    odd = runner.invoke(app, ["rules", "[/x]"])  # rich markup in user input must not crash
    assert odd.exit_code == 2 and "unknown rule code" in odd.output


def test_rules_base_prints_the_config_examples_extend():
    result = runner.invoke(app, ["rules", "--base"])
    assert result.exit_code == 0 and yaml.safe_load(result.stdout) == base()

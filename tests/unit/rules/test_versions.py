"""megatron.version and the version-dependent rules (VER001-VER003, ARG006's start): each known-bad
record warns inside its range, naming the fixing change, and is silent at the fixed release and at
dev; the ranges and the release table are the ones read off github.com/NVIDIA/Megatron-LM's tags."""

from __future__ import annotations

from typing import Any

import pytest

from planner.config.loader import parse_config
from planner.config.megatron_releases import RELEASES, release, resolve_version
from planner.rules import run_rules
from planner.rules.example_base import example_config_data, merge
from planner.rules.versions import RECORDS


def _findings(overlay: dict[str, Any], version: str | None) -> list:
    data = merge(example_config_data(""), overlay)
    if version is not None:
        data["megatron"] = {"version": version}
    return run_rules(parse_config(data))


def _codes(overlay: dict[str, Any], version: str | None) -> list[tuple[str, str]]:
    return [(f.code, f.message.split("[")[-1].split("]")[0] if f.code == "VER002" else f.path)
            for f in _findings(overlay, version) if f.code.startswith(("VER", "ARG006"))]


MTP_CP = {"model": {"mtp_num_layers": 1}, "parallel": {"world_size": 16, "cp": 2}}


@pytest.mark.parametrize(("text", "name"), [
    ("core_r0.14.0", "core_r0.14.0"), ("core_v0.14.0", "core_r0.14.0"), ("0.16.0", "core_r0.16.0"),
    ("megatron-core==0.18.2", "core_v0.18.2"), ("25.09", "25.09-alpha"), ("nemo:25.09", "25.09-alpha"),
    ("nvcr.io/nvidia/nemo:26.04", "26.04-alpha"), ("DEV", "dev"), ("d48bd6be", "dev"),
    ("5be9626709af2722333bf54797c954c09edeada3", "core_r0.19.0"),
])
def test_spellings_resolve(text, name):
    assert resolve_version(text).name == name


@pytest.mark.parametrize("text", ["nemo:25.07", "core_r0.99.0", "deadbeef", "latest", "d4"])
def test_unplaceable_versions_are_none(text):
    assert resolve_version(text) is None


def test_release_table_is_in_date_order_with_dev_the_oracle():
    dates = [r.date for r in RELEASES]
    assert dates == sorted(dates)
    assert release("dev").commit.startswith("d48bd6be") and release("main").commit.startswith("d98e8a64")
    assert len({r.commit for r in RELEASES}) == len(RELEASES)


def test_every_record_range_is_well_formed():
    for record in RECORDS:
        assert record.introduced is None or release(record.introduced)
        assert record.fixed is None or release(record.fixed)
        if record.introduced and record.fixed:
            assert release(record.introduced).before(record.fixed), record.key
        assert ("#" in record.fix or "!" in record.fix) and record.way_out, record.key


def test_unknown_version_is_an_error_not_silently_dev():
    found = _findings({}, "nemo:25.07")
    [ver] = [f for f in found if f.code == "VER001"]
    assert ver.severity == "error" and "'nemo:25.07'" in ver.message and "25.09" in ver.fix


# Hand-checked on the tagged sources: (record, config, a version inside the range, the fixing release).
CASES = [
    ("mtp-per-token-loss", {"model": {"mtp_num_layers": 1},
                            "training": {"calculate_per_token_loss": True}}, "core_v0.16.1", "core_r0.17.0"),
    ("mtp-cp-nan", MTP_CP, "core_r0.16.0", "core_r0.17.0"),
    ("aux-loss-tp-cp-scale", {"parallel": {"tp": 2, "sequence_parallel": True},
                              "training": {"calculate_per_token_loss": True},
                              "moe": {"moe_aux_loss_coeff": 0.01}}, "26.04-alpha", "core_r0.19.0"),
    ("aux-loss-cp-scale", {"parallel": {"world_size": 16, "cp": 2},
                           "moe": {"moe_aux_loss_coeff": 0.01}}, "core_v0.15.3", "core_r0.16.0"),
    ("mtp-recompute-thd", {"model": {"mtp_num_layers": 1},
                           "training": {"qkv_format": "thd"},
                           "overlap": {"recompute_granularity": "full", "recompute_method": "uniform",
                                       "recompute_num_layers": 1}}, "core_v0.17.1", "core_r0.18.0"),
    ("uniform-recompute-remainder", {"parallel": {"pp": 1, "world_size": 4},
                                     "overlap": {"recompute_granularity": "full",
                                                 "recompute_method": "uniform",
                                                 "recompute_num_layers": 3}}, "core_r0.14.0", "core_r0.17.0"),
    ("te-cross-entropy", {"training": {"cross_entropy_loss_fusion": True,
                                       "cross_entropy_fusion_impl": "te"}}, "core_r0.18.0", "core_v0.18.2"),
]


@pytest.mark.parametrize(("key", "overlay", "bad", "fixed"), CASES, ids=[c[0] for c in CASES])
def test_a_config_in_the_bad_range_warns_naming_the_fix(key, overlay, bad, fixed):
    record = next(r for r in RECORDS if r.key == key)
    hits = [f for f in _findings(overlay, bad) if f.code == "VER002" and f"[{key}]" in f.message]
    assert len(hits) == 1 and hits[0].severity == "warning"
    assert record.fix.split(" (")[0] in hits[0].message and f"fixed from {fixed}" in hits[0].message
    for later in (fixed, "dev", None):  # the fixing release, dev, and no version at all (dev)
        assert ("VER002", key) not in _codes(overlay, later), later


def test_te_cross_entropy_runs_before_the_guard_and_is_refused_after():
    overlay = {"training": {"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"}}
    assert _codes(overlay, "core_r0.18.0") == [("VER002", "te-cross-entropy")]
    assert _codes(overlay, "core_v0.18.2") == [("ARG006", "training.cross_entropy_fusion_impl")]
    assert _codes(overlay, None) == [("ARG006", "training.cross_entropy_fusion_impl")]


def test_mtp_with_cp_is_refused_before_25_09():
    assert ("VER003", "parallel.cp") in _codes(MTP_CP, "core_v0.13.1")
    assert ("VER003", "parallel.cp") in _codes(MTP_CP, "25.04-alpha")
    assert not [c for c in _codes(MTP_CP, "core_r0.14.0") if c[0] == "VER003"]


def test_hybridep_past_the_queue_depth_warns_at_every_version():
    # 2 nodes of 8: EP 16 leaves the NVLink domain; 8192 x 4 tokens per rank -> depth 98,305.
    overlay = {"parallel": {"world_size": 16, "pp": 1, "ep": 16},
               "model": {"num_experts": 16},
               "training": {"seq_length": 8192, "micro_batch_size": 4, "global_batch_size": 64},
               "moe": {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}}
    for version in ("core_r0.16.0", "dev", "main"):
        [hit] = [f for f in _findings(overlay, version) if "[hybridep-qp-depth]" in f.message]
        assert "depth 98305 > 65535" in hit.message and "DeepEP PR #638" in hit.message
    assert not [f for f in _findings(overlay, "core_v0.15.3") if "[hybridep-qp-depth]" in f.message]
    small = merge(overlay, {"training": {"seq_length": 4096, "micro_batch_size": 1}})
    assert not [f for f in _findings(small, "dev") if "[hybridep-qp-depth]" in f.message]


def test_a_named_version_without_a_branch_feature_refuses_it():
    gtp = {"parallel": {"world_size": 16, "tp": 2, "gtp": 2, "sequence_parallel": True}}
    assert ("VER003", "parallel.gtp") in _codes(gtp, "core_v0.18.2")
    assert ("VER003", "parallel.gtp") in _codes(gtp, "dev")  # written: dev has no GTP
    assert ("VER003", "parallel.gtp") not in _codes(gtp, "core_r0.19.0")
    assert ("VER003", "parallel.gtp") not in _codes(gtp, None)  # unset: moeplan picks main (MOE003)
    hash_routing = {"model": {"moe_n_hash_layers": 1}}
    assert ("VER003", "model.moe_n_hash_layers") in _codes(hash_routing, "main")


def test_a_pinned_main_commit_holds_the_fixes_its_ancestry_holds():
    """Primus's Megatron-LM d3528a21 (main, 2026-03-06): its ancestors hold PR #3159 (a22c40e8) and
    #3396 (d7500d4d), which core_v0.16.1 (later by date) lacks, and #2237 (f6e0d425); they lack
    #3562, #4593, #5047 and #5115 (git merge-base --is-ancestor on github.com/NVIDIA/Megatron-LM)."""
    carried = {r.key for r in RECORDS if r.carried_by("main@d3528a21")}
    assert carried == {"te-cross-entropy", "aux-loss-tp-cp-scale", "mtp-recompute-thd",
                       "uniform-recompute-remainder", "hybridep-qp-depth"}
    assert {r.key for r in RECORDS if r.carried_by("core_v0.16.1")} == carried | {"mtp-per-token-loss",
                                                                                  "mtp-cp-nan"}
    assert resolve_version("d3528a21301db2d12e92912b3ec025dc8a2ed4d6").name == "main@d3528a21"
    codes = _codes({"model": {"mtp_num_layers": 1}, "training": {"calculate_per_token_loss": True}},
                   "d3528a21")
    assert ("VER002", "mtp-per-token-loss") not in codes


def test_an_unplaced_commit_is_one_finding_naming_how_to_place_it():
    """A commit the table does not hold: one VER001, whose fix names the git commands that place it."""
    [finding] = [f for f in _findings({}, "0123abcd") if f.code == "VER001"]
    assert "git describe --tags 0123abcd" in finding.fix and "git tag --contains 0123abcd" in finding.fix

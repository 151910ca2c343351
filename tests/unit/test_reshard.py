"""Reshard plans between layouts, derived by hand on a 4-rank toy (E=8, I=32, h=64, fp32)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.config.loader import parse_config
from planner.reshard import model_differences, reshard_plan

# Per intermediate unit: W1 and W3 columns + a W2 row = 3·h params, each 4 B (fp32) + 12 B Adam.
UNIT = 3 * 64 * (4 + 12)


def toy(**parallel):
    return parse_config({
        "model": {"num_layers": 1, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128,
                  "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 32},
        "parallel": {"world_size": 4, **parallel},
        "training": {"seq_length": 16, "precision": "fp32", "global_batch_size": 4},
    })


def by_rank(plan):
    return {row["rank"]: row for row in plan["ranks"]}


def test_ep4_to_ep2_moves_half_of_each_rank():
    rows = by_rank(reshard_plan(toy(ep=4), toy(ep=2)))
    assert rows[0]["expert_ids"] == [0, 1, 2, 3]
    assert rows[0]["local_bytes"] == 2 * 32 * UNIT and rows[0]["sources"] == {"1": 2 * 32 * UNIT}
    assert rows[1]["expert_ids"] == [4, 5, 6, 7] and rows[1]["local_bytes"] == 0
    assert rows[1]["sources"] == {"2": 2 * 32 * UNIT, "3": 2 * 32 * UNIT}
    assert rows[3]["sources"] == {"2": 2 * 32 * UNIT} and rows[3]["local_bytes"] == 2 * 32 * UNIT


def test_ep2_etp2_to_ep4_reads_the_other_matrix_half():
    rows = by_rank(reshard_plan(toy(ep=2, etp=2), toy(ep=4)))
    assert rows[0]["intermediate_range"] == [0, 32]
    assert rows[0]["local_bytes"] == 2 * 16 * UNIT
    assert rows[0]["sources"] == {"1": 2 * 16 * UNIT}


def test_same_layout_reads_nothing():
    plan = reshard_plan(toy(ep=2), toy(ep=2))
    assert plan["total_read_bytes"] == 0
    assert plan["total_local_bytes"] == 4 * 4 * 32 * UNIT


@pytest.mark.parametrize("field,value", [("num_experts", 16), ("hidden_size", 32)])
def test_different_model_is_a_finding(field, value):
    old = toy(ep=2)
    new = old.model_copy(update={"model": old.model.model_copy(update={field: value})})
    findings = model_differences(old, new)
    assert [f.code for f in findings] == ["RSH001"] and findings[0].path == f"model.{field}"


def test_cli_exit_codes(tmp_path):
    base = toy(ep=4).model_dump(mode="json")
    other = json.loads(json.dumps(base))
    other["parallel"]["ep"] = 2
    changed = json.loads(json.dumps(base))
    changed["model"]["num_experts"] = 16
    paths = {}
    for name, cfg in (("old", base), ("new", other), ("changed", changed)):
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(json.dumps(cfg))
    moeplan = [sys.executable, "-m", "planner.cli", "reshard-plan"]
    ok = subprocess.run(moeplan + [str(paths["old"]), str(paths["new"]), "--json"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["total_read_bytes"] == (2 + 4 + 4 + 2) * 32 * UNIT
    bad = subprocess.run(moeplan + [str(paths["old"]), str(paths["changed"])], capture_output=True, text=True)
    assert bad.returncode == 1 and "RSH001" in bad.stderr and "Traceback" not in bad.stderr


def _per_replica_reads(old, new):
    """The plan by brute force: every (layer, expert) of every new rank against every old replica,
    own shard first, then the lowest rank (the rule reshard_plan states), as rank -> sources."""
    from planner.layout.grid import Grid
    from planner.layout.spec import grid_spec_from_config

    old_grid, new_grid = Grid(grid_spec_from_config(old)), Grid(grid_spec_from_config(new))
    inter = new.model.moe_ffn_hidden_size
    held = [old_grid.expert_ownership(r) for r in range(old.parallel.world_size)]
    out = {}
    for rank in range(new.parallel.world_size):
        own, sources = new_grid.expert_ownership(rank), {}
        width = inter // own.etp_size
        start, stop = own.etp_rank * width, (own.etp_rank + 1) * width
        for layer, ids in own.experts_by_layer.items():
            for expert in ids:
                taken = set()
                for h in sorted(held, key=lambda h: (h.rank != rank, h.rank)):
                    if expert not in h.experts_by_layer.get(layer, ()) or h.etp_rank in taken:
                        continue
                    w = inter // h.etp_size
                    lo, hi = max(h.etp_rank * w, start), min((h.etp_rank + 1) * w, stop)
                    if lo < hi:
                        taken.add(h.etp_rank)
                        sources[h.rank] = sources.get(h.rank, 0) + (hi - lo) * 3 * 64 * (4 + 12)
        out[rank] = {str(src): amount for src, amount in sorted(sources.items())}
    return out


def toy16(layer_freq, **parallel):
    return parse_config({
        "model": {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128,
                  "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 32,
                  "moe_layer_freq": layer_freq},
        "parallel": {"world_size": 16, **parallel},
        "training": {"seq_length": 16, "precision": "fp32", "global_batch_size": 16},
    })


@pytest.mark.parametrize("old,new", [
    ({"ep": 4, "etp": 2, "pp": 2}, {"ep": 2, "etp": 1, "pp": 4}),
    ({"ep": 2, "pp": 4}, {"ep": 8, "etp": 2}),
    ({"ep": 1, "etp": 4}, {"ep": 4, "etp": 2, "pp": 2}),
])
def test_replicas_are_read_once_like_the_per_replica_walk(old, new):
    """The plan indexes one holder per shard and counts a stage's layers together (linear in
    ranks); the result is the per-replica walk's, with the rank's own copy preferred."""
    freq = [0, 1, 1, 1]
    a, b = toy16(freq, **old), toy16(freq, **new)
    own = {row["rank"]: row for row in reshard_plan(a, b)["ranks"]}
    brute = _per_replica_reads(a, b)
    for rank, row in own.items():
        assert {**row["sources"], **({str(rank): row["local_bytes"]} if row["local_bytes"] else {})} \
            == brute[rank]

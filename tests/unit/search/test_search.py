"""`moeplan search`: every candidate is a config the rule catalog and the memory budget accept,
timed by the same estimate as `moeplan estimate`; the emitted winner passes `moeplan check`; the
user's layout is always a candidate, so the winner is never slower."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from planner.accounting import memory_alike, stage_memory, variant_of
from planner.config.loader import load_config
from planner.config.schema import Config
from planner.estimate import estimate
from planner.findings import has_errors
from planner.layout.pipeline import stage_split
from planner.rules import run_rules
from planner.rules.catalog import CODES
from planner.search.bound import SAME_MEMORY, Work, _grid, cell, family_floor, floor_dispatcher
from planner.search.judge import Judge, float_estimate
from planner.search.knobs import Knobs, Recompute, vpp_of
from planner.search.run import SearchResult, search
from planner.search.space import (
    FULL_RECOMPUTE,
    MBS_CHOICES,
    NO_RECOMPUTE,
    LayerCosts,
    balanced_layout,
    cost_balanced_choices,
    cost_balanced_layout,
    dispatchers,
    dominates,
    layer_costs,
    pipeline_choices,
    recompute_presets,
    recomputed,
)
from tests.support.paths import EXAMPLES


def moeplan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "",
                                                       "COLUMNS": "200"})


def tiny(**model: Any) -> Config:
    data = yaml.safe_load((EXAMPLES / "tiny-cpu-8.yaml").read_text())
    data["model"].update(model)
    return Config.model_validate(data)


@pytest.fixture(scope="module", params=["deepseek-v4-pro-1024", "deepseek-v3-1024"])
def searched(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[str, dict[str, Any], Path]:
    """One `search --json --emit` run per bundled example (the slow part, shared by the tests)."""
    name = request.param
    out = tmp_path_factory.mktemp("search") / f"{name}-winner.yaml"
    done = moeplan("search", str(EXAMPLES / f"{name}.yaml"), "--json", "--top", "5",
                   "--emit", str(out))  # the whole space, as users run it
    assert done.returncode == 0, done.stderr
    return name, json.loads(done.stdout), out


def test_emitted_winner_passes_check_and_keeps_model_cluster_batch(searched) -> None:
    name, data, out = searched
    checked = moeplan("check", str(out))
    assert checked.returncode == 0, checked.stderr
    user, winner = load_config(EXAMPLES / f"{name}.yaml"), load_config(out)
    assert winner.model == user.model and winner.cluster == user.cluster
    assert (winner.training.seq_length, winner.global_batch_size, winner.parallel.world_size) == \
        (user.training.seq_length, user.global_batch_size, user.parallel.world_size)
    best = data["candidates"][0]
    assert {k: getattr(winner.parallel, k) for k in ("tp", "cp", "pp", "ep", "etp")} == \
        {k: best["parallel"][k] for k in ("tp", "cp", "pp", "ep", "etp")}
    assert winner.parallel.pipeline_model_parallel_layout == \
        best["parallel"]["pipeline_model_parallel_layout"]
    # The emitted file is timed as the search timed it: same pipeline, same estimate.
    assert estimate(winner).step_time_s == pytest.approx(best["step_time_s"], rel=1e-9)


def test_winner_is_never_slower_than_the_users_layout(searched) -> None:
    name, data, _ = searched
    user_time = estimate(load_config(EXAMPLES / f"{name}.yaml")).step_time_s
    assert data["user"]["is_user_layout"] and data["user"]["step_time_s"] == pytest.approx(user_time)
    assert data["candidates"][0]["step_time_s"] <= user_time
    times = [c["step_time_s"] for c in data["candidates"]]
    assert times == sorted(times)


def test_json_keys_and_counts(searched) -> None:
    _, data, _ = searched
    assert {"candidates", "explored", "legal", "fitting"} <= data.keys()
    assert data["explored"] >= data["legal"] >= data["fitting"] >= len(data["candidates"]) > 0
    assert len(data["candidates"]) <= 5
    for cand in data["candidates"]:
        assert {"parallel", "step_time_s", "peak_memory_bytes", "tflops_per_gpu",
                "tokens_per_s_per_gpu", "stage_peak_memory_bytes"} <= cand.keys()
        assert cand["peak_memory_bytes"] == max(cand["stage_peak_memory_bytes"])
        assert {"tp", "cp", "pp", "vpp", "ep", "etp"} <= cand["parallel"].keys()


def test_ruled_out_reasons_name_rule_codes_or_memory(searched) -> None:
    _, data, _ = searched
    winner = data["candidates"][0]["step_time_s"]
    for r in data["ruled_out"]:
        assert r["step_time_s"] < winner and r["difference"]
        if r["codes"] == ["MEM001"]:
            assert re.match(r"does not fit: stage \d+ needs an estimated [\d.]+ [KMGT]iB", r["reason"])
        elif r["codes"] == ["HEADROOM"]:
            assert re.match(r"does not fit the \d+% memory headroom: stage \d+ needs an estimated "
                            r"[\d.]+ [KMGT]iB", r["reason"])
        else:
            assert r["reason"] == "rule " + ", ".join(r["codes"])
            assert set(r["codes"]) <= set(CODES)


def test_memory_rejection_says_which_stage_needs_how_much() -> None:
    """A layout over the GPU's memory is refused by MEM001 with the stage and the bytes."""
    cfg = tiny()
    small = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(
        update={"gpu_memory_gib": 0.001})})
    out = Judge(small).judge(None)
    assert out.codes == ("MEM001",)
    assert re.fullmatch(r"does not fit: stage 0 needs an estimated [\d.]+ GiB per rank, "
                        r"[\d.]+ % of 1.02 MiB \(MEM001\)", out.reason), out.reason
    # Read off the figures MEM001 compares, it says what MEM001's own message opens with.
    message = next(f.message for f in run_rules(small) if f.code == "MEM001")
    assert out.reason == f"does not fit: {message.split(' (', 1)[0]} (MEM001)"


def test_illegal_layouts_never_appear_and_the_users_layout_is_a_candidate() -> None:
    """6 experts on 8 ranks: EP 4 and 8 tile the world but do not split the experts (PAR003), so
    only EP 1 and 2 may appear; every candidate passes the whole rule catalog."""
    cfg = tiny(num_experts=6)
    assert not has_errors(run_rules(cfg))
    result = search(cfg, top=10**6, workers=2, refine=6)
    assert result.fitting == len(result.candidates) > 1
    assert {c.cfg.parallel.ep for c in result.candidates} <= {1, 2}
    assert all(not has_errors(run_rules(c.cfg)) for c in result.candidates)
    users = [c for c in result.candidates if c.is_user]
    assert len(users) == 1 and users[0].step_time_s == pytest.approx(estimate(cfg).step_time_s)
    assert result.candidates[0].step_time_s <= users[0].step_time_s
    # Two worker processes or one: the same candidates in the same order.
    alone = search(cfg, top=10**6, workers=1, refine=6)
    assert [(c.step_time_s, Knobs.of(c.cfg)) for c in alone.candidates] == \
        [(c.step_time_s, Knobs.of(c.cfg)) for c in result.candidates]
    assert (alone.explored, alone.legal, alone.fitting) == \
        (result.explored, result.legal, result.fitting)


def test_balanced_layouts_by_hand() -> None:
    """Embedding, loss and each MTP layer count as one layer; earlier chunks take the remainder.
    DeepSeek-V3 (61 + MTP = 64 slots): PP8·VPP4 → 32 chunks of 2 = the published layout;
    PP16 → 16 chunks of 4: E+3, 14×4, 2+m+L. 48 layers, PP4 → 50 slots = 13, 13, 12, 12."""
    assert balanced_layout(61, 1, 8, 4) == "Et|(tt|)*30mL"
    assert balanced_layout(61, 1, 16, 1) == "Et*3|(t*4|)*14ttmL"
    assert balanced_layout(48, 0, 4, 1) == "Et*12|t*13|t*12|t*11L"
    assert balanced_layout(2, 0, 4, 1) == "E|(t|)*2L"  # embedding and loss stages of their own
    assert balanced_layout(1, 0, 4, 1) is None  # 3 slots cannot fill 4 chunks


@pytest.mark.parametrize("layers,mtp", [(61, 1), (48, 0), (27, 2), (94, 0)])
def test_balanced_layouts_split_as_megatron_reads_them(layers: int, mtp: int) -> None:
    base = load_config(EXAMPLES / "deepseek-v3-1024.yaml")
    for pp in (2, 4, 8, 16):
        for vpp in (1, 2, 4):
            layout = balanced_layout(layers, mtp, pp, vpp)
            if layout is None:
                continue
            model = base.model.model_copy(update={"num_layers": layers, "mtp_num_layers": mtp})
            par = base.parallel.model_copy(update={"pp": pp, "pipeline_model_parallel_layout": layout})
            split = stage_split(base.model_copy(update={"model": model, "parallel": par}))
            sizes = [len(c.layers) + len(c.mtp_layers) + c.embedding + c.loss for c in split.chunks]
            assert split.vpp == vpp and max(sizes) - min(sizes) <= 1, (layout, sizes)


def test_exit_codes(tmp_path: Path) -> None:
    missing = moeplan("search", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    bad = moeplan("search", str(EXAMPLES / "invalid" / "par003-experts-not-divisible-by-ep.yaml"))
    assert bad.returncode == 1 and "PAR003" in bad.stderr and "Traceback" not in bad.stderr
    data = yaml.safe_load((EXAMPLES / "tiny-cpu-8.yaml").read_text())
    bad_schema = copy.deepcopy(data)
    bad_schema["parallel"]["tp"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad_schema))
    assert moeplan("search", str(path), "--json").returncode == 1
    unwritable = moeplan("search", str(EXAMPLES / "tiny-cpu-8.yaml"), "--top", "1",
                         "--emit", str(tmp_path / "no-such-dir" / "x.yaml"))
    assert unwritable.returncode == 2 and "cannot write" in unwritable.stderr
    assert "Traceback" not in unwritable.stderr


def test_human_output_lists_the_top_k_and_writes_the_winner(tmp_path: Path) -> None:
    out = tmp_path / "winner.yaml"
    done = moeplan("search", str(EXAMPLES / "tiny-cpu-8.yaml"), "--top", "2", "--emit", str(out))
    assert done.returncode == 0, done.stderr
    assert "fastest fitting layouts" in done.stdout and "wrote the winner" in done.stdout
    rows = [line for line in done.stdout.splitlines() if re.match(r"│ [12]\b", line)]
    assert len(rows) == 2
    assert moeplan("check", str(out)).returncode == 0
    assert out.read_text().startswith("# moeplan search winner for tiny-cpu-8.yaml")


def test_a_layout_that_does_not_fit_is_searched_not_refused(tmp_path: Path) -> None:
    """With 1.1 GiB per GPU the tiny example's own layout needs a device total of ~1.3 GiB
    (MEM001: its NCCL rings and the CUDA context), yet layouts of the same model, cluster and
    batch in fewer communicators fit inside the default margin: search finds them, exit 0, user
    null."""
    data = yaml.safe_load((EXAMPLES / "tiny-cpu-8.yaml").read_text())
    data["cluster"]["gpu_memory_gib"] = 1.1
    path = tmp_path / "tight.yaml"
    path.write_text(yaml.safe_dump(data))
    assert [f.code for f in run_rules(load_config(path)) if f.severity == "error"] == ["MEM001"]
    done = moeplan("search", str(path), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["user"] is None and result["candidates"]
    assert result["memory_headroom"] == 0.92
    assert all(c["device_memory_bytes"] <= 0.92 * 1.1 * (1 << 30) for c in result["candidates"])


# ----------------------------------------------------------------------------- cost balance
def test_cost_balanced_layout_by_hand() -> None:
    """10 layers of cost 1, a free embedding, a tail (MTP + loss) of cost 3, PP4: the busiest
    chunk costs at least 4 (13 over 4 chunks, in whole layers); among layouts reaching 4 the most
    even are 3, 3, 3, 1 + tail and 4, 3, 3, 0 + tail (sum of squares 43, against 45 for 4, 3, 2,
    1 + tail), and of those the one with the lighter first stage wins."""
    costs = LayerCosts(0.0, (1.0,) * 10, 3.0)
    assert cost_balanced_layout(costs, 1, 4, 1) == "Et*3|(t*3|)*2tmL"
    # A heavy embedding moves layers off the first chunk; VPP 2 makes 8 chunks of 10 layers.
    assert cost_balanced_layout(LayerCosts(2.0, (1.0,) * 10, 0.0), 0, 2, 1) == "Et*4|t*6L"
    assert cost_balanced_layout(costs, 1, 4, 2) is not None
    assert cost_balanced_layout(costs, 1, 8, 2) is None  # 16 chunks, 14 need a layer: only 10


def test_layer_costs_read_off_the_stage_rows() -> None:
    """DeepSeek-V3 (layers 0-2 dense, the rest MoE) at PP4 `Et*15|t*16|t*16|t*14mL` with stage
    work (step − bubble) 27, 32, 32, 35 s: the pure-MoE stages give 2 s per MoE layer; stage 0's
    three dense layers share what its 12 MoE layers leave, (27 − 24) / 3 = 1 s each, so nothing
    is left for the embedding; the tail is 35 − 14·2 = 7 s."""
    base = load_config(EXAMPLES / "deepseek-v3-1024.yaml")
    cfg = base.model_copy(update={"parallel": base.parallel.model_copy(update={
        "pp": 4, "pipeline_model_parallel_layout": "Et*15|t*16|t*16|t*14mL"})})
    rows = [{"step_s": w + 0.5, "bubble_s": 0.5} for w in (27.0, 32.0, 32.0, 35.0)]
    costs = layer_costs(cfg, rows)
    assert costs == LayerCosts(0.0, (1.0,) * 3 + (2.0,) * 58, 7.0)
    # 3 + 58·2 + 7 = 126 s over 4 stages: at least 31.5, and 31 is infeasible (at most 3 + 14
    # layers first, 15 in each middle stage, leaving 14 layers + tail = 35 s), so 32: the only way
    # is 3 dense + 14 MoE first (31 s), 16 and 16 MoE (32 s each), 12 MoE + tail (31 s).
    layout = cost_balanced_layout(costs, 1, 4, 1)
    assert layout == "Et*17|(t*16|)*2t*12mL", layout


def test_search_balances_the_winners_stages_by_cost(searched) -> None:
    """The winner's pipeline is at least as even as the slot-balanced layout of its own family and
    knobs, its virtual chunks included (a model chunk has a fixed cost per microbatch of its own;
    the last stage carries MTP and the output layer besides its decoder layers)."""
    name, data, out = searched
    winner = load_config(out)
    vpp = vpp_of(winner)
    slots = balanced_layout(winner.model.num_layers, winner.model.mtp_num_layers,
                            winner.parallel.pp, vpp)
    if winner.parallel.pp == 1 or slots is None:
        pytest.skip("no pipeline to balance")
    slot_cfg = winner.model_copy(update={"parallel": winner.parallel.model_copy(update={
        "pipeline_model_parallel_layout": slots, "vpp": None})})
    slot_stages = [row["step_s"] for row in estimate(slot_cfg).stages]
    best = data["candidates"][0]["stage_step_time_s"]
    assert max(best) <= max(slot_stages) * (1 + 1e-9), (name, best, slot_stages)


# ----------------------------------------------------------------------------- exact pruning
def test_the_pruning_assumptions_hold_on_the_examples() -> None:
    """Search skips a recompute preset when one recomputing a subset of its modules fits (more
    recompute: never faster, never more memory), a preset at larger micro-batches once it does
    not fit (activations grow with the micro-batch) and, in phase 1, smaller EPs once an EP does
    not fit (more experts per rank). Checked here on DeepSeek-V3's own layout."""
    cfg = load_config(EXAMPLES / "deepseek-v3-1024.yaml")
    presets = recompute_presets(cfg)
    knobs = Knobs.of(cfg)
    peaks_by_mbs = []
    for mbs in (1, 2):
        figures = []
        for preset in presets:
            est = estimate(replace(knobs, micro_batch_size=mbs, recompute=preset).apply(cfg))
            figures.append((recomputed(preset), est.step_time_s,
                            max(int(env["peak_memory_bytes"]) for env in est.envs)))
        for small, t_small, m_small in figures:
            for large, t_large, m_large in figures:
                if dominates(small, large):
                    assert t_large >= t_small * (1 - 1e-12) and m_large <= m_small, (small, large)
        peaks_by_mbs.append([peak for _, _, peak in figures])
    assert all(one <= two for one, two in zip(*peaks_by_mbs, strict=True))
    peaks = [max(int(env["peak_memory_bytes"]) for env in estimate(replace(
        knobs, micro_batch_size=mbs, recompute=FULL_RECOMPUTE).apply(cfg)).envs) for mbs in (1, 2, 4)]
    assert peaks == sorted(peaks)
    # Phase 1's EP cut-off: with everything else fixed, a smaller EP never needs less memory.
    by_ep = [max(int(env["peak_memory_bytes"]) for env in estimate(replace(
        knobs, ep=ep, recompute=FULL_RECOMPUTE).apply(cfg)).envs) for ep in (64, 32, 16, 8)]
    assert by_ep == sorted(by_ep)


def test_full_recompute_settings_are_keyed_by_method_and_layer_count() -> None:
    """Full recompute covers every selective set, but two full settings are not compared: uniform
    12 neither recomputes more nor less than uniform 1 (nor uniform 21, nor block 1), so a fitting
    full uniform 1 never prunes them. (The key once held the digits of the layer count: 12 and 21
    shared one, and 12 "recomputed more" than 1.)"""
    full = {n: recomputed(Recompute.full("uniform", n)) for n in (1, 2, 12, 21)}
    assert len(set(full.values())) == 4
    for lesser in full.values():
        assert not any(dominates(lesser, greater) for greater in full.values() if greater != lesser)
    assert recomputed(Recompute.full("block", 1)) != full[1]
    selective = recomputed(Recompute.selective("core_attn", "moe_act"))
    assert all(dominates(selective, f) and not dominates(f, selective) for f in full.values())
    # The user's own full setting is a preset of its own, after the built-in full uniform 1.
    cfg = tiny(num_layers=12)
    cfg = cfg.model_copy(update={"overlap": cfg.overlap.model_copy(update={
        "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 12})})
    assert [p.label for p in recompute_presets(cfg)][-2:] == ["full uniform 1", "full uniform 12"]


def test_ruled_out_lists_each_verdict_once(searched) -> None:
    _, data, _ = searched
    verdicts = [tuple(c for c in r["codes"] if c not in ("MEM001", "HEADROOM")) or tuple(r["codes"])
                for r in data["ruled_out"]]
    assert len(verdicts) == len(set(verdicts))


# ----------------------------------------------------------------------------- headroom
def test_memory_headroom_keeps_every_candidate_under_it(tmp_path: Path) -> None:
    """--memory-headroom 0.5: every listed candidate's device total (busiest stage and EP rank)
    uses at most half the GPU."""
    done = moeplan("search", str(EXAMPLES / "tiny-cpu-8.yaml"), "--json", "--top", "50",
                   "--memory-headroom", "0.5", "--refine", "6")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    gpu = load_config(EXAMPLES / "tiny-cpu-8.yaml").cluster.gpu_memory_gib * (1 << 30)
    assert data["memory_headroom"] == 0.5 and data["candidates"]
    assert all(c["device_memory_bytes"] <= 0.5 * gpu for c in data["candidates"])
    assert all(c["device_memory_free_share"] >= 0.5 for c in data["candidates"])
    for bad in ("0", "1.5"):
        refused = moeplan("search", str(EXAMPLES / "tiny-cpu-8.yaml"), "--memory-headroom", bad)
        assert refused.returncode == 2 and "--memory-headroom" in refused.stderr


@pytest.fixture(scope="module")
def six_experts_unbounded() -> tuple[Config, SearchResult]:
    """Six experts on the tiny example (EP 1 and 2 only, a small space), every family refined and
    no top-K bound (top=10**6 never prunes: fewer than 10**6 known): the reference result the
    refine and bound tests compare against, searched once."""
    cfg = tiny(num_experts=6)
    return cfg, search(cfg, top=10**6, refine=0, workers=1)


def test_refine_limits_the_families_searched_in_full_and_says_so(six_experts_unbounded) -> None:
    """--refine 1: one family (plus yours) gets layouts and the knob grid, the others keep only
    their anchor and are counted as not refined; the winner is still never slower than your
    layout, and refining every family (0) never finds a slower one."""
    cfg, every = six_experts_unbounded
    one = search(cfg, top=10**6, refine=1, workers=1)
    assert one.pruned_by["families not refined"] > 0 == every.pruned_by["families not refined"]
    assert one.explored < every.explored
    assert every.winner is not None and one.winner is not None
    assert every.winner.step_time_s <= one.winner.step_time_s <= estimate(cfg).step_time_s


# ----------------------------------------------------------------------------- speed, exactly
def test_the_default_searches_the_whole_space_and_the_bound_keeps_the_top_exact(
        six_experts_unbounded) -> None:
    """The default refines every family (`--refine 0`); the knob grid's bound (skip a micro-batch
    size whose no-recompute time exceeds the top-th time known) prunes settings but leaves the
    top K as the unbounded search ranks them."""
    cfg, unbounded = six_experts_unbounded
    default = search(cfg, top=3, workers=1)
    assert default.pruned_by["families not refined"] == 0
    assert "settings slower without recompute than the best found" not in unbounded.pruned_by
    assert [(c.step_time_s, Knobs.of(c.cfg)) for c in default.candidates] == \
        [(c.step_time_s, Knobs.of(c.cfg)) for c in unbounded.candidates[:3]]


def test_ranked_in_floats_printed_exactly() -> None:
    """Search ranks with the float estimate (the time page only); on every example it agrees with
    the exact one to 1e-12, and the candidates search prints carry the exact figures of
    `moeplan estimate`, bit for bit."""
    for path in sorted(EXAMPLES.glob("*.yaml")):
        cfg = load_config(path)
        exact, fast = estimate(cfg), estimate(cfg, exact=False)
        assert abs(fast.step_time_s - float(exact.step_time_s)) <= 1e-12 * exact.step_time_s
    result = search(tiny(), top=3, workers=1)
    for cand in result.candidates:
        est = estimate(cand.cfg)
        assert cand.step_time_s == est.step_time_s
        assert cand.stage_peak_bytes == [int(env["peak_memory_bytes"]) for env in est.envs]


# ----------------------------------------------------------------------------- lower bounds
def _time(cfg: Config, layout: Knobs, dispatcher: tuple, flag: bool, mbs: int) -> float | None:
    est = float_estimate(cell(layout, dispatcher, flag, NO_RECOMPUTE, mbs).apply(cfg))
    return None if est is None else est.step_time_s


@pytest.mark.parametrize("name", ["deepseek-v3-1024", "deepseek-v4-pro-1024", "qwen3-30b-a3b-16",
                                  "mixtral-8x7b-64"])
def test_hybridep_with_ep_overlap_bounds_every_setting_it_stands_for(name: str) -> None:
    """The knob grid skips a micro-batch size of a layout — every dispatcher `floor_dispatcher`
    names, EP overlap on and off — when HybridEP's time with EP overlap on and no recompute
    already exceeds the bound. Sound because the exchange time only grows with the bytes (the
    flex backends' node-deduplicated rows are the fewest any dispatcher moves) and the
    permutations (HybridEP's kernel writes expert order: none), and EP overlap only subtracts
    hidden exchange time. Checked here on the examples' own layouts at other EPs too."""
    cfg = load_config(EXAMPLES / f"{name}.yaml")
    choices = dispatchers(cfg)
    lower, bounded = floor_dispatcher(cfg, choices)
    assert lower == ("flex", "hybridep") and bounded == set(choices)
    p = cfg.parallel
    checked = 0
    for ep in sorted({p.ep, max(p.ep // 2, 1), p.ep * 2}):
        layout = replace(Knobs.of(cfg), ep=ep)
        for mbs in MBS_CHOICES[:2]:
            floor = _time(cfg, layout, lower, True, mbs)
            if floor is None:
                continue
            for dispatcher in bounded:
                on, off = (_time(cfg, layout, dispatcher, flag, mbs) for flag in (True, False))
                for t in (on, off):
                    assert t is None or t >= floor * (1 - 1e-12), (ep, mbs, dispatcher)
                if on is not None and off is not None:
                    assert on <= off * (1 + 1e-12), (ep, mbs, dispatcher)
                    checked += 1
    assert checked >= 8



@pytest.mark.parametrize("family", [(2, 1, 8, 32, 1), (1, 2, 16, 16, 1)])
def test_the_family_floor_bounds_every_layout_of_its_family(family: tuple) -> None:
    """Search skips a whole family when its floor (its model on one stage at the floor knobs:
    busy time plus optimizer step over PP) exceeds the bound: sound only if no pipeline split,
    VPP or micro-batch size of the family is faster. Checked on DeepSeek-V3 against every layout
    search times for the family (slot-balanced, even and cost-balanced, VPP 1, 2, 4) at every
    micro-batch size, and close enough to the best of them to prune (within 25 %)."""
    cfg = load_config(EXAMPLES / "deepseek-v3-1024.yaml")
    floor = family_floor(cfg, family)
    assert floor is not None
    knobs = Knobs.of(cfg).of_family(family)
    lower = ("flex", "hybridep")
    pipes = pipeline_choices(cfg, family[2])
    probe = replace(knobs, pipeline=pipes[0]).apply(cfg)
    pipes += cost_balanced_choices(cfg, family[2], layer_costs(probe, estimate(probe).stages))
    times = [t for pipe in dict.fromkeys(pipes) for mbs in MBS_CHOICES
             if (t := _time(cfg, replace(knobs, pipeline=pipe), lower, True, mbs)) is not None]
    assert len(times) >= 12
    assert floor <= min(times) * (1 + 1e-12)
    assert floor >= 0.75 * min(times)


def test_a_dispatcher_more_efficient_than_hybridep_is_not_bounded_by_it() -> None:
    """With efficiency.dispatch_alltoall above dispatch_hybridep, HybridEP's time no longer bounds
    the all-to-all dispatcher's, so the grid times that one on its own."""
    data = yaml.safe_load((EXAMPLES / "deepseek-v3-1024.yaml").read_text())
    data.setdefault("cluster", {}).setdefault("efficiency", {}).update(
        dispatch_alltoall=1.0, dispatch_hybridep=0.5)
    cfg = Config.model_validate(data)
    lower, bounded = floor_dispatcher(cfg, dispatchers(cfg))
    assert lower == ("flex", "hybridep")
    assert ("alltoall", None) not in bounded and ("flex", "hybridep") in bounded


def test_the_workers_never_change_the_result() -> None:
    """Judging is shared over worker processes in rounds of fixed sizes, so one process and two
    judge the same configs and find the same candidates."""
    cfg = tiny()
    one, two = (search(cfg, top=3, workers=w) for w in (1, 2))
    assert (one.explored, one.legal, one.fitting, one.pruned_by) == \
        (two.explored, two.legal, two.fitting, two.pruned_by)
    assert [(c.step_time_s, Knobs.of(c.cfg)) for c in one.candidates] == \
        [(c.step_time_s, Knobs.of(c.cfg)) for c in two.candidates]


SELECTIVE_EXAMPLES = sorted([*EXAMPLES.glob("*.yaml"), *(EXAMPLES / "architectures").glob("*.yaml")])


@pytest.mark.parametrize("path", SELECTIVE_EXAMPLES, ids=lambda p: p.stem)
def test_settings_judged_alike_on_memory_hold_the_same_bytes(path: Path) -> None:
    """The grid skips a preset beside a smaller one that does not fit when `memory_alike` says
    the extra modules hold nothing: on every example, wherever it says so, every stage's memory
    parts are the same (exact arithmetic), at each dispatcher and EP overlap setting."""
    cfg = load_config(path)
    if stage_memory(cfg) is None:
        pytest.skip("the example's own layout has no memory budget")
    selective = [p for p in recompute_presets(cfg) if p.granularity != "full"]
    alike = 0
    for dispatcher, flag in [(d, f) for d in dispatchers(cfg) for f in (True, False)]:
        for small, large in [(a, b) for a in selective for b in selective
                             if recomputed(a) < recomputed(b)]:
            one, two = (cell(Knobs.of(cfg), dispatcher, flag, p, 1).apply(cfg) for p in (small, large))
            if memory_alike(one, two):
                alike += 1
                assert stage_memory(one) == stage_memory(two), (dispatcher, flag, small, large)
    # Selective core attention holds nothing under fused attention, but it checkpoints the DSA
    # sparse core (its scores) on DeepSeek-V3.2 and GLM-5; the MoE activation and norms always
    # hold some.
    cores = [(a, b) for a in selective for b in selective
             if recomputed(a) < recomputed(b) and recomputed(b) - recomputed(a) == {"core_attn"}]
    dsa = variant_of(cfg, stage_split(cfg)).has("dsa")
    assert alike == (0 if dsa else len(cores) * 2 * len(dispatchers(cfg)))


def test_the_grid_skips_what_holds_nothing_and_keeps_the_top() -> None:
    """On DeepSeek-V3 (MLA, fused attention) selective core_attn settings are never judged beside a
    smaller setting that does not fit; the top and the fitting count are the unskipped search's."""
    cfg = load_config(EXAMPLES / "deepseek-v3-1024.yaml")
    layout = Knobs.of(cfg)
    skipped = Work(Judge(cfg, 1.0))
    _grid(skipped, cfg, layout, top=3)
    whole = Work(Judge(cfg, 1.0))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("planner.search.bound.memory_alike", lambda a, b: False)
        _grid(whole, cfg, layout, top=3)
    assert skipped.pruned.get(SAME_MEMORY, 0) > 0 and SAME_MEMORY not in whole.pruned
    assert skipped.judge.explored < whole.judge.explored
    assert skipped.judge.fitting == whole.judge.fitting
    assert [(c.step_time_s, Knobs.of(c.cfg)) for c in sorted(skipped.judge.timed(),
                                                               key=lambda c: c.step_time_s)] == \
        [(c.step_time_s, Knobs.of(c.cfg)) for c in sorted(whole.judge.timed(),
                                                            key=lambda c: c.step_time_s)]

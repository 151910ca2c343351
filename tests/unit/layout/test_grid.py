"""planner.layout (rank_generator, spec, grid, coordinates): Megatron-exact groups, rank views,
expert ownership and formulas.

Expected groups are derived by hand from Megatron's generator (Megatron-LM dev@d48bd6be
megatron/core/parallel_state.py RankGenerator / generate_masked_orthogonal_rank_groups) and the
DeepSeek-V4-Pro layout; property tests compare the arithmetic against a brute-force reading of the
generator definition.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from math import prod

import pytest
import sympy
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.layout.grid import Grid, nodes_spanned
from planner.layout.rank_generator import GridError, RankGenerator
from planner.layout.spec import (
    GridSpec,
    dense_generator,
    expert_generator,
    layout_problems,
    order_dp_rule_holds,
    pp_group_mismatch,
)
from tests.support.paths import ROOT

PP_DP_ORDER = "tp-cp-ep-pp-dp"


def v4_pro() -> GridSpec:
    # DeepSeek-V4-Pro layout: N=1024, PP8, TP1, CP2, ETP1, EP64, 384 experts; 8 MoE layers on stage 0.
    return GridSpec(1024, tp=1, cp=2, pp=8, ep=64, etp=1, num_experts=384,
                    moe_layers_by_stage=(tuple(range(8)),) + ((),) * 7)


# ----------------------------------------------------------------- generator semantics


def test_generator_matches_megatron_docstring_example():
    # parallel_size [tp, dp, pp] = [2, 3, 4], mask dp: dp_group[0] = [0, 2, 4], dp_group[7] = [19, 21, 23]
    layout = RankGenerator("dense", ("tp", "dp", "pp"), (2, 3, 4))
    groups = layout.groups("dp")
    assert len(groups) == 8
    assert groups[0] == [0, 2, 4]
    assert groups[1] == [1, 3, 5]
    assert groups[7] == [19, 21, 23]


def test_token_name_order_is_irrelevant():
    layout = RankGenerator("dense", ("tp", "cp", "dp", "pp"), (2, 2, 2, 2))
    assert layout.groups("dp-cp") == layout.groups("cp-dp")
    assert layout.group_containing("cp-dp", 13) == layout.group_containing("dp-cp", 13)


def test_worked_example_n8_is_reproduced_group_for_group():
    # Worked by hand from RankGenerator: N=8, TP2, CP2, EP2, ETP1, PP2, order tp-cp-ep-dp-pp.
    grid = Grid(GridSpec(8, tp=2, cp=2, ep=2, etp=1, pp=2))
    assert (grid.dp, grid.edp) == (1, 2)
    assert grid.dense.order == "tp-gtp_remat-cp-ep-dp-pp"
    assert grid.dense.sizes == (2, 1, 2, 1, 1, 2)
    assert grid.expert.order == "tp-cp-ep-gtp_remat-dp-pp"
    assert grid.expert.sizes == (1, 1, 2, 1, 2, 2)
    assert grid.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("dp_cp") == grid.groups("cp")
    assert grid.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert grid.groups("mp") == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert grid.groups("tp_cp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert grid.groups("ep") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("expt_dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("tp_ep_pp") == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert grid.groups("intra_dist_opt") == [[0, 1, 4, 5, 2, 3, 6, 7]]


def test_default_kinds_are_the_process_group_collection_fields_in_creation_order():
    grid = Grid(GridSpec(8, tp=2, cp=2, ep=2, etp=1, pp=2))
    assert grid.kinds == (
        "gtp_remat", "dp_cp", "dp", "cp", "mp", "tp", "pp", "embd", "pos_embd", "tp_dp_cp", "tp_dp",
        "tp_cp", "expt_gtp_remat", "ep", "expt_tp", "tp_ep", "tp_ep_pp", "expt_dp", "intra_dist_opt",
    )


def test_gtp_remat_groups_exist_as_singletons_when_gtp_and_egtp_are_one():
    # Megatron-LM main@d98e8a64 megatron/core/parallel_state.py initialize_model_parallel builds
    # GTP_WEIGHT_REMAT_GROUP and EXPERT_GTP_WEIGHT_REMAT_GROUP from the `gtp_remat` token whatever
    # its size: one group per rank at GTP = EGTP = 1. Their aliases (dp_gtp_remat, …) are not built.
    grid = Grid(GridSpec(8, tp=2, cp=2, ep=2, etp=1, pp=2))
    assert grid.groups("gtp_remat") == [[r] for r in range(8)]
    assert grid.groups("expt_gtp_remat") == [[r] for r in range(8)]
    assert (grid.group_size("gtp_remat"), grid.num_groups("expt_gtp_remat")) == (1, 8)
    assert grid.group_of("gtp_remat", 5) == [5] and grid.rank_groups(5)["expt_gtp_remat"] == [5]
    for alias in ("dp_gtp_remat", "dp_cp_gtp_remat", "tp_ep_pp_with_egtp_remat", "expt_dp_gtp_remat"):
        assert alias not in grid.kinds


def test_etp2_ep2_on_four_ranks():
    # ETP is the faster expert axis: ETP groups [0,1],[2,3]; EP groups [0,2],[1,3].
    grid = Grid(GridSpec(4, tp=1, ep=2, etp=2))
    assert grid.groups("expt_tp") == [[0, 1], [2, 3]]
    assert grid.groups("ep") == [[0, 2], [1, 3]]
    # tp_ep in-group index is ep_rank·ETP + etp_rank: ETP is the faster axis.
    assert grid.groups("tp_ep") == [[0, 1, 2, 3]]


# ----------------------------------------------------------------- DeepSeek-V4-Pro layout


def test_v4_pro_degrees():
    spec = v4_pro()
    assert (spec.dp, spec.edp, spec.ranks_per_stage, spec.experts_per_rank) == (64, 2, 128, 6)


def test_v4_pro_ranks_0_and_64_share_experts_0_to_5_and_one_expt_dp_group():
    grid = Grid(v4_pro())
    r0, r64 = grid.expert_ownership(0), grid.expert_ownership(64)
    assert r0.expert_ids == r64.expert_ids == (0, 1, 2, 3, 4, 5)
    assert grid.group_of("expt_dp", 0) == grid.group_of("expt_dp", 64) == [0, 64]
    assert r0.replica_peers == (0, 64)
    assert r0.experts_by_layer == {layer: (0, 1, 2, 3, 4, 5) for layer in range(8)}


def test_v4_pro_ranks_0_and_1_hold_different_experts_and_exchange_tokens():
    grid = Grid(v4_pro())
    assert grid.expert_ownership(1).expert_ids == (6, 7, 8, 9, 10, 11)
    assert 1 not in grid.group_of("expt_dp", 0)
    assert grid.group_of("ep", 0) == list(range(64))
    assert grid.expert_ownership(127).expert_ids == tuple(range(378, 384))


def test_v4_pro_stage0_coordinate_forms():
    # By hand: r = c + 2·d_a (c ∈ [0,1], d_a ∈ [0,63]) = e + 64·d_e (e ∈ [0,63], d_e ∈ [0,1]).
    grid = Grid(v4_pro())
    formulas = grid.formulas(0)
    c, d_a, e, d_e = sympy.symbols("c d_a e d_e")
    assert sympy.simplify(formulas["dense"].stage_expression - (c + 2 * d_a)) == 0
    assert sympy.simplify(formulas["expert"].stage_expression - (e + 64 * d_e)) == 0
    assert formulas["dense"].text(stage=True) == "r = c + 2*d_a"
    assert formulas["expert"].text(stage=True) == "r = e + 64*d_e"
    assert formulas["dense"].text() == "r = c + 2*d_a + 128*p"
    assert formulas["dense"].ranges(stage=True) == "c∈[0,1], d_a∈[0,63]"
    assert formulas["expert"].ranges(stage=True) == "e∈[0,63], d_e∈[0,1]"
    assert grid.formulas(3)["expert"].text(stage=True) == "r = 384 + e + 64*d_e"


def test_v4_pro_rank_view_of_rank_64():
    view = Grid(v4_pro()).rank_view(64)
    assert view.stage == 0
    assert view.dense_coords == {"tp": 0, "cp": 0, "dp": 32, "pp": 0}
    assert view.expert_coords == {"tp": 0, "ep": 0, "dp": 1, "pp": 0}
    assert view.groups["cp"] == [64, 65]
    assert view.groups["expt_dp"] == [0, 64]
    assert view.groups["dp_cp"] == list(range(128))
    assert view.groups["pp"] == [64 + 128 * s for s in range(8)]
    inverse = view.formulas["dense"].inverse
    assert {sym: int(expr.subs("r", 64)) for sym, expr in inverse.items()} == {
        "c": 0, "d_a": 32, "p": 0
    }


# ----------------------------------------------------------------- optional groups


def test_gtp_groups():
    # N=8, TP2, GTP2, PP1: DP = 8/(2·2) = 2; dense axes tp(1) gtp(2) dp(4) strides.
    grid = Grid(GridSpec(8, tp=2, gtp=2, ep=2, etp=2))
    assert grid.dp == 2 and grid.edp == 2
    assert grid.groups("gtp_remat") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert grid.groups("dp_gtp_remat") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert grid.groups("dp_cp_gtp_remat") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert grid.groups("mp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert grid.groups("tp_dp") == [list(range(8))]
    # Any GTP > 1: the instance group is every rank, sorted.
    assert grid.groups("intra_dist_opt") == [list(range(8))]
    # EGTP stays 1: the expert weight-remat groups are singletons and their aliases are absent.
    assert grid.groups("expt_gtp_remat") == [[r] for r in range(8)]
    assert "expt_dp_gtp_remat" not in grid.kinds


def test_hybrid_cp_chunks_every_dp_cp_group_in_powers_of_two_from_2():
    # megatron-core 0.16.1 / Megatron-LM main megatron/core/parallel_state.py
    # create_hybrid_dp_cp_groups: sizes 2^i for 1 <= i < floor(log2 n), consecutive chunks.
    grid = Grid(GridSpec(8, cp=2, dp_cp_chunks="hybrid"))  # one dp-cp group [0..7]
    assert grid.members["hybrid_dp_cp"] == ("hybrid_dp_cp_2", "hybrid_dp_cp_4")
    assert grid.kinds.index("hybrid_dp_cp") == grid.kinds.index("dp_cp") + 1
    assert grid.groups("hybrid_dp_cp_2") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("hybrid_dp_cp_4") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # Creation order: per dp-cp group, every size, every chunk.
    assert grid.groups("hybrid_dp_cp") == [[0, 1], [2, 3], [4, 5], [6, 7], [0, 1, 2, 3], [4, 5, 6, 7]]
    assert grid.rank_groups(5)["hybrid_dp_cp_4"] == [4, 5, 6, 7]
    with pytest.raises(GridError, match="ask for"):
        grid.group_size("hybrid_dp_cp")


def test_dynamic_cp_chunks_start_at_1_and_a_short_last_chunk_is_kept():
    # Megatron-LM dev@d48bd6be megatron/core/parallel_state.py create_dynamic_dp_cp_groups with
    # min_dynamic_context_parallel_size 1; N=8, TP2, CP2: dp-cp groups [0,2,4,6], [1,3,5,7].
    grid = Grid(GridSpec(8, tp=2, cp=2, dp_cp_chunks="dynamic"))
    assert grid.members["dynamic_dp_cp"] == ("dynamic_dp_cp_1", "dynamic_dp_cp_2")
    assert grid.groups("dynamic_dp_cp_2") == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert grid.groups("dynamic_dp_cp_1") == [[0], [2], [4], [6], [1], [3], [5], [7]]
    # DP·CP = 10: chunks of 4 leave [8, 9] (range(0, n, k) slices, as Megatron cuts them).
    ten = Grid(GridSpec(10, dp_cp_chunks="hybrid"))
    assert ten.groups("hybrid_dp_cp_4") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert ten.num_groups("hybrid_dp_cp_4") == 3 and ten.group_of("hybrid_dp_cp_4", 9) == [8, 9]
    assert ten.num_groups("hybrid_dp_cp") == 5 + 3


def test_chunked_dp_cp_needs_an_even_width():
    # megatron-core 0.16.1 asserts "Hybrid context parallel requires an even number of ranks".
    assert any("even DP·CP" in p for p in layout_problems(GridSpec(6, tp=2, dp_cp_chunks="hybrid")))
    assert Grid(GridSpec(6, tp=2)).kinds.count("hybrid_dp_cp") == 0


def test_egtp_axis_goes_after_ep():
    # N=8, EP2, ETP1, EGTP2: EDP = 8/(1·2·1·2) = 2; expert axes ep(1) gtp(2) dp(4) strides.
    grid = Grid(GridSpec(8, ep=2, etp=1, egtp=2))
    assert grid.expert.order == "tp-cp-ep-gtp_remat-dp-pp"
    assert grid.groups("ep") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.groups("expt_gtp_remat") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.groups("expt_dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert grid.groups("expt_dp_gtp_remat") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert grid.groups("tp_ep_pp_with_egtp_remat") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    own = grid.expert_ownership(2)
    assert (own.egtp_rank, own.egtp_size) == (1, 2)
    assert own.replica_peers == (2, 6)
    assert "EGTP weight shard 1 of 2" in own.shard


def test_gtp_axis_falls_back_after_tp_then_first():
    assert dense_generator(GridSpec(4, gtp=2, order="cp-tp-dp-pp")).order.startswith("cp-tp-gtp_remat")
    assert expert_generator(GridSpec(4, egtp=2, order="tp-dp-pp")).order.startswith("tp-gtp_remat-dp")
    assert dense_generator(GridSpec(4, gtp=2, order="dp-pp")).order.startswith("gtp_remat-dp-pp")


def test_distributed_optimizer_instances():
    # N=8, EP2, I=2: DP 8, EDP 4. expt_dp [[0,2,4,6],[1,3,5,7]] split by sizes [2, 2].
    grid = Grid(GridSpec(8, ep=2, dist_opt_instances=2))
    assert grid.groups("intra_dp_cp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert grid.groups("intra_expt_dp") == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert grid.groups("inter_dist_opt") == [[0, 4], [2, 6], [1, 5], [3, 7]]
    assert grid.groups("intra_dist_opt") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert grid.group_of("inter_dist_opt", 6) == [2, 6]
    assert grid.group_of("intra_dist_opt", 5) == [4, 5, 6, 7]


def test_hierarchical_cp_matches_megatron_docstring():
    # create_hierarchical_groups sizes [2, 2, 4] over 16 ranks (CP = 16).
    grid = Grid(GridSpec(16, cp=16, hcp_sizes=(2, 2, 4)))
    assert grid.groups("hcp_l0") == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13],
                                     [14, 15]]
    assert grid.groups("hcp_l1") == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14],
                                     [13, 15]]
    assert grid.groups("hcp_l2") == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]


def test_hcp_listing_follows_creation_order():
    # CP4, DP2, sizes [2, 2]: per cp group, level 0 then level 1.
    grid = Grid(GridSpec(8, cp=4, hcp_sizes=(2, 2)))
    assert grid.groups("cp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert grid.groups("hcp") == [[0, 1], [2, 3], [0, 2], [1, 3], [4, 5], [6, 7], [4, 6], [5, 7]]
    assert grid.rank_groups(6)["hcp_l0"] == [6, 7]
    assert grid.rank_groups(6)["hcp_l1"] == [4, 6]
    with pytest.raises(GridError):
        grid.group_of("hcp", 6)


# ----------------------------------------------------------------- embedding ranks


@pytest.mark.parametrize(
    ("tied", "mtp", "rule", "expected"),
    [
        (True, (), "gpt", [[0, 6], [1, 7]]),
        (False, (), "gpt", [[0], [1]]),
        (False, (3,), "gpt", [[0, 6], [1, 7]]),
        (False, (2,), "gpt", [[0, 4], [1, 5]]),
        (True, (2,), "gpt", [[0, 4, 6], [1, 5, 7]]),
        (False, (), "core", [[0, 6], [1, 7]]),
    ],
)
def test_embedding_groups(tied, mtp, rule, expected):
    # N=8, TP2, PP4: pp groups [0,2,4,6] and [1,3,5,7].
    grid = Grid(GridSpec(8, tp=2, etp=2, pp=4, tied_embeddings=tied, mtp_stages=mtp,
                         embedding_rule=rule))
    assert grid.groups("pp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert grid.groups("embd") == expected
    assert grid.groups("pos_embd") == [[0], [1]]
    assert grid.group_of("embd", 2) == []  # stage 1 never holds embeddings here
    assert grid.group_of("embd", 6) == (expected[0] if 6 in expected[0] else [])


def test_embedding_with_one_stage_is_the_rank_itself():
    grid = Grid(GridSpec(4, mtp_stages=(0,)))
    assert grid.groups("embd") == [[0], [1], [2], [3]]


# ----------------------------------------------------------------- orders and rejections


def test_pp_dp_order_with_equal_dp_is_accepted_and_pp_groups_agree():
    # N=8, TP2, PP2, EP2, ETP1: DP = EDP = 2.
    spec = GridSpec(8, tp=2, pp=2, ep=2, etp=1, order=PP_DP_ORDER)
    assert layout_problems(spec) == []
    grid = Grid(spec)
    assert grid.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.expert.groups("pp") == grid.groups("pp")
    assert grid.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_pp_dp_order_with_unequal_dp_is_rejected():
    # Megatron-LM dev@d48bd6be megatron/core/parallel_state.py initialize_model_parallel asserts
    # DP == EDP without pp last: 8/2/2/2/1/2 (N/TP/CP/EP/ETP/PP) gives DP 1, EDP 2.
    spec = GridSpec(8, tp=2, cp=2, ep=2, etp=1, pp=2, order=PP_DP_ORDER)
    assert not order_dp_rule_holds(spec)
    problems = layout_problems(spec)
    assert len(problems) == 1 and "DP = 1 != EDP = 2" in problems[0]
    with pytest.raises(GridError):
        Grid(spec)


def test_v4_pro_with_pp_dp_order_is_rejected():
    # The same assertion on 1024/1/2/64/1/8 (N/TP/CP/EP/ETP/PP): DP 64 ≠ EDP 2.
    assert not order_dp_rule_holds(GridSpec(1024, cp=2, ep=64, pp=8, order=PP_DP_ORDER))


def test_order_rule_reads_the_raw_order_string():
    spec = GridSpec(8, tp=2, cp=2, ep=2, etp=1, pp=2, order="TP-CP-EP-DP-PP")
    assert not order_dp_rule_holds(spec)


def test_api_order_with_different_tp_and_etp_fails_pp_equality():
    # tp-pp-cp-ep-dp, TP2, ETP1, EP2, PP2: DP = EDP = 2 passes check 1; pp strides 2 vs 1.
    spec = GridSpec(8, tp=2, etp=1, ep=2, pp=2, order="tp-pp-cp-ep-dp")
    assert order_dp_rule_holds(spec)
    assert pp_group_mismatch(spec) == (
        [[0, 2], [1, 3], [4, 6], [5, 7]],
        [[0, 1], [2, 3], [4, 5], [6, 7]],
    )
    assert any("pp groups" in p for p in layout_problems(spec))


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (GridSpec(12, tp=2, pp=4), "not divisible by TP·PP·CP·GTP"),
        (GridSpec(8, ep=3), "not divisible by ETP·EP·PP·EGTP"),
        (GridSpec(8, ep=2, order="tp-cp-dp-pp"), "does not name 'ep'"),
        (GridSpec(8, order="tp-cp-ep-pp"), "does not name 'dp'"),
        (GridSpec(8, order="tp-cp-xp-dp-pp"), "unknown token"),
        (GridSpec(8, order="tp-dp-dp-pp"), "more than once"),
        (GridSpec(8, cp=4, hcp_sizes=(2, 3)), "multiply to CP = 4"),
        (GridSpec(8, dist_opt_instances=3), "not divisible by num_distributed_optimizer_instances"),
        (GridSpec(8, gtp=2, dist_opt_instances=2), "requires num_distributed_optimizer_instances"),
        (GridSpec(8, pp=2, mtp_stages=(2,)), "outside the 2 pipeline stages"),
        (GridSpec(0), "positive integers"),
    ],
)
def test_layout_problems_name_the_rule(spec, needle):
    problems = layout_problems(spec)
    assert any(needle in p for p in problems), problems
    with pytest.raises(GridError):
        Grid(spec)


def test_unknown_kind_and_out_of_range_rank_are_grid_errors():
    grid = Grid(GridSpec(8))
    with pytest.raises(GridError, match="unknown or disabled"):
        grid.groups("dp_gtp_remat")
    with pytest.raises(GridError, match="outside"):
        grid.rank_view(8)
    with pytest.raises(GridError, match="outside"):
        grid.group_of("tp", -1)


def test_experts_that_do_not_split_are_reported_not_invented():
    own = Grid(GridSpec(8, ep=8, num_experts=12)).expert_ownership(3)
    assert own.expert_ids == () and "do not split evenly" in own.note
    assert Grid(GridSpec(8, ep=2)).expert_ownership(0).note == "no routed experts configured"


def test_etp_shard_is_reported():
    own = Grid(GridSpec(8, ep=2, etp=2, num_experts=4)).expert_ownership(3)
    assert (own.ep_rank, own.etp_rank) == (1, 1)
    assert own.expert_ids == (2, 3)
    assert own.shard == "ETP shard 1 of 2: FC1/FC3 column shard, FC2 row shard"
    assert own.replica_peers == (3, 7)


def test_nodes_spanned():
    grid = Grid(v4_pro())
    assert nodes_spanned(grid.group_of("ep", 0), 8) == 8
    assert nodes_spanned(grid.group_of("expt_dp", 0), 8) == 2
    assert nodes_spanned(grid.group_of("cp", 0), 8) == 1


def test_one_rank_view_needs_no_full_listing():
    # 131,072 ranks: a listing would take seconds; the view is arithmetic.
    spec = GridSpec(131072, cp=2, pp=16, ep=64, num_experts=384)
    grid = Grid(spec)
    view = grid.rank_view(100_000, with_formulas=False)
    assert view.stage == 100_000 // 8192
    assert view.groups["expt_dp"][0] == 100_000 % 64 + (100_000 // 8192) * 8192
    assert len(view.groups["expt_dp"]) == 128


def test_the_grid_loads_sympy_only_when_formula_expressions_are_asked_for():
    # `moeplan check`, `budget` and `groups --rank` (JSON or table) print the formulas' texts; only
    # the sympy expressions load sympy (0.35 s, more than the rest of `groups --rank`).
    probe = ("import sys\nfrom planner.layout.grid import Grid\nfrom planner.layout.spec import GridSpec\n"
             "grid = Grid(GridSpec(16, cp=2, ep=4, pp=2, num_experts=8))\n"
             "grid.all_groups(); view = grid.rank_view(5)\nview.groups; view.to_dict()\n"
             "view.formulas['dense'].coordinates_of(5)\n"
             "assert 'sympy' not in sys.modules\n"
             "grid.formulas(1)['dense'].inverse\nassert 'sympy' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


# ----------------------------------------------------------------- property tests


def reference_groups(axes: tuple[str, ...], sizes: tuple[int, ...], token: str) -> list[list[int]]:
    """Brute force from the definition: ranks sharing unmasked coordinates, in mixed-radix order."""
    names = set(token.split("-"))
    n = prod(sizes)

    def coords(rank: int) -> list[int]:
        out = []
        for size in sizes:
            rank, digit = divmod(rank, size)
            out.append(digit)
        return out

    def radix(digits: list[tuple[int, int]]) -> int:
        value, weight = 0, 1
        for digit, size in digits:
            value += digit * weight
            weight *= size
        return value

    buckets: dict[int, list[tuple[int, int]]] = {}
    for rank in range(n):
        c = coords(rank)
        unmasked = [(c[i], sizes[i]) for i, a in enumerate(axes) if a not in names]
        masked = [(c[i], sizes[i]) for i, a in enumerate(axes) if a in names]
        buckets.setdefault(radix(unmasked), []).append((radix(masked), rank))
    return [[r for _pos, r in sorted(buckets[q])] for q in sorted(buckets)]


@st.composite
def layouts(draw, orders=None):
    pp = draw(st.sampled_from([1, 2, 3]))
    tp = draw(st.sampled_from([1, 2]))
    cp = draw(st.sampled_from([1, 2, 3, 4]))
    dp = draw(st.sampled_from([1, 2, 4]))
    gtp = draw(st.sampled_from([1, 1, 2]))
    per_stage = tp * cp * dp * gtp
    divisors = [d for d in range(1, per_stage + 1) if per_stage % d == 0]
    etp = draw(st.sampled_from([d for d in divisors if d <= 2]))
    ep = draw(st.sampled_from([d for d in divisors if (per_stage // etp) % d == 0]))
    egtp = draw(st.sampled_from([d for d in (1, 2) if (per_stage // (etp * ep)) % d == 0]))
    if orders is None:
        tokens = draw(st.permutations(["tp", "cp", "ep", "dp", "pp"]))
        order = "-".join(tokens)
    else:
        order = draw(st.sampled_from(orders))
    edp = per_stage // (etp * ep * egtp)
    instances = 1
    if gtp == 1 and egtp == 1:
        instances = draw(st.sampled_from([i for i in (1, 2, 2) if (dp * cp) % i == 0 and edp % i == 0]))
    hcp = draw(st.sampled_from([None, (cp,)] + ([(2, 2)] if cp == 4 else [])))
    return GridSpec(
        world_size=per_stage * pp, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, gtp=gtp, egtp=egtp,
        order=order, hcp_sizes=hcp, dist_opt_instances=instances,
        tied_embeddings=draw(st.booleans()),
        mtp_stages=draw(st.sampled_from([(), (pp - 1,)])),
        num_experts=ep * draw(st.sampled_from([1, 2, 3])),
    )


PROPERTY = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.filter_too_much])


def _partition_kinds(grid: Grid) -> list[str]:
    return [k for k in grid.kinds if k not in ("embd", "pos_embd", "hcp")] + list(grid.members.get("hcp", ()))


@PROPERTY
@given(layouts())
def test_every_kind_partitions_the_world_with_the_configured_sizes(spec):
    assume(layout_problems(spec) == [])
    grid = Grid(spec)
    n = spec.world_size
    expected_sizes = {
        "tp": spec.tp, "cp": spec.cp, "dp": spec.dp, "pp": spec.pp, "dp_cp": spec.dp * spec.cp,
        "mp": spec.tp * spec.gtp * spec.pp, "tp_cp": spec.tp * spec.cp,
        "tp_dp": spec.tp * spec.gtp * spec.dp, "tp_dp_cp": spec.tp * spec.gtp * spec.dp * spec.cp,
        "ep": spec.ep, "expt_tp": spec.etp, "tp_ep": spec.etp * spec.ep,
        "tp_ep_pp": spec.etp * spec.ep * spec.pp, "expt_dp": spec.edp,
        "intra_dist_opt": n // spec.dist_opt_instances,
        "gtp_remat": spec.gtp, "dp_gtp_remat": spec.gtp * spec.dp,
        "dp_cp_gtp_remat": spec.gtp * spec.dp * spec.cp, "expt_gtp_remat": spec.egtp,
        "expt_dp_gtp_remat": spec.egtp * spec.edp,
        "tp_ep_pp_with_egtp_remat": spec.etp * spec.ep * spec.egtp * spec.pp,
        "intra_dp_cp": spec.dp * spec.cp // spec.dist_opt_instances,
        "intra_expt_dp": spec.edp // spec.dist_opt_instances,
        "inter_dist_opt": spec.dist_opt_instances,
    }
    for kind in _partition_kinds(grid):
        groups = grid.groups(kind)
        assert sorted(r for g in groups for r in g) == list(range(n)), kind
        assert len(groups) == grid.num_groups(kind), kind
        assert {len(g) for g in groups} == {grid.group_size(kind)}, kind
        if kind in expected_sizes:
            assert grid.group_size(kind) == expected_sizes[kind], kind
    stages = spec.embedding_stages()
    embd = grid.groups("embd")
    assert len(embd) == n // spec.pp
    assert sorted(r for g in embd for r in g) == sorted(
        r for r in range(n) if grid.stage_of(r) in stages
    )
    assert sorted(r for g in grid.groups("pos_embd") for r in g) == grid.stage_ranks(0)


@PROPERTY
@given(layouts())
def test_token_kinds_match_the_brute_force_generator(spec):
    assume(layout_problems(spec) == [])
    grid = Grid(spec)
    for layout in (grid.dense, grid.expert):
        for r in range(1, len(layout.axes) + 1):
            for combo in itertools.combinations(layout.axes, r):
                token = "-".join(combo)
                assert layout.groups(token) == reference_groups(layout.axes, layout.sizes, token)


@PROPERTY
@given(layouts())
def test_direct_view_equals_membership_in_the_full_listing(spec):
    assume(layout_problems(spec) == [])
    grid = Grid(spec)
    listings = {kind: grid.groups(kind) for kind in _partition_kinds(grid) + ["embd", "pos_embd"]}
    for rank in range(spec.world_size):
        for kind, groups in listings.items():
            containing = [g for g in groups if rank in g]
            assert len(containing) <= 1, kind
            assert grid.group_of(kind, rank) == (containing[0] if containing else []), kind
        coords = grid.dense.coordinates(rank)
        assert sum(coords[a] * grid.dense.strides[grid.dense.axes.index(a)] for a in coords) == rank


@PROPERTY
@given(layouts(orders=["tp-cp-ep-dp-pp", PP_DP_ORDER]))
def test_cli_orders_never_fail_pp_equality_once_the_order_rule_holds(spec):
    assume(spec.degrees.divides)
    if order_dp_rule_holds(spec):
        assert pp_group_mismatch(spec) is None


@PROPERTY
@given(layouts())
def test_accepted_layouts_have_equal_dense_and_expert_pp_groups(spec):
    assume(layout_problems(spec) == [])
    grid = Grid(spec)
    assert grid.dense.groups("pp") == grid.expert.groups("pp")
    for stage in range(spec.pp):
        ranks = grid.stage_ranks(stage)
        assert len(ranks) == spec.ranks_per_stage
        assert all(grid.expert.coordinate(r, "pp") == stage for r in ranks)


@PROPERTY
@given(layouts())
def test_expert_ownership_covers_every_expert_once_per_ep_group(spec):
    assume(layout_problems(spec) == [])
    grid = Grid(spec)
    for group in grid.groups("ep"):
        held = [e for r in group for e in grid.expert_ownership(r).expert_ids]
        assert sorted(held) == list(range(spec.num_experts))
    for rank in range(spec.world_size):
        own = grid.expert_ownership(rank)
        for peer in own.replica_peers:
            other = grid.expert_ownership(peer)
            assert (other.expert_ids, other.etp_rank, other.egtp_rank, other.stage) == (
                own.expert_ids, own.etp_rank, own.egtp_rank, own.stage)


@settings(max_examples=25, deadline=None)
@given(layouts(), st.data())
def test_formulas_evaluate_to_the_rank(spec, data):
    assume(layout_problems(spec) == [])
    grid = Grid(spec)
    rank = data.draw(st.integers(0, spec.world_size - 1))
    stage = grid.stage_of(rank)
    for name, layout in (("dense", grid.dense), ("expert", grid.expert)):
        formula = grid.formulas(stage)[name]
        values = {sym: int(expr.subs("r", rank)) for sym, expr in formula.inverse.items()}
        assert sorted(values.values()) == sorted(
            v for axis, v in layout.coordinates(rank).items() if layout.size(axis) > 1
        )
        assert int(formula.expression.subs(values)) == rank
        assert int(formula.stage_expression.subs(values)) == rank


@settings(max_examples=50, deadline=None)
@given(layouts(), st.data())
def test_formula_texts_are_what_sympy_prints_and_evaluates(spec, data):
    """`groups --rank` writes the inverse formulas and the coordinates without sympy: they must be
    the bytes sympy printed (str of the expression) and the values it substituted."""
    assume(layout_problems(spec) == [])
    grid = Grid(spec)
    rank = data.draw(st.integers(0, spec.world_size - 1))
    for formula in grid.formulas(grid.stage_of(rank)).values():
        assert formula.inverse_text() == {sym: str(expr) for sym, expr in formula.inverse.items()}
        assert formula.coordinates_of(rank) == {
            sym: int(expr.subs("r", rank)) for sym, expr in formula.inverse.items()}


def test_inverse_text_of_the_v4_pro_dense_stage():
    formula = Grid(GridSpec(1024, cp=2, pp=8, ep=64, num_experts=384)).formulas(5)["dense"]
    assert formula.inverse_text() == {"c": "Mod(r, 2)", "d_a": "Mod(floor(r/2), 64)",
                                      "p": "Mod(floor(r/128), 8)"}
    assert formula.coordinates_of(700) == {"c": 0, "d_a": 30, "p": 5}

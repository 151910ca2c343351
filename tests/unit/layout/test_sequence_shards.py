"""Article §22/§26: the runtime CP group of GTP sequence sharding holds C·q_s ranks
(CP_runtime = C·q_s, D_batch = D_w·R/q_s), cut from Megatron-LM main@d98e8a64's dense
`gtp_remat-cp` groups (megatron/core/parallel_state.py initialize_model_parallel builds the
gtp_remat axis after tp). gtp_remat_num_sequence_shards itself is in no Megatron branch."""

from __future__ import annotations

import pytest

from planner.accounting import budgets
from planner.config.loader import parse_config
from planner.layout.rank_generator import GridError
from planner.layout.sequence_shards import runtime_cp_group, runtime_cp_groups
from planner.layout.spec import GridSpec
from planner.rules.example_base import example_config_data, merge


def test_sixteen_ranks_by_hand():
    # order tp-gtp_remat-cp-ep-dp-pp, TP 1: rank = g + 4·c + 8·d. R 4, q_s 2: GTP blocks {0,1},{2,3}.
    spec = GridSpec(16, cp=2, gtp=4)
    assert runtime_cp_groups(spec, 2) == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]
    assert runtime_cp_group(spec, 2, 6) == [2, 3, 6, 7]
    assert all(len(g) == spec.cp * 2 for g in runtime_cp_groups(spec, 2))


def test_the_write_ups_example():
    # 128 ranks, TP 1, PP 1, R 64, C 2, q_s 64: CP_runtime 128, D_w 1, D_batch 1
    groups = runtime_cp_groups(GridSpec(128, cp=2, gtp=64), 64)
    assert [len(g) for g in groups] == [128]


def test_the_budget_says_the_same_size():
    data = merge(example_config_data(""), {"parallel": {"world_size": 16, "pp": 1, "cp": 2, "gtp": 4,
                                                        "gtp_remat_num_sequence_shards": 2},
                                           "training": {"global_batch_size": 8}})
    got = {b.name: b.value for b in budgets(parse_config(data)) if b.stage in (0, None)}
    assert got["cp_runtime"] == 2 * 2
    assert got["batch_replicas"] == 2 * 4 // 2  # D_w 2 · R 4 / q_s 2


def test_shards_must_divide_gtp():
    with pytest.raises(GridError, match="does not divide gtp 4"):
        runtime_cp_groups(GridSpec(16, cp=2, gtp=4), 3)

"""A validated Config is resolved: each derived field holds its value (Megatron's default when the
user gave none), the values filled in are not counted as the user's (so re-validating what the user
wrote on another card re-derives them), and search's candidates resolve as a fresh config would."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from planner.calibrate.calibration import with_gpu
from planner.config.gpus import GPUS
from planner.config.schema import Config
from planner.search.knobs import Knobs, family_of

MODEL = {"num_layers": 2, "hidden_size": 96, "num_attention_heads": 4, "num_experts": 4,
         "vocab_size": 256}


def config(model: dict[str, Any] | None = None, parallel: dict[str, Any] | None = None,
           cluster: dict[str, Any] | None = None) -> Config:
    return Config.model_validate({"model": {**MODEL, **(model or {})},
                                  "parallel": parallel if parallel is not None else {"world_size": 8},
                                  "training": {"seq_length": 64}, "cluster": cluster or {}})


def test_unset_sizes_take_megatrons_defaults() -> None:
    m = config().model
    # h = 96, 4 heads: kv_channels 96 / 4 = 24, ffn 4 · 96 = 384, no GQA, no shared expert
    assert (m.num_query_groups, m.kv_channels, m.ffn_hidden_size, m.moe_ffn_hidden_size,
            m.moe_shared_expert_intermediate_size, m.qk_head_dim, m.v_head_dim) == (
        4, 24, 384, 384, 0, 24, 24)
    assert m.model_fields_set == set(MODEL)


def test_given_sizes_win_and_feed_what_derives_from_them() -> None:
    m = config({"kv_channels": 32, "ffn_hidden_size": 200, "num_query_groups": 2, "v_head_dim": 16}).model
    assert (m.num_query_groups, m.kv_channels, m.qk_head_dim, m.v_head_dim,
            m.ffn_hidden_size, m.moe_ffn_hidden_size) == (2, 32, 32, 16, 200, 200)


def test_a_bad_size_is_the_only_error_reported() -> None:
    """kv_channels and ffn_hidden_size derive from hidden_size; when hidden_size is itself invalid
    they add no second error."""
    with pytest.raises(ValidationError) as err:
        config({"hidden_size": 0})
    assert [e["loc"] for e in err.value.errors()] == [("model", "hidden_size")]


def test_etp_follows_tp_unless_given() -> None:
    par = config(parallel={"world_size": 8, "tp": 4}).parallel
    assert (par.etp, "etp" in par.model_fields_set) == (4, False)
    assert config(parallel={"world_size": 8, "tp": 4, "expert_tensor_parallel_size": 1}).parallel.etp == 1


def test_world_size_and_nodes_derive_from_each_other() -> None:
    c = config(parallel={}, cluster={"nodes": 2, "gpu": "GB200"})  # 4 GPUs a GB200 tray
    assert (c.parallel.world_size, c.cluster.nodes) == (8, 2)
    c = config(parallel={"world_size": 24})  # nodes of 8: ceil(24 / 8)
    assert (c.cluster.nodes, "nodes" in c.cluster.model_fields_set) == (3, False)
    with pytest.raises(ValidationError, match="world_size is not set and cannot be derived"):
        config(parallel={})


def test_an_unnamed_gpu_is_the_default_card_in_its_own_nodes() -> None:
    """Without `gpu` the card is an H100 whose NVLink domain is the node as given; naming the H100
    brings the catalog's 8-GPU domain."""
    for cluster in ({"gpus_per_node": 4}, {"gpus_per_node": 4, "gpu": None}):
        c = config(cluster=cluster).cluster
        assert (c.gpu, c.gpu_named, c.gpu_label, c.nvlink_domain) == ("H100", False, "H100 (default)", 4)
    c = config(cluster={"gpus_per_node": 4, "gpu": "H100"}).cluster
    assert (c.gpu, c.gpu_named, c.gpu_label, c.nvlink_domain) == ("H100", True, "H100", 8)


def test_the_cards_gemm_figures_fill_efficiency() -> None:
    b200 = GPUS["B200"].gemm_fp8_eff  # the card's fitted FP8 share (planner/config/gpus.py)
    assert b200 != GPUS["H100"].gemm_fp8_eff  # so the test sees which card filled it
    eff = config(cluster={"gpu": "B200"}).cluster.efficiency
    assert (eff.gemm_fp8, eff.gemm_half_dim) == (b200, 64.0)
    eff = config(cluster={"gpu": "B200", "efficiency": {"gemm_half_dim": 32.0}}).cluster.efficiency
    assert (eff.gemm_fp8, eff.gemm_half_dim) == (b200, 32.0)


def test_the_users_input_re_resolves_on_another_card() -> None:
    """calibrate re-validates `model_dump(exclude_unset=True)` on the log's card: no value the schema
    filled in may travel as if the user had written it."""
    cfg = config(parallel={"tp": 2}, cluster={"nodes": 2})
    c = cfg.cluster
    assert (cfg.parallel.world_size, c.efficiency.gemm_fp8, c.nvlink_domain) == (
        16, GPUS["H100"].gemm_fp8_eff, 8)
    assert cfg.model_dump(exclude_unset=True) == {
        "model": MODEL, "parallel": {"tp": 2}, "training": {"seq_length": 64}, "cluster": {"nodes": 2}}
    moved = with_gpu(cfg, "GB200")
    assert (moved.cluster.gpu, moved.cluster.gpus_per_node, moved.cluster.nodes, moved.parallel.world_size,
            moved.cluster.nvlink_domain, moved.cluster.efficiency.gemm_fp8, moved.parallel.etp) == (
        "GB200", 4, 2, 8, 72, GPUS["GB200"].gemm_fp8_eff, 2)


@pytest.mark.parametrize("family", [(2, 1, 1, 2, 2), (2, 1, 1, 2, 1), (1, 2, 1, 4, 1)])
def test_a_search_candidate_resolves_as_a_fresh_config(family: tuple[int, int, int, int, int]) -> None:
    """Knobs.apply copies the sections without re-validating; the knobs name every degree ETP
    included, so the candidate equals the config validated afresh from the user's input and the
    knobs, field for field, and its degrees follow the new TP and ETP."""
    user = {"model": MODEL, "parallel": {"world_size": 8, "ep": 2}, "training": {"seq_length": 64}}
    cfg = Config.model_validate(user)
    knobs = Knobs.of(cfg)
    assert (knobs.etp, family_of(cfg)) == (1, (1, 1, 1, 2, 1))  # ETP resolved to TP 1
    moved = knobs.of_family(family)
    candidate = moved.apply(cfg)
    fresh_input = copy.deepcopy(user)
    for section, values in moved.sections().items():
        fresh_input.setdefault(section, {}).update(values)
    fresh = Config.model_validate(fresh_input)
    assert candidate.model_dump() == fresh.model_dump()
    tp, cp, pp, ep, etp = family
    assert family_of(candidate) == family
    assert (candidate.degrees.etp, candidate.degrees.dp, candidate.degrees.edp) == (
        etp, 8 // (tp * cp * pp), 8 // (etp * ep * pp))

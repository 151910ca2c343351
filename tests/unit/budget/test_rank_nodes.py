"""Article §4: logical rank adjacency says nothing about nodes; the launcher places ranks. A
rank→node map (cluster.rank_distribution: Slurm's block or cyclic; cluster.rank_nodes: a
hostfile's order) feeds the intra/inter-node split and rules CLU003/CLU004. Megatron numbers ranks
only: Megatron-LM dev@d48bd6be megatron/training/initialize.py:275 _initialize_distributed takes
torch.distributed's global rank as the launcher gives it. Hand-derived on the rule examples' base
(8 ranks, PP 2, EP 4: rank 0's EP group is ranks 0-3, its next stage rank 4) over 2 nodes of 4."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from planner.accounting import budgets
from planner.config.loader import parse_config
from planner.layout.nodes import NodeMap, node_of
from planner.rules import run_rules
from planner.rules.example_base import example_config_data, merge
from tests.support.megatron_lines import megatron_line

SEND = 524288  # ep_dispatch_hidden fwd send bytes of rank 0 per step (exact, placement-free)


def _rank0(cluster: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    cfg = parse_config(merge(example_config_data(""), {"cluster": {"nodes": 2, "gpus_per_node": 4,
                                                                   **cluster}}))
    return {b.name: b.value for b in budgets(cfg) if b.stage == 0}, [f.code for f in run_rules(cfg)]


def test_block_keeps_the_ep_group_on_one_node():
    got, codes = _rank0({})
    assert (got["ep_group_nodes"], got["ep_offnode_share"]) == (1, 0)
    assert got["step.ep_dispatch_hidden.fwd.send_bytes"] == SEND
    assert got["step.ep_dispatch_hidden.fwd.inter_node_bytes"] == 0
    assert got["step.pp_activation.fwd.inter_node_bytes"] == got["step.pp_activation.fwd.send_bytes"]
    assert codes == []


@pytest.mark.parametrize("cluster", [{"rank_distribution": "cyclic"},
                                     {"rank_nodes": [0, 1, 0, 1, 0, 1, 0, 1]}])
def test_cyclic_or_a_hostfile_splits_it(cluster):
    # ranks 0-3 on nodes 0,1,0,1: 2 of the 4 EP peers on rank 0's node → half of its send crosses;
    # its next stage, rank 4, is on node 0 with it → no pipeline byte crosses.
    got, codes = _rank0(cluster)
    assert (got["ep_group_nodes"], got["ep_offnode_share"]) == (2, Fraction(1, 2))
    assert got["step.ep_dispatch_hidden.fwd.inter_node_bytes"] == SEND * 2 // 4
    assert got["step.pp_activation.fwd.inter_node_bytes"] == 0
    assert codes == ["CLU003"]  # an EP group of 4 that fits one 4-GPU node spans two


@pytest.mark.parametrize(("rank_nodes", "message"), [
    ([0, 0, 0, 0, 1, 1, 1], "7 entries for world_size 8"),
    ([0, 0, 0, 0, 1, 1, 1, 2], "node index 2 with cluster.nodes 2"),
    ([0, 0, 0, 0, 0, 1, 1, 1], "node 0 holds 5 ranks"),
])
def test_a_map_that_is_no_launch_is_an_error(rank_nodes, message):
    cfg = parse_config(merge(example_config_data(""), {"cluster": {"nodes": 2, "gpus_per_node": 4,
                                                                   "rank_nodes": rank_nodes}}))
    found = [f for f in run_rules(cfg) if f.code == "CLU004"]
    assert found and message in found[0].message


def test_node_map_arithmetic():
    assert [node_of(r, 4) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [node_of(r, NodeMap(4, 2, "cyclic")) for r in range(8)] == [0, 1] * 4
    # NVLink domains of 2 nodes over 4 cyclic nodes: nodes 0,1 → domain 0, nodes 2,3 → domain 1
    assert [node_of(r, NodeMap(2, 4, "cyclic").coarsened(2)) for r in range(8)] == [0, 0, 1, 1] * 2


def test_cited_line():
    assert "args.rank = torch.distributed.get_rank()" in megatron_line("training/initialize.py", 275)

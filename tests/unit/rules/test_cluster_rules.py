"""CLU003: EP groups that straddle NVLink domains they could stay inside (NVL72 racks)."""

from __future__ import annotations

from typing import Any

import pytest

from planner.config.schema import Config
from planner.rules import run_rules


def clu003(ep: int, domain: int, world: int = 256) -> list[str]:
    data: dict[str, Any] = {
        "model": {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 8, "vocab_size": 512,
                  "num_experts": 64, "moe_ffn_hidden_size": 64},
        "parallel": {"world_size": world, "ep": ep, "etp": 1},
        "training": {"seq_length": 256, "global_batch_size": world},
        "cluster": {"gpu": "GB200", "nodes": world // 4, "nvlink_domain": domain}}
    findings = run_rules(Config.model_validate(data, strict=False))
    return [f.message for f in findings if f.code == "CLU003"]


def test_ep64_on_nvl72_racks_straddles_three_of_four_groups() -> None:
    """EP groups are ranks [64k, 64k + 64); rack boundaries at 72, 144, 216 fall inside groups
    1, 2 and 3 (64..127 holds 72; 128..191 holds 144; 192..255 holds 216); group 0 stays in rack 0."""
    (message,) = clu003(64, 72)
    assert message.startswith("3 of 4 ETP·EP groups of 64 ranks") and "ranks 64..127 span 2" in message


@pytest.mark.parametrize(("ep", "domain"), [(64, 64), (8, 72), (32, 64), (128, 64)])
def test_groups_that_tile_the_domains_are_fine(ep: int, domain: int) -> None:
    """A domain that is a multiple of the group, or a group that is a multiple of the domain
    (EP 128 over two 64-GPU domains), spans the fewest domains possible."""
    assert clu003(ep, domain) == []

"""Which node (or NVLink domain) each rank runs on: the launcher's placement, not the grid's.

Megatron numbers ranks only (torch.distributed's global rank); where a rank runs is the
launcher's choice. torchrun and Slurm's default block distribution fill node after node
(rank // gpus_per_node: `Places` is then that plain int, so every existing path and memo key
stays as it was); Slurm's `--distribution=cyclic` deals ranks out round-robin over the nodes
(rank % nodes); a hostfile, or any other launcher order, is an explicit node per rank
(cluster.rank_nodes). `node_of` answers for both, and the placement facts of the formula book
(planner/budget/symbols.py rank_values), the time estimate's NVLink domains and rule CLU003 read it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from planner.config.schema import Config


@dataclass(frozen=True)
class NodeMap:
    """A placement other than node-major: `cyclic` over `nodes` nodes, or `explicit` nodes (one
    per rank, in rank order); `group` nodes make one unit (an NVLink domain of several nodes)."""

    gpus_per_node: int
    nodes: int
    distribution: Literal["block", "cyclic"] = "block"
    explicit: tuple[int, ...] = ()
    group: int = 1

    def node(self, rank: int) -> int:
        if self.explicit:
            where = self.explicit[rank] if 0 <= rank < len(self.explicit) else rank // self.gpus_per_node
        elif self.distribution == "cyclic":
            where = rank % self.nodes
        else:
            where = rank // self.gpus_per_node
        return where // self.group

    def coarsened(self, nodes_per_unit: int) -> NodeMap:
        """The same placement seen in units of `nodes_per_unit` nodes (NVLink domains)."""
        return NodeMap(self.gpus_per_node, self.nodes, self.distribution, self.explicit,
                       self.group * nodes_per_unit)


# A placement: ranks per unit for node-major filling (the plain, fast path), or a NodeMap.
Places = int | NodeMap


def node_of(rank: int, places: Places) -> int:
    """The node (unit) of `rank` under `places`."""
    return rank // places if isinstance(places, int) else places.node(rank)


def nodes_of(ranks: Iterable[int], places: Places) -> list[int]:
    """`node_of` of each rank, the placement read once: a 16,384-rank grid's groups are placed
    rank by rank (CLU003), so the call per rank is worth saving."""
    if isinstance(places, int):
        return [rank // places for rank in ranks]
    return [places.node(rank) for rank in ranks]


def rank_places(cfg: Config, *, nvlink: bool = False) -> Places:
    """The config's placement in nodes, or (`nvlink`) in NVLink domains."""
    c = cfg.cluster
    per_node = c.gpus_per_node or 1
    domain = (c.nvlink_domain or per_node) if nvlink else per_node
    explicit = tuple(c.rank_nodes or ())
    if not explicit and c.rank_distribution == "block":
        return domain
    return NodeMap(per_node, c.nodes, c.rank_distribution, explicit).coarsened(max(domain // per_node, 1))

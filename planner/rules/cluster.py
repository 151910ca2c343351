"""CLU: the world size against the machines the cluster section describes."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts

SOURCE = "planner/emit/shape.py launch_shape (the launchers start one rank per GPU)"


@rule(
    "CLU001", "error", "the cluster has enough GPUs for the world size",
    source=SOURCE,
    why="""Every rank of the layout needs a device: nodes · gpus_per_node must reach the world
    size, or the launcher cannot start the job.""",
    bad="cluster: {nodes: 1, gpus_per_node: 4}",
    good="cluster: {nodes: 2, gpus_per_node: 4}",
)
def cluster_has_enough_gpus(f: Facts) -> Iterator[Violation]:
    nodes, per_node = f.cluster.nodes or 0, f.cluster.gpus_per_node
    if nodes * per_node < f.world_size:
        need = -(-f.world_size // per_node)
        yield Violation("cluster.nodes",
                        f"world_size {f.world_size} > nodes·gpus_per_node = {nodes}·{per_node} = "
                        f"{nodes * per_node}", f"use at least {need} nodes of {per_node} GPUs")


@rule(
    "CLU002", "warning", "GPUs left idle by the world size",
    source=SOURCE,
    why="""The allocation has more GPUs than the layout uses; the surplus sits idle for the whole
    job.""",
    bad="cluster: {nodes: 2, gpus_per_node: 8}",
    good="cluster: {nodes: 1, gpus_per_node: 8}",
)
def cluster_without_idle_gpus(f: Facts) -> Iterator[Violation]:
    nodes, per_node = f.cluster.nodes or 0, f.cluster.gpus_per_node
    if nodes * per_node > f.world_size:
        yield Violation("cluster.nodes",
                        f"nodes·gpus_per_node = {nodes}·{per_node} = {nodes * per_node} GPUs for "
                        f"world_size {f.world_size}: {nodes * per_node - f.world_size} idle",
                        "match the world size to the allocation or request fewer nodes")


RULES = (cluster_has_enough_gpus, cluster_without_idle_gpus)

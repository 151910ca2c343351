"""CLU: the world size against the machines the cluster section describes."""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from planner.config.gpus import gpu as gpu_entry
from planner.config.gpus import has_fp8
from planner.layout.nodes import Places, node_of, nodes_of, rank_places
from planner.layout.rank_generator import GridError, RankGenerator
from planner.layout.spec import expert_generator
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
    nodes, per_node = f.cluster.nodes, f.cluster.gpus_per_node
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
    nodes, per_node = f.cluster.nodes, f.cluster.gpus_per_node
    if nodes * per_node > f.world_size:
        yield Violation("cluster.nodes",
                        f"nodes·gpus_per_node = {nodes}·{per_node} = {nodes * per_node} GPUs for "
                        f"world_size {f.world_size}: {nodes * per_node - f.world_size} idle",
                        "match the world size to the allocation or request fewer nodes")


@rule(
    "CLU003", "warning", "an expert-parallel group crosses NVLink domains it could stay inside",
    source="Megatron-LM dev@d48bd6be megatron/core/parallel_state.py RankGenerator; "
    "planner/emit/shape.py launch_shape (rank r runs on node r // gpus_per_node)",
    why="""The token dispatch and combine all-to-alls run inside each EP group. An EP group no larger
    than an NVLink domain can run entirely over NVLink, but when the domain is not a multiple of
    the group (an NVL72 rack of 72 GPUs with EP 64, say) some groups straddle two domains and send
    part of every dispatch over the much slower scale-out network. The slowest EP group sets the
    step. NVL72 jobs commonly use 16 of the 18 trays of each rack (64 GPUs) for this reason.""",
    bad="""parallel: {ep: 4}
cluster: {nodes: 4, gpus_per_node: 2, nvlink_domain: 6}""",
    good="""parallel: {ep: 4}
cluster: {nodes: 4, gpus_per_node: 2, nvlink_domain: 4}""",
)
def ep_groups_inside_nvlink_domains(f: Facts) -> Iterator[Violation]:
    domain = f.cluster.nvlink_domain or f.cluster.gpus_per_node or 1
    try:
        straddle = _straddling(expert_generator(f.grid_spec), domain, rank_places(f.cfg, nvlink=True))
    except GridError:
        return  # the grid's own rules (PAR) report why it cannot be built
    if straddle is not None:
        count, groups, size, needed, first, spans = straddle
        yield Violation(
            "cluster.nvlink_domain",
            f"{count} of {groups} ETP·EP groups of {size} ranks span more NVLink "
            f"domains of {domain} GPUs than they need ({needed}): ranks {first[0]}..{first[-1]} "
            f"span {spans}",
            (f"use {domain - domain % size} GPUs of each domain (set nvlink_domain: "
             f"{domain - domain % size}), or pick ETP·EP dividing {domain}") if size < domain
            else f"pick ETP·EP a multiple of nvlink_domain {domain}, or one dividing it")


@lru_cache(maxsize=4096)
def _straddling(layout: RankGenerator, domain: int, places: Places
                ) -> tuple[int, int, int, int, tuple[int, ...], int] | None:
    """(groups spanning more domains than needed, all groups, group size, domains needed, the
    first such group, the domains it spans) of the layout's ETP·EP groups, each rank in the NVLink
    domain the launcher places it in (`places`, planner/layout/nodes.py); None when none does
    (remembered: search asks for every knob setting of a layout)."""
    groups = layout.groups("tp-ep")
    size = len(groups[0])
    needed = -(-size // domain)  # the fewest domains a group of this size can span
    straddling = [g for g in groups if len(set(nodes_of(g, places))) > needed]
    if not straddling:
        return None
    first = straddling[0]
    return (len(straddling), len(groups), size, needed, tuple(first),
            len({node_of(r, places) for r in first}))


# --- an explicit rank→node map must place every rank on a real node.


@rule(
    "CLU004", "error", "the rank→node map places every rank on a node with a free GPU",
    source="planner/layout/nodes.py rank_places (torch.distributed global ranks; the launcher "
    "decides the node)",
    why="""cluster.rank_nodes names the node of every rank in rank order (a hostfile's order, or
    any launcher's); the intra/inter-node split of every collective and CLU003 read it. A map
    shorter than the world, a node index past cluster.nodes, or more ranks on a node than it has
    GPUs describes no launch that can happen.""",
    bad="cluster: {nodes: 2, gpus_per_node: 4, rank_nodes: [0, 0, 0, 0, 0, 1, 1, 1]}",
    good="cluster: {nodes: 2, gpus_per_node: 4, rank_nodes: [0, 1, 0, 1, 0, 1, 0, 1]}",
)
def rank_nodes_are_a_launch(f: Facts) -> Iterator[Violation]:
    nodes_of = f.cluster.rank_nodes
    if not nodes_of:
        return
    world, nodes, per_node = f.world_size, f.cluster.nodes, f.cluster.gpus_per_node or 1
    if len(nodes_of) != world:
        yield Violation("cluster.rank_nodes", f"{len(nodes_of)} entries for world_size {world}",
                        f"give one node index per rank ({world})")
    if any(n >= nodes for n in nodes_of):
        yield Violation("cluster.rank_nodes", f"node index {max(nodes_of)} with cluster.nodes {nodes}",
                        f"use node indices 0..{nodes - 1}")
    crowded = sorted({n for n in nodes_of if nodes_of.count(n) > per_node})
    if crowded:
        n = crowded[0]
        yield Violation("cluster.rank_nodes", f"node {n} holds {nodes_of.count(n)} ranks, more than "
                        f"gpus_per_node {per_node}", f"at most {per_node} ranks on each node")


# --- which FP8 the card runs: Transformer Engine checks the device before any FP8 GEMM.
TE_FP8_CHECKS = ("Megatron-LM dev@d48bd6be megatron/core/fp8_utils.py get_fp8_context; moeplan's model "
                 "of Transformer Engine's device checks (transformer_engine/pytorch/fp8.py "
                 "check_fp8_support: compute capability 8.9 or higher; check_mxfp8_support: 10.0)")


@rule(
    "CLU005", "error", "FP8 training on a card without FP8 tensor cores",
    source=TE_FP8_CHECKS,
    why="""Ampere cards (A100, A800: compute capability 8.0) have no FP8 tensor cores: Transformer
    Engine refuses FP8 execution on them at the first FP8 layer, so the run never starts. Train in
    BF16 there, or name the FP8 card the run is for.""",
    bad="""cluster: {gpu: A100-80GB}
training: {fp8: true}""",
    good="""cluster: {gpu: H100}
training: {fp8: true}""",
)
def fp8_needs_an_fp8_card(f: Facts) -> Iterator[Violation]:
    if f.train.fp8 and not has_fp8(f.cluster.gpu):
        field = "training.fp8_format" if "fp8_format" in f.train.model_fields_set else "training.fp8"
        yield Violation(field, f"FP8 on cluster.gpu {f.cluster.gpu}, which has no FP8 tensor cores "
                        "(compute capability 8.0; Transformer Engine needs 8.9)",
                        "train in BF16 (drop training.fp8 / fp8_format) or name an FP8 cluster.gpu")


@rule(
    "CLU006", "error", "MXFP8 on an NVIDIA card before Blackwell",
    source=TE_FP8_CHECKS,
    why="""The MXFP8 recipe's block-scaled GEMMs run on Blackwell's tensor cores (compute capability
    10.0 and later); Transformer Engine refuses the recipe on Hopper, Ada and Ampere. Checked only where
    the config names its card: a config without cluster.gpu says nothing about the hardware.""",
    bad="""cluster: {gpu: H100}
training: {fp8_format: e4m3, fp8_recipe: mxfp8}""",
    good="""cluster: {gpu: B200}
training: {fp8_format: e4m3, fp8_recipe: mxfp8}""",
)
def mxfp8_needs_blackwell(f: Facts) -> Iterator[Violation]:
    card = gpu_entry(f.cluster.gpu)
    before = {"hopper": "Hopper, compute capability 9.0", "ada": "Ada, compute capability 8.9"}
    if (f.train.fp8_recipe == "mxfp8" and f.cluster.gpu_named and has_fp8(card.name)
            and card.family in before):
        yield Violation("training.fp8_recipe", f"mxfp8 on cluster.gpu {card.name} ({before[card.family]}; "
                        "MXFP8 needs 10.0)",
                        "use fp8_recipe blockwise or tensorwise there, or name a Blackwell cluster.gpu")


@rule(
    "CLU007", "warning", "NVLink bridges priced at the card's PCIe link",
    source="planner/config/gpus.py Gpu.nvlink_bridge (NVIDIA H100 PCIe / H100 NVL / H200 NVL "
    "datasheets: NVLink bridges of 2 or 4 cards, no NVSwitch); planner/budget/hardware.py bw_nvlink",
    why="""A PCIe Hopper card (H100 PCIe, H100 NVL, H200 NVL) reaches the other GPUs of its node
    over PCIe Gen5 (64 GB/s one way); only the 2 or 4 cards an NVLink bridge joins reach each other
    at NVLink speed. moeplan prices every intra-node collective at one bandwidth, so it takes the
    PCIe figure for the whole node: a TP or EP group that stays inside one bridge runs faster than
    estimated. Set cluster.intra_node_bandwidth_gb_s to the bridge's figure when every intra-node
    group of the plan fits in one bridge, with cluster.gpus_per_node the bridge's size (the rest of
    the server is then priced at the scale-out figure, near the PCIe one).""",
    bad="cluster: {gpu: H100-NVL}",
    good="cluster: {gpu: H100-NVL, gpus_per_node: 2, intra_node_bandwidth_gb_s: 300}",
)
def bridged_nvlink_not_modelled(f: Facts) -> Iterator[Violation]:
    card = gpu_entry(f.cluster.gpu)
    if (card.nvlink_bridge and f.cluster.gpu_named and (f.cluster.gpus_per_node or 1) > 1
            and "intra_node_bandwidth_gb_s" not in f.cluster.model_fields_set):
        yield Violation("cluster.intra_node_bandwidth_gb_s",
                        f"cluster.gpu {card.name} has no NVSwitch: intra-node collectives are priced "
                        f"at its PCIe link ({card.nvlink_gb_s:g} GB/s one way); the NVLink bridge of "
                        f"{card.nvlink_bridge} cards ({card.bridge_gb_s:g} GB/s one way) is not modelled",
                        f"set intra_node_bandwidth_gb_s {card.bridge_gb_s:g} with gpus_per_node "
                        f"{card.nvlink_bridge} if every intra-node group stays inside one bridge")


RULES = (cluster_has_enough_gpus, cluster_without_idle_gpus, ep_groups_inside_nvlink_domains,
         rank_nodes_are_a_launch, fp8_needs_an_fp8_card, mxfp8_needs_blackwell,
         bridged_nvlink_not_modelled)

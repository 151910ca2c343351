"""What every launcher needs to know about a plan: how its ranks sit on nodes, the runtime command
line, and the provenance lines written at the top of each script.

torchrun.sh and job.sbatch are rendered from the same `LaunchShape`, so the two launchers can never
disagree about processes per node or runtime flags.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.config.schema import Config
from planner.emit.megatron import launch_environment
from planner.emit.safety import EmitError
from planner.layout.nodes import node_of, rank_places

PLAN_FILE = "plan.json"
REPORT_FILE = "report.json"
_NOT_IN_RDZV_ID = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class LaunchShape:
    job_name: str
    rdzv_id: str  # torchrun names a temporary folder after it: file-name characters only
    world_size: int
    nodes: int
    nproc_per_node: int
    cpus_per_task: int
    omp_threads: int
    master_port: int
    runtime_args: tuple[str, ...]  # after `--plan PLAN`; `--report` is added by the template
    env: tuple[tuple[str, str], ...]
    megatron_env: tuple[tuple[str, str], ...]  # what Megatron-LM asserts; launch.env may override
    digest: str
    provenance: tuple[str, ...]  # comment lines (unescaped; templates pass them through `comment`)


def runtime_arguments(cfg: Config) -> tuple[str, ...]:
    """The runtime flags the launchers pass after `--plan`: steps, reference check, balanced routing."""
    args = ["--steps", str(cfg.launch.steps)]
    if cfg.launch.check_reference:
        args.append("--check-reference")
    if cfg.moe.moe_router_force_load_balancing:
        args.append("--balanced")
    return tuple(args)


def layout_line(plan: dict[str, Any]) -> str:
    """`N=8: TP1 CP2 PP1 DP4 | ETP2 EP2 EDP2` — the two grids, for the script header."""
    lay = plan["layout"]
    dense = f"TP{lay['tp']} CP{lay['cp']} PP{lay['pp']} DP{lay['dp']}"
    expert = f"ETP{lay['etp']} EP{lay['ep']} EDP{lay['edp']}"
    if lay.get("vpp", 1) > 1:
        dense += f" VPP{lay['vpp']}"
    return f"N={lay['world_size']}: {dense} | {expert}, order {lay['order']}"


def _refuse_other_placement(cfg: Config, world: int, per_node: int) -> None:
    """The budget's rank→node map (cluster.rank_distribution / rank_nodes, planner/layout/nodes.py)
    must be the one the launchers give: one torchrun per node numbers ranks node after node
    (node_rank · nproc_per_node + local_rank), so a cyclic or hostfile placement is not what runs."""
    c = cfg.cluster
    if c.rank_distribution == "block" and not c.rank_nodes:
        return
    places = rank_places(cfg)
    moved = next((r for r in range(world) if node_of(r, places) != r // per_node), None)
    if moved is None:
        return
    field = "cluster.rank_nodes" if c.rank_nodes else "cluster.rank_distribution"
    raise EmitError(field, f"the budget runs rank {moved} on node {node_of(moved, places)}, but the "
                    "emitted launchers start one torchrun per node, which puts it on node "
                    f"{moved // per_node} (ranks node after node); launch the ranks in that order "
                    "yourself (e.g. srun with one task per GPU and --distribution=cyclic) or plan "
                    "with rank_distribution: block")


def launch_shape(cfg: Config, plan: dict[str, Any], config_path: Path | str) -> LaunchShape:
    """Ranks per node from the plan's world size over cluster.nodes (which must divide it)."""
    world = cfg.parallel.world_size
    nodes = cfg.cluster.nodes
    assert world is not None and nodes is not None  # resolved by Config._resolve
    if world % nodes:
        raise EmitError("cluster.nodes", f"{world} ranks cannot be spread evenly over {nodes} nodes; "
                        "torchrun starts the same number of processes on every node")
    per_node = world // nodes
    if per_node > cfg.cluster.gpus_per_node:
        raise EmitError("cluster.nodes", f"{world} ranks over {nodes} node(s) is {per_node} per node, more "
                        f"than cluster.gpus_per_node = {cfg.cluster.gpus_per_node}")
    _refuse_other_placement(cfg, world, per_node)
    cpus = cfg.launch.cpus_per_task or per_node
    provenance = (
        f"moeplan {plan['moeplan_version']} from config {config_path}",
        f"plan {PLAN_FILE} {plan['digest']}",
        layout_line(plan),
        f"{nodes} node(s) x {per_node} rank(s) = {world} ranks",
    )
    return LaunchShape(
        job_name=cfg.launch.job_name,
        rdzv_id=_NOT_IN_RDZV_ID.sub("_", cfg.launch.job_name).strip("._") or "moeplan",
        world_size=world,
        nodes=nodes,
        nproc_per_node=per_node,
        cpus_per_task=cpus,
        omp_threads=max(1, cpus // per_node),
        master_port=cfg.launch.master_port,
        runtime_args=runtime_arguments(cfg),
        env=tuple(sorted(cfg.launch.env.items())),
        megatron_env=tuple(sorted(launch_environment(cfg).items())),
        digest=plan["digest"],
        provenance=provenance,
    )

"""Process groups exactly as the plan lists them: one `new_group` per plan group, nothing derived.

Every rank creates every group of every kind in the same order (a requirement of
`torch.distributed.new_group`), keeps the one that contains it, and reuses a single communicator
for kinds whose rank sets coincide (e.g. `dp` and `dp_cp` when CP = 1). Every group carries a
timeout so a mismatched collective fails in seconds instead of hanging a CI job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from runtime.plan_io import RUNTIME_GROUP_NAMES, Plan
from runtime.rendezvous import Endpoint, join


def timeout_from_env(variable: str, default: int) -> timedelta:
    """A timeout from the environment; anything but a positive whole number keeps the default."""
    text = os.environ.get(variable, "")
    return timedelta(seconds=int(text) if text.isdigit() and int(text) > 0 else default)


GROUP_TIMEOUT = timeout_from_env("MOEPLAN_GROUP_TIMEOUT_S", 120)
# The world group carries only bookkeeping (the reference broadcast, the report gather): it must
# outwait rank 0 training the single-process reference, which can take minutes on a real model.
WORLD_TIMEOUT = timeout_from_env("MOEPLAN_WORLD_TIMEOUT_S", 1800)
# Every rank must have checked in by then (runtime/rendezvous.py); torchrun's agents allow their
# own rendezvous 600 s, and its workers start together once that has completed.
RENDEZVOUS_TIMEOUT = timeout_from_env("MOEPLAN_RENDEZVOUS_TIMEOUT_S", 300)


def backend_for_host() -> str:
    """NCCL when this process can see a GPU, gloo on CPU ranks."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(plan_digest: str | None = None) -> Endpoint:
    """Join the job torchrun started (its env:// variables): every rank checks in within
    RENDEZVOUS_TIMEOUT (RendezvousError names the missing ones) with the digest of the plan it
    loaded (DifferentPlanError when it is not rank 0's), then the world group forms on the same
    store with WORLD_TIMEOUT, under the prefix torch's env:// init would use."""
    store, endpoint = join(RENDEZVOUS_TIMEOUT, plan_digest)
    backend = backend_for_host()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    store.set_timeout(WORLD_TIMEOUT)
    dist.init_process_group(backend=backend, store=dist.PrefixStore("default_pg", store),
                            rank=endpoint.rank, world_size=endpoint.world_size,
                            timeout=WORLD_TIMEOUT)
    return endpoint


def compute_device() -> torch.device:
    """Where this rank's tensors live: its GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass
class RankGroups:
    """This rank's view of the plan's groups: the communicator and member ranks of each kind."""

    rank: int
    world_size: int
    handles: dict[str, dist.ProcessGroup] = field(default_factory=dict)
    members: dict[str, list[int]] = field(default_factory=dict)

    def __getitem__(self, name: str) -> dist.ProcessGroup:
        return self.handles[name]

    def size(self, name: str) -> int:
        return len(self.members[name])

    def index(self, name: str) -> int:
        """This rank's group-local rank: torch orders a group's members by global rank."""
        return self.members[name].index(self.rank)


def build_groups(plan: Plan, timeout: timedelta = GROUP_TIMEOUT) -> RankGroups:
    """Create every plan group on every rank, in plan order, and keep the ones this rank is in."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != plan.world_size:
        raise RuntimeError(f"the plan is for {plan.world_size} ranks but {world} were launched: "
                           f"start torchrun with --nproc-per-node={plan.world_size} (one node) or "
                           "a matching nodes x processes")
    backend = backend_for_host()
    created: dict[tuple[int, ...], dist.ProcessGroup] = {}
    view = RankGroups(rank=rank, world_size=world)
    for name in RUNTIME_GROUP_NAMES:
        for ranks in plan.groups[name]:
            key = tuple(sorted(ranks))
            if key not in created:
                created[key] = dist.new_group(list(key), timeout=timeout, backend=backend)
            if rank in key:
                view.handles[name] = created[key]
                view.members[name] = list(key)
    return view

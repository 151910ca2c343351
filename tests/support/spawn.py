"""Gloo ranks for the runtime's multi-rank tests, forked from a server that has imported torch.

`torch.multiprocessing.spawn` starts each rank as a fresh interpreter that imports torch (2.4 s on
a 2-core CI machine); a suite of 22 spawned ranks paid that every time. multiprocessing's fork
server imports it once per pytest worker, before it has run a single torch op or started a
thread, and forks each rank from there; the rank then unpickles its function and arguments as
under spawn, so a test file's module and the runtime import as before, and nothing from the test
process (its threads, its process groups, its state) is inherited. Nor is its environment: a
rank sees the variables the server started with (the pytest worker's at its first spawn), so
what a rank needs goes in its arguments, or into os.environ inside the rank, as test_comm.py and
test_moe_layer_dist.py set MASTER_ADDR.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

# What the server imports once: torch, the runtime a rank runs, and torch's pipeline schedules,
# which a pipelined rank imports (runtime/pipeline.py) and which import torch._dynamo (2.5 s).
PRELOAD = ("torch", "torch.distributed", "torch.distributed.pipelining", "runtime.__main__",
           "runtime.train")


def spawn_ranks(function: Callable[..., Any], args: tuple[Any, ...], nprocs: int) -> None:
    """`torch.multiprocessing.spawn(function, args, nprocs, join=True)`, forked from the
    preloaded server (raises `ProcessRaisedException` / `ProcessExitedException` as spawn does)."""
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    mp.start_processes(function, args=args, nprocs=nprocs, join=True, start_method="forkserver")

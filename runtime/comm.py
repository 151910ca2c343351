"""Instrumented collectives for the MoE runtime, with autograd where tokens flow through them.

Every call is recorded in a `Ledger` under `<collective>.<phase>` so the runtime can report the
bytes each rank really moved next to what the plan predicted. Byte conventions (shared with the
planner's budgets):

* all-to-all: ``send_bytes`` is the sum of this rank's input splits, including the chunk it
  addresses to itself; ``remote_send_bytes`` excludes that chunk;
* all-gather: ``send_bytes`` is this rank's own shard;
* reduce-scatter and all-reduce: ``send_bytes`` is the whole input tensor;
* ``recv_bytes`` is always the size of this rank's output.

Variable-size all-gather / reduce-scatter are built on ``all_to_all_single`` because gloo's list
collectives fail on uneven shapes; the ledger still records them as all-gather / reduce-scatter
with the logical byte counts above. A group of size one moves nothing and records nothing.

While activation recompute runs a layer's forward again in backward (runtime/recompute.py), the
forward collectives it issues are recorded under the `recompute` phase instead of `fwd`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

# The collectives table is a leaf (no pydantic, no schema): the ledger only checks names there.
from planner.budget.collectives import RECOMPUTE
from planner.budget.collectives import collective as collective_entry

_recomputing: ContextVar[bool] = ContextVar("moeplan_recomputing", default=False)


@contextmanager
def recomputing() -> Iterator[None]:
    """Record the body's forward collectives as the `recompute` phase (a re-run forward)."""
    token = _recomputing.set(True)
    try:
        yield
    finally:
        _recomputing.reset(token)


@dataclass
class CollectiveStats:
    """Totals of one `<collective>.<phase>` entry on this rank."""

    group: str
    calls: int = 0
    send_bytes: int = 0
    remote_send_bytes: int = 0
    recv_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "calls": self.calls,
            "send_bytes": self.send_bytes,
            "remote_send_bytes": self.remote_send_bytes,
            "recv_bytes": self.recv_bytes,
        }


class Ledger:
    """Per-rank record of every collective call, keyed `<collective>.<phase>`."""

    def __init__(self) -> None:
        self._entries: dict[str, CollectiveStats] = {}

    def record(
        self,
        collective: str,
        phase: str,
        group: str,
        send_bytes: int,
        remote_send_bytes: int,
        recv_bytes: int,
    ) -> None:
        # Names and phases are the planner's collectives table; anything else is a bug. (The group
        # is recorded, not checked: a mis-wired group must show up in `moeplan verify`.)
        if phase == "fwd" and _recomputing.get():
            phase = RECOMPUTE
        collective_entry(collective).check(phase)
        key = f"{collective}.{phase}"
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = CollectiveStats(group=group)
        elif entry.group != group:
            raise ValueError(f"{key} recorded on group {group!r} after {entry.group!r}")
        entry.calls += 1
        entry.send_bytes += int(send_bytes)
        entry.remote_send_bytes += int(remote_send_bytes)
        entry.recv_bytes += int(recv_bytes)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """A plain-dict copy, sorted by name, ready for report.json."""
        return {key: self._entries[key].as_dict() for key in sorted(self._entries)}

    def reset(self) -> None:
        self._entries.clear()


@dataclass(frozen=True)
class CommGroup:
    """A process group together with the plan's name for it and this rank's place in it.

    `pg` is None when the group has one member: then every collective is the identity.
    """

    kind: str
    pg: ProcessGroup | None
    rank: int = 0
    size: int = 1

    @classmethod
    def of(cls, kind: str, pg: ProcessGroup | None) -> CommGroup:
        """Wrap a torch group, reading this rank's index and the size from torch itself."""
        if pg is None:
            return cls(kind, None, 0, 1)
        return cls(kind, pg, dist.get_rank(pg), dist.get_world_size(pg))

    @property
    def active(self) -> bool:
        return self.pg is not None and self.size > 1


@dataclass
class MoEGroups:
    """The groups an MoE layer communicates over (runtime/train.py moe_groups builds it from the plan).

    Groups are torch ProcessGroups, or None when their size is 1. `tp_ep` must list ranks with
    ETP fastest (in-group index = ep_rank * etp_size + etp_rank), as Megatron's expert `tp-ep`
    groups do. `tp_cp` carries the (sequence) aux-loss token counts.
    """

    ep: ProcessGroup | None
    expt_tp: ProcessGroup | None
    tp_ep: ProcessGroup | None
    ep_rank: int = 0
    ep_size: int = 1
    etp_rank: int = 0
    etp_size: int = 1
    tp_ep_size: int = 1
    tp_cp: ProcessGroup | None = None
    tp_cp_size: int = 1

    def __post_init__(self) -> None:
        if self.tp_ep_size != self.ep_size * self.etp_size:
            raise ValueError(
                f"tp_ep size {self.tp_ep_size} != ep size {self.ep_size} x etp size "
                f"{self.etp_size}"
            )
        checks = (
            ("ep", self.ep, self.ep_rank, self.ep_size),
            ("expt_tp", self.expt_tp, self.etp_rank, self.etp_size),
            ("tp_ep", self.tp_ep, self.tp_ep_rank, self.tp_ep_size),
            ("tp_cp", self.tp_cp, None, self.tp_cp_size),
        )
        for name, pg, rank, size in checks:
            if pg is None:
                if size != 1:
                    raise ValueError(f"group {name} of size {size} needs a process group")
                continue
            if dist.get_world_size(pg) != size:
                raise ValueError(
                    f"group {name}: torch size {dist.get_world_size(pg)} != declared {size}"
                )
            if rank is not None and dist.get_rank(pg) != rank:
                raise ValueError(
                    f"group {name}: this rank is member {dist.get_rank(pg)} in torch but "
                    f"{rank} in the plan (tp_ep must list ETP fastest)"
                )

    @classmethod
    def single(cls) -> MoEGroups:
        """No parallelism: the layer routes, permutes and computes locally."""
        return cls(ep=None, expt_tp=None, tp_ep=None)

    @property
    def tp_ep_rank(self) -> int:
        return self.ep_rank * self.etp_size + self.etp_rank

    def comm(self, kind: str) -> CommGroup:
        """The named group as a CommGroup (kind is the plan's group name)."""
        table = {
            "ep": (self.ep, self.ep_rank, self.ep_size),
            "expt_tp": (self.expt_tp, self.etp_rank, self.etp_size),
            "tp_ep": (self.tp_ep, self.tp_ep_rank, self.tp_ep_size),
        }
        if kind == "tp_cp":
            return CommGroup.of("tp_cp", self.tp_cp)
        pg, rank, size = table[kind]
        return CommGroup(kind, pg if size > 1 else None, rank if size > 1 else 0, size)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _row_bytes(t: torch.Tensor) -> int:
    row_elements = 1
    for dim in t.shape[1:]:
        row_elements *= dim
    return row_elements * t.element_size()


def _record(
    ledger: Ledger | None,
    name: str,
    phase: str,
    group: CommGroup,
    send: int,
    remote: int,
    recv: int,
) -> None:
    if ledger is not None:
        ledger.record(name, phase, group.kind, send, remote, recv)


# ---------------------------------------------------------------------------------------------
# Raw collectives (no autograd, no recording)

# torch 2.13 renamed the equal-size tensor collectives; older releases only have the old names.
_all_gather_equal = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_equal = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _all_to_all_raw(
    x: torch.Tensor, group: CommGroup, input_splits: Sequence[int], output_splits: Sequence[int]
) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(output_splits), *x.shape[1:]))
    dist.all_to_all_single(
        out,
        x,
        output_split_sizes=list(output_splits),
        input_split_sizes=list(input_splits),
        group=group.pg,
    )
    return out


def _all_gather_raw(x: torch.Tensor, group: CommGroup, sizes: Sequence[int]) -> torch.Tensor:
    """Concatenate every member's rows in group order; sizes[i] = rows of member i."""
    x = x.contiguous()
    if all(size == sizes[0] for size in sizes):
        out = x.new_empty((sum(sizes), *x.shape[1:]))
        _all_gather_equal(out, x, group=group.pg)
        return out
    # Uneven: every member sends its whole shard to every member.
    replicated = x.repeat(group.size, *([1] * (x.dim() - 1)))
    return _all_to_all_raw(replicated, group, [x.shape[0]] * group.size, sizes)


def _reduce_scatter_raw(x: torch.Tensor, group: CommGroup, sizes: Sequence[int]) -> torch.Tensor:
    """Sum over members, then keep this member's `sizes[rank]` rows."""
    x = x.contiguous()
    mine = sizes[group.rank]
    if all(size == sizes[0] for size in sizes):
        out = x.new_empty((mine, *x.shape[1:]))
        _reduce_scatter_equal(out, x, op=dist.ReduceOp.SUM, group=group.pg)
        return out
    pieces = _all_to_all_raw(x, group, sizes, [mine] * group.size)
    return pieces.view(group.size, mine, *x.shape[1:]).sum(dim=0)


# ---------------------------------------------------------------------------------------------
# Recorded collectives with autograd


def _record_all_to_all(
    ledger: Ledger | None,
    name: str,
    phase: str,
    group: CommGroup,
    row_bytes: int,
    input_splits: Sequence[int],
    output_splits: Sequence[int],
) -> None:
    send = sum(input_splits) * row_bytes
    remote = send - input_splits[group.rank] * row_bytes
    _record(ledger, name, phase, group, send, remote, sum(output_splits) * row_bytes)


class _AllToAllV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, input_splits, output_splits, ledger, name):  # type: ignore[override]
        ctx.meta = (group, input_splits, output_splits, ledger, name)
        out = _all_to_all_raw(x, group, input_splits, output_splits)
        _record_all_to_all(ledger, name, "fwd", group, _row_bytes(x), input_splits, output_splits)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        group, input_splits, output_splits, ledger, name = ctx.meta
        # The transpose of an all-to-all is the all-to-all with swapped splits.
        grad_in = _all_to_all_raw(grad, group, output_splits, input_splits)
        _record_all_to_all(
            ledger, name, "bwd", group, _row_bytes(grad), output_splits, input_splits
        )
        return grad_in, None, None, None, None, None


def _record_in_out(ledger, name, phase, group, x: torch.Tensor, out: torch.Tensor) -> None:
    """All-gather and reduce-scatter: the whole input is sent (no chunk stays local), `out` lands."""
    _record(ledger, name, phase, group, _nbytes(x), _nbytes(x), _nbytes(out))


class _AllGatherV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, sizes, ledger, name):  # type: ignore[override]
        ctx.meta = (group, sizes, ledger, name)
        out = _all_gather_raw(x, group, sizes)
        _record_in_out(ledger, name, "fwd", group, x, out)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        group, sizes, ledger, name = ctx.meta
        # Every member's copy of my rows received a gradient: sum them back onto my shard.
        grad_in = _reduce_scatter_raw(grad, group, sizes)
        _record_in_out(ledger, name, "bwd", group, grad, grad_in)
        return grad_in, None, None, None, None


class _ReduceScatterV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, sizes, ledger, name):  # type: ignore[override]
        ctx.meta = (group, sizes, ledger, name)
        out = _reduce_scatter_raw(x, group, sizes)
        _record_in_out(ledger, name, "fwd", group, x, out)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        group, sizes, ledger, name = ctx.meta
        # Each partial sum fed my output rows with weight one: gather the gradient back.
        grad_in = _all_gather_raw(grad, group, sizes)
        _record_in_out(ledger, name, "bwd", group, grad, grad_in)
        return grad_in, None, None, None, None


def all_to_all_v(
    x: torch.Tensor,
    group: CommGroup,
    input_splits: Sequence[int],
    output_splits: Sequence[int],
    ledger: Ledger | None,
    name: str,
) -> torch.Tensor:
    """Variable all-to-all over rows; input_splits[i] rows go to member i."""
    if not group.active:
        return x
    return _AllToAllV.apply(x, group, tuple(input_splits), tuple(output_splits), ledger, name)


def all_gather_v(
    x: torch.Tensor,
    group: CommGroup,
    sizes: Sequence[int],
    ledger: Ledger | None,
    name: str,
) -> torch.Tensor:
    """Concatenate rows of all members (sizes[i] rows from member i); backward reduce-scatters."""
    if not group.active:
        return x
    if x.shape[0] != sizes[group.rank]:
        raise ValueError(f"{name}: local rows {x.shape[0]} != sizes[{group.rank}]")
    return _AllGatherV.apply(x, group, tuple(sizes), ledger, name)


def reduce_scatter_v(
    x: torch.Tensor,
    group: CommGroup,
    sizes: Sequence[int],
    ledger: Ledger | None,
    name: str,
) -> torch.Tensor:
    """Sum over members and keep rows of this member (sizes as in all_gather_v)."""
    if not group.active:
        return x
    if x.shape[0] != sum(sizes):
        raise ValueError(f"{name}: rows {x.shape[0]} != sum of sizes {sum(sizes)}")
    return _ReduceScatterV.apply(x, group, tuple(sizes), ledger, name)


def all_gather_constant(
    x: torch.Tensor, group: CommGroup, ledger: Ledger | None, name: str
) -> torch.Tensor:
    """Equal-size all-gather without autograd (counts, routing maps); records phase fwd."""
    if not group.active:
        return x
    out = _all_gather_raw(x, group, [x.shape[0]] * group.size)
    _record_in_out(ledger, name, "fwd", group, x, out)
    return out


def all_reduce(
    x: torch.Tensor,
    group: CommGroup,
    ledger: Ledger | None,
    name: str,
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
) -> torch.Tensor:
    """In-place all-reduce without autograd (gradient buffers, token counts); phase fwd."""
    if not group.active:
        return x
    dist.all_reduce(x, op=op, group=group.pg)
    _record(ledger, name, "fwd", group, _nbytes(x), _nbytes(x), _nbytes(x))
    return x

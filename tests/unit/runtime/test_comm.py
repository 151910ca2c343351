"""Instrumented collectives: values, autograd transposes and ledger byte counts.

Single-process tests cover the Ledger and group bookkeeping; one 4-rank gloo launch checks the
variable all-to-all / all-gather / reduce-scatter (uneven and zero sizes) against a Python
simulation of the same data movement, and the recorded bytes against hand-derived counts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from runtime.comm import CommGroup, Ledger, MoEGroups, all_reduce, all_to_all_v
from tests.support.ports import free_port
from tests.support.spawn import spawn_ranks

WORLD = 4
WIDTH = 3  # fp32 row of 3 elements = 12 bytes
# SPLITS[src][dst]: rows rank src sends to rank dst (uneven, with zeros and a self-chunk).
SPLITS = [
    [1, 2, 0, 3],
    [0, 0, 4, 1],
    [2, 1, 1, 0],
    [3, 0, 2, 2],
]
GATHER_SIZES = [2, 0, 3, 1]  # uneven all-gather-v / reduce-scatter-v shard sizes


def test_ledger_accumulates_per_name_and_phase() -> None:
    ledger = Ledger()
    ledger.record("ep_dispatch_hidden", "fwd", "ep", 100, 75, 90)
    ledger.record("ep_dispatch_hidden", "fwd", "ep", 10, 5, 20)
    ledger.record("ep_dispatch_hidden", "bwd", "ep", 90, 60, 100)
    assert ledger.snapshot() == {
        "ep_dispatch_hidden.bwd": {"group": "ep", "calls": 1, "send_bytes": 90,
                                   "remote_send_bytes": 60, "recv_bytes": 100},
        "ep_dispatch_hidden.fwd": {"group": "ep", "calls": 2, "send_bytes": 110,
                                   "remote_send_bytes": 80, "recv_bytes": 110},
    }
    ledger.reset()
    assert ledger.snapshot() == {}


def test_ledger_rejects_unknown_names_phases_and_group_changes() -> None:
    ledger = Ledger()
    with pytest.raises(ValueError, match="'ep_dispatch' is not in the collectives table"):
        ledger.record("ep_dispatch", "fwd", "ep", 1, 1, 1)
    with pytest.raises(ValueError, match="has no phase 'forward'"):
        ledger.record("ep_dispatch_hidden", "forward", "ep", 1, 1, 1)
    ledger.record("dense_grad_reduce", "fwd", "dp_cp", 1, 1, 1)
    with pytest.raises(ValueError, match="recorded on group"):
        ledger.record("dense_grad_reduce", "fwd", "expt_dp", 1, 1, 1)


def test_size_one_groups_are_identity_and_record_nothing() -> None:
    ledger = Ledger()
    x = torch.randn(5, WIDTH, requires_grad=True)
    alone = CommGroup("ep", None)
    assert all_to_all_v(x, alone, [5], [5], ledger, "ep_dispatch_hidden") is x
    assert all_reduce(x.detach(), alone, ledger, "dense_grad_reduce") is not None
    assert ledger.snapshot() == {}


def test_moe_groups_validates_sizes_without_torch_groups() -> None:
    single = MoEGroups.single()
    assert (single.ep_size, single.etp_size, single.tp_ep_size, single.tp_ep_rank) == (1, 1, 1, 0)
    assert not single.comm("ep").active
    with pytest.raises(ValueError, match="needs a process group"):
        MoEGroups(ep=None, expt_tp=None, tp_ep=None, ep_size=2, tp_ep_size=2)
    with pytest.raises(ValueError, match="tp_ep size"):
        MoEGroups(ep=None, expt_tp=None, tp_ep=None, tp_ep_size=2)


# ---------------------------------------------------------------------------------------------
# 4-rank launch


def _rows(rank: int, count: int, salt: float) -> torch.Tensor:
    """Recognisable rows: value = salt + 100·rank + 10·row + column."""
    row = torch.arange(count, dtype=torch.float32).unsqueeze(1) * 10
    column = torch.arange(WIDTH, dtype=torch.float32)
    return salt + 100 * rank + row + column


def _chunks(x: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(torch.split(x, sizes))


def _expected_all_to_all(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Output of rank `rank`, and the gradient its input gets when loss = Σ out·weight."""
    sources = [_chunks(_rows(src, sum(SPLITS[src]), 0.0), SPLITS[src]) for src in range(WORLD)]
    out = torch.cat([sources[src][rank] for src in range(WORLD)])
    # weight of destination d = its output rows with salt 0.5; each source chunk gets back the
    # weight rows that its rows met on the destination.
    weights = {
        dst: _chunks(_rows(dst, sum(row[dst] for row in SPLITS), 0.5),
                     [SPLITS[src][dst] for src in range(WORLD)])
        for dst in range(WORLD)
    }
    grad = torch.cat([weights[dst][rank] for dst in range(WORLD)])
    return out, grad


def _worker(rank: int, port: int, out_dir: str) -> None:
    from runtime.comm import all_gather_v, reduce_scatter_v

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    checks: dict[str, Any] = {}
    try:
        group = CommGroup.of("ep", dist.new_group(list(range(WORLD))))
        # the ledger checks each name against the collectives table, group kind included
        expt_tp = dataclasses.replace(group, kind="expt_tp")
        tp_dp_cp = dataclasses.replace(group, kind="tp_dp_cp")
        ledger = Ledger()

        # all-to-all with uneven and zero splits, and its transpose
        x = _rows(rank, sum(SPLITS[rank]), 0.0).requires_grad_()
        out = all_to_all_v(x, group, SPLITS[rank], [row[rank] for row in SPLITS], ledger,
                           "ep_dispatch_hidden")
        (out * _rows(rank, out.shape[0], 0.5)).sum().backward()
        want_out, want_grad = _expected_all_to_all(rank)
        checks["a2a_values"] = bool(torch.equal(out, want_out))
        checks["a2a_grad"] = bool(torch.equal(x.grad, want_grad))

        # all-gather-v: everyone gets all shards; backward sums every copy's gradient
        shard = _rows(rank, GATHER_SIZES[rank], 0.0).requires_grad_()
        gathered = all_gather_v(shard, expt_tp, GATHER_SIZES, ledger, "etp_gather_hidden")
        weight = torch.full_like(gathered, float(rank + 1))
        (gathered * weight).sum().backward()
        want = torch.cat([_rows(r, GATHER_SIZES[r], 0.0) for r in range(WORLD)])
        checks["gather_values"] = bool(torch.equal(gathered, want))
        # each copy of my rows met weight (holder + 1): 1 + 2 + 3 + 4 = 10
        checks["gather_grad"] = bool(torch.equal(shard.grad, torch.full_like(shard, 10.0)))

        # reduce-scatter-v: member r keeps GATHER_SIZES[r] rows summed over members
        full = (_rows(0, sum(GATHER_SIZES), 0.0) * (rank + 1)).requires_grad_()
        mine = reduce_scatter_v(full, expt_tp, GATHER_SIZES, ledger, "etp_scatter_hidden")
        start = sum(GATHER_SIZES[:rank])
        want = _rows(0, sum(GATHER_SIZES), 0.0)[start : start + GATHER_SIZES[rank]] * 10
        checks["scatter_values"] = bool(torch.equal(mine, want))
        (mine * (rank + 1)).sum().backward()
        # my input row i fed member owner(i)'s output, whose weight is owner + 1
        owners = torch.repeat_interleave(torch.arange(WORLD), torch.tensor(GATHER_SIZES))
        want_grad = (owners + 1).float().unsqueeze(1).expand(-1, WIDTH)
        checks["scatter_grad"] = bool(torch.equal(full.grad, want_grad))

        # bf16 rows count two bytes per element
        half = _rows(rank, sum(SPLITS[rank]), 0.0).to(torch.bfloat16)
        all_to_all_v(half, group, SPLITS[rank], [row[rank] for row in SPLITS], ledger,
                     "ep_combine_hidden")

        counts = torch.full((8,), rank, dtype=torch.int64)
        all_reduce(counts, tp_dp_cp, ledger, "expert_bias_count_reduce")
        checks["all_reduce"] = counts.tolist() == [0 + 1 + 2 + 3] * 8
        checks["ledger"] = ledger.snapshot()
    except Exception:
        checks["exception"] = traceback.format_exc()
        raise
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(checks))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def rank_checks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out_dir = tmp_path_factory.mktemp("comm")
    spawn_ranks(_worker, (free_port(), str(out_dir)), WORLD)
    return [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "check",
    ["a2a_values", "a2a_grad", "gather_values", "gather_grad", "scatter_values",
     "scatter_grad", "all_reduce"],
)
def test_collective_values_and_gradients(rank_checks, check: str) -> None:
    for rank, checks in enumerate(rank_checks):
        assert "exception" not in checks, checks.get("exception")
        assert checks[check], f"rank {rank}: {check}"


def _entry(group: str, send: int, remote: int, recv: int) -> dict[str, Any]:
    return {"group": group, "calls": 1, "send_bytes": send, "remote_send_bytes": remote,
            "recv_bytes": recv}


# Hand-derived from SPLITS / GATHER_SIZES with 12-byte fp32 rows (6-byte bf16 rows):
#   rank 0 sends 1+2+0+3 = 6 rows (1 to itself) and receives 1+0+2+3 = 6;
#   rank 1 sends 0+0+4+1 = 5 (0 to itself), receives 2+0+1+0 = 3;
#   rank 2 sends 2+1+1+0 = 4 (1 to itself), receives 0+4+1+2 = 7;
#   rank 3 sends 3+0+2+2 = 7 (2 to itself), receives 3+1+0+2 = 6.
# The backward all-to-all swaps the splits: it sends what the forward received.
# All-gather-v of 2/0/3/1 rows: send own shard, receive 6 rows; backward is the reduce-scatter.
A2A_SEND = [6, 5, 4, 7]
A2A_SELF = [1, 0, 1, 2]
A2A_RECV = [6, 3, 7, 6]


@pytest.mark.parametrize("rank", range(WORLD))
def test_ledger_bytes_match_hand_counts(rank_checks, rank: int) -> None:
    row = 12
    send, self_rows, recv = A2A_SEND[rank], A2A_SELF[rank], A2A_RECV[rank]
    shard, total = GATHER_SIZES[rank] * row, sum(GATHER_SIZES) * row
    assert rank_checks[rank]["ledger"] == {
        "ep_dispatch_hidden.fwd": _entry("ep", send * row, (send - self_rows) * row,
                                         recv * row),
        "ep_dispatch_hidden.bwd": _entry("ep", recv * row, (recv - self_rows) * row,
                                         send * row),
        "ep_combine_hidden.fwd": _entry("ep", send * 6, (send - self_rows) * 6, recv * 6),
        "etp_gather_hidden.fwd": _entry("expt_tp", shard, shard, total),
        "etp_gather_hidden.bwd": _entry("expt_tp", total, total, shard),
        "etp_scatter_hidden.fwd": _entry("expt_tp", total, total, shard),
        "etp_scatter_hidden.bwd": _entry("expt_tp", shard, shard, total),
        "expert_bias_count_reduce.fwd": _entry("tp_dp_cp", 64, 64, 64),
    }

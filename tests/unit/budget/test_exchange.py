"""The comm page declares each exchange once: the backward rows come from the collectives table
(transposed or repeated), the not-issued rows from the group or the table entry's reason, and a
group the page does not know fails loudly."""

from __future__ import annotations

import pytest

from planner.budget.collectives import TABLE, Exchange, UnknownCollective
from planner.budget.comm import GROUPS, ONE_RANK, Collectives, group_size, one_rank
from planner.budget.expr import Book
from planner.budget.symbols import ALL_SYMBOLS


def _rows(book: Book) -> dict[str, tuple[str, str]]:
    return {q.name: (q.formula, q.doc) for q in book.quantities}


def test_an_all_gather_backward_is_its_transpose_a_reduce_scatter() -> None:
    book = Book(ALL_SYMBOLS)
    Collectives(book).exchange(Exchange("etp_gather_hidden", "expt_tp", "h", "ETP * h",
                                        "gather rows", "scatter their grads"))
    rows = _rows(book)
    assert rows["step.etp_gather_hidden.fwd.send_bytes"][0] == "h"
    assert rows["step.etp_gather_hidden.fwd.recv_bytes"][0] == "ETP * h"
    # send and recv swapped; the table's backward algorithm (reduce-scatter) prices the wire
    assert rows["step.etp_gather_hidden.bwd.send_bytes"] == (
        "ETP * h", "scatter their grads; over expt_tp, ring reduce-scatter: (G-1)/G of the input "
        "on the wire")
    assert rows["step.etp_gather_hidden.bwd.recv_bytes"][0] == "h"
    assert rows["step.etp_gather_hidden.bwd.wire_bytes"][0] == (
        "ceiling(step_etp_gather_hidden_bwd_send_bytes * (ETP - 1) / ETP)")
    assert rows["step.etp_gather_hidden.fwd.wire_bytes"][0] == (
        "step_etp_gather_hidden_fwd_send_bytes * (ETP - 1)")


def test_a_reduce_scatter_backward_is_an_all_gather() -> None:
    book = Book(ALL_SYMBOLS)
    Collectives(book).exchange(Exchange("tp_embedding_reduce", "tp", "h", "h / TP", "sum", "grads",
                                        algorithm="reduce_scatter"))
    rows = _rows(book)
    assert rows["step.tp_embedding_reduce.bwd.send_bytes"][0] == "h / TP"
    assert rows["step.tp_embedding_reduce.bwd.recv_bytes"][0] == "h"
    assert rows["step.tp_embedding_reduce.bwd.wire_bytes"][0] == (
        "step_tp_embedding_reduce_bwd_send_bytes * (TP - 1)")  # an all-gather


def test_a_re_gather_repeats_the_forward_figures() -> None:
    """GTP gathers the weights again for the backward: an all-gather both ways, not a transpose."""
    book = Book(ALL_SYMBOLS)
    Collectives(book).exchange(Exchange("gtp_weight_gather", "gtp_remat", "h", "GTP * h", "f", "b"))
    rows = _rows(book)
    assert rows["step.gtp_weight_gather.bwd.send_bytes"][0] == "h"
    assert rows["step.gtp_weight_gather.bwd.recv_bytes"][0] == "GTP * h"


def test_a_point_to_point_backward_goes_to_the_previous_rank() -> None:
    book = Book(ALL_SYMBOLS)
    Collectives(book).exchange(Exchange("pp_activation", "pp", "h", "2 * h", "acts", "grads"))
    rows = _rows(book)
    assert rows["step.pp_activation.bwd.send_bytes"][0] == "2 * h"
    assert rows["step.pp_activation.fwd.inter_node_bytes"][0] == (
        "ceiling(step_pp_activation_fwd_wire_bytes * pp_next_offnode)")
    assert rows["step.pp_activation.bwd.inter_node_bytes"][0] == (
        "ceiling(step_pp_activation_bwd_wire_bytes * pp_prev_offnode)")


def test_several_exchanges_are_written_forward_first() -> None:
    book = Book(ALL_SYMBOLS)
    Collectives(book).exchange(Exchange("ep_dispatch_hidden", "ep", "h", "2 * h", "d", "dg"),
                               Exchange("ep_combine_hidden", "ep", "2 * h", "h", "c", "cg"))
    order = [q.name for q in book.quantities if q.name.endswith(".send_bytes")]
    assert order == ["step.ep_dispatch_hidden.fwd.send_bytes", "step.ep_combine_hidden.fwd.send_bytes",
                     "step.ep_dispatch_hidden.bwd.send_bytes", "step.ep_combine_hidden.bwd.send_bytes"]


def test_an_exchange_needs_a_backward_phase_and_one_forward_algorithm() -> None:
    c = Collectives(Book(ALL_SYMBOLS))
    with pytest.raises(UnknownCollective, match="dense_grad_reduce.fwd is allreduce or reduce_scatter"):
        c.exchange(Exchange("dense_grad_reduce", "dp_cp", "h", "h", "f", "b"))
    with pytest.raises(UnknownCollective, match="ep_count_exchange.bwd is not in the table"):
        c.exchange(Exchange("ep_count_exchange", "tp_ep", "h", "h", "f", "b"))


def test_close_zero_fills_what_was_not_issued_with_the_group_reason() -> None:
    book = Book(ALL_SYMBOLS)
    Collectives(book).close("etp_gather_hidden", "etp_scatter_hidden", group="expt_tp")
    rows = _rows(book)
    assert [q.name for q in book.quantities] == [
        f"step.{n}.{p}.{d}" for n in ("etp_gather_hidden", "etp_scatter_hidden")
        for p in ("fwd", "bwd") for d in ("send_bytes", "recv_bytes")]
    assert set(rows.values()) == {("0", f"ETP = 1: {ONE_RANK}")}
    assert one_rank("tp_ep") == f"ETP·EP = 1: {ONE_RANK}"


def test_close_takes_the_table_entry_reason_and_keeps_what_was_issued() -> None:
    book = Book(ALL_SYMBOLS)
    c = Collectives(book)
    c.add("tp_embedding_reduce", "fwd", "tp", "allreduce", "h", "h", "summed whole")
    c.close("tp_embedding_reduce", "tp_linear_allreduce")
    rows = _rows(book)
    assert rows["step.tp_embedding_reduce.fwd.send_bytes"][0] == "h"  # issued: left alone
    assert rows["step.tp_embedding_reduce.bwd.send_bytes"] == (
        "0", TABLE["tp_embedding_reduce"].not_issued)
    assert rows["step.tp_linear_allreduce.bwd.recv_bytes"] == (
        "0", "sequence parallelism: reduce-scatter instead")
    c.close("tp_embedding_reduce", group="tp")  # nothing left to fill
    assert len(book.quantities) == len(rows)


def test_close_never_fills_the_recompute_phase() -> None:
    book = Book(ALL_SYMBOLS)
    assert "recompute" in TABLE["cp_boundary_hidden"].phases
    Collectives(book).close("cp_boundary_hidden", group="cp")
    assert {q.name.split(".")[2] for q in book.quantities} == {"fwd", "bwd"}


def test_close_without_a_reason_fails_loudly() -> None:
    c = Collectives(Book(ALL_SYMBOLS))
    with pytest.raises(UnknownCollective, match="tp_xent_reduce has no not_issued reason"):
        c.close("tp_xent_reduce")
    with pytest.raises(UnknownCollective, match="has no phase 'bwd'"):
        c.close("tp_xent_reduce", phase="bwd", group="tp")


def test_an_unknown_group_fails_loudly() -> None:
    with pytest.raises(UnknownCollective, match="group 'nope' has no size"):
        group_size("nope")
    with pytest.raises(UnknownCollective, match="group 'nope' has no size"):
        one_rank("nope")
    # a table group the page prices only with an explicit size: without one, no silent ""
    c = Collectives(Book(ALL_SYMBOLS))
    with pytest.raises(UnknownCollective, match="group 'intra_dp_cp' has no size"):
        c.add("dense_grad_reduce", "fwd", "intra_dp_cp", "reduce_scatter", "h", "h", "doc")


def test_every_table_group_has_a_size_or_always_comes_with_one() -> None:
    explicit = {"intra_dp_cp", "intra_expt_dp", "inter_dist_opt"}  # sized by the caller
    groups = {g for entry in TABLE.values() for g in entry.groups}
    assert groups - set(GROUPS) == explicit

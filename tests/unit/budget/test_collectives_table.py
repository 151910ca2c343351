"""One table of collectives: the byte formulas, the runtime's ledger and `moeplan verify` all name
its entries, and every figure routing cannot change is checked by verify."""

from __future__ import annotations

import ast
import dataclasses
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings

from planner.accounting import (
    ALL_SYMBOLS,
    COLLECTIVES,
    DIRECTIONS,
    UnknownCollective,
    Variant,
    formula_book,
)
from planner.budget.comm import Collectives
from planner.budget.expr import Book
from planner.verify import EXACT, EXPECTATION, MISMATCH, VerifyInputError, routing_free, verify
from tests.support.paths import ROOT
from tests.support.variant_strategy import variants

# runtime/comm.py entry points that record into the ledger, and where each takes the name
_FIRST, _LAST = {"record"}, {"all_to_all_v", "all_gather_v", "reduce_scatter_v",
                             "all_gather_constant", "all_reduce", "_reduce_grads"}


def _step_names(variant: Variant) -> set[tuple[str, str]]:
    names = set()
    for q in formula_book(variant).quantities:
        parts = q.name.split(".")
        if parts[0] == "step" and len(parts) == 4:
            names.add((parts[1], parts[2]))
    return names


def runtime_recorded_names() -> set[str]:
    """Every literal collective name the runtime passes to the ledger."""
    found = set()
    for path in sorted((ROOT / "runtime").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            callee = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            args = [a for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if callee in _FIRST and node.args and node.args[0] in args:
                found.add(args[0].value)
            elif callee in _LAST and args and node.args[-1] is args[-1]:
                found.add(args[-1].value)
    return found


@settings(max_examples=300, deadline=None)
@given(variants())
def test_every_byte_formula_names_a_table_entry(variant: Variant) -> None:
    for name, phase in _step_names(variant):
        assert name in COLLECTIVES, name
        assert phase in COLLECTIVES[name].phases, (name, phase)


def test_every_table_entry_is_priced_by_some_formula() -> None:
    """No dead entries: the formula page's variations (one per structural choice) price every
    (collective, phase) of the table."""
    from planner.docs.formulas_page import VARIATIONS, baseline_variant

    base = baseline_variant()
    priced = set().union(*(_step_names(dataclasses.replace(base, **changes))
                           for _, changes in ((None, {}), *VARIATIONS)))
    assert {(n, p) for n, e in COLLECTIVES.items() for p in e.phases} - priced == set()


def test_every_collective_the_runtime_records_is_in_the_table() -> None:
    names = runtime_recorded_names()
    assert len(names) >= 15, names  # the scan sees the runtime's calls
    assert names - set(COLLECTIVES) == set()


def test_the_formulas_refuse_a_collective_the_table_lacks() -> None:
    c = Collectives(Book(ALL_SYMBOLS))
    with pytest.raises(UnknownCollective, match="'tp_allreduce' is not in the collectives table"):
        c.add("tp_allreduce", "fwd", "tp", "allreduce", "h", "h", "doc")
    with pytest.raises(UnknownCollective, match="is not a allreduce"):
        c.add("ep_dispatch_hidden", "fwd", "ep", "allreduce", "h", "h", "doc")
    with pytest.raises(UnknownCollective, match="does not run over 'dp_cp'"):
        c.add("ep_dispatch_hidden", "fwd", "dp_cp", "alltoall", "h", "h", "doc")
    with pytest.raises(UnknownCollective, match="has no phase 'bwd'"):
        c.close("dense_grad_reduce", phase="bwd")


def test_table_entries_are_consistent() -> None:
    for entry in COLLECTIVES.values():
        assert entry.groups and entry.phases and entry.doc
        assert entry.fixed_when_dropless <= set(entry.figures())
        assert not entry.fixed_when_dropless or entry.routed_rows
        assert entry.overlap is None or entry.overlap.startswith("overlap.")


MODES = {
    "dropless all-to-all": {"moe_token_dispatcher_type": "alltoall",
                            "moe_expert_capacity_factor": None,
                            "moe_pad_expert_input_to_capacity": False},
    "drop without pad": {"moe_token_dispatcher_type": "alltoall", "moe_expert_capacity_factor": 1.0,
                         "moe_pad_expert_input_to_capacity": False},
    "drop-and-pad": {"moe_token_dispatcher_type": "alltoall", "moe_expert_capacity_factor": 1.0,
                     "moe_pad_expert_input_to_capacity": True},
    "allgather": {"moe_token_dispatcher_type": "allgather", "moe_expert_capacity_factor": None,
                  "moe_pad_expert_input_to_capacity": False},
}


def _pair(moe: dict, name: str, phase: str, direction: str, off_by: int):
    plan = {"digest": "sha256:x", "config": {"moe": moe}, "budgets": [
        {"name": f"step.{name}.{phase}.{d}", "value": 100, "stage": 0} for d in DIRECTIONS]}
    measured = {d: 100 for d in DIRECTIONS}
    measured[direction] += off_by
    report = {"plan_digest": "sha256:x", "balanced": False, "ranks": [
        {"rank": 0, "stage": 0, "collectives": {f"{name}.{phase}": {"group": "g", "calls": 1,
                                                                     **measured}}}]}
    return plan, report


@pytest.mark.parametrize("mode", MODES)
def test_verify_checks_every_routing_free_figure(mode: str) -> None:
    moe, checked = MODES[mode], 0
    for name, entry in COLLECTIVES.items():
        for phase, direction in entry.figures():
            free = routing_free({"config": {"moe": moe}}, name, phase, direction)
            [figure] = [f for f in verify(*_pair(moe, name, phase, direction, 1)).figures
                        if f.direction == direction]
            assert figure.status == (MISMATCH if free else EXPECTATION), (name, phase, direction)
            [same] = [f for f in verify(*_pair(moe, name, phase, direction, 0)).figures
                      if f.direction == direction]
            assert same.status == (EXACT if free else EXPECTATION)
            assert same.predicted == Fraction(100)
            checked += free
    everything = sum(len(e.figures()) for e in COLLECTIVES.values())
    routed = sum(len(e.figures()) for e in COLLECTIVES.values() if e.routed_rows)
    fixed = sum(len(e.fixed_when_dropless) for e in COLLECTIVES.values())
    assert checked == {"dropless all-to-all": everything - routed + fixed,
                       "drop without pad": everything - routed}.get(mode, everything)


def test_verify_refuses_a_collective_the_table_lacks() -> None:
    plan, report = _pair(MODES["drop-and-pad"], "ep_dispatch_hidden", "fwd", "send_bytes", 0)
    report["ranks"][0]["collectives"]["tp_allreduce.fwd"] = {"group": "tp", "calls": 1,
                                                            "send_bytes": 1, "recv_bytes": 1}
    with pytest.raises(VerifyInputError, match="'tp_allreduce' is not in the collectives table"):
        verify(plan, report)


def test_runtime_scan_finds_names_in_the_runtime_sources() -> None:
    """The scan is not vacuous: the dispatcher's all-to-all names are among what it finds."""
    assert {"ep_dispatch_hidden", "ep_combine_hidden", "pp_activation",
            "dense_grad_reduce"} <= runtime_recorded_names()
    assert Path(ROOT / "runtime" / "comm.py").exists()

"""Measured vs predicted: close the loop between the plan's budgets and the runtime's report.

The plan predicts, per stage, the bytes one rank sends and receives in one optimizer step under
the shared names `step.<collective>.<phase>.send_bytes` / `.recv_bytes`; the runtime's report holds
what every rank really moved under `<collective>.<phase>`. A figure is *checked* (must be equal)
when it cannot depend on the routing decisions:

* with forced balanced routing every figure is exact: each (source rank, expert) pair gets n·k/E
  assignments, so every split is known in advance;
* with learned routing the rows a rank dispatches are n·k whatever the experts (and the rows that
  come back in the combine), the AllGather dispatcher and drop-and-pad move fixed shapes, and
  gradient reductions, K/V gathers and counts never depend on routing. Received EP rows and
  everything ETP moves do: those are shown against their expectation, not checked.

No torch here: `moeplan verify` reads two JSON files.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from planner.budget.collectives import DIRECTIONS, UnknownCollective, collective
from planner.config.loader import InvalidConfig, UnreadableConfig, parse_config
from planner.files.json_shape import ShapeError, check_shape
from planner.plan import compile_plan
from planner.plan_format import read_artifact
from planner.rules import run_rules

REPORT_FORMAT = "moeplan-report"
REPORT_VERSION = 1

EXACT, MISMATCH, EXPECTATION, UNPREDICTED = "exact", "MISMATCH", "expectation", "not predicted"

class VerifyInputError(Exception):
    """An unreadable or mismatched plan/report pair: nothing can be compared."""


@dataclass(frozen=True)
class Figure:
    """One measured-vs-predicted number: a rank, a collective phase, a direction."""

    rank: int
    stage: int
    collective: str
    phase: str
    direction: str
    group: str | None
    calls: int
    predicted: Fraction | None
    measured: int
    status: str

    @property
    def ratio(self) -> Fraction | None:
        """measured / predicted; None when the prediction is missing or zero."""
        if not self.predicted:
            return None
        return Fraction(self.measured) / self.predicted

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["predicted"] = _json_number(self.predicted)
        data["ratio"] = None if self.ratio is None else float(self.ratio)
        return data


def _json_number(value: Fraction | None) -> int | str | None:
    if value is None:
        return None
    return int(value) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


@dataclass(frozen=True)
class Verification:
    figures: list[Figure]
    balanced: bool
    reference: dict[str, Any]

    @property
    def mismatches(self) -> list[Figure]:
        return [f for f in self.figures if f.status == MISMATCH]

    @property
    def reference_failed(self) -> bool:
        return bool(self.reference.get("checked")) and not self.reference.get("ok", False)

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.reference_failed

    def count(self, status: str) -> int:
        return sum(f.status == status for f in self.figures)


# What verify reads of a report (runtime/report.py build_report, runtime/comm.py ledger rows,
# runtime/equivalence.py check_reference) and of a plan (planner/plan.py compile_plan): checked
# before any of it is read, so an edited file is a message naming the key, never a traceback.
_LEDGER_ROW = {"send_bytes?": "int", "recv_bytes?": "int", "calls?": "int", "group?": ("str", "null"),
               "*": "any"}
REPORT_SHAPE = {
    "plan_digest": ("str", "null"),
    "balanced?": "bool",
    "reference?": ("null", {"checked?": "bool", "ok?": "bool", "max_rel_error?": "number",
                            "tolerance?": ("number", "null"),
                            "mismatches?": [{"rank?": ("int", "null"), "tensor?": "str",
                                             "rel_error?": ("number", "null"), "*": "any"}],
                            "*": "any"}),
    "ranks": [{"rank": "int", "stage": "int", "collectives?": {"*": _LEDGER_ROW}, "*": "any"}],
    "*": "any",
}
PLAN_SHAPE = {
    "digest": "str",
    "budgets": [{"name": "str", "stage?": ("int", "null"), "value": ("number", "str", "null"),
                 "*": "any"}],
    "config": {"moe": {"moe_token_dispatcher_type": "str",
                       "moe_expert_capacity_factor": ("number", "null"),
                       "moe_pad_expert_input_to_capacity": "bool", "*": "any"}, "*": "any"},
    "*": "any",
}


def check_input_shape(data: dict[str, Any], shape: dict[str, Any], path: Path | str, what: str) -> None:
    try:
        check_shape(data, shape)
    except ShapeError as exc:
        raise VerifyInputError(f"{path}: not a {what} this moeplan wrote ({exc})") from None


def read_report(path: Path | str) -> dict[str, Any]:
    report = read_artifact(path, what="runtime report", fmt=REPORT_FORMAT, version=REPORT_VERSION,
                           error=VerifyInputError, remedy="rerun the runtime with this moeplan",
                           kind="report")
    check_input_shape(report, REPORT_SHAPE, path, "runtime report")
    for index, share in enumerate(report["ranks"]):
        for key in share.get("collectives", {}):
            if "." not in key:
                raise VerifyInputError(f"{path}: $.ranks[{index}].collectives.{key}: expected "
                                       "<collective>.<phase>; not a report this moeplan wrote")
    return report


def predictions(plan: dict[str, Any]) -> dict[tuple[int | None, str, str, str], Fraction]:
    """(stage or None for every stage, collective, phase, direction) -> predicted bytes."""
    table: dict[tuple[int | None, str, str, str], Fraction] = {}
    for budget in plan.get("budgets", []):
        parts = str(budget.get("name", "")).split(".")
        if len(parts) != 4 or parts[0] != "step" or parts[3] not in DIRECTIONS:
            continue
        try:
            table[budget.get("stage"), parts[1], parts[2], parts[3]] = Fraction(str(budget["value"]))
        except (ValueError, ZeroDivisionError):
            raise VerifyInputError(f"the plan's budget {budget['name']} has the value "
                                   f"{str(budget['value'])[:40]!r}, not a number: recompile the "
                                   "plan") from None
    return table


def routing_free(plan: dict[str, Any], name: str, phase: str, direction: str) -> bool:
    """Whether a figure is the same for every routing decision (so it is checked exactly), as
    the collectives table says; a name the table does not list raises UnknownCollective."""
    entry = collective(name)
    entry.check(phase)
    if not entry.routed_rows:
        return True
    moe = plan["config"]["moe"]
    if moe["moe_token_dispatcher_type"] == "allgather":
        return True
    if moe["moe_expert_capacity_factor"] is not None:
        # Drop-and-pad fixes every split at E·c rows; dropping without padding moves a
        # routing-dependent number of rows in every routed-rows collective.
        return bool(moe["moe_pad_expert_input_to_capacity"])
    return (phase, direction) in entry.fixed_when_dropless


# What a plan derives from its config; the rest (format, versions, digest) is its envelope.
DERIVED = ("layout", "stages", "groups", "ranks", "budgets", "findings")


def _item_label(index: int, item: Any) -> str:
    """A list item's place, with its name when it has one (a budget: `150 grad_scale_sum_dense`,
    `7 step.ep_dispatch_hidden.fwd.send_bytes, stage 1`), so a message names the figure itself."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return str(index)
    stage = item.get("stage")
    return f"{index} {item['name'][:80]}" + ("" if stage is None else f", stage {stage}")


def _first_difference(mine: Any, theirs: Any, path: str) -> str | None:
    """The first place two JSON values differ, as `path: theirs in the plan, mine recompiled`."""
    stack = [(mine, theirs, path)]
    while stack:
        a, b, where = stack.pop()
        if isinstance(a, dict) and isinstance(b, dict):
            if a.keys() != b.keys():
                extra = sorted(set(a) ^ set(b), key=str)[0]
                return f"{where}.{extra}: present in only one of the plan and its recompile"
            stack += [(a[k], b[k], f"{where}.{k}") for k in reversed(list(a))]
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            pairs = list(enumerate(zip(a, b, strict=True)))
            stack += [(x, y, f"{where}[{_item_label(i, x)}]") for i, (x, y) in reversed(pairs)]
        elif a != b or type(a) is not type(b):
            return f"{where} is {str(b)[:60]} in the plan, {str(a)[:60]} when its config is compiled"
    return None


def check_rederived(plan: dict[str, Any]) -> None:
    """VerifyInputError when the plan's figures are not what its own config compiles to."""
    check_input_shape(plan, PLAN_SHAPE, "the plan", "plan")
    difference = rederived_difference(plan)
    if difference:
        raise VerifyInputError(f"the plan is not what its own config compiles to ({difference}): "
                               "it was edited after compile, or compiled by another moeplan "
                               f"({str(plan.get('moeplan_version'))[:40]}); recompile the config")


def rederived_difference(plan: dict[str, Any]) -> str | None:
    """Compile the plan's own config again and name the first derived figure that differs (None:
    the plan is what its config compiles to). The digest proves the file is intact, not that its
    figures follow from its config: a plan edited and digested again passes the digest."""
    try:
        cfg = parse_config(plan["config"])
        again = compile_plan(cfg, run_rules(cfg))
    except (InvalidConfig, UnreadableConfig) as exc:
        return f"its embedded config does not compile ({str(exc)[:120] or type(exc).__name__})"
    except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError, RecursionError) as exc:
        return f"its embedded config does not compile ({type(exc).__name__}: {str(exc)[:80]})"
    for key in DERIVED:
        difference = _first_difference(again.get(key), plan.get(key), key)
        if difference:
            return difference
    return None


def verify(plan: dict[str, Any], report: dict[str, Any]) -> Verification:
    """Every rank × collective × direction, predicted next to measured, with its status."""
    check_input_shape(plan, PLAN_SHAPE, "the plan", "plan")
    check_input_shape(report, REPORT_SHAPE, "the report", "runtime report")
    if report.get("plan_digest") != plan.get("digest"):
        raise VerifyInputError("the report was measured on another plan (plan_digest "
                               f"{str(report.get('plan_digest'))[:19]}… vs "
                               f"{str(plan.get('digest'))[:19]}…): rerun the runtime on this plan")
    balanced = bool(report.get("balanced"))
    predicted = predictions(plan)
    figures: list[Figure] = []
    for share in sorted(report["ranks"], key=lambda entry: entry["rank"]):
        rank, stage = int(share["rank"]), int(share["stage"])
        measured: dict[str, Any] = share.get("collectives", {})
        names = {(c, p) for (s, c, p, _) in predicted if s in (stage, None)}
        names |= {tuple(key.split(".", 1)) for key in measured}
        for name, phase in sorted(names):
            try:
                collective(name).check(phase)
            except UnknownCollective as exc:
                raise VerifyInputError(f"rank {rank}: {exc}; the plan and the report must come "
                                       "from this moeplan") from None
            entry = measured.get(f"{name}.{phase}", {})
            for direction in DIRECTIONS:
                expected = predicted.get((stage, name, phase, direction),
                                         predicted.get((None, name, phase, direction)))
                value = int(entry.get(direction, 0))
                if expected is None:
                    if not entry:
                        continue
                    status = UNPREDICTED
                elif balanced or routing_free(plan, name, phase, direction):
                    status = EXACT if value == expected else MISMATCH
                else:
                    status = EXPECTATION
                figures.append(Figure(rank, stage, name, phase, direction,
                                      entry.get("group"), int(entry.get("calls", 0)), expected,
                                      value, status))
    return Verification(figures, balanced, dict(report.get("reference") or {}))

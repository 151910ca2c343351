"""Explaining a quantity to a person: exact digits, units, and formula → substitution → value.

Kept apart from the engine (planner/budget/expr.py) so evaluating a budget never needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from functools import cache

from planner.budget.expr import FUNCTIONS, IDENTIFIER, Number
from planner.units import fixed, format_bytes, number_text


def value_text(value: Number, unit: str, *, short: bool = False) -> str:
    """A value for people: exact digits, binary units for bytes, a percentage for shares."""
    if unit == "bytes":
        human = format_bytes(value, digits=3 if short else 6)
        if short or abs(value) < 1024:
            return human
        return f"{number_text(value)} B ({human})"
    if unit == "share":
        return f"{fixed(value * 100, 1)} %"
    return number_text(value)


def pretty(formula: str) -> str:
    """Formulas for people: `a * b` reads as `a · b`."""
    return formula.replace("*", "·")


@cache
def _template(formula: str) -> tuple[tuple[str, bool], ...]:
    """The pretty formula cut into (text, is_name) pieces, so substitution is a join."""
    pieces: list[tuple[str, bool]] = []
    last = 0
    for match in IDENTIFIER.finditer(formula):
        pieces.append((pretty(formula[last:match.start()]), False))
        name = match.group(0)
        pieces.append((name, name not in FUNCTIONS))
        last = match.end()
    pieces.append((pretty(formula[last:]), False))
    return tuple(p for p in pieces if p[0])


def substitute(formula: str, values: Mapping[str, Number]) -> str:
    """The formula with every name replaced by its value: the middle step of an explanation."""
    out = []
    for text, is_name in _template(formula):
        if is_name and text in values:
            value = values[text]
            out.append(f"({number_text(value)})" if isinstance(value, Fraction) else str(value))
        else:
            out.append(text)
    return "".join(out)

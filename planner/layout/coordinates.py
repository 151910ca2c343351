"""A generator's rank as a sympy formula of its coordinates, and each coordinate as a formula of the rank.

The V4-Pro layout reads r = c + 2·d_a (dense) = e + 64·d_e (expert) inside a stage: the strides of
Megatron's RankGenerator (planner/layout/rank_generator.py), written out. This module imports sympy
(about 0.25 s), so only `Grid.formulas` imports it, when formulas are asked for: `moeplan check` and
`moeplan budget` never load it through the grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy

from planner.layout.rank_generator import GTP_AXIS, GridName, RankGenerator

# Symbols of the coordinate formulas (the V4-Pro layout reads r = c + 2·d_a = e + 64·d_e).
_SYMBOLS: dict[GridName, dict[str, str]] = {
    "dense": {"tp": "t", GTP_AXIS: "g", "cp": "c", "ep": "e", "dp": "d_a", "pp": "p"},
    "expert": {"tp": "t_e", GTP_AXIS: "g_e", "cp": "c", "ep": "e", "dp": "d_e", "pp": "p"},
}


@dataclass(frozen=True)
class CoordinateFormula:
    """A generator's rank as a linear form of its coordinates, derived from its strides."""

    layout: GridName
    terms: tuple[tuple[int, str, int], ...]  # (stride, symbol, size), fastest first
    expression: Any  # sympy Expr: global rank
    stage_expression: Any  # sympy Expr: rank inside one stage (p substituted)
    stage: int
    inverse: dict[str, Any]  # symbol -> sympy Expr of r

    def text(self, *, stage: bool = False) -> str:
        """`r = c + 2*d_a + 128*p`, terms fastest axis first (the order sympy would lose)."""
        pieces = []
        for stride, symbol, _size in self.terms:
            if symbol == "p" and stage:
                if self.stage:
                    pieces.insert(0, str(stride * self.stage))
                continue
            pieces.append(symbol if stride == 1 else f"{stride}*{symbol}")
        return "r = " + (" + ".join(pieces) or "0")

    def ranges(self, *, stage: bool = False) -> str:
        return ", ".join(
            f"{sym}∈[0,{size - 1}]" for _st, sym, size in self.terms if not (stage and sym == "p")
        )


def coordinate_formula(generator: RankGenerator, stage: int = 0) -> CoordinateFormula:
    """r as Σ stride·coordinate over axes of size > 1, plus each coordinate as a function of r."""
    names = _SYMBOLS[generator.name]
    # Plain symbols, so callers can substitute by name: expr.subs({"c": 1, "d_a": 5}).
    r = sympy.Symbol("r")
    terms = tuple(
        (stride, names[axis], size)
        for axis, size, stride in zip(generator.axes, generator.sizes, generator.strides, strict=True)
        if size > 1
    )
    symbols = {sym: sympy.Symbol(sym) for _s, sym, _z in terms}
    expression = sympy.Add(*(stride * symbols[sym] for stride, sym, _z in terms))
    p = symbols.get("p")
    stage_expression = expression.subs(p, stage) if p is not None else expression
    inverse = {
        sym: sympy.Mod(sympy.floor(r / stride), size) if stride > 1 else sympy.Mod(r, size)
        for stride, sym, size in terms
    }
    return CoordinateFormula(generator.name, terms, expression, stage_expression, stage, inverse)

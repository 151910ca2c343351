"""A generator's rank as a formula of its coordinates, and each coordinate as a formula of the rank.

The V4-Pro layout reads r = c + 2·d_a (dense) = e + 64·d_e (expert) inside a stage: the strides of
Megatron's RankGenerator (planner/layout/rank_generator.py), written out. The texts `moeplan groups
--rank R` prints (JSON or table) are plain string arithmetic on the strides; only the sympy
expressions (`expression`, `stage_expression`, `inverse`) import sympy (about 0.35 s of start-up,
more than the rest of `groups --rank`), when a caller asks for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

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
    stage: int

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

    def inverse_text(self) -> dict[str, str]:
        """Each coordinate as a function of r, as sympy prints `inverse` (`Mod(floor(r/2), 64)`):
        a stride and a size, so no sympy is needed to write them."""
        return {sym: f"Mod(floor(r/{stride}), {size})" if stride > 1 else f"Mod(r, {size})"
                for stride, sym, size in self.terms}

    def coordinates_of(self, rank: int) -> dict[str, int]:
        """`inverse` evaluated at r = rank: floor(rank / stride) mod size per symbol."""
        return {sym: rank // stride % size for stride, sym, size in self.terms}

    # The same formulas as sympy expressions, for callers that substitute or simplify.

    @cached_property
    def expression(self) -> Any:
        """Global rank, a sympy Expr (plain symbols: expr.subs({"c": 1, "d_a": 5}))."""
        import sympy

        return sympy.Add(*(stride * sympy.Symbol(sym) for stride, sym, _z in self.terms))

    @cached_property
    def stage_expression(self) -> Any:
        """Rank inside one stage, a sympy Expr (p substituted)."""
        import sympy

        if not any(sym == "p" for _st, sym, _z in self.terms):
            return self.expression
        return self.expression.subs(sympy.Symbol("p"), self.stage)

    @cached_property
    def inverse(self) -> dict[str, Any]:
        """symbol -> sympy Expr of r."""
        import sympy

        r = sympy.Symbol("r")
        return {sym: sympy.Mod(sympy.floor(r / stride), size) if stride > 1 else sympy.Mod(r, size)
                for stride, sym, size in self.terms}


def coordinate_formula(generator: RankGenerator, stage: int = 0) -> CoordinateFormula:
    """r as Σ stride·coordinate over axes of size > 1, plus each coordinate as a function of r."""
    names = _SYMBOLS[generator.name]
    terms = tuple(
        (stride, names[axis], size)
        for axis, size, stride in zip(generator.axes, generator.sizes, generator.strides, strict=True)
        if size > 1
    )
    return CoordinateFormula(generator.name, terms, stage)

"""The expression engine behind the budgets: named formulas, exact evaluation, explanation.

Every quantity is written once, as a formula string over config symbols and earlier quantities.
That string is the sympy expression (`Quantity.expression`, parsed lazily and cached) and the fast
path: each group of formulas is compiled once into one Python function whose divisions are exact
(`_div` keeps ints where they divide, Fractions otherwise), so values never drift and `moeplan
check` can evaluate the memory budget without importing sympy. `moeplan search` ranks thousands
of layouts with the same formulas compiled in float mode (`exact=False`: plain `/`, float inputs),
then re-evaluates the ones it prints exactly.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache, lru_cache
from typing import Any, Literal

from planner.budget.code_cache import compiled

Level = Literal["global", "stage", "rank"]
Number = int | Fraction
Evaluator = Callable[[Mapping[str, Number]], dict[str, Number]]

LEVEL_ORDER: dict[str, int] = {"global": 0, "stage": 1, "rank": 2}


def ceil_sqrt(value: Number | float) -> int:
    """The smallest whole number at least the square root of a non-negative value, exactly for
    ints and Fractions (t with t² ≥ value > (t − 1)²): a standard deviation in whole rows."""
    if isinstance(value, float):
        return math.ceil(math.sqrt(value))
    ratio = Fraction(value)
    root = math.isqrt(ratio.numerator // ratio.denominator)
    while root * root * ratio.denominator < ratio.numerator:
        root += 1
    return root


FUNCTIONS: dict[str, Any] = {"ceiling": math.ceil, "floor": math.floor, "Min": min, "Max": max,
                             "ceil_sqrt": ceil_sqrt}
IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z_0-9]*\b")


_NON_WORD = re.compile(r"\W")


@cache
def ident(name: str) -> str:
    """The identifier a formula uses for a public name (`step.pp_activation.fwd.send_bytes`),
    once per name: every variant's book asks again for the same few hundred."""
    return _NON_WORD.sub("_", name)


@dataclass(frozen=True)
class Symbol:
    """An input of the formulas: one config dimension or one fact about a stage or a rank."""

    name: str
    doc: str
    level: Level = "global"


@dataclass(frozen=True)
class Quantity:
    """One named budget: its formula, unit, table category and a one-line meaning."""

    name: str
    formula: str
    unit: str
    category: str
    doc: str = ""
    level: Level = "global"
    refs: tuple[str, ...] = field(default=(), compare=False)
    ident: str = field(default="", compare=False)
    page: str = field(default="", compare=False)

    @property
    def expression(self) -> Any:
        """The sympy expression of this formula (over symbols named like the identifiers)."""
        return sympy_expression(self.formula)


class FormulaError(ValueError):
    """A formula references a name that is neither an input nor an earlier quantity."""


class Book:
    """Collects quantities in dependency order and checks every reference as it goes."""

    def __init__(self, symbols: Iterable[Symbol]) -> None:
        self.levels: dict[str, Level] = {s.name: s.level for s in symbols}
        self.quantities: list[Quantity] = []
        self.page = ""  # the formula-book page now writing (planner/budget/book.py)

    def add(self, name: str, formula: str, unit: str, category: str, doc: str = "") -> str:
        refs = formula_refs(formula)
        missing = [r for r in refs if r not in self.levels]
        if missing:
            raise FormulaError(f"{name} = {formula}: unknown {', '.join(missing)}")
        key = ident(name)
        if key in self.levels:
            raise FormulaError(f"{name} is defined twice")
        level = max((self.levels[r] for r in refs), key=LEVEL_ORDER.__getitem__, default="global")
        self.levels[key] = level
        self.quantities.append(_quantity(name, formula, unit, category, doc, level, self.page))
        return key


@cache
def formula_refs(formula: str) -> tuple[str, ...]:
    """The names a formula reads, in order of first use (once per formula text)."""
    return tuple(dict.fromkeys(r for r in IDENTIFIER.findall(formula) if r not in FUNCTIONS))


@cache
def _quantity(name: str, formula: str, unit: str, category: str, doc: str, level: Level,
              page: str) -> Quantity:
    """One Quantity per distinct definition: variants' books share most of theirs."""
    return Quantity(name, formula, unit, category, doc, level, formula_refs(formula), ident(name),
                    page)


@cache
def sympy_expression(formula: str) -> Any:
    """Parse the formula with sympy; every identifier becomes a plain Symbol (E is not Euler's e)."""
    import sympy

    names = {n: sympy.Symbol(n) for n in IDENTIFIER.findall(formula) if n not in FUNCTIONS}
    names.update(ceiling=sympy.ceiling, floor=sympy.floor, Min=sympy.Min, Max=sympy.Max,
                 ceil_sqrt=lambda x: sympy.ceiling(sympy.sqrt(x)))
    return sympy.sympify(formula, locals=names)


def _div(a: Number, b: Number) -> Number:
    """Exact division: an int when it divides, a Fraction otherwise (ZeroDivisionError on 0)."""
    if type(a) is int and type(b) is int:
        q, r = divmod(a, b)
        return q if r == 0 else Fraction(a, b)
    return normalize(Fraction(a) / b)


def normalize(value: Number | float) -> Number:
    """Integers stay int, other rationals stay Fraction; a float would be a bug in a formula."""
    if type(value) is int:
        return value
    if isinstance(value, float):
        raise TypeError(f"inexact value {value!r}: formulas must stay rational")
    if isinstance(value, Fraction) and value.denominator == 1:
        return int(value.numerator)
    return value


class _ExactDivision(ast.NodeTransformer):
    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Div):
            name = ast.copy_location(ast.Name("_div", ast.Load()), node)
            return ast.copy_location(ast.Call(name, [node.left, node.right], []), node)
        return node


def compile_quantities(quantities: tuple[Quantity, ...], exact: bool = True) -> Evaluator:
    """One Python function evaluating `quantities` in order from an environment of inputs.

    The whole level is parsed and compiled at once (one `compile` instead of one per formula);
    every `/` in it becomes an exact `_div`. With `exact=False` the inputs are turned into floats
    and `/` stays a float division (for ranking many candidates fast; never for a printed
    budget). Equal formula texts compile once, whichever variant's book they come from, and
    the compiled function is kept on disk for later runs (planner/budget/code_cache.py).
    """
    return _compile(tuple((q.ident, q.formula, q.refs) for q in quantities), exact)


@cache
def _compile(formulas: tuple[tuple[str, str, tuple[str, ...]], ...], exact: bool) -> Evaluator:
    defined = {key for key, _, _ in formulas}
    inputs = sorted({r for _, _, refs in formulas for r in refs} - defined)
    lines = ["def _evaluate(env):"]
    cast = "" if exact else "_float"
    lines += [f"    {name} = {cast}(env[{name!r}])" for name in inputs]
    if exact:
        lines += [f"    {key} = _norm({_exact_text(formula)})" for key, formula, _ in formulas]
    else:
        lines += [f"    {key} = ({formula})" for key, formula, _ in formulas]
    lines.append("    return {" + ", ".join(f"{key!r}: {key}" for key, _, _ in formulas) + "}")
    scope: dict[str, Any] = {"__builtins__": {}, "_div": _div, "_norm": normalize, "_float": float,
                             **FUNCTIONS}
    exec(compiled("\n".join(lines), "<budget formulas>"), scope)  # noqa: S102 - our own
    return scope["_evaluate"]


@cache
def _exact_text(formula: str) -> str:
    """The formula with every `/` an exact `_div` (once per formula text, whichever level or
    variant's book it is compiled in). Most formulas divide nothing and go in as written, unparsed:
    two thirds of the book, half the cost of compiling it."""
    if "/" not in formula:
        return formula
    return ast.unparse(_ExactDivision().visit(ast.parse(formula, mode="eval")))


def evaluate(quantities: Iterable[Quantity], env: dict[str, Number],
             exact: bool = True) -> dict[str, Number]:
    """Evaluate quantities in order into `env` (inputs already there); returns env for chaining."""
    env.update(compile_quantities(tuple(quantities), exact)(env))
    return env


def exact(value: Any) -> Number:
    """Turn a config number (int, float from YAML, bool) into an exact rational input."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    return _exact_float(float(value))


@lru_cache(maxsize=4096)
def _exact_float(value: float) -> Number:
    """The rational a float's shortest decimal text names (0.1 -> 1/10), remembered: configs
    repeat a handful of them (efficiencies, bandwidths) across thousands of candidates."""
    return normalize(Fraction(repr(value)))

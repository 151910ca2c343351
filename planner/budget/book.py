"""The formula book: the pages written in order, one cached book per variant.

A page is a module with `PAGE` (its name) and `write(book, variant)`; it may read the config
symbols and any name an earlier page (or itself, above) defined, never a later page's
(tests/unit/budget/test_budget_pages.py walks every variant to check). The order is the order a step is
reasoned about: layout → params → FLOPs → comm → memory → scaling → time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, cached_property
from operator import itemgetter
from types import ModuleType
from typing import Any

from planner.budget import comm, flops, layout, memory, params, scaling, time
from planner.budget.expr import Book, Evaluator, Number, Quantity, compile_quantities
from planner.budget.symbols import ALL_SYMBOLS
from planner.budget.variant import Variant
from planner.memo import Memo

PAGES: tuple[ModuleType, ...] = (layout, params, flops, comm, memory, scaling, time)


@dataclass(frozen=True, eq=False)
class FormulaBook:
    """The quantities of one variant, split by the level they depend on (global < stage < rank).

    Compared by identity (`formula_book` and `subset` are cached, so equal books are one object):
    hashing a thousand formulas per lookup would cost more than evaluating them."""

    quantities: tuple[Quantity, ...]
    _levels: dict[str, tuple[Quantity, ...]] = field(default_factory=dict, repr=False)
    _evaluators: dict[tuple[str, bool], Evaluator] = field(default_factory=dict, repr=False)

    @cached_property
    def reads(self) -> frozenset[str]:
        """Every name a formula of the book reads (symbols and other quantities)."""
        return frozenset(r for q in self.quantities for r in q.refs)

    @cached_property
    def by_name(self) -> dict[str, Quantity]:
        """Each quantity by its name, made once per book (Accounting looks one up per config)."""
        return {q.name: q for q in self.quantities}

    def at(self, level: str) -> tuple[Quantity, ...]:
        if level not in self._levels:
            self._levels[level] = tuple(q for q in self.quantities if q.level == level)
        return self._levels[level]

    def evaluator(self, level: str | None, exact: bool = True) -> Evaluator:
        """The compiled function of one level's quantities (None: all of them), made once."""
        key = (level or "", exact)
        if key not in self._evaluators:
            chosen = self.quantities if level is None else self.at(level)
            self._evaluators[key] = compile_quantities(chosen, exact)
        return self._evaluators[key]

    def subset(self, targets: tuple[str, ...]) -> FormulaBook:
        """Only what `targets` need, in the same order (for cheap memory checks)."""
        return _subset(self, targets)


@cache
def formula_book(variant: Variant) -> FormulaBook:
    """Build (once per variant) every formula, page by page."""
    book = Book(ALL_SYMBOLS)
    for page in PAGES:
        book.page = page.PAGE
        page.write(book, variant)
    return FormulaBook(tuple(book.quantities))


@cache
def _subset(book: FormulaBook, targets: tuple[str, ...]) -> FormulaBook:
    by_ident = {q.ident: q for q in book.quantities}
    needed: set[str] = set()
    stack = list(targets)
    while stack:
        key = stack.pop()
        if key in needed or key not in by_ident:
            continue
        needed.add(key)
        stack.extend(by_ident[key].refs)
    return FormulaBook(tuple(q for q in book.quantities if q.ident in needed))


_PICKERS: Memo[tuple[frozenset[str], tuple[str, ...]],
               tuple[tuple[str, ...], Callable[[dict[str, Number]], tuple[Any, ...]]]] = Memo(
    "read-items pickers", 4096)


def read_items(values: dict[str, Number], read: frozenset[str]) -> tuple[Any, ...]:
    """(names, values) of the entries of `values` named in `read` (a book's `reads`): what
    decides an evaluation of formulas reading `read`. The picker per key set is made once."""
    names = tuple(values)
    chosen, pick = _PICKERS.get((read, names), _picker, read, names)
    return chosen, pick(values)


def _picker(read: frozenset[str], names: tuple[str, ...],
            ) -> tuple[tuple[str, ...], Callable[[dict[str, Number]], tuple[Any, ...]]]:
    chosen = tuple(k for k in names if k in read)
    getter = itemgetter(*chosen) if len(chosen) > 1 else (
        (lambda v, k=chosen[0]: (v[k],)) if chosen else (lambda v: ()))
    return chosen, getter

"""The formula book reads like a book: each page uses only the config symbols and names defined on
its own page (above) or on earlier pages — layout → params → flops → comm → memory → scaling → time."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given, settings

from planner.accounting import (
    ALL_SYMBOLS,
    PAGES,
    PIPELINE_PAGE,
    FormulaBook,
    Quantity,
    Variant,
    formula_book,
    pipeline_page,
)
from planner.budget.layer_kinds import KINDS
from planner.budget.pipeline import PAGE_STAGE_INPUTS
from planner.config.loader import load_config
from planner.layout.pipeline import stage_split
from tests.support.paths import EXAMPLES
from tests.support.variant_strategy import variants

PAGE_ORDER = [page.PAGE for page in PAGES]
SYMBOLS = {s.name for s in ALL_SYMBOLS}


def later_page_reads(book: FormulaBook) -> list[str]:
    """Every `name (page) reads ref (later page)` in the book."""
    page_of = {q.ident: q.page for q in book.quantities}
    found = []
    for q in book.quantities:
        for ref in q.refs:
            if ref in SYMBOLS:
                continue
            if PAGE_ORDER.index(page_of[ref]) > PAGE_ORDER.index(q.page):
                found.append(f"{q.name} ({q.page}) reads {ref} ({page_of[ref]})")
    return found


def test_pages_are_in_the_documented_order() -> None:
    assert PAGE_ORDER == ["layout", "params", "flops", "comm", "memory", "scaling", "time"]


def test_every_quantity_is_written_by_a_page() -> None:
    from planner.accounting import variant_of

    for path in sorted(EXAMPLES.glob("*.yaml")):
        cfg = load_config(path)
        book = formula_book(variant_of(cfg, stage_split(cfg)))
        assert {q.page for q in book.quantities} == set(PAGE_ORDER), path.name


@settings(max_examples=100, deadline=None)
@given(variants())
def test_no_formula_reads_a_later_page(variant: Variant) -> None:
    assert later_page_reads(formula_book(variant)) == []


def test_the_walk_catches_a_later_page_read() -> None:
    """The checker is not vacuous: a layout formula reading a memory name is reported."""
    book = formula_book(next(iter(_example_variants())))
    memory = next(q for q in book.quantities if q.page == "memory")
    bad = Quantity("early", f"{memory.ident} + 1", "bytes", "layout", refs=(memory.ident,),
                   ident="early", page="layout")
    doctored = FormulaBook((*book.quantities, bad))
    assert later_page_reads(doctored) == [f"early (layout) reads {memory.ident} (memory)"]


def _example_variants() -> list[Variant]:
    from planner.accounting import variant_of

    return [variant_of(cfg, stage_split(cfg))
            for cfg in (load_config(p) for p in sorted(EXAMPLES.glob("*.yaml")))]


def test_the_pipeline_page_reads_only_the_time_page_and_its_own_names() -> None:
    """The pipeline page (planner/budget/pipeline.py), written per PP, stage and interleaving
    after the book's pages: it reads its chunk-time symbols, its own names above, and time-page
    results, nothing else."""
    chunk_time = re.compile(r"t_(first|last)_\d+")
    for variant in _example_variants():
        time_names = {q.ident for q in formula_book(variant).quantities if q.page == "time"}
        assert set(PAGE_STAGE_INPUTS) <= time_names
        for pp, stage, interleaved in ((1, 0, False), (4, 0, True), (4, 2, False), (8, 7, True)):
            own: set[str] = set()
            for q in pipeline_page(pp, stage, interleaved):
                assert q.page == PIPELINE_PAGE
                strays = [r for r in q.refs if r not in own and r not in PAGE_STAGE_INPUTS
                          and not chunk_time.fullmatch(r)]
                assert strays == [], (q.name, strays)
                own.add(q.ident)


@pytest.mark.parametrize("kind", [kind for kind in KINDS if not kind.unmodelled], ids=lambda kind: kind.name)
def test_every_layer_kind_builds_a_book_in_page_order(kind) -> None:
    """Each layer kind's variations of the formulas page's baseline (planner/budget/layer_kinds.py)
    build a book whose formulas read only earlier pages."""
    from planner.docs.formulas_page import baseline_variant

    base = baseline_variant()
    for _, changes in kind.variations or (("the baseline's own kind", {}),):
        variant = dataclasses.replace(base, **changes)
        assert kind.name in variant.kinds
        assert later_page_reads(formula_book(variant)) == [], kind.name


def test_an_unmodelled_kind_is_refused_not_counted_as_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record whose `unmodelled` says why is refused where every page reads the kinds."""
    from planner.budget import layer_kinds
    from planner.docs.formulas_page import baseline_variant

    unpriced = dataclasses.replace(layer_kinds.MAMBA, unmodelled="no figures for this kind")
    monkeypatch.setattr(layer_kinds, "KINDS", tuple(
        unpriced if kind is layer_kinds.MAMBA else kind for kind in layer_kinds.KINDS))
    mamba = dataclasses.replace(baseline_variant(), kinds=frozenset({"softmax", "mamba"}))
    with pytest.raises(ValueError, match="no figures for this kind"):
        layer_kinds.kinds_of(mamba)

"""The budget formulas, as a book of pages (see planner/budget/book.py for the order).

* `expr.py` — the engine: named formulas, exact evaluation; `explain.py` — formula → values → text.
* `symbols.py` — the inputs: config dimensions, stage and rank facts (`Holdings`), the structural
  `Variant`; `placement.py` — a rank's groups on nodes, the rank inputs.
* `collectives.py` — every collective once: group, algorithm per phase, routing, overlap flag (a
  leaf: it imports nothing of the book, so verify and the runtime may import it directly).
* pages, each reading only earlier pages: `layout.py` → `params.py` → `comm.py` → `memory.py` →
  `scaling.py` (FLOPs go between params and comm, time after scaling), then `pipeline.py`, the
  pipeline page across stages (bubble and step), written per PP and stage after the time page.
* `evaluate.py` — the evaluator (`Accounting`): one config's book, globals, then stages, then ranks.

Import from `planner.accounting`, the one entry the rest of moeplan uses
(tests/unit/test_import_cycles.py holds it).
"""

"""The budget formulas, as a book of pages (see planner/budget/book.py for the order).

* `expr.py` — the engine: named formulas, exact evaluation; `explain.py` — formula → values → text.
* `symbols.py` — the inputs: config dimensions, stage and rank facts, the structural `Variant`.
* `collectives.py` — every collective once: group, algorithm per phase, routing, overlap flag.
* pages, each reading only earlier pages: `layout.py` → `params.py` → `comm.py` → `memory.py` →
  `scaling.py` (FLOPs go between params and comm, time after scaling).

Import from `planner.accounting`, the one entry the rest of moeplan uses.
"""

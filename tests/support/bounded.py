"""One call of a reader under a stated time and memory bound, for the property tests that random
and adversarial input never hangs or over-allocates (tests/unit/files/test_reader_bounds.py,
tests/unit/config/test_shell_budgets.py)."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from typing import Any


def bounded_call(call: Callable[..., Any], *args: Any, seconds: float,
                 peak_bytes: int) -> Exception | None:
    """Run `call`, returning its exception (or None); assert it ended within `seconds` and that
    Python's own allocations (tracemalloc) peaked below `peak_bytes`."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        call(*args)
        error = None
    except Exception as exc:  # noqa: BLE001 - the property checks which type it is
        error = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.monotonic() - started < seconds
    assert peak < peak_bytes
    return error

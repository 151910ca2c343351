"""Small helpers that turn a failed divisibility into a concrete suggestion for the fix text."""

from __future__ import annotations

from collections.abc import Iterable

# Beyond this a divisor search would be slow; the fix text then just names the constraint.
_MAX_SEARCH = 10**7


def divisors(n: int) -> list[int]:
    """All positive divisors of n in ascending order (empty when n is out of reach)."""
    if n < 1 or n > _MAX_SEARCH:
        return []
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def nearest(candidates: Iterable[int], target: int, count: int = 3) -> list[int]:
    """The `count` candidates closest to target, listed in ascending order."""
    pool = sorted(set(candidates), key=lambda c: (abs(c - target), c))[:count]
    return sorted(pool)


def divisor_hint(n: int, target: int, count: int = 3) -> str:
    """', e.g. 32, 64, 128' — the divisors of n nearest to target, or '' when none are known."""
    near = nearest(divisors(n), target, count)
    return f", e.g. {', '.join(map(str, near))}" if near else ""


def multiple_hint(unit: int, target: int) -> str:
    """The multiples of unit just below and above target, for batch and world-size fixes."""
    below = (target // unit) * unit
    options = [m for m in (below, below + unit) if m > 0]
    return " or ".join(str(m) for m in options)


def join_values(values: Iterable[object]) -> str:
    return ", ".join(str(v) for v in values)

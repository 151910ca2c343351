"""Binary units for display: exact where the value allows it (330.75 MiB, 5.90625 GiB)."""

from __future__ import annotations

from fractions import Fraction

_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(value: int | Fraction, *, digits: int = 6) -> str:
    """Largest binary unit with value ≥ 1; up to `digits` decimals, trailing zeros dropped."""
    amount = Fraction(value)
    for name, size in _UNITS:
        if abs(amount) >= size:
            return f"{_trim(amount / size, digits)} {name}"
    return f"{_trim(amount, digits)} B"


def _trim(value: Fraction, digits: int) -> str:
    text = f"{float(value):.{digits}f}".rstrip("0").rstrip(".")
    return text or "0"

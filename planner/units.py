"""Binary units for display: exact where the value allows it (330.75 MiB, 5.90625 GiB)."""

from __future__ import annotations

import math
from fractions import Fraction

_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(value: int | Fraction, *, digits: int = 6) -> str:
    """Largest binary unit with value ≥ 1; up to `digits` decimals, trailing zeros dropped."""
    amount = Fraction(value)
    name, size = binary_unit(amount)
    return f"{_trim(amount / size, digits)} {name}"


def number_text(value: int | float | Fraction) -> str:
    """A formula value in exact digits: a fraction as numerator/denominator, never a rounded float."""
    if isinstance(value, Fraction):
        return f"{value.numerator}/{value.denominator}"
    return str(value)


def binary_unit(value: int | Fraction) -> tuple[str, int]:
    """The largest binary unit (name, size) in which `value` is at least 1; bytes below 1 KiB."""
    for name, size in _UNITS:
        if abs(value) >= size:
            return name, size
    return "B", 1


def in_unit(value: int | Fraction, size: int, *, digits: int = 3) -> str:
    """`value` counted in a unit of `size` bytes, trailing zeros dropped."""
    return _trim(Fraction(value) / size, digits)


def _trim(value: Fraction, digits: int) -> str:
    text = fixed(value, digits)
    return text if "e" in text else text.rstrip("0").rstrip(".") or "0"


def fixed(value: int | Fraction, digits: int) -> str:
    """`digits` decimals; a value beyond float range (only absurd configs reach one) in
    scientific notation instead of an OverflowError."""
    try:
        return f"{float(value):.{digits}f}"
    except OverflowError:
        magnitude = abs(Fraction(value))
        exponent = math.floor(math.log10(magnitude.numerator) - math.log10(magnitude.denominator))
        mantissa = float(magnitude / Fraction(10) ** exponent)
        return f"{'-' if value < 0 else ''}{mantissa:.{digits}f}e+{exponent}"

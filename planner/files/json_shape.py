"""Check decoded JSON against a declared shape before any code indexes into it.

A plan or report edited by hand (or by a fuzzer) can miss keys, carry a string where a count goes
or a list where an object goes; without this check each such file is a KeyError or TypeError deep
inside the reader. A shape is written as data: a type name (`int`, `number`, `str`, `bool`,
`null`, `any`), a tuple of alternatives, a dict for an object (a key ending in `?` is optional,
the key `*` gives the shape of every other key's value), or a one-element list for an array.
"""

from __future__ import annotations

from typing import Any

Shape = Any

_TYPES = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "any": lambda v: True,
}


class ShapeError(Exception):
    """The JSON does not have the declared shape; `where` is a JSON path such as $.ranks[3].rank."""

    def __init__(self, where: str, expected: str, found: Any) -> None:
        text = repr(found)
        shown = text if len(text) <= 40 else text[:37] + "..."
        super().__init__(f"{where}: expected {expected}, found {shown}")
        self.where, self.expected = where, expected


def describe(shape: Shape) -> str:
    if isinstance(shape, str):
        return {"int": "an integer", "number": "a number", "str": "a string", "bool": "true or false",
                "null": "null", "any": "a value"}[shape]
    if isinstance(shape, tuple):
        return " or ".join(describe(s) for s in shape)
    if isinstance(shape, list):
        return "an array"
    return "an object"


def _matches(value: Any, shape: Shape) -> bool:
    if isinstance(shape, str):
        return _TYPES[shape](value)
    if isinstance(shape, tuple):
        return any(_matches(value, s) for s in shape)
    if isinstance(shape, list):
        return isinstance(value, list)
    return isinstance(value, dict)


def check_shape(value: Any, shape: Shape, where: str = "$") -> None:
    """Raise ShapeError at the first place `value` departs from `shape` (depth is bounded by the
    reader, planner/files/json_input.py)."""
    if isinstance(shape, tuple):
        for option in shape:
            if _matches(value, option):
                check_shape(value, option, where)
                return
        raise ShapeError(where, describe(shape), value)
    if not _matches(value, shape):
        raise ShapeError(where, describe(shape), value)
    if isinstance(shape, list):
        for index, item in enumerate(value):
            check_shape(item, shape[0], f"{where}[{index}]")
    elif isinstance(shape, dict):
        for key, sub in shape.items():
            if key == "*":
                continue
            name = key.rstrip("?")
            if name in value:
                check_shape(value[name], sub, f"{where}.{name}")
            elif not key.endswith("?"):
                raise ShapeError(f"{where}.{name}", f"{describe(sub)} (a required key)", "nothing")
        if "*" in shape:
            named = {key.rstrip("?") for key in shape}
            for name, item in value.items():
                if name not in named:
                    check_shape(item, shape["*"], f"{where}.{name}")

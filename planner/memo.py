"""Bounded memos: the one way moeplan remembers a pure function's results between calls.

`moeplan search` asks for the same pipeline split, stage counts, rank placement and grid thousands
of times (every knob setting of one layout shares them), so those are remembered. Every memo has
the same policy: at most `maxsize` entries, the oldest entry dropped when a new one would exceed
it, keyed on hashable *values* (never `id()`: an equal config built anew hits, and nothing is kept
alive to stop an id being reused). `clear_memos()` empties them all (tests that count work do).

A config section is a frozen pydantic model but not hashable (its list fields); `section_key`
gives the value to key it on.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
F = TypeVar("F", bound=Callable[..., Any])

_MISSING: Any = object()
_MEMOS: list[Memo[Any, Any]] = []


class Memo(Generic[K, V]):
    """A bounded map of key to computed value; the oldest entry goes first when it is full."""

    __slots__ = ("name", "maxsize", "_entries")

    def __init__(self, name: str, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"memo {name}: maxsize must be at least 1, not {maxsize}")
        self.name, self.maxsize = name, maxsize
        self._entries: dict[K, V] = {}
        _MEMOS.append(self)

    def get(self, key: K, make: Callable[..., V], *args: Any) -> V:
        """The value remembered for `key`, or `make(*args)` remembered under it."""
        value = self._entries.get(key, _MISSING)
        if value is _MISSING:
            value = make(*args)
            self.put(key, value)
        return value

    def put(self, key: K, value: V) -> None:
        entries = self._entries
        if len(entries) >= self.maxsize and key not in entries:
            del entries[next(iter(entries))]  # dicts keep insertion order: the oldest
        entries[key] = value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def memoized(maxsize: int) -> Callable[[F], F]:
    """A function of hashable arguments, remembered in a `Memo` by its positional arguments."""

    def wrap(function: F) -> F:
        memo: Memo[tuple[Any, ...], Any] = Memo(f"{function.__module__}.{function.__qualname__}",
                                               maxsize)

        def remembered(*args: Any) -> Any:
            value = memo._entries.get(args, _MISSING)
            if value is _MISSING:
                value = function(*args)
                memo.put(args, value)
            return value

        remembered.__doc__, remembered.__name__ = function.__doc__, function.__name__
        remembered.__qualname__, remembered.__wrapped__ = function.__qualname__, function  # type: ignore[attr-defined]
        remembered.memo = memo  # type: ignore[attr-defined]
        return remembered  # type: ignore[return-value]

    return wrap


def memos() -> tuple[Memo[Any, Any], ...]:
    """Every memo made so far (each module makes its own at import)."""
    return tuple(_MEMOS)


def clear_memos() -> None:
    """Forget everything every memo remembers."""
    for memo in _MEMOS:
        memo.clear()


def section_key(section: BaseModel) -> tuple[Any, ...]:
    """A config section's field values as a hashable tuple (list fields as tuples): what a memo
    keys on for results that read the section. Sections are frozen, so the key stays true. (A
    list comprehension over `__dict__`: a few microseconds, paid once per lookup.)"""
    return (type(section), *[_frozen(v) if type(v) is list or type(v) is dict else v
                             for v in section.__dict__.values()])


def _frozen(value: Any) -> Any:
    """A list field as a tuple, a dict field as a tuple of its items (the schema's containers
    hold scalars; a nested one would fail loudly as unhashable)."""
    return tuple(value.items()) if type(value) is dict else tuple(value)

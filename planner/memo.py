"""Bounded memos: how moeplan remembers results computed from a config between calls.

`moeplan search` asks for the same pipeline split, stage counts, rank placement and grid thousands
of times (every knob setting of one layout shares them), so those are remembered. Every memo has
the same policy: at most `maxsize` entries, the oldest entry dropped when a new one would exceed
it, keyed on hashable *values* (never `id()`: an equal config built anew hits, and nothing is kept
alive to stop an id being reused). `clear_memos()` empties them all (tests that count work do).

Pure functions of small frozen arguments keep functools' `cache`/`lru_cache` instead (the tables
read from planner/config/data/, the formulas planner/budget/expr.py compiles, the rank arithmetic
of planner/layout/): their results never go stale, so nothing needs to clear them.

A config section is a frozen pydantic model but not hashable (its list fields); `section_key`
gives the value to key it on. `HeldByIdentity` is the one exception to keying on values: a few
recent objects held with their values, for a caller asking about the very same frozen object.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

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

    def get_or_raise(self, key: K, make: Callable[..., V], *args: Any,
                     errors: tuple[type[Exception], ...]) -> V:
        """As `get`, remembering a failure too: `make` raising one of `errors` is remembered, and
        asking for the same key raises the same error again without calling `make`."""
        value: Any = self._entries.get(key, _MISSING)
        if value is _MISSING:
            try:
                value = make(*args)
            except errors as exc:
                value = exc
            self.put(key, value)
        if isinstance(value, errors):
            raise value
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


def memos() -> tuple[Memo[Any, Any], ...]:
    """Every memo made so far (each module makes its own at import)."""
    return tuple(_MEMOS)


def clear_memos() -> None:
    """Forget everything every memo remembers."""
    for memo in _MEMOS:
        memo.clear()


class HashedOnce:
    """A tuple of values that hashes once: for keys looked up many times whose hash is slow (many
    fields, Fractions), e.g. a section's key or a rank's placement values."""

    __slots__ = ("items", "_hash")

    def __init__(self, items: tuple[Any, ...]) -> None:
        self.items, self._hash = items, hash(items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, HashedOnce) and self._hash == other._hash
                                 and self.items == other.items)


class HeldByIdentity(Generic[V]):
    """The values made for the last few objects, kept with the objects and matched by identity:
    for a caller that asks again and again about the same frozen object (a config, a config
    section), where even keying by value costs what the lookup should save. Holding an object
    keeps its identity from being reused while its value is kept."""

    __slots__ = ("kept", "_held")

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self._held: list[tuple[Any, V]] = []

    def get(self, obj: Any, make: Callable[[Any], V]) -> V:
        """The value made for `obj` while it is among the last `kept` asked for, else `make(obj)`."""
        for held, value in self._held:
            if held is obj:
                return value
        value = make(obj)
        self._held.insert(0, (obj, value))
        del self._held[self.kept:]
        return value


def section_key(section: BaseModel) -> HashedOnce:
    """A config section's field values, hashable (list fields as tuples): what a memo keys on for
    results that read the section. Sections are frozen, so the key stays true.

    Making it reads every field (a few microseconds), so the last few sections' keys are kept
    with the sections themselves (search's candidates share the user's model section and ask tens
    of thousands of times, between asking for their own parallel section's)."""
    return _SECTION_KEYS.get(section, _section_key)


def _section_key(section: BaseModel) -> HashedOnce:
    return HashedOnce((type(section), *[_frozen(v) if type(v) is list or type(v) is dict else v
                                        for v in section.__dict__.values()]))


_SECTION_KEYS: HeldByIdentity[HashedOnce] = HeldByIdentity(4)


def _frozen(value: Any) -> Any:
    """A list field as a tuple, a dict field as a tuple of its items (the schema's containers
    hold scalars; a nested one would fail loudly as unhashable)."""
    return tuple(value.items()) if type(value) is dict else tuple(value)

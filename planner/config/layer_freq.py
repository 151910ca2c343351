"""Megatron's list-expression strings (`--moe-layer-freq "([0]*3+[1]*58)"`), evaluated without eval.

Megatron accepts an int, an int as a string, or a string of digits, commas, brackets, parentheses,
`+` and `*` that Python evaluates to a list (Megatron-LM dev@d48bd6be megatron/training/arguments.py
moe_freq_type, _eval_pattern). This module parses exactly that grammar:

    expr   := term ('+' term)*
    term   := atom ('*' atom)*
    atom   := INT | '[' [expr (',' expr)*] ']' | '(' expr ')'

where `+` adds ints or concatenates lists and `*` multiplies ints or repeats a list.
"""

from __future__ import annotations

import re

from pydantic_core import PydanticCustomError

MAX_PATTERN_ITEMS = 1_000_000  # bounds `[0]*N`; far above any real layer count
# Bounds on the work, not only the result: an int beyond 64 bits (Megatron's sizes end in 64-bit
# tensors) and the items all `+` and `*` together build, so `[1]*1000000*1*1*…` of a few MB or a
# product of thousands of large numbers is refused in linear time instead of copied a million
# times over or multiplied into a number of thousands of digits.
MAX_INT = 2**63 - 1
MAX_WORK_ITEMS = 4 * MAX_PATTERN_ITEMS
MAX_DIGITS = 19
MAX_TEXT = 1 << 20  # characters: an explicit 0/1 list of MAX_LAYERS layers is ~200 KB
_TOKENS = re.compile(r"\s*(\d+|[\[\](),+*])")

Value = int | list


class PatternError(ValueError):
    """The string is not a list expression Megatron would accept."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos = 0
        text = text.rstrip()
        if len(text) > MAX_TEXT:
            raise PatternError(f"{len(text):,} characters, more than the {MAX_TEXT:,} a pattern "
                               "of every layer needs")
        while pos < len(text):
            match = _TOKENS.match(text, pos)
            if match is None:
                raise PatternError(f"unexpected {text[pos]!r} at {pos}")
            self.tokens.append(match.group(1))
            pos = match.end()
        self.pos = 0
        self.work = 0

    def built(self, items: list) -> list:
        """Count the items a step built against the work budget."""
        self.work += len(items)
        if len(items) > MAX_PATTERN_ITEMS or self.work > MAX_WORK_ITEMS:
            raise PatternError(f"expands beyond {MAX_PATTERN_ITEMS} items")
        return items

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise PatternError(f"expected {expected or 'a value'}, got {token or 'the end'}")
        self.pos += 1
        return token

    def expr(self) -> Value:
        value = self.term()
        while self.peek() == "+":
            self.take()
            value = self._checked(_add(value, self.term()))
        return value

    def term(self) -> Value:
        value = self.atom()
        while self.peek() == "*":
            self.take()
            value = self._checked(_mul(value, self.atom()))
        return value

    def atom(self) -> Value:
        token = self.take()
        if token.isdigit():
            if len(token.lstrip("0")) > MAX_DIGITS:
                raise PatternError(f"{token[:20]}… is beyond the 64-bit range")
            return self._checked(int(token))
        if token == "(":
            value = self.expr()
            self.take(")")
            return value
        if token == "[":
            items: list = []
            while self.peek() != "]":
                items.append(self.expr())
                if self.peek() != ",":
                    break
                self.take(",")
            self.take("]")
            return items
        raise PatternError(f"unexpected {token!r}")

    def _checked(self, value: Value) -> Value:
        if isinstance(value, int):
            if value > MAX_INT:
                raise PatternError(f"a number beyond the 64-bit range ({MAX_INT})")
            return value
        return self.built(value)


def _add(left: Value, right: Value) -> Value:
    if isinstance(left, int) and isinstance(right, int):
        return left + right
    if isinstance(left, list) and isinstance(right, list):
        return _bounded(left + right)
    raise PatternError("'+' joins two lists or two numbers")


def _mul(left: Value, right: Value) -> Value:
    if isinstance(left, int) and isinstance(right, int):
        return left * right
    items, count = (left, right) if isinstance(left, list) else (right, left)
    if not isinstance(items, list) or not isinstance(count, int):
        raise PatternError("'*' repeats a list a number of times")
    if len(items) * count > MAX_PATTERN_ITEMS:
        raise PatternError(f"expands beyond {MAX_PATTERN_ITEMS} items")
    return items * count  # the parser counts the copy against its work budget


def _bounded(items: list) -> list:
    if len(items) > MAX_PATTERN_ITEMS:
        raise PatternError(f"expands beyond {MAX_PATTERN_ITEMS} items")
    return items


def evaluate_pattern(text: str) -> Value:
    """The value of a Megatron list expression; PatternError when it is not one."""
    parser = _Parser(text)
    try:
        value = parser.expr()
    except RecursionError:
        raise PatternError("nested too deeply") from None
    if parser.peek() is not None:
        raise PatternError(f"unexpected {parser.peek()!r} after the expression")
    return value


def parse_layer_freq(text: str) -> Value:
    """`moe_layer_freq` from Megatron's string form: "N" is the int N, anything else must evaluate
    to a flat list of 0/1 (a pydantic error naming the problem otherwise)."""
    try:
        value = evaluate_pattern(text)
    except PatternError as exc:
        raise PydanticCustomError(
            "layer_freq_pattern",
            "not a Megatron list expression ({why}); write an int, a 0/1 list or e.g. "
            "\"([0]*3+[1]*58)\"",
            {"why": str(exc)},
        ) from None
    if isinstance(value, list) and not all(isinstance(v, int) and not isinstance(v, bool)
                                           and v in (0, 1) for v in value):
        raise PydanticCustomError(
            "layer_freq_pattern",
            "must evaluate to a flat list of 0 (dense) and 1 (MoE)",
        )
    return value

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
_TOKENS = re.compile(r"\s*(\d+|[\[\](),+*])")

Value = int | list


class PatternError(ValueError):
    """The string is not a list expression Megatron would accept."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            match = _TOKENS.match(text, pos)
            if match is None:
                raise PatternError(f"unexpected {text[pos]!r} at {pos}")
            self.tokens.append(match.group(1))
            pos = match.end()
        self.pos = 0

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
            value = _add(value, self.term())
        return value

    def term(self) -> Value:
        value = self.atom()
        while self.peek() == "*":
            self.take()
            value = _mul(value, self.atom())
        return value

    def atom(self) -> Value:
        token = self.take()
        if token.isdigit():
            return int(token)
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
    return items * count


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

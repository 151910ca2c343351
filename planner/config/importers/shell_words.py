"""Shell words of a command line or argument file, in time linear in its length.

The words are exactly `shlex.split(text, comments=True, posix=True)`'s (the import corpora were
read with it), but shlex reads one character per Python call and grows each word a character at a time
(`self.token = self.token + nextchar`, a copy per character): a 3 MB word took minutes, 3 MB of
newlines seconds. Here a word or a gap between words is one regex match (a word's quoted strings
and escapes resolved only when it has any), so the cost is linear and mostly in C.
"""

from __future__ import annotations

import re

# shlex's posix rules with whitespace_split: ' \t\r\n' separate words; `#` outside quotes starts a
# comment that runs to the end of its line (mid-word too: it ends the word); `'…'` is literal;
# `"…"` keeps a backslash unless it escapes `"` or `\`; a bare backslash takes the next character.
# possessive: a comment never gives characters back to a word (and nothing backtracks)
_GAPS = r"(?:[ \t\r\n]++|\#[^\n]*+\n?)*+"
_WORD = r"""(?:[^ \t\r\n#'"\\]++|'[^']*+'|"[^"\\]*+(?:\\.[^"\\]*+)*+"|\\.)++"""
_NEXT = re.compile(f"{_GAPS}({_WORD})", re.DOTALL)  # the gaps before a word, and the word
_REST = re.compile(_GAPS, re.DOTALL)
_PART = re.compile(r"""'([^']*)'|"([^"\\]*(?:\\.[^"\\]*)*)"|\\(.)|([^'"\\]+)""", re.DOTALL)
_IN_DOUBLE = re.compile(r'\\(["\\])')
_OPEN_DOUBLE_ESCAPE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*\\', re.DOTALL)


def _resolved(word: str) -> str:
    """A word's text with its quotes and escapes resolved (findall leaves the others empty)."""
    return "".join(single or escaped or plain or (
        _IN_DOUBLE.sub(r"\1", double) if "\\" in double else double)
        for single, double, escaped, plain in _PART.findall(word))


def shell_words(text: str) -> list[str]:
    """The words; ValueError with shlex's own message for an open quote or a trailing `\\`."""
    words: list[str] = []
    position, end = 0, len(text)
    next_word = _NEXT.match
    while (match := next_word(text, position)) is not None:
        position = match.end()
        word = match.group(1)
        words.append(_resolved(word) if "'" in word or '"' in word or "\\" in word else word)
    position = _REST.match(text, position).end()  # type: ignore[union-attr]  # always matches
    if position != end:  # an opening quote with no closing one, or `\` at the very end
        rest = text[position]
        escape = rest == "\\" or (rest == '"' and _OPEN_DOUBLE_ESCAPE.fullmatch(text, position))
        raise ValueError("No escaped character" if escape else "No closing quotation")
    return words

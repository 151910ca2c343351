"""One jinja2 environment for every launch script, with the quoting filters the templates rely on.

Launch scripts are shell, not HTML: autoescape is off and every user-supplied string goes through
an explicit filter instead — `shquote` for shell words, `sbatch_quote` for `#SBATCH` directive
values (parsed by sbatch, not by bash) and `comment` for text inside `#` comments.
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from typing import Any

import jinja2

_SBATCH_SAFE = re.compile(r"[A-Za-z0-9_.,:/=%@+-]+")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")


def shquote(value: object) -> str:
    """One shell word that bash reads back as exactly `value`, whatever it contains."""
    return shlex.quote(str(value))


def sbatch_quote(value: object) -> str:
    """A value for an `#SBATCH` line, quoted the way sbatch's own directive parser reads it.

    sbatch (not bash) parses these lines: whitespace splits words, an unquoted `#` ends the line,
    single and double quotes group, and a backslash escapes the next character even inside
    quotes. Plain values stay bare so the directives read naturally; anything else is
    double-quoted with `\\` and `"` escaped. Control characters never reach here (see safety.py).
    """
    text = str(value)
    if _SBATCH_SAFE.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def comment(value: object) -> str:
    """Text that cannot leave the `#` comment it is written into: control characters are escaped."""
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("templates", ""),
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shquote"] = shquote
    env.filters["sbatch_quote"] = sbatch_quote
    env.filters["comment"] = comment
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)

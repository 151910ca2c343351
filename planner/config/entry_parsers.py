"""Entry scripts with a parser of their own: the arguments they add to Megatron-LM's.

Pai-Megatron-Patch's pretrain scripts pass `extra_args_provider=get_patch_args` to Megatron's
pretrain, and Megatron-LM's own pretrain_gpt.py passes ModelOpt's add_modelopt_args when
nvidia-modelopt is installed (megatron/training/arguments.py parse_args applies it). Such an
argument is no typo: the script as written starts. It is still refused by the parser `emit` writes
for, and may change the model, so `check` names the parser that has it and what it changes. The
classes are planner/config/data/entry_parser_arguments.txt, one section per parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatch
from functools import cache
from pathlib import Path

from planner.config.argument_classes import ArgumentClass, BadClassLine, parse_line

ENTRY_FILE = Path(__file__).parent / "data" / "entry_parser_arguments.txt"


@dataclass(frozen=True)
class EntryParser:
    """One entry script family's parser: who, where its parser is, which scripts use it."""

    key: str
    who: str
    source: str
    entries: tuple[str, ...]
    classes: dict[str, ArgumentClass] = field(default_factory=dict)

    def runs(self, entry: str) -> bool:
        return any(fnmatch(entry.rsplit("/", 1)[-1], pattern) for pattern in self.entries)


def _section(line: str) -> EntryParser:
    key, _, rest = line.partition("]")
    parts = [part.strip() for part in rest.split("|")]
    if len(parts) != 3 or not all(parts):
        raise BadClassLine(f"not '[id] who | source | entry globs': {line!r}")
    return EntryParser(key.removeprefix("[").strip(), parts[0], parts[1], tuple(parts[2].split()))


@cache
def entry_parsers() -> tuple[EntryParser, ...]:
    parsers: list[EntryParser] = []
    for line in ENTRY_FILE.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("["):
            parsers.append(_section(line))
        elif not parsers:
            raise BadClassLine(f"an argument before any [parser] section: {line!r}")
        else:
            entry = parse_line(line)
            parsers[-1].classes[entry.name] = entry
    return tuple(parsers)


def entry_argument(entry: str | None, name: str) -> tuple[EntryParser, ArgumentClass] | None:
    """The parser of entry script `entry` that adds argument `name`, and the argument's class."""
    if not entry:
        return None
    for parser in entry_parsers():
        if parser.runs(entry) and name in parser.classes:
            return parser, parser.classes[name]
    return None

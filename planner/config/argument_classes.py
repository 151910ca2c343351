"""What each Megatron-LM argument does to a plan: modelled, plan-neutral, or not modelled.

moeplan reads a Megatron launch line into fields where it models an argument and carries the rest
verbatim in `launch.megatron_extra_args`. Carrying an argument is only honest when it leaves the
counted model as it is (data, tokenizer, logging, checkpoints, the LR schedule, seeds); one that
changes the shapes, the memory or the step time must say so, or `check` would call a different
model valid. The class of every argument of Megatron-LM dev@d48bd6be's parser
(megatron/training/arguments.py add_megatron_arguments) is one line of
planner/config/data/megatron_argument_classes.txt, so modelling an argument later is a one-line flip.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

CLASSES_FILE = Path(__file__).parent / "data" / "megatron_argument_classes.txt"
# saving: lowers memory below what moeplan counts (its figures stay an upper bound) — a warning.
Kind = Literal["modelled", "neutral", "error", "warning", "saving"]
KINDS: tuple[Kind, ...] = ("modelled", "neutral", "error", "warning", "saving")
NOT_MODELLED: tuple[Kind, ...] = ("error", "warning", "saving")
_NEUTRAL_AS = "plan-neutral as "
# The last part of a line names the one parser that defines the argument, when only one does:
# `main-only` (Megatron-LM main@d98e8a64, not dev@d48bd6be, whose parser `emit` targets) or
# `dev-only`; `as NAME` is the other parser's spelling of the same argument.
Parser = Literal["", "main", "dev"]
_ONLY = re.compile(r"(main|dev)-only(?: as ([a-z0-9_]+))?")


class BadClassLine(ValueError):
    """A line of the classes file that does not read as `name | class | ...`."""


@dataclass(frozen=True)
class ArgumentClass:
    """One argument's class. `what` is the field (modelled), the topic (neutral) or what the
    argument changes (error / warning: parameters, memory, FLOPs, time, bytes); `how` says how;
    `neutral_values` are the values that leave the plan as moeplan counts it."""

    name: str
    kind: Kind
    what: str
    how: str = ""
    neutral_values: tuple[str, ...] = ()
    only: Parser = ""
    other_spelling: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def changes_plan(self, values: tuple[str, ...]) -> bool:
        """Whether passing the argument with `values` changes what moeplan computes."""
        if self.kind not in NOT_MODELLED:
            return False
        return not (values and self.neutral_values and values[0] in self.neutral_values)


def parse_line(line: str) -> ArgumentClass:
    parts = [part.strip() for part in line.split("|")]
    tag = _ONLY.fullmatch(parts[-1]) if len(parts) > 3 else None
    if tag is not None:
        parts = parts[:-1]
    if len(parts) < 3 or parts[1] not in KINDS or not parts[0] or not parts[2]:
        raise BadClassLine(f"not 'name | {'/'.join(KINDS)} | ...': {line!r}")
    name, kind, what, *rest = parts
    how = rest[0] if rest else ""
    neutral: tuple[str, ...] = ()
    if len(rest) > 1:
        if not rest[1].startswith(_NEUTRAL_AS):
            raise BadClassLine(f"the fifth part must start '{_NEUTRAL_AS}': {line!r}")
        neutral = tuple(v.strip() for v in rest[1].removeprefix(_NEUTRAL_AS).split(","))
    if kind in NOT_MODELLED and not how:
        raise BadClassLine(f"a not-modelled argument needs what it changes and how: {line!r}")
    only, other = (tag.group(1), tag.group(2) or "") if tag is not None else ("", "")
    return ArgumentClass(name, kind, what, how, neutral, only, other)  # type: ignore[arg-type]


@cache
def argument_classes() -> dict[str, ArgumentClass]:
    """Every classified argument by name (dashes as underscores)."""
    lines = CLASSES_FILE.read_text(encoding="utf-8").splitlines()
    entries = [parse_line(line) for line in lines if line.strip() and not line.startswith("#")]
    return {entry.name: entry for entry in entries}


def argument_class(name: str) -> ArgumentClass | None:
    """The class of Megatron argument `name` (`quick_geglu`), or None for no argument of the parser."""
    return argument_classes().get(name)


def modelled_field(name: str) -> str | None:
    """The field a modelled argument is read into (`section.field`), else None."""
    entry = argument_class(name)
    return entry.what if entry is not None and entry.kind == "modelled" else None


# Legacy (non-core) model switches (rule ARG004): Megatron-LM dev builds Megatron-Core models only
# and its parser has neither; `--moe-model-type deepspeed_moe` (the DeepSpeed / Pai-Megatron-Patch
# spelling) asks for a DeepSpeed-MoE layer. None: any value.
LEGACY_MODEL_SWITCHES: dict[str, str | None] = {"use_legacy_models": None, "moe_model_type": "deepspeed_moe"}


def is_legacy_model(name: str, values: tuple[str, ...]) -> bool:
    """Whether argument `name` with `values` asks for a legacy (non-core) model."""
    if name not in LEGACY_MODEL_SWITCHES:
        return False
    wanted = LEGACY_MODEL_SWITCHES[name]
    return wanted is None or values[:1] == (wanted,)


def argument_words(words: list[str] | tuple[str, ...]) -> list[tuple[int, str, tuple[str, ...]]]:
    """(index, name, values) of each `--flag` in a list of launch words, values up to the next flag;
    `--flag=value` is one word."""
    found: list[tuple[int, str, tuple[str, ...]]] = []
    for index, word in enumerate(words):
        if word.startswith("--") and len(word) > 2:
            flag, eq, value = word.partition("=")
            found.append((index, flag[2:].replace("-", "_"), (value,) if eq else ()))
        elif found:
            at, name, values = found[-1]
            found[-1] = (at, name, values + (word,))
    return found


DESTS_FILE = Path(__file__).parent / "data" / "megatron_dests.tsv"


@cache
def argument_arities() -> dict[str, tuple[str, str]]:
    """flag → (kind, nargs) of Megatron-LM dev's parser actions (megatron_dests.tsv: kind true /
    false for store_true / store_false, optional, or value; nargs '' for exactly one value)."""
    found: dict[str, tuple[str, str]] = {}
    for line in DESTS_FILE.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            _, flag, kind, nargs, _ = line.split("\t")
            found[flag] = (kind, nargs)
    return found

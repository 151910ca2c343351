"""CFG and IGN: how the config file itself can be wrong.

The CFG codes are emitted by the loader (planner/loader.py) before any rule runs; they are listed
here so that `moeplan rules CFG001` explains them like every other code. Their examples are whole
files. IGN001 checks the `ignore:` list against the catalog.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from planner.rules.base import Violation, documented, rule
from planner.rules.facts import Facts

LOADER = "planner/loader.py::parse_config"
_GOOD_FILE = """
model: {preset: deepseek-v4-flash}
parallel: {world_size: 128, ep: 64}
training: {seq_length: 4096}
"""

CONFIG_DOCS = (
    documented(
        "CFG001", "unknown key",
        source=LOADER,
        why="""Every section is closed: a misspelt key would otherwise be ignored silently and the
        default used instead. The finding suggests the closest known key.""",
        bad="""
        model: {preset: deepseek-v4-flash}
        parallel: {world_size: 128, ep: 64, tensor_parallel: 1}
        training: {seq_length: 4096}
        """,
        good=_GOOD_FILE,
    ),
    documented(
        "CFG002", "wrong type or value",
        source=LOADER,
        why="""Values are not coerced: "64" (a string) is not the integer 64 and `yes` is not a
        size. The finding names the expected type and the value found.""",
        bad="""
        model: {preset: deepseek-v4-flash}
        parallel: {world_size: 128, ep: "64"}
        training: {seq_length: 4096}
        """,
        good=_GOOD_FILE,
    ),
    documented(
        "CFG003", "required field missing",
        source=LOADER,
        why="""Some fields have no sensible default (the model's dimensions unless a preset gives
        them, the sequence length, a world size or a node count).""",
        bad="""
        model: {preset: deepseek-v4-flash}
        parallel: {world_size: 128, ep: 64}
        training: {micro_batch_size: 1}
        """,
        good=_GOOD_FILE,
    ),
    documented(
        "CFG004", "value out of range",
        source=LOADER,
        why="Sizes and degrees are positive (counts such as hash layers may be zero).",
        bad="""
        model: {preset: deepseek-v4-flash}
        parallel: {world_size: 128, ep: 0}
        training: {seq_length: 4096}
        """,
        good=_GOOD_FILE,
    ),
    documented(
        "CFG005", "empty file or not a mapping of sections",
        source=LOADER,
        why="""A config is a YAML mapping with the sections model, parallel, training (and the
        optional moe, overlap, cluster, launch, ignore).""",
        bad="# only a comment: the file is empty",
        good=_GOOD_FILE,
    ),
    documented(
        "CFG006", "duplicate key",
        source=LOADER,
        why="""YAML silently keeps the last of two equal keys, so one of the two values the author
        wrote is ignored without notice.""",
        bad="""
        model: {preset: deepseek-v4-flash}
        parallel:
          world_size: 128
          ep: 64
          ep: 32
        training: {seq_length: 4096}
        """,
        good=_GOOD_FILE,
    ),
)


@rule(
    "IGN001", "warning", "ignore lists only known rule codes",
    source="planner/rules/catalog.py::run_rules",
    why="""`ignore:` silences rule codes like a linter's noqa. A code that is not in the catalog
    (a typo, or a rule that was renamed) silences nothing, which is rarely what the author
    meant.""",
    bad="ignore: [PAR999]",
    good="ignore: [PAR012]",
)
def ignore_known_codes(f: Facts) -> Iterator[Violation]:
    from planner.rules.catalog import CODES  # the catalog imports this module

    for index, code in enumerate(f.cfg.ignore):
        if code.upper() not in CODES:
            close = difflib.get_close_matches(code.upper(), CODES, n=1)
            hint = f"did you mean {close[0]}?" if close else "see `moeplan rules` for the codes"
            yield Violation(f"ignore.{index}", f"unknown rule code '{code}' in ignore", hint)


RULES = (ignore_known_codes,)

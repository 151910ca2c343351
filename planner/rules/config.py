"""CFG and IGN: how the config file itself can be wrong.

The CFG codes are emitted by the loader (planner/config/loader.py) before any rule runs; they are listed
here so that `moeplan rules CFG001` explains them like every other code. Their examples are whole
files. IGN001 checks the `ignore:` list against the catalog; IGN002 refuses to silence the codes
that `UNIGNORABLE` names, with the reason it gives for each.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from collections.abc import Iterator

from planner.rules.base import SHOWN_PER_RULE, Rule, Violation, documented, rule
from planner.rules.facts import Facts

LOADER = "planner/config/loader.py::parse_config"
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
        default used instead. Fields carry Megatron-LM's argument names, so the finding first asks
        whether the key is one: a field of another section (move it), a Megatron argument moeplan
        models under another field (named), or one it does not model (pass it verbatim through
        launch.megatron_extra_args; Megatron-LM dev@d48bd6be megatron/training/arguments.py
        add_megatron_arguments lists them). Only a key that is no Megatron argument gets the
        closest known key of its section as a suggestion, so a real argument is never mistaken
        for a field of another meaning.""",
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
        why="""Sizes and degrees are positive (counts such as hash layers may be zero), every
        number is finite (`.inf` and `.nan` are rejected wherever a float is allowed) and fits in
        64 bits, and the counts moeplan lists one by one (layers, ranks, experts) stay below a
        ceiling far above any real job.""",
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
    documented(
        "CFG008", "YAML too big to read",
        source="planner/config/loader.py::parse_yaml",
        why="""Aliases repeat an anchored value wherever they appear, so a file of a few lines can
        stand for billions of values ("billion laughs"). The loader measures the composed YAML
        before building it: at most 2,500,000 nodes (MOEPLAN_YAML_MAX_NODES raises it), 1,000
        aliases, aliases nested 4 deep and 100,000 nodes that exist only through aliases; a
        recursive alias is refused too. A real config has a few hundred values.""",
        bad="""
        a0: &a0 [x]
        a1: &a1 [*a0, *a0]
        a2: &a2 [*a1, *a1]
        a3: &a3 [*a2, *a2]
        a4: &a4 [*a3, *a3]
        a5: [*a4, *a4]
        """,
        good=_GOOD_FILE,
    ),
    documented(
        "CFG007", "Hugging Face config.json cannot be mapped",
        source="planner/config/importers/hf_config.py::map_hf_config",
        why="""`model: {hf_config: PATH}` fills the model section from a Hugging Face config.json
        for the architectures moeplan can map (DeepSeek-V2/V3, Qwen2-MoE/Qwen3-MoE, Mixtral). An
        unknown architecture, a missing or mistyped key, or a feature moeplan cannot express
        (sliding-window attention, a non-SiLU MLP) is named instead of guessed; a key is not needed
        when the YAML writes the field it feeds.""",
        bad="""
        model: {hf_config: {architectures: [GPT2LMHeadModel]}}
        parallel: {world_size: 128, ep: 64}
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
    known = set(f.known_codes)
    unknown = [index for index, code in enumerate(f.ignore_codes) if code not in known]
    for count, index in enumerate(unknown):
        entry = f.cfg.ignore[index]
        shown = count < SHOWN_PER_RULE  # did-you-mean costs a millisecond: only for those shown
        close = difflib.get_close_matches(f.ignore_codes[index], f.known_codes, n=1) if shown else []
        hint = f"did you mean {close[0]}?" if close else "see `moeplan rules` for the codes"
        violation = Violation(f"ignore.{index}", f"unknown rule code '{entry}' in ignore", hint)
        yield violation
        if count == SHOWN_PER_RULE:
            # Past the shown ones Rule.findings only counts them (and names this first one): a
            # million unknown entries cost a million comparisons, not a million messages.
            yield from itertools.repeat(violation, len(unknown) - count - 1)
            return


_GRID = "the process groups cannot be built, so neither can the budgets, the plan or a launch"
_LOADER = "the loader reports it before `ignore:` is read; a config with it is not read at all"

# Errors that leave nothing for the later steps (groups, stage split, budgets, plan, emit) to
# build on: `ignore:` cannot silence them (IGN002 says so when it lists one).
UNIGNORABLE: dict[str, str] = {
    **{code: _LOADER for code in ("CFG001", "CFG002", "CFG003", "CFG004", "CFG005", "CFG006",
                                   "CFG008")},
    "PAR001": f"without whole dense groups (DP = N / (TP·CP·PP·GTP)) {_GRID}",
    "PAR002": f"without whole expert groups (EDP = N / (ETP·EP·PP·EGTP)) {_GRID}",
    "PAR009": f"the rank order is what the groups are read from: with an invalid order {_GRID}",
    "PAR010": f"Megatron stops building groups at this assertion: {_GRID}",
    "PAR011": f"the pipeline groups of the two layouts differ: {_GRID}",
    "PAR013": f"the hierarchical CP groups do not tile the CP group: {_GRID}",
    "PAR016": f"the hybrid / dynamic DP×CP chunks need an even DP·CP: {_GRID}",
    "DOP001": f"the distributed-optimizer instance groups do not tile DP·CP: {_GRID}",
    "DOP002": f"the distributed-optimizer instance groups do not tile EDP: {_GRID}",
    "GTP008": f"with GTP the optimizer instance groups are not defined: {_GRID}",
    "PIP001": "without a stage split no stage has layers: no per-stage budget, plan or launch",
}


def mark_unignorable(catalog: tuple[Rule, ...]) -> tuple[Rule, ...]:
    """The catalog with each UNIGNORABLE entry's reason on its rule (`moeplan rules` shows it)."""
    return tuple(dataclasses.replace(r, cannot_ignore=UNIGNORABLE[r.code]) if r.code in UNIGNORABLE
                 else r for r in catalog)


@rule(
    "IGN002", "warning", "structural errors cannot be ignored",
    source="planner/rules/catalog.py::run_rules",
    why="""Some errors leave nothing to build: without whole process groups or a stage split there
    are no budgets, no plan and no launch, whatever the author accepts. `ignore:` does not
    silence them — the error is still reported and the config stays invalid — and the entry says
    why. The loader's CFG codes come before `ignore:` is read, so listing one silences nothing.""",
    bad="ignore: [PAR001]",
    good="ignore: [PAR012]",
)
def ignore_structural_codes(f: Facts) -> Iterator[Violation]:
    for index, code in enumerate(f.ignore_codes):
        if code in UNIGNORABLE:
            yield Violation(f"ignore.{index}", f"{code} cannot be ignored: {UNIGNORABLE[code]}",
                            f"remove it from ignore; fix the {code} error if one is reported")


RULES = (ignore_known_codes, ignore_structural_codes)

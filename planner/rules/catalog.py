"""The catalog: every rule unit in one declarative list, and the runner that applies `ignore:`."""

from __future__ import annotations

import difflib

from planner.config.schema import Config
from planner.findings import Finding
from planner.rules import (
    ahead,
    architectures,
    arguments,
    batch,
    cluster,
    config,
    distopt,
    drops,
    flex_backends,
    gtp,
    memory,
    moe,
    offload,
    overlap,
    packing,
    parallel,
    pipeline,
    v4,
    versions,
    virtual_experts,
)
from planner.rules.base import Rule, code_of
from planner.rules.facts import Facts

CATALOG: tuple[Rule, ...] = config.mark_unignorable((
    *config.CONFIG_DOCS,
    *parallel.RULES,
    *batch.RULES,
    *packing.RULES,
    *pipeline.RULES,
    *v4.RULES,
    *ahead.RULES,
    *moe.RULES,
    *flex_backends.RULES,
    *drops.RULES,
    *overlap.RULES,
    *gtp.RULES,
    *distopt.RULES,
    *virtual_experts.RULES,
    *architectures.RULES,
    *cluster.RULES,
    *memory.RULES,
    *offload.RULES,
    *arguments.RULES,
    *versions.RULES,
    *config.RULES,
))
RULES_BY_CODE: dict[str, Rule] = {r.code: r for r in CATALOG}
# The rules that judge a figure of the formula book (the per-stage memory, NCCL EP's receive rows
# against the busiest rank's): they say whether a layout fits, not whether Megatron builds it.
# `moeplan groups` runs the catalog without them, so it never loads the book.
READS_BUDGET: frozenset[str] = frozenset(
    (*(r.code for r in memory.RULES), flex_backends.ncclep_capacity_holds_the_hot_rank.code))
CODES: tuple[str, ...] = tuple(RULES_BY_CODE)
_ERROR_RULES: tuple[Rule, ...] = tuple(entry for entry in CATALOG if entry.severity == "error")


def find_rule(code: str) -> Rule | None:
    """Look a code up case-insensitively (`par001` finds PAR001)."""
    return RULES_BY_CODE.get(code_of(code))


def suggest_codes(code: str, count: int = 3) -> list[str]:
    """The catalog codes closest to a mistyped one: codes it is a prefix of, else the most similar."""
    wanted = code_of(code)
    extending = [c for c in CODES if wanted and c.startswith(wanted)]
    return extending[:count] or difflib.get_close_matches(wanted, CODES, n=count)


def run_rules(cfg: Config, *, facts: Facts | None = None, budget: bool = True,
              errors_only: bool = False) -> list[Finding]:
    """Every checked rule on one config, in catalog order, minus the ignorable codes in
    `cfg.ignore` (IGN002 reports the others). `facts` lets a caller (`moeplan search`) read the
    facts the rules computed, such as the per-stage memory, afterwards. `budget=False` leaves out
    the rules in READS_BUDGET (whether the layout fits memory), for a caller that asks only
    whether Megatron builds the layout. `errors_only` runs only the rules of severity error (a
    finding takes its rule's severity), for a caller that judges by errors alone (`moeplan
    search`, thousands of candidates)."""
    facts = facts or Facts(cfg, known_codes=CODES)
    ignored = set(facts.ignore_codes)
    left_out = frozenset() if budget else READS_BUDGET
    findings: list[Finding] = []
    for entry in _ERROR_RULES if errors_only else CATALOG:
        if entry.code not in left_out and (entry.code not in ignored or entry.cannot_ignore):
            findings.extend(entry.findings(facts))
    return findings

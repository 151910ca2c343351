"""What one rule is: a small unit that owns its code, documentation, examples and check.

The design follows ruff's "Violation" registry: the message and fix of a rule live next to the
logic that detects it, and the catalog is a plain declarative list of these units.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from textwrap import dedent

from planner.findings import Finding, Severity
from planner.rules.facts import Facts, NotComputable
from planner.rules.facts import code_of as code_of  # re-exported: the rules import it from here


@dataclass(frozen=True)
class Violation:
    """One concrete problem found by a check: where, what (with the actual values), how to fix."""

    path: str
    message: str
    fix: str


CheckFn = Callable[["Facts"], Iterable[Violation]]

# Findings one rule reports in full; the rest are counted in one more finding. A config with a
# million-entry `ignore:` list is judged in linear time and printed in a screenful.
SHOWN_PER_RULE = 50


@dataclass(frozen=True)
class Rule:
    """A catalog entry. `check` is None for documentation-only entries (the loader's CFG codes).

    `bad` and `good` are YAML snippets. For checked rules they are overlays merged onto
    `planner.rules.example_base.EXAMPLE_BASE`; for documentation-only entries they are whole
    files (`whole_file_examples`). The tests run both, so an entry without working examples fails.
    `cannot_ignore` says why `ignore:` may not silence the code (empty: it may): the loader's codes
    come before `ignore:` is read, and the structural errors break what the later steps build.
    """

    code: str
    severity: Severity
    title: str
    source: str
    why: str
    bad: str
    good: str
    check: CheckFn | None = None
    whole_file_examples: bool = False
    cannot_ignore: str = ""

    @property
    def family(self) -> str:
        """The code without its three-digit number: PAR001 → PAR, V4001 → V4."""
        return self.code[:-3]

    def findings(self, facts: Facts) -> list[Finding]:
        """Run the check; a rule whose inputs are fractional has nothing to say (never a crash)."""
        if self.check is None:
            return []
        shown: list[Finding] = []
        more, first_more = 0, ""
        try:
            for v in self.check(facts):
                if len(shown) < SHOWN_PER_RULE:
                    shown.append(Finding(self.code, self.severity, v.path, v.message, v.fix, self.source))
                else:
                    more, first_more = more + 1, first_more or v.path
        except NotComputable:
            return []
        if more:
            shown.append(Finding(self.code, self.severity, first_more,
                                 f"and {more:,} more {self.code} finding(s) like the {SHOWN_PER_RULE} "
                                 "above, from here on", "fix the ones shown first, then rerun",
                                 self.source))
        return shown

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "severity": self.severity, "title": self.title,
                "source": self.source, "why": self.why, "bad": self.bad, "good": self.good,
                "checked_by": "loader" if self.check is None else "rules",
                "ignorable": not self.cannot_ignore, "cannot_ignore": self.cannot_ignore}


def _text(block: str) -> str:
    return dedent(block).strip("\n").rstrip()


def rule(code: str, severity: Severity, title: str, *, source: str, why: str, bad: str,
         good: str) -> Callable[[CheckFn], Rule]:
    """Turn a check function into a catalog entry carrying its documentation and examples."""

    def wrap(check: CheckFn) -> Rule:
        return Rule(code, severity, title, source, " ".join(_text(why).split()), _text(bad),
                    _text(good), check)

    return wrap


def documented(code: str, title: str, *, source: str, why: str, bad: str, good: str) -> Rule:
    """A documentation-only entry for a code that another component (the loader) emits."""
    return Rule(code, "error", title, source, " ".join(_text(why).split()), _text(bad), _text(good),
                None, whole_file_examples=True)

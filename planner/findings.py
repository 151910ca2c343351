"""Findings: the one shape every problem report takes, from YAML errors to memory budgets."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    """One violated constraint: stable code, where it is, what is wrong, how to fix it, who says so."""

    code: str
    severity: Severity
    path: str
    message: str
    fix: str
    source: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def line(self) -> str:
        return f"{self.code} {self.severity} {self.path}: {self.message} ({self.fix})"


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then infos; stable inside a severity."""
    return sorted(findings, key=lambda f: SEVERITY_ORDER[f.severity])


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)

"""The rule catalog `moeplan check` runs: one small unit per rule (code, severity, title, source,
why, bad/good example, check), grouped by family — PAR grids and order, BAT batch, PIP pipeline
split, V4 DeepSeek-V4, MOE dispatcher/router, OVL overlaps, GTP, DOP distributed optimizer, VEX
virtual experts, CLU cluster, MEM memory, IGN the ignore list, CFG the loader's schema errors.
"""

from __future__ import annotations

from planner.rules.base import Rule, Violation
from planner.rules.catalog import CATALOG, CODES, find_rule, run_rules, suggest_codes

__all__ = ["CATALOG", "CODES", "Rule", "Violation", "find_rule", "run_rules", "suggest_codes"]

"""`ignore:` cannot silence the errors the later steps need (IGN002), and says why.

Ignoring PAR001 used to make `check` pass and `emit` crash: the structural codes now still report,
the ignore entry itself is a warning that names the reason, and the catalog shows which codes are
not ignorable.
"""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app
from planner.config.loader import parse_config
from planner.findings import has_errors
from planner.layout.pipeline import SplitError, stage_split
from planner.layout.spec import grid_spec_from_config, layout_problems
from planner.rules import CATALOG, CODES, find_rule, run_rules
from planner.rules.config import UNIGNORABLE
from planner.rules.example_base import example_config_data

runner = CliRunner()


def findings(overlay: str) -> list[tuple[str, str, str]]:
    return [(f.code, f.severity, f.path) for f in run_rules(parse_config(example_config_data(overlay)))]


def test_every_unignorable_code_is_in_the_catalog_and_marked_there():
    assert set(UNIGNORABLE) <= set(CODES)
    assert {r.code for r in CATALOG if r.cannot_ignore} == set(UNIGNORABLE)
    assert {"PAR001", "PAR002", "PIP001", "CFG004"} <= set(UNIGNORABLE)
    assert all(r.severity == "error" for r in CATALOG if r.cannot_ignore)
    assert not find_rule("PAR012").cannot_ignore and not find_rule("MEM001").cannot_ignore


@pytest.mark.parametrize("code", sorted(c for c in UNIGNORABLE if not c.startswith("CFG")))
def test_each_unignorable_rule_breaks_the_groups_or_the_split(code):
    """Why these codes: on each one's bad example the grid or the stage split cannot be built."""
    cfg = parse_config(example_config_data(find_rule(code).bad))
    try:
        stage_split(cfg)
        split_fails = False
    except SplitError:
        split_fails = True
    assert split_fails or layout_problems(grid_spec_from_config(cfg))


def _breaks_the_groups_or_the_split(cfg) -> bool:
    try:
        stage_split(cfg)
    except SplitError:
        return True
    return bool(layout_problems(grid_spec_from_config(cfg)))


@pytest.mark.parametrize("code", sorted(r.code for r in CATALOG
                                        if r.check is not None and r.code not in UNIGNORABLE))
def test_no_ignorable_rule_hides_a_layout_that_cannot_be_built(code):
    """The converse: if ignoring a rule would let a config through whose groups or stage split
    cannot be built (emit and compile would then fail), the rule must be unignorable."""
    cfg = parse_config(example_config_data(find_rule(code).bad))
    broken = _breaks_the_groups_or_the_split(cfg)
    assert not broken or has_errors([f for f in run_rules(cfg) if f.code != code]), (
        f"{code}'s bad example cannot be built and no other error reports it: add {code} to "
        "UNIGNORABLE in planner/rules/config.py")


@pytest.mark.parametrize("overlay,code", [
    ("parallel: {world_size: 7}", "PAR001"),
    ("parallel: {ep: 8, world_size: 12}", "PAR002"),
    ("model: {num_layers: 5}", "PIP001"),
])
def test_an_ignored_structural_error_still_reports_and_the_entry_says_why(overlay, code):
    found = findings(f"{overlay}\nignore: [{code.lower()}]")
    assert code in [c for c, severity, _ in found if severity == "error"]
    assert ("IGN002", "warning", "ignore.0") in found
    message = next(f.message for f in run_rules(parse_config(example_config_data(
        f"{overlay}\nignore: [{code}]"))) if f.code == "IGN002")
    assert message == f"{code} cannot be ignored: {UNIGNORABLE[code]}"


def test_ignorable_codes_are_still_silenced_without_ign002():
    assert findings("parallel: {tp: 2}\nignore: [PAR008]") == []


def test_listing_an_unignorable_code_on_a_valid_config_is_only_a_warning():
    assert findings("ignore: [PAR001, CFG002]") == [("IGN002", "warning", "ignore.0"),
                                                    ("IGN002", "warning", "ignore.1")]


def test_ignore_every_code_never_makes_a_broken_layout_valid(tmp_path):
    """The issue's case: ignore PAR001 (and everything else) on a world size that does not divide;
    check and emit exit 1 with the finding, no traceback, no files. (IGN002 is a warning and
    itself ignorable: only ignoring it silences the explanation.)"""
    data = example_config_data("parallel: {world_size: 7}")
    data["ignore"] = [code for code in CODES if code != "IGN002"]
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    check = runner.invoke(app, ["check", str(path), "--json"])
    assert check.exit_code == 1 and isinstance(check.exception, SystemExit)
    codes = [f["code"] for f in json.loads(check.stdout)["findings"]]
    assert "PAR001" in codes and "IGN002" in codes
    emit = runner.invoke(app, ["emit", "all", str(path), "-o", str(tmp_path / "run")])
    assert emit.exit_code == 1 and isinstance(emit.exception, SystemExit)
    assert "PAR001" in emit.output and not (tmp_path / "run").exists()


def test_rules_shows_which_codes_cannot_be_ignored():
    table = runner.invoke(app, ["rules"], terminal_width=200)
    assert table.exit_code == 0 and "ignorable" in table.output
    explained = runner.invoke(app, ["rules", "PIP001"], terminal_width=200)
    assert f"ignorable: no — {UNIGNORABLE['PIP001']}" in explained.output
    as_json = json.loads(runner.invoke(app, ["rules", "PIP001", "--json"]).stdout)
    assert as_json["ignorable"] is False and as_json["cannot_ignore"] == UNIGNORABLE["PIP001"]
    assert json.loads(runner.invoke(app, ["rules", "PAR012", "--json"]).stdout)["ignorable"] is True

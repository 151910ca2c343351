"""Bad input never produces a traceback.

In-process, hypothesis generates and mutates configs — typed and wrongly typed values, zero and
negative sizes, unknown keys, deleted sections, random YAML text, character edits of real files,
junk bytes — and runs the loader, the rule catalog and the layout summary: the only exceptions
allowed are the loader's InvalidConfig / UnreadableConfig (tests/integration/cli/test_fuzz_pipeline.py
takes mutated configs further, through budgets, the plan and every emitter). The commands then run
on bad files in-process (typer's CliRunner: any exception but the CLI's own exit fails), and a few
as real `moeplan` processes check exit codes (0, 1 or 2) and that no "Traceback" reaches the user.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from planner.cli import app
from planner.config.loader import InvalidConfig, UnreadableConfig, load_config, parse_config, parse_yaml
from planner.config.schema import Config
from planner.layout.summary import layout_summary
from planner.rules import CODES, run_rules
from planner.rules.example_base import EXAMPLE_BASE_YAML
from tests.support.base_configs import MINIMAL_V4
from tests.support.paths import EXAMPLES


def cases(count: int) -> settings:
    """`count` generated cases, no per-case deadline (CI machines have 2 slow cores)."""
    return settings(max_examples=count, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SECTIONS: dict[str, type[BaseModel]] = {
    name: info.annotation for name, info in Config.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
}
# Fields whose size turns into work proportional to it (layers are listed one by one); kept to
# realistic magnitudes so the property stays fast. Every other integer also gets huge values.
LINEAR_COST_FIELDS = {"num_layers"}

BASE_DOCS: list[dict[str, Any]] = [
    yaml.safe_load(EXAMPLE_BASE_YAML),
    copy.deepcopy(MINIMAL_V4),
    *(yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES.glob("*.yaml"))),
]
EXAMPLE_TEXTS = [EXAMPLE_BASE_YAML, *(p.read_text() for p in sorted(EXAMPLES.glob("*.yaml")))]

# ----------------------------------------------------------------------------- strategies

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_small_ints = st.one_of(st.sampled_from([1, 2, 3, 4, 6, 8, 16, 61, 64, 128, 384, 1024]),
                        st.integers(min_value=1, max_value=130))
_out_of_range_ints = st.sampled_from([0, -1, -64, -(2**31), 2**40, 10**20])
_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -1.0, 1.5]))
_scalars = st.one_of(st.none(), st.booleans(), _small_ints, _out_of_range_ints, _floats, _text)
_junk = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)), max_leaves=6)


def _typed(annotation: Any, field: str, out_of_range: bool = False) -> st.SearchStrategy[Any]:
    """Values of the field's own type, in range unless asked otherwise (zero, negative, huge)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        if out_of_range and field not in LINEAR_COST_FIELDS:
            return _out_of_range_ints
        return _small_ints
    if annotation is float:
        if out_of_range:
            return st.sampled_from([0.0, -1.0, float("nan"), float("inf"), -float("inf")])
        return st.one_of(st.floats(min_value=1e-6, max_value=1e6), st.sampled_from([1.0, 1e-3]))
    if annotation is str:
        return st.one_of(st.sampled_from(["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-pp-cp-ep-dp",
                                          "tp-cp-dp-pp", "pp-dp", "Et*2|t*2L", "Ett|ttL", "E|tttt|L",
                                          "[/x]", ""]), _text)
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_typed(a, field, out_of_range) for a in args if a is not type(None)),
                         st.none())
    if origin is list:
        return st.lists(_typed(args[0], field, out_of_range) if args else _scalars, max_size=6)
    if origin is dict:
        return st.dictionaries(_text, _text, max_size=3)
    return _junk


@st.composite
def _mutation(draw: st.DrawFn) -> tuple[str, Any]:
    section = draw(st.sampled_from(sorted(SECTIONS)))
    fields = SECTIONS[section].model_fields
    field = draw(st.sampled_from(sorted(fields)))
    kind = draw(st.sampled_from(["typed"] * 16 + ["out_of_range", "junk", "unknown", "delete",
                                                  "drop_section", "junk_section", "top_level",
                                                  "ignore"]))
    if kind in ("typed", "out_of_range"):
        value = draw(_typed(fields[field].annotation, field, kind == "out_of_range"))
        return "typed", (section, field, value)
    if kind == "junk":
        return kind, (section, field, draw(_junk))
    if kind == "unknown":
        return kind, (section, draw(_text), draw(_scalars))
    if kind in ("delete", "drop_section", "junk_section"):
        return kind, (section, field, draw(_junk))
    if kind == "top_level":
        return kind, (draw(_text), draw(_junk))
    return kind, draw(st.lists(st.one_of(_text, st.sampled_from(["par008", *CODES])), max_size=6))


def _apply(doc: dict[str, Any], kind: str, payload: Any) -> None:
    if kind == "top_level":
        key, value = payload
        doc[key] = value
        return
    if kind == "ignore":
        doc["ignore"] = payload
        return
    section, key, value = payload
    if kind == "drop_section":
        doc.pop(section, None)
        return
    if kind == "junk_section":
        doc[section] = value
        return
    target = doc.get(section)
    if not isinstance(target, dict):
        target = doc[section] = {}
    if kind == "delete":
        target.pop(key, None)
    else:
        target[key] = value


@st.composite
def mutated_configs(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(draw(st.sampled_from(BASE_DOCS)))
    for kind, payload in draw(st.lists(_mutation(), min_size=1, max_size=8)):
        _apply(doc, kind, payload)
    return doc


_yaml_tokens = st.sampled_from([
    "model:", "parallel:", "training:", "moe:", "ignore:", "  num_layers: 4", "  world_size: 8",
    "  tp: 2", "  ep: -1", "  seq_length: 0", "{", "}", "[", "]", "- ", ": ", "&a", "*a", "? ",
    "!!python/object:os.system", "!!binary", "\t", "---", "...", "%YAML 1.2", "'", '"', "#", "|",
    ">", "<<: *a", "0x10", "1e400", ".nan", "~", "null", "yes", "@", "`",
])


def _check_in_process(text: str) -> None:
    """Loader + rules + layout summary: success, or one of the loader's two exceptions."""
    try:
        data, positions, duplicates = parse_yaml(text)
        cfg = parse_config(data, positions, duplicates)
    except (InvalidConfig, UnreadableConfig):
        return
    run_rules(cfg)
    layout_summary(cfg)


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


# ----------------------------------------------------------------------------- in-process properties


@cases(600)
@given(mutated_configs())
def test_mutated_configs_never_crash(doc):
    """The bulk of the cases skip YAML text (pure-Python PyYAML dominates the cost per case)."""
    try:
        cfg = parse_config(doc)
    except InvalidConfig:
        return
    run_rules(cfg)
    layout_summary(cfg)


@cases(150)
@given(mutated_configs())
def test_mutated_configs_as_yaml_text_never_crash(doc):
    _check_in_process(_dump(doc))


@cases(400)
@given(st.one_of(st.text(max_size=200), st.lists(_yaml_tokens, max_size=30).map("\n".join),
                 st.lists(_yaml_tokens, max_size=30).map(" ".join)))
def test_random_yaml_text_never_crashes(text):
    _check_in_process(text)


@cases(300)
@given(st.sampled_from(EXAMPLE_TEXTS), st.lists(
    st.tuples(st.floats(min_value=0, max_value=1), st.sampled_from(["delete", "insert", "replace"]),
              st.sampled_from(list(":{}[]-#&*!|>'\"\t\n 0123456789abcxyz"))), min_size=1, max_size=5))
def test_character_edits_of_real_files_never_crash(text, edits):
    chars = list(text)
    for where, how, char in edits:
        at = min(int(where * len(chars)), max(len(chars) - 1, 0))
        if how == "delete" and chars:
            del chars[at]
        elif how == "insert":
            chars.insert(at, char)
        elif chars:
            chars[at] = char
    _check_in_process("".join(chars))


_JUNK_DIR = Path(tempfile.mkdtemp(prefix="moeplan-junk-"))


@cases(300)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=100).map(lambda t: t.encode("utf-16"))))
def test_junk_bytes_never_crash(raw):
    path = _JUNK_DIR / "junk.yaml"
    path.write_bytes(raw)
    try:
        cfg = load_config(path)
    except (InvalidConfig, UnreadableConfig):
        return
    run_rules(cfg)


# ----------------------------------------------------------------------------- real processes


def _moeplan() -> list[str]:
    script = Path(sys.executable).parent / "moeplan"
    return [str(script)] if script.exists() else [sys.executable, "-m", "planner.cli"]


def _check(path: Path | str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "120"}
    return subprocess.run([*_moeplan(), "check", str(path), *extra], capture_output=True, text=True,
                          timeout=60, env=env)


def _here(*args: str) -> subprocess.CompletedProcess[str]:
    """`moeplan ARGS` in this process, as a CompletedProcess: an exception other than the CLI's
    own exit (which a real process would print as a traceback) fails the test here."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "120"})
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args, repr(result.exception))
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def _check_here(path: Path | str, *extra: str) -> subprocess.CompletedProcess[str]:
    return _here("check", str(path), *extra)


_BAD_FILES: dict[str, bytes] = {
    "empty.yaml": b"",
    "comment.yaml": b"# nothing here\n",
    "syntax.yaml": b"model: {preset: deepseek-v4-pro\nparallel: [\n",
    "tab.yaml": b"model:\n\tpreset: deepseek-v4-pro\n",
    "scalar.yaml": b"just a string\n",
    "binary.yaml": bytes(range(256)),
    "latin1.yaml": "model: {preset: caf\u00e9}\n".encode("latin-1"),
    "types.yaml": b"model: {preset: deepseek-v4-pro}\nparallel: {world_size: '1024', tp: [1]}\n"
                  b"training: {seq_length: 8192.5}\n",
    "negative.yaml": b"model: {preset: deepseek-v4-pro}\nparallel: {world_size: 1024, tp: 0, ep: -64}\n"
                     b"training: {seq_length: -1}\n",
    "unknown.yaml": b"model: {preset: deepseek-v4-pro, hiden_size: 7168}\nparallel: {world_size: 1024}\n"
                    b"training: {seq_length: 8192}\nextra_section: {}\n",
    "python_tag.yaml": b"model: !!python/object/apply:os.system ['true']\n",
}


# The bad files also run as real processes: an unreadable file (syntax), bytes that are no text,
# and a YAML tag that names Python code.
_REAL_PROCESS = ("binary.yaml", "python_tag.yaml", "syntax.yaml")


@pytest.mark.parametrize("name", sorted(_BAD_FILES))
def test_moeplan_check_on_bad_files(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(_BAD_FILES[name])
    for result in [_check_here(path)] + ([_check(path)] if name in _REAL_PROCESS else []):
        assert result.returncode in (1, 2), (name, result.returncode, result.stderr)
        assert "Traceback" not in result.stdout + result.stderr
        if name == "syntax.yaml":
            assert "line" in result.stderr and "column" in result.stderr


@pytest.mark.parametrize("name", ["empty.yaml", "binary.yaml", "types.yaml"])
def test_moeplan_check_json_on_bad_files(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(_BAD_FILES[name])
    result = _check_here(path, "--json")
    assert result.returncode in (1, 2) and "Traceback" not in result.stdout + result.stderr
    assert json.loads(result.stdout)["ok"] is False


def test_moeplan_check_on_missing_file_and_directory(tmp_path):
    for target in (tmp_path / "absent.yaml", tmp_path):
        result = _check_here(target)
        assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr


_MARKUP_LIKE = {  # user text that reaches a finding message: a key, an ignore entry, an order
    "key": 'model: {preset: deepseek-v4-flash, "[/x]": 1}\nparallel: {world_size: 128, ep: 64}\n'
           "training: {seq_length: 4096}\n",
    "ignore": "model: {preset: deepseek-v4-flash}\nparallel: {world_size: 128, ep: 64}\n"
              'training: {seq_length: 4096}\nignore: ["[/x]"]\n',
    "order": "model: {preset: deepseek-v4-flash}\nparallel: {world_size: 128, ep: 64, order: '[/x]'}\n"
             "training: {seq_length: 4096}\n",
}


@pytest.mark.parametrize("name", sorted(_MARKUP_LIKE))
def test_moeplan_check_prints_markup_like_input_literally(tmp_path, name):
    path = tmp_path / f"{name}.yaml"
    path.write_text(_MARKUP_LIKE[name])
    result = _check_here(path)
    assert result.returncode in (0, 1) and "Traceback" not in result.stdout + result.stderr
    assert "[/x]" in result.stdout + result.stderr


def test_moeplan_check_on_rule_violations_exits_1(tmp_path):
    path = tmp_path / "violations.yaml"
    path.write_text(yaml.safe_dump(MINIMAL_V4))
    result = _check(path)  # a real process
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    assert "PIP001" in result.stdout + result.stderr


_NON_FINITE = {  # the reproducers: `check` said valid, budget/compile ended in a traceback
    "gpu_memory": ("cluster", "gpu_memory_gib: .inf"),
    "capacity": ("moe", "moe_expert_capacity_factor: .inf"),
    "nan_lr": ("training", "lr: .nan"),
}


@pytest.mark.parametrize("command", [["check", "{cfg}"], ["budget", "{cfg}"],
                                     ["compile", "{cfg}", "-o", "{tmp}/plan.json"],
                                     ["emit", "all", "{cfg}", "-o", "{tmp}/run"]])
@pytest.mark.parametrize("name", sorted(_NON_FINITE))
def test_non_finite_numbers_are_findings_for_every_command(tmp_path, name, command):
    sections = {"model": "preset: deepseek-v4-flash", "parallel": "world_size: 128, ep: 64",
                "training": "seq_length: 4096"}
    section, entry = _NON_FINITE[name]
    sections[section] = ", ".join(filter(None, [sections.get(section), entry]))
    path = tmp_path / "c.yaml"
    path.write_text("".join(f"{key}: {{{body}}}\n" for key, body in sections.items()))
    args = [part.format(cfg=path, tmp=tmp_path) for part in command]
    result = _here(*args)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output
    assert "CFG004" in output and "finite" in output
    assert not (tmp_path / "plan.json").exists() and not (tmp_path / "run").exists()

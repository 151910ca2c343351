"""The shell importer and the YAML argument maps under adversarial input (issue 36): every budget
of the static read is an overrun naming the line, never evaluated further; bash's 64-bit
arithmetic; random scripts and maps end in a read or the reader's own error, within a stated
time and memory bound."""

from __future__ import annotations

import shlex
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.config.importers import shell_script
from planner.config.importers.arg_map import load_map, read_map
from planner.config.importers.shell_script import ScriptTooComplex, read_script
from planner.config.importers.shell_words import shell_words
from planner.config.importers.sources import NotAnImport, import_text
from tests.support.bounded import bounded_call

# The bound each property states: one read of an input of at most a few KiB allocates no more
# than this (tracemalloc) and ends within a second.
PEAK_BYTES = 64 << 20
SECONDS = 1.0
LAUNCH = "torchrun pretrain_gpt.py --num-layers 2 $A\n"


@pytest.mark.parametrize(("script", "says"), [
    ("A=x\n" + "A=$A$A\n" * 40 + LAUNCH, "line 22: a value grows past 1,048,576 characters"),
    ("A=(x)\n" + 'A=("${A[@]}" "${A[@]}")\n' * 40 + LAUNCH, "line 18: an array grows past 100,000"),
    ("A=x\n" + "A+=$A\n" * 40 + LAUNCH, "line 22: a value grows past 1,048,576 characters"),
    ("A=" + "${a:-" * 5000 + "1" + "}" * 5000 + "\n" + LAUNCH, "line 1: '{' nested more than 64 "
                                                            "deep inside an expansion"),
    ("A=" + "$((" * 3000 + "1" + "))" * 3000 + "\n" + LAUNCH, "line 1: '(' nested more than 64 deep"),
    ("A=$((" + "1+" * 600 + "1))\n" + LAUNCH, "line 1: an arithmetic expression of 1,201 characters"),
    ("A=$((" + "1?" * 80_000 + "1" + ":1" * 80_000 + "))\n" + LAUNCH, "line 1: an arithmetic "
                                                                     "expression of 320,001"),
    ("\n\nA=" + "B=(" * 5000 + "\n" + LAUNCH, "line 3: arrays nested more than 64 deep"),
    ("B=" + "9" * 2000 + "\nA=$((B+1))\n" + LAUNCH, "line 2: $B in $((B+1)) holds 2,000 characters"),
])
def test_each_overrun_stops_the_read_and_names_the_line(script: str, says: str) -> None:
    started = time.monotonic()
    with pytest.raises(ScriptTooComplex) as caught:
        read_script(script)
    assert says in str(caught.value) and "--set NAME=VALUE" in str(caught.value)
    assert time.monotonic() - started < 3.0
    with pytest.raises(NotAnImport, match="reads launch scripts statically"):
        import_text(script)


@pytest.mark.parametrize(("expression", "value"), [
    ("9223372036854775807 + 1", "-9223372036854775808"),  # bash: intmax_t wraps
    ("3037000500 * 3037000500", "-9223372036709301616"),
    ("-7 / 2", "-3"), ("-7 % 2", "-1"), ("7 % -2", "1"),  # truncation toward zero, dividend's sign
    ("2 > 1 ? 8 : 4", "8"), ("0 ? 1 : 2 ? 3 : 4", "3"),
])
def test_arithmetic_is_bashs_64_bit(expression: str, value: str) -> None:
    read = read_script(f"A=$(({expression}))\n")
    assert read.variables["A"] == value


def test_the_work_of_all_expansions_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many lines that each build a large value: the total, not only each value, is capped (the
    real cap, 64 MiB, as 1 MiB here to keep the test short)."""
    monkeypatch.setattr(shell_script, "MAX_WORK_CHARS", 1 << 20)
    # line 1 makes 1,000 characters, each later line 10,000: 1,000 + 10,000 * 105 > 2**20 at line 106
    with pytest.raises(ScriptTooComplex, match="line 106: the expansions produce more than 1,048,576"):
        read_script("B=" + "x" * 1000 + "\n" + "A=$B$B$B$B$B$B$B$B$B$B\n" * 200)


def test_squaring_forty_times_wraps_instead_of_growing() -> None:
    """Before, each line doubled the digits: no answer in 30 s."""
    read = read_script("A=99999999\n" + "A=$((A*A))\n" * 40)
    assert -(2**63) <= int(read.variables["A"]) < 2**63


def test_an_alias_bomb_argument_map_is_refused_before_it_is_built() -> None:
    """375 bytes that expanded to 41 MB of arguments in 57 s."""
    bomb = "--a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"--{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcde", "bcdef", strict=True))
    bomb += "--num-layers: 2\n"
    started = time.monotonic()
    with pytest.raises(NotAnImport, match="the YAML argument map: too big to read: aliases nested"):
        import_text(bomb)
    assert time.monotonic() - started < 2.0


def test_an_argument_map_value_nested_in_a_list_is_refused() -> None:
    data = load_map("--num-layers: 2\n--x: [[1, 2]]\n--y: 3\n")
    assert data is not None
    with pytest.raises(ScriptTooComplex, match="the YAML argument map's --x: a value nested"):
        read_map(data, {})


def _bounded(call, *args):  # noqa: ANN001, ANN202 - a test helper
    return bounded_call(call, *args, seconds=SECONDS, peak_bytes=PEAK_BYTES)


_SHELL_BITS = st.sampled_from([
    "A=", "B=", "A+=", "$A", "${A}", "${A:-", "${B:=x}", "}", "$((", "))", "A*A", "+", "?", ":", "1",
    "99999999999999999999", "(", ")", "(x y)", '"${A[@]}"', "'", '"', "\\", "\n", " ", ";", "&&",
    "if [ -z $X ]; then", "fi", "case $A in", "x)", ";;", "esac", "for i in 1 2; do", "done", "`", "$(",
    "export ", "torchrun pretrain_gpt.py --num-layers ", "<<EOF\n", "EOF\n", "#SBATCH -N 2\n", "#",
    "$A$A$A$A", "A=$A$A\n" * 8, "A=(\"${A[@]}\" \"${A[@]}\")\n" * 8, "${a:-${b:-${c:-",
])


@settings(max_examples=30, derandomize=True, deadline=None)
@given(st.lists(_SHELL_BITS, max_size=60))
def test_random_scripts_are_read_or_refused_never_raise(bits: list[str]) -> None:
    error = _bounded(read_script, "".join(bits))
    assert error is None or isinstance(error, ScriptTooComplex), repr(error)


_MAP_BITS = st.sampled_from([
    "--num-layers: ", "--x: ", "MODEL_ARGS:\n", "ENV_VARS:\n", "  ", "2", "true", "false", "${A}",
    "$((1+", "&a ", "*a", "[", "]", ", ", "{", "}", "\n", "- ", "null", "<<: ", "!!str ", "'", '"',
    "${A:-${B:-x}}", "9" * 30,
])


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(_MAP_BITS, max_size=50))
def test_random_argument_maps_are_read_or_refused_never_raise(bits: list[str]) -> None:
    def read(text: str) -> None:
        data = load_map(text)
        if data is not None:
            read_map(data, {})
    error = _bounded(read, "".join(bits))
    assert error is None or isinstance(error, ScriptTooComplex), repr(error)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.text(alphabet=" \t\r\n#'\"\\ab=-$\f\x00é", max_size=24))
def test_shell_words_are_shlexs_words(text: str) -> None:
    """The linear splitter (planner/config/importers/shell_words.py) gives shlex.split's words in
    posix mode with comments, and shlex's own message for an open quote or a trailing `\\`."""
    def words(split: Any) -> list[str] | str:
        try:
            return split(text)
        except ValueError as exc:
            return str(exc)

    assert words(shell_words) == words(lambda t: shlex.split(t, comments=True, posix=True))


@pytest.mark.parametrize("text", ["\n" * 1_000_000, "a" * 1_000_000, "#" * 1_000_000,
                                  '"' + "a" * 1_000_000, "ab " * 100_000])
def test_shell_words_take_linear_time(text: str) -> None:
    """shlex took 15 s on 3 MB of newlines and 34 s on a 1 MB word (it copies the word once per
    character); each of these takes well under a second here."""
    started = time.monotonic()
    try:
        count = len(shell_words(text))
    except ValueError:
        count = -1
    assert time.monotonic() - started < 5.0, count

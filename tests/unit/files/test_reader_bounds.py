"""Readers of calibration profiles and measured logs under adversarial input (issue 36): every
refusal names the entry, the log reader is linear in the line, and random input never raises
anything but the reader's own error, within a stated time and memory bound."""

from __future__ import annotations

import re
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.calibrate.megatron_log import LogError, parse_log
from planner.calibrate.profile import ProfileError, read_profile
from planner.config.gpus import GPU_CARDS, card_named
from planner.config.importers.log_lines import clean_line
from planner.config.layer_freq import PatternError, evaluate_pattern
from planner.config.loader import UnreadableConfig
from tests.support.bounded import bounded_call

# The bound each property states: one call on an input of at most a few KiB allocates no more
# than this (Python's own allocations, tracemalloc) and ends within a second.
PEAK_BYTES = 32 << 20
SECONDS = 1.0


def _bounded(call, *args):  # noqa: ANN001, ANN202 - a test helper
    return bounded_call(call, *args, seconds=SECONDS, peak_bytes=PEAK_BYTES)


# ----------------------------------------------------------------------------- profiles


@pytest.mark.parametrize(("text", "says"), [
    ("factors: {gemm_bf16: -0.5}\n", "factors.gemm_bf16 = -0.5 is outside the range of "
                                     "cluster.efficiency.gemm_bf16 (input should be greater than 0)"),
    ("factors: {permute_unfused: 0.5}\n", "factors.permute_unfused = 0.5 is outside the range"),
    ("factors: {gemm_bf16: .nan}\n", "factors.gemm_bf16 = nan is not a finite number"),
    ("factors: {step_fixed_ms: -.inf}\n", "factors.step_fixed_ms = -inf is not a finite number"),
    ("factors: {gemm_bf16: '0.5'}\n", "factors.gemm_bf16 = '0.5' is not a number"),
    ("factors: {gemm_bf16: " + "9" * 4000 + "}\n", "factors.gemm_bf16 is a 13288-bit integer"),
    ("factors: {gemm: 0.5}\n", "factors.gemm is not a calibrated factor"),
    ("factors: {gemm_bf16: 0.5, gemm_bf16: 0.6}\n", "key factors.gemm_bf16 appears twice (line 1)"),
    ("factors: {gemm_bf16: 0.5}\n---\nfactors: {}\n", "but found another document"),
    ("factors: {gemm_bf16: [\n", "YAML syntax error at line 2, column 1"),
    ("factors: {gemm_bf16: !!float abc}\n", "cannot parse YAML (ValueError)"),
    ("factors: {gemm_bf16: " + "9" * 5000 + "}\n", "cannot parse YAML (a number of more than 4,300 digits)"),
    ("factors: {host_us_per_expert: .inf}\n", "factors.host_us_per_expert = inf is not a finite"),
    ("factors: " + "[" * 5000 + "]" * 5000 + "\n", "exceeded maximum nesting depth"),
    ("a: &a [1, *a]\nfactors: {gemm_bf16: 0.5}\n", "too big to read"),
])
def test_a_profile_is_read_like_a_config_and_its_factors_checked(tmp_path: Path, text: str,
                                                                 says: str) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    with pytest.raises((ProfileError, UnreadableConfig), match=None) as caught:
        read_profile(path)
    assert says in str(caught.value) and str(path) in str(caught.value)


def test_a_fitted_profile_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("stack: {gpu: H100}\nfactors: {gemm_bf16: 0.55, gemm_fp8@hopper: 0.4, "
                    "host_us_per_expert: 0, permute_unfused: 1}\n")
    assert read_profile(path) == ({"gpu": "H100"}, {"gemm_bf16": 0.55, "gemm_fp8@hopper": 0.4,
                                                    "host_us_per_expert": 0.0, "permute_unfused": 1.0})


_YAML_BITS = st.sampled_from([
    "factors:", " {", "}", "[", "]", ", ", "gemm_bf16: ", "hbm@hopper: ", "0.5", "-1", ".nan", ".inf",
    "1e999", "9" * 50, "&a ", "*a", "<<: ", "!!float ", "!!python/name:os.system ", "---\n", "\n",
    "  ", "'x'", '"\\u0000"', "? ", "- ", "~", "true", "{a: *a}", "stack: ", "#", "\t", "%YAML 1.1\n",
])


@settings(max_examples=25, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_YAML_BITS, max_size=40))
def test_random_profiles_end_in_the_readers_errors(tmp_path: Path, bits: list[str]) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("".join(bits))
    error = _bounded(read_profile, path)
    assert error is None or isinstance(error, ProfileError | UnreadableConfig), repr(error)


# ----------------------------------------------------------------------------- logs


def _timing(ms: str, iteration: int = 10) -> str:
    return (f" iteration {iteration:8d}/{30:8d} | elapsed time per iteration (ms): {ms} | "
            "number of skipped iterations:   0 |")


@pytest.mark.parametrize("ms", ["0", "1.2.3", "1e999", "-5000", "0.0"])
def test_an_elapsed_time_that_is_not_a_positive_number_is_named(ms: str) -> None:
    with pytest.raises(LogError, match=rf"no usable timing line: 2 whose elapsed time is not a "
                                       rf"positive, finite number of ms \(first: {ms} at iteration 10\)"):
        parse_log("\n".join([_timing(ms), _timing(ms, 20)]), "m.log")


def test_a_bad_elapsed_time_beside_good_ones_is_left_out_and_noted() -> None:
    log = parse_log("\n".join([_timing("100"), _timing("-5000", 20), _timing("300", 30)]))
    assert [i.elapsed_ms for i in log.intervals] == [100.0, 300.0] and log.step_s == 0.3
    assert any("1 timing line(s) whose elapsed time is not a positive" in n for n in log.notes)


@pytest.mark.parametrize("prefix", ["[a]", "[Rank 1]", "INFO:", "a.py:1 ", ": ", "\x1b[0m", "rank 1: "])
def test_cleaning_and_reading_a_line_is_linear(prefix: str) -> None:
    """A line of stacked stamps just under the 1 MiB line cap: before, each stamp taken off copied
    the rest of the line (quadratic: a 3.2 MB line got no answer in 60 s)."""
    line = prefix * ((1 << 18) // len(prefix)) + _timing("5.0")
    started = time.monotonic()
    clean_line(line)
    log = parse_log(line + "\n" + "[Rank 1]" * 30_000 + " x", "long.log")
    assert time.monotonic() - started < 3.0
    assert log.step_s == 0.005 or prefix == "[Rank 1]"


def test_a_long_log_streams_in_bounded_memory() -> None:
    """2 MB of noise lines around the timing lines: the reader keeps intervals, not lines (its
    peak stays under 512 KiB)."""
    def lines():  # noqa: ANN202
        yield _timing("250.0")
        for i in range(2_000):
            yield f"[default0]: noise {i} " + "x" * 1000
        yield _timing("250.0", 20)
    tracemalloc.start()
    try:
        assert parse_log(lines()).step_s == 0.25
        assert tracemalloc.get_traced_memory()[1] < 512 << 10
    finally:
        tracemalloc.stop()


@settings(max_examples=40, derandomize=True, deadline=None)
@given(st.lists(st.sampled_from(["H100", "GB200", "B200", "MI300X", "H20", "A100", "-SXM4-80GB", "x",
                                 "_", "é", " ", "0", "-", "NVIDIA "]), max_size=12))
def test_a_gpu_is_named_as_a_whole_word(bits: list[str]) -> None:
    """card_named finds what `\\b(name)\\b` finds, without the leading `\\b` that kept re from
    skipping to the names' first letters (64 µs a log line)."""
    line = "".join(bits)
    whole = re.search(r"\b(" + "|".join(sorted(GPU_CARDS, key=len, reverse=True)) + r")\b", line)
    assert card_named(line) == (GPU_CARDS[whole.group(1)] if whole else None)


_LOG_BITS = st.sampled_from([
    " iteration ", "10", "/", "20", " | ", "elapsed time per iteration (ms): ", "1.2.3", "-5", "1e999",
    "9" * 30, "throughput per GPU (TFLOP/s/GPU): ", "number of skipped iterations: ", "[Rank 0]",
    " memory (MB) | allocated: ", " | max allocated: ", " | reserved: ", " | max reserved: ",
    "------------------------ arguments ------------------------",
    "-------------------- end of arguments ---------------------", "  num_layers ...... ",
    "padded vocab (size: ", ") with ", " dummy tokens (new size: ", ")", "after training is done",
    "\n", "\r", "\x1b[31m", "[default0]:", "INFO:megatron:", "NVIDIA H100", "megatron version: ",
])


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(_LOG_BITS, max_size=80))
def test_random_logs_end_in_figures_or_a_log_error(bits: list[str]) -> None:
    error = _bounded(parse_log, "".join(bits), "random.log")
    assert error is None or isinstance(error, LogError), repr(error)


# ----------------------------------------------------------------------------- moe_layer_freq


@pytest.mark.parametrize(("text", "says"), [
    ("*".join(["99999999"] * 600), "a number beyond the 64-bit range"),
    ("9" * 5000, "is beyond the 64-bit range"),
    ("[1]*1000000" + "*1" * 20, "expands beyond 1000000 items"),
    ("+".join(["[1]*400000"] * 11), "expands beyond 1000000 items"),
    ("[1]" + "*1" * 600_000, "more than the 1,048,576"),
    ("(" * 50_000 + "1" + ")" * 50_000, "nested too deeply"),
])
def test_a_layer_pattern_is_bounded_in_its_work(text: str, says: str) -> None:
    started = time.monotonic()
    with pytest.raises(PatternError, match=None) as caught:
        evaluate_pattern(text)
    assert says in str(caught.value) and time.monotonic() - started < 2.0


def test_real_layer_patterns_still_evaluate() -> None:
    assert evaluate_pattern("([0]*3+[1]*58)") == [0] * 3 + [1] * 58
    assert evaluate_pattern("[0,1]*24") == [0, 1] * 24 and evaluate_pattern("2") == 2

"""`moeplan budget CONFIG` leads with the answer: one screen (≤ 80 lines at 160 columns for the
V4-Pro example) whose per-stage peaks are the full table's, gradient collectives labelled "step",
and `--all` stage tables whose numbers never wrap inside a cell."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planner.budget.collectives import ONCE_PER_STEP, TABLE, phase_label

ROOT = Path(__file__).resolve().parents[3]
V4_PRO = str(ROOT / "examples" / "deepseek-v4-pro-1024.yaml")
FAILING = str(ROOT / "examples" / "invalid" / "ovl001-shared-and-batch-overlap.yaml")


def budget(*args: str, columns: int = 160) -> subprocess.CompletedProcess:
    env = os.environ | {"COLUMNS": str(columns), "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "planner.cli", "budget", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def screen() -> str:
    result = budget(V4_PRO)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def full() -> str:
    result = budget(V4_PRO, "--all")
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_screen_fits_in_80_lines_and_leads_with_the_verdict(screen):
    lines = screen.splitlines()
    assert len(lines) <= 80
    assert max(len(line) for line in lines) <= 160
    assert lines[0].startswith("fits: every stage under 92 % of GPU memory")
    for heading in ("peak memory per stage", "largest collectives per optimizer step", "step time"):
        assert heading in screen


def _screen_peaks(screen: str) -> dict[int, float]:
    # rows: stage, rank, peak "59.9 GiB", device total, its share, bar, largest part
    rows = re.findall(r"^\s+(\d)\s+\d+\s+([\d.]+) GiB\s+[\d.]+ GiB\s+[\d.]+%", screen, flags=re.M)
    return {int(stage): float(peak) for stage, peak in rows}


def _table_peaks(full: str) -> dict[int, float]:
    row = next(line for line in full.splitlines() if "peak_memory_bytes" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[-1] == "GiB"  # one unit for the whole row, in the unit column
    return dict(enumerate(float(c) for c in cells[1:-1]))


def test_screen_peaks_are_the_full_tables(screen, full):
    shown, table = _screen_peaks(screen), _table_peaks(full)
    assert sorted(shown) == list(range(8)) and sorted(table) == list(range(8))
    for stage in range(8):
        assert shown[stage] == round(table[stage], 1), stage
    # the same figure the JSON carries: stage 7's peak, 74.24 GiB in the table (the loss's logits
    # and the GEMM workspaces included), and stage 1's, 80.25 GiB (two checkpointed inputs per V4
    # block under full recompute, 7 microbatches in flight)
    assert (shown[7], shown[1]) == (74.2, 80.3)


def test_gradient_collectives_are_labelled_step_not_forward(screen):
    row = next(line for line in screen.splitlines() if line.startswith("dense_grad_reduce"))
    assert row.split()[1] == "step"
    assert re.search(r"^ep_dispatch_hidden\s+forward", screen, flags=re.M)
    assert re.search(r"^ep_dispatch_hidden\s+backward", screen, flags=re.M)


def test_once_per_step_names_are_fwd_only_table_entries():
    for name in ONCE_PER_STEP:
        assert set(TABLE[name].phases) == {"fwd"}, name
        assert phase_label(name, "fwd") == "step"
    assert phase_label("ep_dispatch_hidden", "fwd") == "forward"
    assert phase_label("ep_dispatch_hidden", "recompute") == "recompute"


def test_full_stage_tables_never_wrap_a_number(full):
    # a wrapped cell leaves a continuation line whose stage cells hold a bare unit or number
    # while the quantity cell is empty
    for line in full.splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[0] == "":
            assert all(c == "" for c in cells), line
    assert "…" not in full


def test_failing_config_shows_the_failure_and_its_fix_first():
    result = budget(FAILING)
    assert result.returncode == 1
    first = result.stdout.splitlines()[:3]
    assert first[0].startswith("does not pass: OVL001")
    assert "fix: turn one of them off" in first[1]


@pytest.mark.parametrize("gib, code, verdict", [
    # stage 1's device total is 84.9 GiB: 84.9/90 = 94 % > 92 % → MEM002; 84.9 > 60 → MEM001
    (90, 0, "MEM002: fits, but a stage leaves under 8 % headroom"),
    (60, 1, "MEM001: does not fit"),
])
def test_memory_verdicts(tmp_path, gib, code, verdict):
    text = Path(V4_PRO).read_text().replace("gpu_memory_gib: 141", f"gpu_memory_gib: {gib}")
    path = tmp_path / "v4.yaml"
    path.write_text(text)
    result = budget(str(path))
    assert result.returncode == code
    lines = result.stdout.splitlines()
    assert lines[0].startswith(verdict), lines[0]
    assert "on stage 1" in lines[0] and lines[1].lstrip().startswith(verdict[:6])


def test_bar_marks_the_share_and_the_mem002_line():
    from planner.commands.budget_screen import bar

    assert bar(0.5) == "█" * 20 + "·" * 17 + "|" + "·" * 2  # 40 cells, | at cell 37 = 92 %
    assert bar(0.5, mark=0.8) == "█" * 20 + "·" * 12 + "|" + "·" * 7  # a 20 % margin: cell 32
    assert bar(0.95) == "█" * 38 + "··"  # past the line: the bar covers it
    assert bar(1.25) == "█" * 40 + "▶"  # over the GPU


def test_row_units_are_exact():
    from fractions import Fraction

    from planner.units import binary_unit, in_unit

    assert binary_unit(1023) == ("B", 1) and binary_unit(1024) == ("KiB", 1024)
    assert binary_unit(133177540608) == ("GiB", 2**30)  # 124.03125 GiB = 124.03125 · 2^30 B
    assert in_unit(133177540608, 2**30) == "124.031"  # three decimals, as the tables print
    assert in_unit(Fraction(3, 2) * 2**20, 2**30) == "0.001"
    assert in_unit(0, 2**30) == "0"


def test_narrow_terminal_splits_stage_columns_instead_of_cutting_numbers(full):
    narrow = budget(V4_PRO, "--all", columns=100).stdout
    lines = narrow.splitlines()
    assert max(len(line) for line in lines) <= 100 and "…" not in narrow
    peaks = [line for line in lines if "peak_memory_bytes" in line]
    assert len(peaks) == 2  # stages 0–3, then 4–7
    values = [c.strip() for line in peaks for c in line.strip("│ ").split("│")[1:-1]]
    assert [float(v) for v in values] == list(_table_peaks(full).values())

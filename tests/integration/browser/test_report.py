"""`moeplan report CONFIG -o report.html`: one self-contained page (nothing fetched), the verdict and
findings with fixes at the top, a chart per section, figures equal to what `budget`/`estimate`
print; a failing config still gets its page (exit 1); rendered by headless Chromium."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
V4_PRO = EXAMPLES / "deepseek-v4-pro-1024.yaml"
FAILING = EXAMPLES / "invalid" / "ovl001-shared-and-batch-overlap.yaml"  # grids build, OVL001
NO_GRID = EXAMPLES / "invalid" / "par001-world-not-divisible.yaml"  # no budgets at all
CHARTS = ("chart-rank-map", "chart-memory", "chart-comm", "chart-time")
IN_CI = bool(os.environ.get("CI"))


def _needed(available: bool, what: str) -> None:
    """Skip only outside CI; in CI a missing tool is a failure, not a skip."""
    if not available:
        if IN_CI:
            pytest.fail(f"{what} is missing in CI")
        pytest.skip(f"{what} is not installed (CI installs it)")


_needed_matplotlib = pytest.mark.usefixtures("matplotlib_present")


@pytest.fixture(scope="module")
def matplotlib_present() -> None:
    _needed(importlib.util.find_spec("matplotlib") is not None,
            "matplotlib (the `report` and `test` extras)")


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def moeplan(*args: str) -> Ran:
    """The CLI in this process (typer's runner: exit code, stdout and stderr apart); a cold start
    per command was most of this file's time, and start-up has tests of its own."""
    from typer.testing import CliRunner

    from planner.cli import app

    result = CliRunner().invoke(app, [*map(str, args)], env={"NO_COLOR": "1"})
    return Ran(result.exit_code, result.stdout, result.stderr)


@pytest.fixture(scope="module")
def pages(tmp_path_factory, matplotlib_present) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("report")
    written = {}
    for key, config, code in (("v4", V4_PRO, 0), ("failing", FAILING, 1), ("no_grid", NO_GRID, 1)):
        path = out / f"{key}.html"
        result = moeplan("report", config, "-o", path)
        assert result.returncode == code, result.stderr
        assert f"wrote {path}" in result.stdout
        written[key] = path
    return written


def test_page_is_self_contained(pages):
    for path in pages.values():
        html = path.read_text()
        assert "<script" not in html and "<link" not in html and "@import" not in html
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), path
        assert "url(http" not in html
        assert not list(path.parent.glob(f".{path.name}.*.tmp"))  # atomic write left nothing


def test_v4_page_leads_with_the_verdict_and_holds_every_chart(pages):
    html = pages["v4"].read_text()
    verdict = html.index('id="verdict"')
    assert "fits: every stage under 92 % of GPU memory" in html
    for chart in CHARTS:
        assert f'id="{chart}"' in html, chart
        assert html.index(f'id="{chart}"') > verdict
    assert "search" not in re.findall(r'<section id="([a-z-]+)"', html)


def test_v4_page_shows_the_commands_figures(pages):
    """Peaks as `budget --json` computes them, the step time as `estimate --json` does."""
    html = pages["v4"].read_text()
    budgets = json.loads(moeplan("budget", V4_PRO, "--json").stdout)
    peaks = {b["stage"]: b["value"] for b in budgets if b["name"] == "peak_memory_bytes"}
    gpu = next(b["value"] for b in budgets if b["name"] == "gpu_memory_bytes")
    for stage, peak in peaks.items():
        # stage row: stage, rank, five parts, peak, share
        memory = html[html.index('<section id="memory">'):]
        row = re.search(rf'<tr><td class="num">{stage}</td>.*?</tr>', memory).group(0)
        assert f"{peak / 2**30:.1f} GiB" in row and f"{peak / gpu:.1%}" in row
    assert f"{peaks[7] / 2**30:.1f}" == "74.2"  # stage 7, 74.241 GiB in `budget --all`
    step = json.loads(moeplan("estimate", V4_PRO, "--json").stdout)["step_time_s"]
    assert f"<strong>{step:.2f} s</strong>" in html
    # a gradient reduction is once-per-step work, not forward traffic
    assert re.search(r"<td>dense_grad_reduce</td><td>step</td>", html)


def test_failing_page_puts_the_failure_and_its_fix_first(pages):
    html = pages["failing"].read_text()
    assert 'class="verdict verdict-errors"' in html
    top = html[:html.index('id="chart-memory"')]
    assert "does not pass: OVL001" in top
    assert "turn one of them off" in top  # the finding's fix


def test_page_without_budgets_still_says_what_to_fix(pages):
    html = pages["no_grid"].read_text()
    assert "PAR001" in html and "use a world size that is a multiple of 24" in html
    assert "No budgets" in html and "<svg" not in html


def test_usage_errors_write_nothing(tmp_path):
    result = moeplan("report", V4_PRO, "-o", tmp_path)
    assert result.returncode == 2 and list(tmp_path.iterdir()) == []
    assert moeplan("report", V4_PRO).returncode == 2  # -o is required


def test_search_candidates_are_plotted_with_the_winner(monkeypatch, matplotlib_present):
    """Against planner.search.run's API: search(cfg, top=K) -> result with candidates (fastest first)."""
    from planner.cli_common import collect_findings
    from planner.config.loader import load_config
    from planner.report.page import page_context

    def candidate(tp: int, step: float, peak: int, user: bool = False) -> types.SimpleNamespace:
        data = {"parallel": {"tp": tp, "cp": 1, "pp": 8, "vpp": 1, "ep": 64, "etp": 1},
                "training": {"micro_batch_size": 1}, "recompute": "selective",
                "is_user_layout": user}
        return types.SimpleNamespace(step_time_s=step, peak_memory_bytes=peak, is_user=user,
                                     as_json=lambda: data)

    seen = {}

    def search(cfg, *, top):
        seen["top"] = top
        return types.SimpleNamespace(candidates=[candidate(1, 40.0, 70 * 2**30),
                                                 candidate(2, 45.0, 60 * 2**30)],
                                     user=candidate(1, 57.0, 74 * 2**30, user=True),
                                     fitting=9, explored=30)

    monkeypatch.setattr("planner.report.page.run_search", search)
    cfg = load_config(V4_PRO)
    context = page_context(cfg, V4_PRO, collect_findings(cfg), search_top=5)
    assert seen["top"] == 5
    svg = context["charts"]["search"]
    assert 'id="chart-search"' in svg and "winner: TP1 CP1 PP8 VPP1 EP64 ETP1 mbs1 selective" in svg
    assert "your layout" in svg
    assert [p["step_time_s"] for p in context["search"].points] == [40.0, 45.0, 57.0]


def test_check_does_not_import_matplotlib():
    """Nor the report page, which imports the search (planner/search/run.py) at module level."""
    probe = ("import sys\nfrom planner.cli import app\n"
             f"try:\n    app(['check', {str(V4_PRO)!r}])\nexcept SystemExit:\n    pass\n"
             "assert 'matplotlib' not in sys.modules, 'check imported matplotlib'\n"
             "assert 'planner.report.page' not in sys.modules, 'check imported the report page'\n"
             "assert 'planner.search.run' not in sys.modules, 'check imported the search'\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


# ----------------------------------------------------------------------------- a real browser

def _chromium() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = _chromium()
    _needed(binary is not None, "chromium (.ci/system-deps installs it)")
    return binary  # type: ignore[return-value]


def _browse(chromium: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--no-first-run", f"--user-data-dir={tmp_path}",
                           *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("key, verdict", [("v4", "fits: every stage under 92 %"),
                                          ("failing", "does not pass: OVL001")])
def test_chromium_renders_the_page(pages, chromium, tmp_path, key, verdict):
    from matplotlib.image import imread  # matplotlib's PNG reader: no new dependency

    page = pages[key].resolve().as_uri()
    shot = tmp_path / f"{key}.png"
    _browse(chromium, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1200,2400",
            page)
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (2400, 1200)
    assert pixels.std() > 0.05  # not a blank page
    assert (pixels.min(axis=2) < 0.9).mean() > 0.02  # ink: text, bars, rules
    dom = _browse(chromium, tmp_path / "profile-dom", "--dump-dom", page).stdout
    assert verdict in dom
    for chart in CHARTS:
        assert re.search(rf'<(svg|figure)[^>]*id="{chart}"', dom), chart
    assert dom.count("<svg") >= len(CHARTS)


def test_without_matplotlib_report_says_which_extra(tmp_path):
    probe = ("import sys\nsys.modules['matplotlib'] = None\nfrom planner.cli import app\n"
             f"app(['report', {str(V4_PRO)!r}, '-o', {str(tmp_path / 'r.html')!r}])\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "pip install 'moeplan[report]'" in done.stderr and not (tmp_path / "r.html").exists()

"""planner.layout.group_kinds: one complete record per process-group kind, in Megatron's creation
order, each citing the Megatron function it follows, each documented, each disabled kind with its
reason. (The groups themselves are held by test_grid.py and the megatron-core oracle test.)"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from planner.layout.grid import Grid
from planner.layout.group_kinds import CORE_0_16, DEV, KIND_BY_NAME, KINDS, MAIN
from planner.layout.spec import GridSpec
from tests.support.oracle import megatron_lm_dir
from tests.support.paths import ROOT

# Megatron-LM main@d98e8a64 megatron/core/parallel_state.py initialize_model_parallel, creation order.
CREATION_ORDER = (
    "gtp_remat", "dp_cp", "intra_dp_cp", "hybrid_dp_cp", "dynamic_dp_cp", "dp", "dp_gtp_remat",
    "dp_cp_gtp_remat", "cp", "hcp", "mp", "tp", "pp", "embd", "pos_embd", "tp_dp_cp", "tp_dp", "tp_cp",
    "expt_gtp_remat", "ep", "expt_tp", "tp_ep", "tp_ep_pp", "tp_ep_pp_with_egtp_remat", "expt_dp",
    "intra_expt_dp", "inter_dist_opt", "expt_dp_gtp_remat", "intra_dist_opt",
)
CITATION = re.compile(rf"^({re.escape(DEV)}|{re.escape(MAIN)}|{re.escape(CORE_0_16)}) (\w+)$")

# Layouts that switch every optional kind on and off between them.
SPECS = [
    GridSpec(8),
    GridSpec(8, tp=2, cp=2, ep=2, etp=1, pp=2),
    GridSpec(16, cp=4, hcp_sizes=(2, 2), dp_cp_chunks="hybrid", dist_opt_instances=2, ep=2),
    GridSpec(8, cp=2, dp_cp_chunks="dynamic"),
    GridSpec(8, gtp=2, egtp=2, ep=2),
    GridSpec(4, cp=2, dp_cp_chunks="hybrid"),  # DP·CP = 4: chunks of 2 only
    GridSpec(2, dp_cp_chunks="hybrid"),  # DP·CP = 2: no chunk size at all
]


def test_one_record_per_kind_in_creation_order():
    assert tuple(kind.name for kind in KINDS) == CREATION_ORDER
    assert set(KIND_BY_NAME) == set(CREATION_ORDER)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_record_is_complete(kind):
    assert kind.grid in ("dense", "expert")
    assert kind.built_from and kind.why
    assert CITATION.match(kind.megatron), kind.megatron


def test_cited_dev_functions_exist_in_the_checkout():
    root, why_missing = megatron_lm_dir()
    if root is None:
        pytest.skip(why_missing)
    source = (root / "megatron" / "core" / "parallel_state.py").read_text(encoding="utf-8")
    for kind in KINDS:
        if kind.megatron.startswith(DEV):
            function = kind.megatron.rsplit(" ", 1)[1]
            assert f"def {function}(" in source, (kind.name, function)


def test_cited_megatron_core_functions_exist_in_the_installed_package():
    spec = importlib.util.find_spec("megatron")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron-core is not installed")
    source = (Path(next(iter(spec.submodule_search_locations))) / "core" / "parallel_state.py")
    text = source.read_text(encoding="utf-8")
    for kind in KINDS:
        if kind.megatron.startswith(CORE_0_16):
            function = kind.megatron.rsplit(" ", 1)[1]
            assert f"def {function}(" in text, (kind.name, function)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_every_kind_is_built_or_says_why_not(spec):
    grid = Grid(spec)
    assert set(grid.kinds).isdisjoint(grid.absent)
    assert [k for k in CREATION_ORDER if k in grid.kinds or k in grid.absent] == list(CREATION_ORDER)
    assert all(isinstance(why, str) and why for why in grid.absent.values())


def test_disabled_kinds_name_the_setting_that_would_build_them():
    absent = Grid(GridSpec(8)).absent
    assert absent["dp_gtp_remat"] == "GTP = 1: Megatron-LM main aliases it to dp instead of building it"
    assert absent["expt_dp_gtp_remat"].startswith("EGTP = 1")
    assert "aliases it to expt_dp" in absent["intra_expt_dp"]
    assert "nothing to reduce across" in absent["inter_dist_opt"]
    assert absent["hcp"] == "hierarchical_context_parallel_sizes is not set"
    assert absent["hybrid_dp_cp"] == "hybrid_context_parallel is off"
    assert Grid(GridSpec(2, dp_cp_chunks="hybrid")).absent["hybrid_dp_cp"] == (
        "DP·CP = 2 leaves no power-of-two chunk below it")


def test_a_disabled_kind_asked_for_says_why():
    with pytest.raises(ValueError, match=r"'dp_gtp_remat' \(GTP = 1: .*\); this layout has: gtp_remat"):
        Grid(GridSpec(8)).groups("dp_gtp_remat")


def test_every_kind_has_its_row_in_docs_parallelism_with_its_grid():
    page = (ROOT / "docs" / "parallelism.md").read_text(encoding="utf-8")
    table = page.split("## Every group kind", 1)[1].split("\n\n")[2]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 2:
            for name in re.findall(r"`([^`]+)`", cells[0]):
                rows[name] = cells[1]
    for kind in KINDS:
        documented = ([kind.name] if kind.name in rows else  # a family's row names its members
                      [name for name in rows if name.startswith(f"{kind.name}_")])
        assert documented, f"{kind.name} has no row in docs/parallelism.md's 'Every group kind' table"
        assert {rows[name] for name in documented} == {kind.grid}, kind.name

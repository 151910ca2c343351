"""`moeplan groups`: tables, rank views, JSON, SVG and exit codes, on the bundled examples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app
from planner.commands.groups import format_group
from planner.config.loader import load_config
from planner.layout.grid import Grid
from planner.layout.spec import GridSpec, grid_spec_from_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
V4_PRO = str(EXAMPLES / "deepseek-v4-pro-1024.yaml")
TINY = str(EXAMPLES / "tiny-cpu-8.yaml")
HF_FILES = Path(__file__).resolve().parents[2] / "support" / "hf_config_files"
SVG = "{http://www.w3.org/2000/svg}"

runner = CliRunner()


def invoke(*args: str) -> Any:
    result = runner.invoke(app, ["groups", *args])
    # Bad input must end in a clean exit, never in an uncaught exception.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def write_config(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


# ----------------------------------------------------------------- the V4-Pro layout through the CLI


def test_rank_views_of_the_v4_pro_example():
    views = {}
    for rank in (0, 1, 64):
        result = invoke(V4_PRO, "--rank", str(rank), "--json")
        assert result.exit_code == 0, result.output
        views[rank] = json.loads(result.output)
    assert views[0]["experts"]["expert_ids"] == [0, 1, 2, 3, 4, 5]
    assert views[64]["experts"]["expert_ids"] == [0, 1, 2, 3, 4, 5]
    assert views[1]["experts"]["expert_ids"] == [6, 7, 8, 9, 10, 11]
    assert views[0]["groups"]["expt_dp"] == views[64]["groups"]["expt_dp"] == [0, 64]
    assert views[0]["experts"]["replica_peers"] == [0, 64]
    assert views[64]["expert_coords"] == {"tp": 0, "ep": 0, "dp": 1, "pp": 0}
    assert views[0]["formulas"]["dense"]["stage"] == "r = c + 2*d_a"
    assert views[0]["formulas"]["expert"]["stage"] == "r = e + 64*d_e"
    assert (views[0]["dp"], views[0]["edp"], views[0]["world_size"]) == (64, 2, 1024)


def test_full_json_listing_is_the_grid_in_generator_order():
    result = invoke(V4_PRO, "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert {"world_size", "order", "dp", "edp", "groups"} <= payload.keys()
    assert payload["order"] == "tp-cp-ep-dp-pp"
    grid = Grid(grid_spec_from_config(load_config(V4_PRO)))
    assert payload["groups"] == grid.all_groups()
    assert payload["groups"]["expt_dp"][:2] == [[0, 64], [1, 65]]
    assert payload["groups"]["ep"][0] == list(range(64))


def test_one_kind_in_json_and_in_full_text():
    payload = json.loads(invoke(TINY, "--kind", "ep", "--json").output)
    assert payload["groups"] == {"ep": [[0, 2], [1, 3], [4, 6], [5, 7]]}
    text = invoke(TINY, "--kind", "expt_tp").output
    assert "[0, 1]" in text and "[6, 7]" in text


def test_rank_json_restricted_to_one_kind():
    payload = json.loads(invoke(TINY, "--rank", "3", "--kind", "expt_dp", "--json").output)
    assert payload["groups"] == {"expt_dp": [3, 7]}


def test_default_tables_and_rank_text():
    result = invoke(TINY)
    assert result.exit_code == 0, result.output
    assert "dense layout" in result.output and "expert layout" in result.output
    assert "intra_dist_opt" in result.output
    text = invoke(TINY, "--rank", "3").output
    assert "rank 3" in text
    assert "experts 4–7" in text
    assert "ETP shard 1 of 2" in text
    assert "[3, 7]" in text


# ----------------------------------------------------------------- SVG


def svg_cells(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    return [t.text or "" for t in root.iter(f"{SVG}title") if (t.text or "").startswith("rank ")]


def test_svg_of_v4_stage_draws_every_rank_in_both_views(tmp_path):
    out = tmp_path / "stage.svg"
    result = invoke(V4_PRO, "--svg", str(out))
    assert result.exit_code == 0, result.output
    cells = svg_cells(out)
    assert len(cells) == 2 * 128
    assert sum(c.startswith("rank 64:") for c in cells) == 2
    text = out.read_text()
    assert "EP 0: experts 0–5" in text
    assert "expt_dp replicas [0, 64]" in text
    assert "r = c + 2*d_a" in text and "r = e + 64*d_e" in text


def test_svg_of_another_stage(tmp_path):
    out = tmp_path / "stage3.svg"
    assert invoke(V4_PRO, "--svg", str(out), "--stage", "3").exit_code == 0
    cells = svg_cells(out)
    assert min(int(c.split()[1].rstrip(":")) for c in cells) == 384


def test_svg_aggregates_large_stages(tmp_path):
    # The V4-Pro example at 16,384 ranks: 2,048 ranks per stage (DP 1024, EDP 32).
    data = yaml.safe_load(Path(V4_PRO).read_text())
    data["parallel"]["world_size"] = 16384
    data["cluster"]["nodes"] = 2048
    config = write_config(tmp_path, data)
    out = tmp_path / "big.svg"
    result = invoke(config, "--svg", str(out))
    assert result.exit_code == 0, result.output
    root = ET.parse(out).getroot()
    panels = [g for g in root.iter(f"{SVG}g") if g.get("class") == "panel"]
    assert len(panels) == 2
    for panel in panels:
        cells = [g for g in panel if g.tag == f"{SVG}g"]
        assert 0 < len(cells) <= 128
    assert "aggregated" in out.read_text()


# ----------------------------------------------------------------- rejections and exit codes


def test_pp_dp_order_with_unequal_dp_exits_1_with_findings(tmp_path, minimal_v4):
    minimal_v4["parallel"]["order"] = "tp-cp-ep-pp-dp"
    result = invoke(write_config(tmp_path, minimal_v4))
    assert result.exit_code == 1
    assert "DP" in result.output and "error" in result.output


def test_non_tiling_layout_exits_1(tmp_path, minimal_v4):
    minimal_v4["parallel"]["world_size"] = 1000
    result = invoke(write_config(tmp_path, minimal_v4), "--json")
    assert result.exit_code == 1
    payload = json.loads(result.output)
    assert payload["ok"] is False and payload["findings"]


def test_a_layout_that_does_not_fit_memory_still_has_its_groups(tmp_path):
    """Megatron builds the groups before the first step runs out of memory: `check` refuses the
    layout (MEM001), `groups` lists them, and its pre-check never loads the formula book."""
    data = yaml.safe_load(Path(TINY).read_text())
    data["cluster"]["gpu_memory_gib"] = 0.0001
    path = write_config(tmp_path, data)
    assert runner.invoke(app, ["check", path]).exit_code == 1
    assert "MEM001" in runner.invoke(app, ["check", path, "--json"]).output
    result = invoke(path, "--rank", "3", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["world_size"] == 8
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from planner.config.loader import load_config; "
         "from planner.rules import run_rules; "
         f"found = run_rules(load_config({path!r}), budget=False); "
         "print('planner.accounting' in sys.modules, sorted({f.code for f in found}))"],
        capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.split()[0] == "False", loaded.stdout + loaded.stderr


def test_the_groups_precheck_is_the_catalog_without_the_budget_rules():
    from planner.rules.catalog import READS_BUDGET, run_rules

    assert {"MEM001", "MEM002", "MOE034"} <= READS_BUDGET
    for example in (V4_PRO, str(EXAMPLES / "invalid" / "dop002-instances-do-not-divide-edp.yaml")):
        cfg = load_config(example)
        every = run_rules(cfg)
        assert run_rules(cfg, budget=False) == [f for f in every if f.code not in READS_BUDGET]


def test_unreadable_config_exits_2(tmp_path):
    assert invoke(str(tmp_path / "missing.yaml")).exit_code == 2


@pytest.mark.parametrize(
    "args",
    [("--rank", "8"), ("--rank", "-1"), ("--kind", "bogus"), ("--svg", "x.svg", "--stage", "1")],
)
def test_usage_errors_exit_2(args, tmp_path):
    args = tuple(str(tmp_path / a) if a.endswith(".svg") else a for a in args)
    result = invoke(TINY, *args)
    assert result.exit_code == 2
    assert "error" in result.output


def test_chunk_families_list_member_by_member(tmp_path):
    data = yaml.safe_load(Path(TINY).read_text())
    data["parallel"]["hybrid_context_parallel"] = True  # DP·CP = 8: chunks of 2 and 4
    config = write_config(tmp_path, data)
    table = invoke(config)
    assert table.exit_code == 0, table.output
    assert "hybrid_dp_cp_2" in table.output and "hybrid_dp_cp_4" in table.output
    payload = json.loads(invoke(config, "--kind", "hybrid_dp_cp_4", "--json").output)
    assert payload["groups"] == {"hybrid_dp_cp_4": [[0, 1, 2, 3], [4, 5, 6, 7]]}
    rank = json.loads(invoke(config, "--rank", "6", "--json").output)
    assert rank["groups"]["hybrid_dp_cp_2"] == [6, 7]
    assert invoke(config, "--rank", "6", "--kind", "hybrid_dp_cp").exit_code == 2


def test_unwritable_svg_path_exits_2(tmp_path):
    result = invoke(TINY, "--svg", str(tmp_path / "no" / "such" / "dir.svg"))
    assert result.exit_code == 2


# ----------------------------------------------------------------- formatting


@pytest.mark.parametrize(
    ("group", "text"),
    [
        ([0, 64], "[0, 64]"),
        (list(range(128)), "[0–127] (128)"),
        (list(range(0, 128, 2)), "[0, 2, …, 126] (64)"),
        ([*range(0, 64), *range(128, 192), *range(64, 128)], "[0–63, 128–191, 64–127] (192)"),
        ([r for s in range(0, 1024, 128) for r in range(s, s + 64)], "[0–63, 128–191, …, 896–959] (512)"),
    ],
)
def test_format_group(group, text):
    assert format_group(group) == text


def test_grid_spec_from_the_v4_config():
    spec = grid_spec_from_config(load_config(V4_PRO))
    assert spec == GridSpec(
        world_size=1024, tp=1, cp=2, pp=8, ep=64, etp=1, order="tp-cp-ep-dp-pp",
        tied_embeddings=False, mtp_stages=(7,), num_experts=384,
        moe_layers_by_stage=spec.moe_layers_by_stage,
    )
    # The layout string puts 6 blocks on stage 0, 8 on each middle stage, 7 + MTP on the last.
    assert [len(s) for s in spec.moe_layers_by_stage] == [6, 8, 8, 8, 8, 8, 8, 8]
    assert spec.moe_layers_by_stage[7][-1] == 61  # the MTP block: num_layers + depth 0


def test_one_process_runs_a_second_command_after_a_lazily_loaded_first(capsys: pytest.CaptureFixture[str]):
    """The command line loads only the command named; a second call in the same process (a
    harness, a notebook) still finds every other command."""
    from planner.cli import CommandLine

    cli = CommandLine(name="moeplan", no_args_is_help=True, add_completion=False,
                      pretty_exceptions_enable=False)
    for argv in (["groups", TINY, "--rank", "3", "--json"], ["check", TINY]):
        with pytest.raises(SystemExit) as done:
            cli(argv)
        assert done.value.code == 0, capsys.readouterr()
    assert "valid" in capsys.readouterr().out


# ----------------------------------------------------------------- the result cache


def test_a_cached_grid_spec_is_the_spec_of_every_example():
    """What the cache stores reads back as the same spec (tuples, nested stages, None HCP)."""
    for path in sorted(EXAMPLES.glob("*.yaml")):
        spec = grid_spec_from_config(load_config(path))
        assert GridSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec, path.name


def test_groups_reads_a_valid_config_back_from_the_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MOEPLAN_CACHE_DIR", str(cache))
    first = invoke(V4_PRO, "--rank", "64", "--json")
    assert first.exit_code == 0, first.output
    [entry] = (cache / "grid-spec").iterdir()
    # A fresh process answers from the entry: same bytes, and neither the schema nor a rule loaded.
    probe = ("import sys, runpy; sys.argv = ['moeplan', 'groups', sys.argv[1], '--rank', '64', "
             "'--json']\ntry:\n    runpy.run_module('planner.cli', run_name='__main__')\n"
             "except SystemExit:\n    pass\nprint(sorted(m for m in sys.modules if m.startswith("
             "('planner.config.schema', 'planner.rules'))), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, V4_PRO], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "MOEPLAN_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr
    assert done.stdout == first.stdout
    assert done.stderr.strip() == "[]"
    # Another config is another key; a spec that no longer reads is validated again and rewritten.
    entry.write_text("{\"world_size\": 0}")
    assert invoke(V4_PRO, "--rank", "64", "--json").stdout == first.stdout
    assert json.loads(entry.read_text())["world_size"] == 1024
    assert invoke(TINY, "--rank", "1", "--json").exit_code == 0
    assert len(list((cache / "grid-spec").iterdir())) == 2


def test_groups_never_caches_an_invalid_or_file_reading_config(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MOEPLAN_CACHE_DIR", str(cache))
    data = yaml.safe_load(Path(TINY).read_text())
    data["parallel"]["world_size"] = 7  # not a multiple of the model-parallel size
    bad = write_config(tmp_path, data)
    for _ in range(2):
        assert invoke(bad, "--rank", "0", "--json").exit_code == 1
    assert not (cache / "grid-spec").exists()
    # A config whose load reads another file (model.hf_config) is never stored: its bytes alone
    # would key an answer that file can change.
    example = yaml.safe_load((EXAMPLES / "architectures" / "glm-4.7-flash-16.yaml").read_text())
    example["model"]["hf_config"] = str(HF_FILES / "glm-4.7-flash.json")
    reads_hf = tmp_path / "reads_hf.yaml"
    reads_hf.write_text(yaml.safe_dump(example))
    assert invoke(str(reads_hf), "--rank", "0", "--json").exit_code == 0
    assert not (cache / "grid-spec").exists()
    # A cache folder that cannot be made (a file is in the way) is no cache, not an error.
    cache.write_text("")
    assert invoke(TINY, "--rank", "1", "--json").exit_code == 0

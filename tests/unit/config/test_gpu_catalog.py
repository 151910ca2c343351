"""The GPU catalog's Ampere and China-market cards: the card fills the figures the verdicts read,
a log names the card as CUDA does, and FP8 is refused where Transformer Engine refuses it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app
from planner.cli_common import collect_findings
from planner.config.gpus import card_named
from planner.config.importers.megatron_log import log_essentials, log_front_end
from planner.config.loader import parse_config
from planner.config.schema import Config
from planner.rules import run_rules
from tests.support.launch_corpus import imported_once

runner = CliRunner()


def codes(cfg: Config) -> dict[str, str]:
    return {f.code: f.message for f in collect_findings(cfg)}


@pytest.mark.parametrize("card", ["H100", "H20"])
def test_verls_qwen3_30b_recipe_fits_the_h20_it_is_tested_on(card: str) -> None:
    """verl's Qwen3-30B-A3B Megatron recipe (tested on 96 GB H20s) needs 95.24 GiB a rank, the same
    on either card: over an H100's 80 GiB (MEM001, 119.1 %), under an H20's 96 GiB (the datasheet's
    96 GB read as GiB, as the catalog reads every card) at 99.2 %, inside the last 8 % (MEM002)."""
    result, _ = imported_once("verl_qwen3moe_30b_megatron.sh")
    data: dict[str, Any] = {**result.data, "cluster": {**result.data.get("cluster", {}), "gpu": card}}
    cfg = parse_config(data)
    assert cfg.cluster.gpu_memory_gib == {"H100": 80, "H20": 96}[card]
    found = codes(cfg)
    if card == "H100":
        assert "MEM001" in found and "MEM002" not in found
        assert found["MEM001"].startswith("stage 0 needs an estimated 95.24 GiB per rank, 119.1 % of 80 GiB")
    else:
        assert "MEM001" not in found and "MEM002" in found
        assert "95.24 GiB" in found["MEM002"] and "99.2 % of 96 GiB" in found["MEM002"], found["MEM002"]


def small(cluster: dict[str, Any], training: dict[str, Any] | None = None) -> Config:
    return Config.model_validate({
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 8, "vocab_size": 512,
                  "num_experts": 8, "moe_ffn_hidden_size": 64},
        "parallel": {"world_size": 8, "ep": 8},
        "training": {"seq_length": 256, "global_batch_size": 8, **(training or {})},
        "cluster": cluster}, strict=False)


def test_an_a100_has_no_fp8_rate_and_refuses_fp8_naming_the_field() -> None:
    """A100-80GB: 312 dense BF16 TFLOP/s, no FP8 (the datasheet lists none; TE needs compute
    capability 8.9); the field named is the one the config wrote."""
    bf16 = small({"gpu": "A100-80GB"})
    assert (bf16.cluster.peak_bf16_tflops, bf16.cluster.peak_fp8_tflops,
            bf16.cluster.hbm_bandwidth_tb_s, bf16.cluster.intra_node_bandwidth_gb_s) == (
        312, None, 2.039, 300)
    assert "CLU005" not in {f.code for f in run_rules(bf16)}
    for training, field in (({"fp8": True}, "training.fp8"),
                            ({"fp8_format": "hybrid"}, "training.fp8_format")):
        [finding] = [f for f in run_rules(small({"gpu": "A800"}, training)) if f.code == "CLU005"]
        assert finding.severity == "error" and finding.path == field, finding
        assert "A800" in finding.message and "8.9" in finding.message


@pytest.mark.parametrize(("cluster", "refused"), [
    ({"gpu": "H100"}, True), ({"gpu": "H20"}, True), ({"gpu": "B200"}, False),
    ({}, False),  # no card named: the H100 default says nothing about the hardware
])
def test_mxfp8_needs_a_named_blackwell(cluster: dict[str, Any], refused: bool) -> None:
    found = {f.code for f in run_rules(small(cluster, {"fp8_format": "e4m3", "fp8_recipe": "mxfp8"}))}
    assert ("CLU006" in found) is refused


@pytest.mark.parametrize(("line", "card"), [
    ("GPU 0: NVIDIA H20 (UUID: GPU-1)", "H20"),
    ("device name: NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A800-SXM4-80GB", "A800"),
    ("NVIDIA A100 80GB PCIe", None),  # a PCIe A100 (NVLink bridges of two) is not the catalog's SXM card
    ("GPU 0: NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA H200 NVL", "H200-NVL"), ("GPU 3: NVIDIA L20 (UUID: GPU-3)", "L20"),
    ("NVIDIA GH200 480GB", "GH200"),  # a Grace Hopper: its own memory and NVLink, not an H200
    ("0, NVIDIA GH200 144G HBM3e, 580.173.02, 146831 MiB, 9.0", "GH200-144GB"),
    ("NVIDIA GH200", None),  # 96 or 144 GB: not fixed
    ("layer L20 done", None),  # only CUDA's "NVIDIA L20" names the card
    ("NVIDIA H800 PCIe", None),
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("H20s", None),
])
def test_a_log_names_the_card_as_cuda_does(line: str, card: str | None) -> None:
    assert card_named(line) == card



def test_the_log_importer_takes_the_card_the_log_names() -> None:
    """A log line outside the argument dump naming a card ("NVIDIA H20") sets cluster.gpu and says
    so; a dump entry naming one (a checkpoint path) does not."""
    dump = ("------------------------ arguments ------------------------\n"
            "  num_layers ...................................... 4\n"
            "  save ............................................ /ckpt/H100-run\n"
            "-------------------- end of arguments ---------------------\n")
    assert log_front_end(dump)[0].fields.get("cluster.gpu") is None
    front, _ = log_front_end("GPU 0: NVIDIA H20 (UUID: GPU-0)\n" + dump)
    assert front.fields["cluster.gpu"] == "H20"
    assert [n.why for n in front.notes if n.argument == "GPU"] == [
        "the log names the card: cluster.gpu H20"]
    assert log_essentials(("noise\n" + "GPU 0: NVIDIA H20\n" * 2 + dump).splitlines(True))[0] == (
        "GPU 0: NVIDIA H20\n")


def test_import_takes_the_gpu_named_and_refuses_one_the_catalog_lacks(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 64 "
                      "--num-attention-heads 8 --vocab-size 512 --seq-length 256 "
                      "--max-position-embeddings 256 --micro-batch-size 1 --global-batch-size 8\n",
                      encoding="utf-8")
    out = tmp_path / "job.yaml"
    done = runner.invoke(app, ["import", "megatron", str(script), "--gpu", "A800", "-o", str(out)])
    assert yaml.safe_load(out.read_text())["cluster"]["gpu"] == "A800", done.output
    refused = runner.invoke(app, ["import", "megatron", str(script), "--gpu", "A100"])
    assert refused.exit_code == 2 and "--gpu A100: not in the GPU catalog" in refused.output
    # a file in a folder named for a card (Primus's examples/megatron/configs/MI300X/) names it
    folder = tmp_path / "configs" / "MI355X"
    folder.mkdir(parents=True)
    (folder / "run.sh").write_text(script.read_text(encoding="utf-8"), encoding="utf-8")
    read = runner.invoke(app, ["import", "megatron", str(folder / "run.sh"), "--json"])
    report = json.loads(read.stdout)
    assert report["config"]["cluster"]["gpu"] == "MI355X", read.output
    assert any(row["argument"] == "GPU" and "MI355X/" in row["why"] for row in report["unmapped"])


@pytest.mark.parametrize(("card", "pcie", "bridge"), [
    ("H100-PCIe", 64, "NVLink bridge of 2 cards (300 GB/s one way)"),
    ("H100-NVL", 64, "NVLink bridge of 2 cards (300 GB/s one way)"),
    ("H200-NVL", 64, "NVLink bridge of 4 cards (450 GB/s one way)"),
])
def test_a_bridged_pcie_card_is_priced_at_pcie_and_says_so(card: str, pcie: int, bridge: str) -> None:
    """No NVSwitch: the node's 8 GPUs meet over PCIe Gen5 x16 (128 GB/s both ways, 64 one way), which
    the time page's bw_nvlink takes; the bridge is named as not modelled (CLU007, a warning), and is
    silent once the config sets the intra-node figure or the node holds one GPU."""
    from planner.budget.hardware import hardware_values
    cfg = small({"gpu": card})
    assert (cfg.cluster.intra_node_bandwidth_gb_s, cfg.cluster.nvlink_domain) == (pcie, 8)
    assert hardware_values(cfg)["bw_nvlink"] == pcie * 10**9
    [finding] = [f for f in run_rules(cfg) if f.code == "CLU007"]
    assert finding.severity == "warning" and finding.path == "cluster.intra_node_bandwidth_gb_s"
    assert f"priced at its PCIe link ({pcie} GB/s one way); the {bridge} is not modelled" in finding.message
    for quiet in ({"gpu": card, "intra_node_bandwidth_gb_s": 300}, {"gpu": card, "gpus_per_node": 1}):
        assert "CLU007" not in {f.code for f in run_rules(small(quiet))}
    assert "CLU007" not in {f.code for f in run_rules(small({"gpu": "H100"}))}


def test_grace_hopper_and_l20_fill_their_own_figures() -> None:
    """GH200: the H100's rates, its own HBM (96 or 144 GB), a Grace host, one superchip a node; L20:
    Ada (FP8 runs, MXFP8 refused, the pre-9.0 cuBLAS workspaces), 32 GB/s PCIe Gen4 one way."""
    from planner.config.gpus import HOSTS, pre_hopper
    gh = small({"gpu": "GH200-144GB", "gpus_per_node": 4})
    assert (gh.cluster.gpu_memory_gib, gh.cluster.hbm_bandwidth_tb_s, gh.cluster.peak_bf16_tflops,
            gh.cluster.efficiency.host_launch_scale) == (144, 4.9, 989, HOSTS["grace"].launch_scale)
    assert small({"gpu": "GH200"}).cluster.gpus_per_node == 1
    l20 = small({"gpu": "L20"}, {"fp8": True})
    assert (l20.cluster.peak_fp8_tflops, l20.cluster.intra_node_bandwidth_gb_s, pre_hopper("L20")) == (
        239, 32, True)
    assert "CLU005" not in {f.code for f in run_rules(l20)}
    [mx] = [f for f in run_rules(small({"gpu": "L20"}, {"fp8_format": "e4m3", "fp8_recipe": "mxfp8"}))
            if f.code == "CLU006"]
    assert "Ada, compute capability 8.9" in mx.message

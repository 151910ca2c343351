"""The GPU catalog, FP8 spellings and `moeplan estimate`: its step-time formulas by hand, the
directions they must move in, and the calibration anchors."""

from __future__ import annotations

from typing import Any

import pytest

from planner.gpus import GPUS
from planner.schema import Config

MODEL = {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "vocab_size": 16,
         "num_experts": 4}


def cfg(cluster: dict[str, Any] | None = None, training: dict[str, Any] | None = None) -> Config:
    return Config.model_validate({"model": MODEL, "parallel": {"world_size": 8},
                                  "training": {"seq_length": 8, **(training or {})},
                                  "cluster": cluster or {}}, strict=False)


def test_catalog_holds_the_vendor_figures() -> None:
    """Dense BF16/FP8 TFLOP/s, memory, HBM TB/s, NVLink and scale-out GB/s per GPU, NVLink domain."""
    table = {name: (g.bf16_tflops, g.fp8_tflops, g.memory_gib, g.hbm_tb_s, g.nvlink_gb_s,
                    g.scale_out_gb_s, g.nvlink_domain) for name, g in GPUS.items()}
    assert table == {
        "H100": (989, 1979, 80, 3.35, 450, 50, 8), "H200": (989, 1979, 141, 4.8, 450, 50, 8),
        "H800": (989, 1979, 80, 3.35, 160, 50, 8), "B200": (2250, 4500, 180, 8, 900, 50, 8),
        "GB200": (2500, 5000, 186, 8, 900, 50, 72), "B300": (2250, 4500, 288, 8, 900, 100, 8),
        "GB300": (2500, 5000, 288, 8, 900, 100, 72)}


def test_without_a_gpu_the_defaults_are_unchanged() -> None:
    c = cfg().cluster
    assert (c.gpus_per_node, c.gpu_memory_gib, c.intra_node_bandwidth_gb_s,
            c.inter_node_bandwidth_gb_s, c.nvlink_domain) == (8, 80.0, 450.0, 50.0, 8)


def test_a_gpu_fills_what_is_unset_and_the_config_wins() -> None:
    c = cfg({"gpu": "GB200", "gpu_memory_gib": 180}).cluster
    assert (c.gpus_per_node, c.nvlink_domain, c.gpu_memory_gib, c.peak_bf16_tflops,
            c.intra_node_bandwidth_gb_s) == (4, 72, 180, 2500, 900)


def test_nvlink_domain_must_be_whole_nodes() -> None:
    with pytest.raises(ValueError, match="nvlink_domain 6 is not a whole number of nodes"):
        cfg({"nvlink_domain": 6})


def test_fp8_format_turns_fp8_on_and_a_recipe_needs_it() -> None:
    t = cfg(training={"fp8_format": "hybrid", "fp8_recipe": "blockwise"}).training
    assert (t.fp8, t.fp8_format, t.fp8_recipe) == (True, "hybrid", "blockwise")
    with pytest.raises(ValueError, match="fp8_recipe mxfp8 without FP8"):
        cfg(training={"fp8_recipe": "mxfp8"})
    with pytest.raises(ValueError, match="fp8_format e4m3 but training.fp8 is false"):
        cfg(training={"fp8_format": "e4m3", "fp8": False})

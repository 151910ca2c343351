"""V4011 (DeepSeek-V4 CP boundary window) and DOP007 (Muon without an FSDP), derived by hand."""

from __future__ import annotations

import yaml

from planner.config.loader import parse_config
from planner.rules.catalog import run_rules
from planner.rules.example_base import EXAMPLE_BASE_YAML, merge

V4_CP = """
model: {attention_variant: dsv4_hybrid, compress_ratios: [0, 4, 128, 4]}
parallel: {cp: 2, cp_partition_mode: contiguous}
training: {sequence_packing_scheduler: dp_balanced}
"""


def codes(overlay: str, *extra: str) -> dict[str, str]:
    data = yaml.safe_load(EXAMPLE_BASE_YAML)
    for text in (overlay, *extra):
        data = merge(data, yaml.safe_load(text))
    return {f.code: f.message for f in run_rules(parse_config(data))}


def test_hca_window_is_its_ratio() -> None:
    # seq 256 · mbs 1 / CP 2 = 128 rows = HCA's window 128: allowed; CP 4 gives 64 < 128
    assert "V4011" not in codes(V4_CP)
    found = codes(V4_CP, "parallel: {cp: 4}")
    assert found["V4011"] == ("cp 4 leaves 64 packed rows per CP rank (micro_batch_size 1 · "
                              "seq_length 256 / 4), fewer than the boundary window 128 = "
                              "max(csa_window_size, compressor reach)")


def test_csa_only_needs_eight_rows_or_the_window() -> None:
    csa_only = "model: {compress_ratios: [0, 4, 4, 4]}"
    # CSA reach 2·4 = 8 rows; 64 rows per rank are enough
    assert "V4011" not in codes(V4_CP, csa_only, "parallel: {cp: 4}")
    # a sliding window of 128 raises the need to 128 even without HCA
    assert "V4011" in codes(V4_CP, csa_only, "parallel: {cp: 4}", "model: {csa_window_size: 128}")


def test_muon_refuses_megatron_fsdp() -> None:
    assert "DOP007" in codes("training: {optimizer: muon, use_megatron_fsdp: true}")
    assert "DOP007" not in codes("training: {optimizer: muon, use_distributed_optimizer: true}")
    assert "DOP007" not in codes("training: {optimizer: adam, use_megatron_fsdp: true}")

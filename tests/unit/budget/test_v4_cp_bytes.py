"""DeepSeek-V4 attention under context parallelism: the boundary rows sent to the next CP rank and
the all-gathers of compressed KV and indexer keys, per stage, with hand-derived expectations.

What Megatron issues per V4 attention layer and microbatch with CP > 1 (Megatron-LM dev@d48bd6be
megatron/core/transformer/experimental_attention_variant/csa_utils/cp_utils.py
exchange_cp_boundary_hidden, prepare_cp_compressor_input; csa.py
CompressedSparseAttention._forward_thd_cp):
* p2p: the last max(window, reach) rows of the attention input [n, h] go to the next CP rank
  (reach = 8 for CSA, the ratio for HCA, 0 for window-only layers); backward returns their grads;
* all-gather over CP of each rank's fixed-capacity compressed KV, c = ceil(floor((n + reach) /
  ratio) / a) · a rows (a = 32 / gcd(32, ratio)), d wide; backward reduce-scatters the grads;
* CSA layers also all-gather the indexer keys (same rows, index_head_dim wide).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from planner.accounting import COLLECTIVES, Variant, budgets, formula_book
from planner.config.loader import load_config, parse_config
from tests.support.paths import ROOT

PRO = ROOT / "examples" / "deepseek-v4-pro-1024.yaml"
NAMES = ("cp_boundary_hidden", "cp_compressed_kv_gather", "cp_indexer_k_gather")
PARTS = ("send_bytes", "recv_bytes", "wire_bytes", "intra_node_bytes", "inter_node_bytes")

# A tiny V4 model on CP 2: three layers, one CSA (ratio 4), one HCA (ratio 128), one window-only.
# Megatron accepts only the ratios 0, 4 and 128, and its boundary exchange needs n >= 128 local rows.
TINY: dict[str, Any] = {
    "model": {
        "attention_variant": "dsv4_hybrid", "compress_ratios": [4, 128, 0],
        "num_layers": 3, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 1,
        "kv_channels": 16, "qk_pos_emb_head_dim": 8, "kv_lora_rank": 8, "q_lora_rank": 16,
        "o_groups": 2, "o_lora_rank": 8, "csa_window_size": 8, "index_n_heads": 2,
        "index_head_dim": 8, "index_topk": 4, "ffn_hidden_size": 128, "vocab_size": 256,
        "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 32,
        "untie_embeddings_and_output_weights": True,
    },
    "parallel": {"world_size": 8, "tp": 1, "cp": 2, "pp": 1, "ep": 2, "etp": 1,
                 "cp_partition_mode": "contiguous"},
    "training": {"seq_length": 512, "micro_batch_size": 1, "global_batch_size": 8,
                 "qkv_format": "thd", "sequence_packing_scheduler": "dp_balanced",
                 "precision": "fp32"},
    "moe": {"moe_token_dispatcher_type": "alltoall"},
    "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu_memory_gib": 2},
}


def tiny(**sections: dict[str, Any]) -> Any:
    data = copy.deepcopy(TINY)
    for section, values in sections.items():
        data[section].update(values)
    return parse_config(data)


def figures(cfg: Any, *, rank: int | None = None) -> dict[tuple[int, str], Any]:
    """(stage, name) -> value of every V4 CP figure (per-layer bytes and step predictions)."""
    return {(b.stage, b.name): b.value for b in budgets(cfg, rank=rank)
            if b.name.startswith(("cp_", "step.cp_", "act_v4_cp"))}


# --------------------------------------------------------------------------- the tiny config
#
# n = S / CP = 512 / 2 = 256 rows per rank; m = B / (b · DP) = 8 / (1 · 4) = 2 microbatches;
# h = 64, d = 16, idx_dim = 8, p = 4 (fp32), window 8.
# Boundary rows: CSA max(8, 2·4) = 8, HCA max(8, 128) = 128, window-only 8 → 144 rows · 64 · 4
#   = 36,864 B per microbatch.
# CSA capacity: floor((256 + 8) / 4) = 66, a = 32 / gcd(32, 4) = 8 → 72 rows.
# HCA capacity: floor((256 + 128) / 128) = 3, a = 32 / gcd(32, 128) = 1 → 3 rows.
# Compressed KV: (72 + 3) · 16 · 4 = 4,800 B; indexer keys: 72 · 8 · 4 = 2,304 B per microbatch.

TINY_LAYER = {"cp_boundary_rows_csa": 8, "cp_boundary_rows_hca": 128, "cp_boundary_rows_swa": 8,
              "cp_csa_compressed_rows": 72, "cp_hca_compressed_rows": 3,
              "cp_boundary_bytes": 36864, "cp_compressed_kv_bytes": 4800,
              "cp_indexer_k_bytes": 2304}


def test_tiny_per_layer_rows_and_bytes() -> None:
    got = figures(tiny())
    assert {name: got.get((None, name), got.get((0, name))) for name in TINY_LAYER} == TINY_LAYER


# Boundary rows: 36,864 B · m = 2 → 73,728 B per step. All-gather: own 4,800 B · 2 out, CP · that
# in, ring wire (CP - 1) shards; its backward reduce-scatter takes the whole gathered grad in and
# returns the own shard, (CP - 1) / CP of the input on the wire. Indexer keys: 2,304 · 2 = 4,608.
BOUNDARY = 36864 * 2
GATHERS = {"cp_compressed_kv_gather": {"fwd": (9600, 19200, 9600), "bwd": (19200, 9600, 9600)},
           "cp_indexer_k_gather": {"fwd": (4608, 9216, 4608), "bwd": (9216, 4608, 4608)}}


@pytest.mark.parametrize(("rank", "sends", "receives"), [(0, 1, 0), (1, 0, 1)])
def test_tiny_steps_on_the_first_and_last_cp_rank(rank: int, sends: int, receives: int) -> None:
    # rank 0 is CP rank 0 (order tp-cp-ep-dp-pp): it sends its boundary rows, receives none, and
    # gets the grads of those rows back in backward; rank 1 is the mirror image.
    got = figures(tiny(), rank=rank)
    boundary = {(ph, d): got[0, f"step.cp_boundary_hidden.{ph}.{d}_bytes"]
                for ph in ("fwd", "bwd") for d in ("send", "recv", "wire")}
    assert boundary == {("fwd", "send"): sends * BOUNDARY, ("fwd", "recv"): receives * BOUNDARY,
                        ("fwd", "wire"): sends * BOUNDARY, ("bwd", "send"): receives * BOUNDARY,
                        ("bwd", "recv"): sends * BOUNDARY, ("bwd", "wire"): receives * BOUNDARY}
    for name, phases in GATHERS.items():
        for phase, expected in phases.items():
            assert tuple(got[0, f"step.{name}.{phase}.{d}_bytes"]
                         for d in ("send", "recv", "wire")) == expected, (name, phase)


def test_tiny_intra_and_inter_node_split() -> None:
    # 8 ranks on one node: every CP peer is local. One GPU per node: every CP edge crosses nodes.
    local = figures(tiny(), rank=0)
    spread = figures(tiny(cluster={"nodes": 8, "gpus_per_node": 1}), rank=0)
    for name in NAMES:
        for phase in ("fwd", "bwd"):
            base = f"step.{name}.{phase}"
            assert local[0, f"{base}.inter_node_bytes"] == 0
            assert local[0, f"{base}.intra_node_bytes"] == local[0, f"{base}.wire_bytes"]
            assert spread[0, f"{base}.intra_node_bytes"] == 0
            assert spread[0, f"{base}.inter_node_bytes"] == spread[0, f"{base}.wire_bytes"]
    assert spread[0, "step.cp_boundary_hidden.fwd.inter_node_bytes"] == 73728


def test_tiny_memory_keeps_the_gathered_buffers() -> None:
    # boundary hidden 36,864 + boundary KV (8 + 128 + 8) · 16 · 4 = 9,216
    # + CP · (compressed KV 4,800 + indexer keys 2,304) = 14,208 → 60,288 B per microbatch
    got = figures(tiny())
    assert got[0, "act_v4_cp_per_microbatch"] == 36864 + 9216 + 14208 == 60288


def test_cp_one_issues_nothing() -> None:
    got = figures(tiny(parallel={"cp": 1}))
    steps = {name: value for (_, name), value in got.items() if name.startswith("step.")}
    assert set(steps) == {f"step.{n}.{ph}.{d}" for n in NAMES for ph in ("fwd", "bwd")
                          for d in ("send_bytes", "recv_bytes")}
    assert set(steps.values()) == {0}
    assert not set(TINY_LAYER) & {name for _, name in got}


def test_standard_attention_has_none_of_them() -> None:
    cfg = tiny(model={"attention_variant": "standard", "compress_ratios": None})
    assert not any(name.startswith("step.cp_b") or "compressed" in name
                   for _, name in figures(cfg))


def test_only_v4_attention_with_cp_selects_the_formulas() -> None:
    base = formula_book(Variant(**{**_pro_variant().__dict__}))
    other = formula_book(Variant(**{**_pro_variant().__dict__, "kinds": frozenset({"mla"})}))
    assert "cp_boundary_bytes" in {q.name for q in base.quantities}
    assert "cp_boundary_bytes" not in {q.name for q in other.quantities}


def _pro_variant() -> Variant:
    from planner.docs.formulas_page import baseline_variant

    return baseline_variant()


# --------------------------------------------------------------------------- the V4-Pro example
#
# n = 8,192 / 2 = 4,096; m = 4,096 / (1 · 64) = 64; h = 7,168, d = 512, idx_dim = 128, p = 2.
# Layout "Et*6|(t*8|)*6t*7mL": stage 0 layers 0-5, stages 1-6 eight layers each, stage 7 layers
# 54-60 and the MTP block. compress_ratios = [128, 128, 4] + [128, 4]·29 + [0]: layers 0, 1 and
# every odd layer are HCA, every even layer from 2 on is CSA, MTP is window-only. So
#   stage 0: CSA {2, 4}, HCA {0, 1, 3, 5}            → L_csa 2, L_hca 4, 6 blocks
#   stage s in 1..6: layers 8s-2 .. 8s+5             → L_csa 4, L_hca 4, 8 blocks
#   stage 7: CSA {54, 56, 58, 60}, HCA {55, 57, 59}  → L_csa 4, L_hca 3, 8 blocks (MTP included)
# Boundary rows: max(128, 8) = max(128, 128) = 128 for every layer → blocks · 128 · 7,168 · 2 B.
# CSA capacity: floor((4,096 + 8) / 4) = 1,026 → next multiple of 8 = 1,032 rows.
# HCA capacity: floor((4,096 + 128) / 128) = 33 rows (a = 32 / gcd(32, 128) = 1).

def _pro_expected(l_csa: int, l_hca: int, blocks: int) -> dict[str, int]:
    m, h, d, idx, p = 64, 7168, 512, 128, 2
    boundary = blocks * 128 * h * p * m
    kv = (l_csa * 1032 + l_hca * 33) * d * p * m
    keys = l_csa * 1032 * idx * p * m
    return {"step.cp_boundary_hidden.fwd.send_bytes": boundary,
            "step.cp_boundary_hidden.fwd.recv_bytes": 0,  # the first rank is CP rank 0
            "step.cp_boundary_hidden.bwd.recv_bytes": boundary,
            "step.cp_compressed_kv_gather.fwd.send_bytes": kv,
            "step.cp_compressed_kv_gather.fwd.recv_bytes": 2 * kv,
            "step.cp_compressed_kv_gather.bwd.send_bytes": 2 * kv,
            "step.cp_indexer_k_gather.fwd.send_bytes": keys,
            "step.cp_indexer_k_gather.bwd.recv_bytes": keys}


PRO_STAGES = {0: (2, 4, 6), **{s: (4, 4, 8) for s in range(1, 7)}, 7: (4, 3, 8)}


def test_pro_example_per_stage() -> None:
    got = figures(load_config(PRO))
    for stage, counts in PRO_STAGES.items():
        for name, value in _pro_expected(*counts).items():
            assert got[stage, name] == value, (stage, name)
    # the worked numbers, written out
    assert got[0, "step.cp_boundary_hidden.fwd.send_bytes"] == 6 * 128 * 7168 * 2 * 64 == 704643072
    assert got[1, "step.cp_compressed_kv_gather.fwd.send_bytes"] == 4260 * 1024 * 64 == 279183360
    assert got[7, "step.cp_compressed_kv_gather.fwd.send_bytes"] == 4227 * 1024 * 64 == 277020672
    assert got[1, "step.cp_indexer_k_gather.fwd.send_bytes"] == 4128 * 256 * 64 == 67633152


def test_pro_example_names_every_stage_and_stays_on_the_node() -> None:
    # CP pairs are ranks (2j, 2j + 1) under tp-cp-ep-dp-pp, always on one 8-GPU node.
    got = figures(load_config(PRO))
    for stage in range(8):
        for name in NAMES:
            for phase in ("fwd", "bwd"):
                for part in PARTS:
                    assert (stage, f"step.{name}.{phase}.{part}") in got
                assert got[stage, f"step.{name}.{phase}.inter_node_bytes"] == 0


def test_table_entries_are_rerun_by_full_recompute_only() -> None:
    for name in NAMES:
        assert COLLECTIVES[name].groups == ("cp",)
        assert COLLECTIVES[name].recomputed_with == frozenset({"full"})
    # the recompute phase re-runs the forward's algorithm
    assert COLLECTIVES["cp_boundary_hidden"].phases == {"fwd": ("p2p",), "bwd": ("p2p",),
                                                        "recompute": ("p2p",)}
    assert COLLECTIVES["cp_compressed_kv_gather"].phases == {"fwd": ("allgather",),
                                                             "bwd": ("reduce_scatter",),
                                                             "recompute": ("allgather",)}


def test_the_runtime_refuses_a_v4_plan_and_says_the_cp_figures_are_predicted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from planner.plan import compile_plan
    from planner.plan_format import write_plan
    from planner.rules import run_rules
    from runtime.__main__ import main

    cfg = tiny()
    plan = tmp_path / "tiny-v4.plan.json"
    write_plan(compile_plan(cfg, run_rules(cfg)), plan)
    assert any(b["name"] == "step.cp_boundary_hidden.fwd.send_bytes"
               for b in json.loads(plan.read_text())["budgets"])
    assert main(["--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert "attention_variant = 'dsv4_hybrid'" in err and "predicted only" in err

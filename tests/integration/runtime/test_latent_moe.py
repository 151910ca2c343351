"""Latent MoE (moe_latent_size = ℓ): the payload, parameters and activations it changes, and a
real multi-rank run that equals the reference and moves exactly the predicted bytes (4 gloo
ranks in tests/integration/runtime/test_runtime_equivalence.py's shared launch).

Megatron-LM dev@d48bd6be megatron/core/transformer/moe/moe_layer.py: MoELayer.preprocess projects
the rows h → ℓ (fc1_latent_proj) after the router and before the dispatcher, MoELayer.postprocess
projects the combined rows ℓ → h (fc2_latent_proj) before the shared expert's output is added;
both projections are TELinear in "duplicated" mode (whole on every TP rank, dense parameters).
megatron/core/transformer/moe/experts.py TEGroupedMLP sizes FC1's input and FC2's output at ℓ.
So every exchange of routed rows moves ℓ-wide rows; router and shared expert stay at h.

The small layout of every hand derivation below (unless a test says otherwise): h = 32, ℓ = 8,
E = 4 experts, k = 2, I = 16 (routed), I_s = 16 (shared), 2 MoE layers, S = 16, b = 1, fp32
(p = 4), world 2 = DP2 dense, EP2 expert, global batch 4 ⇒ n = 16 rows per rank, m = 4 / 2 = 2
microbatches, 2 layers × 2 microbatches = 4 MoE passes per step.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.accounting import budgets
from planner.config.loader import InvalidConfig, load_config, parse_config
from planner.rules import run_rules
from tests.support.launch import LATENT, latent_small, moeplan
from tests.support.megatron_lines import megatron_line
from tests.support.paths import EXAMPLES

H, P = 32, 4
PASSES = 2 * 2  # MoE layers × microbatches

# test_runtime_cli's small EP2 layout (the dimensions the docstring derives from) with ℓ = 8.
SMALL: dict[str, Any] = latent_small()
assert SMALL["model"]["hidden_size"] == H and SMALL["training"]["precision"] == "fp32"

MOE_LAYER = "core/transformer/moe/moe_layer.py"
# (path under megatron/, line at dev@d48bd6be, text on that line, function): the facts used here.
CITED_LINES = [
    (MOE_LAYER, 284, 'parallel_mode="duplicated"', "MoELayer.__init__ (fc1_latent_proj)"),
    (MOE_LAYER, 296, 'parallel_mode="duplicated"', "MoELayer.__init__ (fc2_latent_proj)"),
    (MOE_LAYER, 494, "Shared expert overlap with MoE latent projections is not supported",
     "MoELayer.preprocess (MOE016)"),
    (MOE_LAYER, 504, "hidden_states, _ = self.fc1_latent_proj(hidden_states)",
     "MoELayer.preprocess"),
    (MOE_LAYER, 646, "output, _ = self.fc2_latent_proj(output)", "MoELayer.postprocess"),
    ("core/transformer/moe/experts.py", 209,
     "self.input_size if self.config.moe_latent_size is None else self.config.moe_latent_size",
     "TEGroupedMLP.__init__"),
    ("core/transformer/moe/token_dispatcher.py", 1683,
     "self.hidden_dim = config.moe_latent_size or config.hidden_size", "_NCCLEPManager.__init__"),
    ("training/arguments.py", 2179, "args.moe_latent_size > 0", "validate_args"),
]


def small(**sections: dict[str, Any]) -> dict[str, Any]:
    return latent_small(**sections)


def stage0(data: dict[str, Any]) -> dict[str, Any]:
    """name -> value of the global budgets and those of stage 0 (its first rank)."""
    return {b.name: b.value for b in budgets(parse_config(data)) if b.stage in (None, 0)}


def without_latent(data: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    data["moe"].pop("moe_latent_size")
    return data


@pytest.mark.parametrize(("path", "line", "text", "function"), CITED_LINES,
                         ids=[f"{p.rsplit('/', 1)[-1]}:{n}" for p, n, _, _ in CITED_LINES])
def test_cited_megatron_line_says_what_the_test_claims(path, line, text, function):
    assert text in megatron_line(path, line), f"megatron/{path}:{line} ({function})"


# ------------------------------------------------------------------------------ bytes


def test_alltoall_payload_shrinks_to_the_latent_width():
    v = stage0(SMALL)
    # permute 1 sends n·k = 16·2 = 32 rows of ℓ = 8 fp32: 32·8·4 = 1,024 B (h would give 4,096)
    assert v["dispatch_send_rows"] == 32
    assert v["dispatch_send_bytes"] == 32 * LATENT * P == 1024
    # received: E/EP = 2 local experts × EP·n·k/E = 2·16·2/4 = 16 rows each = 32 rows
    assert v["combine_send_bytes"] == 32 * LATENT * P == 1024
    # probs stay one element per row: 32·4 = 128 B
    assert v["dispatch_probs_send_bytes"] == 32 * P
    # per step: × 4 MoE passes
    assert v["step.ep_dispatch_hidden.fwd.send_bytes"] == 1024 * PASSES == 4096
    assert v["step.ep_combine_hidden.bwd.send_bytes"] == 1024 * PASSES
    # the send + combine buffers of one layer: 2 · 1,024
    assert v["comm_buffer_bytes"] == 2048
    plain = stage0(without_latent(SMALL))
    assert plain["dispatch_send_bytes"] == 32 * H * P == 4096


def test_etp_gathers_move_latent_rows():
    # world 4 = DP4 dense, ETP2·EP2 expert, global batch 8 ⇒ n = 16, m = 8 / 4 = 2
    v = stage0(small(parallel={"world_size": 4, "ep": 2, "etp": 2},
                     training={"global_batch_size": 8}))
    # received rows 32 (as above); the ETP all-gather sends its own 32 rows: 32·8·4 = 1,024 B
    assert v["etp_gather_send_bytes"] == 32 * LATENT * P == 1024
    # the reduce-scatter takes the whole gathered input, ETP·32 = 64 rows: 64·8·4 = 2,048 B
    assert v["etp_scatter_send_bytes"] == 64 * LATENT * P == 2048
    assert v["step.etp_gather_hidden.fwd.send_bytes"] == 1024 * PASSES


def test_allgather_dispatcher_gathers_latent_rows():
    v = stage0(small(parallel={"world_size": 4, "ep": 2, "etp": 2},
                     training={"global_batch_size": 8},
                     moe={"moe_token_dispatcher_type": "allgather"}))
    # own n = 16 rows of ℓ: 16·8·4 = 512 B; gathered over tp_ep = 4: 2,048 B
    assert v["ag_gather_send_bytes"] == 16 * LATENT * P == 512
    assert v["ag_gather_recv_bytes"] == 4 * 16 * LATENT * P == 2048
    # probs [n, E] stay: 16·4·4 = 256 B
    assert v["ag_probs_send_bytes"] == 16 * 4 * P
    # buffers: 64 gathered rows × (hidden in and out 2·8·4 + probs 4·4 + map 4) = 64·84
    assert v["comm_buffer_bytes"] == 64 * (2 * LATENT * P + 4 * P + 4) == 5376


def test_flex_payload_is_latent():
    v = stage0(small(moe={"moe_token_dispatcher_type": "flex",
                          "moe_flex_dispatcher_backend": "deepep"}))
    # n·ETP·k = 16·1·2 = 32 rows of ℓ: 1,024 B each way
    assert v["flex_dispatch_send_bytes"] == 32 * LATENT * P == 1024
    assert v["flex_combine_send_bytes"] == 32 * LATENT * P


@settings(max_examples=12, deadline=None)
@given(st.integers(min_value=1, max_value=4 * H))
def test_routed_row_bytes_scale_with_the_latent_width(latent: int):
    """Every routed-row figure is (rows × width × p): ℓ in place of h scales it by ℓ/h."""
    v = stage0(small(moe={"moe_latent_size": latent}))
    plain = stage0(without_latent(SMALL))
    for name in ("dispatch_send_bytes", "combine_send_bytes", "step.ep_dispatch_hidden.fwd.send_bytes",
                 "step.ep_combine_hidden.fwd.recv_bytes"):
        assert v[name] * H == plain[name] * latent, name


@pytest.mark.parametrize("example", ["tiny-cpu-8.yaml", "deepseek-v4-flash-128.yaml"])
def test_latent_equal_to_hidden_moves_the_same_bytes(example: str):
    """ℓ = h changes no routed-row figure; only the projections' parameters and input are added."""
    data = load_config(EXAMPLES / example).model_dump(mode="json", exclude_none=True)
    plain = {b.name: b.value for b in budgets(parse_config(data)) if b.stage in (None, 0)}
    data["moe"]["moe_latent_size"] = data["model"]["hidden_size"]
    same = {b.name: b.value for b in budgets(parse_config(data)) if b.stage in (None, 0)}
    routed = [n for n in plain if n.startswith(("step.ep_", "step.etp_", "step.ag_"))]
    assert routed and all(same[n] == plain[n] for n in routed)
    assert same["routed_params_per_layer"] == plain["routed_params_per_layer"]


# ------------------------------------------------------------------- parameters, activations


def test_parameters_hand_derived():
    v, plain = stage0(SMALL), stage0(without_latent(SMALL))
    # routed experts at ℓ: E/EP = 2 experts × 3 matrices × ℓ·I = 2·3·8·16 = 768 (h: 3,072)
    assert v["routed_params_per_layer"] == 2 * 3 * LATENT * 16 == 768
    assert plain["routed_params_per_layer"] == 2 * 3 * H * 16 == 3072
    assert v["expert_params_on_rank"] == 2 * 768
    # the projections h → ℓ and ℓ → h: 2·32·8 = 512, whole on the rank, dense
    assert v["latent_proj_params_per_layer"] == 2 * H * LATENT == 512
    assert v["dense_params_on_rank"] - plain["dense_params_on_rank"] == 2 * 512


def test_projections_stay_whole_under_tp():
    """TP = 2 (SP on): the shared expert splits over TP, the "duplicated" projections do not."""
    tp = {"world_size": 4, "tp": 2, "ep": 2, "sequence_parallel": True}
    v = stage0(small(parallel=tp, training={"global_batch_size": 4}))
    assert v["latent_proj_params_per_layer"] == 2 * H * LATENT
    assert v["shared_params_per_layer"] == 3 * H * 16 / 2


def test_activations_hand_derived():
    v, plain = stage0(SMALL), stage0(without_latent(SMALL))
    # fc2_latent_proj keeps its input, the combined [n, ℓ] rows: 16·8·4 = 512 B
    assert v["act_latent_per_layer"] == 16 * LATENT * P == 512
    # experts: 32 GEMM rows × (input ℓ + FC1 out 2·I + act I + prob 1)·4 + int64 map n·k·8
    assert v["act_routed_per_layer"] == 32 * (LATENT + 3 * 16 + 1) * P + 32 * 8 == 7552
    assert plain["act_routed_per_layer"] == 32 * (H + 3 * 16 + 1) * P + 32 * 8 == 10624
    # a MoE layer: the expert inputs shrink by 32·(32 − 8)·4 = 3,072, the latent input adds 512
    assert v["act_moe_per_layer"] - plain["act_moe_per_layer"] == 512 - 3072


def test_explain_shows_the_latent_width(tmp_path: Path):
    source = tmp_path / "latent.yaml"
    source.write_text(yaml.safe_dump(SMALL))
    result = moeplan("budget", str(source), "--explain")
    assert result.returncode == 0, result.stderr
    assert "dispatch_send_rows · h_moe · p" in result.stdout and "= 32 · 8 · 4" in result.stdout


# ------------------------------------------------------------------------------- rules


def test_latent_size_must_be_positive():
    # megatron/training/arguments.py:2179 validate_args asserts moe_latent_size > 0
    with pytest.raises(InvalidConfig) as caught:
        parse_config(small(moe={"moe_latent_size": 0}))
    assert [f.path for f in caught.value.findings] == ["moe.moe_latent_size"]


def test_latent_with_shared_expert_overlap_is_refused():
    # megatron/core/transformer/moe/moe_layer.py:494 MoELayer.preprocess raises in training
    found = run_rules(parse_config(small(overlap={"moe_shared_expert_overlap": True})))
    assert [(f.code, f.severity) for f in found if f.code == "MOE016"] == [("MOE016", "error")]

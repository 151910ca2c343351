"""CUDA-graph scope rules (OVL015–OVL023) and the quantised-GEMM alignment warning (MOE021), each
case tied to the Megatron-LM dev@d48bd6be line that decides it (checked against the checkout where
one is present)."""

from __future__ import annotations

from typing import Any

import pytest

from planner.config.loader import parse_config
from planner.rules import run_rules
from planner.rules.example_base import example_config_data, merge
from tests.support.megatron_lines import megatron_line

TRANSFORMER_CONFIG = "core/transformer/transformer_config.py"

CITED_LINES = [
    # TransformerConfig.__post_init__, per-layer graph scopes
    (TRANSFORMER_CONFIG, 3222, "'cuda_graph_modules must not contain both moe and moe_router.'"),
    (TRANSFORMER_CONFIG, 3226, "'moe_preprocess cuda graph is only supported with moe_router"),
    (TRANSFORMER_CONFIG, 3246, "'moe cuda graph is only supported with drop-padding MoE.'"),
    (TRANSFORMER_CONFIG, 3251, "assert CudaGraphModule.moe_preprocess not in self.cuda_graph_modules"),
    (TRANSFORMER_CONFIG, 3260, '"full recompute is only supported with full iteration CUDA graph."'),
    (TRANSFORMER_CONFIG, 3270, '"moe recompute is not supported with moe_router CUDA graph with: "'),
    (TRANSFORMER_CONFIG, 3285, '"attention dropout is not supported with graphed attention "'),
    # cuda_graph_config.normalize_cuda_graph_modules: unknown names fail the enum lookup
    ("core/transformer/cuda_graph_config.py", 57, "normalized_scopes.append(CudaGraphModule[scope])"),
    # validate_args: graphs with a packing scheduler need --pad-packed-seq-alignment
    ("training/arguments.py", 1604, "raise ValueError('THD CUDA Graph requires --pad-packed-seq"),
]


@pytest.mark.parametrize(("path", "line", "text"), CITED_LINES,
                         ids=[f"{p.rsplit('/', 1)[-1]}:{n}" for p, n, _ in CITED_LINES])
def test_cited_megatron_line_says_what_the_rule_claims(path: str, line: int, text: str):
    assert text in megatron_line(path, line), f"megatron/{path}:{line}"


def codes(overlay: dict[str, Any]) -> list[tuple[str, str]]:
    found = run_rules(parse_config(merge(example_config_data(""), overlay)))
    return [(f.code, f.path) for f in found]


def _graphs(impl: str, *scopes: str, **overlap: Any) -> dict[str, Any]:
    return {"overlap": {"cuda_graph_impl": impl, "cuda_graph_scope": list(scopes), **overlap}}


DROP_PAD = {"moe": {"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True}}
DROP = {"moe": {"moe_expert_capacity_factor": 1.0}}


@pytest.mark.parametrize("impl", ["local", "transformer_engine"])
@pytest.mark.parametrize(("moe", "fires"), [({}, True), (DROP, True), (DROP_PAD, False)])
def test_moe_scope_needs_drop_and_pad(impl: str, moe: dict[str, Any], fires: bool):
    # transformer_config.py:3246
    found = codes(merge(_graphs(impl, "moe"), moe))
    assert (("OVL015", "overlap.cuda_graph_scope") in found) == fires


def test_no_graphs_no_scope_rules():
    # cuda_graph_impl none: Megatron skips every per-layer scope check
    assert codes(_graphs("none", "moe")) == []


def test_moe_and_router_scopes_are_exclusive():
    # transformer_config.py:3222
    assert codes(merge(_graphs("local", "moe", "moe_router"), DROP_PAD)) == [
        ("MOE033", "moe.moe_expert_capacity_factor"),  # info: drops follow the slicing
        ("OVL016", "overlap.cuda_graph_scope")]


@pytest.mark.parametrize(("impl", "fires"), [("transformer_engine", True), ("local", False)])
def test_preprocess_needs_router_under_te_only(impl: str, fires: bool):
    # transformer_config.py:3226; the local implementation adds moe_router itself (:3203-3211)
    assert codes(_graphs(impl, "moe_preprocess")) == (
        [("OVL017", "overlap.cuda_graph_scope")] if fires else [])


@pytest.mark.parametrize(("moe", "fires"), [(DROP, True), ({}, False), (DROP_PAD, False)])
def test_preprocess_with_a_syncing_alltoall(moe: dict[str, Any], fires: bool):
    # transformer_config.py:3247-3253: alltoall with a capacity factor and no padding
    found = codes(merge(_graphs("transformer_engine", "moe_router", "moe_preprocess"), moe))
    assert (("OVL018", "overlap.cuda_graph_scope") in found) == fires


def test_full_recompute_excludes_per_layer_graphs():
    # transformer_config.py:3260
    full = {"recompute_granularity": "full", "recompute_method": "uniform",
            "recompute_num_layers": 1}
    assert codes(_graphs("local", "attn", **full)) == [("OVL019", "overlap.cuda_graph_impl")]


def test_te_router_graph_excludes_moe_recompute():
    # transformer_config.py:3264-3271
    selective = {"recompute_granularity": "selective", "recompute_modules": ["moe"]}
    assert ("OVL020", "overlap.recompute_modules") in codes(
        _graphs("transformer_engine", "moe_router", **selective))
    assert ("OVL020", "overlap.recompute_modules") not in codes(
        _graphs("local", "moe_router", **selective))


def test_unknown_and_mixed_full_scopes():
    # cuda_graph_config.py:57 (enum lookup), :40 (full alone)
    assert codes(_graphs("local", "router")) == [("OVL021", "overlap.cuda_graph_scope")]
    assert codes(_graphs("local", "full", "attn")) == [("OVL021", "overlap.cuda_graph_scope")]
    assert codes(_graphs("local", "full")) == []


def test_graphs_with_packing_need_an_alignment():
    # arguments.py:1600-1604
    found = codes(merge(_graphs("local", "attn"),
                        {"training": {"sequence_packing_scheduler": "dp_balanced"}}))
    assert ("OVL022", "overlap.cuda_graph_impl") in found


@pytest.mark.parametrize(("scopes", "modules", "expected"), [
    ((), ["core_attn"], [("OVL023", "model.attention_dropout")]),  # empty scope: whole layer
    (("attn",), ["core_attn"], [("OVL023", "model.attention_dropout")]),
    (("moe_router",), ["core_attn"], []),  # attention outside the graph
    (("mlp",), ["mlp"], [("OVL023", "model.hidden_dropout")]),
])
def test_graphed_recompute_takes_no_dropout(scopes: tuple[str, ...], modules: list[str],
                                            expected: list[tuple[str, str]]):
    # transformer_config.py:3280-3300
    overlay = _graphs("local", *scopes, recompute_granularity="selective",
                      recompute_modules=modules)
    assert [c for c in codes(overlay) if c[0] == "OVL023"] == expected


@pytest.mark.parametrize(("training", "etp", "ffn", "fires"), [
    ({"fp8": True}, 1, 40, True), ({"fp8": True}, 1, 48, False),
    ({"fp8": True}, 2, 48, True),  # 48 / 2 = 24
    ({"fp4": True}, 1, 48, True), ({"fp4": True}, 1, 64, False), ({}, 1, 40, False)])
def test_quantised_expert_width_alignment(training: dict[str, Any], etp: int, ffn: int,
                                          fires: bool):
    overlay = {"training": training, "model": {"moe_ffn_hidden_size": ffn},
               "parallel": {"etp": etp, "ep": 2 if etp > 1 else 4}}
    assert (("MOE021", "model.moe_ffn_hidden_size") in codes(overlay)) == fires

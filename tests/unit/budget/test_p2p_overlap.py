"""The pipeline send/recv overlap as Megatron runs it: on by default (--no-overlap-p2p-communication,
dest overlap_p2p_comm), used by the interleaved schedule only (validate_args turns it off without
virtual stages; megatron/core/pipeline_parallel/schedules.py
forward_backward_pipelining_with_interleaving waits for each chunk's exchange after the next chunk)."""

from __future__ import annotations

from typing import Any

from planner.config.schema import Config
from planner.estimate import estimate
from planner.rules.catalog import run_rules

MODEL = {"num_layers": 8, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 512,
         "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 128}


def env(vpp: int | None, p2p: bool = True, pp: int = 4) -> dict[str, Any]:
    parallel: dict[str, Any] = {"world_size": 8, "pp": pp, "ep": 2}
    if vpp:
        parallel["vpp"] = vpp
    cfg = Config.model_validate({
        "model": MODEL, "parallel": parallel,
        "training": {"seq_length": 512, "micro_batch_size": 1, "global_batch_size": 16},
        "overlap": {"overlap_p2p_comm": p2p}, "cluster": {"gpu": "H100", "nodes": 1}})
    return estimate(cfg).envs[1]  # a middle stage sends and receives both ways


def test_interleaving_hides_the_exchange_behind_the_next_chunk() -> None:
    e = env(vpp=2)
    assert e["on_overlap_p2p_comm"] == 1
    for phase in ("fwd", "bwd"):
        t = e[f"time_pp_activation_{phase}"]
        hidden = min(e["eff_overlap"] * t, e["time_compute_s"])
        assert t > 0 and e[f"time_pp_activation_{phase}_exposed"] == t - hidden


def test_plain_1f1b_and_the_negation_leave_it_exposed() -> None:
    for e in (env(vpp=None), env(vpp=2, p2p=False)):
        assert e["on_overlap_p2p_comm"] == 0
        assert e["time_pp_activation_fwd_exposed"] == e["time_pp_activation_fwd"] > 0


def test_pp2_interleaving_without_the_overlap_is_refused_as_megatron_does() -> None:
    def codes(pp: int, p2p: bool) -> set[str]:
        parallel = {"world_size": 8, "pp": pp, "vpp": 2, "ep": 2}
        cfg = Config.model_validate({
            "model": MODEL, "parallel": parallel, "overlap": {"overlap_p2p_comm": p2p},
            "training": {"seq_length": 512, "micro_batch_size": 1, "global_batch_size": 16}})
        return {f.code for f in run_rules(cfg)}
    assert "PIP006" in codes(2, False)
    assert "PIP006" not in codes(2, True) | codes(4, False)

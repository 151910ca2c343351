"""The data-parallel buffers' overlap, as Megatron runs it: the grad reduce only beside the last
microbatch's backward, the parameter gather only beside the first one's forward, one bucket of
each exposed (Megatron-LM dev@d48bd6be megatron/core/pipeline_parallel/schedules.py
forward_backward_pipelining_without_interleaving enable_grad_sync;
megatron/core/distributed/distributed_data_parallel.py DistributedDataParallel.__init__
bucket_size = max(40M, 1M x DP))."""

from __future__ import annotations

import math
from typing import Any

from planner.config.schema import Config
from planner.estimate import estimate

# The model of Megatron-LM issue #1258 (bench/scaling_1258.py), EP 8 on 16 H100.
MODEL = {"num_layers": 36, "hidden_size": 2304, "ffn_hidden_size": 7680, "num_attention_heads": 36,
         "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 7680, "vocab_size": 32000,
         "swiglu": True, "normalization": "RMSNorm", "untie_embeddings_and_output_weights": True,
         "add_bias_linear": False}


def cfg(gbs: int, overlap: bool = True, scale_out: float | None = None) -> Config:
    cluster: dict[str, Any] = {"gpu": "H100", "nodes": 2}
    if scale_out:
        cluster["inter_node_bandwidth_gb_s"] = scale_out
    return Config.model_validate({
        "model": MODEL, "parallel": {"world_size": 16, "ep": 8},
        "training": {"seq_length": 2048, "micro_batch_size": 1, "global_batch_size": gbs,
                     "use_distributed_optimizer": True},
        "overlap": {"overlap_grad_reduce": overlap, "overlap_param_gather": overlap},
        "cluster": cluster})


def env(c: Config) -> dict[str, Any]:
    return estimate(c).envs[0]


def test_hand_derived_exposure_of_the_grad_reduce_and_the_gather() -> None:
    e = env(cfg(64))
    dp = 16  # TP 1, CP 1, PP 1 on 16 GPUs
    bucket = max(40_000_000, 1_000_000 * dp)
    assert e["time_ddp_bucket_params"] == bucket
    m, compute, eff = e["microbatches"], e["time_compute_s"], e["eff_overlap"]
    assert m == 4
    for name, params, window in (("expert_grad_reduce", "expert_grad_params", 2 * compute / (3 * m)),
                                 ("dense_grad_reduce", "dense_grad_params", 2 * compute / (3 * m)),
                                 ("expert_param_gather", "expert_grad_params", compute / (3 * m)),
                                 ("dense_param_gather", "dense_grad_params", compute / (3 * m))):
        buckets = math.ceil(e[params] / bucket)
        assert e[f"time_ddp_buckets_{name}"] == buckets
        t = e[f"time_{name}_fwd"]
        hidden = min(eff * t * (1 - 1 / buckets), window)
        assert float(e[f"time_{name}_fwd_exposed"]) == float(t - hidden)
        assert t > 0 and hidden > 0


def test_without_the_flags_nothing_is_hidden() -> None:
    e = env(cfg(64, overlap=False))
    assert e["time_expert_grad_reduce_fwd_exposed"] == e["time_expert_grad_reduce_fwd"]


def test_a_short_microbatch_bounds_what_the_reduce_hides() -> None:
    """Over a 2 GB/s scale-out one microbatch's backward is shorter than the share of the expert
    grad reduce the overlap would hide: exactly that backward is hidden, however many
    microbatches the step has (the whole step's compute would have hidden all of it)."""
    e = env(cfg(256, scale_out=2.0))
    t, window = e["time_expert_grad_reduce_fwd"], e["time_ddp_bwd_window_s"]
    assert window < e["eff_overlap"] * t * (1 - 1 / e["time_ddp_buckets_expert_grad_reduce"])
    assert e["time_expert_grad_reduce_fwd_exposed"] == t - window
    assert e["eff_overlap"] * t < e["time_compute_s"]

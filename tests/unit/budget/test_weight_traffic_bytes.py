"""Weight traffic and its memory: GTP/EGTP rematerialisation (Megatron-LM main@d98e8a64
megatron/core/tensor_parallel/generalized_tensor_parallelism.py), Megatron-FSDP sharding
(Megatron-LM dev@d48bd6be megatron/core/distributed/fsdp/src/megatron_fsdp/), and Muon's TP
gather (Megatron-LM dev@d48bd6be megatron/core/optimizer/emerging_optimizers.py).

Every expectation is derived by hand from the example base (planner/rules/example_base.py):
h 64, 8 heads of d = 8 over 4 query groups, 4 layers (all MoE) over PP 2, so stage 0 holds
2 blocks, the embedding (V_pad 512) and no output layer; E 8, I 64, shared I_s 64; bf16 (p = 2);
seq 256, micro-batch 1, global batch 16; 8 ranks, 8 GPUs per node (every group on one node).
"""

from __future__ import annotations

from typing import Any

import pytest

from planner.accounting import budgets, memory_by_stage
from planner.config.loader import load_config, parse_config
from planner.plan import compile_plan
from planner.rules import run_rules
from planner.rules.example_base import example_config_data, merge
from planner.rules.memory import memory_findings
from runtime.plan_io import PlanError, check_plan
from tests.support.paths import EXAMPLES

FSDP = "training: {use_megatron_fsdp: true, ckpt_format: fsdp_dtensor}"


def _stage0(overlay: str) -> dict[str, Any]:
    """Every budget of stage 0's first rank, by name."""
    cfg = parse_config(example_config_data(overlay))
    return {b.name: b.value for b in budgets(cfg, stage=0)}


def _step(env: dict[str, Any], name: str, phase: str) -> tuple[Any, ...]:
    """send, recv, wire, intra-node, inter-node bytes; a collective that is not issued (one-rank
    group, or replaced) has only send and recv, both 0."""
    base = f"step.{name}.{phase}"
    sent = (env[f"{base}.send_bytes"], env[f"{base}.recv_bytes"])
    if f"{base}.wire_bytes" not in env:
        return sent
    return sent + tuple(env[f"{base}.{part}"] for part in
                        ("wire_bytes", "intra_node_bytes", "inter_node_bytes"))


# --------------------------------------------------------------------------- GTP / EGTP
# parallel: gtp 2, egtp 2, ep 2.
#   DP = 8 / (TP 1 · CP 1 · PP 2 · GTP 2) = 2; D_batch = DP · GTP = 4; microbatches = 16 / 4 = 4.
#   Sliced dense weights on stage 0 (TP·GTP = 2 shards each):
#     attention 2·h·d·(heads + groups) / 2 = 2·64·8·12 / 2 = 6144 per block, × 2 blocks = 12288
#     shared expert 3·h·I_s / 2 = 3·64·64 / 2 = 6144 per MoE layer, × 2 = 12288
#     dense_sliced_params = 24576
#   Replicated (not GTP-sliced): norms 2·2·64 = 256, routers 2·8·64 = 1024, embedding 512·64 = 32768
#     dense_replicated_params = 34048
#   Routed experts: E/EP = 4 per rank, 4 · 3·64·64 / EGTP 2 = 24576 per layer, × 2 = 49152.
GTP = "parallel: {gtp: 2, egtp: 2, ep: 2}"


def test_gtp_weight_gather_wgrad_scatter_and_replicated_reduce():
    env = _stage0(GTP)
    assert env["microbatches"] == 4
    assert env["dense_sliced_params"] == 24576
    assert env["dense_replicated_params"] == 34048
    assert env["expert_params_on_rank"] == 49152
    # Gather, forward and again for the backward: own shard 24576 · 2 B · 4 microbatches = 196608
    # sent; the whole (GTP 2 ×) 393216 held; a ring all-gather puts (G-1) shards on the wire.
    for phase in ("fwd", "bwd"):
        assert _step(env, "gtp_weight_gather", phase) == (196608, 393216, 196608, 196608, 0)
    # wgrad reduce-scatter: the whole wgrad 393216 in, the shard 196608 out; wire (G-1)/G · 393216.
    assert _step(env, "gtp_wgrad_scatter", "bwd") == (393216, 196608, 196608, 196608, 0)
    # EGTP: 49152 · 2 B · 4 = 393216 per gather, whole 786432.
    for phase in ("fwd", "bwd"):
        assert _step(env, "egtp_weight_gather", phase) == (393216, 786432, 393216, 393216, 0)
    assert _step(env, "egtp_wgrad_scatter", "bwd") == (786432, 393216, 393216, 393216, 0)
    # Unsliced grads, fp32 main grads, once per step: 34048 · 4 = 136192; all-reduce wire
    # 2 · (G-1)/G · 136192 = 136192.
    assert _step(env, "gtp_replicated_grad_reduce", "fwd") == (136192, 136192, 136192, 136192, 0)


def test_gtp_materialised_weights_in_memory():
    env = _stage0(GTP)
    # One block whole: GTP 2 · ceil(24576 / 2 blocks) + EGTP 2 · 24576 (one MoE layer) = 73728;
    # the block in use plus the prefetched next one: 2 · 73728 · 2 B = 294912; one whole wgrad
    # waiting for its reduce-scatter: 73728 · 2 B = 147456.
    assert env["gtp_unit_params"] == 73728
    assert env["gtp_materialised_bytes"] == 294912
    assert env["gtp_wgrad_bytes"] == 147456
    # Buffers: dense 24576 + 34048 = 58624, experts 49152 (no distributed optimizer: unpadded).
    assert env["weight_bytes"] == (58624 + 49152) * 2 + 294912 == 510464
    assert env["grad_bytes"] == (58624 + 49152) * 4 + 147456 == 578560


def test_gtp_one_rank_axes_price_nothing():
    env = _stage0("")
    for name, phases in (("gtp_weight_gather", ("fwd", "bwd")), ("gtp_wgrad_scatter", ("bwd",)),
                         ("egtp_weight_gather", ("fwd", "bwd")), ("egtp_wgrad_scatter", ("bwd",)),
                         ("gtp_replicated_grad_reduce", ("fwd",))):
        for phase in phases:
            assert _step(env, name, phase)[:2] == (0, 0)
    assert "gtp_materialised_bytes" not in env


# --------------------------------------------------------------------------- Megatron-FSDP
# DP·CP = 8 / (1 · 1 · 2) = 4 dense shards; EDP = 8 / (ETP 1 · EP 4 · PP 2) = 1; microbatches 4.
# Stage 0 dense: attention 2 · 12288 + norms 256 + shared 2 · 12288 + routers 1024 + embedding
# 32768 = 83200, padded to lcm(4, 128) = 128: 650 · 128 = 83200, shard 83200 / 4 = 20800.
# Experts: 2 per rank · 3·64·64 = 24576 per layer, × 2 = 49152 (one shard: EDP = 1).
# Megatron-FSDP's main grads keep the parameters' dtype (bf16, 2 B).


def test_fsdp_optim_grads_params_traffic():
    env = _stage0(FSDP)
    assert (env["dense_buffer_params"], env["dense_shard_params"]) == (83200, 20800)
    assert env["bytes_grad"] == 2
    # Parameters gathered before every forward and again before every backward:
    # shard 20800 · 2 B · 4 = 166400 sent, 83200 · 2 · 4 = 665600 whole; wire 3 · 166400.
    for phase in ("fwd", "bwd"):
        assert _step(env, "fsdp_dense_param_gather", phase) == (166400, 665600, 499200, 499200, 0)
    # Grads reduce-scattered after every backward: 665600 in, 166400 out, wire 3/4 · 665600.
    assert _step(env, "fsdp_dense_grad_reduce", "bwd") == (665600, 166400, 499200, 499200, 0)
    # ... replacing the once-per-step DDP reduce and the distributed optimizer's gather.
    assert _step(env, "dense_grad_reduce", "fwd")[:2] == (0, 0)
    assert _step(env, "dense_param_gather", "fwd")[:2] == (0, 0)
    # EDP = 1: no expert collective.
    assert _step(env, "fsdp_expert_param_gather", "fwd")[:2] == (0, 0)
    assert _step(env, "fsdp_expert_grad_reduce", "bwd")[:2] == (0, 0)


def test_fsdp_optim_grads_params_memory():
    env = _stage0(FSDP)
    # Weights: shards (20800 + 49152) · 2 B = 139904, plus two whole average blocks
    # ceil((83200 + 49152) / 2) = 66176 params: 2 · 66176 · 2 B = 264704.
    assert env["fsdp_unit_params"] == 66176
    assert env["weight_bytes"] == 139904 + 264704 == 404608
    # Grads: shards 69952 · 2 B = 139904 plus one block's whole grads 66176 · 2 B = 132352.
    assert env["grad_bytes"] == 139904 + 132352 == 272256
    # Optimizer: fp32 master + Adam m, v = 12 B per owned element: 12 · 69952.
    assert env["optimizer_bytes"] == 12 * 69952 == 839424


@pytest.mark.parametrize(("strategy", "weights", "grads", "dense_reduce", "dense_gather"), [
    # no_shard: nothing sharded (no padding either), grads all-reduced once per step.
    ("no_shard", (83200 + 49152) * 2, (83200 + 49152) * 2, "allreduce", None),
    # optim (ZeRO-1): grads reduce-scattered once per step, weights gathered after the update.
    ("optim", (83200 + 49152) * 2, (83200 + 49152) * 2, "reduce_scatter", 166400 // 4),
    # optim_grads (ZeRO-2): grads sharded (+ one whole block), reduce-scattered every backward.
    ("optim_grads", (83200 + 49152) * 2, 139904 + 132352, None, 166400 // 4),
])
def test_fsdp_strategies(strategy: str, weights: int, grads: int, dense_reduce: str | None,
                         dense_gather: int | None):
    env = _stage0(FSDP[:-1] + f", data_parallel_sharding_strategy: {strategy}}}")
    assert env["weight_bytes"] == weights
    assert env["grad_bytes"] == grads
    send = _step(env, "dense_grad_reduce", "fwd")[0]
    buffer = 83200 * 2
    assert send == {"allreduce": buffer, "reduce_scatter": buffer, None: 0}[dense_reduce]
    if dense_gather is None:
        assert "step.dense_param_gather.fwd.send_bytes" not in env
    else:  # the shard 20800 · 2 B, once per step
        assert _step(env, "dense_param_gather", "fwd")[0] == dense_gather
    optimizer_elements = 83200 + 49152 if strategy == "no_shard" else 20800 + 49152
    assert env["optimizer_bytes"] == 12 * optimizer_elements
    if strategy == "optim_grads":
        assert _step(env, "fsdp_dense_grad_reduce", "bwd")[:2] == (665600, 166400)


def _v4_pro(training: dict[str, Any]) -> dict[str, Any]:
    data = load_config(EXAMPLES / "deepseek-v4-pro-1024.yaml").model_dump(mode="json",
                                                                          exclude_none=True)
    return merge(data, {"training": training})


def test_v4_pro_with_megatron_fsdp_shards_the_optimizer():
    """Unsharded, stage 1 carried 75442740288 B (70.26 GiB) of optimizer state; Megatron-FSDP
    shards it over dp_cp (128) and expt_dp (2) exactly as the distributed optimizer does."""
    fsdp = {"use_megatron_fsdp": True, "use_distributed_optimizer": False,
            "ckpt_format": "fsdp_dtensor"}
    sharded = memory_by_stage(parse_config(_v4_pro(fsdp)))[1]
    dist_opt = memory_by_stage(parse_config(_v4_pro({})))[1]
    assert sharded["optimizer_bytes"] == dist_opt["optimizer_bytes"] == 19317488064
    assert sharded["weight_bytes"] < dist_opt["weight_bytes"]
    assert sharded["grad_bytes"] < dist_opt["grad_bytes"]


def test_mem_hint_under_fsdp_never_asks_for_the_distributed_optimizer():
    tight = {"gpu_memory_gib": 30}
    # 2048-token sequences: the checkpointed inputs are small and the last stage, whose weights
    # and grads the strategy leaves whole, is the worst (at 8192 stage 1's activations are).
    data = merge(_v4_pro({"use_megatron_fsdp": True, "use_distributed_optimizer": False,
                          "ckpt_format": "fsdp_dtensor", "seq_length": 2048,
                          "data_parallel_sharding_strategy": "optim"}), {"cluster": tight})
    fixes = [f.fix for f in memory_findings(parse_config(data))]
    assert fixes and all("use_distributed_optimizer" not in fix for fix in fixes)
    assert all("data_parallel_sharding_strategy: optim_grads_params" in fix for fix in fixes)
    plain = merge(_v4_pro({"use_distributed_optimizer": False}), {"cluster": tight})
    assert all("use_distributed_optimizer: true" in f.fix
               for f in memory_findings(parse_config(plain)))


# --------------------------------------------------------------------------- Muon
# TP 2, ETP 2, EP 2 with SP: DP = 8 / (2 · 2) = 2, microbatches 16 / 2 = 8 (not used: once per step).
# Dense matrices sliced over TP 2: attention 2·64·8·12 / 2 = 6144 · 2 blocks + shared 3·64·64 / 2
# = 6144 · 2 layers = 24576; experts: 4 per rank · 3·64·64 / ETP 2 = 24576 per layer · 2 = 49152.


def test_muon_gathers_the_tp_slices_of_its_fp32_momentum():
    # --muon-tp-mode duplicated gathers the slices; the default, blockwise, gathers nothing
    blockwise = _stage0("parallel: {tp: 2, etp: 2, ep: 2, sequence_parallel: true}\n"
                        "training: {optimizer: muon}")
    assert _step(blockwise, "muon_dense_tp_gather", "fwd")[:2] == (0, 0)
    env = _stage0("parallel: {tp: 2, etp: 2, ep: 2, sequence_parallel: true}\n"
                  "training: {optimizer: muon, muon_tp_mode: duplicated}")
    # 24576 · 4 B = 98304 own slice; TP 2 · 98304 whole; wire (2-1) · 98304.
    assert _step(env, "muon_dense_tp_gather", "fwd") == (98304, 196608, 98304, 98304, 0)
    # 49152 · 4 B = 196608 own; 393216 whole.
    assert _step(env, "muon_expert_tp_gather", "fwd") == (196608, 393216, 196608, 196608, 0)


def test_muon_layer_wise_optimizer_all_reduces_whole_grads():
    # Megatron turns muon + use_distributed_optimizer into the layer-wise optimizer: grads stay
    # whole and are all-reduced (dense 83200 params · fp32 4 B = 332800 over dp_cp 4).
    env = _stage0("training: {optimizer: muon, use_distributed_optimizer: true}")
    assert _step(env, "dense_grad_reduce", "fwd")[:3] == (332800, 332800, 2 * 332800 * 3 // 4)
    assert _step(env, "muon_dense_tp_gather", "fwd")[:2] == (0, 0)  # TP = 1


# --------------------------------------------------------------------------- runtime refusal


@pytest.mark.parametrize(("overlay", "message"), [
    ("parallel: {gtp: 2, egtp: 2, ep: 2}", r"layout\.gtp = 2: GTP weight rematerialisation is not"),
    (FSDP, r"use_megatron_fsdp/use_torch_fsdp2: FSDP is not implemented"),
    ("training: {optimizer: muon}", r"training\.optimizer = 'muon': only 'adam'"),
])
def test_the_runtime_refuses_what_is_predicted_only(overlay: str, message: str):
    cfg = parse_config(example_config_data(overlay))
    with pytest.raises(PlanError, match=message):
        check_plan(compile_plan(cfg, run_rules(cfg)))

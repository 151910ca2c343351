"""The runtime's TP split (runtime/tensor_parallel.py), in one process and in float64.

A TP rank's module holds its shard of each weight and returns its partial output (the row-parallel
sum is a collective; here it is summed by hand), so for every split module the sum of the ranks'
outputs must equal the whole module's, and each rank's weight gradient must be its shard of the
whole gradient, cut by the same rule the reference check uses (`tensor_parallel_split`). In float64
the two differ only by rounding (1e-12), so a wrong head, group, segment or dim is caught exactly.
The collectives themselves (SP gathers and scatters, vocab-parallel loss, the SP grad sum) run on
real gloo ranks in tests/integration/runtime/test_runtime_equivalence.py.

The toy: h = 16, 4 query heads of 4 in 2 groups with learnable sinks and QKV biases, a SwiGLU MLP
of 32, a Mamba-2 mixer of 4 heads of 8 (d_inner 32), 2 B/C groups, state 4; TP 2.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from runtime.comm import CommGroup
from runtime.mamba import MambaMixer, MambaSpec
from runtime.model import CausalAttention, DecoderSpec, DenseMLP, tensor_parallel_split
from runtime.plan_io import Plan, tensor_parallel_problems
from runtime.tensor_parallel import TensorParallel, shard_of

TP, S, B, H = 2, 6, 2, 16
MAMBA = MambaSpec(hidden_size=H, heads=4, head_dim=8, groups=2, state_dim=4)
SPEC = DecoderSpec(num_layers=2, hidden_size=H, num_heads=4, num_query_groups=2, head_dim=4,
                   ffn_hidden_size=32, vocab_size=64, untied_head=True, norm_epsilon=1e-5,
                   moe_layers=(), hash_layers=(), init_std=0.3, mtp_num_layers=0,
                   mtp_loss_scale=0.1, rotary_base=10000.0, add_qkv_bias=True,
                   softmax_type="learnable", mamba_layers=(0,), mamba=MAMBA)


def _rank(rank: int) -> TensorParallel:
    """Rank `rank` of TP 2 without a process group: its shards, its partial outputs."""
    return TensorParallel(CommGroup("tp", None, rank, TP))


POSITIONS = torch.arange(S)
MODULES: dict[str, tuple[str, Callable[[TensorParallel | None], torch.nn.Module],
                         Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]]] = {
    "attention": ("attention", lambda tp: CausalAttention(SPEC, 1, 5, torch.float64,
                                                          CommGroup("cp", None), None, tp),
                  lambda module, x: module(x, POSITIONS, POSITIONS)),
    "mlp": ("ffn", lambda tp: DenseMLP(SPEC, 1, 5, torch.float64, tp),
            lambda module, x: module(x, None)),
    "mamba": ("mamba", lambda tp: MambaMixer(MAMBA, 0, 5, 0.3, 0.2, torch.float64, tp),
              lambda module, x: module(x)),
}


@pytest.mark.parametrize("kind", list(MODULES))
def test_ranks_partial_outputs_sum_to_the_whole_and_grads_are_shards(kind: str) -> None:
    owner, build, run = MODULES[kind]
    generator = torch.Generator().manual_seed(11)
    whole = build(None)
    with torch.no_grad():  # biases and sinks start at zero/ones: give every tensor real values
        for p in whole.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.3)
    ranks = [build(_rank(r)) for r in range(TP)]
    for r, module in enumerate(ranks):
        with torch.no_grad():
            for name, p in module.named_parameters():
                split = tensor_parallel_split(SPEC, f"{owner}.{name}")
                assert split is not None, f"{owner}.{name} is split over TP"
                p.copy_(shard_of(dict(whole.named_parameters())[name], split[0], r, TP, split[1]))
    x = torch.randn(S, B, H, generator=generator, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(S, B, H, generator=generator, dtype=torch.float64)
    (run(whole, x) * probe).sum().backward()
    expected_input_grad = x.grad.clone()
    x.grad = None
    partial = [run(module, x) for module in ranks]
    assert torch.allclose(sum(partial), run(whole, x), rtol=0, atol=1e-12)
    for out in partial:
        (out * probe).sum().backward()
    assert torch.allclose(x.grad, expected_input_grad, rtol=0, atol=1e-12)
    for r, module in enumerate(ranks):
        for name, p in module.named_parameters():
            dim, segments = tensor_parallel_split(SPEC, f"{owner}.{name}")  # type: ignore[misc]
            want = shard_of(dict(whole.named_parameters())[name].grad, dim, r, TP, segments)
            assert torch.allclose(p.grad, want, rtol=0, atol=1e-12), (kind, name, r)


def test_mamba_shards_are_megatrons_partition_sizes() -> None:
    """MambaMixer.__init__ at TP 2: in_proj's columns [z 16, x 16, B 4, C 4, dt 2] per rank (its
    partition_sizes), the conv's channels [x 16, B 4, C 4], 2 heads of dt_bias/A_log/D, the norm's
    16 channels (its one group of d_inner / ngroups = 16), out_proj's 16 rows."""
    shapes = {name: tuple(p.shape) for name, p in MambaMixer(
        MAMBA, 0, 5, 0.3, 0.2, torch.float64, _rank(1)).named_parameters()}
    assert shapes == {"in_proj": (16, 42), "conv1d_weight": (24, 1, 4), "conv1d_bias": (24,),
                      "dt_bias": (2,), "A_log": (2,), "D": (2,), "norm_weight": (16,),
                      "out_proj": (16, 16)}
    # rank 1's in_proj columns: z 16..31, x 48..63, B 68..71, C 76..79, dt 82..83 of the 84
    index = shard_of(torch.arange(84)[None, :], 1, 1, TP, MAMBA.in_proj_segments)[0].tolist()
    assert index == [*range(16, 32), *range(48, 64), *range(68, 72), *range(76, 80), 82, 83]


def test_replicated_weights_are_not_split() -> None:
    """Norms, the row-parallel biases and an MoE block's router and latent projections stay
    whole on every TP rank (their grads are summed over TP under SP); the routed experts follow
    ETP, the shared expert is split like an MLP (SharedExpertMLP)."""
    for name in ("layers.0.input_norm.weight", "final_norm.weight", "layers.1.attention.bo",
                 "layers.1.ffn.b2", "layers.1.ffn.router.weight", "layers.1.ffn.fc1_latent_proj",
                 "layers.1.ffn.experts.w1"):
        assert tensor_parallel_split(SPEC, name) is None, name
    assert tensor_parallel_split(SPEC, "layers.1.ffn.shared_expert.w2") == (0, None)
    assert tensor_parallel_split(SPEC, "embedding") == tensor_parallel_split(SPEC, "head") == (0,
                                                                                            None)


def _plan(tp: int, pp: int = 1, sp: bool = True, mtp: int = 0, heads: int = 4,
          moe: bool = True, cp: int = 1) -> Plan:
    model = {"num_attention_heads": heads, "num_query_groups": 2, "ffn_hidden_size": 64,
             "mtp_num_layers": mtp, "hidden_size": 32, "mamba_layers": [1, 0],
             "mamba_num_heads": None, "mamba_head_dim": 16, "mamba_num_groups": 2}
    stages = [{"stage": 0, "moe_layers": [0] if moe else [], "hash_layers": []}]
    return Plan({"layout": {"tp": tp, "cp": cp, "pp": pp}, "stages": stages,
                 "config": {"model": model, "parallel": {"sequence_parallel": sp,
                                                         "cp_partition_mode": "contiguous"},
                            "training": {"seq_length": 16}}})


def test_tp_layouts_the_runtime_cannot_run_are_refused_by_name() -> None:
    assert tensor_parallel_problems(_plan(1, pp=2, sp=False, mtp=1, heads=3)) == []
    assert tensor_parallel_problems(_plan(2, pp=2, mtp=1)) == []
    assert tensor_parallel_problems(_plan(2, sp=False, moe=False)) == []
    # MTP with TP, SP and contiguous CP: Megatron's TransformerConfig raises
    assert [line.split(":")[0] for line in tensor_parallel_problems(_plan(2, mtp=1, cp=2))] == [
        "model.mtp_num_layers with layout.tp = 2, sequence parallelism and contiguous CP"]
    refused = {line.split(":")[0] for line in tensor_parallel_problems(
        _plan(2, pp=2, sp=False, mtp=1, heads=3))}
    assert refused == {"layout.tp = 2 with MoE layers and parallel.sequence_parallel false",
                       "model.num_attention_heads = 3 does not split over layout.tp = 2"}
    odd = copy.deepcopy(_plan(4))
    assert [line.split(":")[0] for line in tensor_parallel_problems(odd)] == [
        "model.num_query_groups = 2 does not split over layout.tp = 4",
        "model.mamba_num_groups = 2 does not split over layout.tp = 4"]

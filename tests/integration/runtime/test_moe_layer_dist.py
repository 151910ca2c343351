"""Multi-rank equivalence of the runtime MoE layer with the single-process reference.

Real ranks (torch.multiprocessing spawn, gloo, fp32). Every case runs the parallel layer on each
rank's token shard, reduces gradients the way the runtime does (router/shared expert SUM over
dp_cp, routed experts SUM over expt_dp), and compares with `reference_moe` run on all shards:
MoE output, input gradient and every parameter gradient within 1e-5 relative, for 1 or 3 SGD
steps with expert-bias updates. All cases share one launch of 8 ranks: ranks 0-3 run the
4-rank cases on their own groups, then all 8 the 8-rank cases.

Group lists follow Megatron's generator order with TP = 1 (dense `tp-cp-ep-dp`: CP fastest;
expert `tp-ep-dp`: ETP fastest, then EP, then EDP); see `expert_grid` below.
"""

from __future__ import annotations

import json
import os
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from planner.config.schema import ModelSection, MoeSection
from tests.support.runtime_ranks import free_port
from tests.support.spawn import spawn_ranks

TOLERANCE = 1e-5
SEQ, BATCH, HIDDEN, VOCAB = 4, 2, 16, 32  # n = 8 token rows per rank
# The runtime reads every config field from the plan and defaults none, so the layer's dicts are
# completed the way a compiled plan is: the schema's own defaults for every field not set here.
BASE_MODEL: dict[str, Any] = {
    "num_attention_heads": 2,
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "num_layers": 2,
    "num_experts": 8,
    "moe_router_topk": 2,
    "moe_ffn_hidden_size": 8,
    "moe_shared_expert_intermediate_size": 8,
    "moe_router_score_function": "sqrtsoftplus",
    "moe_router_topk_scaling_factor": 2.5,
    "moe_router_enable_expert_bias": True,
    "moe_router_bias_update_rate": 1e-2,
    "swiglu_limit": 0.3,  # small enough that the clamp acts on these inputs
}
BASE_MOE: dict[str, Any] = {
    "moe_token_dispatcher_type": "alltoall",
    "moe_expert_capacity_factor": None,
    "moe_pad_expert_input_to_capacity": False,
    "moe_aux_loss_coeff": 1e-1,
    "moe_router_load_balancing_type": "seq_aux_loss",
    "moe_router_force_load_balancing": False,
}
BASE_MODEL = ModelSection.model_validate(BASE_MODEL).model_dump(mode="json")
BASE_MOE = MoeSection.model_validate(BASE_MOE).model_dump(mode="json")


def owned_block(num_experts: int, ep_rank: int, ep_size: int) -> range:
    """What a compiled plan assigns EP rank r: the contiguous block [r·L, (r+1)·L), L = E/EP."""
    count = num_experts // ep_size
    return range(ep_rank * count, (ep_rank + 1) * count)


@dataclass(frozen=True)
class Case:
    name: str
    ep: int
    etp: int = 1
    cp: int = 1  # dense CP size: consecutive ranks share sequences (tp_cp groups)
    model: dict[str, Any] = field(default_factory=dict)
    moe: dict[str, Any] = field(default_factory=dict)
    hash_layer: bool = False
    steps: int = 1
    wrong: str | None = None  # a deliberately broken variant that the comparison must catch


def expert_grid(world: int, ep: int, etp: int) -> dict[str, list[list[int]]]:
    """Expert-grid groups, order tp-ep-dp: rank = etp_r + etp·(ep_r + ep·edp_r)."""
    edp = world // (ep * etp)

    def rank(etp_r: int, ep_r: int, edp_r: int) -> int:
        return etp_r + etp * (ep_r + ep * edp_r)

    return {
        "expt_tp": [[rank(t, e, d) for t in range(etp)] for d in range(edp) for e in range(ep)],
        "ep": [[rank(t, e, d) for e in range(ep)] for d in range(edp) for t in range(etp)],
        "tp_ep": [[rank(t, e, d) for e in range(ep) for t in range(etp)] for d in range(edp)],
        "expt_dp": [[rank(t, e, d) for d in range(edp)] for e in range(ep) for t in range(etp)],
    }


def test_expert_grid_matches_megatron_order() -> None:
    # Megatron's expert RankGenerator, ETP2×EP2 on 4 ranks, default order:
    # ETP [0,1],[2,3]; EP [0,2],[1,3].
    four = expert_grid(4, ep=2, etp=2)
    assert four["expt_tp"] == [[0, 1], [2, 3]]
    assert four["ep"] == [[0, 2], [1, 3]]
    eight = expert_grid(8, ep=2, etp=2)
    assert eight["tp_ep"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert eight["expt_dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]


# ---------------------------------------------------------------------------------------------
# Single-process pieces of the layer


def test_split_plan_reproduces_the_worked_split() -> None:
    from runtime.dispatcher import ExpertLayout, split_plan

    # The worked split: EP2, 4 experts, rank 0 owns 0/1, rank 1 owns 2/3, 4 assignments per rank.
    # Rank 0 sends [2, 2], rank 1 sends [1, 3]; so rank 0 receives [2, 1], rank 1 [2, 3].
    counts = [torch.tensor([1, 1, 1, 1]), torch.tensor([1, 0, 2, 1])]
    gathered = torch.stack(counts)
    plans = [split_plan(counts[r], gathered, ExpertLayout(4, r, 2, 0, 1, range(2 * r, 2 * r + 2)))
             for r in range(2)]
    assert [plan.input_splits for plan in plans] == [(2, 2), (1, 3)]
    assert [plan.output_splits for plan in plans] == [(2, 1), (2, 3)]
    assert [sum(plan.output_splits) for plan in plans] == [3, 5]
    # rank 0's experts 0/1 get (1+1, 1+0) rows; rank 1's experts 2/3 get (1+2, 1+1)
    assert [plan.tokens_per_local_expert for plan in plans] == [[2, 1], [3, 2]]


def test_split_plan_with_etp_orders_sources_etp_major() -> None:
    from runtime.dispatcher import ExpertLayout, split_plan

    # ETP2 x EP2, E = 4 (2 local experts). tp_ep members in order (ep, etp):
    # 0=(0,0) 1=(0,1) 2=(1,0) 3=(1,1). Member m sends count m+1 to every expert.
    gathered = torch.tensor([[m + 1] * 4 for m in range(4)])
    plan = split_plan(gathered[3], gathered, ExpertLayout(4, 1, 2, 1, 2, range(2, 4)))  # member 3
    assert plan.input_splits == (8, 8)
    # EP peers sharing etp index 1 are members 1 and 3: 2 local experts x (2, 4) rows
    assert plan.output_splits == (4, 8)
    # ETP peer 0 (members 0, 2) gathered 2·1 + 2·3 = 8 rows, peer 1 gathered 4 + 8 = 12
    assert plan.output_splits_tp == (8, 12)
    # sources (etp, ep): (0,0)=member 0, (0,1)=member 2, (1,0)=member 1, (1,1)=member 3
    assert plan.chunk_counts == ((1, 1), (3, 3), (2, 2), (4, 4))


@given(
    st.lists(st.lists(st.integers(0, 4), min_size=3, max_size=3), min_size=1, max_size=5)
)
def test_chunk_sort_index_makes_rows_expert_major(counts: list[list[int]]) -> None:
    from runtime.dispatcher import chunk_sort_index, inverse_permutation

    table = torch.tensor(counts, dtype=torch.int64)
    labels = torch.cat([
        torch.full((n,), expert) for row in counts for expert, n in enumerate(row)
    ]) if table.sum() else torch.zeros(0, dtype=torch.int64)
    order = chunk_sort_index(table)
    assert sorted(order.tolist()) == list(range(int(table.sum())))
    assert labels[order].tolist() == sorted(labels.tolist())
    assert torch.equal(labels[order][inverse_permutation(order)], labels)


@given(st.integers(1, 12), st.integers(1, 4), st.integers(0, 6), st.integers(0, 10**6))
def test_capacity_mask_keeps_the_heaviest_assignments(
    tokens: int, topk: int, capacity: int, seed: int
) -> None:
    from runtime.router import capacity_keep_mask

    num_experts = 4
    topk = min(topk, num_experts)
    generator = torch.Generator().manual_seed(seed)
    experts = torch.stack([torch.randperm(num_experts, generator=generator)[:topk]
                           for _ in range(tokens)])
    weights = torch.rand(tokens, topk, generator=generator)
    kept = capacity_keep_mask(experts, weights, num_experts, capacity)
    for expert in range(num_experts):
        mine = experts == expert
        assert int((kept & mine).sum()) == min(capacity, int(mine.sum()))
        if (kept & mine).any() and (~kept & mine).any():
            assert weights[kept & mine].min() >= weights[~kept & mine].max()


def test_balanced_routing_gives_every_expert_n_k_over_e() -> None:
    from runtime.router import MoEConfigError, balanced_experts

    experts = balanced_experts(8, 2, 8, "cpu")
    assert experts[:2].tolist() == [[0, 1], [2, 3]]  # (t·k + i) mod E
    assert torch.bincount(experts.reshape(-1), minlength=8).tolist() == [2] * 8
    with pytest.raises(MoEConfigError, match="divide"):
        balanced_experts(3, 2, 8, "cpu")


def test_init_depends_only_on_identity() -> None:
    from runtime.init import init_shard, init_tensor

    full = init_tensor(3, (1, "expert", 7, "w2"), (8, 4), 0.02, torch.float32)
    assert torch.equal(full, init_tensor(3, (1, "expert", 7, "w2"), (8, 4), 0.02, torch.float32))
    assert not torch.equal(full, init_tensor(3, (1, "expert", 6, "w2"), (8, 4), 0.02,
                                             torch.float32))
    shard = init_shard(3, (1, "expert", 7, "w2"), (8, 4), 0.02, torch.float32, 0, 1, 2)
    assert torch.equal(shard, full[4:])


@pytest.mark.parametrize(
    ("model", "moe", "message"),
    [
        ({}, {"moe_token_dispatcher_type": "flex"}, "flex dispatcher is not implemented"),
        ({}, {"moe_pad_expert_input_to_capacity": True}, "needs moe_expert_capacity_factor"),
        ({}, {"moe_token_dispatcher_type": "allgather", "moe_expert_capacity_factor": 1.0,
              "moe_pad_expert_input_to_capacity": True}, "only implemented for the alltoall"),
        ({}, {"moe_router_load_balancing_type": "sinkhorn"}, "not supported by the runtime"),
        ({"moe_router_score_function": "tanh"}, {}, "is not one of"),
        ({"moe_router_topk": 9}, {}, "moe_router_topk"),
    ],
)
def test_unsupported_settings_are_refused(model, moe, message) -> None:
    from runtime.router import MoEConfigError, MoESettings

    with pytest.raises(MoEConfigError, match=message):
        MoESettings.from_config({**BASE_MODEL, **model}, {**BASE_MOE, **moe})


def test_layout_refusals() -> None:
    from runtime.comm import Ledger, MoEGroups
    from runtime.dispatcher import ExpertLayout
    from runtime.moe_layer import MoEConfigError, MoELayer

    with pytest.raises(MoEConfigError, match="divisible by EP"):
        ExpertLayout(num_experts=8, ep_rank=0, ep_size=3, etp_rank=0, etp_size=1,
                     experts=range(0, 3))
    with pytest.raises(MoEConfigError, match="equal contiguous blocks"):  # a plan edited by hand
        ExpertLayout(num_experts=8, ep_rank=1, ep_size=2, etp_rank=0, etp_size=1,
                     experts=range(0, 4))
    with pytest.raises(MoEConfigError, match="needs the plan's expert ownership"):
        two_ep_ranks = SimpleNamespace(ep_rank=0, ep_size=2, etp_rank=0, etp_size=1)
        ExpertLayout.of(8, two_ep_ranks, None)  # type: ignore[arg-type]
    with pytest.raises(MoEConfigError, match="needs a tid2eid"):
        MoELayer(BASE_MODEL, BASE_MOE, 0, True, MoEGroups.single(), Ledger(), 0, None,
                 torch.float32, range(8))
    layer = MoELayer(BASE_MODEL, {**BASE_MOE, **BALANCED}, 0, False, MoEGroups.single(),
                     Ledger(), 0, None, torch.float32, range(8))
    with pytest.raises(MoEConfigError, match="forced balanced routing"):
        layer(torch.randn(3, 1, HIDDEN), None)  # n·k = 6 is not a multiple of E = 8


def test_bf16_layer_tracks_fp32() -> None:
    from runtime.comm import Ledger, MoEGroups
    from runtime.moe_layer import MoELayer

    def run(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        layer = MoELayer(BASE_MODEL, BASE_MOE, 0, False, MoEGroups.single(), Ledger(), 3, None,
                         dtype, range(8))
        x = (torch.randn(SEQ, BATCH, HIDDEN, generator=torch.Generator().manual_seed(0)) * 5)
        x = x.to(dtype).requires_grad_()
        out = layer(x, None)
        out.float().sum().backward()
        return out.detach().float(), layer.experts.w2.grad.float()

    (out16, grad16), (out32, grad32) = run(torch.bfloat16), run(torch.float32)
    assert out16.dtype == torch.float32 and grad16.shape == grad32.shape
    assert float((out16 - out32).abs().max() / out32.abs().max()) < 5e-2
    assert float((grad16 - grad32).abs().max() / grad32.abs().max()) < 5e-2


# ---------------------------------------------------------------------------------------------
# Worker side


class _Groups:
    """Creates every group of every case once, in the same order on every rank."""

    def __init__(self) -> None:
        self._cache: dict[tuple[int, ...], Any] = {}

    def get(self, ranks: list[int]) -> Any:
        key = tuple(ranks)
        if key not in self._cache:
            self._cache[key] = dist.new_group(list(ranks))
        return self._cache[key]


def _mine(groups: list[list[int]], rank: int) -> list[int]:
    return next(group for group in groups if rank in group)


def _build_groups(case: Case, world: int, rank: int, cache: _Groups):
    from runtime.comm import MoEGroups

    grid = expert_grid(world, case.ep, case.etp)
    tp_cp = [list(range(start, start + case.cp)) for start in range(0, world, case.cp)]
    handles = {}
    for kind, lists in (*grid.items(), ("tp_cp", tp_cp)):
        for ranks in lists:
            pg = cache.get(ranks) if len(ranks) > 1 else None
            if rank in ranks:
                handles[kind] = (pg, ranks)
    ep_ranks, etp_ranks = handles["ep"][1], handles["expt_tp"][1]
    groups = MoEGroups(
        ep=handles["ep"][0],
        expt_tp=handles["expt_tp"][0],
        tp_ep=handles["tp_ep"][0],
        ep_rank=ep_ranks.index(rank),
        ep_size=case.ep,
        etp_rank=etp_ranks.index(rank),
        etp_size=case.etp,
        tp_ep_size=case.ep * case.etp,
        tp_cp=handles["tp_cp"][0],
        tp_cp_size=case.cp,
    )
    return groups, handles["expt_dp"], tp_cp


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = float(want.detach().abs().max()) if want.numel() else 0.0
    diff = float((got.detach() - want.detach()).abs().max()) if want.numel() else 0.0
    return diff / scale if scale > 0 else diff


def _case_inputs(case_index: int, world: int, num_experts: int, topk: int):
    generator = torch.Generator().manual_seed(1000 + case_index)
    shards = [torch.randn(SEQ, BATCH, HIDDEN, generator=generator) * 5 for _ in range(world)]
    upstream = [torch.randn(SEQ, BATCH, HIDDEN, generator=generator) for _ in range(world)]
    ids = [torch.randint(VOCAB, (BATCH, SEQ), generator=generator) for _ in range(world)]
    tid2eid = torch.stack(
        [torch.randperm(num_experts, generator=generator)[:topk] for _ in range(VOCAB)]
    )
    bias = torch.randn(num_experts, generator=generator) * 0.05
    return shards, upstream, ids, tid2eid, bias


def _run_case(case: Case, case_index: int, world: int, rank: int, cache: _Groups) -> dict:
    import runtime.dispatcher
    import runtime.experts
    from runtime.comm import CommGroup, Ledger, all_reduce
    from runtime.moe_layer import MoELayer
    from runtime.reference_moe import ReferenceMoE, reference_moe

    model_cfg = {**BASE_MODEL, **case.model}
    moe_cfg = {**BASE_MOE, **case.moe}
    groups, expt_dp_handle, tp_cp_lists = _build_groups(case, world, rank, cache)
    world_group = CommGroup.of("dp_cp", cache.get(list(range(world))))
    expert_dp = CommGroup.of("expt_dp", expt_dp_handle[0]) if expt_dp_handle[0] else (
        CommGroup("expt_dp", None))
    if case.wrong == "expert_grads_over_dp_cp":
        expert_dp = world_group
    num_experts, topk = model_cfg["num_experts"], model_cfg["moe_router_topk"]
    shards, upstream, ids, tid2eid, bias = _case_inputs(case_index, world, num_experts, topk)

    ledger = Ledger()
    seed, layer_id = 11, 5
    layer = MoELayer(model_cfg, moe_cfg, layer_id, case.hash_layer, groups, ledger, seed,
                     tid2eid if case.hash_layer else None, torch.float32,
                     owned_block(num_experts, groups.ep_rank, groups.ep_size))
    reference = ReferenceMoE(layer.settings, layer_id, seed, torch.float32)
    layer.aux_loss_backward_scale = 0.5
    with torch.no_grad():
        layer.router.expert_bias.copy_(bias)
        reference.router.expert_bias.copy_(bias)

    saved = (runtime.experts.scale_by_probs, runtime.dispatcher.chunk_sort_index)
    if case.wrong == "probs_twice":
        runtime.experts.scale_by_probs = lambda act, p: saved[0](saved[0](act, p), p)
    if case.wrong == "skip_expert_sort":
        runtime.dispatcher.chunk_sort_index = lambda counts: torch.arange(int(counts.sum()))

    errors: dict[str, float] = {}

    def note(key: str, got: torch.Tensor, want: torch.Tensor) -> None:
        errors[key] = max(errors.get(key, 0.0), _rel(got, want))

    try:
        for _ in range(case.steps):
            ledger.reset()
            x = shards[rank].clone().requires_grad_()
            out = layer(x, ids[rank])
            (out * upstream[rank]).sum().backward()
            for param in layer.dense_parameters():
                all_reduce(param.grad, world_group, ledger, "dense_grad_reduce")
            for param in layer.expert_parameters():
                all_reduce(param.grad, expert_dp, ledger, "expert_grad_reduce")
            counts = layer.local_tokens_per_expert.clone()
            all_reduce(counts, world_group, ledger, "expert_bias_count_reduce")

            ref_inputs = [shard.clone().requires_grad_() for shard in shards]
            result = reference_moe(
                reference, ref_inputs, ids, is_hash_layer=case.hash_layer,
                tid2eid=tid2eid if case.hash_layer else None,
                force_balanced=bool(moe_cfg["moe_router_force_load_balancing"]),
                aux_groups=tp_cp_lists, aux_loss_backward_scale=0.5,
            )
            sum((o * g).sum() for o, g in zip(result.outputs, upstream, strict=True)).backward()

            note("output", out, result.outputs[rank])
            note("input_grad", x.grad, ref_inputs[rank].grad)
            note("tokens_per_expert", counts, result.tokens_per_expert)
            ref_params = dict(reference.named_parameters())
            for name, param in layer.named_parameters():
                note(f"grad:{name}", param.grad, layer.local_view(name, ref_params[name].grad))

            with torch.no_grad():  # plain SGD on both, then the expert-bias rule
                for param in layer.parameters():
                    param -= 0.5 * param.grad
                    param.grad = None
                for param in reference.parameters():
                    param -= 0.5 * param.grad
                    param.grad = None
            layer.update_expert_bias(counts)
            reference.update_expert_bias(result.tokens_per_expert, case.hash_layer)
        ref_params = dict(reference.named_parameters())
        for name, param in layer.named_parameters():
            note(f"weight:{name}", param, layer.local_view(name, ref_params[name]))
        note("expert_bias", layer.router.expert_bias, reference.router.expert_bias)
    finally:
        runtime.experts.scale_by_probs, runtime.dispatcher.chunk_sort_index = saved
    return {"errors": errors, "ledger": ledger.snapshot()}


def _four_rank_groups(case: Case, cache: _Groups) -> None:
    """Every group `_run_case` uses for a 4-rank case, made in its order (cached)."""
    grid = expert_grid(4, case.ep, case.etp)
    tp_cp = [list(range(start, start + case.cp)) for start in range(0, 4, case.cp)]
    for lists in (*grid.values(), tp_cp):
        for ranks in lists:
            if len(ranks) > 1:
                cache.get(ranks)
    cache.get(list(range(4)))


def _worker(rank: int, port: int, out_dir: str) -> None:
    """One of 8 ranks: ranks 0-3 run the 4-rank cases on their own groups while 4-7 wait, then
    all 8 run the 8-rank cases (one launch for both). torch's new_group is collective over the
    whole world, so every rank first makes every 4-rank case's groups, in one order."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=8, timeout=timedelta(seconds=60))
    cache = _Groups()
    results: dict[str, Any] = {}
    try:
        for case in FOUR_RANK_CASES:
            _four_rank_groups(case, cache)
        runs = [(4, index, case) for index, case in enumerate(FOUR_RANK_CASES)] if rank < 4 else []
        for world, index, case in runs:
            try:
                results[case.name] = _run_case(case, index, world, rank, cache)
            except Exception:  # report, then stop this rank: peers time out
                results[case.name] = {"exception": traceback.format_exc()}
                raise
        dist.monitored_barrier(timeout=timedelta(seconds=600))
        for index, case in enumerate(EIGHT_RANK_CASES):
            try:
                results[case.name] = _run_case(case, index, 8, rank, cache)
            except Exception:  # report, then stop this rank: peers time out within 60 s
                results[case.name] = {"exception": traceback.format_exc()}
                raise
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def launch(tmp_path: Path) -> list[dict[str, Any]]:
    """Spawn 8 gloo ranks running every case; returns each rank's results."""
    spawn_ranks(_worker, (free_port(), str(tmp_path)), 8)
    return [json.loads(Path(tmp_path, f"rank{r}.json").read_text()) for r in range(8)]


# ---------------------------------------------------------------------------------------------
# Cases

CAPACITY = {"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True}
BALANCED = {"moe_router_force_load_balancing": True}

FOUR_RANK_CASES = [
    Case("ep4", ep=4, steps=3),
    Case("ep2_etp2", ep=2, etp=2, steps=3),
    Case("cp2_ep2_folding", ep=2, cp=2, steps=2,
         moe={"moe_router_load_balancing_type": "aux_loss"}),
    Case("allgather_ep2_etp2", ep=2, etp=2, steps=2,
         model={"moe_router_score_function": "softmax"},
         moe={"moe_token_dispatcher_type": "allgather"}),
    Case("hash_ep4", ep=4, hash_layer=True, steps=2,
         model={"moe_router_score_function": "sigmoid"}),
    Case("drop_and_pad_ep4", ep=4, moe=CAPACITY, steps=2),
    Case("drop_and_pad_ep2_etp2", ep=2, etp=2, moe=CAPACITY),
    Case("drop_no_pad_ep2_etp2", ep=2, etp=2, moe={"moe_expert_capacity_factor": 0.75}),
    Case("allgather_drop_ep4", ep=4,
         moe={"moe_token_dispatcher_type": "allgather", "moe_expert_capacity_factor": 0.75}),
    Case("top1_sigmoid_ep4", ep=4,
         model={"moe_router_topk": 1, "moe_router_score_function": "sigmoid"}),
    Case("balanced_ep4", ep=4, moe=BALANCED),
    Case("balanced_ep2_etp2", ep=2, etp=2, moe=BALANCED),
    Case("wrong_probs_twice", ep=4, wrong="probs_twice"),
    Case("wrong_skip_expert_sort", ep=2, etp=2, wrong="skip_expert_sort"),
    Case("wrong_expert_grads_over_dp_cp", ep=2, etp=2, wrong="expert_grads_over_dp_cp"),
]
EIGHT_RANK_CASES = [
    Case("ep2_etp2_edp2", ep=2, etp=2, steps=3),
    Case("allgather_ep4_etp2", ep=4, etp=2, moe={"moe_token_dispatcher_type": "allgather"}),
    # dense CP4 x DP2 folded onto expert EP2 x EDP4 (EDP != DP); seq aux counts over CP4
    Case("cp4_dp2_ep2_edp4", ep=2, cp=4, steps=2),
    Case("balanced_ep2_etp2_edp2", ep=2, etp=2, moe=BALANCED),
]


@pytest.fixture(scope="module")
def eight_rank_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return launch(tmp_path_factory.mktemp("layer"))


@pytest.fixture(scope="module")
def four_rank_results(eight_rank_results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ranks 0-3, which ran the 4-rank cases."""
    return eight_rank_results[:4]


def _errors(results: list[dict[str, Any]], name: str) -> list[dict[str, float]]:
    per_rank = []
    for rank_results in results:
        entry = rank_results[name]
        assert "exception" not in entry, entry.get("exception")
        per_rank.append(entry["errors"])
    return per_rank


def _assert_equivalent(results: list[dict[str, Any]], name: str) -> None:
    for rank, errors in enumerate(_errors(results, name)):
        bad = {key: value for key, value in errors.items() if not value <= TOLERANCE}
        assert not bad, f"{name} rank {rank}: {bad}"
        # every parameter was compared: router, three expert matrices, three shared matrices
        assert sum(key.startswith("grad:") for key in errors) == 7


RIGHT_FOUR = [case.name for case in FOUR_RANK_CASES if case.wrong is None]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", RIGHT_FOUR)
def test_four_rank_layer_matches_reference(four_rank_results, name: str) -> None:
    _assert_equivalent(four_rank_results, name)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [case.name for case in EIGHT_RANK_CASES])
def test_eight_rank_layer_matches_reference(eight_rank_results, name: str) -> None:
    _assert_equivalent(eight_rank_results, name)


@pytest.mark.parametrize(
    ("name", "caught_in"),
    [
        # probs applied twice squares the weights: outputs and every gradient move
        ("wrong_probs_twice", "output"),
        # rows left source-major feed tokens to the wrong local expert
        ("wrong_skip_expert_sort", "output"),
        # expert shards of different experts summed together: only expert grads go wrong
        ("wrong_expert_grads_over_dp_cp", "grad:experts.w2"),
    ],
)
def test_wrong_variants_are_caught(four_rank_results, name: str, caught_in: str) -> None:
    worst = max(errors[caught_in] for errors in _errors(four_rank_results, name))
    assert worst > 1e-3, f"{name} slipped through: {caught_in} error {worst}"


# ---------------------------------------------------------------------------------------------
# Forced balanced routing: exact rows and bytes (hand-derived from the contract)

ROWS = SEQ * BATCH * BASE_MODEL["moe_router_topk"]  # n·k = 8·2 = 16 assignment rows per rank
ROW_BYTES = HIDDEN * 4  # fp32 hidden row
PROB_BYTES = 4  # fp32 routing weight
COUNT_BYTES = BASE_MODEL["num_experts"] * 8  # length-E int64 count vector


def _stats(group: str, calls: int, send: int, remote: int, recv: int) -> dict[str, Any]:
    return {"group": group, "calls": calls, "send_bytes": send, "remote_send_bytes": remote,
            "recv_bytes": recv}


def test_balanced_ep4_ledger(four_rank_results) -> None:
    # EP4, E=8: each rank owns 2 experts, so n·k/E·2 = 4 of its 16 rows stay home (remote 12);
    # balanced routing gives every rank exactly n·k = 16 rows back.
    hidden = _stats("ep", 1, ROWS * ROW_BYTES, 12 * ROW_BYTES, ROWS * ROW_BYTES)
    probs = _stats("ep", 1, ROWS * PROB_BYTES, 12 * PROB_BYTES, ROWS * PROB_BYTES)
    expected = {
        "ep_count_exchange.fwd": _stats("tp_ep", 1, COUNT_BYTES, COUNT_BYTES, 4 * COUNT_BYTES),
        "ep_dispatch_hidden.fwd": hidden,
        "ep_dispatch_hidden.bwd": hidden,
        "ep_dispatch_probs.fwd": probs,
        "ep_dispatch_probs.bwd": probs,
        "ep_combine_hidden.fwd": hidden,
        "ep_combine_hidden.bwd": hidden,
    }
    for rank_results in four_rank_results:
        ledger = rank_results["balanced_ep4"]["ledger"]
        assert {k: v for k, v in ledger.items() if k in expected} == expected
        assert not any(key.startswith(("etp_", "ag_")) for key in ledger)


def _assert_ep2_etp2_ledger(ledger: dict[str, Any], tp_ep_size: int) -> None:
    # EP2, E=8: 4 local experts, so half of the 16 rows stay home. ETP2 gathers the 16 rows of
    # both ETP peers (32) and the reduce-scatter sends all 32 partial rows, keeping 16.
    hidden = _stats("ep", 1, ROWS * ROW_BYTES, 8 * ROW_BYTES, ROWS * ROW_BYTES)
    probs = _stats("ep", 1, ROWS * PROB_BYTES, 8 * PROB_BYTES, ROWS * PROB_BYTES)
    gather_hidden = _stats("expt_tp", 1, ROWS * ROW_BYTES, ROWS * ROW_BYTES,
                           2 * ROWS * ROW_BYTES)
    scatter_hidden = _stats("expt_tp", 1, 2 * ROWS * ROW_BYTES, 2 * ROWS * ROW_BYTES,
                            ROWS * ROW_BYTES)
    gather_probs = _stats("expt_tp", 1, ROWS * PROB_BYTES, ROWS * PROB_BYTES,
                          2 * ROWS * PROB_BYTES)
    scatter_probs = _stats("expt_tp", 1, 2 * ROWS * PROB_BYTES, 2 * ROWS * PROB_BYTES,
                           ROWS * PROB_BYTES)
    expected = {
        "ep_count_exchange.fwd": _stats("tp_ep", 1, COUNT_BYTES, COUNT_BYTES,
                                        tp_ep_size * COUNT_BYTES),
        "ep_dispatch_hidden.fwd": hidden,
        "ep_dispatch_hidden.bwd": hidden,
        "ep_dispatch_probs.fwd": probs,
        "ep_dispatch_probs.bwd": probs,
        "ep_combine_hidden.fwd": hidden,
        "ep_combine_hidden.bwd": hidden,
        "etp_gather_hidden.fwd": gather_hidden,
        "etp_gather_hidden.bwd": scatter_hidden,  # AllGather⁻ = ReduceScatter
        "etp_gather_probs.fwd": gather_probs,
        "etp_gather_probs.bwd": scatter_probs,
        "etp_scatter_hidden.fwd": scatter_hidden,
        "etp_scatter_hidden.bwd": gather_hidden,  # ReduceScatter⁻ = AllGather
    }
    assert {k: v for k, v in ledger.items() if k in expected} == expected


def test_balanced_ep2_etp2_ledger(four_rank_results) -> None:
    for rank_results in four_rank_results:
        _assert_ep2_etp2_ledger(rank_results["balanced_ep2_etp2"]["ledger"], tp_ep_size=4)


def test_balanced_ep2_etp2_edp2_ledger(eight_rank_results) -> None:
    for rank_results in eight_rank_results:
        _assert_ep2_etp2_ledger(rank_results["balanced_ep2_etp2_edp2"]["ledger"], tp_ep_size=4)


def test_drop_and_pad_sends_capacity_rows(four_rank_results) -> None:
    # c = ceil(n·k/E · 1.0) = ceil(16/8) = 2: the first permute is exactly E·c = 16 rows, even
    # splits, no count exchange.
    for rank_results in four_rank_results:
        ledger = rank_results["drop_and_pad_ep4"]["ledger"]
        assert ledger["ep_dispatch_hidden.fwd"]["send_bytes"] == 16 * ROW_BYTES
        assert ledger["ep_dispatch_hidden.fwd"]["recv_bytes"] == 16 * ROW_BYTES
        assert "ep_count_exchange.fwd" not in ledger


def test_allgather_ledger(eight_rank_results) -> None:
    # tp_ep = 8 ranks, n = 8 tokens: gather [8, h] → [64, h]; probs and map are [n, E].
    tokens, experts, members = SEQ * BATCH, BASE_MODEL["num_experts"], 8
    for rank_results in eight_rank_results:
        ledger = rank_results["allgather_ep4_etp2"]["ledger"]
        own, full = tokens * ROW_BYTES, members * tokens * ROW_BYTES
        assert ledger["ag_gather_hidden.fwd"] == _stats("tp_ep", 1, own, own, full)
        assert ledger["ag_scatter_hidden.fwd"] == _stats("tp_ep", 1, full, full, own)
        probs = tokens * experts * PROB_BYTES
        assert ledger["ag_gather_probs.fwd"] == _stats("tp_ep", 1, probs, probs, members * probs)
        routing_map = tokens * experts  # one byte per entry
        assert ledger["ag_gather_routing_map.fwd"] == _stats(
            "tp_ep", 1, routing_map, routing_map, members * routing_map
        )
        assert "ag_gather_routing_map.bwd" not in ledger

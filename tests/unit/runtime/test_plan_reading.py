"""The runtime reads what the plan says — gradient pre-scales, expert ownership, MoE settings — and
never recomputes or re-defaults them.

Each test edits one value in a compiled plan, re-digests it (`planner.plan_format.plan_digest`, so the
edited plan still loads) and shows that the runtime's behaviour follows the edit, or that the
runtime refuses it with a PlanError naming the field. The gradient test really trains: 2 gloo
ranks (torch.multiprocessing spawn) run one optimizer step of the real `RankTrainer` per plan.
"""

from __future__ import annotations

import copy
import json
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
import yaml

from planner.config.loader import load_config
from planner.plan import compile_plan
from planner.plan_format import plan_digest, write_plan
from planner.rules import run_rules
from runtime.plan_io import PlanError, load_plan
from tests.support.ports import free_port
from tests.support.spawn import spawn_ranks

# 2 ranks, EP 2 over DP 2: dense grads sum over dp_cp = {0, 1}, each rank holds E/EP = 2 experts
# and its expt_dp group is itself (EDP 1). The load-balancing type is left to the schema.
SMALL: dict[str, Any] = {
    "model": {"num_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "kv_channels": 8,
              "ffn_hidden_size": 32, "vocab_size": 32, "num_experts": 4, "moe_router_topk": 2,
              "moe_ffn_hidden_size": 8, "moe_shared_expert_intermediate_size": 8},
    "parallel": {"world_size": 2, "ep": 2},
    "training": {"seq_length": 8, "micro_batch_size": 1, "global_batch_size": 2,
                 "precision": "fp32", "lr": 1e-3, "seed": 5},
    "moe": {"moe_token_dispatcher_type": "alltoall", "moe_aux_loss_coeff": 1e-2},
    "cluster": {"gpus_per_node": 8},
}


def compiled(folder: Path, name: str = "small", config: dict[str, Any] | None = None) -> Path:
    source = folder / f"{name}.yaml"
    source.write_text(yaml.safe_dump(config or SMALL))
    cfg = load_config(source)
    target = folder / f"{name}.plan.json"
    write_plan(compile_plan(cfg, run_rules(cfg)), target)
    return target


def edited(source: Path, target: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the plan with `edit` applied and the digest recomputed, so it still loads."""
    document = json.loads(source.read_text())
    edit(document)
    document["digest"] = plan_digest(document)
    write_plan(document, target)
    return target


def set_budget(name: str, value: str) -> Callable[[dict[str, Any]], None]:
    def edit(document: dict[str, Any]) -> None:
        (entry,) = [b for b in document["budgets"] if b["name"] == name]
        entry["value"] = value
    return edit


def budget_value(plan_path: Path, name: str) -> str:
    (entry,) = [b for b in json.loads(plan_path.read_text())["budgets"] if b["name"] == name]
    return str(entry["value"])


# ---------------------------------------------------------------------------------------------
# (a) gradient pre-scales: two real ranks, one training step per plan


def _worker(rank: int, world: int, port: int, plans: dict[str, str], out: str) -> None:
    """Build the real RankTrainer for each plan, run step 0, save the reduced grads."""
    import torch.distributed as dist

    from runtime.groups import build_groups
    from runtime.train import RankTrainer, RunOptions, moe_blocks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    result: dict[str, Any] = {}
    try:
        groups = build_groups(load_plan(plans["original"]), timedelta(seconds=60))
        for name, path in plans.items():
            try:
                trainer = RankTrainer(load_plan(path), groups, RunOptions(capture=True))
            except PlanError as exc:
                result[name] = {"refused": str(exc)}
                continue
            expert_ids = {id(p) for p in trainer.expert_params}
            grads = trainer.step(0).grads
            result[name] = {
                "grads": grads,
                "expert_names": sorted(n for n, p in trainer.model.named_parameters()
                                       if id(p) in expert_ids),
                "built_experts": [list(block.experts.expert_ids)
                                  for block in moe_blocks(trainer.model)],
                "balancing": [block.router.settings.aux_loss_type
                              for block in moe_blocks(trainer.model)],
            }
    except Exception:  # noqa: BLE001 - hand the failure to the test
        result["error"] = traceback.format_exc()
        raise
    finally:
        torch.save(result, f"{out}.rank{rank}")
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("plan_reading")
    original = compiled(folder)
    # the compiled factors for DP·CP = 2: 1/|dp_cp| = 1/2 for both parameter classes
    assert budget_value(original, "grad_scale_sum_dense") == "1/2"
    assert budget_value(original, "grad_scale_sum_expert") == "1/2"

    plans = {
        "original": original,
        "dense_doubled": edited(original, folder / "dense.plan.json",
                                set_budget("grad_scale_sum_dense", "1")),
        "expert_doubled": edited(original, folder / "expert.plan.json",
                                 set_budget("grad_scale_sum_expert", "1")),
        # the loss-scale chain: m = B 2 / (b 1 · DP 2) = 1, so 1/m = 1
        "loss_doubled": edited(original, folder / "loss.plan.json",
                               set_budget("loss_scale_microbatch", "2")),
    }
    assert budget_value(original, "loss_scale_microbatch") == "1"
    assert budget_value(original, "expert_grad_buffers") == "1"  # EP 2: the experts' own buffer
    out = folder / "result"
    try:
        spawn_ranks(_worker, (2, free_port(), {k: str(v) for k, v in plans.items()}, str(out)),
                    2)
    except mp.ProcessRaisedException:
        pass  # the traceback is in the result files
    runs = {rank: torch.load(f"{out}.rank{rank}", weights_only=False) for rank in range(2)}
    for rank, run in runs.items():
        assert "error" not in run, f"rank {rank}: {run['error']}"
    return runs


def test_edited_dense_pre_scale_doubles_exactly_the_reduced_dense_grads(two_rank_runs) -> None:
    """s = 1/2 → 2s = 1 on grad_scale_sum_dense: every dense grad after the dp_cp SUM doubles
    (a power-of-two factor is exact in fp32: (a+b)·1 = 2·((a·½)+(b·½))); experts keep theirs."""
    for rank, run in two_rank_runs.items():
        base, doubled = run["original"], run["dense_doubled"]
        experts = set(base["expert_names"])
        assert experts and len(experts) < len(base["grads"])
        for name, grad in base["grads"].items():
            want = grad if name in experts else 2 * grad
            assert torch.equal(doubled["grads"][name], want), f"rank {rank} {name}"
        assert any(base["grads"][name].abs().sum() > 0 for name in base["grads"]
                   if name not in experts)


def test_edited_expert_pre_scale_doubles_exactly_the_reduced_expert_grads(two_rank_runs) -> None:
    for rank, run in two_rank_runs.items():
        base, doubled = run["original"], run["expert_doubled"]
        experts = set(base["expert_names"])
        for name, grad in base["grads"].items():
            want = 2 * grad if name in experts else grad
            assert torch.equal(doubled["grads"][name], want), f"rank {rank} {name}"
        assert any(base["grads"][name].abs().sum() > 0 for name in experts)


def test_edited_loss_scale_doubles_the_grads_the_aux_loss_does_not_reach(two_rank_runs) -> None:
    """Article §18-19, the loss-scale / 1/m chain: the runtime multiplies each microbatch's loss by
    the plan's loss_scale_microbatch (Megatron-LM dev@d48bd6be megatron/core/pipeline_parallel/
    schedules.py:336 forward_step `output_tensor /= num_microbatches`). 1 → 2 doubles exactly the
    grads of the parameters after the last router (the final norm and the output layer); the aux
    loss, scaled on its own, still reaches the others."""
    for rank, run in two_rank_runs.items():
        base, doubled = run["original"], run["loss_doubled"]
        head = [n for n in base["grads"] if n.startswith(("final_norm", "output"))]
        assert head, sorted(base["grads"])
        for name in head:
            assert torch.equal(doubled["grads"][name], 2 * base["grads"][name]), f"rank {rank} {name}"


def test_experts_join_the_dense_reduction_without_an_expert_grid(tmp_path: Path) -> None:
    """Article §18-19: EP 1, ETP = TP, EGTP = GTP: the plan says no expert buffer and the runtime
    reduces the experts with the dense grads (Megatron-LM main@d98e8a64 megatron/core/extensions/
    transformer_engine.py:1236 use_expert_pgs)."""
    config = copy.deepcopy(SMALL)
    config["parallel"]["ep"] = 1
    scales = load_plan(compiled(tmp_path, "ep1", config)).grad_scales
    assert (scales.expert_buffer, scales.dense, scales.expert, scales.loss) == (False, 0.5, 0.5, 1.0)


# ---------------------------------------------------------------------------------------------
# (b) expert ownership


def test_runtime_builds_the_experts_the_plan_lists(two_rank_runs) -> None:
    """E = 4, EP = 2: the plan gives rank 0 experts 0, 1 and rank 1 experts 2, 3 in each MoE layer."""
    assert two_rank_runs[0]["original"]["built_experts"] == [[0, 1], [0, 1]]
    assert two_rank_runs[1]["original"]["built_experts"] == [[2, 3], [2, 3]]


def test_edited_ownership_the_dispatcher_cannot_route_is_refused_at_load(tmp_path: Path) -> None:
    """Swapping the two ranks' experts in the plan: the alltoall dispatcher would send expert 0's
    tokens to EP rank 0, which would now hold experts 2, 3 — refused on every rank alike, before
    any group forms, naming what each rank was given."""
    def swap(document: dict[str, Any]) -> None:
        first, second = document["ranks"][0]["experts"], document["ranks"][1]["experts"]
        document["ranks"][0]["experts"], document["ranks"][1]["experts"] = second, first

    with pytest.raises(PlanError, match=r"rank 0: \[2, 3\], rank 1: \[0, 1\]\).*recompile"):
        load_plan(edited(compiled(tmp_path), tmp_path / "swapped.plan.json", swap))


def test_moe_layer_refuses_experts_its_dispatcher_does_not_route(tmp_path: Path) -> None:
    """The layer's own guard (one rank, EP 1: the dispatcher routes all of experts 0..3 here)."""
    from runtime.comm import Ledger, MoEGroups
    from runtime.moe_layer import MoELayer

    plan = load_plan(compiled(tmp_path))
    layer = MoELayer(plan.model, plan.moe, 0, False, MoEGroups.single(), Ledger(), 1, None,
                     torch.float32, range(4))
    assert layer.experts.expert_ids == (0, 1, 2, 3)
    with pytest.raises(PlanError, match=r"experts \[3, 2, 1, 0\], but the alltoall dispatcher "
                                        r"routes one ascending contiguous block per EP rank"):
        MoELayer(plan.model, plan.moe, 0, False, MoEGroups.single(), Ledger(), 1, None,
                 torch.float32, (3, 2, 1, 0))


def test_grouped_experts_are_built_from_the_ids_given(tmp_path: Path) -> None:
    """Expert weights are drawn from their global ids: ids (3, 1) give the weights of expert 3
    then expert 1, exactly as the full-range build holds them."""
    from runtime.experts import GroupedExperts
    from runtime.router import MoESettings

    plan = load_plan(compiled(tmp_path))
    settings = MoESettings.from_config(plan.model, plan.moe)
    everything = GroupedExperts(settings, 0, range(4), 0, 1, 9, torch.float32)
    chosen = GroupedExperts(settings, 0, (3, 1), 0, 1, 9, torch.float32)
    assert chosen.expert_ids == (3, 1) and chosen.num_local_experts == 2
    for matrix in ("w1", "w3", "w2"):
        assert torch.equal(getattr(chosen, matrix), getattr(everything, matrix)[[3, 1]])


def test_plan_with_inconsistent_ownership_is_refused_at_load(tmp_path: Path) -> None:
    def bad(document: dict[str, Any]) -> None:
        document["ranks"][1]["experts"]["count"] = 3

    with pytest.raises(PlanError, match=r"ranks\[1\]\.experts is inconsistent"):
        load_plan(edited(compiled(tmp_path), tmp_path / "bad.plan.json", bad))


# ---------------------------------------------------------------------------------------------
# (c) MoE settings come from the plan's resolved config


def test_router_balancing_type_is_the_plans(two_rank_runs, tmp_path: Path) -> None:
    """SMALL leaves moe_router_load_balancing_type unset: the plan holds the schema's default,
    'aux_loss', and every router of the trained model uses it (the runtime used to default to
    'none'). An edited plan's 'seq_aux_loss' reaches the settings the layers are built from."""
    from runtime.router import MoESettings

    original = compiled(tmp_path)
    plan = load_plan(original)
    assert plan.moe["moe_router_load_balancing_type"] == "aux_loss"
    assert two_rank_runs[0]["original"]["balancing"] == ["aux_loss", "aux_loss"]

    def seq(document: dict[str, Any]) -> None:
        document["config"]["moe"]["moe_router_load_balancing_type"] = "seq_aux_loss"

    changed = load_plan(edited(original, tmp_path / "seq.plan.json", seq))
    assert MoESettings.from_config(changed.model, changed.moe).aux_loss_type == "seq_aux_loss"


@pytest.mark.parametrize(("section", "key"), [
    ("moe", "moe_router_load_balancing_type"),
    ("moe", "moe_token_dispatcher_type"),
    ("model", "norm_epsilon"),
    ("parallel", "cp_partition_mode"),
])
def test_plan_missing_a_config_field_is_refused_not_defaulted(tmp_path: Path, section: str,
                                                              key: str) -> None:
    def drop(document: dict[str, Any]) -> None:
        del document["config"][section][key]

    path = edited(compiled(tmp_path), tmp_path / "dropped.plan.json", drop)
    with pytest.raises(PlanError, match=rf"no config\.{section}\.{key}: .*recompile"):
        plan = load_plan(path)
        # fields only the model build reads are refused there, before any group forms
        from runtime.model import DecoderSpec
        from runtime.router import MoESettings

        MoESettings.from_config(plan.model, plan.moe)
        DecoderSpec.from_config(plan.model, plan.moe_layers(), plan.hash_layers(),
                                plan.padded_vocab_size)


@pytest.mark.parametrize("name", ["grad_scale_sum_dense", "grad_scale_sum_expert"])
def test_plan_without_a_gradient_pre_scale_is_refused(tmp_path: Path, name: str) -> None:
    def drop(document: dict[str, Any]) -> None:
        document["budgets"] = [b for b in document["budgets"] if b["name"] != name]

    with pytest.raises(PlanError, match=rf"no budget '{name}'.*recompile"):
        load_plan(edited(compiled(tmp_path), tmp_path / "noscale.plan.json", drop))


def test_grad_scales_follow_the_loss_mode(tmp_path: Path) -> None:
    """average_in_collective reads the AVG pair (dense 1, expert |EDP|/|DP·CP| = 1/2);
    per-token loss reads the SUM pair (1, 1) and the final 1/tokens = 1/(B·S) = 1/16."""
    def variant(**training: Any) -> Any:
        config = copy.deepcopy(SMALL)
        config["training"].update(training)
        name = "_".join(training)
        return load_plan(compiled(tmp_path, name, config)).grad_scales

    average = variant(average_in_collective=True)
    assert (average.dense, average.expert, average.average, average.per_token) == (
        1.0, 0.5, True, None)
    per_token = variant(calculate_per_token_loss=True)
    assert (per_token.dense, per_token.expert, per_token.average, per_token.per_token) == (
        1.0, 1.0, False, 1 / 16)


def test_re_paired_groups_are_refused_at_load() -> None:
    """A plan whose groups were re-paired and re-digested (issue 26) passed every check before:
    the groups are now held against the plan's own degrees and rank coordinates."""
    from runtime.plan_io import check_plan

    cfg = load_config(Path(__file__).resolve().parents[3] / "examples" / "tiny-cpu-8.yaml")
    plan = compile_plan(cfg, run_rules(cfg))
    check_plan(copy.deepcopy(plan))
    swapped = copy.deepcopy(plan)
    first, second = swapped["groups"]["dp"][0], swapped["groups"]["dp"][1]
    first[0], second[0] = second[0], first[0]
    swapped["digest"] = plan_digest(swapped)
    with pytest.raises(PlanError, match=r"dp group 0 .* does not match the plan's rank coordinates"):
        check_plan(swapped)
    resized = copy.deepcopy(plan)
    resized["groups"]["expt_dp"] = [group[:1] for group in resized["groups"]["expt_dp"]] + [
        group[1:] for group in resized["groups"]["expt_dp"]]
    with pytest.raises(PlanError, match=r"expt_dp group 0 .* has 1 ranks, the plan declares edp = 2"):
        check_plan(resized)

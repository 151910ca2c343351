"""Checkpoints keyed by global expert id survive layout changes (runtime/checkpoint.py, DCP).

One 4-rank gloo launch runs a chain of jobs on the same model (4 experts, a hash layer, expert
bias, tied embeddings, seq aux loss, one MTP depth; the vocabulary 64 padded to a multiple of
32·TP, so 64 under TP 1 and TP 2) and global batch B = 4 under five layouts:

    A = EP4 (DP4)          B = EP2 (DP4, EDP2)     C = EP2×ETP2 (DP4)     D = PP2×EP2 (DP2)
    E = TP2 with SP × EP2 (ETP2, DP2), bf16, the distributed optimizer (Nemotron-3-Nano's axes)

* round trips: A saves after one step (A1); B, C load it and re-save (0 steps); A loads those
  and re-saves. Every logical tensor — weights, expert bias, tid2eid, AdamW moments and step
  counts, RNG states, the data position — must come back bit-identical;
* continued training: A trains 2 steps (A2, never changing layout); B, C and D load A1 and
  train the second step. Every weight and expert bias must match A2 within the equivalence
  tolerance (a different layout sums gradients in another order: fp32 rounding only);
* an ETP checkpoint stores each expert matrix once, as two column blocks at offsets of the
  logical [h, f] matrix;
* E saves the same logical tensors: each TP-split weight whole (gathered over TP), the sharded
  AdamW state whole (gathered over dp_cp / expt_dp), and its fp32 main params beside its bf16
  weights. A1 → E → A round-trips bit-exactly (an fp32 checkpoint's weights are E's main
  params; E's main params are A's weights), and E resumes from its own checkpoint bit-identically:
  a step from E1 (A1 saved again by E) ends in the same bits as a step from A1 itself, so E's
  save and load lose nothing;
* a checkpoint of another model (8 experts) is refused on every rank with a message;
* untrusted folders (runtime/checkpoint_trust.py), made from A1 between jobs: a `.metadata` that is
  a pickle payload (with a manifest rewritten to match) is refused naming the class, and the
  payload's marker file never appears; a truncated shard is refused naming the file; a folder
  without a manifest (a foreign or unfinished checkpoint) is refused; a --save folder another run
  holds locked is refused naming the lock.
"""

from __future__ import annotations

import json
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.runtime_ranks import TOLERANCE, free_port
from tests.support.spawn import spawn_ranks

MODEL = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "kv_channels": 8,
         "ffn_hidden_size": 64, "vocab_size": 64, "num_experts": 4, "moe_router_topk": 2,
         "moe_ffn_hidden_size": 16, "moe_shared_expert_intermediate_size": 16,
         "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
         "moe_n_hash_layers": 1, "untie_embeddings_and_output_weights": False,
         "mtp_num_layers": 1, "make_vocab_size_divisible_by": 32}
LAYOUTS = {
    "A": {"world_size": 4, "ep": 4},
    "B": {"world_size": 4, "ep": 2},
    "C": {"world_size": 4, "ep": 2, "etp": 2},
    "D": {"world_size": 4, "ep": 2, "pp": 2, "pipeline_model_parallel_layout": "Et|tmL"},
    "E": {"world_size": 4, "tp": 2, "ep": 2, "sequence_parallel": True},
    "other": {"world_size": 4, "ep": 4},
}
# (plan, load, steps, save)
JOBS = [
    ("A", None, 2, "A2"), ("A", None, 1, "A1"),
    ("B", "A1", 0, "B1"), ("A", "B1", 0, "A1_via_B"),
    ("C", "A1", 0, "C1"), ("A", "C1", 0, "A1_via_C"),
    ("B", "A1", 1, "B2"), ("C", "C1", 1, "C2"), ("D", "A1", 1, "D2"),
    ("E", "A1", 0, "E1"), ("A", "E1", 0, "A1_via_E"),
    ("E", "A1", 1, "E2"), ("E", "E1", 1, "E2_resumed"),
    ("other", "A1", 0, "refused"),
    ("prepare", None, 0, "untrusted folders"),
    ("A", "evil", 0, "refused_evil"), ("A", "truncated", 0, "refused_truncated"),
    ("A", "foreign", 0, "refused_foreign"), ("A", "A1", 0, "locked"),
]
MARKER = "PAYLOAD-RAN"
TRAINING = {"E": {"precision": "bf16", "use_distributed_optimizer": True}}


class _Payload:
    """Unpickling this runs a shell command that leaves MARKER behind."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.system, (f"touch {self.folder}/{MARKER}",))


def _untrusted_folders(root: Path) -> None:
    """Rank 0, between jobs: copies of A1 broken the ways a shared checkpoint can be."""
    import hashlib
    import pickle
    import shutil

    from runtime.checkpoint_trust import LOCK, MANIFEST, METADATA

    for name in ("evil", "truncated", "foreign"):
        shutil.copytree(root / "A1", root / name)
    (root / "evil" / METADATA).write_bytes(pickle.dumps(_Payload(str(root))))
    manifest = json.loads((root / "evil" / MANIFEST).read_text())
    manifest["metadata_sha256"] = hashlib.sha256((root / "evil" / METADATA).read_bytes()).hexdigest()
    manifest["files"][METADATA] = (root / "evil" / METADATA).stat().st_size
    (root / "evil" / MANIFEST).write_text(json.dumps(manifest))
    shard = sorted((root / "truncated").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    (root / "foreign" / MANIFEST).unlink()
    (root / "locked").mkdir()
    (root / "locked" / LOCK).write_text("pid 1 on elsewhere since earlier\n")


def _config(name: str) -> dict[str, Any]:
    model = dict(MODEL, num_experts=8) if name == "other" else dict(MODEL)
    return {
        "model": model, "parallel": dict(LAYOUTS[name]),
        "training": {"seq_length": 16, "micro_batch_size": 1, "global_batch_size": 4,
                     "precision": "fp32", "lr": 1e-3, "seed": 5, **TRAINING.get(name, {})},
        "moe": {"moe_token_dispatcher_type": "alltoall", "moe_tid2eid_source": "seeded",
                "moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": 1e-2},
        "cluster": {"gpus_per_node": 8},
    }


def _compile(name: str, folder: Path) -> Path:
    import yaml

    from planner.config.loader import load_config
    from planner.plan import compile_plan
    from planner.plan_format import write_plan
    from planner.rules import run_rules

    source = folder / f"{name}.yaml"
    source.write_text(yaml.safe_dump(_config(name)))
    cfg = load_config(source)
    target = folder / f"{name}.plan.json"
    write_plan(compile_plan(cfg, run_rules(cfg)), target)
    return target


def _worker(rank: int, port: int, folder: str) -> None:
    import torch.distributed as dist

    from runtime.__main__ import execute
    from runtime.checkpoint import CheckpointError
    from runtime.plan_io import load_plan
    from runtime.train import RunOptions

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=4, timeout=timedelta(seconds=90))
    outcomes: dict[str, Any] = {}
    root = Path(folder)
    try:
        for plan_name, load, steps, save in JOBS:
            if plan_name == "prepare":
                if rank == 0:
                    _untrusted_folders(root)
                dist.barrier()
                continue
            plan = load_plan(root / f"{plan_name}.plan.json")
            try:
                execute(plan, RunOptions(steps=steps), False, None,
                        root / load if load else None, root / save)
                outcomes[save] = "ok"
            except CheckpointError as exc:
                outcomes[save] = f"refused: {exc}"
    except Exception:  # noqa: BLE001 - name the failing job in the outcome file
        outcomes["error"] = traceback.format_exc()
        raise
    finally:
        (root / f"outcomes-{rank}.json").write_text(json.dumps(outcomes))
        dist.destroy_process_group()


def _full(folder: Path, name: str) -> dict[str, Any]:
    """A checkpoint as full logical tensors, read without any process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = folder / f"{name}.pt"
    dcp_to_torch_save(str(folder / name), str(target))
    return torch.load(target, weights_only=False)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("checkpoints")
    for name in LAYOUTS:
        _compile(name, folder)
    try:
        spawn_ranks(_worker, (free_port(), str(folder)), 4)
    except mp.ProcessRaisedException:
        pass  # the outcome files say which job failed
    return folder


def _outcomes(chain: Path) -> list[dict[str, Any]]:
    outcomes = [json.loads((chain / f"outcomes-{rank}.json").read_text()) for rank in range(4)]
    for outcome in outcomes:
        assert "error" not in outcome, outcome.get("error")
    return outcomes


def test_every_job_of_the_chain_ran(chain: Path) -> None:
    for outcome in _outcomes(chain):
        assert all(outcome[save] == "ok" for plan, _, _, save in JOBS
                   if plan != "prepare" and not save.startswith(("refused", "locked")))


def test_checkpoint_keys_are_logical(chain: Path) -> None:
    state = _full(chain, "A1")
    experts = {key for key in state if ".ffn.experts." in key and "optimizer" not in key}
    prefixes = ("layers.0", "layers.1", "mtp.0.block")  # MTP depth 0 is MoE layer 2
    assert experts == {f"{prefix}.ffn.experts.{eid}.{matrix}" for prefix in prefixes
                       for eid in range(4) for matrix in ("w1", "w2", "w3")}
    assert tuple(state["layers.0.ffn.experts.3.w1"].shape) == (32, 16)  # one expert, [h, f]
    assert tuple(state["layers.0.ffn.experts.3.w2"].shape) == (16, 32)
    for key in ("layers.0.ffn.router.weight", "layers.1.ffn.router.expert_bias",
                "layers.0.ffn.router.tid2eid", "embedding", "progress.steps",
                "optimizer.layers.0.ffn.experts.2.w3.exp_avg",
                "optimizer.layers.0.ffn.experts.w3.step", "optimizer.embedding.exp_avg_sq",
                "mtp.0.eh_proj", "mtp.0.block.ffn.router.expert_bias",
                "rng.rank0", "rng.rank3"):
        assert key in state, key
    assert int(state["progress.steps"]) == 1
    assert float(state["optimizer.embedding.step"]) == 1.0
    # tid2eid spans the padded vocabulary (64, a multiple of make_vocab_size_divisible_by·TP)
    assert tuple(state["layers.0.ffn.router.tid2eid"].shape) == (64, 2)


def test_etp_shards_are_offsets_of_the_logical_matrix(chain: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(chain / "C1")).read_metadata().state_dict_metadata
    w1, w2 = metadata["layers.1.ffn.experts.2.w1"], metadata["layers.1.ffn.experts.2.w2"]
    assert tuple(w1.size) == (32, 16) and tuple(w2.size) == (16, 32)
    # ETP2 halves the intermediate dimension f = 16: columns of w1, rows of w2
    assert sorted(tuple(c.offsets) for c in w1.chunks) == [(0, 0), (0, 8)]
    assert sorted(tuple(c.offsets) for c in w2.chunks) == [(0, 0), (8, 0)]
    assert {tuple(c.sizes) for c in w1.chunks} == {(32, 8)}


@pytest.mark.parametrize("copy", ["B1", "A1_via_B", "C1", "A1_via_C", "A1_via_E"])
def test_round_trips_are_bit_exact(chain: Path, copy: str) -> None:
    original, other = _full(chain, "A1"), _full(chain, copy)
    assert set(other) == set(original)
    for key, value in original.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(other[key], value), key
        else:
            assert other[key] == value, key


def test_tp_bf16_and_sharded_optimizer_state_are_saved_whole(chain: Path) -> None:
    """E's checkpoint: h = 32, 4 query heads of 8 (KV groups = heads), TP 2. The query weight
    [h, heads·d] is whole ([32, 32], not a TP rank's [32, 16]); weights are bf16 and each has an
    fp32 main param; the moments, sharded over dp_cp by the distributed optimizer, are whole."""
    state = _full(chain, "E1")
    assert tuple(state["layers.0.attention.wq"].shape) == (32, 32)
    assert state["layers.0.attention.wq"].dtype == torch.bfloat16
    main = state["optimizer.layers.0.attention.wq.main_param"]
    assert main.dtype == torch.float32 and tuple(main.shape) == (32, 32)
    assert torch.equal(main.to(torch.bfloat16), state["layers.0.attention.wq"])
    assert tuple(state["optimizer.embedding.exp_avg"].shape) == (64, 32)
    assert float(state["optimizer.embedding.step"]) == 1.0
    assert tuple(state["optimizer.layers.0.ffn.experts.1.w2.main_param"].shape) == (16, 32)
    assert int(state["progress.steps"]) == 1


def test_the_same_layout_resumes_bit_identically(chain: Path) -> None:
    """TP 2 with SP, bf16, the distributed optimizer: one step from the state in memory (A1 just
    loaded) or from E's own save of it (E1) ends in the same bits (weights, main params, moments,
    step counts, expert biases, RNG, the data position)."""
    straight, resumed = _full(chain, "E2"), _full(chain, "E2_resumed")
    assert set(straight) == set(resumed)
    for key, value in straight.items():
        assert torch.equal(resumed[key], value), key


@pytest.mark.parametrize("resumed", ["B2", "C2", "D2"])
def test_training_continues_as_if_the_layout_never_changed(chain: Path, resumed: str) -> None:
    from runtime.equivalence import relative_error

    expected, actual = _full(chain, "A2"), _full(chain, resumed)
    assert int(actual["progress.steps"]) == 2
    compared = 0
    for key, value in expected.items():
        if key.startswith(("rng.", "optimizer.")) or not isinstance(value, torch.Tensor):
            continue
        if value.dtype == torch.int64:
            assert torch.equal(actual[key], value), key
        else:
            error = relative_error(actual[key], value)
            assert error <= TOLERANCE, f"{key}: {error:.3e}"
        compared += 1
    assert compared >= 40


def test_a_checkpoint_of_another_model_is_refused_on_every_rank(chain: Path) -> None:
    for outcome in _outcomes(chain):
        assert outcome["refused"].startswith("refused: ")
        assert "another model" in outcome["refused"]


def test_checkpoint_flags_are_checked_before_anything_starts(tmp_path: Path) -> None:
    from tests.support.launch import runtime

    plan = _compile("A", tmp_path)
    zero = runtime("--plan", str(plan), "--steps", "0")
    assert zero.returncode == 2 and "0 only with --load and --save" in zero.stderr
    checked = runtime("--plan", str(plan), "--load", str(tmp_path), "--check-reference")
    assert checked.returncode == 2 and "cannot check a run that starts from --load" in (
        checked.stderr)
    for run in (zero, checked):
        assert "Traceback" not in run.stderr


@pytest.mark.parametrize(("job", "says"), [
    ("refused_evil", "names posix.system, which no checkpoint this runtime writes holds"),
    ("refused_truncated", "truncated or replaced after the save"),
    ("refused_foreign", "has no moeplan-manifest.json"),
    ("locked", "another run is saving into"),
])
def test_an_untrusted_checkpoint_is_refused_before_anything_runs(chain: Path, job: str, says: str) -> None:
    for outcome in _outcomes(chain):
        assert outcome[job].startswith("refused: ") and says in outcome[job], outcome[job]
    assert not (chain / MARKER).exists(), "the pickle payload ran"


def test_a_save_leaves_a_manifest_and_no_lock(chain: Path) -> None:
    from runtime.checkpoint_trust import LOCK, MANIFEST

    manifest = json.loads((chain / "A1" / MANIFEST).read_text())
    assert manifest["model"]["num_experts"] == 4 and manifest["steps"] == 1
    assert ".metadata" in manifest["files"] and not (chain / "A1" / LOCK).exists()

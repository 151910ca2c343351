"""Distributed checkpoints that survive a layout change (torch.distributed.checkpoint, DCP).

A checkpoint addresses *logical* tensors, never a rank's storage:

* a routed expert's matrix is `layers.<L>.ffn.experts.<global expert id>.<w1|w2|w3>`, the
  expert's own [in, out] matrix. A rank's ETP shard is a DTensor on the (expt_dp, expt_tp)
  sub-mesh of the plan's expert grid — replicated over expt_dp, sharded over expt_tp along the
  intermediate dimension — so DCP records it as an offset into the logical matrix and any later
  layout (other EP, ETP, EDP, PP) reads exactly the slice it owns;
* every other parameter (embedding, attention, norms, router weight, shared expert, head), the
  router buffers (`expert_bias`, `tid2eid`) and the optimizer state are plain tensors under the
  single-process model's names, replicated wherever the layout replicates them (DCP keeps one
  copy); AdamW's `exp_avg` / `exp_avg_sq` sit under `optimizer.<key>.<state>` with the same
  per-expert keys, its step count under `optimizer.<parameter name>.step`;
* `progress.steps` (optimizer steps done: the data position) and every rank's CPU RNG state
  (`rng.rank<R>`; a rank of a larger job restarts from rank R mod the saved world size).

The runtime draws its weights and data from (seed, identity) generators, so the RNG state does
not change its numbers; it is kept so that anything that does draw from torch's global generator
resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from runtime.checkpoint_trust import (
    MANIFEST,
    CheckpointRefused,
    SafeReader,
    SaveLock,
    check_manifest,
    check_metadata_files,
    safe_metadata,
    write_manifest,
)
from runtime.experts import EXPERT_TENSORS, expert_shard_dim
from runtime.plan_io import Plan

PROGRESS_KEY = "progress.steps"
MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's per-element state; `step` is one count


class CheckpointError(Exception):
    """A checkpoint this run cannot load; the message says why."""


def expert_mesh(plan: Plan) -> DeviceMesh:
    """The plan's expert grid as a (pp, ep, edp, etp) device mesh (collective: every rank)."""
    sizes = (plan.pp, int(plan.layout["ep"]), int(plan.layout["edp"]),
             int(plan.layout["etp"]))
    mesh = torch.full(sizes, -1, dtype=torch.long)
    for entry in plan.raw["ranks"]:
        mesh[int(entry["stage"]), int(entry["ep_rank"]), int(entry["edp_rank"]),
             int(entry["etp_rank"])] = int(entry["rank"])
    if int((mesh < 0).sum()):
        raise CheckpointError("the plan's expert coordinates do not fill the expert grid")
    return DeviceMesh("cpu" if dist.get_backend() == "gloo" else "cuda", mesh,
                      mesh_dim_names=("pp", "ep", "edp", "etp"))


def _key(name: str, state: str) -> str:
    """A logical key: the tensor's own name, or `optimizer.<name>.<state>` for AdamW state."""
    return f"optimizer.{name}.{state}" if state else name


def _expert_param(name: str) -> tuple[str, str] | None:
    """`layers.L.ffn.experts.w1` → ("layers.L.ffn.experts", "w1"); None for other names."""
    prefix, _, matrix = name.rpartition(".")
    if prefix.endswith(".ffn.experts") and matrix in EXPERT_TENSORS:
        return prefix, matrix
    return None


class LogicalState:
    """Maps one rank's model and optimizer onto logical checkpoint keys and back."""

    def __init__(self, plan: Plan, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 expert_ids: Sequence[int], mesh: DeviceMesh) -> None:
        self.plan, self.model, self.optimizer = plan, model, optimizer
        self.expert_ids = tuple(expert_ids)  # the plan's, in local order: logical key of each
        self.submesh = mesh["edp", "etp"]

    def _pieces(self, name: str, tensor: torch.Tensor, state: str = "") -> dict[str, Any]:
        """One parameter-shaped tensor (the parameter `name` itself, or its optimizer `state`)
        as its logical checkpoint entries."""
        expert = _expert_param(name)
        if expert is None:
            return {_key(name, state): tensor}
        prefix, matrix = expert
        dim = expert_shard_dim(matrix)
        placements = [Replicate(), Replicate() if dim is None else Shard(dim)]
        return {
            _key(f"{prefix}.{self.expert_ids[index]}.{matrix}", state): DTensor.from_local(
                tensor[index], self.submesh, placements, run_check=False)
            for index in range(tensor.shape[0])
        }

    def save_state(self) -> dict[str, Any]:
        entries: dict[str, Any] = {}
        for name, param in self.model.named_parameters():
            entries.update(self._pieces(name, param.detach()))
            state = self.optimizer.state.get(param) or {}
            if not state:
                raise CheckpointError("nothing to save: the optimizer has not stepped yet "
                                      "(save after at least one step, or after --load)")
            for key in MOMENTS:
                entries.update(self._pieces(name, state[key].detach(), key))
            # one count per parameter (all experts of a layer step together): layout-free
            entries[f"optimizer.{name}.step"] = torch.as_tensor(state["step"]).detach()
        for name, buffer in self.model.named_buffers():
            if name.endswith((".expert_bias", ".tid2eid")):
                entries.update(self._pieces(name, buffer.detach()))
        return entries

    def load_targets(self) -> dict[str, Any]:
        """Fresh tensors shaped like `save_state`'s entries, for DCP to fill."""
        entries: dict[str, Any] = {}
        for name, param in self.model.named_parameters():
            entries.update(self._pieces(name, torch.empty_like(param.detach())))
            for key in MOMENTS:
                entries.update(self._pieces(name, torch.empty_like(param.detach()), key))
            entries[f"optimizer.{name}.step"] = torch.zeros((), dtype=torch.float32)
        for name, buffer in self.model.named_buffers():
            if name.endswith((".expert_bias", ".tid2eid")):
                entries.update(self._pieces(name, torch.empty_like(buffer)))
        return entries

    def gather(self, entries: dict[str, Any], name: str, like: torch.Tensor,
               state: str = "") -> torch.Tensor:
        """Reassemble one parameter-shaped tensor from loaded logical entries."""
        expert = _expert_param(name)
        if expert is None:
            return entries[_key(name, state)]
        prefix, matrix = expert
        return torch.stack([
            entries[_key(f"{prefix}.{self.expert_ids[index]}.{matrix}", state)].to_local()
            for index in range(like.shape[0])])

    def apply(self, entries: dict[str, Any]) -> None:
        """Copy loaded values into the parameters, buffers and a rebuilt AdamW state."""
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                param.copy_(self.gather(entries, name, param))
                state = {key: self.gather(entries, name, param, key).clone() for key in MOMENTS}
                state["step"] = entries[f"optimizer.{name}.step"].clone()
                self.optimizer.state[param] = state
            for name, buffer in self.model.named_buffers():
                if name.endswith((".expert_bias", ".tid2eid")):
                    buffer.copy_(self.gather(entries, name, buffer))


def save_checkpoint(path: Path, plan: Plan, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, expert_ids: Sequence[int], steps_done: int) -> None:
    """Collective: every rank writes its logical entries into one DCP folder, which rank 0 holds
    locked for the save (a second run saving there is refused) and then describes in a manifest."""
    state = LogicalState(plan, model, optimizer, expert_ids, expert_mesh(plan))
    entries = state.save_state()
    entries[PROGRESS_KEY] = torch.tensor(steps_done, dtype=torch.int64)
    entries[f"rng.rank{dist.get_rank()}"] = torch.get_rng_state()
    lock = SaveLock(path)
    refusal = lock.acquire() if dist.get_rank() == 0 else None
    if lock.held:  # a save that dies half-way leaves no manifest: the folder reads as unfinished
        (path / MANIFEST).unlink(missing_ok=True)
    try:
        _refuse_as_rank0(refusal)
        dcp.save(entries, checkpoint_id=str(path))
        problem = None
        if dist.get_rank() == 0:
            try:
                write_manifest(path, plan.raw["config"]["model"], steps_done, dist.get_world_size())
            except CheckpointRefused as exc:
                problem = str(exc)
        _refuse_as_rank0(problem)
    finally:
        lock.release()


def checkpoint_shapes(path: Path, model: dict[str, Any] | None = None) -> dict[str, tuple[int, ...] | None]:
    """Logical key → logical shape (None for non-tensor entries), from the metadata alone. With
    `model` (the plan's model section) the manifest is checked first (runtime/checkpoint_trust.py);
    the metadata is always read through the allow-list unpickler."""
    try:
        manifest = check_manifest(path, model) if model is not None else None
        metadata = safe_metadata(path)
        if manifest is not None:
            check_metadata_files(path, metadata, manifest)
    except CheckpointRefused as exc:
        raise CheckpointError(str(exc)) from None
    return {key: tuple(entry.size) if hasattr(entry, "size") else None
            for key, entry in metadata.state_dict_metadata.items()}


def fit_problems(path: Path, saved: dict[str, tuple[int, ...] | None],
                 targets: dict[str, Any]) -> list[str]:
    """Why this rank's logical tensors cannot be read from the checkpoint (empty: they can)."""
    missing = sorted(key for key in targets if key not in saved)
    problems = []
    if missing:
        shown = ", ".join(missing[:4]) + (" …" if len(missing) > 4 else "")
        problems.append(f"{path} lacks {len(missing)} tensor(s) this model needs ({shown}): "
                        "it was saved from another model")
    for key, value in targets.items():
        if key in saved and saved[key] != tuple(value.shape):
            problems.append(f"{key} is {list(saved[key] or [])} in {path} but "
                            f"{list(value.shape)} in this model: it was saved from another model")
            break
    return problems


def _refuse_as_rank0(problem: str | None) -> None:
    """Collective: rank 0's refusal (or None), raised on every rank with rank 0's words."""
    said: list[str | None] = [problem]
    dist.broadcast_object_list(said, src=0)
    if said[0]:
        raise CheckpointError(said[0])


def _agree_on_fit(problems: list[str]) -> None:
    """Collective: every rank refuses together, so none waits inside DCP for the others."""
    flag = torch.tensor([1 if problems else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if problems:
        raise CheckpointError("; ".join(problems))
    if int(flag):
        raise CheckpointError("the checkpoint was saved from another model (another rank "
                              "found tensors that do not fit)")


def load_checkpoint(path: Path, plan: Plan, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, expert_ids: Sequence[int]) -> int:
    """Collective: fill this rank's model, buffers, AdamW state and RNG from a checkpoint saved
    under any layout of the same model; returns the optimizer steps already done."""
    try:
        saved = checkpoint_shapes(path, plan.raw["config"]["model"])
        problems: list[str] = []
    except CheckpointError as exc:
        saved, problems = {}, [str(exc)]
    state = LogicalState(plan, model, optimizer, expert_ids, expert_mesh(plan))
    targets = state.load_targets()
    problems = problems or fit_problems(path, saved, targets)
    saved_ranks = sorted(int(key.removeprefix("rng.rank")) for key in saved
                         if key.startswith("rng.rank"))
    if not saved_ranks and not problems:
        problems.append(f"{path} holds no RNG state (not a moeplan runtime checkpoint)")
    _agree_on_fit(problems)
    rng_key = f"rng.rank{saved_ranks[dist.get_rank() % len(saved_ranks)]}"
    targets[rng_key] = torch.empty_like(torch.get_rng_state())
    targets[PROGRESS_KEY] = torch.zeros((), dtype=torch.int64)
    try:
        dcp.load(targets, checkpoint_id=str(path), storage_reader=SafeReader(str(path)))
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP's is a BaseException
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path} does not fit this model: {first}") from None
    state.apply(targets)
    torch.set_rng_state(targets[rng_key])
    return int(targets[PROGRESS_KEY])

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
  copy); a weight split over TP is saved whole, gathered over the TP group (`tensor_parallel_split`
  says how it was cut, Mamba-2's packed in_proj segment by segment), and each rank of any TP
  reads back its own cut; AdamW's `exp_avg` / `exp_avg_sq` sit under `optimizer.<key>.<state>`
  with the same per-expert keys, its step count under `optimizer.<parameter name>.step`; under the
  distributed optimizer they are gathered from the shards into whole parameters first
  (runtime/optimizer_state.py), so the keys are the same with or without it;
* a bf16 run also saves each fp32 main param under `optimizer.<key>.main_param` (its weights
  under their own keys are the main params cast to bf16); an fp32 run's weights are its main
  params, so a bf16 run loading an fp32 checkpoint takes them, and an fp32 run loading a bf16 one
  takes the main params: both directions lose nothing;
* `progress.steps` (optimizer steps done: the data position) and every rank's CPU RNG state
  (`rng.rank<R>`; a rank of a larger job restarts from rank R mod the saved world size).

The runtime draws its weights and data from (seed, identity) generators, so the RNG state does
not change its numbers; it is kept so that anything that does draw from torch's global generator
resumes where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from runtime.model import tensor_parallel_split
from runtime.optimizer_state import NotStepped, load_whole_state, whole_state
from runtime.plan_io import Plan
from runtime.tensor_parallel import shard_of

if TYPE_CHECKING:
    from runtime.train import RankTrainer

PROGRESS_KEY = "progress.steps"
MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's per-element state; `step` is one count
MAIN = "main_param"  # a bf16 run's fp32 main params


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

    def __init__(self, plan: Plan, trainer: RankTrainer, mesh: DeviceMesh) -> None:
        self.plan, self.trainer, self.model = plan, trainer, trainer.model
        self.tp = trainer.tp
        self.mixed = trainer.precision.mixed
        # the plan's experts, in local order: the logical key of each
        self.expert_ids = tuple(plan.expert_ownership(trainer.rank).ids)
        self.submesh = mesh["edp", "etp"]

    def _tp_split(self, name: str) -> tuple[int, tuple[int, ...] | None] | None:
        return tensor_parallel_split(self.model.spec, name) if self.tp.active else None

    def _whole_over_tp(self, name: str, local: torch.Tensor) -> torch.Tensor:
        """Collective over the TP group: a TP-split tensor reassembled whole (each rank's cut put
        back where `shard_of` took it), or `local` itself for one every TP rank holds whole."""
        split = self._tp_split(name)
        if split is None:
            return local
        dim, segments = split
        size = self.tp.size
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local.contiguous(), group=self.tp.group.pg)
        shape = list(local.shape)
        shape[dim] *= size
        whole = torch.empty(shape, dtype=local.dtype, device=local.device)
        positions = torch.arange(whole.numel()).view(shape)
        for part, values in enumerate(parts):
            index = shard_of(positions, dim, part, size, segments).reshape(-1)
            whole.view(-1)[index] = values.reshape(-1)
        return whole

    def _whole_shape(self, name: str, local: torch.Tensor) -> list[int]:
        shape = list(local.shape)
        split = self._tp_split(name)
        if split is not None:
            shape[split[0]] *= self.tp.size
        return shape

    def _pieces(self, name: str, tensor: torch.Tensor, state: str = "",
                target: bool = False) -> dict[str, Any]:
        """One parameter-shaped tensor (the parameter `name` itself, or its optimizer `state`)
        as its logical checkpoint entries; `target`: empty tensors for DCP to fill, shaped like
        what a save writes (no collective)."""
        expert = _expert_param(name)
        if expert is None:
            if target:
                return {_key(name, state): torch.empty(self._whole_shape(name, tensor),
                                                       dtype=tensor.dtype, device=tensor.device)}
            return {_key(name, state): self._whole_over_tp(name, tensor)}
        prefix, matrix = expert
        dim = expert_shard_dim(matrix)
        placements = [Replicate(), Replicate() if dim is None else Shard(dim)]
        return {
            _key(f"{prefix}.{self.expert_ids[index]}.{matrix}", state): DTensor.from_local(
                tensor[index], self.submesh, placements, run_check=False)
            for index in range(tensor.shape[0])
        }

    def save_state(self) -> dict[str, Any]:
        try:
            whole = whole_state(self.trainer)
        except NotStepped:
            raise CheckpointError("nothing to save: the optimizer has not stepped yet "
                                  "(save after at least one step, or after --load)") from None
        entries: dict[str, Any] = {}
        for name, param in self.model.named_parameters():
            entries.update(self._pieces(name, param.detach()))
            values = whole[name]
            if self.mixed:
                entries.update(self._pieces(name, values["main"], MAIN))
            for key in MOMENTS:
                entries.update(self._pieces(name, values[key], key))
            # one count per parameter (all experts of a layer step together): layout-free
            entries[f"optimizer.{name}.step"] = values["step"]
        for name, buffer in self.model.named_buffers():
            if name.endswith((".expert_bias", ".tid2eid")):
                entries.update(self._pieces(name, buffer.detach()))
        return entries

    def load_targets(self, with_main: bool) -> dict[str, Any]:
        """Fresh tensors shaped like a save's entries, for DCP to fill: the fp32 main params
        (`with_main`: the checkpoint's main_param entries, else its fp32 weights), the
        moments and step counts, the router buffers."""
        entries: dict[str, Any] = {}
        for name, param in self.model.named_parameters():
            wide = torch.empty_like(param.detach(), dtype=torch.float32)
            entries.update(self._pieces(name, wide, MAIN if with_main else "", target=True))
            for key in MOMENTS:
                entries.update(self._pieces(name, torch.empty_like(wide), key, target=True))
            entries[f"optimizer.{name}.step"] = torch.zeros((), dtype=torch.float32)
        for name, buffer in self.model.named_buffers():
            if name.endswith((".expert_bias", ".tid2eid")):
                entries.update(self._pieces(name, torch.empty_like(buffer), target=True))
        return entries

    def gather(self, entries: dict[str, Any], name: str, like: torch.Tensor,
               state: str = "") -> torch.Tensor:
        """This rank's part of one parameter-shaped tensor, from loaded logical entries."""
        expert = _expert_param(name)
        if expert is None:
            value = entries[_key(name, state)]
            split = self._tp_split(name)
            if split is None:
                return value
            return shard_of(value, split[0], self.tp.rank, self.tp.size, split[1])
        prefix, matrix = expert
        return torch.stack([
            entries[_key(f"{prefix}.{self.expert_ids[index]}.{matrix}", state)].to_local()
            for index in range(like.shape[0])])

    def apply(self, entries: dict[str, Any], with_main: bool) -> None:
        """Loaded values into the main params (and through them the weights), a rebuilt AdamW
        state and the router buffers."""
        whole = {}
        for name, param in self.model.named_parameters():
            values = {"main": self.gather(entries, name, param, MAIN if with_main else "")}
            values.update({key: self.gather(entries, name, param, key) for key in MOMENTS})
            values["step"] = entries[f"optimizer.{name}.step"]
            whole[name] = values
        load_whole_state(self.trainer, whole)
        with torch.no_grad():
            for name, buffer in self.model.named_buffers():
                if name.endswith((".expert_bias", ".tid2eid")):
                    buffer.copy_(self.gather(entries, name, buffer))


def save_checkpoint(path: Path, plan: Plan, trainer: RankTrainer, steps_done: int) -> None:
    """Collective: every rank writes its logical entries into one DCP folder, which rank 0 holds
    locked for the save (a second run saving there is refused) and then describes in a manifest."""
    state = LogicalState(plan, trainer, expert_mesh(plan))
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


def vocabulary_problems(path: Path, saved: dict[str, tuple[int, ...] | None],
                        plan: Plan) -> list[str]:
    """The padded vocabulary is part of the model: its padding rows are trained weights (the
    output layer's padded logits enter the softmax), and Megatron pads to a multiple of
    make_vocab_size_divisible_by · TP, so a TP whose padding differs cannot take the checkpoint."""
    padded = plan.padded_vocab_size
    for key in ("embedding", "head"):
        shape = saved.get(key)
        if shape and shape[0] != padded:
            return [f"{path} holds a vocabulary padded to {shape[0]} rows, this plan's "
                    f"layout.padded_vocab_size is {padded} (Megatron pads to a multiple of "
                    "model.make_vocab_size_divisible_by x layout.tp, and the padding rows are "
                    "trained): keep the saved TP, or set make_vocab_size_divisible_by so both "
                    "layouts pad alike"]
    return []


def load_checkpoint(path: Path, plan: Plan, trainer: RankTrainer) -> int:
    """Collective: fill this rank's model, buffers, AdamW state and RNG from a checkpoint saved
    under any layout of the same model (any EP, ETP, DP, PP, TP whose vocabulary padding agrees,
    with or without the distributed optimizer, at fp32 or bf16); returns the optimizer steps
    already done."""
    try:
        saved = checkpoint_shapes(path, plan.raw["config"]["model"])
        problems: list[str] = []
    except CheckpointError as exc:
        saved, problems = {}, [str(exc)]
    state = LogicalState(plan, trainer, expert_mesh(plan))
    with_main = any(key.endswith(f".{MAIN}") for key in saved)
    targets = state.load_targets(with_main)
    problems = problems or vocabulary_problems(path, saved, plan) or fit_problems(path, saved,
                                                                                   targets)
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
    state.apply(targets, with_main)
    torch.set_rng_state(targets[rng_key])
    return int(targets[PROGRESS_KEY])

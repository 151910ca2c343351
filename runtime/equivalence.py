"""Prove a distributed run equals the single-process reference, tensor by tensor and rank by rank.

Rank 0 trains the reference (`runtime.reference`) on the whole global batch and broadcasts it;
every rank then compares what it holds against its slice — its DP replica's samples, its CP
positions, its experts and ETP shard (`MoELayer.local_view`), its TP shard of the dense weights
(`tensor_parallel_split`) — and every rank gets the verdicts:

* the loss of every microbatch (mean token loss over the rank's tokens), and of every MTP depth
  (masked mean over the rank's valid shifted positions);
* every MoE layer's output on every microbatch;
* every parameter gradient after the gradient reduction, at every step;
* every parameter and expert bias after the last optimizer step.

The error of a tensor is max|actual − expected| / max|expected| (0 when both are zero); for a TP
shard of a dense weight the denominator is the whole logical tensor's max (`split_over_tp`).

Tolerances (`tolerance_for`): fp32 1e-5, where the layouts differ only in the order of fp32 sums.
Under bf16 the reference is the same model at the same precision (bf16 weights and compute, fp32
main grads and main params, runtime/precision.py), but the two runs round at different points:
a TP rank rounds its partial GEMM output to bf16 before the sum over TP, an SP or CP rank its
share of the rows, the reference each whole product once. Each such rounding moves a value by up
to half a bf16 ulp, u = 2^-8 of it, and a layer's forward and backward chain a few of them, so a
gradient element can differ by a small multiple of u of its tensor's largest value; the bf16
tolerance is 16·u = 2^-4. Routing is discrete: one rounding can flip a near-tied top-k choice,
which makes a different model rather than a rounding error, so a bf16 check runs with forced
balanced routing (the choices fixed, the weights still the scores': `__main__` refuses it
otherwise).
"""

from __future__ import annotations

import io
import math
import pickle
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from runtime.model import ffn_parameter, tensor_parallel_split
from runtime.plan_io import Plan
from runtime.precision import Precision
from runtime.reference import ReferenceModel, ReferenceResult
from runtime.train import RankResult, RankTrainer, RunOptions

TOLERANCE = 1e-5
BF16_UNIT_ROUNDOFF = 2.0 ** -8
BF16_TOLERANCE = 16 * BF16_UNIT_ROUNDOFF


def tolerance_for(precision: Precision) -> float:
    """The comparison's relative tolerance at the run's precision (see the module docstring)."""
    return TOLERANCE if not precision.mixed else BF16_TOLERANCE


# dtypes numpy holds exactly (fp32 runs and main grads; ids, counts and indices are int64); bf16,
# which numpy lacks, travels as its int16 bits
_ARRAY_DTYPES = frozenset({torch.float32, torch.float64, torch.int64, torch.int32, torch.bool})


def _tensor_of(array: Any) -> torch.Tensor:
    return torch.from_numpy(array)


def _bf16_of(array: Any) -> torch.Tensor:
    return torch.from_numpy(array).view(torch.bfloat16)


class _ArrayPickler(pickle.Pickler):
    """Pickles CPU tensors as numpy arrays (their raw bytes). torch's own reduction writes every
    tensor through torch.save, and on the small models a reference check runs on, saving and
    loading the thousands of captured tensors cost more CPU than training the reference."""

    def reducer_override(self, obj: Any) -> Any:
        if (isinstance(obj, torch.Tensor) and obj.dtype in _ARRAY_DTYPES
                and obj.device.type == "cpu" and obj.layout == torch.strided):
            return _tensor_of, (obj.detach().numpy(),)
        if (isinstance(obj, torch.Tensor) and obj.dtype == torch.bfloat16
                and obj.device.type == "cpu" and obj.layout == torch.strided):
            return _bf16_of, (obj.detach().contiguous().view(torch.int16).numpy(),)  # its bits
        return NotImplemented


def _packed(value: Any) -> bytes:
    """`value` as bytes for an object collective (which then pickles one bytes object)."""
    buffer = io.BytesIO()
    _ArrayPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def _unpacked(data: bytes) -> Any:
    return pickle.loads(data)  # noqa: S301 - bytes this job's own ranks packed


def relative_error(actual: torch.Tensor, expected: torch.Tensor,
                   whole: torch.Tensor | None = None) -> float:
    """max|actual − expected| over max|whole| (the logical tensor `expected` is a TP shard of;
    by default `expected` itself)."""
    actual, expected = actual.double(), expected.double()
    whole = expected if whole is None else whole.double()
    difference = float((actual - expected).abs().max()) if expected.numel() else 0.0
    scale = float(whole.abs().max()) if whole.numel() else 0.0
    if scale == 0.0:
        return difference
    return difference / scale


@dataclass
class Comparison:
    """Every tensor one rank checked: the worst error and the mismatches beyond tolerance."""

    rank: int
    tolerance: float
    checked: int = 0
    max_rel_error: float = 0.0
    mismatches: list[dict[str, Any]] = field(default_factory=list)

    def check(self, name: str, actual: torch.Tensor, expected: torch.Tensor,
              whole: torch.Tensor | None = None) -> None:
        self.checked += 1
        if actual.shape != expected.shape:
            self.mismatches.append({"tensor": name, "rank": self.rank, "rel_error": None,
                                    "detail": f"shape {tuple(actual.shape)} vs reference "
                                              f"{tuple(expected.shape)}"})
            return
        error = relative_error(actual, expected, whole)
        if error != error:  # NaN
            error = float("inf")
        self.max_rel_error = max(self.max_rel_error, error)
        if error > self.tolerance:
            self.mismatches.append({"tensor": name, "rank": self.rank, "rel_error": error})


def split_over_tp(trainer: RankTrainer, name: str) -> bool:
    """A dense weight whose TP shard this rank holds: it is judged against the scale of the whole
    logical tensor, as a TP 1 run judges the same elements (a shard of a few per-head values,
    e.g. Mamba's dt_bias, can be far smaller than its tensor's largest)."""
    return trainer.tp.active and tensor_parallel_split(trainer.model.spec, name) is not None


def rank_view(trainer: RankTrainer, name: str, full: torch.Tensor) -> torch.Tensor:
    """This rank's part of a reference tensor: MoE blocks slice experts, TP-split dense weights
    keep this TP rank's shard, the rest is whole."""
    spec = trainer.model.spec
    split = tensor_parallel_split(spec, name) if trainer.tp.active else None
    if split is not None:
        return trainer.tp.shard(full, *split)
    found = ffn_parameter(name, spec.num_layers)
    if found is not None:
        layer = trainer.model.layer(found[0])
        if layer.is_moe:
            return layer.ffn.local_view(found[1], full)
    return full


def compare_with_reference(trainer: RankTrainer, result: RankResult, reference: ReferenceResult,
                           tolerance: float = TOLERANCE) -> Comparison:
    """Check everything this rank captured against its slice of the reference."""
    comparison = Comparison(rank=result.rank, tolerance=tolerance)
    positions = reference.slices[result.cp_rank].index()
    # MoE layers see this TP rank's share of the CP rank's rows under sequence parallelism
    moe_positions = positions[trainer.tp.sequence_rows(len(positions))]
    for step, (capture, expected) in enumerate(zip(result.captures, reference.steps, strict=True)):
        for microbatch, loss in enumerate(capture.losses):
            key = (result.dp_rank, microbatch)
            reference_loss = expected.token_losses[key].index_select(1, positions).mean()
            comparison.check(f"step {step} microbatch {microbatch} loss",
                             torch.tensor(loss), reference_loss)
            depth_losses = capture.mtp_losses[microbatch] if capture.mtp_losses else []
            for depth, value in enumerate(depth_losses):
                masked, mask = expected.mtp_losses[key][depth]
                count = max(float(mask.index_select(1, positions).sum()), 1.0)
                comparison.check(f"step {step} microbatch {microbatch} MTP depth {depth} loss",
                                 torch.tensor(value),
                                 masked.index_select(1, positions).sum() / count)
            for layer, output in capture.moe_outputs[microbatch].items():
                comparison.check(
                    f"step {step} microbatch {microbatch} layer {layer} MoE output", output,
                    expected.moe_outputs[key][layer].index_select(0, moe_positions))
        for name, grad in capture.grads.items():
            full = expected.grads[name]
            comparison.check(f"step {step} gradient {name}", grad, rank_view(trainer, name, full),
                             full if split_over_tp(trainer, name) else None)
    for name, value in result.final_state.items():
        full = reference.final_state[name]
        comparison.check(f"after step {len(result.captures) - 1} weight {name}", value,
                         rank_view(trainer, name, full),
                         full if split_over_tp(trainer, name) else None)
    return comparison


def shard_index(trainer: RankTrainer, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Where each of this rank's parameter elements sits in the full logical tensor (flat)."""
    index = {}
    held = {name for name, _ in trainer.model.named_parameters()}  # PP: this stage's only
    for name, shape in shapes.items():
        if name not in held:
            continue
        positions = torch.arange(math.prod(shape)).view(shape)
        index[name] = rank_view(trainer, name, positions).reshape(-1)
    return index


def assemble_gradients(shapes: dict[str, tuple[int, ...]], shares: list[Any],
                       steps: int) -> list[dict[str, torch.Tensor]]:
    """Full logical gradients of every step from the ranks' reduced shards. Replicas (DP, EDP,
    CP) hold identical reduced values, so which copy lands last does not matter."""
    assembled = []
    for step in range(steps):
        full = {name: torch.zeros(shape) for name, shape in shapes.items()}
        for index, grads in shares:
            for name, positions in index.items():
                full[name].view(-1)[positions] = grads[step][name].reshape(-1).float()
        assembled.append(full)
    return assembled


def check_reference(plan: Plan, trainer: RankTrainer, result: RankResult, options: RunOptions,
                    tolerance: float | None = None) -> dict[str, Any]:
    """Collective over the world: the report's `reference` block, identical on every rank.

    The reference records its own gradients for the comparison, then lets AdamW step on the
    ranks' reduced gradients (assembled into full tensors). AdamW divides each element by
    sqrt(v) + eps, so an element whose gradient is near eps turns fp32 rounding (~1e-7 of the
    largest gradient) into a weight difference of up to lr·noise/eps — about 1e-4 relative after
    one step at the default eps = 1e-8 — which is numerics, not a bug. Stepping on the verified
    gradients keeps both trajectories on the same weights, so every later loss, output and
    gradient is still compared at fp32 precision, and the final weights check the optimizer
    (hyper-parameters, weight-decay groups, shards) and the expert-bias updates.
    """
    tolerance = tolerance_for(trainer.precision) if tolerance is None else tolerance
    rank, world = dist.get_rank(), dist.get_world_size()
    reference = ReferenceModel(plan, trainer.seed, options.balanced) if rank == 0 else None
    shapes: list[Any] = [reference.parameter_shapes() if reference is not None else None]
    dist.broadcast_object_list(shapes, src=0)
    share = _packed((shard_index(trainer, shapes[0]),
                     [capture.grads for capture in result.captures]))
    shares: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(share, shares, dst=0)
    payload: list[Any] = [None]
    if reference is not None and shares is not None:
        grads = assemble_gradients(shapes[0], [_unpacked(data) for data in shares], options.steps)
        payload = [_packed(reference.run(options.steps, optimizer_grads=grads))]
    dist.broadcast_object_list(payload, src=0)
    comparison = compare_with_reference(trainer, result, _unpacked(payload[0]), tolerance)
    verdicts: list[Any] = [None] * world
    dist.all_gather_object(verdicts, comparison)
    mismatches = [m for verdict in verdicts for m in verdict.mismatches]
    return {
        "checked": True,
        "ok": not mismatches,
        "tolerance": tolerance,
        "max_rel_error": max(verdict.max_rel_error for verdict in verdicts),
        "tensors_checked": sum(verdict.checked for verdict in verdicts),
        "mismatches": mismatches,
    }


def describe_mismatches(block: dict[str, Any], limit: int = 20) -> list[str]:
    """One line per mismatch (worst first), naming the tensor and the rank."""
    ordered = sorted(block["mismatches"], key=lambda m: -(m["rel_error"] or float("inf")))
    lines = []
    for mismatch in ordered[:limit]:
        error = mismatch["rel_error"]
        detail = mismatch.get("detail") or f"relative error {error:.3e}"
        lines.append(f"rank {mismatch['rank']}: {mismatch['tensor']}: {detail} "
                     f"(tolerance {block['tolerance']:g})")
    if len(ordered) > limit:
        lines.append(f"... and {len(ordered) - limit} more mismatches")
    return lines

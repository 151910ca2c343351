"""GTP: generalized tensor parallelism with weight rematerialization (GTP/EGTP) and its sequence shards."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.hints import divisor_hint
from planner.rules.sources import GTP_SEQUENCE_SHARDS, MAIN_DDP, MAIN_PARALLEL_STATE, MAIN_VALIDATE_ARGS

_SHARDED = "parallel: {gtp: 4, gtp_remat_num_sequence_shards: 2}"


def _degrees(f: Facts) -> str:
    return f"gtp {f.par.gtp} / egtp {f.par.egtp}"


@rule(
    "GTP001", "error", "GTP sequence shards divide the GTP axis",
    source=GTP_SEQUENCE_SHARDS,
    why="""Sequence sharding runs inside the GTP axis R: q_s shards of the sequence, R/q_s batch
    replicas (CP_runtime = C·q_s, D_batch = D_w·R/q_s). q_s must divide R.""",
    bad="parallel: {gtp: 4, gtp_remat_num_sequence_shards: 3}",
    good=_SHARDED,
)
def sequence_shards_divide_gtp(f: Facts) -> Iterator[Violation]:
    shards, gtp = f.par.gtp_remat_num_sequence_shards, f.par.gtp
    if shards is not None and gtp % shards:
        yield Violation("parallel.gtp_remat_num_sequence_shards",
                        f"gtp_remat_num_sequence_shards {shards} does not divide gtp {gtp}",
                        f"choose a divisor of {gtp}{divisor_hint(gtp, shards)}")


@rule(
    "GTP002", "error", "GTP sequence sharding needs Megatron DDP (no FSDP)",
    source=GTP_SEQUENCE_SHARDS,
    why="""Sequence-sharded GTP finishes its gradient reduction inside Megatron's own DDP buffers;
    Megatron-FSDP and torch FSDP2 shard parameters differently and are excluded.""",
    bad=_SHARDED + "\ntraining: {use_megatron_fsdp: true}",
    good=_SHARDED + "\ntraining: {use_megatron_fsdp: false}",
)
def sequence_shards_need_ddp(f: Facts) -> Iterator[Violation]:
    if f.sequence_shards > 1 and f.fsdp:
        yield Violation(f"training.{f.fsdp}",
                        f"gtp_remat_num_sequence_shards {f.sequence_shards} with {f.fsdp}",
                        f"turn {f.fsdp} off to use Megatron DDP, or drop the sequence shards")


@rule(
    "GTP003", "error", "GTP sequence sharding needs torch_dist checkpoints",
    source=GTP_SEQUENCE_SHARDS,
    why="""Sequence-sharded GTP state is saved only through distributed (torch_dist)
    checkpoints.""",
    bad=_SHARDED + "\ntraining: {ckpt_format: torch}",
    good=_SHARDED + "\ntraining: {ckpt_format: torch_dist}",
)
def sequence_shards_need_torch_dist(f: Facts) -> Iterator[Violation]:
    if f.sequence_shards > 1 and f.train.ckpt_format != "torch_dist":
        yield Violation("training.ckpt_format",
                        f"gtp_remat_num_sequence_shards {f.sequence_shards} with ckpt_format "
                        f"{f.train.ckpt_format}", "set training.ckpt_format: torch_dist")


@rule(
    "GTP004", "error", "GTP sequence sharding excludes dynamic CP",
    source=GTP_SEQUENCE_SHARDS,
    why="""Sequence shards already enlarge the runtime CP to C·q_s; dynamic (or hybrid) CP would
    regroup those ranks per batch.""",
    bad="parallel: {gtp: 4, gtp_remat_num_sequence_shards: 2, dynamic_context_parallel: true}",
    good="parallel: {gtp: 4, gtp_remat_num_sequence_shards: 2, dynamic_context_parallel: false}",
)
def sequence_shards_static_cp(f: Facts) -> Iterator[Violation]:
    if f.sequence_shards > 1 and f.dynamic_cp:
        yield Violation(f"parallel.{f.dynamic_cp}",
                        f"gtp_remat_num_sequence_shards {f.sequence_shards} with {f.dynamic_cp}",
                        f"set parallel.{f.dynamic_cp}: false")


@rule(
    "GTP005", "error", "average-in-collective is forbidden with GTP",
    source=MAIN_VALIDATE_ARGS,
    why="""With GTP the gradient mean is finished over the GTP axis separately; an AVG collective
    over the replicate group would divide a second time.""",
    bad="""
    parallel: {gtp: 4}
    training: {average_in_collective: true}
    """,
    good="""
    parallel: {gtp: 4}
    training: {average_in_collective: false}
    """,
)
def gtp_without_average_in_collective(f: Facts) -> Iterator[Violation]:
    if f.gtp_active and f.train.average_in_collective:
        yield Violation("training.average_in_collective",
                        f"average_in_collective with {_degrees(f)}",
                        "set training.average_in_collective: false")


@rule(
    "GTP006", "warning", "GTP != EGTP needs the R_e/R expert-gradient correction",
    source=MAIN_DDP,
    why="""With GTP != EGTP the expert gradients must be pre-scaled by EGTP/GTP. Megatron
    snapshots before PR #7165 miss this factor and silently train experts with gradients off by
    GTP/EGTP. moeplan models the fixed behaviour.""",
    bad="parallel: {gtp: 4}",
    good="parallel: {gtp: 4, egtp: 4, ep: 1}",
)
def gtp_egtp_correction(f: Facts) -> Iterator[Violation]:
    gtp, egtp = f.par.gtp, f.par.egtp
    if gtp != egtp:
        yield Violation("parallel.egtp",
                        f"gtp {gtp} != egtp {egtp}: expert gradients need the factor egtp/gtp = "
                        f"{egtp}/{gtp}; without it (Megatron before PR #7165) every expert update is off by "
                        f"gtp/egtp = {gtp}/{egtp}",
                        "run a Megatron that has PR #7165, the expert gradient correction, or use egtp = gtp")


@rule(
    "GTP007", "error", "GTP needs torch or torch_dist checkpoints",
    source=MAIN_VALIDATE_ARGS,
    why="GTP/EGTP weight shards can only be saved through the torch or torch_dist formats.",
    bad="""
    parallel: {gtp: 4}
    training: {ckpt_format: torch_dcp}
    """,
    good="""
    parallel: {gtp: 4}
    training: {ckpt_format: torch}
    """,
)
def gtp_checkpoint_format(f: Facts) -> Iterator[Violation]:
    if f.sequence_shards > 1:
        return  # GTP003 asks for torch_dist, the stricter form of this rule
    if f.gtp_active and f.train.ckpt_format not in ("torch", "torch_dist"):
        yield Violation("training.ckpt_format",
                        f"ckpt_format {f.train.ckpt_format} with {_degrees(f)}",
                        "set training.ckpt_format: torch_dist or torch")


@rule(
    "GTP008", "error", "GTP needs a single distributed-optimizer instance",
    source=MAIN_PARALLEL_STATE,
    why="""Megatron does not yet support splitting the distributed optimizer into several
    instances when GTP or EGTP is active.""",
    bad="""
    parallel: {gtp: 4}
    training: {use_distributed_optimizer: true, num_distributed_optimizer_instances: 2}
    """,
    good="""
    parallel: {gtp: 4}
    training: {use_distributed_optimizer: true, num_distributed_optimizer_instances: 1}
    """,
)
def gtp_single_optimizer_instance(f: Facts) -> Iterator[Violation]:
    instances = f.train.num_distributed_optimizer_instances
    if f.gtp_active and instances > 1:
        yield Violation("training.num_distributed_optimizer_instances",
                        f"num_distributed_optimizer_instances {instances} with {_degrees(f)}",
                        "set num_distributed_optimizer_instances: 1")


# --- the packing schedulers sequence-sharded GTP excludes.
DYNAMIC_CP_SCHEDULER = ("Megatron-LM dev@d48bd6be megatron/core/datasets/data_schedule.py "
                        "DefaultDynamicCPScheduler.__init__; " + GTP_SEQUENCE_SHARDS)


@rule(
    "GTP009", "error", "GTP sequence sharding excludes the default_dynamic_cp packing scheduler",
    source=DYNAMIC_CP_SCHEDULER,
    why="""The default_dynamic_cp scheduler packs each batch for a CP size it picks per batch over
    the dp·cp ranks, while sequence shards fix the runtime context split at C·q_s ranks (the GTP
    peers of one sample). dp_balanced keeps the CP size and balances over the D_batch = D_w·R/q_s
    batch replicas, so it stays allowed.""",
    bad=_SHARDED + "\ntraining: {sequence_packing_scheduler: default_dynamic_cp}",
    good=_SHARDED + "\ntraining: {sequence_packing_scheduler: dp_balanced}",
)
def sequence_shards_static_packing(f: Facts) -> Iterator[Violation]:
    scheduler = f.train.sequence_packing_scheduler
    if f.sequence_shards > 1 and scheduler == "default_dynamic_cp":
        yield Violation("training.sequence_packing_scheduler",
                        f"gtp_remat_num_sequence_shards {f.sequence_shards} with the {scheduler} "
                        "packing scheduler (a CP size per batch)",
                        "use sequence_packing_scheduler: dp_balanced, or drop the sequence shards")


RULES = (
    sequence_shards_divide_gtp, sequence_shards_need_ddp, sequence_shards_need_torch_dist,
    sequence_shards_static_cp, gtp_without_average_in_collective, gtp_egtp_correction,
    gtp_checkpoint_format, gtp_single_optimizer_instance, sequence_shards_static_packing,
)

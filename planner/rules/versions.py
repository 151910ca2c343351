"""VER: which Megatron-LM the job runs on (megatron.version) and what that version does with the
config: refusals that changed between versions and known-bad ranges, one record per bug in one
table (`RECORDS`); a new bug is one record.

Each record names the config it hits (a predicate on the config, returning the field to point at
and what of the config triggers it), the range of versions that carry it (from `introduced`, the
first row of planner/config/megatron_releases.py that has it, None for every row before the fix, up
to `fixed`, the first row with the fix, None when no version in the table has one), the symptom, the
fixing change with its public source, and the way out. The ranges were read off the tagged sources
of github.com/NVIDIA/Megatron-LM, the fixing change's code looked for in every row.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from planner.config.megatron_branch import branch_features
from planner.config.megatron_releases import known_spellings, release
from planner.layout.pipeline import SplitError
from planner.rules.base import Violation, rule
from planner.rules.facts import Facts

PR = "https://github.com/NVIDIA/Megatron-LM/pull/"
AUX_LOSS_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss")
# DeepEP's HybridEP sizes its RDMA send queue at 3 work requests per token plus one, and the
# InfiniBand queue-pair depth is a 16-bit count (deepseek-ai/DeepEP csrc/hybrid_ep/buffer/internode.cu
# setup_qp_init_attr asserts tx_depth < 65536).
HYBRID_EP_QP_MAX_DEPTH = 65535
HYBRID_EP_DEPTH_PER_TOKEN = 3

Hit = tuple[str, str] | None  # (the field to point at, what of the config triggers it), or no hit


@dataclass(frozen=True)
class Record:
    """One version-dependent behaviour: `refused` (Megatron stops at start-up in that range: rule
    VER003, an error) or `bug` (the job starts and crashes or mis-trains: rule VER002, a warning)."""

    key: str
    kind: Literal["bug", "refused"]
    hits: Callable[[Facts], Hit]
    introduced: str | None  # first release row carrying it; None: every row before `fixed`
    fixed: str | None  # first release row without it; None: no row in the table
    symptom: str
    fix: str  # the change that ends the range, with its public source
    way_out: str  # what the user can do on an affected version

    def carried_by(self, name: str) -> bool:
        """Whether release `name` (a row of the release table) is in this record's range."""
        at = release(name)
        if self.key in at.fixes:  # a main commit that holds the fix ahead of the next release
            return False
        after_start = self.introduced is None or not at.before(self.introduced)
        return after_start and (self.fixed is None or at.before(self.fixed))


def _packed(f: Facts) -> bool:
    """THD input: packed sequences (qkv_format thd) or a sequence-packing scheduler."""
    return (f.train.qkv_format == "thd" or f.train.sequence_packing_scheduler is not None
            or bool(f.train.packed_lengths))


def _mtp_with_cp(f: Facts) -> Hit:
    if f.model.mtp_num_layers and f.par.cp > 1:
        return "parallel.cp", f"model.mtp_num_layers {f.model.mtp_num_layers} with cp {f.par.cp}"
    return None


def _te_cross_entropy(f: Facts) -> Hit:
    if f.train.cross_entropy_loss_fusion and f.train.cross_entropy_fusion_impl == "te":
        return "training.cross_entropy_fusion_impl", "cross_entropy_loss_fusion with impl te"
    return None


def _mtp_per_token(f: Facts) -> Hit:
    if f.model.mtp_num_layers and f.train.calculate_per_token_loss:
        return ("training.calculate_per_token_loss",
                f"model.mtp_num_layers {f.model.mtp_num_layers} with calculate_per_token_loss")
    return None


def _aux_loss_on(f: Facts) -> bool:
    return f.moe.moe_aux_loss_coeff > 0 and f.moe.moe_router_load_balancing_type in AUX_LOSS_TYPES


def _aux_loss_tp_cp(f: Facts) -> Hit:
    size = f.par.tp * f.par.cp
    if _aux_loss_on(f) and f.train.calculate_per_token_loss and size > 1:
        return ("training.calculate_per_token_loss", f"{f.moe.moe_router_load_balancing_type} with "
                f"calculate_per_token_loss and tp x cp = {size}")
    return None


def _aux_loss_cp(f: Facts) -> Hit:
    if _aux_loss_on(f) and not f.train.calculate_per_token_loss and f.par.cp > 1:
        return "parallel.cp", f"{f.moe.moe_router_load_balancing_type} with cp {f.par.cp}"
    return None


def _mtp_recompute_thd(f: Facts) -> Hit:
    if f.model.mtp_num_layers and f.ovl.recompute_granularity == "full" and _packed(f):
        return ("overlap.recompute_granularity",
                f"model.mtp_num_layers {f.model.mtp_num_layers}, full recompute and packed (THD) input")
    return None


def _uniform_remainder(f: Facts) -> Hit:
    ovl = f.ovl
    if ovl.recompute_granularity != "full" or ovl.recompute_method != "uniform" \
            or not ovl.recompute_num_layers:
        return None
    step, split = ovl.recompute_num_layers, f.split_result
    if isinstance(split, SplitError):  # the split's own rule reports it
        return None
    uneven = sorted({len(c.layers) for c in split.chunks if len(c.layers) % step})
    if uneven:
        return ("overlap.recompute_num_layers", f"uniform recompute of {step} layers over a model "
                f"chunk of {', '.join(map(str, uneven))} layers")
    return None


def _hybridep_qp_depth(f: Facts) -> Hit:
    group = f.degrees.tp_ep_size
    domain = f.cluster.nvlink_domain or f.cluster.gpus_per_node or 1
    tokens = f.train.seq_length * f.train.micro_batch_size // (f.par.tp * f.par.cp)
    depth = HYBRID_EP_DEPTH_PER_TOKEN * tokens + 1
    if f.flex_backend == "hybridep" and group > domain and depth > HYBRID_EP_QP_MAX_DEPTH:
        return ("training.micro_batch_size", f"hybridep over {group} expert ranks (NVLink domain "
                f"{domain}) with {tokens} tokens per rank: queue-pair depth {depth} > "
                f"{HYBRID_EP_QP_MAX_DEPTH}")
    return None


RECORDS: tuple[Record, ...] = (
    Record("mtp-cp-refused", "refused", _mtp_with_cp, None, "25.09-alpha",
           "validate_args asserts 'Multi-Token Prediction (MTP) is not supported with Context "
           "Parallelism' (megatron/training/arguments.py validate_args at core_v0.13.1)",
           "MTP with CP arrived with Megatron-LM MR !3330 ('support CP and recompute for MTP'), in "
           "25.09-alpha and core_r0.14.0",
           "run cp 1, or move to core_r0.14.0 or later"),
    Record("te-cross-entropy", "bug", _te_cross_entropy, None, "core_v0.18.2",
           "Transformer Engine's fused cross entropy keeps its gradient in the BF16 logits buffer "
           "and training is unstable (the reason Megatron disabled it)",
           f"Megatron-LM refuses it from PR #5115 ({PR}5115, main ff641441; the guard moved to "
           f"validate_args in #5162), backported to core_v0.18.2; the TE fix is "
           "NVIDIA/TransformerEngine PR #3193",
           "set training.cross_entropy_fusion_impl: native"),
    Record("mtp-per-token-loss", "bug", _mtp_per_token, None, "core_r0.17.0",
           "the MTP loss gradient is scaled by the main loss's token count, not the rolled mask's, "
           "so MTP is under-weighted (issue #2417)",
           f"PR #3159 ({PR}3159, main 41fe9c61, dev a22c40e8)",
           "accept the small under-weighting, or move to core_r0.17.0 or later"),
    Record("mtp-cp-nan", "bug", _mtp_with_cp, "25.09-alpha", "core_r0.17.0",
           "a CP rank whose rolled MTP loss mask is empty divides 0 by 0: the loss and every "
           "gradient turn NaN at the first iteration",
           f"PR #3396 ({PR}3396, main 16e27495, dev d7500d4d)",
           "run cp 1 or mtp_num_layers 0, or move to core_r0.17.0 or later"),
    Record("aux-loss-tp-cp-scale", "bug", _aux_loss_tp_cp, None, "core_r0.19.0",
           "with calculate_per_token_loss the router's aux-loss gradient is scaled by the local "
           "token count only, so it shrinks by TP x CP: load balancing is weaker than "
           "moe_aux_loss_coeff says and changes with the layout",
           f"PR #5047 ({PR}5047, main 9ef8a2a4; dev carries it, reworked in #4359)",
           "scale moe_aux_loss_coeff by tp x cp, or move to core_r0.19.0 or later"),
    Record("aux-loss-cp-scale", "bug", _aux_loss_cp, None, "core_r0.16.0",
           "without calculate_per_token_loss the aux-loss gradient is divided by CP (the "
           "microbatch count it is scaled by grows with CP): load balancing is CP times weaker",
           f"PR #2237 ({PR}2237, main f6e0d425; dev #2217, ca4c03ea)",
           "scale moe_aux_loss_coeff by cp, or move to core_r0.16.0 or later"),
    Record("mtp-recompute-thd", "bug", _mtp_recompute_thd, "25.09-alpha", "core_r0.18.0",
           "MTP's checkpointed forward passes PackedSeqParams to save_for_backward: TypeError at "
           "the first step (and FP8 recompute can drop MTP gradients)",
           f"PR #4593 ({PR}4593, main 2b77d32b; dev #4592, 09894867)",
           "use selective recompute, or move to core_r0.18.0 or later"),
    Record("uniform-recompute-remainder", "bug", _uniform_remainder, None, "core_r0.17.0",
           "uniform recompute indexes past the chunk's last layer when recompute_num_layers does "
           "not divide it: IndexError at the first step (issues #1807, #2294)",
           f"PR #3562 ({PR}3562, main 9054192b)",
           "pick recompute_num_layers dividing every chunk's layer count, or move to core_r0.17.0 "
           "or later"),
    Record("hybridep-qp-depth", "bug", _hybridep_qp_depth, "core_r0.16.0", None,
           "HybridEP sizes its InfiniBand send queue for every token of the microbatch: past "
           "65,535 work requests DeepEP's assertion aborts every rank (issue #3999)",
           "no Megatron-LM row fixes it (its guard, PR #4094, was reverted in #4718, the next one "
           "removed in #4846); DeepEP refuses instead of aborting from deepseek-ai/DeepEP PR #638",
           "lower micro_batch_size or seq_length, or raise tp or cp, until 3 x tokens per rank + 1 "
           "<= 65,535, or keep the EP group inside one NVLink domain"),
)


# The rows whose parser and TransformerConfig have each branch-specific feature
# (planner/config/megatron_branch.py), read off megatron/training/arguments.py,
# megatron/core/transformer/transformer_config.py and megatron/core/model_parallel_config.py at
# every row of the release table: on any other row Megatron's parser refuses the argument.
FEATURE_ROWS: dict[str, tuple[str, ...]] = {
    "model.attention_variant": ("dev",),  # dsv4_hybrid
    "model.moe_n_hash_layers": ("dev",),
    "model.enable_hyper_connections": ("26.04-alpha", "dev"),
    "parallel.cp_partition_mode": ("dev",),
    "parallel.dynamic_context_parallel": ("26.04-alpha", "dev"),
    "training.sequence_packing_scheduler": ("26.04-alpha", "dev"),
    "moe.moe_flex_dispatcher_backend": ("dev",),  # deepepv2
    "parallel.gtp": ("core_r0.19.0", "main"),  # --tensor-parallel-num-weight-shards
    "parallel.egtp": ("core_r0.19.0", "main"),
    "moe.moe_ncclep_zero_copy": ("core_r0.19.0", "main"),
}


def _absent_features(f: Facts) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    """(field, feature, the rows that have it) for each branch feature the named version lacks; only
    where megatron.version is written (unset, moeplan picks the branch itself: rule MOE003)."""
    if "version" not in f.cfg.megatron.model_fields_set or f.release is None:
        return
    dev, main = branch_features(f.cfg)
    for path, what in (*dev, *main):
        rows = FEATURE_ROWS.get(path)
        if rows is not None and f.release.name not in rows:
            yield path, what, rows


def _hits(f: Facts, kind: str) -> Iterator[tuple[Record, str, str]]:
    at = f.judged_release
    for record in RECORDS:
        if record.kind == kind and record.carried_by(at.name):
            hit = record.hits(f)
            if hit is not None:
                yield record, *hit


@rule(
    "VER001", "error", "megatron.version is a version moeplan can place",
    source="planner/config/megatron_releases.py RELEASES (tags and branches of NVIDIA/Megatron-LM)",
    why="""The version selects the rules whose behaviour changed between Megatron-LM versions and
    the known-bad ranges. A version moeplan cannot place would be judged as dev@d48bd6be without
    a word, and a fix or refusal it lacks would go unsaid: name a release, a NeMo container or a
    commit of the table instead.""",
    bad="megatron: {version: core_r0.99.0}",
    good="megatron: {version: core_r0.16.0}",
)
def version_known(f: Facts) -> Iterator[Violation]:
    if f.release is None:
        version = str(f.cfg.megatron.version)
        commit = re.fullmatch(r"[0-9a-fA-F]{7,40}", version.strip()) is not None
        fix = (f"a commit between the table's rows: name the release before it (`git describe --tags "
               f"{version}` in a Megatron-LM clone) to keep its known bugs, or the first one shipping it "
               f"(`git tag --contains {version}`); the rows are {known_spellings()}" if commit else
               f"name one of {known_spellings()} (a release also as 0.16.0 or megatron-core==0.16.0, a "
               "container as 25.09 or nemo:25.09, or its commit)")
        yield Violation("megatron.version", f"Megatron-LM version {version!r} is not one moeplan can place; "
                        "the version-dependent rules followed dev@d48bd6be", fix)


@rule(
    "VER002", "warning", "the config avoids the known bugs of its Megatron-LM version",
    source="planner/rules/versions.py RECORDS (each record names its fixing Megatron-LM PR)",
    why="""A layout can be legal and still crash or mis-train on the Megatron-LM it runs on: MTP's
    per-token loss, MTP with CP, the router aux loss under TP, CP and per-token loss, MTP recompute
    on packed input, uniform recompute over an uneven chunk, HybridEP past the InfiniBand queue
    depth. Each finding names the version range, the symptom and the fixing change.""",
    bad="""
    megatron: {version: core_r0.16.0}
    model: {mtp_num_layers: 1}
    parallel: {world_size: 16, cp: 2}
    """,
    good="""
    megatron: {version: core_r0.17.0}
    model: {mtp_num_layers: 1}
    parallel: {world_size: 16, cp: 2}
    """,
)
def known_bugs(f: Facts) -> Iterator[Violation]:
    at = f.judged_release
    for record, path, what in _hits(f, "bug"):
        fixed = f"fixed by {record.fix}" if record.fixed is None else \
            f"fixed from {record.fixed} by {record.fix}"
        yield Violation(path, f"{what} on Megatron-LM {at.shown()} [{record.key}]: {record.symptom}; "
                        f"{fixed}", record.way_out)


@rule(
    "VER003", "error", "the config is one its Megatron-LM version accepts",
    source="planner/rules/versions.py RECORDS (core_v0.13.1 megatron/training/arguments.py validate_args)",
    why="""Megatron refuses some combinations at start-up on older versions that dev accepts (MTP
    with context parallelism until core_r0.14.0), and a version without a branch's feature refuses
    its argument (DeepSeek-V4 attention, hash routing, deepepv2 only on dev; mHC, dynamic CP and
    the packing scheduler on dev and 26.04-alpha; GTP and NCCL EP zero-copy on core_r0.19.0 and
    main): on such a version the job does not start.""",
    bad="""
    megatron: {version: core_r0.13.0}
    model: {mtp_num_layers: 1}
    parallel: {world_size: 16, cp: 2}
    """,
    good="""
    megatron: {version: core_r0.14.0}
    model: {mtp_num_layers: 1}
    parallel: {world_size: 16, cp: 2}
    """,
)
def version_refuses(f: Facts) -> Iterator[Violation]:
    at = f.judged_release
    for record, path, what in _hits(f, "refused"):
        yield Violation(path, f"{what} on Megatron-LM {at.shown()}: {record.symptom}; {record.fix}",
                        record.way_out)
    for path, what, rows in _absent_features(f):
        yield Violation(path, f"{what} is not in Megatron-LM {at.shown()}: its parser refuses the "
                        f"argument (only {', '.join(rows)} have it)",
                        f"set megatron.version to {' or '.join(rows)}, or drop {path}")


RULES = (version_known, known_bugs, version_refuses)

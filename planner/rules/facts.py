"""Derived quantities the rules share, computed once per config.

A quantity that is not a whole number (DP when N is not divisible by TP·CP·PP·GTP, the layer
split when the layers do not divide) raises `NotComputable`: the rule that owns that
divisibility reports it once, and every rule built on top of it stays silent instead of crashing.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from planner.config.megatron_branch import BranchConflict, megatron_branch
from planner.config.megatron_releases import DEFAULT_VERSION, Release, release, resolve_version
from planner.config.schema import Config
from planner.degrees import Degrees
from planner.layout.pipeline import SplitError, StageSplit, stage_split
from planner.layout.spec import GridSpec, grid_spec

if TYPE_CHECKING:
    from planner.accounting import Number


def code_of(text: str) -> str:
    """A rule code as written by a person (`ignore:` entries, `moeplan rules par001`): PAR001."""
    return text.strip().upper()


class NotComputable(Exception):
    """A quantity the rule needs is not a whole number (another rule already reports why)."""


class Facts:
    """One config plus the derived numbers and predicates several rules read."""

    def __init__(self, cfg: Config, known_codes: tuple[str, ...] = (), *,
                 terse: bool = False) -> None:
        self.cfg = cfg
        self.known_codes = known_codes  # the catalog's codes, for IGN001 (passed in: no cycle)
        # The caller reads the findings' codes, not their text (`moeplan search` judging
        # thousands of candidates): a rule whose full message is costly may say it briefly.
        self.terse = terse
        self.model = cfg.model
        self.par = cfg.parallel
        self.train = cfg.training
        self.moe = cfg.moe
        self.ovl = cfg.overlap
        self.cluster = cfg.cluster

    # ----------------------------------------------------------------- the ignore list
    @cached_property
    def ignore_codes(self) -> list[str]:
        """`ignore:` entries as rule codes (PAR001), one per entry in order: normalised once for
        the runner and both IGN rules, as a list of a million entries is judged in linear time."""
        return list(map(code_of, self.cfg.ignore))

    # ----------------------------------------------------------------- degrees and grids
    @property
    def world_size(self) -> int:
        return self.degrees.world_size

    @cached_property
    def degrees(self) -> Degrees:
        """The layout degrees and their derived sizes, from their one owner."""
        return self.cfg.degrees

    @property
    def etp(self) -> int:
        """ETP after Megatron's default (ETP = TP when unset)."""
        return self.degrees.etp

    @property
    def dense_grid_ok(self) -> bool:
        return self.degrees.dense_divides

    @property
    def expert_grid_ok(self) -> bool:
        return self.degrees.expert_divides

    @property
    def dp(self) -> int:
        """Replicate attention data-parallel size D_a."""
        if not self.dense_grid_ok:
            raise NotComputable("DP")
        return self.degrees.dp

    @property
    def edp(self) -> int:
        """Expert data-parallel size D_e (CP never enters the expert grid)."""
        if not self.expert_grid_ok:
            raise NotComputable("EDP")
        return self.degrees.edp

    @property
    def dp_cp_size(self) -> int:
        """DP·CP: the dense gradient group, cut by optimizer instances and CP chunks."""
        if not self.dense_grid_ok:
            raise NotComputable("DP")
        return self.degrees.dp_cp_size

    @property
    def batch_unit(self) -> int:
        """micro · D_batch: samples one microbatch step consumes across the data-parallel ranks."""
        if not self.dense_grid_ok:
            raise NotComputable("DP")
        return self.cfg.batch_unit

    @property
    def microbatches(self) -> int:
        """m = B / (b · D_batch); CP, EP and ETP add no samples."""
        if self.cfg.global_batch_size % self.batch_unit:
            raise NotComputable("microbatches")
        return self.cfg.global_batch_size // self.batch_unit

    @cached_property
    def stage_memory(self) -> list[dict[str, Number]] | None:
        """Every stage's memory parts (None when not computable), once for MEM001 and MEM002."""
        from planner.accounting import stage_memory

        return stage_memory(self.cfg)

    @cached_property
    def ncclep_receive_rows(self) -> dict[str, Any] | None:
        """NCCL EP's static receive rows against the busiest rank's (None without NCCL EP)."""
        from planner.accounting import ncclep_receive_check

        return ncclep_receive_check(self.cfg)

    def give_stage_memory(self, stages: list[dict[str, Number]]) -> None:
        """Take the memory parts from a caller that has them already: `moeplan search` gives its
        float budget when every verdict on it equals the exact one."""
        self.__dict__["stage_memory"] = stages  # the cached property's slot

    @cached_property
    def grid_spec(self) -> GridSpec:
        """The grid's view of the layout; only meaningful once both grids tile the world."""
        if not (self.dense_grid_ok and self.expert_grid_ok):
            raise NotComputable("grid")
        return grid_spec(self.cfg)

    # ----------------------------------------------------------------- pipeline
    @cached_property
    def split_result(self) -> StageSplit | SplitError:
        try:
            return stage_split(self.cfg)
        except SplitError as err:
            return err

    @property
    def split(self) -> StageSplit:
        result = self.split_result
        if isinstance(result, SplitError):
            raise NotComputable("layer split")
        return result

    @property
    def vpp(self) -> int:
        """Virtual stages per rank: from the split (a layout implies it), else as configured."""
        result = self.split_result
        if isinstance(result, StageSplit):
            return result.vpp
        return self.par.vpp or 1

    @property
    def asks_for_virtual_stages(self) -> bool:
        """More than one virtual stage per rank: the split's, or, when the split fails (PIP001 says
        why), whether the config asks for them (parallel.vpp > 1, or layers per virtual stage)."""
        result = self.split_result
        if isinstance(result, StageSplit):
            return result.vpp > 1
        return (self.par.vpp or 1) > 1 or self.par.num_layers_per_virtual_pipeline_stage is not None

    # ----------------------------------------------------------------- features
    @property
    def v4_attention(self) -> bool:
        """DeepSeek-V4 CSA/HCA attention (Megatron dev `dsv4_hybrid`)."""
        return self.model.attention_variant == "dsv4_hybrid"

    @property
    def v4_model(self) -> bool:
        return self.v4_attention or (self.model.preset or "").startswith("deepseek-v4")

    @property
    def hash_layers(self) -> int:
        return self.model.moe_n_hash_layers

    @property
    def mhc(self) -> bool:
        return self.model.enable_hyper_connections

    @property
    def variable_seq_lengths(self) -> bool:
        """A sequence-packing scheduler turns variable sequence lengths on (Megatron dev)."""
        return self.train.variable_seq_lengths or self.train.sequence_packing_scheduler is not None

    @property
    def fsdp(self) -> str | None:
        if self.train.use_megatron_fsdp:
            return "use_megatron_fsdp"
        if self.train.use_torch_fsdp2:
            return "use_torch_fsdp2"
        return None

    @property
    def dynamic_cp(self) -> str | None:
        if self.par.dynamic_context_parallel:
            return "dynamic_context_parallel"
        if self.par.hybrid_context_parallel:
            return "hybrid_context_parallel"
        return None

    @property
    def gtp_active(self) -> bool:
        return self.par.gtp > 1 or self.par.egtp > 1

    @property
    def sequence_shards(self) -> int:
        """q_s, GTP sequence shards inside the gtp axis (1 when unset)."""
        return self.par.gtp_remat_num_sequence_shards or 1

    @property
    def flex_backend(self) -> str | None:
        """The flex backend in effect (the schema fills in Megatron's default), or None when the
        dispatcher is not flex."""
        if self.moe.moe_token_dispatcher_type != "flex":
            return None
        return self.moe.moe_flex_dispatcher_backend

    @property
    def megatron_branch(self) -> str:
        """The Megatron-LM branch the emitted command targets: dev, main, or 'main or dev'."""
        try:
            return megatron_branch(self.cfg)
        except BranchConflict:  # GTP with V4 features: the emitter reports it, no branch has both
            return "main or dev"

    @cached_property
    def release(self) -> Release | None:
        """The Megatron-LM version megatron.version names, or None when moeplan cannot place it
        (rule VER001 says so; the version-dependent rules then follow dev@d48bd6be)."""
        return resolve_version(self.cfg.megatron.version)

    @property
    def judged_release(self) -> Release:
        """The version whose behaviour the version-dependent rules follow: the named one, or dev."""
        return self.release or release(DEFAULT_VERSION)

    @property
    def drop_and_pad(self) -> bool:
        return self.moe.moe_expert_capacity_factor is not None or self.moe.moe_pad_expert_input_to_capacity

"""The knobs search varies, as one frozen record: what a candidate sets over the user's config.

A candidate is the user's config with every knob of a `Knobs` written over it (`apply`); the
record is also how the winner is written back to YAML (`sections`, schema names), how two
candidates are said to differ (`diff`) and how `--json` names a candidate's layout. Everything
else in the config is the user's.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, fields, replace
from typing import Any

from planner.config.schema import Config
from planner.layout.pipeline import SplitError, stage_split

Dispatcher = tuple[str, str | None]  # (moe_token_dispatcher_type, moe_flex_dispatcher_backend)
Family = tuple[int, int, int, int, int]  # (TP, CP, PP, EP, ETP)


@dataclass(frozen=True, slots=True)
class Pipeline:
    """How the layers split over the pipeline stages (the schema's `parallel` fields, by name);
    the defaults are the even split."""

    vpp: int | None = None
    pipeline_model_parallel_layout: str | None = None
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    num_layers_per_virtual_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    microbatch_group_size_per_vp_stage: int | None = None

    @classmethod
    def of(cls, cfg: Config) -> Pipeline:
        return cls(**{name: getattr(cfg.parallel, name) for name in PIPELINE_FIELDS})

    def values(self) -> dict[str, Any]:
        return {"vpp": self.vpp, "pipeline_model_parallel_layout": self.pipeline_model_parallel_layout,
                "decoder_first_pipeline_num_layers": self.decoder_first_pipeline_num_layers,
                "decoder_last_pipeline_num_layers": self.decoder_last_pipeline_num_layers,
                "num_layers_per_virtual_pipeline_stage": self.num_layers_per_virtual_pipeline_stage,
                "account_for_embedding_in_pipeline_split":
                    self.account_for_embedding_in_pipeline_split,
                "account_for_loss_in_pipeline_split": self.account_for_loss_in_pipeline_split,
                "microbatch_group_size_per_vp_stage": self.microbatch_group_size_per_vp_stage}


PIPELINE_FIELDS = tuple(f.name for f in fields(Pipeline))


@dataclass(frozen=True, slots=True)
class Recompute:
    """An activation recompute setting (the schema's `overlap.recompute_*` fields)."""

    granularity: str | None = None  # None, "selective" or "full"
    method: str | None = None
    num_layers: int | None = None
    modules: tuple[str, ...] | None = None

    @classmethod
    def of(cls, cfg: Config) -> Recompute:
        ov = cfg.overlap
        modules = ov.recompute_modules
        return cls(ov.recompute_granularity, ov.recompute_method, ov.recompute_num_layers,
                   None if modules is None else tuple(modules))

    @classmethod
    def selective(cls, *modules: str) -> Recompute:
        return cls("selective", modules=modules)

    @classmethod
    def full(cls, method: str, num_layers: int) -> Recompute:
        return cls("full", method, num_layers)

    @property
    def label(self) -> str:
        """How search prints it: "none", "selective core_attn,moe_act", "full uniform 1"."""
        if self.granularity == "full":
            return f"full {self.method} {self.num_layers}"
        if self.granularity == "selective":
            return "selective " + ",".join(self.modules or ["core_attn"])
        return "none"

    def values(self) -> dict[str, Any]:
        return {"recompute_granularity": self.granularity, "recompute_method": self.method,
                "recompute_num_layers": self.num_layers,
                "recompute_modules": None if self.modules is None else list(self.modules)}


@dataclass(frozen=True, slots=True)
class Knobs:
    """Every field search sets on a candidate: the degrees, the pipeline split, the micro-batch
    size, recompute, the token dispatcher and EP overlap."""

    tp: int
    cp: int
    pp: int
    ep: int
    etp: int
    sequence_parallel: bool
    pipeline: Pipeline
    micro_batch_size: int
    recompute: Recompute
    dispatcher: Dispatcher
    permute_fusion: bool
    ep_overlap: bool

    @classmethod
    def of(cls, cfg: Config) -> Knobs:
        p, moe = cfg.parallel, cfg.moe
        return cls(p.tp, p.cp, p.pp, p.ep, p.etp, p.sequence_parallel, Pipeline.of(cfg),
                   cfg.training.micro_batch_size, Recompute.of(cfg),
                   (moe.moe_token_dispatcher_type, moe.moe_flex_dispatcher_backend),
                   moe.moe_permute_fusion, cfg.overlap.overlap_moe_expert_parallel_comm)

    @property
    def family(self) -> Family:
        return (self.tp, self.cp, self.pp, self.ep, self.etp)

    def of_family(self, family: Family) -> Knobs:
        """These knobs on another family's degrees, sequence parallelism on whenever TP > 1."""
        tp, cp, pp, ep, etp = family
        return replace(self, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, sequence_parallel=tp > 1)

    def sections(self) -> dict[str, dict[str, Any]]:
        """The knobs by config section, in the schema's names (how they are written to YAML)."""
        return {"parallel": {"tp": self.tp, "cp": self.cp, "pp": self.pp, "ep": self.ep,
                             "etp": self.etp, "sequence_parallel": self.sequence_parallel,
                             **self.pipeline.values()},
                "training": {"micro_batch_size": self.micro_batch_size},
                "overlap": {**self.recompute.values(),
                            "overlap_moe_expert_parallel_comm": self.ep_overlap},
                "moe": {"moe_token_dispatcher_type": self.dispatcher[0],
                        "moe_flex_dispatcher_backend": self.dispatcher[1],
                        "moe_permute_fusion": self.permute_fusion}}

    def section_keys(self) -> dict[str, Hashable]:
        """What decides each section `sections` writes: equal keys write equal sections."""
        return {"parallel": (self.tp, self.cp, self.pp, self.ep, self.etp, self.sequence_parallel,
                             self.pipeline),
                "training": self.micro_batch_size, "overlap": (self.recompute, self.ep_overlap),
                "moe": (self.dispatcher, self.permute_fusion)}

    def apply(self, cfg: Config) -> Config:
        """`cfg` with these knobs (no re-validation needed: every value set is one the schema
        accepts, and the rule catalog judges the combination)."""
        return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=values)
                                      for section, values in self.sections().items()})

    def view(self) -> dict[str, Any]:
        """The varied fields, flat, for saying how two candidates differ (recompute as its label;
        sequence parallelism and permute fusion follow from the others)."""
        return {"tp": self.tp, "cp": self.cp, "pp": self.pp, "ep": self.ep, "etp": self.etp,
                **self.pipeline.values(), "micro_batch_size": self.micro_batch_size,
                "recompute": self.recompute.label, "moe_token_dispatcher_type": self.dispatcher[0],
                "moe_flex_dispatcher_backend": self.dispatcher[1],
                "overlap_moe_expert_parallel_comm": self.ep_overlap}

    def diff(self, other: Knobs) -> dict[str, Any]:
        """The varied fields whose value in `other` differs from these, with `other`'s values."""
        mine, theirs = self.view(), other.view()
        return {k: v for k, v in theirs.items() if v != mine[k]}


def family_of(cfg: Config) -> Family:
    """The config's (TP, CP, PP, EP, ETP)."""
    p = cfg.parallel
    return (p.tp, p.cp, p.pp, p.ep, p.etp)


def vpp_of(cfg: Config) -> int:
    """The virtual pipeline size the config's split has (its `vpp` when it does not split)."""
    try:
        return stage_split(cfg).vpp
    except SplitError:
        return cfg.parallel.vpp or 1

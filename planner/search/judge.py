"""Judging one candidate: the rule catalog refuses it or the step-time estimate times it.

Search is a loop around the one pipeline `check` and `estimate` use: every candidate is a real
Config (the user's with the knobs of a `Knobs` written over it), refused by the rule catalog
(MEM001 is the memory budget's verdict; `memory_headroom` may demand more margin) and timed by the
estimate. Nothing here re-states a rule or a formula. Ranking uses the float estimate
(planner/budget/expr.py); what search prints is re-evaluated exactly (`exact`, `exact_refusal`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from planner.accounting import BudgetError, Number, stage_memory
from planner.config.schema import Config
from planner.estimate import Estimate, estimate
from planner.findings import Finding
from planner.rules import run_rules
from planner.rules.catalog import CODES
from planner.rules.facts import Facts
from planner.rules.memory import SHARE, headroom_share
from planner.search.knobs import Knobs, vpp_of
from planner.units import fixed, format_bytes

if TYPE_CHECKING:
    from pydantic import BaseModel

# Verdicts that leave a candidate legal (every other rule passes) but not fitting: the memory
# verdicts (MEM001, the stricter headroom), and no estimate.
MEMORY_VERDICTS = (("MEM001",), ("HEADROOM",))
NOT_FITTING = (*MEMORY_VERDICTS, ("EST",))
# Float ranking is within this relative distance of the exact step time (a few dozen roundings of
# 1e-16 each); candidates that close to the K-th are re-evaluated exactly before ranking.
FLOAT_MARGIN = 1e-12


@dataclass
class Candidate:
    """One timed, fitting layout: the config, the knobs it sets over the user's (None: the user's
    own config) and its figures."""

    cfg: Config
    knobs: Knobs | None
    step_time_s: float
    tflops_per_gpu: float
    tokens_per_s_per_gpu: float
    peak_memory_bytes: int  # the largest per-rank peak over the stages
    peak_stage: int
    stage_peak_bytes: list[int]
    is_user: bool = False
    stage_step_s: list[float] = field(default_factory=list)  # each stage's step time
    stage_bubble_s: list[float] = field(default_factory=list)  # and its pipeline bubble
    device_memory_bytes: int = 0  # the largest device total (busiest EP rank) over the stages
    gpu_memory_bytes: int = 0

    @property
    def headroom(self) -> float:
        """The share of GPU memory the largest device total leaves free."""
        return 1 - self.device_memory_bytes / self.gpu_memory_bytes if self.gpu_memory_bytes else 0.0

    def as_json(self) -> dict[str, Any]:
        c, k = self.cfg, Knobs.of(self.cfg)
        return {
            "parallel": {"tp": k.tp, "cp": k.cp, "pp": k.pp, "vpp": vpp_of(c), "ep": k.ep,
                         "etp": k.etp, "dp": c.dp, "edp": c.edp,
                         "pipeline_model_parallel_layout": k.pipeline.pipeline_model_parallel_layout,
                         "account_for_embedding_in_pipeline_split":
                             k.pipeline.account_for_embedding_in_pipeline_split,
                         "account_for_loss_in_pipeline_split":
                             k.pipeline.account_for_loss_in_pipeline_split},
            "training": {"micro_batch_size": k.micro_batch_size},
            "recompute": k.recompute.label,
            "moe": {"moe_token_dispatcher_type": k.dispatcher[0],
                    "moe_flex_dispatcher_backend": k.dispatcher[1]},
            "overlap_moe_expert_parallel_comm": k.ep_overlap,
            "is_user_layout": self.is_user,
            "step_time_s": self.step_time_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_stage": self.peak_stage,
            "stage_peak_memory_bytes": self.stage_peak_bytes,
            "stage_step_time_s": self.stage_step_s,
            "device_memory_bytes": self.device_memory_bytes,
            "device_memory_free_share": self.headroom,
        }


@dataclass
class Rejected:
    """A candidate the catalog or the memory budget refused, with why (and its time if known)."""

    cfg: Config
    knobs: Knobs | None
    reason: str
    codes: tuple[str, ...]
    step_time_s: float | None = None
    difference: dict[str, Any] | None = None  # from the winner, when listed as ruled out


def identity(cfg: Config) -> str:
    """What makes two candidates the same layout (the sections a candidate changes)."""
    return _identity_text(repr(cfg.parallel.model_dump()), cfg.training.micro_batch_size,
                          repr(cfg.overlap.model_dump()), repr(cfg.moe.model_dump()))


def _identity_text(parallel: str, micro_batch_size: int, overlap: str, moe: str) -> str:
    """`identity`'s text from its sections' reprs (the repr of their tuple), so a judge that keeps
    each section's repr (`Judge._apply`) writes the same text without dumping them again."""
    return f"({parallel}, {micro_batch_size!r}, {overlap}, {moe})"


def _errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


def _stage_needs(stage: int, peak: Number, share: str, gpu: Number) -> str:
    return (f"stage {stage} needs an estimated {format_bytes(peak, digits=2)} per rank, {share} of "
            f"{format_bytes(gpu, digits=2)}")


def _memory_reason(stages: list[dict[str, Number]]) -> str:
    """MEM001's verdict read off the figures it compares (planner/rules/memory.py): the stage
    with the largest share of GPU memory, its device total and the GPU's memory."""
    worst = max(range(len(stages)), key=lambda s: stages[s][SHARE])
    env = stages[worst]
    share = fixed(Fraction(env[SHARE]) * 100, 1)
    needs = _stage_needs(worst, env["device_memory_bytes"], f"{share} %", env["gpu_memory_bytes"])
    return f"does not fit: {needs} (MEM001)"


class Judge:
    """Builds, judges and times candidates, counting and remembering what it refused.

    The catalog judges first (MEM001 included: the memory page alone is cheaper than a whole
    estimate); a candidate whose busiest stage's device total needs more than `headroom` of the
    GPU's memory (by default 1 - cluster.memory_margin, MEM002's line) is refused as HEADROOM; the
    rest are timed."""

    def __init__(self, cfg: Config, headroom: float | None = None, float_memory: bool = True) -> None:
        self.cfg = cfg
        self.headroom = float(headroom_share(cfg)) if headroom is None else headroom
        self.float_memory = float_memory
        self.seen: dict[str, Candidate | Rejected] = {}  # by the candidate's identity
        self._estimates: dict[str, Estimate] = {}  # timed by `step_time` before being judged
        # Each knob setting's config and identity, made once: a setting is timed, judged or
        # forgotten by the same knobs, and building one costs as much as a rule family.
        self._built: dict[Knobs, tuple[Config, str]] = {}
        # Each section a knob setting writes, with its `identity` part, made once per
        # `Knobs.section_keys` value: the settings of one layout share their parallel section
        # (and the memos keyed on its identity hit), a grid's cells their other sections.
        self._sections: dict[tuple[str, Hashable], tuple[BaseModel, str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """What a worker sends back: not the configs it built (`_setting`), which only it asks for."""
        return {**self.__dict__, "_built": {}, "_sections": {}}

    @property
    def explored(self) -> int:
        return len(self.seen)

    @property
    def legal(self) -> int:
        """No rule error besides the memory verdict."""
        return sum(1 for out in self.seen.values()
                   if isinstance(out, Candidate) or out.codes in NOT_FITTING)

    @property
    def fitting(self) -> int:
        return sum(1 for out in self.seen.values() if isinstance(out, Candidate))

    def timed(self) -> list[Candidate]:
        return [out for out in self.seen.values() if isinstance(out, Candidate)]

    def bound(self, top: int) -> float:
        """The `top`-th fastest fitting step time known (inf while fewer are known): what a
        candidate must beat to enter the top."""
        known = sorted(c.step_time_s for c in self.timed())
        return known[top - 1] if top >= 1 and len(known) >= top else float("inf")

    def absorb(self, other: Judge) -> None:
        """Take another judge's verdicts (a worker's), keeping the first of equal candidates."""
        for key, out in other.seen.items():
            self.seen.setdefault(key, out)

    def build(self, knobs: Knobs | None) -> Config:
        """The user's config with `knobs` written over it (None: the user's own)."""
        return self.cfg.model_copy() if knobs is None else self._setting(knobs)[0]

    def _setting(self, knobs: Knobs) -> tuple[Config, str]:
        """The config `knobs` make and its identity, remembered for this judge's life."""
        made = self._built.get(knobs)
        if made is None:
            made = self._built[knobs] = self._apply(knobs)
        return made

    def _apply(self, knobs: Knobs) -> tuple[Config, str]:
        """`knobs.apply(self.cfg)` and its `identity`, from the sections made before."""
        parts: dict[str, tuple[BaseModel, str]] = {}
        values: dict[str, dict[str, Any]] | None = None
        for name, key in knobs.section_keys().items():
            part = self._sections.get((name, key))
            if part is None:
                values = values or knobs.sections()
                section = getattr(self.cfg, name).model_copy(update=values[name])
                part = self._sections[(name, key)] = (section, repr(section.model_dump()))
            parts[name] = part
        cand = self.cfg.model_copy(update={name: section for name, (section, _) in parts.items()})
        return cand, _identity_text(parts["parallel"][1], knobs.micro_batch_size,
                                    parts["overlap"][1], parts["moe"][1])

    def judge(self, knobs: Knobs | None, *, is_user: bool = False) -> Candidate | Rejected:
        if knobs is None:
            cand = self.build(knobs)
            key = identity(cand)
        else:
            cand, key = self._setting(knobs)
        if key in self.seen:
            return self.seen[key]
        facts = Facts(cand, known_codes=CODES, terse=True)  # the codes decide; reasons are ours
        if self.float_memory:
            self._float_memory(facts)
        errors = _errors(run_rules(cand, facts=facts, errors_only=True))
        codes = tuple(sorted({f.code for f in errors}))
        out: Candidate | Rejected
        if codes == ("MEM001",):
            out = Rejected(cand, knobs, _memory_reason(facts.stage_memory or []), codes)
        elif codes:
            out = Rejected(cand, knobs, "rule " + ", ".join(codes), codes)
        elif (over := self._over_headroom(facts.stage_memory or [])) is not None:
            out = Rejected(cand, knobs, over, ("HEADROOM",))
        else:
            try:
                est = self._estimates.pop(key, None) or estimate(cand, exact=False)
            except BudgetError as exc:  # the catalog passed it: report, do not crash
                out = Rejected(cand, knobs, f"no estimate: {exc}", ("EST",))
            else:
                out = candidate(cand, knobs, est, is_user, facts.stage_memory)
        self._estimates.pop(key, None)
        self.seen[key] = out
        return out

    def _float_memory(self, facts: Facts) -> None:
        """Give the catalog the memory budget in floats when every stage is clear of the
        thresholds a verdict compares with (MEM001's 100 %, MEM002's 80 %, the headroom) by far
        more than float rounding: the verdicts are then those of the exact budget. Otherwise
        the catalog evaluates it exactly, as `moeplan check` does."""
        stages = stage_memory(facts.cfg, exact=False)
        if stages is None:
            return
        lines = (1.0, float(headroom_share(facts.cfg)), self.headroom)  # once, not per stage
        for env in stages:
            share = float(env[SHARE])
            if any(abs(share - t) <= FLOAT_MARGIN * t for t in lines):
                return
        facts.give_stage_memory(stages)

    def step_time(self, knobs: Knobs) -> float | None:
        """The candidate's step time without judging it (None when it cannot be estimated); the
        estimate is kept for `judge`."""
        cand, key = self._setting(knobs)
        if key in self.seen:
            return self.seen[key].step_time_s
        if key in self._estimates:
            return float(self._estimates[key].step_time_s)
        est = float_estimate(cand)
        if est is None:
            return None
        self._estimates[key] = est
        return float(est.step_time_s)

    def forget_all(self) -> None:
        self._estimates.clear()
        self._built.clear()

    def forget(self, knobs: Knobs) -> None:
        """Drop a kept estimate (its candidate was pruned, not judged)."""
        self._estimates.pop(self._setting(knobs)[1], None)

    def _over_headroom(self, stages: list[dict[str, Number]]) -> str | None:
        """Why the busiest stage is above the headroom (None when every stage is inside it)."""
        if self.headroom >= 1 or not stages:
            return None  # MEM001 already holds every stage to the whole GPU memory
        shares = [float(env[SHARE]) for env in stages]
        worst = max(range(len(shares)), key=shares.__getitem__)
        if shares[worst] <= self.headroom:
            return None
        env = stages[worst]
        return (f"does not fit the {self.headroom:.0%} memory headroom: "
                + _stage_needs(worst, int(env["device_memory_bytes"]), f"{shares[worst]:.1%}",
                               int(env["gpu_memory_bytes"])))

    def time_rejected(self, r: Rejected) -> None:
        """The step time a refused candidate would have (when its grids build)."""
        if r.step_time_s is None and "EST" not in r.codes:
            est = float_estimate(r.cfg)
            if est is not None:
                r.step_time_s = est.step_time_s


def float_estimate(cand: Config) -> Estimate | None:
    """The float estimate of a candidate that may not be judged yet, or None when a layout the
    catalog would refuse cannot be estimated at all."""
    try:
        return estimate(cand, exact=False)
    except (BudgetError, ValueError, ZeroDivisionError, KeyError):
        return None


def candidate(cfg: Config, knobs: Knobs | None, est: Estimate, is_user: bool,
              memory: list[dict[str, Number]] | None = None) -> Candidate:
    """The candidate's figures; peaks from the catalog's memory budget when given (a float
    estimate holds none)."""
    envs = memory or est.envs
    peaks = [int(env["peak_memory_bytes"]) for env in envs]
    stage = max(range(len(peaks)), key=peaks.__getitem__)
    return Candidate(cfg, knobs, est.step_time_s, est.tflops_per_gpu, est.tokens_per_s_per_gpu,
                     peaks[stage], stage, peaks, is_user,
                     [float(t) for t in est.page_values("time_stage_step_s")],
                     [float(t) for t in est.page_values("time_bubble_s")],
                     max(int(env["device_memory_bytes"]) for env in envs),
                     int(envs[0]["gpu_memory_bytes"]))


def exact(cand: Candidate) -> Candidate:
    """The candidate's figures evaluated exactly (as `moeplan estimate` prints them)."""
    return candidate(cand.cfg, cand.knobs, estimate(cand.cfg), cand.is_user)


def exact_refusal(unit: tuple[Config, float, Rejected]) -> tuple[float, str | None]:
    """A listed refusal's step time evaluated exactly, and its memory verdict judged on the exact
    budget (None when no memory verdict is involved): as printed, whereas search judged the
    memory verdicts in floats."""
    cfg, headroom, r = unit
    reason = None
    if set(r.codes) & {"MEM001", "HEADROOM"}:
        again = Judge(cfg, headroom, float_memory=False).judge(r.knobs)
        if isinstance(again, Rejected):
            reason = again.reason
    return estimate(r.cfg).step_time_s, reason


def verdict_key(codes: tuple[str, ...]) -> tuple[str, ...]:
    """Which verdict a refusal is, for listing each once: its rule codes, memory aside when a
    rule also refuses it (that rule is the reason; fixing memory would not help)."""
    rules = tuple(c for c in codes if c not in ("MEM001", "HEADROOM"))
    return rules or codes

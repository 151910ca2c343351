"""V4030-V4032: what the DeepSeek-V4 trainer does that no Megatron-LM branch has (dev@d48bd6be,
main@d98e8a64). Each is information: moeplan budgets what Megatron runs and says what it leaves out."""

from __future__ import annotations

from collections.abc import Iterator

from planner.rules.base import Violation, rule
from planner.rules.facts import Facts
from planner.rules.sources import V4_WRITE_UP, dev

_V4 = "model: {attention_variant: dsv4_hybrid, compress_ratios: [0, 4, 128, 4]}"


def _v4(f: Facts) -> bool:
    return f.model.attention_variant == "dsv4_hybrid" or f.model.enable_hyper_connections


@rule(
    "V4030", "error", "DualPipe is not in Megatron: estimated, never emitted",
    source=f"{V4_WRITE_UP}; {dev('core/pipeline_parallel/schedules.py', 'get_forward_backward_func')}",
    why="""DeepSeek's trainers (V3's, and V4's adapted for mHC) run the DualPipe schedule. No
    Megatron-LM branch has it (combined_1f1b overlaps EP communication inside 1F1B; it is not
    DualPipe), so Megatron cannot run such a config: check refuses it and emit writes nothing.
    `moeplan estimate` still prices it, as an estimate only: the bubble as the DeepSeek-V3
    report's Table 2 states it, (PP/2 − 1)(F&B + B − 3W) against 1F1B's (PP − 1)(F + B)
    (planner/budget/pipeline.py), and its memory as the same table does: two stages' parameters
    per rank (their grads and optimizer states with them) and PP + 1 microbatches of activations
    (planner/budget/memory.py).""",
    bad="parallel: {pp: 2}\noverlap: {pipeline_schedule: dualpipe}",
    good="parallel: {pp: 2}\noverlap: {pipeline_schedule: 1f1b}",
)
def dualpipe_not_in_megatron(f: Facts) -> Iterator[Violation]:
    if f.ovl.pipeline_schedule == "dualpipe":
        yield Violation("overlap.pipeline_schedule", "pipeline_schedule dualpipe: DualPipe"
                        + (" for mHC" if f.model.enable_hyper_connections else "")
                        + " is not in Megatron-LM, which cannot run it; `moeplan estimate` prices "
                        "it as an estimate only (DeepSeek-V3 report, Table 2: its bubble, 2x the "
                        "parameters and PP + 1 microbatches of activations per rank)",
                        "set overlap.pipeline_schedule: 1f1b to check and emit a Megatron run")


@rule(
    "V4031", "info", "the V4 trainer's Muon gradient all-to-all is not in Megatron",
    source=f"{V4_WRITE_UP}; {dev('core/optimizer/layer_wise_optimizer.py', 'LayerWiseDistributedOptimizer')}",
    why="""The DeepSeek-V4 trainer gives each matrix's owner its whole gradient for Newton-Schulz
    with an all-to-all of parameter gradients (BF16 with stochastic rounding, FP32 accumulation).
    Megatron's Muon runs in its layer-wise distributed optimizer, which all-reduces whole grads
    over the data-parallel group and gathers TP shards; moeplan budgets that (dense_grad_reduce,
    step.muon_*), not the all-to-all, and never as the token dispatcher's all-to-all.""",
    bad=_V4 + "\ntraining: {optimizer: muon}",
    good=_V4 + "\ntraining: {optimizer: adam}",
)
def muon_all_to_all_not_in_megatron(f: Facts) -> Iterator[Violation]:
    if _v4(f) and f.train.optimizer == "muon":
        yield Violation("training.optimizer", "Muon on a DeepSeek-V4 model: the gradient all-to-all "
                        "is the V4 trainer's, not Megatron's (budgeted: all-reduce of whole grads)",
                        "nothing to change; compare with the V4 trainer's traffic by hand")


@rule(
    "V4032", "info", "V4's MXFP4 is post-training QAT; Megatron's fp4 trains NVFP4",
    source=f"{V4_WRITE_UP}; {dev('core/transformer/transformer_config.py', 'TransformerConfig.fp4_recipe')}",
    why="""DeepSeek-V4 applies MXFP4 quantisation-aware training after pre-training; Megatron's
    fp4 is NVFP4 training (fp4_recipe nvfp4 or custom; no MXFP4 recipe in any branch). moeplan
    budgets Megatron's NVFP4 (row padding, no FP4 weight copies) and keeps the dispatch payload in
    the training precision: MXFP4 is no reason to divide the BF16 all-to-all by four.""",
    bad=_V4 + "\ntraining: {fp4: true}",
    good=_V4 + "\ntraining: {fp4: false}",
)
def mxfp4_is_not_megatrons_fp4(f: Facts) -> Iterator[Violation]:
    if _v4(f) and f.train.fp4:
        yield Violation("training.fp4", "fp4 on a DeepSeek-V4 model: Megatron trains NVFP4; V4's "
                        "MXFP4 QAT is not in Megatron-LM", "nothing to change; budgets follow NVFP4")


RULES = (dualpipe_not_in_megatron, muon_all_to_all_not_in_megatron, mxfp4_is_not_megatrons_fp4)

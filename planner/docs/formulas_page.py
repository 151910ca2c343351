"""docs/formulas.md: every budget quantity with its formula string, unit and meaning.

The formula book depends on a few structural choices (`Variant`: dispatcher, capacity mode,
optimizer, recompute ...). The page shows the book of one baseline layout, the DeepSeek-V4-Pro
example, and under each quantity the other formula it takes, or that it only exists, when one
choice changes. `VARIATIONS` names every choice; a test checks it covers every Variant field.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.accounting import (
    ALL_SYMBOLS,
    LAYER_KINDS,
    Variant,
    formula_book,
    pipeline_page,
    pretty,
    variant_of,
)
from planner.config.loader import parse_config
from planner.docs.markdown import GENERATED_NOTE, cell, code
from planner.layout.pipeline import stage_split

# The baseline: the bundled DeepSeek-V4-Pro layout on 1,024 GPUs (examples/deepseek-v4-pro-1024.yaml).
BASELINE_CONFIG: dict[str, Any] = {
    "model": {"preset": "deepseek-v4-pro"},
    "parallel": {"world_size": 1024, "tp": 1, "cp": 2, "pp": 8, "ep": 64, "etp": 1,
                 "cp_partition_mode": "contiguous",
                 "pipeline_model_parallel_layout": "Et*6|(t*8|)*6t*7mL"},
    "training": {"seq_length": 8192, "micro_batch_size": 1, "global_batch_size": 4096,
                 "qkv_format": "thd", "sequence_packing_scheduler": "dp_balanced",
                 "precision": "bf16", "use_distributed_optimizer": True},
    "moe": {"moe_token_dispatcher_type": "alltoall", "moe_router_load_balancing_type": "seq_aux_loss",
            "moe_aux_loss_coeff": 1.0e-4, "moe_tid2eid_source": "checkpoint"},
    "overlap": {"recompute_granularity": "full", "recompute_method": "uniform",
                "recompute_num_layers": 1},
    "cluster": {"nodes": 128, "gpus_per_node": 8, "gpu_memory_gib": 141},
}

_SELECTIVE = {"recompute": "selective", "recompute_method": None}
STANDARD = frozenset({"softmax"})

# label -> the Variant fields that change (relative to the baseline).
VARIATIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("dispatcher `allgather`", {"dispatcher": "allgather"}),
    ("dispatcher `flex`", {"dispatcher": "flex", "flex_backend": "deepep"}),
    ("dispatcher `flex` with the `ncclep` backend", {"dispatcher": "flex", "ncclep": True,
                                                     "flex_backend": "ncclep"}),
    ("a capacity factor (dropping)", {"capacity": "drop"}),
    ("drop-and-pad", {"capacity": "pad"}),
    ("ETP > 1", {"etp": True}),
    ("EP = 1, ETP = 1", {"ep": False, "etp": False, "tp_ep": False}),
    ("PP = 1", {"pp": False}),
    ("DP·CP = 1", {"dp_cp": False}),
    ("EDP = 1", {"edp": False}),
    ("TP·DP·CP = 1", {"tp_dp_cp": False}),
    ("no distributed optimizer", {"dist_opt": False}),
    ("several distributed-optimizer instances", {"instances": True}),
    ("no mHC", {"mhc": False}),
    ("per-token loss", {"per_token_loss": True}),
    ("no expert bias", {"expert_bias": False}),
    ("optimizer `sgd`", {"optimizer": "sgd"}),
    ("optimizer `muon`", {"optimizer": "muon"}),
    ("fp32 parameters (no master copy)", {"master_copy": False}),
    ("no recompute", {"recompute": None, "recompute_method": None}),
    ("full recompute, `block` method", {"recompute_method": "block"}),
    *((f"selective recompute of `{module}`", {**_SELECTIVE, "recompute_modules": frozenset({module})})
      for module in ("core_attn", "layernorm", "mla_up_proj", "moe_act", "shared_experts", "mlp",
                     "moe")),
    ("`aux_loss` balancing with TP·CP > 1", {"aux_counts": "aux_loss"}),
    ("no aux-loss counts to reduce", {"aux_counts": ""}),
    ("latent MoE (`moe_latent_size`)", {"latent": True}),
    *((f"Megatron-FSDP `{strategy}`", {"fsdp": strategy, "dist_opt": strategy != "no_shard"})
      for strategy in ("no_shard", "optim", "optim_grads", "optim_grads_params")),
    ("Megatron-FSDP `optim_grads_params` without gradient accumulation fusion",
     {"fsdp": "optim_grads_params", "dist_opt": True, "fsdp_grad_copy": True}),
    ("GTP > 1", {"gtp": True}),
    ("EGTP > 1", {"egtp": True}),
    ("optimizer `muon` with TP > 1 and ETP > 1, tp_mode duplicated",
     {"optimizer": "muon", "muon_tp": True, "tp": True, "etp": True}),
    ("optimizer `muon` on MLA", {"optimizer": "muon", "kinds": frozenset({"mla"}), "mla_q_lora": True,
                                 "cp": False}),
    ("the weight-hash check (check_weight_hash_across_dp_replicas_interval)", {"weight_hash": True}),
    ("zeros counted in every gradient (log_num_zeros_in_grad)", {"count_zeros": True}),
    ("the bf16 optimizer's per-tensor copy of the main parameters", {"param_copy_loop": True}),
    ("the parameter norm after every step (log_params_norm)", {"params_norm": True}),
    ("the parameter norm under the distributed optimizer", {"params_norm": True, "dist_opt": True}),
    ("the parameter norm under Megatron-FSDP", {"params_norm": True, "fsdp": "optim_grads_params",
                                                 "dist_opt": True}),
    ("TP > 1 with sequence parallelism", {"tp": True, "sp": True}),
    ("TP > 1 without sequence parallelism", {"tp": True}),
    ("TP > 1 above the query groups (the QKV output all-gathered over TP)",
     {"tp": True, "sp": True, "qkv_gather": True}),
    ("TP > 1, sequence parallelism, overlapped shared expert",
     {"tp": True, "sp": True, "shared_overlap": True}),
    ("`global_aux_loss` balancing", {"global_aux": True}),
    ("pipeline schedule `dualpipe` (an estimate only: V4030)", {"pp": True, "dualpipe": True}),
    ("dispatcher `flex` with the `hybridep` backend", {"dispatcher": "flex", "flex_backend": "hybridep"}),
    ("fp8/fp4 padding of each expert's rows", {"quant_pad": True}),
    ("fp8/fp4 with the `ncclep` backend", {"dispatcher": "flex", "ncclep": True,
                                           "flex_backend": "ncclep", "quant_pad": True}),
    ("virtual experts", {"virtual_experts": True}),
    ("LayerNorm instead of RMSNorm", {"layernorm": True}),
    ("non-gated MLPs (swiglu false)", {"swiglu": False}),
    ("linear biases (add_bias_linear)", {"bias": True}),
    ("quick-GEGLU MLPs (quick_geglu)", {"quick_geglu": True}),
    ("hybrid Mamba-2 stack with mixer-only blocks (mixer_only_layers)",
     {"kinds": frozenset({"softmax", "mamba"}), "mixer_only": True, "dropout": True}),
    ("hybrid Mamba-2 stack under uniform full recompute (N_r counts pattern layers)",
     {"kinds": frozenset({"softmax", "mamba"}), "hybrid_stack": True, "recompute": "full",
      "recompute_method": "uniform"}),
    ("hybrid stack under the block method (the first N_r pattern layers of each chunk)",
     {"kinds": frozenset({"softmax", "mamba"}), "hybrid_stack": True, "recompute": "full",
      "recompute_method": "block"}),
    # every layer kind's own (planner/budget/layer_kinds.py)
    *(variation for kind in LAYER_KINDS for variation in kind.variations),
    ("q/k/v biases only (add_qkv_bias)", {"kinds": STANDARD, "cp": False, "qkv_bias": True}),
    ("hidden dropout", {"dropout": True}),
    ("a shared-expert gate", {"shared_gate": True}),
    ("zero-computation experts in the router (moe_zero_experts)", {"zero_experts": True}),
    ("router dtype fp64", {"router_fp64": True}),
    ("a learned absolute position table", {"learned_positions": True}),
    ("grad buffers in the parameters' dtype", {"grads_fp32": False}),
    ("precision-aware optimizer (bf16 master remainders and moments)", {"precision_aware": ("2", "2", "2")}),
    ("optimizer CPU offload", {"optimizer_offload": True}),
    ("MLA without qk_layernorm (no latent norms)", {"kinds": frozenset({"mla"}), "mla_q_lora": True,
                                                    "mla_norms": False, "cp": False}),
    ("FP8 weights, tensor scaling on Hopper", {"quant_pad": True, "fp8_weights": "tensor",
                                               "fp8_transpose": True}),
    ("FP8 weights with fp8_param_gather (blockwise)",
     {"quant_pad": True, "fp8_weights": "blockwise", "fp8_param_gather": True}),
    ("FP8 weights with fp8_param_gather (mxfp8)",
     {"quant_pad": True, "fp8_weights": "mxfp8", "fp8_param_gather": True}),
    ("FP8 weights with the first and last blocks in BF16 (first_last_layers_bf16)",
     {"quant_pad": True, "fp8_weights": "blockwise", "bf16_layers": True}),
    # --- expert buffers, NCCL EP and THD packing
    ("EP 1, ETP = TP, EGTP = GTP: routed experts in the dense grad buffer", {"expert_buffer": False}),
    ("NCCL EP zero-copy (main's moe_ncclep_zero_copy)", {"dispatcher": "flex", "ncclep": True,
                                                         "flex_backend": "ncclep", "ncclep_zero_copy": True}),
    ("dispatcher `flex` with the `deepepv2` backend", {"dispatcher": "flex", "flex_backend": "deepepv2"}),
    ("THD packing budgeted at the longest packed microbatch", {"packed_basis": "max"}),
    ("THD packing budgeted at the mean packed microbatch", {"packed_basis": "mean"}),
    # --- fine-grained activation offloading
    ("fine-grained activation offloading of every module (standard attention)",
     {"recompute": None, "recompute_method": None, "kinds": STANDARD, "cp": False,
      "offload": frozenset({"qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"})}),
    ("fine-grained activation offloading of every module (MLA)",
     {"recompute": None, "recompute_method": None, "kinds": frozenset({"mla"}), "cp": False,
      "mla_q_lora": True,
      "offload": frozenset({"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1",
                            "moe_act"})}),
    # the allocator's peak (planner/budget/device_memory.py)
    ("unfused attention (standard, attention dropout): the s x s scores stored",
     {"attn_scores": True, "attention_dropout": True, "kinds": STANDARD, "cp": False}),
    ("Transformer Engine's fused cross entropy", {"ce_impl": "te"}),
    ("the fused native cross entropy", {"ce_impl": "native"}),
    ("the local implementation, no TE grouped GEMM", {"te": False, "grouped_gemm": False}),
    ("an Ampere card (A100, A800): the smaller GEMM workspaces", {"large_workspaces": False}),
    # what trains (planner/budget/training_modes.py)
    ("routed experts frozen", {"freeze": frozenset({"experts"})}),
    ("an encoder tower on the first stage (frozen_tower_params, trained_tower_params)",
     {"tower": True}),
    ("LoRA on linear_qkv, linear_proj, linear_fc1, linear_fc2 (standard attention)",
     {"lora": frozenset({"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}), "kinds": STANDARD,
      "cp": False}),
    ("a colocated RL engine, both sides offloading in the other's phase", {"rl": "train+rollout"}),
    ("a colocated RL engine that keeps its pool, training that keeps its state", {"rl": "none"}),
    ("RoPE by Megatron's unfused path (--no-rope-fusion, MLA with plain RoPE, YaRN's concentration "
     "factor other than 1)", {"rope_unfused": True}),
    ("routed experts' clamped quick-GELU GLU (--quick-geglu with a clamp value)",
     {"moe_act_clamp": True, "quick_geglu": True}),
    ("gradient accumulation fusion off (--no-gradient-accumulation-fusion)", {"wgrad_unfused": True}),
)

CATEGORY_TITLES: dict[str, str] = {
    "layout": "Layout: degrees, microbatches, layers",
    "rows": "Token rows (per rank, per MoE layer, per microbatch)",
    "bytes": "Bytes per collective (per rank, per MoE layer, per microbatch)",
    "memory": "Memory per rank",
    "step": "Per optimizer step, per collective (what `moeplan verify` compares)",
    "topology": "Topology: intra-node and inter-node bytes",
    "scaling": "Gradient scaling",
    "flops": "FLOPs (Megatron's num_floating_point_operations, per token)",
    "time": "Step time (`moeplan estimate`)",
}
LEVEL_TITLES = {"global": "Config dimensions (one value per job)",
                "stage": "Per pipeline stage", "rank": "Per rank (placement on nodes)"}


def baseline_variant() -> Variant:
    cfg = parse_config(BASELINE_CONFIG)
    return variant_of(cfg, stage_split(cfg))


def _books() -> tuple[list[Any], list[tuple[str, dict[str, Any]]]]:
    base = baseline_variant()
    baseline = list(formula_book(base).quantities)
    others = [(label, {q.name: q for q in formula_book(replace(base, **changes)).quantities})
              for label, changes in VARIATIONS]
    return baseline, others


def _ordered_quantities(baseline: list[Any], others: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Baseline quantities in book order, then those only some variation has, in first-seen order."""
    seen = {q.name for q in baseline}
    extra = []
    for _, book in others:
        for name, q in book.items():
            if name not in seen:
                seen.add(name)
                extra.append(q)
    return baseline + extra


def _alternatives(name: str, base_formula: str | None,
                  others: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    """(formula, the variations giving it) for each formula other than the baseline's."""
    by_formula: dict[str, list[str]] = {}
    for label, book in others:
        q = book.get(name)
        if q is not None and q.formula != base_formula:
            by_formula.setdefault(q.formula, []).append(label)
    return [(formula, "; ".join(labels)) for formula, labels in by_formula.items()]


def _symbols_section() -> list[str]:
    lines = ["## Inputs", "",
             "Every formula is written over these inputs and earlier quantities. Global inputs come "
             "from the config, stage inputs from the pipeline split, rank inputs from the process "
             "groups and `cluster.gpus_per_node` (node-major placement: rank r is on node "
             "r // gpus_per_node).", ""]
    for level, title in LEVEL_TITLES.items():
        lines += [f"### {title}", "", "| input | meaning |", "|---|---|"]
        lines += [f"| {code(s.name)} | {cell(s.doc)} |" for s in ALL_SYMBOLS if s.level == level]
        lines.append("")
    return lines


def _pipeline_section() -> list[str]:
    """The pipeline page (planner/budget/pipeline.py): stage 2 of the baseline's PP 8."""
    lines = ["## Pipeline step (`moeplan estimate`, across stages)", "",
             "Evaluated after the time page on every stage, over the other stages' chunk times: "
             "`t_first_j` / `t_last_j` is `time_microbatch_s` of stage j's first / last model "
             "chunk alone (its whole microbatch without interleaving). Shown for stage 2 of PP 8; "
             "the sums run over the stages before and after the one evaluated.", "",
             "| quantity | unit | formula | meaning |", "|---|---|---|---|"]
    lines += [f"| {code(q.name)} | {q.unit} | {code(pretty(q.formula))} | {cell(q.doc)} |"
              for q in pipeline_page(8, 2, False)]
    return [*lines, ""]


def formulas_page() -> str:
    baseline, others = _books()
    base_names = {q.name: q for q in baseline}
    quantities = _ordered_quantities(baseline, others)
    lines = [
        GENERATED_NOTE.format(what="planner/accounting*.py"),
        "# Budget formulas",
        "",
        "Every number `moeplan budget` prints is one of these named formulas, evaluated exactly "
        "(integers and fractions, never floats). `moeplan budget CONFIG --explain` shows each as "
        "formula → substitution → value. What the budgets count and leave out is explained in "
        "[budgets.md](budgets.md).",
        "",
        "The formulas depend on a few structural choices of the config. This page shows the "
        "formula book of the bundled DeepSeek-V4-Pro layout (1,024 GPUs, TP1 CP2 PP8 EP64 ETP1, "
        "AlltoAll dispatcher, dropless, distributed optimizer with Adam, bf16, full uniform "
        "recompute, mHC, expert bias, `seq_aux_loss`). Under a quantity, *when …* rows give the "
        "formula it takes instead when one choice differs; a quantity marked *only when …* "
        "does not exist in the baseline. In formulas `·` is multiplication, `/` exact division.",
        "",
        *_symbols_section(),
    ]
    for category, title in CATEGORY_TITLES.items():
        rows = [q for q in quantities if q.category == category]
        if not rows:
            continue
        lines += [f"## {title}", "", "| quantity | unit | formula | meaning |", "|---|---|---|---|"]
        for q in rows:
            base = base_names.get(q.name)
            alternatives = _alternatives(q.name, base.formula if base else None, others)
            if base is None:
                formula, labels = alternatives[0]
                lines.append(f"| {code(q.name)} | {q.unit} | *only when {labels}:* "
                             f"{code(pretty(formula))} | {cell(q.doc)} |")
                alternatives = alternatives[1:]
            else:
                lines.append(f"| {code(q.name)} | {q.unit} | {code(pretty(base.formula))} | "
                             f"{cell(q.doc)} |")
            lines += [f"| | | *when {labels}:* {code(pretty(formula))} | |"
                      for formula, labels in alternatives]
        lines.append("")
    lines += _pipeline_section()
    uncovered = [q.name for q in quantities if q.category not in CATEGORY_TITLES]
    if uncovered:
        raise ValueError(f"quantities without a docs category: {', '.join(uncovered)}")
    return "\n".join(lines).rstrip("\n") + "\n"

"""Page 4, what trains: frozen parameter groups and LoRA adapters.

Megatron's DDP builds its param and grad buffers from the parameters that require grad
(Megatron-LM dev@d48bd6be megatron/core/distributed/distributed_data_parallel.py
DistributedDataParallel.__init__ skips `not param.requires_grad`), and the optimizer holds states
only for those; a frozen parameter stays on the GPU as a plain tensor in training precision. So a
frozen group (`training.freeze`: "dense", every parameter outside the routed experts; "experts",
the routed experts) keeps its weights and loses its main grads and optimizer states.

LoRA (`training.lora`) freezes the whole base and adds, as Megatron-Bridge's PEFT builds them
(src/megatron/bridge/peft/utils.py get_adapter_attributes_from_linear, ParallelLinearAdapter), an
adapter of `dim` r to each targeted linear: linear_in [r, in] and linear_out [out, r] over the
base's full in/out features, both split over the base's TP group (column-parallel base: linear_in
column-parallel with gathered output, linear_out column-parallel; row-parallel base: linear_in
row-parallel, linear_out column-parallel with gathered output), so r·(in + out)/TP parameters a
rank. A grouped-GEMM expert linear gets one adapter shared by the layer's experts (split over
ETP, its grads summed over EP: ParallelLinearAdapter._uses_grouped_expert_sharding); a sequential
expert one per local expert. linear_qkv exists only in standard attention (MLA names its
projections otherwise); DeepSeek-V4's grouped output projection is no LoRA target moeplan counts.

Not counted: the adapters' r-wide intermediate activations (under r/h of one stored hidden per
adapter), and that a frozen linear no longer needs its input for a weight gradient (the stored
activations are those of full training: an upper bound).
"""

from __future__ import annotations

from planner.budget.expr import Book
from planner.budget.variant import Variant


def _mats(v: Variant) -> str:
    return "2" if v.swiglu else "1"


def _lora_terms(v: Variant) -> tuple[list[str], list[str], list[str], list[str]]:
    """Adapter parameters a rank holds per attention block, MoE layer (shared expert), dense MLP
    layer and MoE layer (routed experts)."""
    m, r = _mats(v), "lora_rank"
    attention, shared, dense, routed = [], [], [], []
    # (DeepSeek-V4 attention with linear_qkv / linear_proj targets is refused by the schema:
    # planner/config/schema.py Config._lora_targets_counted)
    if "linear_qkv" in v.lora and v.attention == "standard":
        attention.append(f"{r} * (h + (heads + 2 * groups) * d) / TP")
    if "linear_proj" in v.lora:
        width = "heads * d_v" if v.attention == "mla" else "heads * d"
        attention.append(f"{r} * ({width} + h) / TP")
    w = "h_moe" if v.latent else "h"
    if "linear_fc1" in v.lora:
        shared.append(f"Min(I_s, 1) * {r} * (h + {m} * I_s) / TP")
        dense.append(f"{r} * (h + {m} * f) / TP")
        routed.append(f"{r} * ({w} + {m} * I) / ETP")
    if "linear_fc2" in v.lora:
        shared.append(f"Min(I_s, 1) * {r} * (I_s + h) / TP")
        dense.append(f"{r} * (f + h) / TP")
        routed.append(f"{r} * (I + {w}) / ETP")
    return attention, shared, dense, routed


def trainable(book: Book, v: Variant) -> tuple[str, str]:
    """The dense and expert parameters that require grad (what the DDP buffers hold), adding the
    frozen bytes' quantity; the plain counts when everything trains."""
    add = book.add
    frozen_tower, trained_tower = _tower(book, v)
    if v.lora:
        attention, shared, dense, routed = (" + ".join(t) or "0" for t in _lora_terms(v))
        experts = "1" if v.grouped_gemm else "E / EP"
        add("lora_dense_params", f"blocks * ({attention}) + moe_layers * ({shared})"
            f" + L_dense * ({dense})", "params", "memory",
            "LoRA adapters on the dense linears of the rank: r·(in + out)/TP each (attention "
            "blocks, shared experts, dense MLPs)")
        add("lora_expert_params", f"moe_layers * {experts} * ({routed})", "params", "memory",
            "LoRA adapters on the routed experts' linears: "
            + ("one shared by the layer's grouped experts" if v.grouped_gemm else
               "one per local expert") + ", r·(in + out)/ETP each")
        add("frozen_params_on_rank", " + ".join(["params_on_rank", *frozen_tower]), "params",
            "memory", "LoRA: the whole base model is frozen (weights kept, no grads or optimizer "
            "states)" + ("; and the encoder tower's frozen part" if frozen_tower else ""))
        return " + ".join(["lora_dense_params", *trained_tower]), "lora_expert_params"
    dense = "0" if "dense" in v.freeze else "dense_params_on_rank"
    expert = "0" if "experts" in v.freeze else "expert_params_on_rank"
    frozen = [part for part, name in (("dense_params_on_rank", "dense"),
                                       ("expert_params_on_rank", "experts")) if name in v.freeze]
    what = [f"training.freeze {', '.join(sorted(v.freeze))}"] if v.freeze else []
    what += ["the encoder tower's frozen part"] if frozen_tower else []
    add("frozen_params_on_rank", " + ".join([*frozen, *frozen_tower]) or "0", "params", "memory",
        f"{' and '.join(what) or 'nothing'}: weights kept, no grads or optimizer states")
    return " + ".join([*([dense] if dense != "0" else []), *trained_tower]) or "0", expert


def _tower(book: Book, v: Variant) -> tuple[list[str], list[str]]:
    """The encoder tower's frozen and trained parameters a rank holds, as term names (none
    without a tower). Megatron-Bridge builds the tower on the first pipeline stage only, its
    linears split over TP (Qwen3VLModel: TE column/row-parallel linears from the language model's
    TP); its norms, biases and patch and position embeddings, held whole by every TP rank, are
    counted split too (under 1 % of Qwen3-VL's tower). The trained part joins the dense grad
    buffer (reduced over dp_cp with the decoder's dense parameters)."""
    if not v.tower:
        return [], []
    book.add("frozen_tower_params_on_rank", "is_first_stage * tower_params / TP", "params", "memory",
             "the encoder tower's frozen parameters (training.frozen_tower_params) on the first "
             "stage, split over TP: weights only")
    book.add("trained_tower_params_on_rank", "is_first_stage * tower_trained_params / TP", "params",
             "memory", "the encoder tower's trained parameters (training.trained_tower_params) on "
             "the first stage, split over TP: weights, main grads and optimizer states")
    return ["frozen_tower_params_on_rank"], ["trained_tower_params_on_rank"]

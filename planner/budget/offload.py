"""Fine-grained activation offloading on the memory page: which offload groups a layer
runs, the bytes each one moves to pinned host memory, and what stays on the GPU.

Megatron-LM dev@d48bd6be: each named module's forward runs inside an offload group
(megatron/core/pipeline_parallel/fine_grained_activation_offload.py, FineGrainedActivationOffloading
Interface / ChunkOffloadHandler), and every tensor autograd saves inside the group that has at
least min_offloaded_tensor_size elements (ChunkOffloadHandler.tensor_need_offloading_checker) is
copied to the host after the group and released on the GPU; backward reloads it. The groups of one
layer, in forward order, and the saved tensors they hold (megatron/core/transformer/attention.py
SelfAttention; multi_latent_attention.py MLASelfAttention.forward; moe/experts.py TEGroupedMLP.
forward):
* attn_norm: the input layernorm's input. Under Transformer Engine's standard-attention spec the
  norm is fused into linear_qkv (TELayerNormColumnParallelLinear; input_layernorm is IdentityOp,
  megatron/core/models/gpt/gpt_layer_specs.py), and TransformerLayer._set_offload_modules turns
  the group off: 0 bytes. MLA's spec keeps a separate TENorm.
* qkv_linear: everything the QKV projections save: standard, linear_qkv's input and its norm's
  output (and the q/k norms' inputs); MLA, the down projections' input (the norm output) and the
  low-rank norms' and up projections' inputs.
* core_attn: q, k, v and the fp32 softmax statistics. Flash attention saves its output here too,
  so the group copies it to the host, but linear_proj keeps the same tensor: it leaves the GPU only
  with attn_proj.
* attn_proj: the core-attention output linear_proj saves (freed by attn_proj's group).
* mlp_norm: the pre-MLP norm's input, on MoE layers only (dense layers fuse it into linear_fc1:
  IdentityOp, off).
* expert_fc1: the grouped FC1's input rows (set_save_original_input).
* moe_act: the activation's saved FC1 output and the permuted probabilities (FC2's input stays).
"""

from __future__ import annotations

from planner.budget.expr import Book
from planner.budget.variant import Variant, routed_width
from planner.config.offload_groups import ATTENTION_GROUPS, MOE_GROUPS


def _offloaded(numel: str, nbytes: str) -> str:
    """A tensor's bytes if it reaches min_offloaded_tensor_size elements (smaller ones stay)."""
    return f"Min(1, floor(({numel}) / Max(min_offloaded, 1))) * {nbytes}"


def _tensors(terms: list[tuple[str, str]]) -> str:
    """Sum of the offloaded bytes of (elements, bytes per element) tensors."""
    return " + ".join(_offloaded(n, f"({n}) * {b}") for n, b in terms) if terms else "0"


def _attention_tensors(v: Variant) -> dict[str, tuple[list[tuple[str, str]], str]]:
    """Per attention group: its released tensors (elements per microbatch, bytes per element), and
    the bytes it copies to the host beyond them (core_attn's copy of the output)."""
    t, mods = "tokens_per_rank", v.recompute_modules
    norm_out = [] if "layernorm" in mods else [(f"{t} * h", "p")]
    lse = (f"{t} * heads", "4")
    if "core_attn" in mods:  # checkpointed core attention runs outside the core_attn group
        core: tuple[list[tuple[str, str]], str] = ([], "0")
    elif v.attn_scores and v.attention in ("standard", "mla"):
        core = _unfused_core(v, t, mods)
    elif v.attention == "standard":
        core = ([(f"{t} * heads * d", "p"), (f"{t} * groups * d", "p"), (f"{t} * groups * d", "p"), lse],
                _offloaded(f"{t} * heads * d", f"{t} * heads * d * p"))
    else:
        qkv = [] if "mla_up_proj" in mods else [(f"{t} * heads * (d_qk + qk_rope)", "p"),
                                                 (f"{t} * heads * (d_qk + qk_rope)", "p"),
                                                 (f"{t} * heads * d_v", "p")]
        core = ([*qkv, lse], _offloaded(f"{t} * heads * d_v", f"{t} * heads * d_v * p"))
    if v.attention == "standard":
        qk_norm = [(f"{t} * heads * d", "p"), (f"{t} * groups * d", "p")] if v.qk_norm else []
        return {
            "qkv_linear": ([(f"{t} * h", "p"), *norm_out, *qk_norm], "0"),
            "core_attn": core,
            "attn_proj": ([(f"{t} * heads * d", "p")], "0"),
        }
    low_rank = ([(f"{t} * q_lora", "p"), (f"{t} * q_lora", "p"), (f"{t} * (kv_lora + qk_rope)", "p"),
                 (f"{t} * (kv_lora + qk_rope)", "p")] if v.mla_norms
                else [(f"{t} * q_lora", "p"), (f"{t} * (kv_lora + qk_rope)", "p")])
    return {
        "attn_norm": ([(f"{t} * h", "p")], "0"),
        "qkv_linear": ([*norm_out, *low_rank], "0"),
        "core_attn": core,
        "attn_proj": ([(f"{t} * heads * d_v", "p")], "0"),
    }


def _unfused_core(v: Variant, t: str, mods: frozenset[str]) -> tuple[list[tuple[str, str]], str]:
    """The core_attn group under unfused attention (Megatron-LM dev@d48bd6be
    megatron/core/transformer/dot_product_attention.py DotProductAttention.forward): torch.baddbmm
    saves q and k (k and v repeated to every head under GQA), the fused softmax its output
    (fused_softmax.py ScaledUpperTriangMaskedSoftmax), torch.bmm the probabilities again and v;
    attention dropout its mask and the dropped copy, which bmm saves instead. No softmax statistics
    and no output are saved. Each save is its own tag in the group (ChunkOffloadHandler.tensor_push
    keeps no identity check), so without dropout the probabilities are copied to the host twice:
    the second copy is the group's bytes beyond what it releases."""
    if v.attention == "standard":
        qkv = [(f"{t} * heads * d", "p")] * 3
    else:
        qkv = [] if "mla_up_proj" in mods else [(f"{t} * heads * (d_qk + qk_rope)", "p"),
                                                 (f"{t} * heads * (d_qk + qk_rope)", "p"),
                                                 (f"{t} * heads * d_v", "p")]
    scores = "attn_score_elements"
    if v.attention_dropout:
        return [*qkv, (scores, "p"), (scores, "1"), (scores, "p")], "0"
    return [*qkv, (scores, "p")], _offloaded(scores, f"{scores} * p")


def _moe_tensors(v: Variant) -> dict[str, list[tuple[str, str]]]:
    rows = "gemm_rows_padded" if v.quant_pad else "expert_gemm_rows"
    fc1 = "2 * I / ETP" if v.swiglu else "I / ETP"
    return {
        "mlp_norm": [("tokens_per_rank * h", "p")],
        "expert_fc1": [(f"{rows} * {routed_width(v)}", "p")],
        "moe_act": [(f"{rows} * {fc1}", "p"), (rows, "p")],
    }


def write_offload(book: Book, v: Variant) -> str:
    """Add the offload formulas; returns what one microbatch's stored layers lose to the host."""
    add, names = book.add, v.offload
    attention = {n: parts for n, parts in _attention_tensors(v).items() if n in names}
    moe = {n: parts for n, parts in _moe_tensors(v).items() if n in names}
    order = [n for n in (*ATTENTION_GROUPS, *MOE_GROUPS) if n in attention or n in moe]
    for name in order:
        tensors = attention[name][0] if name in attention else moe[name]
        where = "softmax-attention block" if name in attention else "MoE layer"
        add(f"offload_{name}_bytes", _tensors(tensors), "bytes", "memory",
            f"per microbatch and {where}: the tensors the {name} offload group releases on the GPU "
            "(each one of at least min_offloaded_tensor_size elements; expert rows at their "
            "expected count, which routing decides at run time)")
    attn_sum = " + ".join(f"offload_{n}_bytes" for n in attention) or "0"
    moe_sum = " + ".join(f"offload_{n}_bytes" for n in moe) or "0"
    # The chunk's last layer, whose groups the fraction keeps first: a MoE layer when the chunk has
    # one (first-k-dense patterns put the dense layers first), else a dense block.
    last_moe = "Min(1, moe_layers)"
    on = {n: f"Min(1, ceiling(offload_{n}_bytes))" if n in attention
          else f"{last_moe} * Min(1, ceiling(offload_{n}_bytes))" for n in order}
    add("offload_layer_bytes", f"{attn_sum} + {last_moe} * ({moe_sum})", "bytes", "memory",
        "per microbatch: what the offload groups of a chunk's last layer release (a MoE layer when "
        "the chunk has one)")
    add("offload_groups_per_layer", " + ".join(on.values()), "count", "memory",
        "offload groups with bytes to move in that layer (a group with none is not eligible)")
    attn_groups = " + ".join(on[n] for n in attention) or "0"
    moe_groups = " + ".join(f"Min(1, ceiling(offload_{n}_bytes))" for n in moe) or "0"
    add("offload_eligible_groups", f"blocks * ({attn_groups}) + moe_layers * ({moe_groups})",
        "count", "memory", "per chunk pass: the eligible offload groups (attention groups on every "
        "block, MoE groups on MoE layers)")
    add("offload_groups_kept", "floor(offload_eligible_groups * offload_keep_share)", "count",
        "memory", "per chunk pass: int(eligible · (1 − activation_offload_fraction)) groups stay on "
        "the GPU, the last ones forward runs (PipelineOffloadManager.post_warmup_callback)")
    # The kept tail, counted from the chunk's last layer backwards: whole layers, then the last
    # (kept mod groups_per_layer) groups of one more layer in forward order.
    tail_layers = "floor(offload_groups_kept / Max(offload_groups_per_layer, 1))"
    rest = f"(offload_groups_kept - {tail_layers} * offload_groups_per_layer)"
    partial = []
    for i, name in enumerate(order):
        later = " + ".join(on[n] for n in order[i + 1:]) or "0"
        partial.append(f"Min(1, Max(0, {rest} - ({later}))) * {on[name]} * offload_{name}_bytes")
    released = f"blocks * ({attn_sum}) + moe_layers * ({moe_sum})"
    add("offload_kept_tail_bytes", f"Min({tail_layers} * offload_layer_bytes + "
        + " + ".join(partial) + f", {released})",
        "bytes", "memory", "per chunk pass: the bytes of the groups activation_offload_fraction keeps "
        "on the GPU (whole last layers, then the last groups of the layer before them); exact when "
        "those layers are all like the chunk's last layer, as under first-k-dense patterns")
    add("act_offloaded_per_microbatch", f"{released} - offload_kept_tail_bytes", "bytes", "memory",
        "per microbatch: the stored activations the offload groups move to the host in steady state "
        "(the warm-up iteration offloads every group; MEM001 judges the steady-state peak)")
    copy = [n for n in attention if attention[n][1] != "0"]
    for name in copy:
        add(f"offload_{name}_host_copy", attention[name][1], "bytes", "memory",
            "per microbatch and block: core attention's output, which flash attention saves in "
            "the core_attn group (copied to the host) while linear_proj keeps it on the GPU")
    add("offload_host_per_microbatch", "act_offloaded_per_microbatch"
        + "".join(f" + blocks * offload_{n}_host_copy" for n in copy), "bytes", "memory",
        "per microbatch: the bytes one microbatch's offload groups copy to pinned host memory (an "
        "upper bound: core attention's output copy counted on every block)")
    return "act_offloaded_per_microbatch"


def write_offload_peak(book: Book) -> str:
    """The stage-level offload terms, after in_flight_microbatches; returns the GPU-side addend."""
    add = book.add
    add("act_offload_kept_bytes", "Min(2 * offload_layer_bytes + s * offload_delta_bytes"
        " + Min(1, s * offload_delta_bytes) * offload_layer_bytes,"
        " ceiling(in_flight_microbatches * act_offloaded_per_microbatch))",
        "bytes", "memory",
        "offloaded bytes on the GPU at the peak all the same: the last group of each name of the "
        "first chunk run backward (post_warmup_callback's margin; the last stage's should_bulk_offload"
        " keeps the same), one layer reloaded ahead in backward (bulk_reload / "
        "pre_reload_last_layer), and pp_rank · delta_offload_bytes_across_pp_ranks (whole groups, "
        "so at most one group over: counted as one layer), each an upper bound. Copies in flight are "
        "taken as finished: a released tensor's memory returns when its D2H copy ends (record_stream), "
        "which this assumes keeps pace with compute; fine_grained_offloading_max_inflight_offloads "
        "makes compute wait beyond that many pending copies per name, and unset nothing bounds them")
    add("host_activation_bytes", "ceiling(in_flight_microbatches * offload_host_per_microbatch)", "bytes",
        "memory", "pinned host memory the offloaded activations take at the peak, per rank (whole-"
        "stage counts: an upper bound that includes the groups kept on the GPU)")
    return "act_offload_kept_bytes"

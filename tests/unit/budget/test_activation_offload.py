"""Fine-grained activation offloading (issue 22): the settings by Megatron's names, what Megatron
asserts of them, the bytes that leave the GPU and the host memory they take. Each test names the
Megatron-LM dev@d48bd6be source it follows; expected numbers are derived by hand here from the
module shapes, never read back from the product."""

from __future__ import annotations

from typing import Any

import pytest

from planner.accounting import budgets
from planner.config.loader import InvalidConfig
from planner.emit.megatron import megatron_arguments
from planner.rules import run_rules
from planner.rules.memory import _activation_levers
from tests.support.launch_arguments import build, imported, stage0
from tests.support.megatron_judge import case_of, register, verdict
from tests.support.megatron_lines import megatron_line

TRANSFORMER_CONFIG = "core/transformer/transformer_config.py"
OFFLOAD = "core/pipeline_parallel/fine_grained_activation_offload.py"
EVERY = ["qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"]

# (path under megatron/, line at dev@d48bd6be, text on that line, function) — every line a test
# below relies on.
CITED_LINES = [
    (TRANSFORMER_CONFIG, 2407, "assert self.offload_modules is not None and len(self.offload_modules) > 0",
     "__post_init__"),
    (TRANSFORMER_CONFIG, 2418, "invalid_modules = set(self.offload_modules) - allowed_modules",
     "__post_init__"),
    (TRANSFORMER_CONFIG, 2423,
     'if "attn_proj" in self.offload_modules and "core_attn" not in self.offload_modules:', "__post_init__"),
    (TRANSFORMER_CONFIG, 2429,
     'if self.recompute_granularity == "selective" and "moe" in self.recompute_modules:', "__post_init__"),
    (TRANSFORMER_CONFIG, 2326, '_MHC_CONFLICTING_OFFLOAD_MODULES = {"attn_norm", "mlp_norm"}',
     "__post_init__"),
    (TRANSFORMER_CONFIG, 2441, "self.min_offloaded_tensor_size >= 0", "__post_init__"),
    (TRANSFORMER_CONFIG, 2444,
     "self.activation_offload_fraction >= 0 and self.activation_offload_fraction <= 1", "__post_init__"),
    (TRANSFORMER_CONFIG, 2447, "self.delta_offload_bytes_across_pp_ranks >= 0", "__post_init__"),
    (TRANSFORMER_CONFIG, 2451, "self.fine_grained_offloading_max_inflight_offloads >= 0", "__post_init__"),
    (TRANSFORMER_CONFIG, 2454, "if not self.use_transformer_engine_op_fuser:", "__post_init__"),
    ("training/arguments.py", 2132, 'os.getenv("NVTE_CPU_OFFLOAD_V1", "0") == "1"', "validate_args"),
    (OFFLOAD, 598, "keep_on_gpu_bytes = self._pp_rank * self._delta_offload_bytes_across_pp_ranks",
     "PipelineOffloadManager.post_warmup_callback"),
    (OFFLOAD, 617, "offloaded_groups_count * (1 - self._activation_offload_fraction)",
     "PipelineOffloadManager.post_warmup_callback"),
    (OFFLOAD, 993, "if tensor.numel() < self.min_offloaded_tensor_size:",
     "ChunkOffloadHandler.tensor_need_offloading_checker"),
    ("core/transformer/transformer_layer.py", 1798,
     'self.offload_attn_norm = "attn_norm" in self.config.offload_modules and not isinstance(',
     "TransformerLayer._set_offload_modules"),
    ("core/models/gpt/gpt_layer_specs.py", 336, "linear_qkv=backend.column_parallel_layer_norm_linear(),",
     "get_gpt_layer_with_transformer_engine_submodules"),
    ("core/transformer/attention.py", 1634,
     'self.offload_core_attention and self.training, query, "core_attn"', "SelfAttention.forward"),
    ("core/transformer/attention.py", 1717,
     'attn_proj_manager = off_interface(self.offload_attn_proj, core_attn_out, "attn_proj")',
     "SelfAttention.forward"),
    ("core/transformer/moe/experts.py", 788,
     'self.offload_expert_fc1, permuted_local_hidden_states, "expert_fc1"', "TEGroupedMLP.forward"),
    ("core/transformer/moe/experts.py", 800,
     'moe_act_manager = off_interface(self.offload_moe_act, fc1_output, "moe_act")', "TEGroupedMLP.forward"),
]


@pytest.mark.parametrize(("path", "line", "text", "function"), CITED_LINES)
def test_cited_megatron_line_says_what_the_test_claims(path: str, line: int, text: str, function: str):
    assert text in megatron_line(path, line), f"megatron/{path}:{line} ({function})"


def offloading(modules: list[str] | None = None, model: dict[str, Any] | None = None, **overlap: Any):
    return build(model, overlap={"fine_grained_activation_offloading": True,
                                 "offload_modules": modules or EVERY, **overlap})


# ------------------------------------------------------------------------ the bytes, by hand
# The small config of test_launch_script_arguments: h 64, 4 heads of d 16 (4 query groups), top-2 of
# 4 experts of 32 over EP 2, SwiGLU, bf16 (p = 2), seq 32, mbs 1, no TP/CP: 32 tokens per rank and,
# with 2 experts a rank, 32 · 2 = 64 expected expert rows.
T, P, ROWS = 32, 2, 64
QKV_LINEAR = 2 * T * 64 * P  # linear_qkv's input and its fused norm's output: 8192
CORE_ATTN = 3 * T * 4 * 16 * P + T * 4 * 4  # q, k, v, and the fp32 softmax statistics: 12800
ATTN_PROJ = T * 4 * 16 * P  # the core-attention output linear_proj saves: 4096
MLP_NORM = T * 64 * P  # the pre-MLP norm's input: 4096
EXPERT_FC1 = ROWS * 64 * P  # the grouped FC1's input rows: 8192
MOE_ACT = ROWS * 2 * 32 * P + ROWS * P  # the SwiGLU's FC1 output [rows, 2 · 32] and the probs: 8320
LAYER = QKV_LINEAR + CORE_ATTN + ATTN_PROJ + MLP_NORM + EXPERT_FC1 + MOE_ACT  # 45696


def test_each_group_releases_its_saved_tensors():
    """attention.py SelfAttention.forward / moe/experts.py TEGroupedMLP.forward: the tensors
    autograd saves inside each group; with min_offloaded_tensor_size 0 every one of them moves."""
    v = stage0(offloading(min_offloaded_tensor_size=0))
    assert (v["offload_qkv_linear_bytes"], v["offload_core_attn_bytes"], v["offload_attn_proj_bytes"],
            v["offload_mlp_norm_bytes"], v["offload_expert_fc1_bytes"], v["offload_moe_act_bytes"]) == (
        QKV_LINEAR, CORE_ATTN, ATTN_PROJ, MLP_NORM, EXPERT_FC1, MOE_ACT)
    # both layers offload everything: 2 · 45696 leave the stored activations of the microbatch
    assert v["act_offloaded_per_microbatch"] == 2 * LAYER
    plain = stage0(build())
    assert v["act_stored_layers"] == plain["act_stored_layers"] - 2 * LAYER
    # one microbatch in flight; the margin (one layer) and the reloaded layer would stay, but the two
    # layers offloaded are all there is: everything comes back, the peak is the plain one
    assert v["act_offload_kept_bytes"] == 2 * LAYER
    assert v["activation_bytes"] == plain["activation_bytes"]
    # the host gets the released bytes plus core_attn's copy of the output on both blocks
    assert v["host_activation_bytes"] == 2 * LAYER + 2 * ATTN_PROJ


def test_small_tensors_stay_on_the_gpu():
    """ChunkOffloadHandler.tensor_need_offloading_checker: a tensor under min_offloaded_tensor_size
    elements is not offloaded. At 2048 the [32, 64] norm tensors (2048 elements) go, the fp32
    softmax statistics (32 · 4 = 128) and the probs (64) stay; at Megatron's default (1 Mi) nothing
    of this small model moves."""
    v = stage0(offloading(min_offloaded_tensor_size=2048))
    assert v["offload_core_attn_bytes"] == 3 * T * 4 * 16 * P
    assert v["offload_moe_act_bytes"] == ROWS * 2 * 32 * P
    assert stage0(offloading())["act_offloaded_per_microbatch"] == 0


@pytest.mark.parametrize(("fraction", "kept"), [
    # 4 layers · 6 groups = 24 eligible; int(24 · 0.5) = 12 kept: the last two layers
    (0.5, 2 * LAYER),
    # int(24 · 0.4) = 9 kept: the last layer, then that layer's predecessor's last three groups
    (0.6, LAYER + MLP_NORM + EXPERT_FC1 + MOE_ACT),
    # int(24 · 0.1) = 2 kept: the last layer's expert_fc1 and moe_act
    (0.9, EXPERT_FC1 + MOE_ACT),
])
def test_the_fraction_keeps_the_last_forward_groups(fraction: float, kept: int):
    """PipelineOffloadManager.post_warmup_callback: int(eligible · (1 − fraction)) groups of each
    chunk stay on the GPU, taken from the last groups forward ran."""
    v = stage0(offloading(model={"num_layers": 4}, min_offloaded_tensor_size=0,
                          activation_offload_fraction=fraction))
    assert v["offload_kept_tail_bytes"] == kept
    assert v["act_offloaded_per_microbatch"] == 4 * LAYER - kept


def test_the_fraction_is_taken_in_floating_point():
    """Megatron computes int(eligible · (1 − fraction)) in floats: 5 layers · 2 groups = 10 eligible
    and 10 · (1 − 0.9) = 0.9999999999999998, so no group stays (exact arithmetic would keep one)."""
    v = stage0(offloading(["expert_fc1", "moe_act"], model={"num_layers": 5}, min_offloaded_tensor_size=0,
                          activation_offload_fraction=0.9))
    assert v["offload_eligible_groups"] == 10 and v["offload_groups_kept"] == 0


def test_the_pipeline_delta_and_the_margin_stay_on_the_gpu():
    """post_warmup_callback: pipeline rank r keeps r · delta_offload_bytes_across_pp_ranks (whole
    groups, so up to one more group: counted as a layer), besides the last group of each name (one
    layer) and the layer bulk_reload fetches ahead. 8 layers over PP 2: stage 1 (r = 1) holds 4
    layers and one microbatch in flight (1F1B: PP − r), so 4 · 45696 are offloaded."""
    cfg = build({"num_layers": 8}, parallel={"world_size": 4, "pp": 2, "ep": 2},
                training={"global_batch_size": 4},
                overlap={"fine_grained_activation_offloading": True, "offload_modules": EVERY,
                         "min_offloaded_tensor_size": 0, "delta_offload_bytes_across_pp_ranks": 1000})
    last = {b.name: b.value for b in budgets(cfg) if b.stage in (None, 1)}
    assert last["in_flight_microbatches"] == 1
    assert last["act_offloaded_per_microbatch"] == 4 * LAYER
    assert last["act_offload_kept_bytes"] == 2 * LAYER + 1 * 1000 + LAYER


def test_attn_norm_is_fused_away_under_standard_attention():
    """TransformerLayer._set_offload_modules turns attn_norm off where input_layernorm is IdentityOp:
    the standard attention spec fuses it into linear_qkv (gpt_layer_specs.py)."""
    v = stage0(offloading(["attn_norm", "expert_fc1"], min_offloaded_tensor_size=0))
    assert "offload_attn_norm_bytes" not in v
    assert v["act_offloaded_per_microbatch"] == 2 * EXPERT_FC1


# ------------------------------------------------------------------- Megatron's assertions
@pytest.mark.parametrize(("overlap", "message"), [  # the line of transformer_config.py each follows
    ({"offload_modules": []}, "needs overlap.offload_modules"),  # 2407
    ({"offload_modules": ["mlp"]}, "offload_modules"),  # 2418, the allowed names
    ({"offload_modules": ["attn_proj"]}, "attn_proj without core_attn"),  # 2423
    ({"offload_modules": ["moe_act"], "recompute_granularity": "selective", "recompute_modules": ["moe"]},
     "recomputed whole"),  # 2429
    ({"offload_modules": ["mlp_norm"], "recompute_granularity": "selective", "recompute_modules": ["mhc"]},
     "refuses them together"),  # 2326
    ({"offload_modules": ["moe_act"], "min_offloaded_tensor_size": -1}, "min_offloaded_tensor_size"),  # 2441
    ({"offload_modules": ["moe_act"], "activation_offload_fraction": 1.5}, "activation_offload_fraction"),
    ({"offload_modules": ["moe_act"], "delta_offload_bytes_across_pp_ranks": -1}, "delta_offload"),  # 2447
    ({"offload_modules": ["moe_act"], "fine_grained_offloading_max_inflight_offloads": -1},
     "max_inflight"),  # 2451
    ({"offload_modules": ["fused_group_mlp"]}, "use_transformer_engine_op_fuser"),  # 2454
])
def test_megatrons_offload_assertions(overlap: dict[str, Any], message: str):
    """transformer_config.py TransformerConfig.__post_init__, the fine_grained_activation_offloading
    block (the lines CITED_LINES names)."""
    with pytest.raises(InvalidConfig, match=message):
        build(overlap={"fine_grained_activation_offloading": True, **overlap})


@pytest.mark.parametrize(("overlap", "model"), [
    ({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}, {}),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["attn"]}, {}),
    ({}, {"attention_output_gate": True}),
])
def test_what_moeplan_cannot_count_is_refused(overlap: dict[str, Any], model: dict[str, Any]):
    """OFL001: the memory verdict is refused rather than guessed."""
    cfg = offloading(["core_attn", "expert_fc1"], model=model, **overlap)
    assert "OFL001" in {f.code for f in run_rules(cfg)}
    assert "OFL001" not in {f.code for f in run_rules(offloading(["core_attn", "expert_fc1"]))}


def test_the_step_time_says_it_prices_no_host_offload():
    """OFL002 (warning): the time page has no host link and no CPU optimizer, so either offload
    makes the estimate a lower bound, and the finding names the offload."""
    def ofl002(cfg: Any) -> list[str]:
        return [f.message for f in run_rules(cfg) if f.code == "OFL002"]

    [activations] = ofl002(offloading(["expert_fc1"]))
    assert "fine-grained activation offloading" in activations
    optimizer = build(training={"use_precision_aware_optimizer": True, "optimizer_cpu_offload": True,
                                "optimizer_offload_fraction": 0.5})
    [states] = ofl002(optimizer)
    assert "optimizer CPU offload (0.5 of the optimizer step" in states
    assert ofl002(build()) == []


# --------------------------------------------------------------------------- import and emit
def test_offload_arguments_import_and_emit_back():
    """megatron/training/arguments.py builds these flags from TransformerConfig's fields; emit
    writes each one that differs from Megatron's default, and exports NVTE_CPU_OFFLOAD_V1=1
    (validate_args asserts it with Transformer Engine >= 2.10)."""
    words = ("--fine-grained-activation-offloading --offload-modules core_attn attn_proj expert_fc1 "
             "--activation-offload-fraction 0.5 --min-offloaded-tensor-size 4096 "
             "--delta-offload-bytes-across-pp-ranks 1024 --fine-grained-offloading-max-inflight-offloads 2")
    overlap = imported(words)["overlap"]
    assert overlap == {"fine_grained_activation_offloading": True,
                       "offload_modules": ["core_attn", "attn_proj", "expert_fc1"],
                       "activation_offload_fraction": 0.5, "min_offloaded_tensor_size": 4096,
                       "delta_offload_bytes_across_pp_ranks": 1024,
                       "fine_grained_offloading_max_inflight_offloads": 2}
    args = megatron_arguments(build(overlap=overlap))
    flags = args.as_dict()
    assert flags["--fine-grained-activation-offloading"] == ()
    assert flags["--offload-modules"] == ("core_attn", "attn_proj", "expert_fc1")
    assert flags["--activation-offload-fraction"] == ("0.5",)
    assert flags["--min-offloaded-tensor-size"] == ("4096",)
    assert flags["--delta-offload-bytes-across-pp-ranks"] == ("1024",)
    assert flags["--fine-grained-offloading-max-inflight-offloads"] == ("2",)
    assert args.env["NVTE_CPU_OFFLOAD_V1"] == "1"
    written = " ".join(f"{flag} {' '.join(values)}" for flag, values in flags.items() if "offload" in flag)
    assert imported(written)["overlap"] == overlap  # the emitted flags read back to the same fields
    defaults = megatron_arguments(build(overlap={"fine_grained_activation_offloading": True,
                                                 "offload_modules": ["expert_fc1"]})).as_dict()
    assert not {"--activation-offload-fraction", "--min-offloaded-tensor-size"} & set(defaults)


# ------------------------------------------------------------------------------- the oracle
ORACLE_OFFLOAD = "activation offloading: modules, fraction, size threshold, PP delta, in-flight cap"
register(ORACLE_OFFLOAD, case_of(offloading(activation_offload_fraction=0.5, min_offloaded_tensor_size=4096,
                                            delta_offload_bytes_across_pp_ranks=1024,
                                            fine_grained_offloading_max_inflight_offloads=2), ORACLE_OFFLOAD))


def test_megatron_accepts_the_emitted_offload_arguments():
    """Megatron's parser, validate_args and TransformerConfig.__post_init__ take the emitted
    arguments with the exported environment (planner/emit/megatron_check.py)."""
    result = verdict(ORACLE_OFFLOAD)
    assert result.verdict == "pass", (result.message, result.location, result.mismatches)


def test_the_memory_fix_names_offloading_as_an_activation_lever():
    """MEM001's fix for activations offers offloading where it is off (and counted)."""
    hint = next(h for h in _activation_levers(build()) if "fine_grained_activation_offloading" in h)
    assert "offload_modules: [expert_fc1, moe_act]" in hint
    assert not [h for h in _activation_levers(offloading()) if "fine_grained_activation_offloading" in h]


def test_unfused_attention_offloads_its_probabilities_once_per_save():
    """dot_product_attention.py DotProductAttention.forward under attention_backend unfused: baddbmm
    saves q and k, the fused softmax its probabilities, bmm the probabilities again and v; no
    softmax statistics, no output. Scores of the rank's 4 heads: 1 · 4 · 32 · 32 = 4096 elements.
    Without dropout the probabilities are two saves, two tags, two copies to the host
    (ChunkOffloadHandler.tensor_push): released q, k, v (3 · 32 · 64 · 2 = 12288) and the
    probabilities once (8192), the second copy host-only. With attention dropout bmm saves the
    dropped copy instead: the probabilities, the one-byte mask and the dropped copy, each once."""
    def unfused(model: dict[str, Any] | None = None) -> dict[str, Any]:
        return stage0(build(model, training={"attention_backend": "unfused"}, overlap={
            "fine_grained_activation_offloading": True, "offload_modules": EVERY,
            "min_offloaded_tensor_size": 0}))

    v = unfused()
    assert v["attn_score_elements"] == 4096
    assert v["offload_core_attn_bytes"] == 12288 + 8192
    assert v["offload_core_attn_host_copy"] == 8192
    dropped = unfused({"attention_dropout": 0.1})
    assert dropped["offload_core_attn_bytes"] == 12288 + 4096 * (2 + 1 + 2)
    assert "offload_core_attn_host_copy" not in dropped

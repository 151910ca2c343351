"""Megatron's Mamba-2 mixer and the hybrid stack, by hand (planner/budget/layer_kinds.py MAMBA).

The toy: tiny-cpu-8 (h 64, fp32, S 32, MBS 1) at TP 2 with SP and CP 2, block 0 a Mamba-2 mixer of
4 heads of 8 (d_inner 32, not Megatron's FLOPs figure's 2h = 128), 2 groups, state 8, Megatron's
d_conv 4 and chunk 128. Every figure below is written out from MambaMixer.__init__ (parameters),
mamba_layer_flops (Megatron's FLOPs), the SSD kernel's GEMMs and MambaContextParallel."""

from __future__ import annotations

from typing import Any

import pytest

from planner.accounting import budgets
from planner.cli_common import collect_findings
from planner.config.hybrid_pattern import PatternNotModelled, read_hybrid_pattern
from planner.config.loader import InvalidConfig, load_config, parse_config
from planner.emit.megatron import megatron_arguments
from planner.model_size import model_size
from planner.plan import compile_plan
from planner.rules import run_rules
from tests.support.paths import EXAMPLES

H, DIN, NH, N, G, CONV, CHUNK, TP, CP, P = 64, 32, 4, 8, 2, 4, 128, 2, 2, 4
NANO = EXAMPLES / "architectures" / "nemotron-3-nano-30b-a3b-64.yaml"
SUPER = EXAMPLES / "architectures" / "nemotron-3-super-120b-a12b-256.yaml"
NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"


def _hybrid(**model: Any):
    data = load_config(EXAMPLES / "tiny-cpu-8.yaml").model_dump(mode="json", exclude_unset=True)
    data["model"].update({"mamba_layers": [1, 0], "mamba_num_heads": NH, "mamba_head_dim": 8,
                          "mamba_num_groups": G, "mamba_state_dim": N, **model})
    data["parallel"].update(tp=TP, cp=CP, etp=1, sequence_parallel=True)
    return parse_config(data)


def _values(cfg) -> dict[str, Any]:
    return {b.name: b.value for b in budgets(cfg, stage=0) if b.stage in (None, 0)}


def test_mamba_layer_figures_by_hand() -> None:
    env = _values(_hybrid())
    # in_proj h x (z, x, B, C, dt), conv1d over x, B, C with its bias, dt_bias / A_log / D, the
    # gated norm over d_inner, out_proj: all split over TP
    in_proj = H * (2 * DIN + 2 * G * N + NH)  # 6,400
    conv = (DIN + 2 * G * N) * (CONV + 1)  # 320
    assert env["mamba_params_per_layer"] == (in_proj + conv + 3 * NH + DIN + DIN * H) / TP == 4406
    # Megatron's mamba_layer_flops with d_in = 2h: in_proj, 7·d_in·state, out_proj
    assert env["flops_mamba_fwd_per_token"] == 2 * H * (2 * 2 * H + 2 * G * N + NH) + 7 * 2 * H * N \
        + 2 * 2 * H * H == 60_928
    assert env["flops_mamba_proj_fwd_per_token"] == 2 * in_proj + 2 * DIN * H == 16_896
    # conv taps, C·Bᵀ over a chunk per group, the causal half of the chunk per head, states in/out
    assert env["flops_mamba_scan_fwd_per_token"] == 2 * CONV * (DIN + 2 * G * N) + 2 * G * CHUNK * N \
        + DIN * CHUNK + 4 * DIN * N == 9728
    assert env["flops_mamba_counted_core_fwd_per_token"] == 60_928 - 16_896
    # one block of each: Megatron's attention row for block 1, the Mamba row for block 0
    attention = 2 * H * 16 * (2 * 4 + 2 * 4) + 2 * 4 * 16 * 32
    assert env["stage_attention_fwd_flops_per_token"] == attention + 60_928
    # the time page: the real projections as GEMMs, the scan as a kernel
    assert env["time_attention_core_fwd_flops"] == 2 * 4 * 16 * 32 + 9728
    assert env["time_attention_linear_fwd_flops"] == 2 * H * 16 * 16 + 16_896
    # stored: norm in/out (2h), zxBCdt, out_x, gated-norm input, out_proj input, fp32 rstd per
    # group; rows b·S / (CP·TP) = 8 under SP
    rows = 32 // (CP * TP)
    assert env["act_mamba_per_layer"] == rows * ((2 * H + 5 * DIN + 2 * G * N + NH) * P + G * 4) == 10_432
    # CP: a TP rank holds G / TP = 1 group < CP 2, so B and C are repeated twice before the
    # all-to-all (MambaContextParallel.pre_conv_ssm); y comes back d_inner / TP wide
    assert env["cp_mamba_pre_bytes"] == 32 // CP * (2 * DIN + 2 * G * N * 2 + NH) // TP * P == 4224
    assert env["cp_mamba_post_bytes"] == 32 // CP * DIN // TP * P == 1024
    assert env["step.cp_mamba_a2a.fwd.send_bytes"] == (4224 + 1024) * env["microbatches"]


def test_a_mixer_only_block_has_one_norm_and_no_mlp() -> None:
    plain = _values(_hybrid())
    alone = _values(_hybrid(mixer_only_layers=[1, 0], moe_layer_freq=[0, 1]))
    # block 0 runs no MLP: one MoE layer on the stage, no dense one
    assert alone["stage_moe_fwd_flops_per_token"] == alone["flops_moe_mlp_fwd_per_token"]
    assert alone["stage_dense_fwd_flops_per_token"] == 0
    moe_block = plain["shared_params_per_layer"] + plain["router_params_per_layer"]
    # block 0 loses its MoE layer (both of tiny's blocks are MoE) and its pre-MLP norm (h)
    assert plain["dense_params_on_rank"] - alone["dense_params_on_rank"] == moe_block + H
    assert plain["expert_params_on_rank"] - alone["expert_params_on_rank"] == plain["routed_params_per_layer"]


def test_mamba_dims_megatron_refuses_are_refused() -> None:
    with pytest.raises(InvalidConfig, match="mamba_num_groups 3 does not divide the 4 Mamba heads"):
        _hybrid(mamba_num_groups=3)
    with pytest.raises(InvalidConfig, match="mamba_layers lists 1 layers, the model has 2"):
        _hybrid(mamba_layers=[1])
    with pytest.raises(InvalidConfig, match="last decoder block is not MoE"):
        _hybrid(mtp_num_layers=1, moe_layer_freq=[1, 0])
    codes = {f.code for f in run_rules(_hybrid(mamba_num_groups=4, mamba_num_heads=8))}
    assert "ARC010" not in codes  # 4 groups over TP 2 = 2 per rank = CP 2
    found = [f for f in run_rules(_hybrid(mamba_num_groups=1, mamba_num_heads=4)) if f.code == "ARC010"]
    assert [f.path for f in found] == ["model.mamba_num_groups"]  # MambaMixer: ngroups % tp


def test_nemotron_3_nano_counts_by_hand() -> None:
    """23 Mamba-2, 6 attention, 23 MoE layers of the published config.json (its tensors as
    transformers 5.25's NemotronHForCausalLM builds them: 31,577,937,344 on the meta device)."""
    h, vocab = 2688, 131072
    mamba = h * (2 * 4096 + 2 * 8 * 128 + 64) + (4096 + 2 * 8 * 128) * 5 + 3 * 64 + 4096 + 4096 * h
    attention = h * (32 + 2 * 2) * 128 + 32 * 128 * h
    routed = 128 * 2 * h * 1856
    moe = routed + 2 * h * 3712 + 128 * h
    total = 2 * vocab * h + h + 23 * (mamba + h) + 6 * (attention + h) + 23 * (moe + h)
    assert total == 31_577_937_344
    size = model_size(load_config(NANO))
    assert size is not None and size.total_params == total and size.mtp_params == 0
    assert size.active_params == total - 23 * (128 - 6) * 2 * h * 1856 == 3_580_073_408
    # Megatron's num_floating_point_operations (hybrid_flops) per token at S 8192, by hand
    hp = 128 * 32  # kv_channels · heads
    fwd = (6 * (4 * hp * (h + h * 2 / 32) + 2 * 8192 * hp)
           + 23 * (2 * h * (2 * 2 * h + 2 * 8 * 128 + 64) + 7 * 2 * h * 128 + 2 * 2 * h * h)
           + 23 * (4 * h * 1856 * 6 + 4 * h * 3712) + 2 * h * vocab)
    env = _values(load_config(NANO))
    assert env["flops_per_token"] == 3 * fwd == 22_278_094_848


def test_nemotron_3_nano_pattern_reads_and_emits_as_published() -> None:
    decoded = read_hybrid_pattern(NANO_PATTERN)
    assert decoded["num_layers"] == 29 and sum(decoded["mamba_layers"]) == 23
    assert sum(decoded["mixer_only_layers"]) == 6 and sum(decoded["moe"]) == 23
    cfg = load_config(NANO)
    assert cfg.model.mamba_layers == decoded["mamba_layers"]
    args = megatron_arguments(cfg)
    assert args.entry == "pretrain_hybrid.py"
    flags = {f.flag: f.values for f in args.flags}
    assert flags["--hybrid-layer-pattern"] == (NANO_PATTERN,)
    assert "--num-layers" not in flags and "--spec" not in flags  # the pattern's 52 layers
    assert flags["--mamba-num-heads"] == ("64",) and flags["--mamba-num-groups"] == ("8",)


@pytest.mark.parametrize(("pattern", "why"), [
    ("EM*E", "layer 1 'E' is an MLP layer with no mixer before it"),
    ("ME|EM", "layer 3 'E' is an MLP layer with no mixer before it"),
    ("MEGE", "layer 3 'G' beside Mamba-stack layers"),
    ("M*E/ME", "MTP part 'ME'"),
])
def test_mamba_patterns_moeplan_cannot_pair_are_refused(pattern: str, why: str) -> None:
    with pytest.raises(PatternNotModelled, match=why):
        read_hybrid_pattern(pattern)


def test_hybrid_mtp_depths_are_attention_then_moe() -> None:
    """Nemotron-3-Super's MTP depth `*E` is moeplan's MTP block (attention, then MoE after a MoE
    last block): read from `/*E` parts, written back on the last pipeline segment, counted as
    Megatron's hybrid_flops counts it (the depth's layers, its norms and eh_proj, its logits)."""
    decoded = read_hybrid_pattern("M*E|ME/*E/*E")
    assert (decoded["num_layers"], decoded["mtp_num_layers"], decoded["segments"]) == (3, 2, [2, 1])
    data = load_config(NANO).model_dump(mode="json", exclude_unset=True)
    derived = ("num_layers", "mamba_layers", "mixer_only_layers", "moe_layer_freq", "mtp_num_layers")
    data["model"] = {k: v for k, v in data["model"].items() if k not in derived}
    data["model"]["hybrid_layer_pattern"] = NANO_PATTERN + "/*E/*E"
    cfg = parse_config(data)
    [pattern] = [f.values for f in megatron_arguments(cfg).flags if f.flag == "--hybrid-layer-pattern"]
    assert pattern == (NANO_PATTERN + "/*E/*E",)
    h, vocab = 2688, 131072
    depth = (4 * 128 * 32 * (h + h * 2 / 32) + 2 * 8192 * 128 * 32  # its attention layer
             + 4 * h * 1856 * 6 + 4 * h * 3712  # its MoE layer
             + 2 * (3 * h + 2 * h * h) + 2 * h * vocab)  # norms, eh_proj and logits
    assert _values(cfg)["flops_per_token"] == 22_278_094_848 + 3 * 2 * depth


def test_nemotron_3_super_counts_by_hand() -> None:
    """Latent MoE (routed experts at 1024, the h ↔ latent projections whole on every rank) under a
    Mamba stack of 88 layers and one `*E` MTP depth; Megatron's hybrid_flops by hand at S 8192
    (d_inner 8192 = 2h here, so Megatron's Mamba figure is the work as it runs)."""
    h, vocab, latent = 4096, 131072, 1024
    mamba = h * (2 * 8192 + 2 * 8 * 128 + 128) + (8192 + 2 * 8 * 128) * 5 + 3 * 128 + 8192 + 8192 * h
    attention = h * (32 + 2 * 2) * 128 + 32 * 128 * h
    routed = 512 * 2 * latent * 2688
    moe = routed + 2 * h * latent + 2 * h * 5376 + 512 * h
    total = 2 * vocab * h + h + 40 * (mamba + h) + 8 * (attention + h) + 40 * (moe + h)
    mtp = 2 * h * h + 3 * h + attention + moe + 2 * h
    size = model_size(load_config(SUPER))
    assert size is not None
    assert (size.total_params, size.mtp_params) == (total, mtp) == (120_668_687_360, 2_942_324_736)
    assert size.active_params == total - 40 * (512 - 22) * 2 * latent * 2688 == 12_770_216_960
    hp = 128 * 32
    attention_flops = 4 * hp * (h + h * 2 / 32) + 2 * 8192 * hp
    mamba_flops = 2 * h * (2 * 2 * h + 2 * 8 * 128 + 128) + 7 * 2 * h * 128 + 2 * 2 * h * h
    moe_flops = 4 * latent * 2688 * 22 + 4 * h * latent + 4 * h * 5376
    fwd = (9 * attention_flops + 40 * mamba_flops + 41 * moe_flops + 2 * (3 * h + 2 * h * h)
           + 2 * 2 * h * vocab)
    assert _values(load_config(SUPER))["flops_per_token"] == 3 * fwd == 80_250_740_736


def test_uniform_full_recompute_of_a_hybrid_stack_counts_pattern_layers() -> None:
    """Megatron's HybridStack checkpoints per pattern layer: Super's 88 layers and its MTP depth
    keep 89 inputs [S / TP, h] under recompute_num_layers 1, not one per block (49)."""
    env = _values(load_config(SUPER))
    rows = 8192 // 2  # S over TP (sequence parallel)
    assert env["layer_input_bytes"] == rows * 4096 * 2
    assert env["act_stored_layers"] == (88 + 1) * rows * 4096 * 2
    data = load_config(SUPER).model_dump(mode="json", exclude_unset=True)
    data["overlap"]["recompute_method"] = "block"  # Megatron's N_r pattern layers: refused
    assert "ARC011" in {f.code for f in run_rules(parse_config(data))}


def test_the_runtime_runs_nanos_example_as_it_is() -> None:
    """The bundled runtime runs Nano's layer kinds (Mamba-2 mixers, mixer-only blocks, squared-ReLU
    experts, attention without RoPE: runtime/mamba.py), its TP 2 split (runtime/
    tensor_parallel.py), its distributed optimizer (runtime/dist_opt.py) and its bf16 with fp32
    main grads (runtime/precision.py): the example's own plan is refused for nothing
    (tests/support/launch.py nano_at_tiny_dims runs it at tiny widths)."""
    import torch

    from runtime.plan_io import attention_mechanism_problems, check_plan
    from runtime.precision import Precision

    cfg = load_config(NANO)
    assert attention_mechanism_problems(cfg.model.model_dump(mode="json")) == []
    plan = check_plan(compile_plan(cfg, collect_findings(cfg)))
    assert Precision.of(plan) == Precision(torch.bfloat16, torch.float32)


def test_fp8_quantises_the_mamba_projections_only() -> None:
    """Under FP8 Transformer Engine quantises in_proj and out_proj; conv1d, dt_bias, A_log, D and
    the gated norm stay in bf16. Nano at TP 2: 6 attention, 23 Mamba, 23 shared experts."""
    data = load_config(NANO).model_dump(mode="json", exclude_unset=True)
    data["training"]["fp8_format"] = "e4m3"
    env = _values(parse_config(data))
    h = 2688
    attention = 2 * h * 128 * (32 + 2) // 2
    mamba = (h * (2 * 4096 + 2 * 8 * 128 + 64) + 4096 * h) // 2
    shared = 2 * h * 3712 // 2
    assert env["dense_fp8_params_on_rank"] == 6 * attention + 23 * mamba + 23 * shared == 744_812_544


def test_selective_core_attn_recompute_leaves_the_mamba_scan_alone() -> None:
    data = load_config(NANO).model_dump(mode="json", exclude_unset=True)
    data["overlap"].update(recompute_granularity="selective", recompute_modules=["core_attn"])
    env = _values(parse_config(data))
    assert env["time_recompute_attention_core_flops"] == 6 * 2 * 32 * 128 * 8192  # 6 attention layers


def test_the_pattern_fills_the_block_fields_and_refuses_a_contradiction() -> None:
    """model.hybrid_layer_pattern, as Megatron spells it, is read once into the block fields; one
    written beside it that says otherwise, or a pipeline split inside it, is refused by name."""
    cfg = load_config(NANO)
    assert cfg.model.hybrid_layer_pattern == NANO_PATTERN and cfg.model.num_layers == 29
    data = load_config(NANO).model_dump(mode="json", exclude_unset=True)
    for field, value, why in (("mtp_num_layers", 1, "model.mtp_num_layers 1 contradicts"),
                              ("hybrid_layer_pattern", "MEM*E|ME", "holds pipeline segments"),
                              ("hybrid_layer_pattern", "-MEM*E", "layer 1 '-' is an MLP layer")):
        with pytest.raises(InvalidConfig, match=why):
            parse_config({**data, "model": {**data["model"], field: value}})

"""Rules fixed against Megatron-LM's own code: each test names the line of Megatron-LM dev@d48bd6be
that decides the case, checks moeplan's verdict on it, and (where a checkout is present) that the
cited line still says what the test claims."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from planner.config.loader import parse_config
from planner.emit.megatron import megatron_arguments
from planner.findings import Finding
from planner.rules import find_rule, run_rules
from planner.rules.example_base import example_config_data, merge
from tests.support.base_configs import MINIMAL_V4
from tests.support.megatron_lines import megatron_line

TRANSFORMER_CONFIG = "core/transformer/transformer_config.py"
ARGUMENTS = "training/arguments.py"
TOKEN_DISPATCHER = "core/transformer/moe/token_dispatcher.py"
MOE_UTILS = "core/transformer/moe/moe_utils.py"
DDP = "core/distributed/distributed_data_parallel.py"

# (path under megatron/, line at dev@d48bd6be, text on that line, function) — every line a test
# below relies on.
CITED_LINES = [
    ("core/transformer/transformer_block.py", 722, "layer_idx += self.config.recompute_num_layers",
     "_checkpointed_forward"),
    # current architectures (planner/rules/architectures.py): ARC001's no_rope_freq checks ...
    (TRANSFORMER_CONFIG, 3580, "assert self.num_layers % self.no_rope_freq == 0, (", "__post_init__"),
    (TRANSFORMER_CONFIG, 3589, "assert len(self.no_rope_freq) == self.num_layers, (", "__post_init__"),
    # ... ARC002's GLU offset under the fused bias-activation kernel ...
    (TRANSFORMER_CONFIG, 2689, "if self.glu_linear_offset != 0.0 and self.activation_func != quick_gelu:",
     "__post_init__"),
    # ... ARC003's L2 norm with MLA, and quick-GEGLU's refusal of --swiglu (the schema's)
    ("core/models/gpt/gpt_layer_specs.py", 255, 'assert qk_l2_norm is False, "qk_l2_norm is not supported '
     'with MLA."', "get_gpt_layer_with_transformer_engine_submodules"),
    ("training/argument_utils.py", 440, "assert not args.swiglu", "core_transformer_config_from_args"),
    # ... ARC004 / ARC005: gated DeltaNet's head ratio and its heads over TP
    (TRANSFORMER_CONFIG, 1677, "assert self.linear_num_value_heads % self.linear_num_key_heads == 0, (",
     "__post_init__"),
    (TRANSFORMER_CONFIG, 1704, "assert self.linear_num_key_heads % linear_head_parallel_size == 0, (",
     "__post_init__"),
    (TRANSFORMER_CONFIG, 1708, "assert self.linear_num_value_heads % linear_head_parallel_size == 0, (",
     "__post_init__"),
    # ... ARC006 / ARC007: DSA refuses linear biases and any CP exchange but all-gather
    (TRANSFORMER_CONFIG, 1714, "if self.add_bias_linear:", "__post_init__"),
    (TRANSFORMER_CONFIG, 1737, 'and cp_comm_type.replace("_", "").lower() == "allgather"',
     "__post_init__"),
    # ... ARC008: the shared expert refuses linear biases
    ("core/transformer/moe/shared_experts.py", 124, "assert config.add_bias_linear == False",
     "SharedExpertMLP.__init__"),
    # ... ARC009: the head-wise gate's heads and groups over TP, and its FP8/FP4 row alignment
    (TRANSFORMER_CONFIG, 1521, "if self.num_attention_heads % tp != 0:", "__post_init__"),
    (TRANSFORMER_CONFIG, 1529, "if self.num_query_groups < tp:", "__post_init__"),
    (TRANSFORMER_CONFIG, 1545, "if per_partition % align != 0:", "__post_init__"),
    # ... ARC010: Mamba-2 heads and groups over TP, their FP8 width, and over CP
    ("core/ssm/mamba_mixer.py", 241,
     "assert (2 * self.d_inner + 2 * self.ngroups * self.d_state + self.nheads) % 16 == 0, (",
     "MambaMixer.__init__"),
    ("core/ssm/mamba_mixer.py", 249, "assert self.nheads % tp_size == 0", "MambaMixer.__init__"),
    ("core/ssm/mamba_mixer.py", 257, "assert self.ngroups % tp_size == 0", "MambaMixer.__init__"),
    ("core/ssm/mamba_context_parallel.py", 110, "self.nheads_local_tp % self.cp_size == 0",
     "MambaContextParallel._set_cp_params"),
    ("core/ssm/mamba_context_parallel.py", 124, "self.cp_size % self.ngroups_local_tp == 0",
     "MambaContextParallel._set_cp_params"),
    ("core/ssm/mamba_context_parallel.py", 131, "self.ngroups_local_tp % self.cp_size == 0",
     "MambaContextParallel._set_cp_params"),
    # TransformerConfig.__post_init__: full granularity without a method raises
    (TRANSFORMER_CONFIG, 2165, 'elif self.recompute_granularity != "selective":', "__post_init__"),
    # ... and without recompute_num_layers
    (TRANSFORMER_CONFIG, 2171,
     'if self.recompute_granularity != "selective" and self.recompute_num_layers is None:',
     "__post_init__"),
    # ... selective with recompute_num_layers raises
    (TRANSFORMER_CONFIG, 2179,
     'self.recompute_granularity == "selective" and self.recompute_num_layers is not None',
     "__post_init__"),
    # validate_args: selective with a recompute method asserts
    (ARGUMENTS, 1521, "assert args.recompute_method is None", "validate_args"),
    # contiguous CP with CP > 1 needs a packing scheduler (no qkv_format involved)
    (TRANSFORMER_CONFIG, 1569, "if self.sequence_packing_scheduler is None:", "__post_init__"),
    # _NCCLEPManager.__init__: ncclep without a rank capacity factor raises
    (TOKEN_DISPATCHER, 1717, "if self.rank_capacity_factor is None:", "_NCCLEPManager.__init__"),
    # _NCCLEPManager._ensure_bootstrap: the receive budget it sizes
    (TOKEN_DISPATCHER, 1760,
     "budget = int(self._max_tokens_per_rank * self.router_topk * self.rank_capacity_factor)",
     "_NCCLEPManager._ensure_bootstrap"),
    # a rank capacity factor needs the hybridep or ncclep backend
    (TRANSFORMER_CONFIG, 2122,
     'if self.moe_flex_dispatcher_backend not in ("hybridep", "ncclep"):', "__post_init__"),
    # router groups are checked only under group_topk ...
    (TRANSFORMER_CONFIG, 2954, "if self.moe_router_group_topk:", "__post_init__"),
    # ... and group-limited routing only runs with group_topk
    (MOE_UTILS, 777, "if group_topk:", "topk_routing_with_score_function._compute_topk"),
    # DistributedDataParallel.__init__: partial DistOpt without DistOpt asserts
    (DDP, 294, "), 'Partial DistOpt cannot be used without DistOpt'", "DistributedDataParallel.__init__"),
    # validate_args: Megatron-FSDP turns the distributed optimizer on
    (ARGUMENTS, 1212, "args.use_distributed_optimizer = True", "validate_args"),
    # validate_args: dynamic CP needs per-token loss and the default_dynamic_cp scheduler
    (ARGUMENTS, 1552, "args.calculate_per_token_loss", "validate_args"),
    (ARGUMENTS, 1556, "if args.sequence_packing_scheduler != 'default_dynamic_cp':", "validate_args"),
    # EP overlap with PP > 1 needs only VPP (nothing about mHC)
    (TRANSFORMER_CONFIG, 3385,
     "assert self.virtual_pipeline_model_parallel_size is not None, (", "__post_init__"),
    # hash layers with PP > 1 need an explicit layout
    (TRANSFORMER_CONFIG, 2883, "assert self.pipeline_model_parallel_layout is not None, (",
     "__post_init__"),
    # ... on the GPT path only
    (TRANSFORMER_CONFIG, 2882,
     "if self.pipeline_model_parallel_size > 1 and not self.is_hybrid_model:", "__post_init__"),
    # EP overlap takes at most one MTP layer
    (TRANSFORMER_CONFIG, 3466, "MTP layernum only supports 1 when enabling", "__post_init__"),
    # MTP under uniform full recompute checkpoints one layer at a time
    ("core/transformer/multi_token_prediction.py", 2499, "self.config.recompute_num_layers == 1",
     "MultiTokenPredictionLayer._checkpointed_forward"),
    # EP overlap + full recompute needs dropout 0
    (TRANSFORMER_CONFIG, 3422, "assert self.attention_dropout == 0.0 and self.hidden_dropout == 0.0",
     "__post_init__"),
    # EP overlap without full recompute: no method, no layer count
    (TRANSFORMER_CONFIG, 3445, "assert self.recompute_method is None, (", "__post_init__"),
    (TRANSFORMER_CONFIG, 3448, "assert self.recompute_num_layers is None, (", "__post_init__"),
    # MTP only with rope or no position embedding
    (ARGUMENTS, 919,
     'assert args.position_embedding_type == "rope" or args.position_embedding_type == "none"',
     "validate_args"),
    # a hybrid layer pattern makes the config a hybrid model
    (ARGUMENTS, 2272, "kw_args['is_hybrid_model'] = True", "core_transformer_config_from_args"),
    # _LeftBoundaryExchange.forward: V4 CP raises when a rank holds fewer rows than the window (V4011)
    ("core/transformer/experimental_attention_variant/csa_utils/cp_utils.py", 135,
     "if tensor.shape[0] < d_window:", "_LeftBoundaryExchange.forward"),
    # validate_args: emerging optimizers (Muon) refuse torch FSDP2 and Megatron-FSDP (DOP007)
    (ARGUMENTS, 1873,
     'assert not args.use_torch_fsdp2, "Emerging optimizer does not support Torch-FSDP2 for now."',
     "validate_args"),
    (ARGUMENTS, 1876, '), "Emerging optimizer does not support Megatron-FSDP for now."',
     "validate_args"),
    # validate_args: fp8_param_gather asserts a sharded parameter gather (DOP008) ...
    (ARGUMENTS, 1165, "'--fp8-param-gather only supported with distributed optimizer, torch fsdp2, "
     "megatron fsdp, or inference mode'", "validate_args"),
    # ... and TransformerConfig refuses fp8_param without FP8
    (TRANSFORMER_CONFIG, 1868, "if self.fp8_param and not self.fp8:", "__post_init__"),
    # DSA top-k shared across layers (ARC012): which layers reuse, that they build no indexer, and
    # the pipeline split that refuses a chunk whose reused top-k is not earlier in the chunk
    ("core/transformer/experimental_attention_variant/dsa.py", 47,
     "return (max(layer_number - skip_topk_offset, 0) % topk_freq) != 0", "is_dsa_skip_topk_layer"),
    ("core/transformer/experimental_attention_variant/dsa.py", 1728, "if not self.skip_topk:",
     "DSAttention.__init__"),
    ("core/models/gpt/experimental_attention_variant_module_specs.py", 442,
     "source_layer_id not in local_layer_positions", "_validate_dsa_index_share_pipeline_split"),
]


@pytest.mark.parametrize(("path", "line", "text", "function"), CITED_LINES,
                         ids=[f"{p.rsplit('/', 1)[-1]}:{n}" for p, n, _, _ in CITED_LINES])
def test_cited_megatron_line_says_what_the_rule_claims(path, line, text, function):
    assert text in megatron_line(path, line), f"megatron/{path}:{line} ({function})"


def findings(overlay: dict[str, Any]) -> list[Finding]:
    return run_rules(parse_config(merge(example_config_data(""), overlay)))


def codes(overlay: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(f.code, f.severity, f.path) for f in findings(overlay)]


# ----------------------------------------------------------------------------- recompute


def test_full_recompute_without_method_is_an_error():
    # megatron/core/transformer/transformer_config.py:2165 and :2171, TransformerConfig.__post_init__
    assert codes({"overlap": {"recompute_granularity": "full"}}) == [
        ("OVL009", "error", "overlap.recompute_method"),
        ("OVL009", "error", "overlap.recompute_num_layers"),
    ]
    done = {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 2}
    assert codes({"overlap": done}) == []


def test_zero_recompute_layers_hang_uniform_and_are_legal_under_block():
    # megatron/core/transformer/transformer_block.py:722 TransformerBlock._checkpointed_forward:
    # the uniform loop advances by recompute_num_layers, so 0 never ends it; TransformerConfig
    # checks only that the count is set (transformer_config.py:2171)
    uniform = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 0}
    assert codes({"overlap": uniform}) == [("OVL009", "error", "overlap.recompute_num_layers")]
    assert codes({"overlap": {**uniform, "recompute_method": "block"}}) == []


def test_selective_recompute_with_method_is_an_error():
    # megatron/training/arguments.py:1521 validate_args (method);
    # megatron/core/transformer/transformer_config.py:2179 TransformerConfig.__post_init__ (layers)
    overlay = {"overlap": {"recompute_granularity": "selective", "recompute_method": "uniform",
                           "recompute_num_layers": 1}}
    assert codes(overlay) == [("OVL010", "error", "overlap.recompute_method"),
                              ("OVL010", "error", "overlap.recompute_num_layers")]
    assert codes({"overlap": {"recompute_granularity": "selective"}}) == []


def test_ep_overlap_takes_one_mtp_layer():
    # megatron/core/transformer/transformer_config.py:3466 TransformerConfig.__post_init__
    overlay = {"model": {"mtp_num_layers": 2}, "parallel": {"pp": 1},
               "overlap": {"overlap_moe_expert_parallel_comm": True}}
    assert codes(overlay) == [("OVL011", "error", "model.mtp_num_layers")]


@pytest.mark.parametrize(("method", "layers", "ok"), [
    ("uniform", 1, True), ("uniform", 2, False), ("block", 2, True)])
def test_mtp_uniform_full_recompute_needs_one_layer(method, layers, ok):
    # megatron/core/transformer/multi_token_prediction.py:2499
    # MultiTokenPredictionLayer._checkpointed_forward
    overlay = {"model": {"mtp_num_layers": 1},
               "overlap": {"recompute_granularity": "full", "recompute_method": method,
                           "recompute_num_layers": layers}}
    assert codes(overlay) == ([] if ok else [("OVL012", "error", "overlap.recompute_num_layers")])


# ----------------------------------------------------------------------------- V4002


_V4_CP2 = {"model": {"attention_variant": "dsv4_hybrid", "compress_ratios": [0, 4, 128, 4]},
           "parallel": {"cp": 2, "cp_partition_mode": "contiguous"}}


@pytest.mark.parametrize("qkv_format", ["sbhd", "bshd", "thd"])
def test_v4_cp_needs_a_packing_scheduler_not_a_qkv_format(qkv_format):
    # megatron/core/transformer/transformer_config.py:1569 TransformerConfig.__post_init__: only the
    # scheduler is checked; dev has no qkv_format argument and moeplan emits none.
    packed = merge(_V4_CP2, {"training": {"qkv_format": qkv_format,
                                          "sequence_packing_scheduler": "dp_balanced"}})
    assert codes(packed) == []
    unpacked = merge(_V4_CP2, {"training": {"qkv_format": qkv_format}})
    assert codes(unpacked) == [("V4002", "error", "training.sequence_packing_scheduler")]


def test_qkv_format_does_not_change_the_emitted_arguments():
    data = merge(example_config_data(""), merge(_V4_CP2, {
        "training": {"sequence_packing_scheduler": "dp_balanced"}}))
    emitted = {fmt: megatron_arguments(parse_config(merge(data, {"training": {"qkv_format": fmt}})))
               .as_dict() for fmt in ("sbhd", "thd")}
    assert emitted["sbhd"] == emitted["thd"]


def test_minimal_v4_file_asks_for_the_scheduler_once():
    found = run_rules(parse_config(copy.deepcopy(MINIMAL_V4)))
    assert [f.path for f in found if f.code == "V4002"] == ["training.sequence_packing_scheduler"]


# ----------------------------------------------------------------------------- ncclep


_NCCLEP = {"moe": {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "ncclep"}}


def test_ncclep_needs_a_rank_capacity_factor():
    # megatron/core/transformer/moe/token_dispatcher.py:1717 _NCCLEPManager.__init__
    assert codes(_NCCLEP) == [("MOE018", "error", "moe.moe_expert_rank_capacity_factor")]
    assert codes(merge(_NCCLEP, {"moe": {"moe_expert_rank_capacity_factor": 1.25}})) == []


@pytest.mark.parametrize(("dispatcher", "backend", "ok"), [
    ("flex", "ncclep", True), ("flex", "deepep", False), ("flex", None, False),
    ("flex", "hybridep", False), ("alltoall", None, False)])
def test_rank_capacity_factor_needs_ncclep(dispatcher, backend, ok):
    # megatron/core/transformer/transformer_config.py:2122 TransformerConfig.__post_init__ (hybridep
    # also needs use_transformer_engine_op_fuser, :2127, which moeplan does not set)
    moe: dict[str, Any] = {"moe_token_dispatcher_type": dispatcher,
                           "moe_expert_rank_capacity_factor": 2.0}
    if backend:
        moe["moe_flex_dispatcher_backend"] = backend
    found = [c for c in codes({"moe": moe}) if c[0] == "MOE019"]
    assert found == ([] if ok else [("MOE019", "error", "moe.moe_expert_rank_capacity_factor")])


def test_rank_capacity_factor_is_emitted():
    cfg = parse_config(merge(example_config_data(""),
                             merge(_NCCLEP, {"moe": {"moe_expert_rank_capacity_factor": 1.5}})))
    assert megatron_arguments(cfg).as_dict()["--moe-expert-rank-capacity-factor"] == ("1.5",)
    plain = parse_config(example_config_data(""))
    assert "--moe-expert-rank-capacity-factor" not in megatron_arguments(plain).as_dict()


@pytest.mark.parametrize("value", [0, -1.0, "1.5"])
def test_rank_capacity_factor_must_be_a_positive_number(value):
    from planner.config.loader import InvalidConfig

    with pytest.raises(InvalidConfig):
        parse_config(merge(example_config_data(""), {"moe": {"moe_expert_rank_capacity_factor": value}}))


def test_ncclep_drop_and_pad_is_a_warning_naming_both_branches():
    # Megatron-LM main@d98e8a64 rejects it in the flex dispatcher; dev only asks for the rank
    # capacity factor (megatron/core/transformer/moe/token_dispatcher.py:1717).
    overlay = merge(_NCCLEP, {"moe": {"moe_expert_rank_capacity_factor": 1.5,
                                      "moe_expert_capacity_factor": 1.0}})
    [finding] = [f for f in findings(overlay) if f.code != "MOE033"]  # MOE033: info on drops
    assert (finding.code, finding.severity) == ("MOE003", "warning")
    assert "main rejects" in finding.message and "dev accepts" in finding.message
    assert "main@d98e8a64" in finding.source and "dev@d48bd6be" in finding.source
    assert finding.message.endswith("on main it fails")  # no V4 feature, no GTP: either branch
    v4 = merge(overlay, {"model": {"moe_n_hash_layers": 1}, "parallel": {"pp": 1},
                         "moe": {"moe_tid2eid_source": "checkpoint"}})
    assert [f.message.rsplit("; ", 1)[1] for f in findings(v4) if f.code == "MOE003"] == [
        "this config targets dev (DeepSeek-V4 features)"]
    gtp = merge(overlay, {"parallel": {"gtp": 2, "egtp": 2, "ep": 2}})
    assert [(f.code, f.message.rsplit("; ", 1)[1]) for f in findings(gtp) if f.code == "MOE003"] == [
        ("MOE003", "this config targets main (GTP), where it fails")]


# ----------------------------------------------------------------------------- router groups, DistOpt


def test_router_groups_without_group_topk_warn_and_are_not_checked():
    # megatron/core/transformer/transformer_config.py:2954 (checks only under group_topk) and
    # megatron/core/transformer/moe/moe_utils.py:777 (routes group-limited only with group_topk)
    assert codes({"model": {"moe_router_num_groups": 3}}) == [
        ("MOE020", "warning", "model.moe_router_group_topk")]
    assert codes({"model": {"moe_router_num_groups": 3, "moe_router_group_topk": 1}}) == [
        ("MOE009", "error", "model.moe_router_num_groups")]


def test_optimizer_instances_without_distopt_stay_an_error():
    # megatron/core/distributed/distributed_data_parallel.py:291-294 DistributedDataParallel.__init__
    # asserts 'Partial DistOpt cannot be used without DistOpt' when the model is wrapped (after
    # validate_args passed), so Megatron does not ignore the count.
    overlay = {"parallel": {"world_size": 16}, "training": {"num_distributed_optimizer_instances": 2}}
    assert codes(overlay) == [("DOP003", "error", "training.use_distributed_optimizer")]
    assert find_rule("DOP003").severity == "error"
    # megatron/training/arguments.py:1212 validate_args: Megatron-FSDP switches DistOpt on itself.
    fsdp = merge(overlay, {"training": {"use_megatron_fsdp": True}})
    assert "DOP003" not in [c[0] for c in codes(fsdp)]


# ----------------------------------------------------------------------------- write-up vs dev


def test_v4_dynamic_cp_is_a_warning_when_megatron_accepts_it():
    # megatron/training/arguments.py:1552 and :1556 validate_args: dynamic CP needs per-token loss
    # and the default_dynamic_cp scheduler; nothing refuses dsv4_hybrid with it.
    dynamic = merge(_V4_CP2, {"parallel": {"dynamic_context_parallel": True},
                              "training": {"calculate_per_token_loss": True}})
    assert codes(dynamic) == [("V4004", "warning", "parallel.dynamic_context_parallel")]
    [warning] = findings(dynamic)
    assert "write-up" in warning.message and "Megatron dev accepts" in warning.message
    assert warning.source.startswith("the DeepSeek-V4 Megatron write-up; Megatron-LM dev@d48bd6be")


def test_dynamic_cp_requirements_are_errors():
    # megatron/training/arguments.py:1552 (per-token loss) and :1556 (scheduler) validate_args
    overlay = {"parallel": {"cp": 2, "dynamic_context_parallel": True},
               "training": {"sequence_packing_scheduler": "dp_balanced"}}
    assert codes(overlay) == [("PAR015", "error", "training.calculate_per_token_loss"),
                              ("PAR015", "error", "training.sequence_packing_scheduler")]


def test_mhc_with_pp_and_ep_overlap_is_a_warning():
    # megatron/core/transformer/transformer_config.py:3385 TransformerConfig.__post_init__: with
    # PP > 1 the overlap needs VPP, nothing about mHC.
    overlay = {"model": {"enable_hyper_connections": True, "num_residual_streams": 4},
               "parallel": {"vpp": 2}, "overlap": {"overlap_moe_expert_parallel_comm": True}}
    assert codes(overlay) == [("V4007", "warning", "overlap.overlap_moe_expert_parallel_comm")]
    rule = find_rule("V4007")
    assert "write-up" in rule.why and "Megatron dev accepts" in rule.why


# ----------------------------------------------------------------------------- PIP004


def _gpt_path_v4() -> dict[str, Any]:
    """The minimal V4-Pro file with MLA attention: the GPT entry, where Megatron checks the layout."""
    data = copy.deepcopy(MINIMAL_V4)
    data["model"]["attention_variant"] = "mla"
    return data


def test_pip004_is_reported_when_the_split_fails():
    # megatron/core/transformer/transformer_config.py:2883 TransformerConfig.__post_init__ asserts
    # the layout for hash layers with PP > 1 whatever the even split would have been.
    found = run_rules(parse_config(_gpt_path_v4()))
    pip = {f.code: f for f in found if f.code.startswith("PIP")}
    assert set(pip) == {"PIP001", "PIP004"}
    # 61 layers over PP 8: 8 per stage, the remaining 5 (>= 3 hash layers) on the embedding stage.
    assert pip["PIP004"].fix == 'set pipeline_model_parallel_layout, e.g. "Et*5|(t*8|)*6t*8mL"'


def test_pip004_suggested_layout_is_valid_when_the_split_fails():
    data = _gpt_path_v4()
    fix = next(f.fix for f in run_rules(parse_config(data)) if f.code == "PIP004")
    data["parallel"]["pipeline_model_parallel_layout"] = fix.split('"')[1]
    assert not {f.code for f in run_rules(parse_config(data))} & {"PIP001", "PIP003", "PIP004"}


def test_pip004_without_a_usable_suggestion_names_what_the_layout_needs():
    # 9 layers over PP 4: the suggestion "Et*0|..." does not exist; 5 hash layers.
    overlay = {"model": {"num_layers": 9, "moe_n_hash_layers": 5},
               "parallel": {"world_size": 16, "pp": 4}, "moe": {"moe_tid2eid_source": "checkpoint"}}
    pip4 = [f for f in findings(overlay) if f.code == "PIP004"]
    assert len(pip4) == 1 and "'Et*5'" in pip4[0].fix


def test_pip004_does_not_apply_to_the_hybrid_entry():
    # megatron/core/transformer/transformer_config.py:2882: the check runs only when
    # not is_hybrid_model; a --hybrid-layer-pattern (DeepSeek-V4 attention) sets it
    # (megatron/training/arguments.py:2272 core_transformer_config_from_args).
    v4 = {"model": {"attention_variant": "dsv4_hybrid", "compress_ratios": [0, 4, 128, 4],
                    "moe_n_hash_layers": 1}, "moe": {"moe_tid2eid_source": "checkpoint"}}
    assert codes(v4) == []
    assert codes(merge(v4, {"model": {"attention_variant": "standard"}})) == [
        ("PIP004", "error", "parallel.pipeline_model_parallel_layout")]


# ----------------------------------------------------------------------------- found by the pre-flight

_EP_OVERLAP_FULL = {"overlap_moe_expert_parallel_comm": True, "recompute_granularity": "full",
                    "recompute_method": "uniform", "recompute_num_layers": 1}


def test_ep_overlap_with_full_recompute_needs_dropout_zero():
    # megatron/core/transformer/transformer_config.py:3422 TransformerConfig.__post_init__
    dropout = {"hidden_dropout": 0.1, "attention_dropout": 0.05}
    assert codes({"model": dropout, "parallel": {"pp": 1}, "overlap": _EP_OVERLAP_FULL}) == [
        ("OVL013", "error", "model.hidden_dropout"), ("OVL013", "error", "model.attention_dropout")]
    zero = {"hidden_dropout": 0.0, "attention_dropout": 0.0}
    assert codes({"model": zero, "parallel": {"pp": 1}, "overlap": _EP_OVERLAP_FULL}) == []
    # without the overlap, dropout and full recompute go together
    plain = {**_EP_OVERLAP_FULL, "overlap_moe_expert_parallel_comm": False}
    assert codes({"model": dropout, "parallel": {"pp": 1}, "overlap": plain}) == []


def test_ep_overlap_without_full_recompute_takes_no_method():
    # megatron/core/transformer/transformer_config.py:3445 and :3448 TransformerConfig.__post_init__
    overlay = {"parallel": {"pp": 1}, "model": {"hidden_dropout": 0.0, "attention_dropout": 0.0},
               "overlap": {"overlap_moe_expert_parallel_comm": True, "recompute_num_layers": 1}}
    assert ("OVL014", "error", "overlap.recompute_num_layers") in codes(overlay)
    overlay["overlap"] = {"overlap_moe_expert_parallel_comm": True}
    assert not [c for c in codes(overlay) if c[0] == "OVL014"]


@pytest.mark.parametrize(("kind", "ok"), [("rope", True), ("none", True), ("learned_absolute", False),
                                          ("yarn", False)])
def test_mtp_needs_rope_or_no_position_embedding(kind, ok):
    # megatron/training/arguments.py:919 validate_args
    overlay = {"model": {"mtp_num_layers": 1, "position_embedding_type": kind}}
    pip005 = [c for c in codes(overlay) if c[0] == "PIP005"]
    assert pip005 == ([] if ok else [("PIP005", "error", "model.position_embedding_type")])


# ----------------------------------------------------------------------------- fp8_param_gather


def test_fp8_param_gather_without_fp8_or_distributed_optimizer_is_dop008() -> None:
    """arguments.py:1165 (the distributed optimizer or an FSDP) and transformer_config.py:1868
    (FP8 on) both fire on a plain config; the emitted command line keeps the flag."""
    assert codes({"training": {"fp8_param_gather": True}}) == [
        ("DOP008", "error", "training.fp8_param_gather"),
        ("DOP008", "error", "training.use_distributed_optimizer")]
    good = {"training": {"fp8_format": "e4m3", "fp8_param_gather": True,
                         "use_distributed_optimizer": True}}
    assert not [c for c in codes(good) if c[0] == "DOP008"]
    assert "--fp8-param-gather" in megatron_arguments(
        parse_config(merge(example_config_data(""), good))).as_dict()


# ----------------------------------------------------------------------------- head-wise attention gate


def test_head_wise_gate_over_tp_is_arc009() -> None:
    """transformer_config.py:1521 (TP divides the heads), :1529 (query groups >= TP) and :1545
    (FP8: each rank's linear_qkv rows a multiple of 16). 16 heads, 4 groups, kv_channels 8 give
    (16 + 2·4)·8 + 16 = 208 rows: 104 per rank at TP 2 (104 = 6·16 + 8, refused), 208 = 13·16 at
    TP 1 (accepted)."""
    model = {"head_wise_attn_gate": True, "num_attention_heads": 8, "num_query_groups": 2,
             "hidden_size": 128}
    par = {"tp": 4, "ep": 2, "sequence_parallel": True}
    assert [c for c in codes({"model": model, "parallel": par}) if c[0] == "ARC009"] == [
        ("ARC009", "error", "model.num_query_groups")]
    par6 = {"tp": 3, "ep": 2, "sequence_parallel": True}
    assert ("ARC009", "error", "model.num_attention_heads") in codes(
        {"model": {**model, "num_query_groups": 4}, "parallel": par6})
    fp8_model = {"head_wise_attn_gate": True, "num_attention_heads": 16, "num_query_groups": 4,
                 "hidden_size": 128, "kv_channels": 8}
    fp8 = {"fp8_format": "e4m3"}
    refused = codes({"model": fp8_model, "parallel": {"tp": 2, "ep": 2, "sequence_parallel": True},
                     "training": fp8})
    assert ("ARC009", "error", "model.head_wise_attn_gate") in refused  # 104 rows per rank
    fits = codes({"model": fp8_model, "parallel": {"tp": 1, "ep": 2}, "training": fp8})
    assert not [c for c in fits if c[0] == "ARC009"]  # 208 = 13 · 16 rows
    assert not [c for c in codes({"model": {**model, "num_query_groups": 4}, "parallel": par})
                if c[0] == "ARC009"]


def test_mamba_heads_and_groups_over_tp_and_cp_are_arc010() -> None:
    """mamba_mixer.py:249/:257 (TP divides heads and groups), mamba_context_parallel.py:110
    (CP divides a TP rank's heads) and :124/:131 (a rank's groups and CP divide one another).
    8 heads of 16 over 4 groups: at TP 2 a rank holds 4 heads and 2 groups."""
    model = {"num_layers": 2, "mamba_layers": [1, 0], "mamba_num_heads": 8, "mamba_head_dim": 16,
             "mamba_num_groups": 4}
    arc = lambda overlay: [c for c in codes(overlay) if c[0] == "ARC010"]  # noqa: E731
    par = {"tp": 2, "ep": 2, "sequence_parallel": True}
    assert arc({"model": model, "parallel": par}) == []
    assert arc({"model": {**model, "mamba_num_groups": 2}, "parallel": {**par, "tp": 4}}) == [
        ("ARC010", "error", "model.mamba_num_groups")]  # 2 groups over TP 4
    # CP 8 > 4 heads per TP rank (at TP 1: 8 heads, 4 groups -> CP 8 divides 8 heads, 8 % 4 = 0)
    assert arc({"model": model, "parallel": {"tp": 2, "cp": 8, "ep": 2,
                                             "sequence_parallel": True}}) == [
        ("ARC010", "error", "parallel.cp")]


_DSA_MODEL = {"num_layers": 8, "multi_latent_attention": True, "kv_lora_rank": 32, "q_lora_rank": 32,
              "dsa": True, "index_n_heads": 4, "index_head_dim": 16, "index_topk": 64}


def test_dsa_top_k_sharing_chunks_start_on_computing_layers_arc012() -> None:
    """experimental_attention_variant_module_specs.py:442: a chunk's reused top-k must come from
    a layer earlier in the chunk. 8 layers over PP 2 split 4 + 4. freq 2 (offset 0, read as 1):
    0-based layers 0, 2, 4, 6 compute, the second chunk starts on 4: accepted. freq 3: layers 0,
    3, 6 compute; layer 4 reuses layer 3's top-k on the first chunk: refused, and the fix moves
    the boundary to the nearest computing layer, 3, which Megatron accepts."""
    arc = lambda overlay: [f for f in findings(overlay) if f.code == "ARC012"]  # noqa: E731
    assert arc({"model": {**_DSA_MODEL, "dsa_indexer_topk_freq": 2}}) == []
    [finding] = arc({"model": {**_DSA_MODEL, "dsa_indexer_topk_freq": 3}})
    assert finding.path == "parallel.pipeline_model_parallel_layout"
    assert "layer 4 (0-based), which reuses the top-k of layer 3" in finding.message
    assert finding.fix.endswith('pipeline_model_parallel_layout: "Et*3|t*5L"')
    assert arc({"model": {**_DSA_MODEL, "dsa_indexer_topk_freq": 3},
                "parallel": {"pipeline_model_parallel_layout": "Et*3|t*5L"}}) == []
    # PP 2 x VPP 2 (chunks of 2 from layers 0, 2, 4, 6); offset 2: layers 0, 1, 3, 5, 7 compute
    vpp = {"model": {**_DSA_MODEL, "dsa_indexer_topk_freq": 2, "dsa_indexer_skip_topk_offset": 2},
           "parallel": {"vpp": 2}}
    [finding] = arc(vpp)
    assert finding.fix.endswith('"Et|(tt|)*2t*3L"')  # chunks now start on 0, 1, 3, 5
    assert arc(merge(vpp, {"parallel": {"vpp": None,
                                        "pipeline_model_parallel_layout": "Et|(tt|)*2t*3L"}})) == []


def test_pip001_suggests_a_layout_arc012_accepts() -> None:
    """9 layers over PP 2 do not divide: PIP001 suggests full stages of 5 after a first of 4, and
    with the top-k shared every 3 layers (computing 0, 3, 6) it moves the boundary to layer 3."""
    model = {**_DSA_MODEL, "num_layers": 9, "dsa_indexer_topk_freq": 3}
    [pip] = [f for f in findings({"model": model}) if f.code == "PIP001"]
    assert pip.fix.endswith('pipeline_model_parallel_layout: "Et*3|t*6L"')
    layout = {"model": model, "parallel": {"pipeline_model_parallel_layout": "Et*3|t*6L"}}
    assert not [f for f in findings(layout) if f.severity == "error"]


def test_an_mtp_layer_reusing_a_top_k_needs_its_source_on_its_chunk_arc012() -> None:
    """dsa.py DSAttention.__init__ numbers MTP depth 1 after the 8 decoder layers (Megatron's
    layer 9, 0-based 8); with freq 3 (0, 3, 6 compute) it reuses layer 6's top-k
    (max(9 - 1, 0) % 3 = 2), which DSAttention.forward must find earlier on the same chunk: the
    MTP layer on a chunk of its own (PP 2 x VPP 2) is refused."""
    model = {**_DSA_MODEL, "dsa_indexer_topk_freq": 3, "mtp_num_layers": 1}
    arc = lambda layout: [f.message for f in findings(  # noqa: E731
        {"model": model, "parallel": {"pipeline_model_parallel_layout": layout}}) if f.code == "ARC012"]
    assert arc("Et*6|t*2mL") == []  # layer 6 computes and holds the chunk with the MTP layer
    [message] = arc("Et*3|t*3|t*2|mL")
    assert "MTP depth 1 (layer 8, 0-based) reuses the top-k of layer 6" in message

"""`moeplan emit bridge`: a plan as Megatron-Bridge ConfigContainer overrides (`KEY=VALUE`, the
Hydra syntax Megatron-Bridge's recipe runner takes after a recipe: scripts/training/run_recipe.py,
src/megatron/bridge/training/utils/omegaconf_utils.py parse_hydra_overrides).

The overrides are the values Megatron-LM's own container would hold for the plan's argument list:
the arguments `emit megatron` writes go where megatron/training/argument_utils.py
pretrain_cfg_container_from_args (and the core_transformer_config_from_args, gpt_config_from_args
and megatron/training/training.py get_megatron_ddp_config it calls) put them, which Megatron-Bridge's
ConfigContainer sections extend (Megatron-LM dev@d48bd6be; Megatron-Bridge main@067f987d). A field of
the same name is found in the committed table of Megatron's config dataclasses
(planner/config/megatron_config_fields.py); the arguments those functions move or invert are listed
below. What a Bridge recipe owns otherwise is said, not guessed: precision is a mixed-precision
recipe name, the sequence length is the dataset's, and an argument no section holds is named in the
file's header instead of being dropped silently.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from planner.config.hybrid_pattern import ATTENTION_RATIO, MTP_BREAK, SEGMENT_BREAK
from planner.config.importers.megatron_log import flag_destination
from planner.config.layer_freq import evaluate_pattern
from planner.config.megatron_config_fields import sections_holding
from planner.config.schema import Config
from planner.emit.megatron import MegatronArgs, MegatronFlag, megatron_arguments
from planner.emit.safety import EmitError

BRIDGE_FILE = "bridge_overrides.txt"
BRIDGE_SOURCE = "Megatron-Bridge main@067f987d"


def _same(value: Any) -> Any:
    return value


def _negated(value: Any) -> Any:
    return not value


def _one(value: Any) -> Any:
    return value[0] if isinstance(value, list) and len(value) == 1 else value


# Arguments Megatron's container builders place under another name or value, on top of (or instead of)
# a field of their own name: core_transformer_config_from_args (num_moe_experts, batch_p2p_comm,
# the first/last stage layer counts, fp8/fp4 param, gated_linear_unit for --swiglu, cp_comm_type of
# one entry), gpt_config_from_args (the model config's own fields), get_megatron_ddp_config (the ddp_*
# arguments) and Megatron-Bridge's dataset-owned sequence length (scripts/training/run_recipe.py:
# `dataset.seq_length`, from which the runner synchronises model.seq_length).
PLACED: dict[str, tuple[tuple[str, Callable[[Any], Any]], ...]] = {
    "num_experts": (("model.num_moe_experts", _same),),
    "overlap_p2p_comm": (("model.batch_p2p_comm", _negated),),
    "decoder_first_pipeline_num_layers": (("model.num_layers_in_first_pipeline_stage", _same),),
    "decoder_last_pipeline_num_layers": (("model.num_layers_in_last_pipeline_stage", _same),),
    "fp8_param_gather": (("model.fp8_param", _same),),
    "fp4_param_gather": (("model.fp4_param", _same),),
    "swiglu": (("model.gated_linear_unit", _same),),
    "cp_comm_type": (("model.cp_comm_type", _one),),
    # validate_args keeps a one-entry list as its entry (megatron/training/arguments.py).
    "moe_router_load_balancing_type": (("model.moe_router_load_balancing_type", _one),),
    "moe_aux_loss_coeff": (("model.moe_aux_loss_coeff", _one),),
    "no_persist_layer_norm": (("model.persist_layer_norm", _negated),),
    "position_embedding_type": (("model.position_embedding_type", _same),),
    "rotary_percent": (("model.rotary_percent", _same),),
    "rotary_base": (("model.rotary_base", _same),),
    "make_vocab_size_divisible_by": (("model.make_vocab_size_divisible_by", _same),),
    "use_rope_scaling": (("model.rope_scaling", _same),),
    "rotary_seq_len_interpolation_factor": (("model.seq_len_interpolation_factor", _same),),
    "untie_embeddings_and_output_weights": (("model.share_embeddings_and_output_weights", _negated),),
    # gpt_config_from_args gives the model the padded vocabulary and no further padding
    "vocab_size": (("model.vocab_size", _same), ("model.should_pad_vocab", lambda _: False)),
    "hybrid_layer_pattern": (("model.hybrid_layer_pattern", _same),),
    "fp16_lm_cross_entropy": (("model.fp16_lm_cross_entropy", _same),),
    "accumulate_allreduce_grads_in_fp32": (("ddp.grad_reduce_in_fp32", _same),),
    "ddp_num_buckets": (("ddp.num_buckets", _same),),
    "ddp_bucket_size": (("ddp.bucket_size", _same),),
    "ddp_average_in_collective": (("ddp.average_in_collective", _same),),
    "seq_length": (("dataset.seq_length", _same),),
    # Megatron-Bridge's own DistributedInitConfig field (src/megatron/bridge/training/config.py;
    # initialize.py turns it into the pp-before-dp rank order); Megatron reads the argument itself.
    "use_tp_pp_dp_mapping": (("dist.use_tp_pp_dp_mapping", _same),),
}
# Override paths only Megatron-Bridge's ConfigContainer has (Megatron's own container has no dataset
# or mixed-precision section, and reads the rank-order argument itself): the pre-flight cannot ask
# Megatron for these, tests/unit/emit/test_emit_bridge.py checks them against Bridge's source.
# Standard attention's YaRN factor is a GPTModelProvider field in Bridge (src/megatron/bridge/models/
# gpt_provider.py); Megatron's own TransformerConfig gets it as a plain attribute only when its
# arguments say yarn (megatron/training/argument_utils.py _apply_yarn_config_from_args).
BRIDGE_ONLY = ("mixed_precision", "dataset.", "dist.use_tp_pp_dp_mapping", "model.yarn_rotary_scaling_factor")
# Arguments whose value a Bridge override cannot carry, with what the recipe does instead.
NOT_CARRIED: dict[str, str] = {
    "max_position_embeddings": "a Bridge run's model.seq_length follows dataset.seq_length "
                               "(run_recipe.py synchronises it); RoPE models keep no position table",
    "spec": "a Bridge recipe's model provider chooses its layer spec (a module, not a value)",
    "group_query_attention": "model.num_query_groups carries it",
    "params_dtype": "set by the mixed-precision recipe",
}
# Argument dests the mixed-precision recipe sets (src/megatron/bridge/training/mixed_precision.py
# MixedPrecisionConfig.setup writes them into the model, optimizer and DDP configs).
PRECISION_DESTS = {"bf16", "fp16", "fp8", "fp8_recipe", "fp4", "fp4_recipe", "fp8_param_gather",
                   "fp4_param_gather"}
# Fields Megatron-Bridge's CommOverlapConfig re-derives at setup when a recipe sets `comm_overlap`
# (src/megatron/bridge/training/comm_overlap.py CommOverlapConfig._get_model_comm_overlap_cfgs and
# _get_optimizer_overlap_cfgs): for such a recipe they must be given as comm_overlap.<name>.
COMM_OVERLAP_FIELDS = ("tp_comm_overlap", "overlap_p2p_comm", "batch_p2p_comm", "overlap_grad_reduce",
                       "overlap_param_gather", "overlap_param_gather_with_optimizer_step",
                       "align_param_gather", "bucket_size", "defer_embedding_wgrad_compute",
                       "wgrad_deferral_limit", "overlap_moe_expert_parallel_comm",
                       "delay_wgrad_compute")


@dataclass(frozen=True)
class PrecisionRecipe:
    """One of Megatron-Bridge's registered mixed-precision recipes and the settings it fixes."""

    name: str
    fixes: dict[str, Any]


def _recipe(name: str, **fixes: Any) -> PrecisionRecipe:
    return PrecisionRecipe(name, fixes)


# (precision, FP8 recipe or "nvfp4") -> the recipe src/megatron/bridge/training/mixed_precision.py
# registers for it, with the FP8 format and parameter handling it sets.
PRECISION_RECIPES: dict[tuple[str, str | None], PrecisionRecipe] = {
    ("bf16", None): _recipe("bf16_mixed"),
    ("fp16", None): _recipe("fp16_mixed"),
    ("bf16", "delayed"): _recipe("bf16_with_fp8_delayed_scaling_mixed", fp8_format="hybrid",
                                 fp8_param_gather=True),
    ("fp16", "delayed"): _recipe("fp16_with_fp8_delayed_scaling_mixed", fp8_format="hybrid",
                                 fp8_param_gather=True),
    ("bf16", "mxfp8"): _recipe("bf16_with_mxfp8_mixed", fp8_format="e4m3", fp8_param_gather=True),
    ("fp16", "mxfp8"): _recipe("fp16_with_mxfp8_mixed", fp8_format="e4m3", fp8_param_gather=True),
    ("bf16", "tensorwise"): _recipe("bf16_with_fp8_current_scaling_mixed", fp8_format="hybrid",
                                    fp8_param_gather=True),
    ("fp16", "tensorwise"): _recipe("fp16_with_fp8_current_scaling_mixed", fp8_format="hybrid",
                                    fp8_param_gather=True),
    ("bf16", "blockwise"): _recipe("bf16_with_fp8_subchannel_scaling_mixed", fp8_format="hybrid",
                                   fp8_param_gather=False),
    ("fp16", "blockwise"): _recipe("fp16_with_fp8_subchannel_scaling_mixed", fp8_format="hybrid",
                                   fp8_param_gather=False),
    ("bf16", "nvfp4"): _recipe("bf16_with_nvfp4_mixed", fp8_param_gather=False),
}


@dataclass
class BridgeOverrides:
    """The overrides in the argument list's order, the comm_overlap alternatives, and what a Bridge
    override does not carry (each with why)."""

    lines: list[tuple[str, Any, str]] = field(default_factory=list)  # path, value, moeplan source
    comm_overlap: list[tuple[str, Any]] = field(default_factory=list)
    not_carried: list[str] = field(default_factory=list)

    def set(self, path: str, value: Any, source: str) -> None:
        held = next((line for line in self.lines if line[0] == path), None)
        if held is not None:
            if held[1] != value:
                raise ValueError(f"{path} is placed twice: {held[1]!r} from {held[2]} and "
                                 f"{value!r} from {source}")
            return
        self.lines.append((path, value, source))


_INT = re.compile(r"-?\d+")
_FLOAT = re.compile(r"-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?|-?\d+[eE][-+]?\d+")
# Arguments whose argparse type evaluates a list expression (megatron/training/arguments.py
# moe_freq_type, no_rope_freq_type, la_freq_type) or parses a bracketed list / a pair.
_LIST_EXPRESSIONS = {"moe_layer_freq", "window_attn_skip_freq", "no_rope_freq", "linear_attention_freq",
                     "csa_compress_ratios"}


def _scalar(word: str) -> Any:
    if _INT.fullmatch(word):
        return int(word)
    if _FLOAT.fullmatch(word):
        return float(word)
    return {"None": None, "True": True, "False": False}.get(word, word)


def argument_value(flag: MegatronFlag) -> tuple[str, Any] | None:
    """The dest and value Megatron-LM dev's argparse makes of one emitted flag (None: dev's parser
    has no such argument)."""
    row = flag_destination(flag.flag)
    if row is None:
        return None
    if row.kind in ("true", "false"):
        return row.dest, row.kind == "true"
    if row.dest in _LIST_EXPRESSIONS:
        return row.dest, evaluate_pattern(flag.values[0])
    if row.dest == "window_size":
        return row.dest, [int(w) for w in flag.values[0].split(",")]
    values = [_scalar(w) for w in flag.values]
    return row.dest, values if row.nargs in ("+", "*") else values[0]


def full_compress_ratios(compact: list[int], pattern: str) -> list[int]:
    """DeepSeek-V4's compress ratios as TransformerConfig holds them: one per symbol of the hybrid
    pattern (pipes and the MTP separator dropped), 0 for every non-attention symbol
    (megatron/training/argument_utils.py _normalize_dsv4_hybrid_csa_compress_ratios)."""
    ratios = iter(compact)
    layers = [s for s in pattern if s not in (SEGMENT_BREAK, MTP_BREAK)]
    return [next(ratios) if s in ATTENTION_RATIO else 0 for s in layers]


def precision_recipe(cfg: Config) -> PrecisionRecipe | None:
    """The Megatron-Bridge mixed-precision recipe that sets the plan's precision (None: fp32)."""
    t = cfg.training
    if t.precision == "fp32":
        return None
    key = (t.precision, "nvfp4" if t.fp4 else t.fp8_recipe if t.fp8 else None)
    if key not in PRECISION_RECIPES:
        names = ", ".join(r.name for r in PRECISION_RECIPES.values())
        raise EmitError("training.precision", f"{t.precision} with {key[1]}: Megatron-Bridge registers "
                        f"no mixed-precision recipe for it (it has {names}); emit megatron instead")
    return PRECISION_RECIPES[key]


def _precision(cfg: Config, out: BridgeOverrides) -> None:
    recipe = precision_recipe(cfg)
    out.set("mixed_precision", None if recipe is None else recipe.name, "training.precision")
    if recipe is None:
        return
    plan = {"fp8_format": cfg.training.fp8_format, "fp8_param_gather": cfg.training.fp8_param_gather}
    for name, fixed in recipe.fixes.items():
        if plan[name] != fixed:
            out.not_carried.append(f"training.{name} {plan[name]!r}: the recipe {recipe.name} sets "
                                   f"{fixed!r} (src/megatron/bridge/training/mixed_precision.py)")


def bridge_overrides(cfg: Config, args: MegatronArgs | None = None) -> BridgeOverrides:
    """Every emitted argument placed in the container (EmitError from `emit megatron` propagates)."""
    args = args or megatron_arguments(cfg)
    out = BridgeOverrides()
    mla = any(f.flag == "--multi-latent-attention" for f in args.flags)
    _precision(cfg, out)
    for flag in args.flags:
        parsed = argument_value(flag)
        if parsed is None:
            out.not_carried.append(f"{flag.flag} ({flag.source}): an argument of Megatron-LM {args.branch}, "
                                   "not of dev, whose config dataclasses these overrides name")
            continue
        dest, value = parsed
        if dest == "no_rope_freq":  # TransformerConfig.__post_init__ holds it per layer
            value = cfg.model.no_rope_layers()
        if dest in PRECISION_DESTS:
            continue
        if dest in NOT_CARRIED:
            out.not_carried.append(f"{flag.flag} ({flag.source}): {NOT_CARRIED[dest]}")
            continue
        # a field of the argument's name in every section that has one, unless the builders place it
        placed = {f"{section}.{dest}": _same for section in sections_holding(dest, mla=mla)}
        placed.update(PLACED.get(dest, ()))
        if dest == "rotary_scaling_factor" and not mla:  # standard attention's YaRN factor
            placed = {"model.yarn_rotary_scaling_factor": _same}
        if not placed:
            out.not_carried.append(f"{flag.flag} ({flag.source}): no section of Megatron's config "
                                   "container has this field; pass it as the recipe's own setting")
            continue
        if dest == "vocab_size":  # the embedding rows Megatron builds (make_vocab_size_divisible_by x TP)
            placed["model.vocab_size"] = lambda _: cfg.padded_vocab_size
        if dest == "csa_compress_ratios":
            pattern = next(f.values[0] for f in args.flags if f.flag == "--hybrid-layer-pattern")
            value = full_compress_ratios(value, pattern)
        for path, transform in placed.items():
            out.set(path, transform(value), flag.source)
    for path, value, _ in out.lines:
        name = path.split(".", 1)[1] if "." in path else path
        if name in COMM_OVERLAP_FIELDS and path.startswith(("model.", "ddp.")):
            out.comm_overlap.append((f"comm_overlap.{name}", value))
    return out


def megatron_view(out: BridgeOverrides) -> dict[str, Any]:
    """The overrides Megatron's own container holds, path -> value: what `--check-with` asks
    Megatron-LM (megatron/training/argument_utils.py pretrain_cfg_container_from_args) to confirm."""
    return {path: value for path, value, _ in out.lines if not path.startswith(BRIDGE_ONLY)}


_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar: true/false/null, numbers, [lists], quoted strings."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _BARE.fullmatch(text) and text not in ("true", "false", "null"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def bridge_file_text(cfg: Config, digest: str, config_path: str) -> str:
    """The overrides file: a header saying how to pass it and what it leaves out, then one override
    per line (comments are skipped by `grep -v '^#'`)."""
    out = bridge_overrides(cfg)
    head = [
        "# Megatron-Bridge ConfigContainer overrides reproducing a moeplan plan (`moeplan emit`).",
        f"#   config {config_path}",
        f"#   plan plan.json {digest}",
        "# Pass them after a recipe, e.g.:",
        "#   scripts/training/train.sh [launch options] --recipe RECIPE $(grep -v '^#' bridge_overrides.txt)",
        "# Field names follow Megatron-LM dev@d48bd6be's config dataclasses (which Megatron-Bridge's",
        f"# ConfigContainer sections extend) and {BRIDGE_SOURCE}'s ConfigContainer.",
    ]
    if out.not_carried:
        head.append("# Not carried by these overrides (set them in the recipe, or accept the difference):")
        head += [f"#   {item}" for item in out.not_carried]
    body = [f"{path}={hydra_value(value)}" for path, value, _ in out.lines]
    tail = []
    if out.comm_overlap:
        tail = ["# A recipe that sets `comm_overlap` re-derives these at setup (CommOverlapConfig);",
                "# for such a recipe add these lines (without the leading '# '):"]
        tail += [f"# {path}={hydra_value(value)}" for path, value in out.comm_overlap]
    return "\n".join([*head, *body, *tail]) + "\n"

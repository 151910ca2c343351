"""Run a user's own Megatron-LM on emitted argument lists, on CPU, and report what it says.

This is a standalone script (`python megatron_probe.py REQUEST.json RESULT.json`), started in a
subprocess by `moeplan emit … --check-with`; planner never imports it (planner must not import
torch). For each request it runs Megatron's own chain — `parse_args` → `validate_args` →
`set_global_variables` → `core_transformer_config_from_args` → `hybrid_config_from_args` (hybrid
entry) or `gpt_config_from_args` (GPT entry) — and then asks Megatron, for every (pipeline rank,
virtual stage) under torch's fake process group, which decoder, MoE and MTP layers it builds and
which of those MoE layers its router hash-routes, and reads the rotary settings the configs ended
up with. A request with "count_parameters" also gets the parameters of Megatron's GPTModel built
whole on one rank on the meta device (`_parameter_counts`).

Hash routing is decided by Megatron's own objects (as of Megatron-LM dev@d48bd6be):
`megatron/core/transformer/moe/router.py TopKRouter.__init__` sets `is_hash_layer` from the layer
number the stack gives it, and the stack numbers its layers (`megatron/core/models/hybrid/
hybrid_block.py HybridStack` numbers every pattern symbol from the segment's
`select_pipeline_segment` offset; `megatron/core/transformer/transformer_block.py TransformerBlock`
numbers decoder layers from `get_transformer_layer_offset` or the pipeline layout;
`MultiTokenPredictionBlock` marks MTP layers). Building them at the model's real size
would allocate every expert on this CPU, so the stacks are built from a toy `TransformerConfig`
that copies only what decides numbering and routing (layer count, hybrid pattern or MoE layer
frequency, hash count, pipeline sizes / layout / uneven first and last stages, MTP depths) and
shrinks the rest (hidden 8, 2 experts, one head, local non-Transformer-Engine modules, weights on
the CPU); non-MoE symbols of a hybrid segment stay `HybridStack`'s default `IdentityOp`. The toy
config is listed in the result with the stand-ins. Without `--moe-n-hash-layers` (or experts) no
router can hash (`moe_n_hash_layers > 0` is part of the router's condition), so no stack is built.

A CPU machine cannot answer a few GPU-only queries. Each gets an explicit stand-in, applied only
when the real thing is missing and listed in the result; nothing else is patched:
  * CUDA device capability → sm_90 (`torch.cuda.get_device_capability`/`get_device_properties`)
  * the Transformer Engine version gate → STAND_IN_TE_VERSION (`megatron.core.utils._te_version`),
    and with it the presence of TE's fused RoPE kernel (`rope_utils.fused_apply_rotary_pos_emb`),
    which `TransformerConfig` asks for when RoPE fusion is on (Megatron's default)
  * the cuDNN DSA kernel presence check (device + `flash_mla`/`cudnn.DSA` import) → present, so a
    login node without the kernels judges the arguments, not the installation
  * the flash-linear-attention kernel presence check of gated DeltaNet (`HAVE_FLA`) → present, its
    kernel not callable (only the parameter count builds the module)
  * `typing.override` (Python 3.12) → `typing_extensions.override` on Python 3.11
  * `torch.cuda.current_device` → "cpu": the router allocates its hash table (tid2eid) and expert
    bias on the current device while the hash-routing stacks are built

Two speed-ups change no answer and are not listed:
  * Megatron's argument factory reads each config dataclass's source again at every `parse_args`
    for its fields' help texts
    (`megatron/training/argument_utils.py ArgumentGroupFactory._get_field_docstrings`: inspect
    and ast on TransformerConfig and its kin, about half a second a parse on a CPU), so the probe
    keeps each class's texts after the first read (`_read_field_docstrings_once`).
  * Megatron wraps its fused kernels in `torch.compile` as its modules are imported
    (`megatron/core/jit.py` `jit_fuser`, `@torch.compile` on the inference router's top-k and the
    hyper-connection kernels), and torch's first `torch.compile` imports its compiler front end,
    torch._dynamo with sympy: about 2.7 of Megatron's 7 s import on a CPU. The probe builds
    Megatron's configs and modules and never calls a kernel, so in its process `torch.compile`
    hands the function back uncompiled (`_uncompiled`), as Megatron's own `disable_jit_fuser`
    does for `jit_fuser`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import sys
import traceback
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STAND_IN_TE_VERSION = "2.14.0"
STAND_IN_CAPABILITY = (9, 0)
TOY_HIDDEN, TOY_EXPERTS, TOY_VOCAB = 8, 2, 16
# The probe's own questions once Megatron has built its configs (the name a refusal there reports).
PROBE_STEP = "pipeline layout and hash-routing stacks"
# What the GPT stack's layer numbering and MoE placement read from the TransformerConfig.
GPT_NUMBERING_FIELDS = (
    "num_layers", "moe_layer_freq", "moe_n_hash_layers", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "pipeline_model_parallel_layout",
    "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "mtp_num_layers")
ROTARY_FIELDS = ("position_embedding_type", "rope_type", "rotary_base", "rotary_scaling_factor",
                 "original_max_position_embeddings", "csa_compress_rotary_base", "beta_fast", "beta_slow",
                 "rotary_percent")
TOY_STACKS = (f"hash-routing stacks: toy TransformerConfig (hidden {TOY_HIDDEN}, {TOY_EXPERTS} experts, "
              "1 head, local modules, CPU weights) with the real layer count, pattern or MoE layer "
              "frequency, hash count, pipeline split and MTP depths")


class Unusable(Exception):
    """The folder or interpreter cannot run Megatron at all (not a verdict on the config)."""


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def install_stand_ins(megatron_dir: Path) -> list[str]:
    """Import Megatron from `megatron_dir` with the GPU-only stand-ins; the list of those used."""
    used: list[str] = []
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override  # type: ignore[attr-defined]
        used.append("typing.override: typing_extensions.override (Python < 3.12)")
    try:
        import torch
    except ImportError as exc:
        raise Unusable(f"this Python cannot import torch ({exc})") from None
    if not torch.cuda.is_available():
        major, minor = STAND_IN_CAPABILITY
        torch.cuda.get_device_capability = lambda device=None: (major, minor)
        torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(
            major=major, minor=minor, name=f"stand-in sm_{major}{minor}")
        used.append(f"CUDA device capability: sm_{major}{minor} (no CUDA device here)")
        torch.cuda.current_device = lambda: "cpu"
        used.append("CUDA current device: cpu (no CUDA device here; the router's buffers go there)")
    sys.path.insert(0, str(megatron_dir))
    torch.compile = _uncompiled  # type: ignore[assignment]  # for every Megatron module, also later imports
    try:
        import megatron.core.transformer.transformer_config as transformer_config
        import megatron.core.utils as core_utils
        from megatron.training import arguments  # noqa: F401  (fails early if the package is broken)
    except ImportError as exc:
        raise Unusable(f"cannot import Megatron-LM from {megatron_dir}: {exc}") from None
    if not _installed("transformer_engine"):
        used.extend(_transformer_engine_stand_ins(core_utils))
    real_check = getattr(transformer_config, "_validate_dsa_kernel_backend_dependencies", None)
    missing_kernels = getattr(core_utils, "_missing_cudnn_dsa_kernel_dependencies", lambda: [])
    if real_check is not None and (not torch.cuda.is_available() or missing_kernels()):

        def dsa_backend_check(backend: str) -> None:
            """The backend name is still validated; only the device/kernel presence is assumed."""
            return None if backend == "cudnn" else real_check(backend)

        transformer_config._validate_dsa_kernel_backend_dependencies = dsa_backend_check
        if not _installed("cudnn"):
            sys.modules["cudnn"] = _cudnn_dsa_stand_in()
        used.append("cuDNN DSA kernel presence check: kernels present (flash_mla, cudnn.DSA with "
                    "q_causal_offsets; no CUDA device or no kernels here)")
    used.extend(_fla_stand_in())
    _read_field_docstrings_once()
    return used


def _uncompiled(model: Any = None, **options: Any) -> Any:
    """`torch.compile`'s two forms, compiling nothing: `torch.compile(fn)` is `fn`, and
    `torch.compile(**options)` a decorator that returns the function it decorates."""
    return model if model is not None else (lambda function: function)


def _read_field_docstrings_once() -> None:
    """Keep each dataclass's field help texts after Megatron's first read of its source: they are
    a function of the class alone, and a batch of requests parses arguments hundreds of times."""
    try:
        from megatron.training import argument_utils
    except ImportError:  # a Megatron-LM before the dataclass-driven arguments
        return
    factory = getattr(argument_utils, "ArgumentGroupFactory", None)
    read = getattr(factory, "_get_field_docstrings", None)
    if read is None:
        return
    texts: dict[type, dict[str, str]] = {}

    def read_once(self: Any, src_cfg_class: type) -> dict[str, str]:
        if src_cfg_class not in texts:
            texts[src_cfg_class] = read(self, src_cfg_class)
        return dict(texts[src_cfg_class])

    factory._get_field_docstrings = read_once  # type: ignore[union-attr]


def _fla_stand_in() -> list[str]:
    """Gated DeltaNet refuses to build without flash-linear-attention's kernels
    (megatron/core/ssm/gated_delta_net/common.py _GDNBase.__init__: HAVE_FLA); the parameter count
    only builds it, so a not-callable kernel stands in when FLA is not installed."""
    if _installed("fla"):
        return []
    try:
        from megatron.core.ssm.gated_delta_net import common, gdn
    except ImportError:
        return []
    kernel = _not_callable("flash-linear-attention chunk_gated_delta_rule")
    common.HAVE_FLA = True
    common.chunk_gated_delta_rule = gdn.chunk_gated_delta_rule = kernel
    return ["flash-linear-attention kernel presence check (gated DeltaNet): present, not callable "
            "(not installed)"]


def _transformer_engine_stand_ins(core_utils: Any) -> list[str]:
    """Transformer Engine is not installed: its version gate and fused RoPE kernel stand in."""
    from packaging.version import Version

    used = []
    if hasattr(core_utils, "_te_version"):
        core_utils._te_version = Version(STAND_IN_TE_VERSION)
        used.append(f"Transformer Engine version gate: {STAND_IN_TE_VERSION} (not installed)")
    try:
        from megatron.core.models.common.embeddings import rope_utils
    except ImportError:
        return used
    if getattr(rope_utils, "fused_apply_rotary_pos_emb", False) is None:
        rope_utils.fused_apply_rotary_pos_emb = _not_callable("Transformer Engine fused RoPE")
        used.append("Transformer Engine fused RoPE kernel: present (not installed)")
    return used


def _not_callable(what: str) -> Any:
    def stand_in(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"stand-in for {what}: not callable on CPU")

    return stand_in


def _cudnn_dsa_stand_in() -> types.ModuleType:
    def wrapper(*args: Any, q_causal_offsets: Any = None, **kwargs: Any) -> None:
        raise RuntimeError("stand-in cuDNN DSA kernel: not callable on CPU")

    module = types.ModuleType("cudnn")
    module.DSA = types.SimpleNamespace(  # type: ignore[attr-defined]
        indexer_forward_wrapper=wrapper, dense_indexer_score_recompute_wrapper=wrapper,
        dense_attn_score_recompute_wrapper=wrapper, dense_indexer_backward_wrapper=wrapper)
    return module


def _location(exc: BaseException, megatron_dir: Path) -> str | None:
    """`megatron/…/file.py:LINE function` of the last traceback frame inside the megatron package."""
    package = (megatron_dir / "megatron").resolve()
    where = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(package):
            where = f"{path.relative_to(megatron_dir.resolve()).as_posix()}:{frame.lineno} {frame.name}"
    return where


def _message(exc: BaseException, argparse_text: str) -> str:
    if isinstance(exc, SystemExit):
        lines = [line for line in argparse_text.splitlines() if "error:" in line]
        return lines[-1].split("error:", 1)[1].strip() if lines else argparse_text.strip()
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _megatron_chain(request: dict[str, Any], not_run: list[str],
                    steps: list[str]) -> tuple[Any, Any, Any]:
    from megatron.training import arguments

    try:
        from megatron.training import argument_utils
    except ImportError:  # older Megatron-LM: everything lives in arguments.py
        argument_utils = arguments
    sys.argv = [request.get("entry", "pretrain_gpt.py"), *request["argv"]]
    steps.append("parse_args")
    args = arguments.parse_args()
    steps.append("validate_args")
    arguments.validate_args(args, {})
    steps.append("set_global_variables")
    arguments.set_global_variables(args)
    steps.append("core_transformer_config_from_args")
    make_transformer = getattr(argument_utils, "core_transformer_config_from_args",
                               arguments.core_transformer_config_from_args)
    transformer = make_transformer(args)
    builder = ("hybrid_config_from_args" if args.hybrid_layer_pattern is not None
               else "gpt_config_from_args")
    make_model_config = getattr(argument_utils, builder, None)
    if make_model_config is None:
        not_run.append(f"{builder}: not in this Megatron-LM")
        return args, transformer, None
    steps.append(builder)
    model_args = args
    if args.spec is not None and not _installed("transformer_engine"):
        model_args = argparse.Namespace(**{**vars(args), "spec": None})
        not_run.append(f"--spec {' '.join(args.spec)}: the layer-spec factory builds Transformer Engine "
                       "modules, and Transformer Engine is not installed")
    return args, transformer, make_model_config(model_args, transformer)


@contextlib.contextmanager
def _pipeline_rank(rank: int, pp: int, vpp: int) -> Iterator[Any]:
    """Megatron's process groups as pipeline rank `rank` of `pp` sees them (torch's fake backend)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=pp)
    try:
        parallel_state.initialize_model_parallel(
            pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
            create_gloo_process_groups=False)
        yield ProcessGroupCollection.use_mpu_process_groups()
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def _toy_config(**numbering: Any) -> Any:
    """A TransformerConfig with the real numbering/routing fields and toy sizes (module docstring)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(hidden_size=TOY_HIDDEN, ffn_hidden_size=TOY_HIDDEN, num_attention_heads=1,
                             num_moe_experts=TOY_EXPERTS, moe_router_topk=TOY_EXPERTS,
                             moe_ffn_hidden_size=TOY_HIDDEN, actual_vocab_size=TOY_VOCAB,
                             pipeline_dtype=torch.float32, use_cpu_initialization=True,
                             add_bias_linear=False, **numbering)


def _routers(module: Any) -> list[list[Any]]:
    """[Megatron layer number, hash-routed] of every router `module` built, in build order."""
    from megatron.core.transformer.moe.router import TopKRouter

    return [[m.layer_number, bool(m.is_hash_layer)] for m in module.modules() if isinstance(m, TopKRouter)]


def _hybrid_submodules() -> tuple[Any, Any]:
    """Megatron's local MoE layer for `E` symbols (others stay IdentityOp) and the MTP block spec."""
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.models.hybrid.hybrid_block import HybridStack, HybridStackSubmodules
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer.multi_token_prediction import (
        MultiTokenPredictionBlock,
        MultiTokenPredictionBlockSubmodules,
        MultiTokenPredictionLayer,
        MultiTokenPredictionLayerSubmodules,
    )
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

    moe = get_moe_module_spec(use_te=False, num_experts=TOY_EXPERTS, moe_grouped_gemm=False)
    submodules = HybridStackSubmodules(
        moe_layer=ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(mlp=moe)))
    layer = MultiTokenPredictionLayerSubmodules(
        enorm=WrappedTorchNorm, hnorm=WrappedTorchNorm, layer_norm=WrappedTorchNorm,
        eh_proj=ColumnParallelLinear,
        mtp_model_layer=ModuleSpec(module=HybridStack, submodules=submodules))
    mtp = ModuleSpec(module=MultiTokenPredictionBlock, submodules=MultiTokenPredictionBlockSubmodules(
        layer_specs=[ModuleSpec(module=MultiTokenPredictionLayer, submodules=layer)]))
    return submodules, mtp


def _hybrid_chunks(args: Any, pp: int, vpp: int, hashing: bool) -> list[dict[str, Any]]:
    from megatron.core.models.hybrid.hybrid_block import HybridStack
    from megatron.core.models.hybrid.hybrid_layer_allocation import (
        Symbols,
        get_hybrid_total_layer_count,
        parse_hybrid_pattern,
        select_pipeline_segment,
    )
    from megatron.core.transformer.multi_token_prediction import (
        MultiTokenPredictionBlock,
        mtp_on_this_rank,
    )

    parsed = parse_hybrid_pattern(args.hybrid_layer_pattern)
    main = parsed.main_pattern or ""
    mtp_moe = (parsed.mtp_pattern or "").count(Symbols.MOE) * parsed.mtp_num_depths
    mixers = Symbols.VALID_LAYERS - {Symbols.MLP, Symbols.MOE}
    submodules, mtp_spec = _hybrid_submodules() if hashing else (None, None)
    chunks = []
    for rank in range(pp):
        with _pipeline_rank(rank, pp, vpp) as groups:
            toy = _toy_config(num_layers=get_hybrid_total_layer_count(main), is_hybrid_model=True,
                              moe_n_hash_layers=args.moe_n_hash_layers, pipeline_model_parallel_size=pp,
                              virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                              mtp_num_layers=parsed.mtp_num_depths or None) if hashing else None
            for virtual in range(vpp):
                vp_stage = virtual if vpp > 1 else None
                layers, offset = select_pipeline_segment(
                    main, groups.pp, vp_stage, first_stage_layers=args.decoder_first_pipeline_num_layers,
                    last_stage_layers=args.decoder_last_pipeline_num_layers)
                mtp = parsed.mtp_num_depths > 0 and mtp_on_this_rank(
                    layout=None, mtp_num_layers=args.mtp_num_layers, ignore_virtual=False,
                    vp_stage=vp_stage)
                chunk = {"stage": rank, "virtual": virtual, "layers": sum(s in mixers for s in layers),
                         "moe_layers": layers.count(Symbols.MOE),
                         "mtp_layers": parsed.mtp_num_depths if mtp else 0,
                         "mtp_moe_layers": mtp_moe if mtp else 0}
                if hashing:
                    stack = HybridStack(toy, submodules, layer_type_list=layers, pp_layer_offset=offset,
                                        post_layer_norm=False, post_process=False, pg_collection=groups)
                    chunk["routers"] = _routers(stack)
                    chunk["mtp_routers"] = _routers(MultiTokenPredictionBlock(
                        toy, mtp_spec, vp_stage=vp_stage, pg_collection=groups,
                        mtp_layer_pattern=parsed.mtp_pattern, mtp_num_depths=parsed.mtp_num_depths,
                        hybrid_submodules=submodules)) if mtp else []
                chunks.append(chunk)
    return chunks


def _gpt_chunks(transformer: Any, pp: int, vpp: int, hashing: bool) -> list[dict[str, Any]]:
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_decoder_layer_specs,
    )
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.multi_token_prediction import get_mtp_num_layers_to_build
    from megatron.core.transformer.transformer_block import TransformerBlock, get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    moe = _gpt_moe_layers(transformer, get_gpt_decoder_layer_specs, MoELayer)
    layout = transformer.pipeline_model_parallel_layout
    numbering = {name: getattr(transformer, name) for name in GPT_NUMBERING_FIELDS}
    chunks = []
    for rank in range(pp):
        with _pipeline_rank(rank, pp, vpp) as groups:
            toy = _toy_config(**numbering) if hashing else None
            for virtual in range(vpp):
                vp_stage = virtual if vpp > 1 else None
                if layout is not None:
                    ids = layout.get_layer_id_list(layer_type=LayerType.decoder, vp_stage=vp_stage,
                                                   pp_rank=rank)
                else:
                    count = get_num_layers_to_build(transformer, vp_stage=vp_stage, pp_rank=rank)
                    offset = get_transformer_layer_offset(transformer, vp_stage=vp_stage, pp_rank=rank)
                    ids = list(range(offset, offset + count))
                _check_dsa_index_share(transformer, ids)
                mtp = get_mtp_num_layers_to_build(transformer, vp_stage=vp_stage, pp_rank=rank)
                chunk = {"stage": rank, "virtual": virtual, "layers": len(ids),
                         "moe_layers": sum(moe[i] for i in ids), "mtp_layers": mtp}
                if hashing:  # MTP layers are not built here: the router never hashes one (router.py)
                    spec = get_gpt_decoder_block_spec(toy, use_transformer_engine=False,
                                                      vp_stage=vp_stage, pp_rank=rank)
                    chunk["routers"] = _routers(TransformerBlock(toy, spec, post_process=False,
                                                                 pg_collection=groups, vp_stage=vp_stage))
                chunks.append(chunk)
    return chunks


def _check_dsa_index_share(transformer: Any, ids: Any) -> None:
    """Megatron's own check of a chunk's layers under DSA top-k sharing, which it runs when it
    builds the DSA decoder block (megatron/core/models/gpt/
    experimental_attention_variant_module_specs.py _validate_dsa_index_share_pipeline_split:
    a reused top-k must come from earlier in the chunk); the toy stacks here are not DSA blocks,
    so it is called on the chunk's layer ids directly. A checkout without it shares no top-k."""
    if getattr(transformer, "experimental_attention_variant", None) != "dsa":
        return
    from megatron.core.models.gpt import experimental_attention_variant_module_specs as specs

    validate = getattr(specs, "_validate_dsa_index_share_pipeline_split", None)
    if validate is not None:
        validate(transformer, list(ids))


def _gpt_moe_layers(transformer: Any, layer_specs: Any, moe_layer: Any) -> list[bool]:
    """Which decoder layers are MoE, as the GPT path decides: from its layer specs, or, for an
    experimental attention variant (gated DeltaNet), whose layer specs exist only with Transformer
    Engine, from the MoE pattern those specs are cut from (megatron/core/models/gpt/
    experimental_attention_variant_module_specs.py get_moe_layer_pattern)."""
    if getattr(transformer, "experimental_attention_variant", None) is not None:
        from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
            get_moe_layer_pattern,
        )

        return [bool(flag) for flag in get_moe_layer_pattern(transformer)]
    specs = layer_specs(transformer, use_transformer_engine=False)
    return [_builds(spec.submodules.mlp) is moe_layer for spec in specs]


def _builds(spec: Any) -> Any:
    """The class a layer spec builds: a ModuleSpec's `module`, or a partial's function."""
    return getattr(spec, "module", None) or getattr(spec, "func", None)


def _rotary(transformer: Any, model_config: Any) -> dict[str, Any]:
    """The rotary settings as built: the TransformerConfig's where it has the field (MLA and DSv4
    attention read theirs) or its yarn_-prefixed twin (standard attention's YaRN), else the
    GPT/hybrid model config's (standard attention's rotary base)."""
    found = {}
    for name in ROTARY_FIELDS:
        yarn = f"yarn_{name}"  # standard attention's YaRN (argument_utils.py _apply_yarn_config_from_args)
        if transformer is not None and not hasattr(transformer, name) and hasattr(transformer, yarn):
            found[name] = getattr(transformer, yarn)
            continue
        for source in (transformer, model_config):
            if source is not None and hasattr(source, name):
                value = getattr(source, name)
                found[name] = value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)
                break
    return found


SHAPE_FIELDS = ("num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
                "moe_ffn_hidden_size", "multi_latent_attention", "q_lora_rank", "kv_lora_rank",
                "qk_head_dim", "v_head_dim", "qk_pos_emb_head_dim", "gated_linear_unit",
                "normalization", "add_bias_linear", "qk_layernorm", "moe_shared_expert_gate",
                "moe_router_dtype", "hidden_dropout", "attention_dropout",
                # current MoE architectures (gpt-oss, GLM-4.5, MiniMax-M2)
                "softmax_type", "window_size", "window_attn_skip_freq", "glu_linear_offset",
                "activation_func_clamp_value", "add_qkv_bias", "no_rope_freq", "qk_l2_norm",
                "moe_apply_probs_on_input", "experimental_attention_variant", "linear_attention_freq",
                "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                "linear_num_key_heads", "linear_num_value_heads", "attention_output_gate")


def _shape(transformer: Any) -> dict[str, Any]:
    """The model-shape fields of the TransformerConfig (MLATransformerConfig for MLA) as built."""
    found = {}
    for name in SHAPE_FIELDS:
        if hasattr(transformer, name):
            value = getattr(transformer, name)
            if isinstance(value, (tuple, list)) and all(isinstance(v, (int, float)) for v in value):
                value = list(value)  # window_size (left, right), a per-layer pattern
            found[name] = (value if isinstance(value, (bool, int, float, str, list, type(None)))
                           else repr(value))
    return found


# The parallel sizes a one-rank copy of the model resets (the parameter count is of the whole model).
ONE_RANK = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
            "virtual_pipeline_model_parallel_size": None, "pipeline_model_parallel_layout": None,
            "num_layers_in_first_pipeline_stage": None, "num_layers_in_last_pipeline_stage": None,
            "expert_model_parallel_size": 1, "expert_tensor_parallel_size": 1,
            "context_parallel_size": 1, "sequence_parallel": False}
# Fused-kernel switches the local modules refuse (megatron/core/transformer/torch_norm.py
# WrappedTorchNorm), and the token dispatcher (the all-to-all one opens a CUDA stream,
# megatron/core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher) with the shared-expert
# overlap and the EP all-to-all overlap that TransformerConfig.__post_init__ allows only beside
# alltoall or flex (the latter only with EP > 1, which the one-rank copy resets): none holds parameters.
LOCAL_KERNELS = {"persist_layer_norm": False, "memory_efficient_layer_norm": False,
                 "layernorm_zero_centered_gamma": False, "gradient_accumulation_fusion": False,
                 "moe_token_dispatcher_type": "allgather", "moe_shared_expert_overlap": False,
                 "overlap_moe_expert_parallel_comm": False, "delay_wgrad_compute": False}


def _parameter_free_core_attention() -> Any:
    import torch

    class CoreAttention(torch.nn.Module):
        """Stands in for MLA's local core attention: Megatron's local MLA spec passes it
        `k_channels`/`v_channels`, which DotProductAttention does not take (dev@d48bd6be
        megatron/core/models/gpt/gpt_layer_specs.py get_gpt_layer_local_submodules), and the
        softmax(QK^T)V it computes holds no parameters."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()

    return CoreAttention


@functools.cache
def _duplicated_linear() -> Any:
    """Stands in for Transformer Engine's TELinear, the one module DSA's spec takes from
    `backend.linear()` (megatron/core/models/gpt/experimental_attention_variant_module_specs.py
    get_dsa_module_spec_for_backend; megatron/core/models/backends.py LocalSpecProvider has no
    `linear`). DSA builds it with parallel_mode "duplicated" (dsa.py DSAIndexer.__init__): a
    whole, un-split weight [output, input] on every TP rank, and a bias only when asked (never
    here), so its parameters are TELinear's, by name and shape. It never runs."""
    import torch

    class DuplicatedLinear(torch.nn.Module):
        def __init__(self, input_size: int, output_size: int, *, config: Any, bias: bool,
                     **_: Any) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(output_size, input_size,
                                                         dtype=config.params_dtype))
            self.bias = (torch.nn.Parameter(torch.empty(output_size, dtype=config.params_dtype))
                         if bias else None)

    return DuplicatedLinear


def _dsa_attention_spec(config: Any) -> Any:
    """DSA's self-attention spec from Megatron's own builder with the local backend and the
    duplicated linear above for `backend.linear()`. AbsorbedMLASelfAttention accepts its
    down projections only as TELinear (duplicated) or a column-parallel linear
    (absorbed_mla.py AbsorbedMLASelfAttention.__init__, `in [TELinear]`), and binds TELinear to
    None when Transformer Engine is missing, so the stand-in takes that name there too."""
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.transformer.experimental_attention_variant import absorbed_mla

    if absorbed_mla.TELinear is None:
        absorbed_mla.TELinear = _duplicated_linear()
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_dsa_module_spec_for_backend,
    )

    class LocalWithLinear(LocalSpecProvider):
        def linear(self) -> type:
            return _duplicated_linear()

    return get_dsa_module_spec_for_backend(config=config, backend=LocalWithLinear())


def _local_block_spec(config: Any, block_spec: Any) -> Any:
    """The local decoder block spec of `config`. Gated DeltaNet layers (experimental attention
    variant gated_delta_net) have Transformer-Engine-only specs (megatron/core/models/gpt/
    experimental_attention_variant_module_specs.py _get_backend_spec_provider), so their layers
    get Megatron's GatedDeltaNet module with local linear layers standing in for Transformer
    Engine's (its in_proj fuses the input norm, which the local layer keeps apart: the same
    parameters), on the layers get_linear_attention_pattern marks."""
    import dataclasses

    variant = getattr(config, "experimental_attention_variant", None)
    if variant == "dsa":  # every layer DSA (megatron/core/transformer/experimental_attention_variant)
        spec = block_spec(dataclasses.replace(config, experimental_attention_variant=None),
                          use_transformer_engine=False)
        dsa = _dsa_attention_spec(config)
        layers = [dataclasses.replace(layer, submodules=dataclasses.replace(
            layer.submodules, self_attention=dsa)) for layer in spec.layer_specs]
        return dataclasses.replace(spec, layer_specs=layers)
    if variant != "gated_delta_net":
        return block_spec(config, use_transformer_engine=False)
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_linear_attention_pattern,
    )
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    standard = dataclasses.replace(config, experimental_attention_variant=None,
                                   linear_attention_freq=None)
    spec = block_spec(standard, use_transformer_engine=False)
    gdn = ModuleSpec(module=GatedDeltaNet, submodules=GatedDeltaNetSubmodules(
        in_proj=ColumnParallelLinear, out_norm=WrappedTorchNorm, out_proj=RowParallelLinear))
    layers = [dataclasses.replace(layer, submodules=dataclasses.replace(layer.submodules,
                                                                        self_attention=gdn))
              if linear else layer
              for layer, linear in zip(spec.layer_specs, get_linear_attention_pattern(config),
                                       strict=True)]
    return dataclasses.replace(spec, layer_specs=layers)


def _parameter_counts(args: Any, transformer: Any) -> dict[str, Any]:
    """Megatron's own GPTModel, built whole on one rank on the meta device (shapes, no memory):
    the TransformerConfig as `core_transformer_config_from_args` made it with every parallel size
    1, the local (non-Transformer-Engine) layer and MTP specs of
    megatron/core/models/gpt/gpt_layer_specs.py, the vocabulary padded for one TP rank
    (megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding). Parameters are
    summed by name: `mtp.` is the MTP block, `.experts.` the routed experts, the word embedding
    and the output layer the tables. The shape of every distinct parameter name pattern (layer
    indices and expert numbers folded) comes back with its count, for a failing test to show."""
    import dataclasses
    import re

    import torch
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding

    config = dataclasses.replace(transformer, **ONE_RANK, **LOCAL_KERNELS,
                                 use_cpu_initialization=True, perform_initialization=False)
    # the attributes core_transformer_config_from_args attaches beside the dataclass fields
    # (standard attention's yarn_*: argument_utils.py _apply_yarn_config_from_args), which replace drops
    fields = {f.name for f in dataclasses.fields(transformer)}
    for name, value in vars(transformer).items():
        if name not in fields and not hasattr(config, name):
            setattr(config, name, value)
    vocab = vocab_size_with_padding(args.vocab_size, argparse.Namespace(
        **{**vars(args), "tensor_model_parallel_size": 1}), logging_enabled=False)
    with _pipeline_rank(0, 1, 1) as groups, torch.device("meta"):
        spec = _local_block_spec(config, get_gpt_decoder_block_spec)
        for layer in spec.layer_specs:
            attention = layer.submodules.self_attention.submodules
            if (config.multi_latent_attention and hasattr(attention, "core_attention")
                    and getattr(config, "experimental_attention_variant", None) != "dsa"):
                attention.core_attention = _parameter_free_core_attention()
        mtp = (get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False)
               if config.mtp_num_layers else None)
        model = GPTModel(config, spec, vocab, args.max_position_embeddings,
                         share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                         position_embedding_type=args.position_embedding_type,
                         mtp_block_spec=mtp, pg_collection=groups)
    counts = {"total": 0, "mtp": 0, "routed_experts": 0, "embedding": 0}
    shapes: dict[str, list[Any]] = {}
    for name, param in model.named_parameters():
        n = param.numel()
        mtp_param = name.startswith("mtp.")
        counts["mtp" if mtp_param else "total"] += n
        counts["routed_experts"] += n if ".experts." in name and not mtp_param else 0
        counts["embedding"] += n if name.startswith(("embedding.word_embeddings", "output_layer")) else 0
        pattern = re.sub(r"\.\d+\.", ".N.", re.sub(r"\.\d+\.", ".N.", name))
        entry = shapes.setdefault(pattern, [list(param.shape), 0])
        entry[1] += 1
    return {**counts, "shapes": shapes}


def _derived(args: Any, transformer: Any, model_config: Any) -> dict[str, Any]:
    from megatron.core.num_microbatches_calculator import get_num_microbatches

    pp = args.pipeline_model_parallel_size
    vpp = args.virtual_pipeline_model_parallel_size or 1
    hashing = bool(getattr(transformer, "moe_n_hash_layers", 0)) and bool(transformer.num_moe_experts)
    chunks = (_hybrid_chunks(args, pp, vpp, hashing) if args.hybrid_layer_pattern is not None
              else _gpt_chunks(transformer, pp, vpp, hashing))
    derived = {
        "data_parallel_size": args.data_parallel_size,
        "num_microbatches": get_num_microbatches(),
        "virtual_pipeline_model_parallel_size": vpp,
        "num_layers": args.num_layers,
        "padded_vocab_size": args.padded_vocab_size,
        "chunks": chunks,
        "hash_routing_built": hashing,
        "rope": _rotary(transformer, model_config),
        "shape": _shape(transformer),
    }
    edp = getattr(args, "expert_data_parallel_size", None)
    if edp is not None:
        derived["expert_data_parallel_size"] = edp
    return derived


def _json_value(value: Any) -> Any:
    """A config value as JSON: lists for tuples, an enum's name, anything else without a JSON form
    (a dtype, a layout object) as its text."""
    import enum

    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _container_values(args: Any, model_config: Any, paths: list[str], not_run: list[str]) -> dict[str, Any]:
    """The values Megatron's own config container (megatron/training/argument_utils.py
    pretrain_cfg_container_from_args) holds at each `section.field` path; Megatron's GPT/hybrid
    model config nests the TransformerConfig under `transformer`, where Megatron-Bridge's model
    providers hold it flat, so `model.X` is read there first. A path it does not hold is left out."""
    from megatron.training import argument_utils

    build = getattr(argument_utils, "pretrain_cfg_container_from_args", None)
    if build is None or model_config is None:
        not_run.append("pretrain_cfg_container_from_args: not in this Megatron-LM")
        return {}
    container = build(args, model_config)
    values = {}
    for path in paths:
        section, name = path.split(".", 1)
        holder = getattr(container, section, None)
        if section == "model" and hasattr(getattr(holder, "transformer", None), name):
            holder = holder.transformer
        if holder is not None and hasattr(holder, name):
            values[path] = _json_value(getattr(holder, name))
    return values


def check_one(request: dict[str, Any], megatron_dir: Path) -> dict[str, Any]:
    """Megatron's verdict on one argument list: pass with derived values, or its message."""
    from megatron.training.global_vars import unset_global_variables

    saved_env = dict(os.environ)
    os.environ.update(request.get("env", {}))
    os.environ["WORLD_SIZE"], os.environ["RANK"] = str(request["world_size"]), "0"
    saved_argv = sys.argv
    captured = io.StringIO()
    not_run: list[str] = []
    steps: list[str] = []
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            args, transformer, model_config = _megatron_chain(request, not_run, steps)
            steps.append(PROBE_STEP)
            derived = _derived(args, transformer, model_config)
            if request.get("count_parameters"):
                steps.append("parameter count")
                derived["parameters"] = _parameter_counts(args, transformer)
            if request.get("container_paths"):
                steps.append("pretrain_cfg_container_from_args")
                derived["container"] = _container_values(args, model_config, request["container_paths"],
                                                         not_run)
        return {"verdict": "pass", "derived": derived, "not_run": not_run}
    except ImportError as exc:
        return {"verdict": "unusable", "message": _message(exc, ""),
                "location": _location(exc, megatron_dir)}
    except (TypeError, AttributeError, NameError) as exc:
        # In the probe's own step these mean its questions do not fit this Megatron-LM's helpers.
        verdict = "unusable" if steps[-1:] == [PROBE_STEP] else "rejected"
        return {"verdict": verdict, "message": _message(exc, captured.getvalue()),
                "location": _location(exc, megatron_dir), "step": steps[-1] if steps else "start"}
    except (Exception, SystemExit) as exc:  # Megatron's own refusal, whatever its type
        return {"verdict": "rejected", "message": _message(exc, captured.getvalue()),
                "location": _location(exc, megatron_dir), "step": steps[-1] if steps else "start"}
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        unset_global_variables()


def main(argv: list[str]) -> int:
    request_path, result_path = Path(argv[1]), Path(argv[2])
    request = json.loads(request_path.read_text())
    megatron_dir = Path(request["megatron_lm"])
    try:
        stand_ins = install_stand_ins(megatron_dir)
    except Unusable as exc:
        result_path.write_text(json.dumps({"unusable": str(exc)}))
        return 0
    results = [check_one(one, megatron_dir) for one in request["configs"]]
    if any(result.get("derived", {}).get("hash_routing_built") for result in results):
        stand_ins.append(TOY_STACKS)
    result_path.write_text(json.dumps({"stand_ins": stand_ins, "results": results,
                                       "python": sys.version.split()[0]}))
    return 0


def _forget_own_folder() -> None:
    """Run as a script, this file's folder comes first on sys.path; that folder is moeplan's emitter,
    whose `megatron.py` would shadow the user's Megatron-LM package."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != here]


if __name__ == "__main__":
    _forget_own_folder()
    sys.exit(main(sys.argv))

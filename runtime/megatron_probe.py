"""Run a user's own Megatron-LM on emitted argument lists, on CPU, and report what it says.

This is a standalone script (`python megatron_probe.py REQUEST.json RESULT.json`), started in a
subprocess by `moeplan emit … --check-with`; planner never imports it (planner must not import
torch). For each request it runs Megatron's own chain — `parse_args` → `validate_args` →
`set_global_variables` → `core_transformer_config_from_args` → `hybrid_config_from_args` (hybrid
entry) or `gpt_config_from_args` (GPT entry) — and then asks Megatron's pipeline helpers which
decoder, MoE and MTP layers every (pipeline rank, virtual stage) builds.

A CPU machine cannot answer a few GPU-only queries. Each gets an explicit stand-in, applied only
when the real thing is missing and listed in the result; nothing else is patched:
  * CUDA device capability → sm_90 (`torch.cuda.get_device_capability`/`get_device_properties`)
  * the Transformer Engine version gate → STAND_IN_TE_VERSION (`megatron.core.utils._te_version`),
    and with it the presence of TE's fused RoPE kernel (`rope_utils.fused_apply_rotary_pos_emb`),
    which `TransformerConfig` asks for when RoPE fusion is on (Megatron's default)
  * the cuDNN DSA kernel presence check (device + `flash_mla`/`cudnn.DSA` import) → present, so a
    login node without the kernels judges the arguments, not the installation
  * `typing.override` (Python 3.12) → `typing_extensions.override` on Python 3.11
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import traceback
import types
import typing
from pathlib import Path
from typing import Any

STAND_IN_TE_VERSION = "2.14.0"
STAND_IN_CAPABILITY = (9, 0)


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
    sys.path.insert(0, str(megatron_dir))
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
    return used


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


def _megatron_chain(request: dict[str, Any], not_run: list[str], steps: list[str]) -> tuple[Any, Any]:
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
        return args, transformer
    steps.append(builder)
    model_args = args
    if args.spec is not None and not _installed("transformer_engine"):
        model_args = argparse.Namespace(**{**vars(args), "spec": None})
        not_run.append(f"--spec {' '.join(args.spec)}: the layer-spec factory builds Transformer Engine "
                       "modules, and Transformer Engine is not installed")
    make_model_config(model_args, transformer)
    return args, transformer


def _hybrid_chunks(args: Any, pp: int, vpp: int) -> list[dict[str, Any]]:
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.hybrid.hybrid_layer_allocation import (
        Symbols,
        parse_hybrid_pattern,
        select_pipeline_segment,
    )
    from megatron.core.transformer.multi_token_prediction import mtp_on_this_rank
    from torch.testing._internal.distributed.fake_pg import FakeStore

    parsed = parse_hybrid_pattern(args.hybrid_layer_pattern)
    mtp_moe = (parsed.mtp_pattern or "").count(Symbols.MOE) * parsed.mtp_num_depths
    mixers = Symbols.VALID_LAYERS - {Symbols.MLP, Symbols.MOE}
    chunks = []
    for rank in range(pp):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=pp)
        try:
            parallel_state.set_pipeline_model_parallel_rank(rank)
            for virtual in range(vpp):
                vp_stage = virtual if vpp > 1 else None
                layers, _ = select_pipeline_segment(
                    parsed.main_pattern or "", dist.group.WORLD, vp_stage,
                    first_stage_layers=args.decoder_first_pipeline_num_layers,
                    last_stage_layers=args.decoder_last_pipeline_num_layers,
                    tp_group=dist.group.WORLD, dp_cp_group=dist.group.WORLD)
                mtp = parsed.mtp_num_depths > 0 and mtp_on_this_rank(
                    layout=None, mtp_num_layers=args.mtp_num_layers, ignore_virtual=False,
                    vp_stage=vp_stage)
                chunks.append({"stage": rank, "virtual": virtual,
                               "layers": sum(s in mixers for s in layers),
                               "moe_layers": layers.count(Symbols.MOE),
                               "mtp_layers": parsed.mtp_num_depths if mtp else 0,
                               "mtp_moe_layers": mtp_moe if mtp else 0})
        finally:
            dist.destroy_process_group()
    return chunks


def _gpt_chunks(transformer: Any, pp: int, vpp: int) -> list[dict[str, Any]]:
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_layer_specs
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.multi_token_prediction import get_mtp_num_layers_to_build
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    specs = get_gpt_decoder_layer_specs(transformer, use_transformer_engine=False)
    moe = [_builds(spec.submodules.mlp) is MoELayer for spec in specs]
    layout = transformer.pipeline_model_parallel_layout
    chunks = []
    for rank in range(pp):
        parallel_state.set_pipeline_model_parallel_rank(rank)
        for virtual in range(vpp):
            vp_stage = virtual if vpp > 1 else None
            if layout is not None:
                ids = layout.get_layer_id_list(layer_type=LayerType.decoder, vp_stage=vp_stage,
                                               pp_rank=rank)
            else:
                count = get_num_layers_to_build(transformer, vp_stage=vp_stage, pp_rank=rank)
                offset = get_transformer_layer_offset(transformer, vp_stage=vp_stage, pp_rank=rank)
                ids = list(range(offset, offset + count))
            mtp = get_mtp_num_layers_to_build(transformer, vp_stage=vp_stage, pp_rank=rank)
            chunks.append({"stage": rank, "virtual": virtual, "layers": len(ids),
                           "moe_layers": sum(moe[i] for i in ids), "mtp_layers": mtp})
    return chunks


def _builds(spec: Any) -> Any:
    """The class a layer spec builds: a ModuleSpec's `module`, or a partial's function."""
    return getattr(spec, "module", None) or getattr(spec, "func", None)


def _derived(args: Any, transformer: Any) -> dict[str, Any]:
    from megatron.core import parallel_state
    from megatron.core.num_microbatches_calculator import get_num_microbatches

    pp = args.pipeline_model_parallel_size
    vpp = args.virtual_pipeline_model_parallel_size or 1
    parallel_state.set_pipeline_model_parallel_world_size(pp)
    parallel_state.set_virtual_pipeline_model_parallel_world_size(vpp if vpp > 1 else None)
    try:
        chunks = (_hybrid_chunks(args, pp, vpp) if args.hybrid_layer_pattern is not None
                  else _gpt_chunks(transformer, pp, vpp))
    finally:
        parallel_state.set_pipeline_model_parallel_world_size(None)
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)
        parallel_state.set_pipeline_model_parallel_rank(None)
    derived = {
        "data_parallel_size": args.data_parallel_size,
        "num_microbatches": get_num_microbatches(),
        "virtual_pipeline_model_parallel_size": vpp,
        "num_layers": args.num_layers,
        "padded_vocab_size": args.padded_vocab_size,
        "chunks": chunks,
    }
    edp = getattr(args, "expert_data_parallel_size", None)
    if edp is not None:
        derived["expert_data_parallel_size"] = edp
    return derived


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
            args, transformer = _megatron_chain(request, not_run, steps)
            steps.append("pipeline layout")
            derived = _derived(args, transformer)
        return {"verdict": "pass", "derived": derived, "not_run": not_run}
    except ImportError as exc:
        return {"verdict": "unusable", "message": _message(exc, ""),
                "location": _location(exc, megatron_dir)}
    except (TypeError, AttributeError, NameError) as exc:
        # In the probe's own step these mean its questions do not fit this Megatron-LM's helpers.
        verdict = "unusable" if steps[-1:] == ["pipeline layout"] else "rejected"
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
    result_path.write_text(json.dumps({"stand_ins": stand_ins, "results": results,
                                       "python": sys.version.split()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

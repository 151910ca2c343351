"""Run inside a subprocess with Megatron-LM dev on sys.path: build Megatron's own decoder stacks for
an emitted launch and report which MoE routers Megatron made hash-routed. Nothing of Megatron's
layer numbering is reproduced here; the probe only builds its objects, one pipeline rank at a time
under torch's fake process group:

* hybrid launches (`--hybrid-layer-pattern`, `--moe-n-hash-layers`):
  `hybrid_layer_allocation.parse_hybrid_pattern` / `select_pipeline_segment` pick each segment and
  its layer offset; `HybridStack` numbers the layers and builds each `E` as a real
  `TransformerLayer` + `MoELayer`, whose `TopKRouter.__init__` decides `is_hash_layer`;
  `MultiTokenPredictionBlock` builds the MTP depths after `/` as `HybridModel` does. Symbols other
  than `E` stay Megatron's `HybridStackSubmodules` default (`IdentityOp`); the MoE and MTP specs use
  Megatron's local (non-Transformer-Engine) modules at toy sizes (pattern and hash count are the
  only emitted values that decide numbering);
* GPT launches (the whole emitted argument list): the config comes from Megatron's training entry
  (`megatron_config_probe.build_config`, with its listed stand-ins), each stage's layers from
  `get_gpt_decoder_block_spec` and `TransformerBlock`.

Stand-in for a GPU-only query, besides those of megatron_config_probe:

* `torch.cuda.current_device` -> "cpu": the router allocates its tid2eid table and expert-bias
  buffers on the current CUDA device.

Input: a JSON list of cases, {"pattern", "moe_n_hash_layers", "pp"} (hybrid) or {"argv", "pp",
"vpp"} (GPT), on stdin. Output: one JSON line, per case {"segments": [{"pp_rank", "vp_stage",
"routers": [[layer_number, is_hash], ...]}], "mtp_routers": [[layer_number, is_hash], ...]}.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from tests.megatron_config_probe import build_config
from tests.megatron_oracle import answer_cases

torch.cuda.current_device = lambda: "cpu"  # stand-in: see the module docstring

with contextlib.redirect_stdout(io.StringIO()):  # Megatron prints import notices
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.models.hybrid.hybrid_block import HybridStack, HybridStackSubmodules
    from megatron.core.models.hybrid.hybrid_layer_allocation import (
        get_hybrid_total_layer_count,
        get_hybrid_total_pipeline_segment_count,
        parse_hybrid_pattern,
        select_pipeline_segment,
    )
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.multi_token_prediction import (
        MultiTokenPredictionBlock,
        MultiTokenPredictionBlockSubmodules,
        MultiTokenPredictionLayer,
        MultiTokenPredictionLayerSubmodules,
    )
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

TOY_EXPERTS = 2


def _submodules() -> HybridStackSubmodules:
    moe = get_moe_module_spec(use_te=False, num_experts=TOY_EXPERTS, moe_grouped_gemm=False)
    layer = ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(mlp=moe))
    return HybridStackSubmodules(moe_layer=layer)


def _mtp_spec(submodules: HybridStackSubmodules) -> ModuleSpec:
    layer = MultiTokenPredictionLayerSubmodules(
        enorm=WrappedTorchNorm, hnorm=WrappedTorchNorm, layer_norm=WrappedTorchNorm,
        eh_proj=ColumnParallelLinear, mtp_model_layer=ModuleSpec(module=HybridStack, submodules=submodules),
    )
    return ModuleSpec(module=MultiTokenPredictionBlock, submodules=MultiTokenPredictionBlockSubmodules(
        layer_specs=[ModuleSpec(module=MultiTokenPredictionLayer, submodules=layer)]))


def _routers(module: torch.nn.Module) -> list[list[Any]]:
    return [[m.layer_number, bool(m.is_hash_layer)] for m in module.modules() if isinstance(m, TopKRouter)]


def _config(main: str, mtp_depths: int, n_hash: int, pp: int, vpp: int | None) -> TransformerConfig:
    return TransformerConfig(
        num_layers=get_hybrid_total_layer_count(main), hidden_size=8, num_attention_heads=1,
        num_moe_experts=TOY_EXPERTS, moe_router_topk=TOY_EXPERTS, moe_ffn_hidden_size=8,
        moe_n_hash_layers=n_hash, actual_vocab_size=16, is_hybrid_model=True,
        pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
        pipeline_dtype=torch.float32, use_cpu_initialization=True, add_bias_linear=False,
        mtp_num_layers=mtp_depths or None,
    )


@contextlib.contextmanager
def pipeline_rank(rank: int, pp: int, vpp: int) -> Iterator[ProcessGroupCollection]:
    """Megatron's process groups as pipeline rank `rank` of `pp` sees them (fake backend)."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=pp)
    try:
        parallel_state.initialize_model_parallel(
            pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
            create_gloo_process_groups=False,
        )
        yield ProcessGroupCollection.use_mpu_process_groups()
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def hybrid_routers(case: dict[str, Any]) -> dict[str, Any]:
    pp, n_hash = case["pp"], case["moe_n_hash_layers"]
    parsed = parse_hybrid_pattern(case["pattern"])
    main = parsed.main_pattern or ""
    vpp = get_hybrid_total_pipeline_segment_count(main) // pp
    submodules = _submodules()
    out: dict[str, Any] = {"segments": [], "mtp_routers": []}
    for rank in range(pp):
        with pipeline_rank(rank, pp, vpp) as groups:
            config = _config(main, parsed.mtp_num_depths, n_hash, pp, vpp if vpp > 1 else None)
            for vp_stage in range(vpp):
                types, offset = select_pipeline_segment(main, groups.pp, vp_stage if vpp > 1 else None)
                stack = HybridStack(config, submodules, layer_type_list=types, pp_layer_offset=offset,
                                    post_layer_norm=False, post_process=False, pg_collection=groups)
                out["segments"].append({"pp_rank": rank, "vp_stage": vp_stage, "routers": _routers(stack)})
            if parsed.mtp_pattern and rank == pp - 1:
                mtp = MultiTokenPredictionBlock(
                    config, _mtp_spec(submodules), vp_stage=vpp - 1 if vpp > 1 else None,
                    pg_collection=groups, mtp_layer_pattern=parsed.mtp_pattern,
                    mtp_num_depths=parsed.mtp_num_depths, hybrid_submodules=submodules,
                )
                out["mtp_routers"] = _routers(mtp)
    return out


def gpt_routers(case: dict[str, Any]) -> dict[str, Any]:
    pp, vpp = case["pp"], case["vpp"]
    config = build_config(case["argv"], pp)
    out: dict[str, Any] = {"segments": [], "mtp_routers": []}
    for rank in range(pp):
        with pipeline_rank(rank, pp, vpp) as groups:
            for vp_stage in range(vpp):
                stage = vp_stage if vpp > 1 else None
                spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, vp_stage=stage,
                                                  pp_rank=rank)
                block = TransformerBlock(config, spec, post_process=False, pg_collection=groups,
                                         vp_stage=stage)
                out["segments"].append({"pp_rank": rank, "vp_stage": vp_stage, "routers": _routers(block)})
    return out


def routers(case: dict[str, Any]) -> dict[str, Any]:
    return gpt_routers(case) if "argv" in case else hybrid_routers(case)


if __name__ == "__main__":
    answer_cases(routers)

"""Megatron-LM's own TopKRouter run on a CPU, its ATen ops counted forward and backward: the figures
planner/budget/hardware.py ROUTER_FORWARD_OPS and ROUTER_BACKWARD_OPS hold.

The router runs in a subprocess (tests/support/megatron_snippet.py) under torch's fake process
group, with the JIT fuser off (Megatron compiles only the expert bias's token count, under
torch.no_grad). A TorchDispatchMode counts every ATen op that computes; views, allocations and
metadata ops launch no kernel and are left out. The backward is run from a gradient of ones on the
probabilities, as the MoE layer's backward hands the router one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.megatron_snippet import snippet_json

_COUNT = r"""
import collections
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode
from megatron.core import parallel_state
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.transformer_config import TransformerConfig

NO_KERNEL = {"view", "_unsafe_view", "expand", "t", "transpose", "permute", "unsqueeze", "squeeze",
             "slice", "select", "as_strided", "alias", "detach", "empty", "empty_like",
             "empty_strided", "split", "split_with_sizes", "unbind", "narrow", "_reshape_alias",
             "lift_fresh", "new_empty", "new_empty_strided", "is_same_size"}

class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_KERNEL:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
parallel_state.initialize_model_parallel(create_gloo_process_groups=False)
groups = ProcessGroupCollection.use_mpu_process_groups()
out = []
for fields in json.loads(sys.stdin.read()):
    config = TransformerConfig(hidden_size=64, ffn_hidden_size=64, num_attention_heads=1,
                               num_layers=1, moe_ffn_hidden_size=64, moe_router_dtype="fp32",
                               pipeline_dtype=torch.float32, use_cpu_initialization=True,
                               add_bias_linear=False, **fields)
    router = TopKRouter(config, pg_collection=groups, layer_number=1)
    tokens = torch.randn(128, 1, 64, requires_grad=True)
    router(tokens)  # first call: lazy buffers
    forward, backward = Count(), Count()
    with forward:
        probs, _ = router(tokens)
    gradient = torch.ones_like(probs)
    with backward:
        probs.backward(gradient)
    out.append({"forward": dict(forward.ops), "backward": dict(backward.ops)})
print(json.dumps(out))
"""


def count_router_ops(megatron: Path, routers: list[dict[str, Any]]) -> list[dict[str, dict[str, int]]]:
    """Per TransformerConfig router fields in `routers`: the forward and backward ATen ops by name."""
    return snippet_json(_COUNT, megatron, routers, env={"TORCHDYNAMO_DISABLE": "1"})

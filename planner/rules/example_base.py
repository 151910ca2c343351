"""The small valid config every rule's bad/good overlay is merged onto (docs and tests alike).

8 ranks, 4 layers over PP 2, 8 experts over EP 4: DP 4, EDP 1, 4 microbatches. Big enough that
an overlay can move any degree, small enough to read in one glance.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

EXAMPLE_BASE_YAML = """\
model:
  num_layers: 4
  hidden_size: 64
  num_attention_heads: 8
  num_query_groups: 4
  ffn_hidden_size: 128
  vocab_size: 512
  num_experts: 8
  moe_router_topk: 2
  moe_ffn_hidden_size: 64
  moe_shared_expert_intermediate_size: 64
parallel: {world_size: 8, tp: 1, cp: 1, pp: 2, ep: 4, etp: 1}
training: {seq_length: 256, micro_batch_size: 1, global_batch_size: 16}
"""


def merge(base: Any, overlay: Any) -> Any:
    """Deep-merge YAML data: mappings merge key by key, anything else in the overlay wins."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = dict(base)
        for key, value in overlay.items():
            merged[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(overlay)


def example_config_data(overlay_yaml: str) -> dict[str, Any]:
    """The base config with a rule's example overlay applied, as plain YAML data."""
    base = yaml.safe_load(EXAMPLE_BASE_YAML)
    overlay = yaml.safe_load(overlay_yaml) or {}
    return merge(base, overlay)

"""Small hand-checkable models shared by the FLOPs and step-time tests."""

from __future__ import annotations

from typing import Any

# h 4, 2 heads of 2 over 1 KV group, dense FFN 8, 4 experts of 3 with top-2, vocabulary 100;
# layer 0 dense, layer 1 MoE: small enough to count every FLOP by hand (test_flops.py does).
TINY: dict[str, Any] = {
    "num_layers": 2, "hidden_size": 4, "num_attention_heads": 2, "num_query_groups": 1,
    "kv_channels": 2, "ffn_hidden_size": 8, "vocab_size": 100, "num_experts": 4,
    "moe_router_topk": 2, "moe_ffn_hidden_size": 3, "moe_layer_freq": [0, 1],
}

"""DeepEP's communication buffers, allocated outside PyTorch's caching allocator.

Megatron's flex dispatcher with the `deepep` backend asks DeepEP for one `Buffer` per EP group,
sized by DeepEP's own hints for the dispatch and the combine configuration of that group size
(Megatron-LM dev@d48bd6be megatron/core/transformer/moe/fused_a2a.py get_buffer: the larger of
the two `get_nvl_buffer_size_hint`s, and `get_rdma_buffer_size_hint` only when the group spans
more ranks than a node has GPUs). The NVLink buffer is cudaMalloc'd and the RDMA buffer comes
from NVSHMEM's symmetric heap, so neither shows in `max allocated`: they are device-total terms.

The sizes follow DeepEP (deepseek-ai/DeepEP csrc/config.hpp Config.get_nvl_buffer_size_hint and
get_rdma_buffer_size_hint; deep_ep/buffer.py Buffer.get_dispatch_config / get_combine_config, the
recommended (NVL send, NVL receive, RDMA send, RDMA receive) chunk tokens per group size) with
Megatron's SM count (token_dispatcher.py _DeepepManager: 20 unless moe_flex_dispatcher_num_sms).
"""

from __future__ import annotations

NUM_MAX_NVL_PEERS = 8  # DeepEP csrc/kernels/configs.cuh
DEEPEP_NUM_SMS = 20
SOURCE_META_BYTES = 8  # csrc/kernels/internode.cu SourceMeta: two ints
MAX_TOPK = MAX_SCALES = 128  # the hints' kNumMaxTopK, kNumMaxScales
RDMA_SAFETY_BYTES = 1 << 20  # the RDMA hint's "large number to be safe"

# Buffer.get_dispatch_config and get_combine_config: chunk tokens per EP group size.
DISPATCH_CONFIG: dict[int, tuple[int, int, int, int]] = {
    2: (24, 256, 6, 128), 4: (6, 256, 6, 128), 8: (6, 256, 6, 128), 16: (36, 288, 20, 128),
    24: (8, 288, 32, 128), 32: (32, 288, 32, 128), 64: (20, 288, 28, 128),
    128: (20, 560, 32, 128), 144: (32, 720, 12, 128), 160: (28, 720, 12, 128)}
COMBINE_CONFIG: dict[int, tuple[int, int, int, int]] = {
    2: (10, 256, 6, 128), 4: (9, 256, 6, 128), 8: (4, 256, 6, 128), 16: (4, 288, 12, 128),
    24: (1, 288, 8, 128), 32: (1, 288, 8, 128), 64: (1, 288, 20, 128),
    128: (1, 560, 12, 128), 144: (2, 720, 8, 128), 160: (2, 720, 8, 128)}


def _align(value: int, to: int) -> int:
    return -(-value // to) * to


def _token_bytes(hidden_bytes: int) -> int:
    """One received token in either buffer: its data, source meta, top-k indices and weights and
    its scales."""
    return hidden_bytes + SOURCE_META_BYTES + MAX_TOPK * 8 + MAX_TOPK * 4 + MAX_SCALES * 4


def nvl_bytes(config: tuple[int, int, int, int], hidden_bytes: int, ranks: int) -> int:
    """Config.get_nvl_buffer_size_hint: per channel (num_sms / 2) and NVLink peer, the receive
    chunk's tokens with their data, source meta, top-k indices and weights and scales."""
    channels = DEEPEP_NUM_SMS // 2
    rdma_ranks, nvl_ranks = max(ranks // NUM_MAX_NVL_PEERS, 1), min(ranks, NUM_MAX_NVL_PEERS)
    tokens = channels * nvl_ranks * config[1]
    total = channels * nvl_ranks * (2 * rdma_ranks + 3) * 4
    total += tokens * _token_bytes(hidden_bytes)
    return _align(total, 128)


def rdma_bytes(config: tuple[int, int, int, int], hidden_bytes: int, ranks: int) -> int:
    """Config.get_rdma_buffer_size_hint: per channel and node, the RDMA receive chunk (aligned to
    the send chunk, as Config's constructor does) twice (send and receive halves)."""
    channels = DEEPEP_NUM_SMS // 2
    rdma_ranks = ranks // NUM_MAX_NVL_PEERS
    recv = _align(config[3], config[2])
    total = channels * rdma_ranks * (NUM_MAX_NVL_PEERS * 2 + 2) * 2 * 4
    total += channels * rdma_ranks * recv * 2 * (_token_bytes(hidden_bytes) + 16)
    return _align(total + RDMA_SAFETY_BYTES, 128)


def deepep_buffers(ranks: int, hidden: int, gpus_per_node: int) -> tuple[int, int] | None:
    """(NVLink bytes, RDMA bytes) of the DeepEP Buffer Megatron allocates for an EP group of
    `ranks` moving `hidden`-wide rows (hidden_bytes = hidden · 2: fused_a2a.py get_hidden_bytes
    counts at least 2 bytes an element); None when DeepEP has no configuration for that size."""
    if ranks not in DISPATCH_CONFIG:
        return None
    hidden_bytes = hidden * 2
    configs = (DISPATCH_CONFIG[ranks], COMBINE_CONFIG[ranks])
    nvl = max(nvl_bytes(c, hidden_bytes, ranks) for c in configs)
    rdma = max(rdma_bytes(c, hidden_bytes, ranks) for c in configs) \
        if ranks > gpus_per_node and ranks > NUM_MAX_NVL_PEERS else 0
    return nvl, rdma

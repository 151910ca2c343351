"""The runtime context-parallel groups of GTP sequence sharding: C·q_s ranks per group.

gtp_remat_num_sequence_shards (q_s) is in no Megatron-LM branch yet (Megatron-LM main@d98e8a64
and dev@d48bd6be both lack it); this is moeplan's model of the DeepSeek-V4 Megatron write-up:
inside each dense gtp_remat group of R ranks, q_s consecutive GTP coordinates hold the q_s
sequence shards of one sample and the R/q_s blocks see different samples (D_batch = D_w·R/q_s).
A sample's context is then split over its C configured CP ranks times those q_s GTP ranks:
CP_runtime = C·q_s (the budget's `cp_runtime`). The groups below are cut from Megatron's
`gtp_remat-cp` token (RankGenerator order: the GTP coordinate varies fastest), so they follow the
dense grid exactly; they are not one of Megatron's process-group kinds.
"""

from __future__ import annotations

from planner.layout.rank_generator import GridError
from planner.layout.spec import GridSpec, dense_generator

TOKEN = "gtp_remat-cp"


def _check(spec: GridSpec, shards: int) -> None:
    if shards < 1 or spec.gtp % shards:
        raise GridError([f"gtp_remat_num_sequence_shards {shards} does not divide gtp {spec.gtp}"])


def _block(group: list[int], spec: GridSpec, shards: int, block: int) -> list[int]:
    """The ranks of one gtp_remat-cp group whose GTP coordinate lies in block `block`."""
    return [group[c * spec.gtp + block * shards + i] for c in range(spec.cp) for i in range(shards)]


def runtime_cp_groups(spec: GridSpec, shards: int) -> list[list[int]]:
    """Every runtime CP group (C·q_s ranks each), in the token's group order, block by block."""
    _check(spec, shards)
    return [_block(group, spec, shards, block) for group in dense_generator(spec).groups(TOKEN)
            for block in range(spec.gtp // shards)]


def runtime_cp_group(spec: GridSpec, shards: int, rank: int) -> list[int]:
    """The runtime CP group holding `rank`."""
    _check(spec, shards)
    generator = dense_generator(spec)
    group = generator.group_containing(TOKEN, rank)
    gtp_coordinate = generator.position_in_group(TOKEN, rank) % spec.gtp
    return _block(group, spec, shards, gtp_coordinate // shards)

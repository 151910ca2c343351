"""Deterministic parameter initialisation keyed by a parameter's *global identity*.

A parameter's values depend only on (seed, identity) — never on the layout — so every rank of
any EP/ETP/DP layout and the single-process reference start from identical logical weights:
the full logical tensor is generated, then each rank keeps its shard. An identity is a tuple of
strings, ints and bools, for example ``(layer_id, "expert", global_expert_id, "w1")``.
"""

from __future__ import annotations

import hashlib

import torch

# Megatron's default `init_method_std`; output projections use std / sqrt(2 * num_layers)
# (Megatron's `scaled_init_method_normal`).
DEFAULT_INIT_STD = 0.02

_Identity = tuple[str | int | bool, ...]


def identity_seed(seed: int, identity: _Identity) -> int:
    """A 63-bit generator seed from (seed, identity), stable across processes and runs.

    Python's hash() is salted per process for strings, so a cryptographic digest of an
    unambiguous encoding is used instead.
    """
    for part in identity:
        if not isinstance(part, str | int | bool):
            raise TypeError(f"identity parts must be str, int or bool, got {part!r}")
    encoded = repr((int(seed), *identity)).encode()
    return int.from_bytes(hashlib.sha256(encoded).digest()[:8], "little") & (2**63 - 1)


def init_tensor(
    seed: int,
    identity: _Identity,
    shape: tuple[int, ...],
    std: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The full logical tensor N(0, std²) for this identity (generated on CPU in fp32)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(identity_seed(seed, identity))
    values = torch.randn(tuple(shape), generator=generator, dtype=torch.float32)
    return (values * std).to(dtype)


def init_shard(
    seed: int,
    identity: _Identity,
    shape: tuple[int, ...],
    std: float,
    dtype: torch.dtype,
    dim: int,
    part: int,
    parts: int,
) -> torch.Tensor:
    """Shard `part` of `parts` equal slices along `dim` of the full logical tensor."""
    if shape[dim] % parts:
        raise ValueError(f"dimension {dim} of {shape} is not divisible into {parts} shards")
    full = init_tensor(seed, identity, shape, std, dtype)
    width = shape[dim] // parts
    return full.narrow(dim, part * width, width).contiguous()

"""CP bytes of the current architectures' attention kinds, by hand.

Gated DeltaNet under Megatron's default chunkwise CP (Megatron-LM dev@d48bd6be megatron/core/ssm/
gated_delta_net/gdn.py GatedDeltaNet.forward; flash-linear-attention fla/ops/cp) exchanges no K/V:
it all-gathers each rank's fp32 state and transition matrix [value heads/TP, d_k, d_k + d_v] (and
their gradients in backward), sends the short convolution's last kernel − 1 input rows to the next
CP rank, and converts a zigzag layout to the contiguous one and back (an all-to-all of the hidden
rows each way). DSA (dsa.py DSAttention.forward) all-gathers the absorbed attention's latent key
[kv_lora + qk_rope] and the indexer's keys [idx_dim]. Window layers keep full attention's K/V.
"""

from __future__ import annotations

import pytest

from planner.accounting import budgets
from planner.config.loader import load_config, parse_config
from tests.support.megatron_lines import megatron_line
from tests.support.paths import EXAMPLES


def _stage(cfg, stage: int = 0) -> dict[str, object]:
    """name -> value of the global budgets and those of the stage's first rank."""
    return {b.name: b.value for b in budgets(cfg, stage=stage) if b.stage in (None, stage)}


def _with_cp(example: str, **parallel: object):
    data = load_config(EXAMPLES / "architectures" / f"{example}.yaml").model_dump(
        mode="json", exclude_unset=True)
    data["parallel"].update({"cp": 2, **parallel})
    return parse_config(data)


def test_gated_delta_net_cp_bytes_by_hand():
    """Qwen3-Next's example with CP 2 (zigzag, TP 1, PP 2, DP 8, S 4096, b 1, bf16): stage 0 holds
    24 blocks, 18 of them DeltaNet layers; m = 512 / 8 = 64 microbatches."""
    env = _stage(_with_cp("qwen3-next-80b-a3b-32"))
    # 32 value heads · d_k 128 · (128 + 128) · 4 B = 4 MiB per rank and layer
    assert env["cp_gdn_state_bytes"] == 32 * 128 * 256 * 4 == 4_194_304
    # (4 − 1) rows · (2 · 2048 + 4096) channels · 2 B
    assert env["cp_gdn_conv_bytes"] == 3 * 8192 * 2 == 49_152
    # zigzag → contiguous: the rank's 4096 / 2 rows · h 2048 · 2 B
    assert env["cp_gdn_relayout_bytes"] == 2048 * 2048 * 2 == 8_388_608
    assert env["step.cp_gdn_state_gather.fwd.send_bytes"] == 4_194_304 * 18 * 64
    assert env["step.cp_gdn_state_gather.bwd.recv_bytes"] == 2 * 4_194_304 * 18 * 64
    # stage 0's first rank is CP rank 0: it has a next rank, so it sends its conv rows
    assert env["step.cp_gdn_conv_boundary.fwd.send_bytes"] == 49_152 * 18 * 64
    assert env["step.cp_gdn_relayout.fwd.send_bytes"] == 2 * 8_388_608 * 18 * 64
    # K/V all-gathers only on the 6 gated-attention blocks
    assert env["step.cp_kv_gather.fwd.send_bytes"] == env["cp_kv_bytes"] * 6 * 64


def test_contiguous_cp_needs_no_relayout():
    env = _stage(_with_cp("qwen3-next-80b-a3b-32", cp_partition_mode="contiguous"))
    assert env["cp_gdn_relayout_bytes"] == env["step.cp_gdn_relayout.fwd.send_bytes"] == 0


def test_dsa_cp_gathers_the_latent_key_and_the_indexer_keys():
    """DeepSeek-V3.2's example with CP 2 and the all-gather exchange DSA requires (ARC007):
    S 4096 → 2048 local rows; latent key 512 + 64, indexer keys 128, bf16."""
    cfg = _with_cp("deepseek-v3.2-1024", cp_comm_type="all_gather")
    env = _stage(cfg, 1)
    local = 1 * 4096 // 2
    assert env["cp_kv_bytes"] == local * (512 + 64) * 2
    assert env["cp_dsa_indexer_k_bytes"] == local * 128 * 2
    # both gathers run once per DSA layer and microbatch (m = 8192 / DP 32 = 256)
    layer_passes = env["step.cp_kv_gather.fwd.send_bytes"] // env["cp_kv_bytes"]
    assert env["step.cp_dsa_indexer_k_gather.fwd.send_bytes"] == (
        env["cp_dsa_indexer_k_bytes"] * layer_passes)
    assert layer_passes % 256 == 0 and layer_passes > 0


@pytest.mark.parametrize(("path", "line", "text"), [
    ("core/ssm/gated_delta_net/gdn.py", 134, 'if self.config.linear_cp_mode == "chunkwise":'),
    ("core/ssm/gated_delta_net/gdn.py", 141, 'target_partition_mode="contiguous",'),
    ("core/transformer/transformer_config.py", 1077, 'linear_cp_mode: Optional[str] = "chunkwise"'),
    ("core/transformer/experimental_attention_variant/absorbed_mla.py", 857, "value=None,"),
    ("core/transformer/experimental_attention_variant/dsa.py", 2136,
     "k = gather_from_sequence_parallel_region(k, group=cp_group)"),
])
def test_cited_megatron_line(path: str, line: int, text: str):
    assert text in megatron_line(path, line), f"megatron/{path}:{line}"

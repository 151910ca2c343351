"""The model's size, from the formula book's params page evaluated for the whole model: totals
against the published model cards (within 0.5 %), exact hand counts for two GPT-form models, and
`moeplan check` printing them (without importing sympy)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.config.loader import parse_config
from planner.model_size import model_size
from tests.support.paths import EXAMPLES, ROOT

B = 10**9

# Published sizes (billions): total without MTP, activated per token (every non-routed parameter,
# embedding and output layer included, plus the top-k routed experts; no MTP), with MTP.
# DeepSeek-V3: its model card (671B + 14B MTP; 37B activated, 37.5B counting the output layer's
# 0.93B as activated). Qwen3: the model cards (30.5B / 3.3B, 235B / 22B) to the digits of an
# independent count from config.json. Mixtral-8x7B: Mistral's 46.7B / 12.9B. DeepSeek-V4: the
# DeepSeek-V4 Megatron write-up's counts of the released checkpoints.
PUBLISHED = {
    "deepseek-v3": (671.0, 37.5, None),
    "qwen3-30b-a3b": (30.53, 3.35, None),
    "qwen3-235b-a22b": (235.09, 22.19, None),
    "mixtral-8x7b": (46.70, 12.88, None),
    "deepseek-v4-pro": (1573.0, 49.78, 1598.8),
    "deepseek-v4-flash": (284.3, 13.80, None),
}


def size_of(preset: str, **model: object):
    cfg = parse_config({"model": {"preset": preset, **model}, "parallel": {"world_size": 8},
                        "training": {"seq_length": 128}, "ignore": ["MEM001"]})
    size = model_size(cfg)
    assert size is not None
    return size


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_totals_match_the_model_cards(preset: str):
    total, active, with_mtp = PUBLISHED[preset]
    size = size_of(preset)
    assert size.total_params / B == pytest.approx(total, rel=0.005)
    assert size.active_params / B == pytest.approx(active, rel=0.005)
    if with_mtp is not None:
        assert (size.total_params + size.mtp_params) / B == pytest.approx(with_mtp, rel=0.005)


def test_mixtral_by_hand():
    # h 4096, 32 layers, 32 heads of 128, 8 KV groups, 8 experts of FFN 14336, top-2, V 32000.
    attention = 2 * 4096 * 4096 + 2 * 4096 * 8 * 128  # q and o, k and v = 41,943,040
    expert = 3 * 4096 * 14336                          # SwiGLU FC1 (2x) + FC2 = 176,160,768
    layer = attention + 2 * 4096 + 8 * 4096 + 8 * expert  # + two RMSNorms + the router
    tables = 2 * 32000 * 4096                          # untied embedding and output layer
    total = 32 * layer + tables + 4096                 # + the final norm
    assert total == 46_702_792_704
    size = size_of("mixtral-8x7b")
    assert size.total_params == total
    assert size.active_params == total - 32 * 6 * expert == 12_879_925_248
    assert size.embedding_params == tables and size.mtp_params == 0
    assert size.routed_expert_params == 32 * 8 * expert


def test_qwen3_30b_by_hand():
    # h 2048, 48 layers, 32 heads of 128 (q/o 4096 wide), 4 KV groups, q/k RMSNorm over 128,
    # 128 experts of FFN 768, top-8, V 151936, every layer MoE.
    attention = 2 * 2048 * 4096 + 2 * 2048 * 4 * 128 + 2 * 128
    expert = 3 * 2048 * 768
    layer = attention + 2 * 2048 + 128 * 2048 + 128 * expert
    total = 48 * layer + 2 * 151936 * 2048 + 2048
    assert total == 30_532_122_624
    size = size_of("qwen3-30b-a3b")
    assert size.total_params == total
    assert size.active_params == total - 48 * 120 * expert


def test_mtp_block_and_tied_embedding():
    # DeepSeek-V3's MTP layer is one MoE block plus its e/h projection (2h x h) and three norms;
    # its embedding and output layer are the main model's.
    v3 = size_of("deepseek-v3")
    no_mtp = size_of("deepseek-v3", mtp_num_layers=0)
    assert no_mtp.total_params == v3.total_params and no_mtp.mtp_params == 0
    block = (v3.total_params - size_of("deepseek-v3", num_layers=60,
                                       moe_layer_freq=[0] * 3 + [1] * 57).total_params)
    assert v3.mtp_params == block + 2 * 7168 * 7168 + 3 * 7168
    tied = size_of("mixtral-8x7b", untie_embeddings_and_output_weights=False)
    assert tied.total_params == size_of("mixtral-8x7b").total_params - 32000 * 4096
    assert tied.embedding_params == 32000 * 4096


def test_check_prints_the_model_size():
    result = CliRunner().invoke(app, ["check", "--json", str(EXAMPLES / "mixtral-8x7b-64.yaml")])
    assert result.exit_code == 0
    assert json.loads(result.output)["model"] == {
        "total_params": 46_702_792_704, "active_params": 12_879_925_248, "mtp_params": 0,
        "embedding_params": 2 * 32000 * 4096, "routed_expert_params": 32 * 8 * 3 * 4096 * 14336}
    text = CliRunner().invoke(app, ["check", str(EXAMPLES / "deepseek-v3-1024.yaml")]).output
    assert "total parameters (without MTP)" in text and "671.03 B" in text
    assert "activated parameters per token" in text and "37.55 B" in text


def test_check_stays_free_of_sympy():
    code = ("import sys; from typer.testing import CliRunner; from planner.cli import app; "
            f"r = CliRunner().invoke(app, ['check', {str(EXAMPLES / 'deepseek-v4-pro-1024.yaml')!r}]);"
            "print(r.exit_code, 'sympy' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    assert out.stdout.split() == ["0", "False", "False"]

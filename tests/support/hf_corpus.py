"""The verbatim Hugging Face config.json corpus (tests/support/hf_config_files/, sources in its
SOURCES.txt) and what transformers builds from each file.

`TRANSFORMERS_COUNTS` holds, per file, the parameters of transformers' own model built on the meta
device from that file (transformers 5.25.0, `AutoModelForCausalLM.from_config`, every parameter
summed; no MTP layer, which transformers does not build; for a multimodal wrapper, the text stack
with its output layer, from `AutoModelForImageTextToText`). The unit tests compare moeplan's count
with these numbers without importing torch; tests/integration/transformers/ rebuilds the models
and checks the numbers still hold (skipped where transformers is not installed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).parent / "hf_config_files"

# name -> total parameters of transformers 5.25.0's meta-device build of the file.
TRANSFORMERS_COUNTS: dict[str, int] = {
    "deepseek-v4-pro": 1_572_997_179_491,
    "deepseek-v4-flash": 284_332_230_231,
    "glm-4.7-flash": 29_943_390_976,
    "nvidia-nemotron-3-nano-30b-a3b": 31_577_937_344,  # NemotronHForCausalLM
    "glm-5.1": 743_911_199_232,
    # Qwen3VLMoeForConditionalGeneration: its language_model (30,220,957,696) and lm_head
    # (311,164,928); the vision tower's 538,631,408 are left out (moeplan plans the text stack).
    "qwen3-vl-30b-a3b": 30_532_122_624,
    # Qwen3_5MoeForConditionalGeneration: language_model 34,152,051,328 + lm_head 508,559,360
    # (vision tower 446,571,248 left out).
    "qwen3.5-35b-a3b": 34_660_610_688,
    # NemotronHForCausalLM with the latent MoE (fc1/fc2_latent_proj of 4096 x 1024 per MoE layer).
    "nvidia-nemotron-3-super-120b-a12b": 120_668_687_360,
    # Kimi_K25ForConditionalGeneration: language_model 1,025,233,804,288 + lm_head 1,174,405,120
    # (vision tower and mm_projector 471,143,920 left out).
    "kimi-k2.5": 1_026_408_209_408,
    # Qwen3VLMoeForConditionalGeneration: language_model 234,471,301,120 + lm_head 622,329,856
    # (vision tower 576,388,336 left out; with it, the checkpoint's 235,670,022,896).
    "qwen3-vl-235b-a22b": 235_093_634_560,
    # Qwen3_5MoeForCausalLM (AutoModelForCausalLM builds the text stack only)
    "qwen3.5-397b-a17b": 396_346_350_336,
    # held out (HELD_OUT below): measured after the records were written, no code changed for them
    "glm-5": 743_911_199_232,  # GlmMoeDsaForCausalLM, GLM-5.1's network
    # Qwen3_5MoeForConditionalGeneration: language model and lm_head (vision tower left out)
    "qwen3.5-122b-a10b": 122_111_526_912,
    "qwen3.5-122b-a10b-nvfp4": 122_111_526_912,
    "qwen3.6-35b-a3b-nvfp4": 34_660_610_688,
    "minimax-m2.5": 228_689_748_992,  # MiniMaxM2ForCausalLM (no MTP module built)
    "minimax-m2.7": 228_689_748_992,
    "nvidia-nemotron-3-ultra-550b-a55b": 549_308_968_960,  # NemotronHForCausalLM, latent MoE
    "nvidia-nemotron-3.5-lightning-30b-a3b-nvfp4": 31_577_937_344,
    "nvidia-nemotron-3-super-120b-a12b-fp8": 120_668_687_360,
    # Kimi_K25ForConditionalGeneration: language model and lm_head (vision tower left out)
    "kimi-k2.6-nvfp4": 1_026_408_209_408,
    "kimi-k2.7-code-nvfp4": 1_026_408_209_408,
    "deepseek-v3.2": 671_877_929_216,  # DeepseekV32ForCausalLM
    # GlmMoeDsaForCausalLM: indexers on the 21 'full' layers only (indexer_types), the other 57
    # reuse the last full layer's top-k
    "glm-5.2": 743_377_000_704,
}

# Files of the corpus whose model_type has no moeplan record: what transformers 5.25 builds of the
# text stack (towers and projector left out), which `import hf`'s no-record path maps onto the layer
# kinds and counts exactly (MiniMax-M3: its block-sparse layers, model.index_sparse_layers).
# Measured by `moeplan import hf` on the whole file (~7 CPU-seconds for MiniMax-M3, so
# tests/integration/transformers/ rebuilds it only when named in NO_RECORD_REBUILT).
NO_RECORD_COUNTS: dict[str, int] = {
    # MiniMaxM3SparseForConditionalGeneration; + towers 865,567,232 + 57 x 128 routing biases (a
    # buffer in transformers) = the checkpoint's 427,040,140,160.
    "minimax-m3": 426_174_565_632,
    # held out: MiMoV2FlashForCausalLM (its router correction biases are parameters there)
    "mimo-v2-flash": 308_778_768_832,
    # held out: Gemma4ForConditionalGeneration's text stack (towers 572,792,112 more)
    "gemma-4-26b-a4b": 25_233_141_760,
    "gemma-4-26b-a4b-nvfp4": 25_233_141_760,
}

# Held-out files moeplan refuses, with what transformers 5.25 builds of each and the config key the
# refusal names (none now: GLM-5.2's shared indexer top-k, once refused naming indexer_types, maps
# to Megatron's --dsa-indexer-topk-freq / --dsa-indexer-skip-topk-offset).
REFUSED: dict[str, tuple[int, str]] = {}

# Activated parameters of transformers' build of each held-out file: every parameter less, per
# routed expert block, the share of its experts a token does not reach (1 - top-k / experts), as
# tests/support/hf_sweep.py transformers_counts measures them (transformers 5.25.0).
HELD_OUT_ACTIVATED: dict[str, int] = {
    "mimo-v2-flash": 15_445_924_288, "gemma-4-26b-a4b": 3_822_530_560,
    "gemma-4-26b-a4b-nvfp4": 3_822_530_560, "glm-5": 41_784_709_632,
    "qwen3.5-122b-a10b": 9_771_288_576, "qwen3.5-122b-a10b-nvfp4": 9_771_288_576,
    "qwen3.6-35b-a3b-nvfp4": 3_454_988_928, "minimax-m2.5": 11_030_537_216,
    "minimax-m2.7": 11_030_537_216, "nvidia-nemotron-3-ultra-550b-a55b": 56_058_818_560,
    "nvidia-nemotron-3.5-lightning-30b-a3b-nvfp4": 3_580_073_408,
    "nvidia-nemotron-3-super-120b-a12b-fp8": 12_770_216_960,
    "kimi-k2.6-nvfp4": 32_861_477_888, "kimi-k2.7-code-nvfp4": 32_861_477_888,
    "deepseek-v3.2": 38_403_807_488, "glm-5.2": 41_250_511_104,
}

# The recent files added after the family records and the no-record path were written, no code
# changed for them (tests/support/hf_config_files/SOURCES.txt): the set `import hf` is judged on.
HELD_OUT: tuple[str, ...] = (
    "mimo-v2-flash", "gemma-4-26b-a4b", "gemma-4-26b-a4b-nvfp4", "glm-5", "glm-5.2",
    "qwen3.5-122b-a10b", "qwen3.5-122b-a10b-nvfp4", "qwen3.6-35b-a3b-nvfp4", "minimax-m2.5",
    "minimax-m2.7", "nvidia-nemotron-3-ultra-550b-a55b", "nvidia-nemotron-3.5-lightning-30b-a3b-nvfp4",
    "nvidia-nemotron-3-super-120b-a12b-fp8", "kimi-k2.6-nvfp4", "kimi-k2.7-code-nvfp4",
    "deepseek-v3.2")


def corpus_path(name: str) -> Path:
    return CORPUS / f"{name}.json"


def corpus_config(name: str) -> dict[str, Any]:
    """The file as Python's json reads it (Infinity and NaN included, as transformers reads them)."""
    data: dict[str, Any] = json.loads(corpus_path(name).read_text("utf-8"))
    return data

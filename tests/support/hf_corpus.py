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
}


def corpus_path(name: str) -> Path:
    return CORPUS / f"{name}.json"


def corpus_config(name: str) -> dict[str, Any]:
    """The file as Python's json reads it (Infinity and NaN included, as transformers reads them)."""
    data: dict[str, Any] = json.loads(corpus_path(name).read_text("utf-8"))
    return data

"""transformers builds each verbatim config.json on the meta device (no memory, no weights) and
its parameter count is the one tests/support/hf_corpus.py records, which the unit tests hold
moeplan's count to. Skipped where transformers is not installed (it is pinned in the `test` extra).

Only DeepSeek-V4-Flash is rebuilt here (the article's model; about 5 CPU-seconds, most of it
importing torch and transformers): every build costs 0.5-4 s more, over the suite's time budget.
The other recorded counts were measured the same way; name a file in REBUILT to re-check it.
The no-record path of `import hf` (planner/commands/hf_meta.py) builds a toy ERNIE-4.5-MoE.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from tests.support.hf_corpus import TRANSFORMERS_COUNTS, corpus_path

REBUILT = ("deepseek-v4-flash",)


@pytest.mark.parametrize("name", REBUILT)
def test_transformers_meta_build_has_the_recorded_count(name: str):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    data = json.loads(corpus_path(name).read_text("utf-8"))
    data.pop("quantization_config", None)  # the released weights' format, not the network
    config = transformers.AutoConfig.for_model(**data)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == TRANSFORMERS_COUNTS[name]


def test_a_model_type_without_a_record_is_counted_by_transformers_and_refused_by_layer(
        tmp_path: Path):
    # ERNIE-4.5-MoE has a Megatron-Bridge bridge but no moeplan record: import hf reports what
    # transformers builds from the file and names the layer-0 modules it cannot price.
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = {"architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe",
          "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "moe_num_experts": 4, "moe_k": 2, "vocab_size": 256, "moe_layer_start_index": 1}
    built = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**hf))
    count = sum(p.numel() for p in built.parameters())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf), "utf-8")
    result = CliRunner().invoke(app, ["import", "hf", str(path), "--json"])
    assert result.exit_code == 1
    messages = [f["message"] for f in json.loads(result.output)["findings"]]
    [census] = [m for m in messages if "transformers" in m]
    assert f"Ernie4_5_MoeForCausalLM with {count:,} parameters in its text stack (2 decoder layers)" \
        in census
    assert "layer 0 (self_attn Ernie4_5_MoeAttention" in census

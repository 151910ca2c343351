"""transformers builds each verbatim config.json on the meta device (no memory, no weights) and
its parameter count is the one tests/support/hf_corpus.py records, which the unit tests hold
moeplan's count to. Skipped where transformers is not installed (it is pinned in the `test` extra).

Only DeepSeek-V4-Flash is rebuilt here (the article's model; about 5 CPU-seconds, most of it
importing torch and transformers): every build costs 0.5-4 s more, over the suite's time budget.
The other recorded counts were measured the same way; name a file in REBUILT to re-check it.
"""

from __future__ import annotations

import json

import pytest

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

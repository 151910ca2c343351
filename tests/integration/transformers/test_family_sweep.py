"""Every MoE family a user is likely to bring, as transformers 5.25 ships it (shrunk from its own
config class's defaults: tests/support/hf_sweep.py), through `import hf` in-process: counted
exactly as transformers' meta-device build counts it (total and activated, no MTP), or refused
naming the module, its class and its layer index; never another model, never a traceback.
Skipped where transformers is not installed (it is pinned in the `test` extra)."""

from __future__ import annotations

import pytest

from tests.support.hf_sweep import SWEEP, moeplan_counts, shrunk, transformers_counts


@pytest.mark.parametrize("model_type", sorted(SWEEP))
def test_a_family_is_counted_as_transformers_builds_it_or_refused_by_module(model_type: str):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from planner.commands.hf_meta import _build

    hf = shrunk(model_type)
    path, counted = moeplan_counts(hf)
    expected = SWEEP[model_type]
    if expected != "exact":
        assert path == "refused" and expected in str(counted), counted
        return
    assert path != "refused", counted
    assert counted == transformers_counts(_build(hf))

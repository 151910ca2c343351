"""The judge builds a knob setting's config from sections it made before (shared objects, so the
memos keyed on a section's identity hit): the config and its identity must be exactly those that
`Knobs.apply` and `identity` give, or search would judge other candidates or merge distinct ones."""

from __future__ import annotations

from dataclasses import replace

from planner.config.loader import load_config
from planner.search.judge import Judge, identity
from planner.search.knobs import Knobs, Pipeline
from planner.search.space import dispatchers, pipeline_choices, recompute_presets
from tests.support.paths import EXAMPLES


def test_shared_sections_build_the_same_config_and_identity() -> None:
    cfg = load_config(EXAMPLES / "deepseek-v3-1024.yaml")
    judge, base = Judge(cfg), Knobs.of(cfg)
    pipes = [Pipeline.of(cfg), *pipeline_choices(cfg, 4, (1, 2))[:2]]
    keys = set()
    for pp, pipe in ((cfg.parallel.pp, pipes[0]), (4, pipes[1]), (4, pipes[2])):
        for dispatcher in dispatchers(cfg):
            for preset in recompute_presets(cfg)[:3]:
                for mbs in (1, 2):
                    for overlap in (True, False):
                        knobs = replace(base, pp=pp, pipeline=pipe, dispatcher=dispatcher,
                                        recompute=preset, micro_batch_size=mbs, ep_overlap=overlap)
                        made, key = judge._setting(knobs)
                        assert made == knobs.apply(cfg)
                        assert key == identity(made)
                        keys.add(key)
                        # one section object per value: the layout's settings share theirs
                        assert made.parallel is judge._setting(replace(knobs, micro_batch_size=4))[0].parallel
    assert len(keys) == 3 * len(dispatchers(cfg)) * 3 * 2 * 2

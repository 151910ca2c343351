"""Layer → stage split: Megatron's even, uneven and layout-string rules."""

from __future__ import annotations

import pytest

from planner.config.loader import parse_config
from planner.layout.pipeline import SplitError, expand_layout, stage_split


def split_of(minimal_v4, **parallel):
    minimal_v4["parallel"].update(parallel)
    return stage_split(parse_config(minimal_v4))


def test_expand_megatron_reference_layout():
    stages = expand_layout("Et*4|(tttt|)*14tmL")
    assert len(stages) == 16
    assert stages[0] == ["E", "t", "t", "t", "t"] and stages[-1] == ["t", "m", "L"]
    assert sum(s.count("t") for s in stages) == 61


def test_v4_pro_example_layout(minimal_v4):
    split = split_of(minimal_v4, pipeline_model_parallel_layout="Et*6|(t*8|)*6t*7mL")
    assert split.vpp == 1
    assert [len(s.layers) for s in split.stages] == [6, 8, 8, 8, 8, 8, 8, 7]
    assert split.stages[0].hash_layers == (0, 1, 2) and split.stages[0].embedding
    last = split.stages[-1]
    assert last.mtp_layers == (0,) and last.output_head and last.moe_layers[-1] == 61
    assert [len(s.moe_layers) for s in split.stages] == [6, 8, 8, 8, 8, 8, 8, 8]


def test_layout_with_vpp_maps_virtual_stages_round_robin(minimal_v4):
    minimal_v4["parallel"].update(world_size=256, pp=4, ep=64, cp=1)
    split = split_of(minimal_v4, pipeline_model_parallel_layout="Et*4|(tttt|)*14tmL")
    assert split.vpp == 4
    assert [c.stage for c in split.chunks[:5]] == [0, 1, 2, 3, 0]
    assert split.stages[0].layers[:8] == (0, 1, 2, 3, 16, 17, 18, 19)
    assert split.stages[3].mtp_layers == (0,)


def test_even_split_needs_divisibility(minimal_v4):
    with pytest.raises(SplitError, match="not divisible by pp=8"):
        split_of(minimal_v4)


def test_first_last_counts(minimal_v4):
    split = split_of(minimal_v4, decoder_first_pipeline_num_layers=6,
                     decoder_last_pipeline_num_layers=7)
    assert [len(s.layers) for s in split.stages] == [6, 8, 8, 8, 8, 8, 8, 7]
    with pytest.raises(SplitError, match="middle"):
        split_of(minimal_v4, decoder_first_pipeline_num_layers=5, decoder_last_pipeline_num_layers=7)


def test_interleaved_even_split(minimal_v4):
    minimal_v4["model"]["num_layers"] = 16
    minimal_v4["model"]["mtp_num_layers"] = 0
    split = split_of(minimal_v4, pp=2, vpp=2, world_size=256, ep=64)
    assert [c.layers for c in split.chunks] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11),
                                                (12, 13, 14, 15)]
    assert split.stages[0].layers == (0, 1, 2, 3, 8, 9, 10, 11)


def test_layout_vpp_mismatch(minimal_v4):
    with pytest.raises(SplitError, match="vpp=2"):
        split_of(minimal_v4, pipeline_model_parallel_layout="Et*6|(t*8|)*6t*7mL", vpp=2)


@pytest.mark.parametrize("layout,fragment", [
    ("Et*6|(t*8|)*6t*6mL", "decoder layers"),
    ("Et*6|(t*8|)*6t*7L", "MTP"),
    ("t*6|(t*8|)*6Et*7mL", "embedding"),
    ("Et*6|(t*8|*6t*7mL", "unbalanced"),
    ("Et*6|(t*8|)*6t*7mLx", "unexpected"),
])
def test_bad_layouts(minimal_v4, layout, fragment):
    with pytest.raises(SplitError, match=fragment):
        split_of(minimal_v4, pipeline_model_parallel_layout=layout)


def test_huge_layout_repeat_is_refused_quickly(minimal_v4):
    with pytest.raises(SplitError, match="limit"):
        split_of(minimal_v4, pipeline_model_parallel_layout="Et*1000000000|tmL")


def test_uneven_split_suggests_a_layout_that_works(minimal_v4):
    with pytest.raises(SplitError) as err:
        split_of(minimal_v4)
    assert 'pipeline_model_parallel_layout: "Et*5|(t*8|)*6t*8mL"' in err.value.fix
    split = split_of(minimal_v4, pipeline_model_parallel_layout="Et*5|(t*8|)*6t*8mL")
    assert [len(s.layers) for s in split.stages] == [5, 8, 8, 8, 8, 8, 8, 8]
    assert split.stages[0].hash_layers == (0, 1, 2) and split.stages[-1].mtp_layers == (0,)

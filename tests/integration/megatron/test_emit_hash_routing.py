"""Which MoE blocks Megatron hash-routes under the emitted launch, judged by Megatron's own objects
through the shipped pre-flight (the probe builds Megatron's decoder stacks per pipeline rank and
virtual stage and reads each router's decision), and the hand-derived values behind it.

Megatron hashes a non-MTP MoE layer whose layer number is <= moe_n_hash_layers (Megatron-LM
dev@d48bd6be megatron/core/transformer/moe/router.py TopKRouter.__init__). The hybrid stack numbers
every pattern symbol, attention and MLP alike, across pipeline segments
(megatron/core/models/hybrid/hybrid_block.py HybridStack.__init__, offsets from
hybrid_layer_allocation.py select_pipeline_segment), so moeplan's "first 3 MoE blocks" of
`HEHECE…` are layers 2, 4, 6 and the flag must say 6, not 3. The GPT stack numbers decoder layers
(megatron/core/transformer/transformer_block.py TransformerBlock), so there the count is moeplan's.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import pytest

from planner.config.loader import load_config, parse_config
from planner.config.schema import Config
from planner.emit import EmitError
from planner.emit.megatron import megatron_arguments, megatron_hash_layer_count
from planner.emit.megatron_check import CheckRequest, CheckResult, expected_values, request_for
from planner.layout.pipeline import stage_split
from tests.support.megatron_judge import Case, case_of, hashed_blocks, plan_of, register, verdict
from tests.support.paths import EXAMPLES

V4_EXAMPLES = ("deepseek-v4-pro-1024.yaml", "deepseek-v4-flash-128.yaml")


def hybrid_args(cfg: Config) -> tuple[str, int]:
    flags = megatron_arguments(cfg).as_dict()
    return flags["--hybrid-layer-pattern"][0], int(flags.get("--moe-n-hash-layers", ("0",))[0])


def planned_hashed(cfg: Config) -> set[int]:
    return {layer for stage in stage_split(cfg).stages for layer in stage.hash_layers}


def megatron_hashed(results: list[CheckResult]) -> list[set[int]]:
    """Per config, the planned MoE blocks Megatron hash-routed; every config must pass the whole
    pre-flight (the hash comparison included), so a failure shows Megatron's own message."""
    for result in results:
        assert result.verdict == "pass", (result.name, result.message, result.location, result.mismatches)
    return [hashed_blocks(result) for result in results]


# ------------------------------------------------------------------ hand-derived (no Megatron)


def test_v4_examples_count_pattern_symbols_up_to_the_third_moe_block():
    # Both begin with three blocks (attention symbol + E): E of block 2 is symbol 6.
    for name in V4_EXAMPLES:
        cfg = load_config(EXAMPLES / name)
        pattern, count = hybrid_args(cfg)
        assert pattern[:6] in ("HEHECE", "WEWECE")
        assert count == 6 and planned_hashed(cfg) == {0, 1, 2}


def flash(**model: Any) -> Config:
    data = {"model": {"preset": "deepseek-v4-flash", "num_layers": 6, "mtp_num_layers": 0, **model},
            "parallel": {"world_size": 1}, "training": {"seq_length": 128}}
    return parse_config(data)


def test_dense_first_layers_are_counted_but_never_hashed():
    # moe_n_hash_layers 3 over [dense, MoE, MoE, ...]: MoE blocks 1 and 2, symbols W- WE CE -> 6.
    cfg = flash(moe_layer_freq=[0, 1, 1, 1, 1, 1], moe_n_hash_layers=3)
    pattern, count = hybrid_args(cfg)
    assert pattern.startswith("W-WECE") and count == 6
    assert planned_hashed(cfg) == {1, 2}  # the plan lists MoE blocks only, as the runtime hashes


def test_a_dense_block_last_in_the_hashed_range_shortens_the_count():
    # [MoE, MoE, dense, MoE, ...] with 3: blocks 0, 1 hashed; stop at the second E (symbol 4).
    cfg = flash(moe_layer_freq=[1, 1, 0, 1, 1, 1], moe_n_hash_layers=3)
    assert hybrid_args(cfg) == ("WEWEC-HECEHE", 4)
    assert planned_hashed(cfg) == {0, 1}


def test_hash_layers_over_dense_blocks_only_emit_no_flag_and_say_so():
    cfg = flash(moe_layer_freq=[0, 0, 1, 1, 1, 1], moe_n_hash_layers=2)
    args = megatron_arguments(cfg)
    assert "--moe-n-hash-layers" not in args.as_dict() and planned_hashed(cfg) == set()
    assert any("model.moe_n_hash_layers 2" in note and "not passed" in note for note in args.notes)


def test_a_numbering_no_count_can_cut_exactly_is_an_emit_error():
    # Megatron's stacks number layers in pipeline order, so this cannot come from a real pattern;
    # the guard still refuses rather than emit a count that hashes other blocks than planned.
    cfg = flash(num_layers=3, moe_n_hash_layers=2)
    with pytest.raises(EmitError) as caught:
        megatron_hash_layer_count(cfg, stage_split(cfg), {0: 6, 1: 2, 2: 4})
    assert caught.value.path == "model.moe_n_hash_layers" and "[0, 1]" in caught.value.message


GPT_DENSE_FIRST = parse_config({
    "model": {"num_layers": 4, "hidden_size": 16, "num_attention_heads": 2, "vocab_size": 64,
              "max_position_embeddings": 32, "num_experts": 2, "moe_ffn_hidden_size": 8,
              "moe_layer_freq": [0, 1, 1, 1], "moe_n_hash_layers": 3},
    "parallel": {"world_size": 2, "pp": 2, "pipeline_model_parallel_layout": "Ettt|tL"},
    "training": {"seq_length": 32, "global_batch_size": 4},
    "moe": {"moe_token_dispatcher_type": "allgather", "moe_grouped_gemm": False,
            "moe_tid2eid_source": "seeded"},
})


def test_gpt_entry_keeps_decoder_layer_numbers():
    # Layers 1..4, dense first: with 3, Megatron hashes MoE layers 2 and 3 = blocks 1 and 2.
    assert megatron_arguments(GPT_DENSE_FIRST).as_dict()["--moe-n-hash-layers"] == ("3",)
    assert planned_hashed(GPT_DENSE_FIRST) == {1, 2}


# ------------------------------------------------------------------ Megatron as the judge


for _name in V4_EXAMPLES:
    register(_name, case_of(load_config(EXAMPLES / _name), _name))
register("gpt dense first, hash 3", case_of(GPT_DENSE_FIRST, "gpt dense first, hash 3"))


def test_megatron_hashes_the_planned_blocks_of_both_v4_examples_and_a_dense_first_gpt():
    names = [*V4_EXAMPLES, "gpt dense first, hash 3"]
    assert load_config(EXAMPLES / V4_EXAMPLES[0]).parallel.pp == 8  # hashed blocks all on stage 0
    assert megatron_hashed([verdict(name) for name in names]) == [{0, 1, 2}, {0, 1, 2}, {1, 2}]
    configs = [load_config(EXAMPLES / name) for name in V4_EXAMPLES] + [GPT_DENSE_FIRST]
    assert [planned_hashed(cfg) for cfg in configs] == [{0, 1, 2}, {0, 1, 2}, {1, 2}]


def test_megatron_never_hash_routes_an_mtp_layer():
    """Both V4 examples build one MTP depth with an MoE layer on their last stage; its router is
    an MTP router, which Megatron never hashes (moe/router.py TopKRouter.__init__)."""
    for name in V4_EXAMPLES:
        last = verdict(name).derived["chunks"][-1]
        assert [is_hash for _, is_hash in last["mtp_routers"]] == [False]


def pipelines(rng: random.Random, max_pp: int, extra_layers: int, mtp: int) -> tuple[int, list[int], str]:
    """PP, decoder layers per PP x VPP segment (each at least one), and the layout string."""
    pp = rng.randint(1, max_pp)
    segments = pp * (rng.randint(1, 2) if pp > 1 else 1)
    layers = rng.randint(max(segments, 2), segments + extra_layers)
    cuts = sorted(rng.sample(range(1, layers), segments - 1))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, layers], strict=True)]
    layout = "|".join(("E" if i == 0 else "") + "t" * size + ("m" * mtp + "L" if i == segments - 1 else "")
                      for i, size in enumerate(sizes))
    return pp, sizes, layout


def moe_layer_freqs(rng: random.Random, layers: int) -> list[int]:
    """Dense-first blocks, then at least one MoE block and a random (mostly MoE) rest."""
    dense_first = rng.randint(0, layers - 1)
    rest = layers - dense_first - 1
    return [0] * dense_first + [1] + [rng.choice([0, 1, 1]) for _ in range(rest)]


def hybrid_layout(rng: random.Random) -> Config:
    """A V4-Flash-shaped model with a random layer count, MoE pattern, MTP, pipeline layout over
    PP x VPP segments, and a hash count within the first segment (rule PIP003 keeps hashed layers on
    the embedding stage)."""
    mtp = rng.randint(0, 1)
    pp, sizes, layout = pipelines(rng, 4, 10, mtp)
    layers = sum(sizes)
    data = {"model": {"preset": "deepseek-v4-flash", "num_layers": layers, "mtp_num_layers": mtp,
                      "moe_layer_freq": moe_layer_freqs(rng, layers),
                      "moe_n_hash_layers": rng.randint(1, sizes[0])},
            "parallel": {"world_size": pp, "pp": pp, "pipeline_model_parallel_layout": layout},
            "training": {"seq_length": 128, "global_batch_size": 2 * pp},
            "ignore": ["MEM001"]}  # memory is not judged here
    return parse_config(data)


def gpt_layout(rng: random.Random) -> Config:
    """A toy GPT MoE model: random layer count, dense-first/scattered dense blocks, PP x VPP layout,
    and a hash count within the embedding stage (Megatron asserts that for GPT with PP > 1)."""
    pp, sizes, layout = pipelines(rng, 3, 6, 0)
    layers = sum(sizes)
    data = {"model": {"num_layers": layers, "hidden_size": 16, "num_attention_heads": 2, "vocab_size": 64,
                      "max_position_embeddings": 32, "num_experts": 2, "moe_ffn_hidden_size": 8,
                      "moe_layer_freq": moe_layer_freqs(rng, layers),
                      "moe_n_hash_layers": rng.randint(1, sizes[0])},
            "parallel": {"world_size": pp, "pp": pp, "pipeline_model_parallel_layout": layout},
            "training": {"seq_length": 32, "global_batch_size": 2 * pp},
            "moe": {"moe_token_dispatcher_type": "allgather", "moe_grouped_gemm": False,
                    "moe_tid2eid_source": "seeded"}}
    return parse_config(data)


RANDOM_SEED = 20260601  # a fixed draw, as the run before it (derandomized hypothesis) was
RANDOM_COUNT = 10  # of each stack


@functools.cache
def random_layouts() -> list[Config]:
    """Ten hybrid and ten GPT stacks, the same on every run and every xdist worker."""
    rng = random.Random(RANDOM_SEED)
    return ([hybrid_layout(rng) for _ in range(RANDOM_COUNT)]
            + [gpt_layout(rng) for _ in range(RANDOM_COUNT)])


def _random_case(index: int) -> Case:
    """The plain emitted request (no Bridge container: only the hash routing is judged here)."""
    def make() -> tuple[CheckRequest, dict[str, Any]]:
        cfg = random_layouts()[index]
        return request_for(cfg, f"random layout {index}"), expected_values(cfg, plan_of(cfg))
    return make


# The random stacks join the shared probe run (Megatron's import dominates a run's cost): the
# configs are built only when the batch runs.
for _index in range(2 * RANDOM_COUNT):
    register(f"hash routing, random layout {_index}", _random_case(_index))


def test_megatron_hybrid_and_gpt_stacks_hash_the_planned_blocks_of_random_layouts():
    configs = random_layouts()
    results = [verdict(f"hash routing, random layout {i}") for i in range(len(configs))]
    for cfg, hashed in zip(configs, megatron_hashed(results), strict=True):
        assert hashed == planned_hashed(cfg), cfg.parallel.pipeline_model_parallel_layout

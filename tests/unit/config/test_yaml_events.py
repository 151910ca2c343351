"""The event-stream reader (planner/config/yaml_events.py) builds what the composing path builds:
the same data, duplicate keys and key positions, and leaves to it what only it reads faithfully."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from planner.config import loader, yaml_events
from planner.config.loader import InvalidConfig, NodePositions, _ConfigLoader, _duplicate_keys, parse_yaml

ROOT = Path(__file__).resolve().parents[3]
TEXTS = [
    "a: 1\na: 2\nb: [1, 2]\n",
    "x: !!str 12\ny: 0x1F\nz: 017\nw: -5\nv: +5\nu: 1_000\nt: 09\ns: 0\n",
    "t: 2001-12-14\nb: !!binary aGVsbG8=\nn: ~\nm: null\nq: ''\nr:\n",
    "1: a\n'1': b\ntrue: c\nTrue: d\n",
    "- 1\n- [2, 3]\n- {a: b}\n",
    "hello\n", "", "--- \n...\n",
    "a: 1.5\nb: .inf\nc: 1e400\nd: 1e-4\ne: 04:00:00\nf: 10000000000000000000000\n",
    "a: !!map {b: 1}\nc: !!seq [1]\nd: ! 12\n",
    "a: yes\nb: on\nc: 'true'\nd: \"x\"\n",
    "a:\n  b:\n    c: [1, [2, [3, {d: e}]]]\n  b:\n    x: 1\n",
    "{a: 1, a: {b: 2}, c: 3}\n",
    (ROOT / "examples" / "deepseek-v3-1024.yaml").read_text(),
    (ROOT / "examples" / "tiny-cpu-8.yaml").read_text() + "ignore:\n  - par001\n  - PAR999\n",
]


def composed(text: str):
    reader = _ConfigLoader(text)
    try:
        node = reader.get_single_node()
        data = reader.construct_document(node) if node is not None else None
        return data, NodePositions(node), _duplicate_keys(node) if node is not None else []
    finally:
        reader.dispose()


def events(text: str):
    reader = _ConfigLoader(text)
    try:
        return yaml_events.build(reader, 10_000)
    finally:
        reader.dispose()


def paths_of(data, path=()):
    yield path
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        yield from paths_of(value, path + (key if isinstance(data, list) else str(key),))


@pytest.mark.parametrize("text", TEXTS)
def test_events_build_what_the_composer_builds(text):
    want_data, want_positions, want_duplicates = composed(text)
    data, positions, duplicates = events(text)
    assert data == want_data and [type(v) for v in paths_of(data)] == [type(v) for v in paths_of(want_data)]
    assert duplicates == want_duplicates
    for path in paths_of(data):
        assert positions.get(path) == want_positions.get(path), path


@pytest.mark.parametrize("text", [
    "a: &x 1\nb: *x\n", "<<: {a: 1}\nb: 2\n", "? [a]\n: 1\n", "a: 1\n---\nb: 2\n",
    "!!set {a, b}\n", "a: !!omap [{b: 1}]\n", "a: !custom 1\n",
])
def test_what_only_the_composer_reads_is_left_to_it(text):
    with pytest.raises(yaml_events.NeedsComposer):
        events(text)
    try:
        assert parse_yaml(text)[0] == composed(text)[0]  # parse_yaml falls back: the same answer
    except loader.UnreadableConfig as exc:  # or the composer's own refusal
        assert "YAML" in str(exc)


def test_the_node_cap_is_counted_while_building(monkeypatch):
    monkeypatch.setenv("MOEPLAN_YAML_MAX_NODES", "1000")
    with pytest.raises(InvalidConfig) as err:
        parse_yaml("[" + "1," * 5_000 + "1]\n")
    assert [f.code for f in err.value.findings] == ["CFG008"]
    assert "more than 1,000 nodes" in err.value.findings[0].message


def test_the_bench_judges_both_big_cases(tmp_path):
    """bench/yaml_bench.py's cases end as `check` should (its timings are not asserted)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import yaml_bench

    found = yaml_bench.measure(ROOT, 2_000, tmp_path, repeats=1)
    assert {case: row["exit"] for case, row in found.items()} == {"ignore list": 0, "unknown section": 1}
    assert all(row["libyaml_per_100k_s"] > 0 for row in found.values())


@pytest.mark.parametrize("text", ["a: !!bool maybe\n", "a: !!int ''\n", "a: !!timestamp bad\n"])
def test_a_malformed_tagged_value_is_a_usage_error(text):
    """PyYAML's constructors raise KeyError, IndexError, AttributeError on these (a traceback
    before); a syntax error further on still comes first (the composer reads before it builds)."""
    with pytest.raises(loader.UnreadableConfig, match="cannot be read as its tag"):
        parse_yaml(text)
    with pytest.raises(loader.UnreadableConfig, match="syntax error at line 3"):
        parse_yaml(text + "b: [1\n")


def test_mutated_configs_read_alike_on_both_paths():
    """Mutated example configs (tests/support/text_mutator.py): where the event path reads one, the
    data, duplicates and positions are the composer's; where either refuses, both refuse alike."""
    from tests.support.text_mutator import mutate_text

    originals = [path.read_text() for path in sorted((ROOT / "examples").glob("*.yaml"))]
    for seed in range(300):
        text, steps = mutate_text(originals[seed % len(originals)], seed, steps=4)
        try:
            want, refusal = composed(text), None
        except Exception as exc:  # noqa: BLE001 - compared with the event path's refusal below
            want, refusal = None, (type(exc), str(exc))
        try:
            got = events(text)
        except yaml_events.NeedsComposer:
            continue
        except Exception as exc:  # noqa: BLE001
            assert (type(exc), str(exc)) == refusal, (seed, steps)
            continue
        assert refusal is None and got[0] == want[0] and got[2] == want[2], (seed, steps)
        assert all(got[1].get(path) == want[1].get(path) for path in paths_of(got[0])), (seed, steps)

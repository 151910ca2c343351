"""The config schema and loader: presets, derived fields, and every kind of bad input as findings."""

from __future__ import annotations

import pytest

from planner.config.loader import InvalidConfig, UnreadableConfig, load_config, parse_config, parse_yaml
from planner.config.presets import PRESETS
from planner.rules.example_base import example_config_data, merge
from tests.support.paths import EXAMPLES


def codes(exc: InvalidConfig) -> list[str]:
    return [f.code for f in exc.findings]


def test_minimal_file_of_the_issue_is_accepted(minimal_v4):
    cfg = parse_config(minimal_v4)
    assert (cfg.dp, cfg.edp, cfg.microbatches) == (64, 2, 64)
    assert cfg.parallel.etp == 1 and cfg.cluster.nodes == 128


def test_v4_pro_preset_dimensions(minimal_v4):
    m = parse_config(minimal_v4).model
    assert (m.hidden_size, m.num_layers, m.vocab_size, m.num_experts, m.moe_router_topk) == (
        7168, 61, 129280, 384, 6)
    assert (m.moe_ffn_hidden_size, m.moe_shared_expert_intermediate_size, m.moe_n_hash_layers) == (
        3072, 3072, 3)
    assert (m.num_attention_heads, m.mtp_num_layers, m.mhc_expansion) == (128, 1, 4)
    assert m.moe_router_topk_scaling_factor == 2.5
    assert m.moe_router_score_function == "sqrtsoftplus" and m.moe_router_enable_expert_bias
    assert len(m.compress_ratios) == 62


def test_v4_flash_preset_differs_where_documented(minimal_v4):
    minimal_v4["model"] = {"preset": "deepseek-v4-flash"}
    m = parse_config(minimal_v4).model
    assert (m.hidden_size, m.num_layers, m.num_experts, m.moe_ffn_hidden_size) == (4096, 43, 256, 2048)
    assert (m.num_attention_heads, m.moe_router_topk_scaling_factor, m.moe_router_topk) == (64, 1.5, 6)
    assert m.compress_ratios[:3] == [0, 0, 4] and len(m.compress_ratios) == 44


def test_preset_fields_can_be_overridden(minimal_v4):
    minimal_v4["model"]["num_experts"] = 256
    assert parse_config(minimal_v4).model.num_experts == 256
    assert PRESETS["deepseek-v4-pro"]["num_experts"] == 384


def test_megatron_long_names_are_accepted(minimal_v4):
    minimal_v4["parallel"] = {"world_size": 64, "tensor_model_parallel_size": 1,
                              "expert_model_parallel_size": 8, "context_parallel_size": 2}
    cfg = parse_config(minimal_v4)
    assert (cfg.parallel.ep, cfg.parallel.cp, cfg.parallel.etp) == (8, 2, 1)


def test_world_size_derived_from_cluster(minimal_v4):
    del minimal_v4["parallel"]["world_size"]
    minimal_v4["cluster"] = {"nodes": 128, "gpus_per_node": 8}
    assert parse_config(minimal_v4).parallel.world_size == 1024


def test_world_size_missing_everywhere_is_a_finding(minimal_v4):
    del minimal_v4["parallel"]["world_size"]
    with pytest.raises(InvalidConfig) as err:
        parse_config(minimal_v4)
    assert err.value.findings[0].path == "parallel.world_size"


def test_unknown_key_suggests_the_near_name(minimal_v4):
    minimal_v4["parallel"]["expert_paralel"] = 4
    minimal_v4["trainin"] = {}
    with pytest.raises(InvalidConfig) as err:
        parse_config(minimal_v4)
    fixes = {f.path: f.fix for f in err.value.findings}
    assert codes(err.value) == ["CFG001", "CFG001"]
    assert "did you mean 'training'" in fixes["trainin"]
    assert fixes["parallel.expert_paralel"].startswith("did you mean")


@pytest.mark.parametrize("value,code", [(0, "CFG004"), (-2, "CFG004"), ("8", "CFG002"),
                                        (2.5, "CFG002"), (True, "CFG002"), ([2], "CFG002")])
def test_bad_sizes(minimal_v4, value, code):
    minimal_v4["parallel"]["ep"] = value
    with pytest.raises(InvalidConfig) as err:
        parse_config(minimal_v4)
    assert codes(err.value) == [code]
    assert err.value.findings[0].path == "parallel.ep"


def test_all_problems_reported_at_once(minimal_v4):
    minimal_v4["parallel"]["tp"] = 0
    minimal_v4["training"]["seq_length"] = "long"
    minimal_v4["moe"] = {"moe_token_dispatcher_type": "alltoal"}
    with pytest.raises(InvalidConfig) as err:
        parse_config(minimal_v4)
    assert {f.path for f in err.value.findings} == {
        "parallel.tp", "training.seq_length", "moe.moe_token_dispatcher_type"}


def test_line_numbers_and_duplicates():
    text = "model:\n  preset: deepseek-v4-pro\nparallel:\n  world_size: 8\n  ep: 0\n  ep: 2\n" \
           "training:\n  seq_length: 8\n"
    data, positions, duplicates = parse_yaml(text)
    with pytest.raises(InvalidConfig) as err:
        parse_config(data, positions, duplicates)
    assert [f.code for f in err.value.findings] == ["CFG006"]
    assert "line 6" in err.value.findings[0].message


@pytest.mark.parametrize("content,fragment", [
    ("model: [1, 2\n", "line 2"),
    (b"\x00\x01\x02", "binary"),
    (b"\xff\xfe junk", "UTF-8"),
])
def test_unreadable_inputs(tmp_path, content, fragment):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UnreadableConfig) as err:
        load_config(path)
    assert fragment in str(err.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(UnreadableConfig, match="no such file"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(UnreadableConfig, match="directory"):
        load_config(tmp_path)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "42\n", "- a\n- b\n"])
def test_empty_or_non_mapping(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(InvalidConfig) as err:
        load_config(path)
    assert codes(err.value) == ["CFG005"]


def test_bundled_examples_load():
    for name in ("deepseek-v4-pro-1024", "deepseek-v4-flash-128", "tiny-cpu-8"):
        load_config(EXAMPLES / f"{name}.yaml")


def test_resolved_config_round_trips(minimal_v4):
    cfg = parse_config(minimal_v4)
    again = parse_config(cfg.model_dump(mode="json"))
    assert again == cfg


def test_yaml_numbers_read_as_megatron_users_write_them(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {preset: deepseek-v4-pro}\n"
                    "parallel: {world_size: 1024, cp: 2, pp: 8, ep: 64,"
                    " pipeline_model_parallel_layout: 'Et*6|(t*8|)*6t*7mL'}\n"
                    "training: {seq_length: 8192, global_batch_size: 4096, lr: 3e-4, adam_eps: 1e-8}\n"
                    "launch: {time: 04:00:00}\n")
    cfg = load_config(path)
    assert cfg.training.lr == 3e-4 and cfg.training.adam_eps == 1e-8
    assert cfg.launch.time == "04:00:00"


# ----------------------------------------------------------------------------- non-finite and huge


def _float_fields() -> list[tuple[str, str]]:
    """Every (section, field) of the schema that takes a float, found from the annotations."""
    import typing

    from planner.config.schema import Config

    def takes_float(annotation) -> bool:
        if annotation is float:
            return True
        return any(takes_float(a) for a in typing.get_args(annotation))

    return [(section, name) for section, info in Config.model_fields.items()
            if hasattr(info.annotation, "model_fields")
            for name, field in info.annotation.model_fields.items() if takes_float(field.annotation)]


FLOAT_FIELDS = _float_fields()


def test_the_schema_has_float_fields_in_several_sections():
    assert {"model", "training", "moe", "cluster"} <= {section for section, _ in FLOAT_FIELDS}
    assert ("cluster", "gpu_memory_gib") in FLOAT_FIELDS
    assert ("moe", "moe_expert_capacity_factor") in FLOAT_FIELDS


@pytest.mark.parametrize("section,field", FLOAT_FIELDS)
@pytest.mark.parametrize("literal", [".inf", "-.inf", ".nan", ".NaN", "+.Inf", "1e400"])
def test_non_finite_floats_are_cfg004_everywhere(section, field, literal):
    """`.inf`/`.nan` (and 1e400, which YAML reads as inf) are rejected where they are written,
    for every float field of every section, instead of crashing a budget later."""
    sections = {"model": "preset: deepseek-v4-flash", "parallel": "world_size: 128, ep: 64",
                "training": "seq_length: 4096"}
    sections[section] = ", ".join(filter(None, [sections.get(section), f"{field}: {literal}"]))
    text = "".join(f"{name}: {{{body}}}\n" for name, body in sections.items())
    data, positions, duplicates = parse_yaml(text)
    with pytest.raises(InvalidConfig) as err:
        parse_config(data, positions, duplicates)
    assert [(f.code, f.path) for f in err.value.findings] == [("CFG004", f"{section}.{field}")]
    finding = err.value.findings[0]
    assert "finite" in finding.message and "line" in finding.message
    assert f"{section}.{field}" in finding.fix


def test_integers_beyond_64_bits_are_cfg004(minimal_v4):
    minimal_v4["model"]["hidden_size"] = 10**30
    minimal_v4["model"]["compress_ratios"] = [0, -(2**64)]
    with pytest.raises(InvalidConfig) as err:
        parse_config(minimal_v4)
    assert [(f.code, f.path) for f in err.value.findings] == [
        ("CFG004", "model.compress_ratios.1"), ("CFG004", "model.hidden_size")]
    assert "31-digit integer is beyond the 64-bit range" in err.value.findings[1].message


@pytest.mark.parametrize("section,field,value", [
    ("parallel", "world_size", 2**20 + 1), ("model", "num_layers", 100_001),
    ("model", "mtp_num_layers", 2**31), ("model", "num_experts", 2**16 + 1),
    ("cluster", "gpus_per_node", 2**21),
])
def test_counts_moeplan_enumerates_have_a_ceiling(minimal_v4, section, field, value):
    minimal_v4.setdefault(section, {})[field] = value
    with pytest.raises(InvalidConfig) as err:
        parse_config(minimal_v4)
    assert [(f.code, f.path) for f in err.value.findings] == [("CFG004", f"{section}.{field}")]


def test_world_derived_from_nodes_has_the_same_ceiling(minimal_v4):
    del minimal_v4["parallel"]["world_size"]
    minimal_v4["cluster"] = {"nodes": 2**18, "gpus_per_node": 8}
    with pytest.raises(InvalidConfig) as err:
        parse_config(minimal_v4)
    assert [(f.code, f.path) for f in err.value.findings] == [("CFG004", "cluster.nodes")]
    assert "2097152 ranks" in err.value.findings[0].message


# ----------------------------------------------------------------------------- defaults, one home
# Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py:
# TransformerConfig.moe_flex_dispatcher_backend = "deepep", TransformerConfig.fp8_recipe = "delayed".


def _with(section: str, values: dict) -> dict:
    return merge(example_config_data(""), {section: values})


def test_flex_without_a_backend_gets_megatrons_default() -> None:
    cfg = parse_config(_with("moe", {"moe_token_dispatcher_type": "flex"}))
    assert cfg.moe.moe_flex_dispatcher_backend == "deepep"
    named = parse_config(_with("moe", {"moe_token_dispatcher_type": "flex",
                                       "moe_flex_dispatcher_backend": "hybridep"}))
    assert named.moe.moe_flex_dispatcher_backend == "hybridep"


def test_other_dispatchers_keep_no_backend() -> None:
    """Only flex has a backend: search's plain dispatchers carry None, and so does the user's."""
    cfg = parse_config(_with("moe", {"moe_token_dispatcher_type": "alltoall"}))
    assert cfg.moe.moe_flex_dispatcher_backend is None


def test_fp8_alone_is_e4m3_with_the_delayed_recipe() -> None:
    t = parse_config(_with("training", {"fp8": True})).training
    assert (t.fp8_format, t.fp8_recipe) == ("e4m3", "delayed")
    t = parse_config(_with("training", {"fp8_format": "hybrid", "fp8_recipe": "mxfp8"})).training
    assert (t.fp8_format, t.fp8_recipe) == ("hybrid", "mxfp8")
    t = parse_config(_with("training", {})).training
    assert (t.fp8, t.fp8_format, t.fp8_recipe) == (False, None, None)


def test_resolved_defaults_survive_a_dump_and_reload() -> None:
    """The compiled plan carries the resolved config; reading it back validates it again."""
    flex = _with("moe", {"moe_token_dispatcher_type": "flex"})
    cfg = parse_config(merge(flex, {"training": {"fp8": True}}))
    again = parse_config(cfg.model_dump(mode="json"))
    assert again.model_dump() == cfg.model_dump()

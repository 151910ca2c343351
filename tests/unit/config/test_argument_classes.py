"""Every Megatron argument in exactly one class (modelled, plan-neutral, not modelled: error or
warning), and `check` loud about the ones it carries but does not model (rules ARG001-ARG004).

The parser is Megatron-LM dev@d48bd6be megatron/training/arguments.py add_megatron_arguments:
tests/unit/config/test_model_fields.py test_megatron_argument_list_matches_the_oracle holds
planner/config/data/megatron_arguments.txt to the oracle's parser name for name, and this test holds
the classes table to that list, so together every argument of the oracle's parser has one class.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest

from planner.config.argument_classes import (
    CLASSES_FILE,
    KINDS,
    BadClassLine,
    argument_classes,
    argument_words,
    parse_line,
)
from planner.config.entry_parsers import entry_parsers
from planner.config.loader import parse_config
from planner.config.megatron_arguments import section_model
from planner.config.megatron_names import (
    MAIN_DATA_FILE,
    main_arguments,
    megatron_arguments,
    moeplan_field,
    section_fields,
)
from planner.rules import run_rules
from planner.rules.example_base import example_config_data
from tests.support.megatron_argument_lists import parser_argument_names
from tests.support.oracle import megatron_lm_main_dir


def _lines() -> list[str]:
    return [line for line in CLASSES_FILE.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]


def test_every_parser_argument_has_exactly_one_class():
    """Dev's and main's parsers together, each argument once; the table's tags say which parser lacks
    which (megatron_arguments.txt and megatron_arguments_main.txt are the two parsers)."""
    names = [parse_line(line).name for line in _lines()]
    twice = [name for name, count in Counter(names).items() if count > 1]
    assert not twice, f"classified more than once: {twice}"
    both = megatron_arguments() | main_arguments()
    assert set(names) == both, (f"unclassified: {sorted(both - set(names))}; "
                                f"in neither parser: {sorted(set(names) - both)}")
    assert {entry.kind for entry in argument_classes().values()} == set(KINDS)
    tagged = {only: {e.name for e in argument_classes().values() if e.only == only}
              for only in ("main", "dev")}
    assert tagged["main"] == main_arguments() - megatron_arguments(), "main-only tags"
    assert tagged["dev"] == megatron_arguments() - main_arguments(), "dev-only tags"


def test_other_spellings_are_arguments_of_the_other_parser():
    """`main-only as X` names dev's spelling (an argument of dev only) and the reverse."""
    for entry in argument_classes().values():
        if entry.other_spelling:
            other = argument_classes()[entry.other_spelling]
            assert {entry.only, other.only} == {"main", "dev"}, entry
            assert other.other_spelling == entry.name, (entry, other)


def test_main_list_matches_a_main_checkout():
    """Opt-in: with MOEPLAN_MEGATRON_LM_MAIN naming a Megatron-LM main checkout, the committed list is
    its parser name for name (CI has no main checkout and reads the list)."""
    folder, why = megatron_lm_main_dir()
    if folder is None:
        pytest.skip(why)
    assert sorted(main_arguments()) == parser_argument_names(folder), MAIN_DATA_FILE


def test_modelled_arguments_name_a_field_that_exists():
    for entry in argument_classes().values():
        if entry.kind != "modelled":
            continue
        section, _, name = entry.what.partition(".")
        model = section_model(section)
        assert model is not None and name in section_fields(model), entry


def test_every_argument_with_a_field_of_its_name_is_modelled():
    """A schema field (or alias) spelt like the argument is the argument: the table may not call it
    neutral or not modelled."""
    for entry in argument_classes().values():
        field = moeplan_field(entry.name)
        assert (field is not None) == (entry.kind == "modelled"), entry


def class_counts(parser: frozenset[str]) -> Counter[str]:
    """How many of a parser's arguments fall in each class (the closing note's figures)."""
    return Counter(argument_classes()[name].kind for name in parser)


def test_class_counts_are_reported():
    for parser in (megatron_arguments(), main_arguments()):
        counts = class_counts(parser)
        assert sum(counts.values()) == len(parser)
        assert counts["error"] and counts["warning"] and counts["neutral"] and counts["modelled"]


@pytest.mark.parametrize("line", ["x | maybe | y", "x | error | memory", "x | warning | time | t | ok 1",
                                  " | neutral | data"])
def test_malformed_lines_are_refused(line: str):
    with pytest.raises(BadClassLine):
        parse_line(line)


def test_argument_words_reads_flags_and_values():
    words = ["--data-path", "/d/a", "/d/b", "--quick-geglu", "--window-size=128,0"]
    assert argument_words(words) == [(0, "data_path", ("/d/a", "/d/b")), (3, "quick_geglu", ()),
                                     (4, "window_size", ("128,0",))]


def _findings(extra: list[str]) -> list[Any]:
    data: dict[str, Any] = example_config_data("{}")
    data["launch"] = {"megatron_extra_args": copy.copy(extra)}
    return [f for f in run_rules(parse_config(data)) if f.code.startswith("ARG")]


def _codes(extra: list[str]) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in _findings(extra)]


def test_check_is_loud_about_what_it_carries():
    extra = ["--data-path", "/d/x", "--lr-decay-style", "cosine", "--quick-geglu",
             "--no-persist-layer-norm", "--softmax-type", "vanilla", "--softmax-type",
             "learnable", "--no-such-flag", "--use-legacy-models", "--moe-model-type", "deepspeed_moe",
             "--recompute-activations", "--attention-backend", "unfused"]
    assert sorted(_codes(extra)) == sorted([
        ("ARG005", "launch.megatron_extra_args[4]"),  # gpt-oss's experts: model.quick_geglu models it
        ("ARG002", "launch.megatron_extra_args[5]"),  # a kernel choice: time only
        ("ARG005", "launch.megatron_extra_args[6]"),  # model.softmax_type models attention sinks,
        ("ARG005", "launch.megatron_extra_args[8]"),  # the default vanilla as well as learnable
        ("ARG003", "launch.megatron_extra_args[10]"),  # Megatron's parser refuses it
        ("ARG004", "launch.megatron_extra_args[11]"),  # legacy models
        ("ARG004", "launch.megatron_extra_args[12]"),  # DeepSpeed-MoE
        ("ARG005", "launch.megatron_extra_args[14]"),  # overlap.recompute_granularity models it
        ("ARG005", "launch.megatron_extra_args[15]"),  # training.attention_backend models it
    ])


def test_plan_neutral_arguments_pass_silently():
    """Of dev's parser (a main-only one is ARG003, test_main_only_arguments_are_said_as_such)."""
    neutral = [entry.flag for entry in argument_classes().values()
               if entry.kind == "neutral" and entry.only != "main"]
    # (given bare, the value options among them are ARG007: a value missing, not a class)
    assert [c for c in _codes(neutral) if c[0] != "ARG007"] == []


def test_not_modelled_arguments_say_what_they_change():
    """The finding names what the argument changes, in the issue's terms."""
    terms = {"parameters", "memory", "FLOPs", "time", "bytes", "refused"}
    for entry in argument_classes().values():
        if entry.kind in ("error", "warning"):
            changes = {part.strip() for part in entry.what.split(",")}
            assert changes and changes <= terms, entry
            # a warning changes only how fast (time, and the bytes moved); never shapes or memory
            assert (entry.kind == "warning") == (changes <= {"time", "bytes"}), entry
        if entry.kind == "saving":  # lowers the memory moeplan counts: its figures an upper bound
            assert "memory" in {part.strip() for part in entry.what.split(",")}, entry


def test_arguments_megatron_refuses_together_are_refused():
    """Megatron-LM dev's validate_args asserts not (cross_entropy_loss_fusion and
    cross_entropy_fusion_impl == 'te'): the training fields that model them refuse the pair
    (ARG006), each alone passes; carried, they belong in those fields (ARG005)."""
    def codes(training: dict[str, Any]) -> list[tuple[str, str]]:
        data: dict[str, Any] = example_config_data("{}")
        data["training"] = {**data["training"], **training}
        return [(f.code, f.path) for f in run_rules(parse_config(data)) if f.code.startswith("ARG")]

    pair = {"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"}
    assert codes(pair) == [("ARG006", "training.cross_entropy_fusion_impl")]
    assert codes({"cross_entropy_fusion_impl": "te"}) == []
    assert codes({**pair, "cross_entropy_fusion_impl": "native"}) == []
    carried = ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    assert [c for c, _ in _codes(carried)] == ["ARG005", "ARG005"]


def test_main_only_arguments_are_said_as_such():
    """An argument of main@d98e8a64's parser that dev@d48bd6be's lacks: ARG003 says main accepts it
    and dev refuses it, with dev's spelling where dev has one; what it changes is still ARG001/ARG002,
    and a neutral one is ARG003 alone. A typo stays a typo."""
    extra = ["--otel-enabled", "--enable-mhc-connections", "--moe-use-grouped-tensor", "--otel-enabeld"]
    found = {(f.code, f.path): f for f in _findings(extra)}
    assert sorted(found) == [("ARG001", "launch.megatron_extra_args[1]"),
                             ("ARG002", "launch.megatron_extra_args[2]"),
                             ("ARG003", "launch.megatron_extra_args[0]"),
                             ("ARG003", "launch.megatron_extra_args[1]"),
                             ("ARG003", "launch.megatron_extra_args[2]"),
                             ("ARG003", "launch.megatron_extra_args[3]")]
    main_only = found[("ARG003", "launch.megatron_extra_args[0]")]
    assert "main-only" in main_only.message and "main@d98e8a64's accepts it" in main_only.message
    assert "ignore: [ARG003]" in main_only.fix
    renamed = found[("ARG003", "launch.megatron_extra_args[1]")]
    assert "--enable-hyper-connections" in renamed.fix and "model.enable_hyper_connections" in renamed.fix
    assert "main-only" not in found[("ARG003", "launch.megatron_extra_args[3]")].message


@pytest.mark.parametrize(("embedding", "refused"), [("rope", False), ("learned_absolute", True),
                                                     ("none", True), ("yarn", True)])
def test_no_position_embedding_follows_the_position_embedding_field(embedding: str, refused: bool):
    """Megatron-LM dev@d48bd6be megatron/training/arguments.py validate_args raises on
    `not args.add_position_embedding and args.position_embedding_type != 'rope'`: a carried
    --no-position-embedding is a no-op under model.position_embedding_type rope, refused otherwise."""
    data: dict[str, Any] = example_config_data("{}")
    data["model"]["position_embedding_type"] = embedding
    data["launch"] = {"megatron_extra_args": ["--no-position-embedding"]}
    codes = [f.code for f in run_rules(parse_config(data)) if f.code.startswith("ARG")]
    assert codes == (["ARG001"] if refused else [])


@pytest.mark.parametrize("fsdp", [False, True])
def test_megatron_fsdp_dtypes_count_only_under_megatron_fsdp(fsdp: bool):
    """Only the Megatron-FSDP wrapper reads these (Megatron-LM dev@d48bd6be megatron/core/distributed/
    fsdp/src/megatron_fsdp/mixed_precision.py; training.py get_model passes them to every DDP config),
    so an older Megatron's dump default such as fp32 is a no-op without use_megatron_fsdp."""
    data: dict[str, Any] = example_config_data("{}")
    data["training"]["use_megatron_fsdp"] = fsdp
    data["launch"] = {"megatron_extra_args": ["--megatron-fsdp-main-grads-dtype", "fp32",
                                              "--megatron-fsdp-max-pool-double-buffer"]}
    codes = [f.code for f in run_rules(parse_config(data)) if f.code.startswith("ARG")]
    assert codes == (["ARG001", "ARG001"] if fsdp else [])


# ------------------------------------------------------------------------ entry scripts' parsers


def test_entry_parser_arguments_are_no_arguments_of_megatron():
    """The entry parsers' lines classify arguments Megatron-LM's parsers lack (one Megatron defines
    belongs in the main table), each saying what it changes in the issue's terms."""
    terms = {"parameters", "memory", "FLOPs", "time", "bytes"}
    parsers = entry_parsers()
    assert {p.key for p in parsers} == {"pai", "modelopt", "mindspeed", "mindspeed_core"}
    for parser in parsers:
        for entry in parser.classes.values():
            assert entry.name not in megatron_arguments() | main_arguments(), entry
            if entry.kind in ("error", "warning"):
                assert {part.strip() for part in entry.what.split(",")} <= terms, entry


def test_check_names_the_entry_parser_and_what_it_changes():
    """ARG003 says which parser accepts an entry script's argument; one that changes the model is
    ARG001 as well (Pai's --extra-vocab-size grows the vocabulary), a neutral one ARG003 alone.
    Without the entry script the same word is not an argument of any parser moeplan knows."""
    extra = ["--extra-vocab-size", "421", "--patch-tokenizer-type", "DeepSeekV2Tokenizer"]
    data: dict[str, Any] = example_config_data("{}")
    data["launch"] = {"megatron_extra_args": extra, "megatron_entry": "pretrain_deepseek.py"}
    found = [f for f in run_rules(parse_config(data)) if f.code.startswith("ARG")]
    assert sorted((f.code, f.path) for f in found) == [("ARG001", "launch.megatron_extra_args[0]"),
                                                        ("ARG008", "launch.megatron_extra_args[0]"),
                                                        ("ARG008", "launch.megatron_extra_args[2]")]
    arg003 = [f for f in found if f.code == "ARG008"][0]  # a warning: the launch as written starts
    assert "Pai-Megatron-Patch's parser" in arg003.message and "get_patch_args" in arg003.message
    plain = [f for f in _findings(extra) if f.code == "ARG003"]
    assert len(plain) == 2 and all("not an argument of" in f.message for f in plain)


def test_import_says_main_only_and_entry_parser_arguments_apart():
    """`import megatron` keeps each in launch.megatron_extra_args with the parser that has it."""
    from planner.config.importers.megatron_args import import_arguments

    words = "pretrain_deepseek.py --num-layers 2 --otel-enabled --train-mode pretrain --no-such-flag"
    why = {u.argument: u.why for u in import_arguments(words).unmapped}
    assert why["--otel-enabled"].startswith("main-only: Megatron-LM main's parser accepts it")
    assert why["--train-mode"].startswith("an argument of Pai-Megatron-Patch's parser")
    assert "not an argument of Megatron-LM dev's parser" in why["--no-such-flag"]
    assert import_arguments(words).data["launch"]["megatron_entry"] == "pretrain_deepseek.py"

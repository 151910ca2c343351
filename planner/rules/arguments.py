"""ARG: the Megatron arguments carried verbatim in `launch.megatron_extra_args`.

A carried argument reaches Megatron untouched, so one that changes the model moeplan counted
would make `check` call a different model valid. Each argument's class is one line of
planner/config/data/megatron_argument_classes.txt (planner/config/argument_classes.py): a
plan-neutral one passes silently, one that changes the shapes or the memory verdict is an error
(ARG001), one that changes only the step time a warning (ARG002); a word Megatron-LM dev's parser
does not define is refused there, so it is refused here (ARG003: one of main@d98e8a64's parser
said as main-only), legacy (non-core) models with
their own code (ARG004), a modelled argument belongs in its field (ARG005), and carried arguments
Megatron's validate_args refuses together are refused here too (ARG006).
"""

from __future__ import annotations

from collections.abc import Iterator

from planner.config.argument_classes import (
    ArgumentClass,
    argument_arities,
    argument_class,
    argument_words,
    is_legacy_model,
)
from planner.config.entry_parsers import entry_argument
from planner.config.schema import field_choices
from planner.rules.base import Violation, rule
from planner.rules.facts import Facts

PARSER = "Megatron-LM dev@d48bd6be megatron/training/arguments.py add_megatron_arguments"
MAIN_PARSER = "Megatron-LM main@d98e8a64 megatron/training/arguments.py add_megatron_arguments"
TABLE = "planner/config/argument_classes.py argument_classes"
ENTRY_TABLE = "planner/config/entry_parsers.py entry_parsers"


def _carried(f: Facts) -> Iterator[tuple[str, str, tuple[str, ...], ArgumentClass | None]]:
    """Each carried argument with its class: Megatron's table, else the class the entry script's
    own parser gives it (launch.megatron_entry; planner/config/entry_parsers.py)."""
    words = f.cfg.launch.megatron_extra_args
    for index, name, values in argument_words(words):
        entry = argument_class(name)
        if entry is None and (added := entry_argument(f.cfg.launch.megatron_entry, name)) is not None:
            entry = added[1]
        yield f"launch.megatron_extra_args[{index}]", name, values, entry


def _shown(name: str, values: tuple[str, ...]) -> str:
    flag = "--" + name.replace("_", "-")
    return " ".join((flag, *values))


# Carried arguments that are no-ops for the value a modelled field holds, read from the field rather
# than from the launch words: (argument, section.field, value). Megatron-LM dev@d48bd6be
# megatron/training/arguments.py validate_args refuses --no-position-embedding unless
# position_embedding_type is rope, where GPTModel.__init__ builds no table either way. The
# Megatron-FSDP dtypes and buffer pool reach DistributedDataParallelConfig always (training.py
# get_model), but only the Megatron-FSDP wrapper reads them (megatron/core/distributed/fsdp/):
# without use_megatron_fsdp they change nothing, and older Megatrons print other defaults for them
# in their argument dumps.
INERT_WHEN = (("no_position_embedding", "model.position_embedding_type", "rope"),
              *((name, "training.use_megatron_fsdp", False)
                for name in ("megatron_fsdp_main_params_dtype", "megatron_fsdp_main_grads_dtype",
                             "megatron_fsdp_grad_comm_dtype", "megatron_fsdp_max_pool_double_buffer")))


def _inert(f: Facts, name: str) -> bool:
    def holds(path: str) -> object:
        section, field = path.split(".")
        return getattr(getattr(f.cfg, section), field)

    return any(name == argument and holds(path) == value for argument, path, value in INERT_WHEN)


def _not_modelled(f: Facts, kinds: tuple[str, ...]) -> Iterator[Violation]:
    for path, name, values, entry in _carried(f):
        if entry is None or entry.kind not in kinds or not entry.changes_plan(values) or _inert(f, name):
            continue
        neutral = (f"; as {' or '.join(entry.neutral_values)} it would not"
                   if entry.neutral_values else "")
        if entry.kind == "saving":
            yield Violation(path, f"{_shown(name, values)} lowers the memory ({entry.how}) below what "
                            f"moeplan counts{neutral}",
                            "moeplan's memory figures are an upper bound for this job and the step-time "
                            "estimate leaves it out: ignore ARG002 to accept that")
            continue
        kind = entry.kind
        fix = ("drop it from launch.megatron_extra_args to train the model moeplan counts, or ignore "
               "ARG001 to accept figures without it" if kind == "error" else
               "the step-time estimate leaves it out: ignore ARG002 to accept that, or drop it")
        yield Violation(path, f"{_shown(name, values)} changes {entry.what} ({entry.how}), which "
                        f"moeplan does not model{neutral}", fix)


@rule(
    "ARG001", "error", "carried Megatron arguments leave the counted model as it is",
    source=f"{PARSER}; {TABLE}",
    why="""`launch.megatron_extra_args` reaches Megatron verbatim. An argument there that changes
    the model's shapes, parameters, FLOPs or memory (FP16 logits, a Megatron-FSDP buffer, first and
    last layers kept in BF16) would train a different model than the one whose parameters and memory
    moeplan reports, and `check` would call it valid. Each argument's class is one line of the
    classes table; modelled ones go in their field instead.""",
    bad="launch: {megatron_extra_args: [--fp16-lm-cross-entropy]}",
    good="launch: {megatron_extra_args: [--lr-decay-style, cosine]}",
)
def carried_changes_model(f: Facts) -> Iterator[Violation]:
    yield from _not_modelled(f, ("error",))


@rule(
    "ARG002", "warning", "carried Megatron arguments leave the step time as estimated",
    source=f"{PARSER}; {TABLE}",
    why="""A fusion, a CUDA graph, a kernel or communication choice carried verbatim changes only how
    fast the same model trains: the parameters and the memory verdict still hold, the step-time
    estimate does not account for it. One that only lowers the memory (optimizer states offloaded in
    chunks, the routed experts' paged stash) leaves moeplan's memory figures an upper bound.""",
    bad="launch: {megatron_extra_args: [--attention-softmax-in-fp32]}",
    good="launch: {megatron_extra_args: [--log-interval, '10']}",
)
def carried_changes_time(f: Facts) -> Iterator[Violation]:
    yield from _not_modelled(f, ("warning", "saving"))


@rule(
    "ARG003", "error", "carried words are arguments of Megatron-LM dev's parser",
    source=f"{PARSER}; {MAIN_PARSER}; {ENTRY_TABLE}",
    why="""Megatron's parser stops at an argument it does not define ("unrecognized arguments"), so a
    job carrying one does not start. The list is the parser Megatron-LM dev builds
    (planner/config/data/megatron_arguments.txt), the one `emit` writes for. An argument only
    main@d98e8a64's parser defines (megatron_arguments_main.txt; `main-only` in the classes table) is
    an error too, said as such: the job runs on main as written, the emitted launch does not start on
    dev. A user on main ignores ARG003 for it (`ignore: [ARG003]`); what the argument changes is still
    ARG001/ARG002 and the finding names dev's spelling where dev has one. An argument the entry
    script's own parser adds (`launch.megatron_entry`: Pai-Megatron-Patch's get_patch_args,
    MindSpeed-LLM's, ModelOpt's add_modelopt_args; planner/config/data/entry_parser_arguments.txt) is
    no typo and the launch as written starts: ARG008 names it, a warning.""",
    bad="launch: {megatron_extra_args: [--no-such-megatron-flag]}",
    good="launch: {megatron_extra_args: [--log-interval, '10']}",
)
def carried_unknown(f: Facts) -> Iterator[Violation]:
    script = f.cfg.launch.megatron_entry
    for path, name, values, entry in _carried(f):
        if entry is not None and entry.only == "main":
            yield _main_only(path, name, values, entry)
        elif entry is None and entry_argument(script, name) is None and not is_legacy_model(name, values):
            yield Violation(path, f"{_shown(name, values)} is not an argument of Megatron-LM "
                            "dev@d48bd6be's parser, which refuses it",
                            "drop it, or spell the argument as megatron/training/arguments.py does")


@rule(
    "ARG008", "warning", "carried arguments of the entry script's own parser",
    source=f"{PARSER}; {ENTRY_TABLE}",
    why="""An entry script with a parser of its own (launch.megatron_entry: Pai-Megatron-Patch's
    get_patch_args, MindSpeed-LLM's features, ModelOpt's add_modelopt_args) accepts its arguments, so
    the launch as written starts. Megatron-LM's own entry script, the one `emit megatron` writes,
    refuses them: emit leaves each out with a note. What such an argument changes is still ARG001 /
    ARG002 by its class.""",
    bad="launch: {megatron_entry: pretrain_deepseek.py, megatron_extra_args: [--train-mode, pretrain]}",
    good="launch: {megatron_extra_args: [--log-interval, '10']}",
)
def carried_entry_arguments(f: Facts) -> Iterator[Violation]:
    script = f.cfg.launch.megatron_entry
    for path, name, values, _ in _carried(f):
        if argument_class(name) is None and (added := entry_argument(script, name)) is not None:
            parser = added[0]
            yield Violation(path, f"{_shown(name, values)} is an argument of {parser.who}'s parser "
                            f"({parser.source}), which {script} adds: the launch as written starts; "
                            "Megatron-LM dev@d48bd6be's own parser refuses it",
                            "emit megatron leaves it out; keep it for the launch of "
                            f"{script}, or ignore ARG008")


def _main_only(path: str, name: str, values: tuple[str, ...], entry: ArgumentClass) -> Violation:
    """ARG003 for an argument of main's parser that dev's lacks: where the job runs as written and
    what to write for dev."""
    spelled = ""
    if entry.other_spelling:
        dev = argument_class(entry.other_spelling)
        field = f" (moeplan models it as {dev.what})" if dev is not None and dev.kind == "modelled" else ""
        spelled = f"dev spells it {_shown(entry.other_spelling, ())}{field}; "
    return Violation(path, f"{_shown(name, values)} is main-only: Megatron-LM dev@d48bd6be's parser "
                     "refuses it, main@d98e8a64's accepts it, and moeplan emits and checks for dev",
                     f"{spelled or 'drop it for dev; '}on main, where the job runs as written, ignore "
                     "ARG003 (ignore: [ARG003])")


@rule(
    "ARG004", "error", "the model is a Megatron-Core model",
    source=PARSER,
    why="""moeplan counts and lays out Megatron-Core MoE models. A legacy (non-core) model
    (`--use-legacy-models`) or a DeepSpeed-MoE layer (`--moe-model-type deepspeed_moe`) has other
    modules, other expert groups and capacity-bound gating: its parameters, memory and
    communication are not the ones moeplan would report, and Megatron-LM dev no longer builds it.""",
    bad="launch: {megatron_extra_args: [--use-legacy-models]}",
    good="launch: {megatron_extra_args: []}",
)
def legacy_model(f: Facts) -> Iterator[Violation]:
    for path, name, values, _ in _carried(f):
        if is_legacy_model(name, values):
            yield Violation(path, f"{_shown(name, values)} asks for a legacy (non-core) model; moeplan "
                            "plans Megatron-Core MoE models only and Megatron-LM dev@d48bd6be no longer "
                            "builds legacy ones",
                            "port the job to Megatron-Core (drop the flag; MoE through --num-experts "
                            "and the --moe-* arguments)")


@rule(
    "ARG005", "error", "modelled arguments are set by their field, not carried",
    source=f"{PARSER}; {TABLE}",
    why="""An argument moeplan models is written by `emit megatron` from its field; carried as well,
    it would set the model behind the plan's back (Megatron's parser keeps the last value), and
    `emit` refuses it. The finding names the field to set instead.""",
    bad="launch: {megatron_extra_args: [--qk-layernorm]}",
    good="model: {qk_layernorm: true}",
)
def carried_modelled(f: Facts) -> Iterator[Violation]:
    for path, name, values, entry in _carried(f):
        if entry is None or entry.kind != "modelled":
            continue
        choices = field_choices(entry.what)
        if values and choices and values[0] not in choices:  # a value moeplan has no model of
            yield Violation(path, f"{_shown(name, values)}: moeplan models {entry.what} as "
                            f"{', '.join(choices)} only, so the figures leave {values[0]!r} out",
                            f"set {entry.what} to a modelled value, or ignore ARG005 to accept "
                            "figures without it")
            continue
        yield Violation(path, f"{_shown(name, values)} is modelled by moeplan as {entry.what}",
                        f"set {entry.what} and drop it from launch.megatron_extra_args")


# Argument values Megatron's validate_args refuses together: (field, value), (field, value), Megatron's
# reason and its way out (Megatron-LM dev@d48bd6be megatron/training/arguments.py validate_args;
# megatron/core/model_parallel_config.py
# ModelParallelConfig.__post_init__ asserts the same).
# The last item is the first Megatron-LM release that refuses the pair (planner/config/
# megatron_releases.py; before it the pair runs, and rule VER002 names what it costs there).
REFUSED_TOGETHER = (
    (("training.cross_entropy_fusion_impl", "te"), ("training.cross_entropy_loss_fusion", True),
     "Transformer Engine's fused cross entropy is disabled for its stability issues",
     "set training.cross_entropy_fusion_impl: native, or training.cross_entropy_loss_fusion: false",
     "core_v0.18.2"),
)


def _field(f: Facts, path: str) -> object:
    section, name = path.split(".")
    return getattr(getattr(f.cfg, section), name)


@rule(
    "ARG006", "error", "arguments are ones Megatron accepts together",
    source="Megatron-LM dev@d48bd6be megatron/training/arguments.py validate_args",
    why="""Each argument may be fine alone while Megatron refuses the pair at start-up: dev refuses
    `--cross-entropy-fusion-impl te` with `--cross-entropy-loss-fusion` (Transformer Engine's fused
    cross entropy is disabled). A job with both does not start, so `check` does not call it valid.""",
    bad="training: {cross_entropy_loss_fusion: true, cross_entropy_fusion_impl: te}",
    good="training: {cross_entropy_loss_fusion: true, cross_entropy_fusion_impl: native}",
)
def carried_refused_together(f: Facts) -> Iterator[Violation]:
    at = f.judged_release
    for (name, value), (other, other_value), why, fix, since in REFUSED_TOGETHER:
        if _field(f, name) == value and _field(f, other) == other_value and not at.before(since):
            yield Violation(name, f"{name} {value} with {other} {other_value} is refused by "
                            f"Megatron-LM {at.label}'s validate_args ({why})", fix)


@rule(
    "ARG007", "error", "carried arguments have as many values as Megatron's parser takes",
    source=PARSER,
    why="""argparse gives a switch no value and a plain option exactly one: any other word after it
    is left over, and Megatron stops with "unrecognized arguments". A launch script's unquoted
    placeholder path (`--save $CKPT_SAVE_DIR` with "your model save ckpt path") splits into words
    so, and the job does not start.""",
    bad="launch: {megatron_extra_args: [--save, your, ckpt, path]}",
    good="launch: {megatron_extra_args: [--save, /ckpt]}",
)
def carried_arity(f: Facts) -> Iterator[Violation]:
    arities = argument_arities()
    for path, name, values, _ in _carried(f):
        kind, nargs = arities.get("--" + name.replace("_", "-"), ("", "?"))
        takes = 0 if kind in ("true", "false") else 1 if kind == "value" and nargs == "" else None
        if takes is not None and len(values) != takes:
            said = "no value" if takes == 0 else "one value"
            yield Violation(path, f"{_shown(name, values)}: Megatron's parser takes {said} for it, so "
                            f"{' '.join(values[takes:])!r} is left over and refused as unrecognized",
                            "quote the value (an unquoted variable holding spaces splits into words) or "
                            "give the value the script leaves as a placeholder")


RULES = (carried_changes_model, carried_changes_time, carried_unknown, legacy_model, carried_modelled,
         carried_refused_together, carried_arity, carried_entry_arguments)

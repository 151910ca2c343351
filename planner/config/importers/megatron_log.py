"""A Megatron training log back into the launch it ran: the argument dump Megatron prints between
`---- arguments ----` and `---- end of arguments ----` (Megatron-LM dev@d48bd6be
megatron/training/arguments.py _print_args, called at the end of validate_args) holds every
argument after validation, plus the world size; the tokenizer's `padded vocab (size: N) with M
dummy tokens (new size: P)` line (megatron/training/vocab_utils.py calculate_padded_vocab_size)
and `setting number of microbatches to constant K` (megatron/core/num_microbatches_calculator.py)
follow it.

The dump prints destinations, not flags, and every value, defaults included. The parser's table
(planner/config/data/megatron_dests.tsv: dest, flag, kind, nargs, default) turns each value that
differs from Megatron's default back into the flag that sets it, so the argument list is what the
user could have typed; values validate_args derives from others (the sequence length copied into
encoder_seq_length, iteration counts of a sample-based run) are left out, since Megatron refuses
them given twice.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from planner.config.gpus import card_named
from planner.config.importers.assemble import FrontEnd, assemble
from planner.config.importers.launch_facts import DUMP_LAUNCHER, LaunchFacts
from planner.config.importers.log_lines import clean_line, clean_lines
from planner.config.importers.megatron_args import Unmapped

DESTS_FILE = Path(__file__).resolve().parents[1] / "data" / "megatron_dests.tsv"
_START = re.compile(r"^-+ arguments -+$")
_END = re.compile(r"^-+ end of arguments -+$")
_ENTRY = re.compile(r"^\s*(?P<name>[A-Za-z_]\w*) \.*(?: (?P<value>.*))?$")
# Counts of at most 18 digits: a longer one is not a count, and int() of thousands of digits is
# slow (and refused past 4,300).
_PADDED = re.compile(r"padded vocab \(size: (?P<size>\d{1,18})\) with (?P<dummy>\d{1,18}) dummy "
                     r"tokens \(new size: (?P<padded>\d{1,18})\)")
_MICROBATCHES = re.compile(r"setting number of micro-?batches to constant (?P<count>\d{1,18})\b")
# validate_args' own line before the dump (Megatron-LM dev@d48bd6be megatron/training/arguments.py
# validate_args: 'using world size: W, data-parallel size: ...', the same words since 2023): the world
# size of a log whose dump is cut short, as dumps pasted into issues often are.
_WORLD_LINE = re.compile(r"using world size: (?P<world>\d{1,18}),")
# Dump entries that are facts of the run, not arguments (set by parse_args / validate_args).
_FACTS = {"world_size", "rank", "local_rank", "data_parallel_size", "params_dtype",
          "virtual_pipeline_model_parallel_size", "transformer_pipeline_model_parallel_size",
          "consumed_train_samples", "consumed_valid_samples", "padded_vocab_size", "iteration",
          "curr_iteration", "variable_seq_lengths", "num_floating_point_operations_so_far"}
_ENUM = re.compile(r"^[A-Z]\w*\.(?P<member>\w+)$")
# Printed values that leave an unknown dump entry unset (the run did not ask for anything).
_UNSET = {"None", "False", "0", "0.0", "", "[]", "{}"}
# validate_args turns the dtype arguments' spellings into torch dtypes before the dump is printed
# (megatron/training/arguments.py validate_args, its dtype_map); the flag takes the spelling.
_DTYPE_SPELLINGS = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16",
                    "torch.uint8": "fp8"}

# dest → the dests whose value (other than their default) makes validate_args derive it: given
# both, Megatron refuses the pair (validate_args: "expected sample-based training", the
# encoder_seq_length assertion, the one-of-three VPP assertion, 'cannot have both num-layers and
# encoder-num-layers').
_DERIVED_FROM: dict[str, tuple[str, ...]] = {
    "encoder_seq_length": ("seq_length",),
    "train_iters": ("train_samples",),
    "lr_decay_iters": ("lr_decay_samples",),
    "lr_warmup_iters": ("lr_warmup_samples", "lr_warmup_fraction"),
    "num_virtual_stages_per_pipeline_rank": ("num_layers_per_virtual_pipeline_stage",
                                             "pipeline_model_parallel_layout", "hybrid_layer_pattern"),
    "num_layers": ("hybrid_layer_pattern",),
    "encoder_num_layers": ("num_layers",),  # validate_args copies num_layers into it
}
# dest → (dest, printed value) under which validate_args derives it and refuses it given: with
# --weight-decay-incr-style constant it asserts the start and end decays unset, then copies
# --weight-decay into both (megatron/training/arguments.py validate_args).
_DERIVED_WHEN: dict[str, tuple[str, str]] = {
    "start_weight_decay": ("weight_decay_incr_style", "constant"),
    "end_weight_decay": ("weight_decay_incr_style", "constant"),
}


@dataclass(frozen=True)
class Destination:
    dest: str
    flag: str
    kind: str  # true, false, optional, value
    nargs: str
    default: str


@cache
def destinations() -> dict[str, tuple[Destination, ...]]:
    table: dict[str, list[Destination]] = {}
    for line in DESTS_FILE.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            dest, flag, kind, nargs, default = line.split("\t")
            table.setdefault(dest, []).append(Destination(dest, flag, kind, nargs, default))
    return {dest: tuple(rows) for dest, rows in table.items()}


@cache
def _by_flag() -> dict[str, Destination]:
    return {row.flag: row for rows in destinations().values() for row in rows}


def flag_destination(flag: str) -> Destination | None:
    """The parser action of one option string (`--disable-bias-linear`: dest add_bias_linear,
    store_false); None for an option dev's parser does not define."""
    return _by_flag().get(flag)


def argument_destination(name: str) -> Destination | None:
    """The parser action a config key names, by its dest (`apply_rope_fusion`, set by
    --no-rope-fusion) or by its flag's spelling (`norm_epsilon`: --norm-epsilon, dest
    layernorm_epsilon), as launchers that pass Megatron's settings by name write them."""
    rows = destinations().get(name)
    return rows[0] if rows else flag_destination("--" + name.replace("_", "-"))


@dataclass
class LogRead:
    """What one log says: the (last) argument dump and the derived values printed after it."""

    dump: dict[str, str]
    dumps: int  # how many dumps the log holds (a resumed job prints one per start)
    padded_vocab_size: int | None = None
    vocab_size: int | None = None  # the tokenizer's own size, before padding
    num_microbatches: int | None = None
    argv: list[str] = field(default_factory=list)
    every_dump: list[dict[str, str]] = field(default_factory=list)  # all of them, in log order
    gpu: str | None = None  # the catalog card the log first names ("NVIDIA H20"), if any
    world_line: int | None = None  # the world size validate_args printed before the dump

    def printed_int(self, name: str) -> int | None:
        value = self.dump.get(name, "None")
        digits = value.lstrip("-")
        return int(value) if digits.isdigit() and len(digits) <= 18 else None


def has_dump(lines: list[str]) -> bool:
    return any(_START.match(line.strip()) for line in lines)


def dump_start(stripped: str) -> bool:
    """Whether a cleaned, stripped line opens an argument dump."""
    return _START.match(stripped) is not None


def dump_end(stripped: str) -> bool:
    return _END.match(stripped) is not None


def dump_entry(line: str) -> tuple[str, str] | None:
    """One dump line as (dest, printed value), or None."""
    match = _ENTRY.match(line)
    return (match["name"], (match["value"] or "").strip()) if match else None


def argument_dumps(lines: list[str]) -> list[dict[str, str]]:
    """Every complete dump in the log, each as dest → printed value."""
    dumps: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in lines:
        stripped = line.strip()
        if _START.match(stripped):
            current = {}
        elif _END.match(stripped) and current is not None:
            dumps.append(current)
            current = None
        elif current is not None and (match := _ENTRY.match(line)):
            current[match["name"]] = (match["value"] or "").strip()
    return dumps


# A dump is one line per argument (~880 in dev); one running far longer never ends (a log cut off
# inside it), and argument_dumps drops an unterminated dump anyway.
MAX_DUMP_LINES = 20_000


def log_essentials(raw_lines: Iterable[str]) -> list[str] | None:
    """From a log streamed line by line, the raw lines read_log reads (every argument dump with its
    markers, the padded-vocabulary and microbatch lines, the first line outside a dump naming a
    catalog GPU), so a log of any length is imported in the memory of its dump; None when the
    stream holds no dump (it is not a Megatron log)."""
    kept: list[str] = []
    current: list[str] | None = None
    seen = card = False
    for raw in raw_lines:
        line = clean_line(raw)
        stripped = line.strip()
        if _START.match(stripped):
            current, seen = [raw], True
        elif current is not None:
            current.append(raw)
            if _END.match(stripped):
                kept += current
                current = None
            elif len(current) > MAX_DUMP_LINES:
                current = None
        elif _PADDED.search(line) or _MICROBATCHES.search(line) or _WORLD_LINE.search(line):
            kept.append(raw)
        elif not card and card_named(line):  # the card the run reports (planner/config/gpus.py)
            kept.append(raw)
            card = True
    return kept if seen else None


def read_log(text: str) -> LogRead:
    """The log's last argument dump and the tokenizer and microbatch lines that follow it."""
    return read_lines(clean_lines(text))


def read_lines(lines: list[str]) -> LogRead:
    """`read_log` of lines already cleaned (log_lines.clean_lines): a reader that also wants the
    log's other lines, such as calibrate's timing reader, cleans the log once and shares them."""
    dumps = argument_dumps(lines)
    read = LogRead(dumps[-1] if dumps else {}, len(dumps), every_dump=dumps)
    for line in lines:
        if read.gpu is None and dump_entry(line) is None:  # a dump's paths name no card
            read.gpu = card_named(line)
        if match := _PADDED.search(line):
            read.vocab_size, read.padded_vocab_size = int(match["size"]), int(match["padded"])
        elif match := _MICROBATCHES.search(line):
            read.num_microbatches = int(match["count"])
        elif match := _WORLD_LINE.search(line):
            read.world_line = int(match["world"])
    if read.padded_vocab_size is None:
        read.padded_vocab_size = read.printed_int("padded_vocab_size")
    read.argv = dump_arguments(read.dump, read.vocab_size or read.padded_vocab_size,
                               tokenizer_size=read.vocab_size)
    return read


def _words(row: Destination, printed: str) -> list[str] | None:
    """The flag's words for a printed value, or None when it is Megatron's default."""
    if row.kind in ("true", "false", "optional"):
        if printed not in ("True", "False") or printed == row.default:
            return None
        if row.kind == "true":
            return [row.flag] if printed == "True" else None
        if row.kind == "false":
            return [row.flag] if printed == "False" else None
        return [row.flag if printed == "True" else "--no-" + row.flag.removeprefix("--")]
    printed = _DTYPE_SPELLINGS.get(printed, printed)
    if printed == row.default or printed == "None":
        return None
    if (enum := _ENUM.match(printed)) and _ENUM.match(row.default):
        printed = enum["member"]
    if row.nargs in ("+", "*") or row.nargs.isdigit():
        try:
            values = ast.literal_eval(printed)
        except (ValueError, SyntaxError):
            values = printed
        items = values if isinstance(values, list | tuple) else [values]
        return [row.flag, *(str(v) for v in items)] if items else None
    return [row.flag, printed]


def dump_arguments(dump: dict[str, str], vocab_size: int | None = None, *,
                   tokenizer_size: int | None = None) -> list[str]:
    """The argument list that makes Megatron print this dump: every value that differs from the
    parser's default, under the flag that sets it (entries the parser has no flag for — world size,
    ranks, dtypes validate_args computes — are facts, not arguments). `tokenizer_size`, the size
    the padded-vocabulary line printed, wins over a different `vocab_size` in the dump (see
    `_tokenizer_resized`)."""
    table = destinations()
    argv: list[str] = []
    resized = _tokenizer_resized(dump, tokenizer_size)
    for dest, printed in dump.items():
        if dest == "vocab_size" and resized:
            continue
        given = (other for other in _DERIVED_FROM.get(dest, ()))
        if any(dump.get(other, "None") not in ("None", "0", "False", "") for other in given):
            continue
        if (when := _DERIVED_WHEN.get(dest)) and dump.get(when[0]) == when[1]:
            continue
        for row in table.get(dest, ()):
            words = _words(row, printed)
            if words:
                argv += words
                break
    if vocab_size is not None and (dump.get("vocab_size", "None") == "None" or resized):
        argv += ["--vocab-size", str(vocab_size)]  # the tokenizer's size, which Megatron pads again
    return argv


def _tokenizer_resized(dump: dict[str, str], tokenizer_size: int | None) -> bool:
    """Whether the run's tokenizer reported a size other than the dump's --vocab-size: Megatron pads
    the tokenizer's size, not the argument (megatron/core/tokenizers/utils/build_tokenizer.py
    build_tokenizer → vocab_size_with_padding), and tokenizers differ between versions in what
    they add to it (an older NullTokenizer appended its end-of-document id: 131072 → 131073 →
    131200 padded). The
    size the log printed is the embedding the run built, so it is the one carried over."""
    given = dump.get("vocab_size", "None")
    return tokenizer_size is not None and given.isdigit() and int(given) != tokenizer_size


def log_front_end(text: str, source: str = "log") -> tuple[FrontEnd, LogRead]:
    """The log as an import front end: the dump's arguments, its world size as the launch."""
    read = read_log(text)
    return front_end_of(read, source), read


def front_end_of(read: LogRead, source: str = "log") -> FrontEnd:
    """The import front end of a log already read."""
    world = read.printed_int("world_size")
    where = f"world_size {world} in the argument dump of {source}"
    if world is None and read.world_line is not None:  # a dump cut short: validate_args' line
        world, where = read.world_line, f"'using world size: {read.world_line}' in {source}"
    facts = LaunchFacts(launcher=DUMP_LAUNCHER, world_size=world, sources=[where] if world else [])
    front = FrontEnd("Megatron training log, argument dump", read.argv, facts=facts)
    if read.gpu is not None:  # the card the run's log names: its memory and peaks judge the plan
        front.fields["cluster.gpu"] = read.gpu
        front.notes.append(Unmapped("GPU", read.gpu, f"the log names the card: cluster.gpu {read.gpu}"))
    if read.dumps > 1:
        front.notes.append(Unmapped("---- arguments ----", str(read.dumps), "the log holds several argument "
                                    "dumps (one per start of the job); the last one is read"))
    if _tokenizer_resized(read.dump, read.vocab_size):
        front.notes.append(Unmapped("--vocab-size", read.dump["vocab_size"], f"the run's tokenizer reported "
                                    f"{read.vocab_size} tokens (the padded-vocabulary line), which Megatron "
                                    f"padded to {read.padded_vocab_size}: --vocab-size {read.vocab_size} is "
                                    "taken, so the model has the embedding the run built"))
    unknown = sorted(d for d in read.dump if d not in destinations() and d not in _FACTS)
    if unknown:
        # Entries the run set come first, with their values: one of another Megatron (or a fork such
        # as Primus) may change the model, and the user is the one who can tell.
        set_ = [d for d in unknown if read.dump[d] not in _UNSET]
        shown = [f"{d}={read.dump[d]}" for d in set_] + [d for d in unknown if d not in set_]
        front.notes.append(Unmapped(" ".join(shown[:8]) + (" …" if len(shown) > 8 else ""), "",
                                    f"{len(unknown)} dump entries ({len(set_)} of them set) have no flag "
                                    "in the parser of the Megatron-LM moeplan follows (values validate_args "
                                    "sets, or arguments of another Megatron version or a fork); left out: "
                                    "check the set ones change nothing the plan counts"))
    return front


def config_from_log(text: str, source: str = "log") -> tuple[dict[str, dict[str, Any]], list[Unmapped]]:
    """The config a Megatron training log ran, from its argument dump alone: the raw config
    sections (as `moeplan import megatron` writes them) and what could not be taken over, each row
    naming the argument and why (`error` rows make the config not what the log ran)."""
    return config_from_read(read_log(text), source)


def config_from_read(read: LogRead, source: str = "log") -> tuple[dict[str, dict[str, Any]], list[Unmapped]]:
    """`config_from_log` of a log already read (`read_lines`)."""
    result = assemble(front_end_of(read, source))
    return result.data, result.unmapped

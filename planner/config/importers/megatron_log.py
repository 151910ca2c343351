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

from planner.config.importers.assemble import FrontEnd, assemble
from planner.config.importers.launch_facts import DUMP_LAUNCHER, LaunchFacts
from planner.config.importers.log_lines import clean_line, clean_lines
from planner.config.importers.megatron_args import Unmapped

DESTS_FILE = Path(__file__).resolve().parents[1] / "data" / "megatron_dests.tsv"
_START = re.compile(r"^-+ arguments -+$")
_END = re.compile(r"^-+ end of arguments -+$")
_ENTRY = re.compile(r"^\s*(?P<name>[A-Za-z_]\w*) \.*(?: (?P<value>.*))?$")
_PADDED = re.compile(r"padded vocab \(size: (?P<size>\d+)\) with (?P<dummy>\d+) dummy tokens "
                     r"\(new size: (?P<padded>\d+)\)")
_MICROBATCHES = re.compile(r"setting number of micro-?batches to constant (?P<count>\d+)")
# Dump entries that are facts of the run, not arguments (set by parse_args / validate_args).
_FACTS = {"world_size", "rank", "local_rank", "data_parallel_size", "params_dtype",
          "virtual_pipeline_model_parallel_size", "transformer_pipeline_model_parallel_size",
          "consumed_train_samples", "consumed_valid_samples", "padded_vocab_size", "iteration",
          "curr_iteration", "variable_seq_lengths", "num_floating_point_operations_so_far"}
_ENUM = re.compile(r"^[A-Z]\w*\.(?P<member>\w+)$")
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


@dataclass
class LogRead:
    """What one log says: the (last) argument dump and the derived values printed after it."""

    dump: dict[str, str]
    dumps: int  # how many dumps the log holds (a resumed job prints one per start)
    padded_vocab_size: int | None = None
    vocab_size: int | None = None  # the tokenizer's own size, before padding
    num_microbatches: int | None = None
    argv: list[str] = field(default_factory=list)

    def printed_int(self, name: str) -> int | None:
        value = self.dump.get(name, "None")
        return int(value) if value.lstrip("-").isdigit() else None


def has_dump(lines: list[str]) -> bool:
    return any(_START.match(line.strip()) for line in lines)


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
    markers, the padded-vocabulary and microbatch lines), so a log of any length is imported in the
    memory of its dump; None when the stream holds no dump (it is not a Megatron log)."""
    kept: list[str] = []
    current: list[str] | None = None
    seen = False
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
        elif _PADDED.search(line) or _MICROBATCHES.search(line):
            kept.append(raw)
    return kept if seen else None


def read_log(text: str) -> LogRead:
    """The log's last argument dump and the tokenizer and microbatch lines that follow it."""
    lines = clean_lines(text)
    dumps = argument_dumps(lines)
    read = LogRead(dumps[-1] if dumps else {}, len(dumps))
    for line in lines:
        if match := _PADDED.search(line):
            read.vocab_size, read.padded_vocab_size = int(match["size"]), int(match["padded"])
        elif match := _MICROBATCHES.search(line):
            read.num_microbatches = int(match["count"])
    if read.padded_vocab_size is None:
        read.padded_vocab_size = read.printed_int("padded_vocab_size")
    read.argv = dump_arguments(read.dump, read.vocab_size or read.padded_vocab_size)
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


def dump_arguments(dump: dict[str, str], vocab_size: int | None = None) -> list[str]:
    """The argument list that makes Megatron print this dump: every value that differs from the
    parser's default, under the flag that sets it (entries the parser has no flag for — world size,
    ranks, dtypes validate_args computes — are facts, not arguments)."""
    table = destinations()
    argv: list[str] = []
    for dest, printed in dump.items():
        given = (other for other in _DERIVED_FROM.get(dest, ()))
        if any(dump.get(other, "None") not in ("None", "0", "False", "") for other in given):
            continue
        for row in table.get(dest, ()):
            words = _words(row, printed)
            if words:
                argv += words
                break
    if vocab_size is not None and dump.get("vocab_size", "None") == "None":
        argv += ["--vocab-size", str(vocab_size)]  # the tokenizer's size, which Megatron pads again
    return argv


def log_front_end(text: str, source: str = "log") -> tuple[FrontEnd, LogRead]:
    """The log as an import front end: the dump's arguments, its world size as the launch."""
    read = read_log(text)
    world = read.printed_int("world_size")
    facts = LaunchFacts(launcher=DUMP_LAUNCHER, world_size=world,
                        sources=[f"world_size {world} in the argument dump of {source}"] if world else [])
    front = FrontEnd("Megatron training log, argument dump", read.argv, facts=facts)
    if read.dumps > 1:
        front.notes.append(Unmapped("---- arguments ----", str(read.dumps), "the log holds several argument "
                                    "dumps (one per start of the job); the last one is read"))
    unknown = sorted(d for d in read.dump if d not in destinations() and d not in _FACTS)
    if unknown:
        front.notes.append(Unmapped(" ".join(unknown[:6]) + (" …" if len(unknown) > 6 else ""), "",
                                    f"{len(unknown)} dump entries have no flag in the parser of the "
                                    "Megatron-LM moeplan follows (values validate_args sets, or arguments "
                                    "of another Megatron version); left out"))
    return front, read


def config_from_log(text: str, source: str = "log") -> tuple[dict[str, dict[str, Any]], list[Unmapped]]:
    """The config a Megatron training log ran, from its argument dump alone: the raw config
    sections (as `moeplan import megatron` writes them) and what could not be taken over, each row
    naming the argument and why (`error` rows make the config not what the log ran)."""
    front, _ = log_front_end(text, source)
    result = assemble(front)
    return result.data, result.unmapped

"""`moeplan import megatron`: read a Megatron-LM command line back into a moeplan config.

The mapping is the emitter's (planner/emit/megatron.py), read from the same table
(planner/config/megatron_arguments.py): every schema field whose name (or AliasChoices alias) is a
Megatron argument name maps to `--the-name`, and a small table covers the arguments moeplan spells
differently or encodes in several fields (precision, the hybrid layer pattern, GTP weight shards,
attention kind). Values are read with Megatron's argparse semantics
(Megatron-LM dev@d48bd6be megatron/training/arguments.py add_megatron_arguments and
megatron/training/argument_utils.py ArgumentGroupFactory): store_true flags, `--no-*`/`--disable-*`
negations of boolean settings, nargs lists, `--moe-layer-freq` as an int or a list expression.
An absent argument means Megatron's default, which is written out wherever moeplan's default differs.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from planner.config.argument_classes import argument_class, is_legacy_model
from planner.config.entry_parsers import entry_argument
from planner.config.hybrid_pattern import PatternNotModelled, read_hybrid_pattern
from planner.config.importers.shell_words import shell_words
from planner.config.layout_strings import IMPORTED, layout_string
from planner.config.megatron_arguments import (
    LEGACY_SPELLINGS,
    MEGATRON_DEFAULTS,
    MLA_DEFAULTS,
    SPECIAL,
    Kind,
    argument_table,
)
from planner.config.megatron_names import HYBRID_DSV4_SPEC, PP_DP_ORDER, main_arguments, megatron_arguments
from planner.config.schema import field_choices

KEPT = "kept in launch.megatron_extra_args"  # where an argument moeplan does not model goes
_ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_TORCHRUN_NODES = ("--nnodes",)
_TORCHRUN_PROCS = ("--nproc-per-node", "--nproc_per_node")


class UnreadableArgs(Exception):
    """The argument text cannot be split into words (exit 2)."""


@dataclass(frozen=True)
class Unmapped:
    """One argument moeplan did not take into a field, and why."""

    argument: str
    value: str
    why: str
    error: bool = False  # a malformed value (the import is not valid) rather than a passthrough

    def as_dict(self) -> dict[str, Any]:
        return {"argument": self.argument, "value": self.value, "why": self.why, "error": self.error}


@dataclass
class Imported:
    """The mapped config (section → field → value), what was left over, and where things came from."""

    data: dict[str, dict[str, Any]] = field(default_factory=dict)
    unmapped: list[Unmapped] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)  # verbatim words of the unmapped arguments
    entry: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    # A value for a required field the launch leaves out, and where it comes from: the other rules
    # run on it in the same pass, while the field itself stays missing (CFG003) in the YAML.
    placeholders: dict[str, tuple[Any, str]] = field(default_factory=dict)

    def set(self, dotted: str, value: Any) -> None:
        section, name = dotted.split(".", 1)
        self.data.setdefault(section, {})[name] = value

    def get(self, dotted: str, default: Any = None) -> Any:
        section, name = dotted.split(".", 1)
        return self.data.get(section, {}).get(name, default)

    def has(self, dotted: str) -> bool:
        section, name = dotted.split(".", 1)
        return name in self.data.get(section, {})


@dataclass(frozen=True)
class Argument:
    flag: str
    values: tuple[str, ...]

    @property
    def words(self) -> list[str]:
        return [self.flag, *self.values]

    @property
    def text(self) -> str:
        return " ".join(self.values)

    @property
    def name(self) -> str:
        """The argument's name as the classes table spells it (`--quick-geglu` → quick_geglu)."""
        return self.flag[2:].replace("-", "_")


# ---------------------------------------------------------------------------------------- words
def split_words(text: str) -> list[str]:
    """Shell words of a command line or argument file: `\\` continuations, quotes, `#` comments."""
    joined = re.sub(r"\\\r?\n", " ", text)  # bash drops backslash-newline before splitting words
    try:
        return shell_words(joined)  # shlex.split(comments=True, posix=True)'s words, linear time
    except ValueError as exc:
        raise UnreadableArgs(f"cannot split the arguments into shell words: {exc}") from None


@dataclass
class CommandLine:
    env: dict[str, str]
    launcher: list[str]
    entry: str | None
    arguments: list[Argument]
    stray: list[str]  # words before the first `--flag` that are not the entry script


def parse_command(words: list[str]) -> CommandLine:
    """Environment assignments, launcher (torchrun / python …), entry script, Megatron arguments."""
    env: dict[str, str] = {}
    index = 0
    while index < len(words) and _ENV_ASSIGNMENT.match(words[index]):
        name, value = words[index].split("=", 1)
        env[name] = value
        index += 1
    rest = words[index:]
    # The entry script is the first `*.py` word; what precedes it (torchrun and its options, python,
    # `-m torch.distributed.run`) is the launcher.
    entry_at = next((i for i, w in enumerate(rest) if w.endswith(".py") and not w.startswith("-")), None)
    launcher: list[str] = []
    entry = None
    if entry_at is not None:
        launcher, entry, rest = rest[:entry_at], rest[entry_at], rest[entry_at + 1:]
    stray: list[str] = []
    arguments: list[Argument] = []
    for word in rest:
        if word.startswith("--"):
            flag, _, value = word.partition("=")
            arguments.append(Argument(flag, (value,) if "=" in word else ()))
        elif arguments:
            last = arguments[-1]
            arguments[-1] = Argument(last.flag, last.values + (word,))
        else:
            stray.append(word)
    return CommandLine(env, launcher, None if entry is None else entry.rsplit("/", 1)[-1], arguments, stray)


def launcher_world(launcher: list[str]) -> tuple[int | None, int | None, list[Unmapped]]:
    """torchrun's --nnodes and --nproc-per-node, when both are plain integers."""
    values: dict[str, str] = {}
    for i, word in enumerate(launcher):
        flag, eq, value = word.partition("=")
        if flag in _TORCHRUN_NODES + _TORCHRUN_PROCS:
            if not eq:
                value = launcher[i + 1] if i + 1 < len(launcher) else ""
            values["nodes" if flag in _TORCHRUN_NODES else "procs"] = value
    issues = []
    numbers: dict[str, int | None] = {"nodes": None, "procs": None}
    for key, value in values.items():
        if value.isdigit() and int(value) > 0:
            numbers[key] = int(value)
        else:
            flag = "--nnodes" if key == "nodes" else "--nproc-per-node"
            issues.append(Unmapped(flag, value, "torchrun value is not a fixed number of nodes/processes; "
                                   "the world size cannot be derived from it (give --world-size)"))
    return numbers["nodes"], numbers["procs"], issues


# ---------------------------------------------------------------------------------------- values
class BadValue(ValueError):
    """A value Megatron's parser would refuse (or moeplan cannot read): reported as malformed."""


def _number(text: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise BadValue(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def _eval_int_list(text: str) -> list[int]:
    """A Python list expression of ints (`([0]*3+[1]*58)`, `[1,0,1]`), evaluated without eval()."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise BadValue(f"not a list expression: {text!r}") from None

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List | ast.Tuple):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                return left + right
            if isinstance(node.op, ast.Mult):
                seq, times = (left, right) if isinstance(left, list) else (right, left)
                if isinstance(seq, list) and isinstance(times, int) and 0 <= times * len(seq) <= 1_000_000:
                    return seq * times
        raise BadValue(f"only lists of integers, + and * are allowed in {text!r}")

    result = value(tree)
    if not isinstance(result, list) or not all(isinstance(v, int) for v in result):
        raise BadValue(f"expected a list of integers, got {text!r}")
    return result


def parse_value(kind: Kind, values: tuple[str, ...]) -> Any:
    if kind == "flag":
        if values:
            raise BadValue(f"is a switch and takes no value, got {' '.join(values)!r}")
        return True
    if kind in ("ints", "strs"):
        if not values:
            raise BadValue("expects one or more values")
        return [_number(v, int) for v in values] if kind == "ints" else list(values)
    if len(values) != 1:
        raise BadValue(f"expects one value, got {len(values)}" + (" (moeplan models a single value)"
                                                                  if values else ""))
    [text] = values
    if kind == "int":
        return _number(text, int)
    if kind == "float":
        return _number(text, float)
    if kind == "moe_freq":
        return _eval_int_list(text) if "[" in text else _number(text, int)
    if kind == "int_tuple":  # megatron/training/arguments.py tuple_type: "127,0" or "(127,0)"
        return [_number(v, int) for v in text.strip("()").split(",")]
    if kind == "bracket_ints":
        return _eval_int_list(text) if "[" in text else [_number(v, int) for v in text.split(",")]
    return text


def moe_layer_freq(pattern: list[int]) -> int | list[int]:
    """The int N when the 0/1 pattern is `every N-th layer`, else the list itself."""
    for every in range(1, len(pattern) + 1):
        if pattern == [1 if layer % every == 0 else 0 for layer in range(len(pattern))]:
            return every
    return pattern


# ---------------------------------------------------------------------------------------- import
def import_arguments(text: str, world_size: int | None = None) -> Imported:
    """Map a Megatron command line (text of a file or stdin) to a config dictionary this schema takes."""
    result = map_arguments(text, world_size)
    keep_extra_args(result)
    return result


def map_arguments(text: str, world_size: int | None = None) -> Imported:
    """Every modelled argument of a command line's text, under its field."""
    return map_command(parse_command(split_words(text)), world_size)


def map_command(line: CommandLine, world_size: int | None = None, model_defaults: bool = True) -> Imported:
    """Every modelled argument of a command line's words, under its field; the others kept. Without
    `model_defaults`, Megatron's model defaults stay unwritten (a preset gives the model)."""
    result = Imported(entry=line.entry, env=line.env)
    for word in line.stray:
        result.unmapped.append(Unmapped(word, "", "not an argument (no leading --) and not the entry "
                                        "script; ignored"))
    nodes, procs, issues = launcher_world(line.launcher)
    result.unmapped += issues
    table = argument_table()
    special: dict[str, Argument] = {}
    for arg in dashed_arguments(result, line.arguments):
        if arg.flag in SPECIAL:
            special[arg.flag] = arg
            continue
        target = table.get(arg.flag)
        negated = False
        if target is None:
            for prefix in ("--no-", "--disable-"):
                base = table.get("--" + arg.flag.removeprefix(prefix))
                if arg.flag.startswith(prefix) and base is not None and base[1] == "flag":
                    target, negated = base, True
        if target is None:
            _keep(result, arg, kept_reason(arg, line.entry))
            if argument_class(arg.name) is None and entry_argument(line.entry, arg.name) is not None:
                result.set("launch.megatron_entry", line.entry)  # ARG003 names its parser
            continue
        dotted, kind = target
        try:
            value = parse_value(kind, arg.values)
        except BadValue as exc:
            _malformed(result, arg, f"malformed value: {exc}")
            continue
        choices = field_choices(dotted)
        if isinstance(value, str) and choices and value not in choices:
            _unmodelled_value(result, arg, dotted, choices)
            continue
        # the table's own negations (--disable-bias-linear, --no-gradient-accumulation-fusion)
        if negated or (kind == "flag" and arg.flag.startswith(("--no-", "--disable-"))):
            value = False
        if kind == "moe_freq" and isinstance(value, int) and value <= 0:
            value = _signed_moe_freq(result, arg, value)
            if value is None:
                continue
        result.set(dotted, value)
    _apply_special(result, special)
    pattern = result.get("model.moe_layer_freq")
    if isinstance(pattern, list) and len(pattern) == result.get("model.num_layers"):
        result.set("model.moe_layer_freq", moe_layer_freq(pattern))  # [1, 1, …] builds what 1 builds
    _refused_words(result, line.arguments)
    _apply_megatron_defaults(result, model_defaults)
    _apply_world(result, nodes, procs, world_size)
    if line.env:  # the environment the line exports goes where moeplan's launchers export theirs
        result.set("launch.env", dict(line.env))
    return result


def _refused_words(result: Imported, arguments: list[Argument]) -> None:
    """Words whose field value moeplan reads alike but Megatron does not: an explicit
    `--mtp-num-layers 0` is not the absent argument (None) that TransformerConfig.__post_init__
    (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_config.py) accepts beside
    overlap_moe_expert_parallel_comm, which asserts mtp_num_layers is None or 1."""
    given = {arg.flag: arg.values for arg in arguments}
    if given.get("--mtp-num-layers") == ("0",) and "--overlap-moe-expert-parallel-comm" in given:
        result.unmapped.append(Unmapped("--mtp-num-layers", "0", "Megatron asserts 'MTP layernum only "
                                        "supports 1 when enabling overlap_moe_expert_parallel_comm': 0 "
                                        "is refused where the absent argument is not; fix: drop "
                                        "--mtp-num-layers 0 (the emitted launch leaves it out)", error=True))


def dashed_arguments(result: Imported, arguments: list[Argument]) -> list[Argument]:
    """`--tensor_model_parallel_size` read as `--tensor-model-parallel-size`: launchers with their own
    parsers (ms-swift's `megatron` command) take Megatron's arguments in underscore spelling, while
    Megatron's parser (megatron/training/arguments.py) defines only the dashed one. An underscore
    word no Megatron parser knows stays as written (ARG003 names it)."""
    known = megatron_arguments() | main_arguments()
    read: list[Argument] = []
    respelled: list[str] = []
    for arg in arguments:
        name = arg.flag[2:]
        if "_" in name and name in known:
            dashed = "--" + name.replace("_", "-")
            respelled.append(f"{arg.flag} as {dashed}")
            arg = Argument(dashed, arg.values)
        read.append(arg)
    if respelled:
        result.unmapped.append(Unmapped("--*_*", "", "underscore spellings read as Megatron's dashed "
                                        f"arguments: {', '.join(respelled)}"))
    return read


def _signed_moe_freq(result: Imported, arg: Argument, value: int) -> int | None:
    """--moe-layer-freq -N: Megatron makes layer i MoE where `i % freq == 0` (Megatron-LM dev@d48bd6be
    megatron/core/models/gpt/gpt_layer_specs.py get_gpt_decoder_layer_specs), and Python's i % -N is
    0 exactly where i % N is: the same pattern as N (-1: every layer). 0 divides by zero there."""
    if value == 0:
        result.unmapped.append(Unmapped(arg.flag, arg.text, "malformed value: 0 (Megatron computes "
                                        "layer % 0 and fails); fix: 1 for every layer MoE", error=True))
        return None
    result.unmapped.append(Unmapped(arg.flag, arg.text, f"read as {-value}: Megatron makes layer i MoE "
                                    f"where i % {value} == 0, which are the layers i % {-value} == 0"))
    return -value


def kept_reason(arg: Argument, entry_script: str | None = None) -> str:
    """Why an argument is carried verbatim, from its class (planner/config/argument_classes.py, or
    the entry script's own parser: planner/config/entry_parsers.py): plan-neutral, or what it
    changes and the rule `check` reports it under."""
    name = arg.name
    entry = argument_class(name)
    where = KEPT
    if entry is None and (added := entry_argument(entry_script, name)) is not None:
        parser, entry = added
        changes = (f"changes {entry.what}, {entry.how}; check reports ARG003 and "
                   f"{'ARG001' if entry.kind == 'error' else 'ARG002'}"
                   if entry.changes_plan(arg.values)
                   else f"plan-neutral, {entry.what}; check reports ARG003")
        return (f"an argument of {parser.who}'s parser ({parser.source}), which {entry_script} adds; "
                f"Megatron-LM's parser refuses it ({where}; {changes})")
    if entry is None:
        code = "ARG004" if is_legacy_model(name, arg.values) else "ARG003"
        return f"not modelled: not an argument of Megatron-LM dev's parser ({where}; check reports {code})"
    if entry.only == "main":  # main@d98e8a64's parser has it, dev's (emit's target) does not
        return (f"main-only: Megatron-LM main's parser accepts it, dev's refuses it ({where}; check "
                "reports ARG003)")
    if entry.kind == "saving" and entry.changes_plan(arg.values):
        return (f"not modelled: changes {entry.what}, {entry.how}; the memory it saves is not taken off "
                f"moeplan's figures ({where}; check reports ARG002)")
    if entry.changes_plan(arg.values):
        code = "ARG001" if entry.kind == "error" else "ARG002"
        return f"not modelled: changes {entry.what}, {entry.how} ({where}; check reports {code})"
    return f"not modelled, plan-neutral ({entry.what if entry.kind == 'neutral' else 'as given'}; {where})"


def _keep(result: Imported, arg: Argument, why: str) -> None:
    result.unmapped.append(Unmapped(arg.flag, arg.text, why))
    result.extra_args += arg.words


def _unmodelled_value(result: Imported, arg: Argument, dotted: str, choices: tuple[str, ...]) -> None:
    """A value of a modelled argument that moeplan has no model of (MindSpeed's `--rope-type longrope`,
    `--moe-router-load-balancing-type sparsemixer_topk`): named as an error and kept as written, so
    the rest of the launch is still judged in the same pass instead of the config being refused."""
    result.unmapped.append(Unmapped(arg.flag, arg.text, f"{' '.join(arg.values)!r} is not a value moeplan "
                                    f"models for {dotted} ({', '.join(choices)}); kept as written in "
                                    "launch.megatron_extra_args, the plan counts without it", error=True))
    result.extra_args += arg.words


def _malformed(result: Imported, arg: Argument, why: str) -> None:
    """A value Megatron's parser refuses: named as an error, and kept in the launch words as written,
    so the YAML holds it too and `check` of that YAML refuses it (ARG005, naming its field)."""
    result.unmapped.append(Unmapped(arg.flag, arg.text, f"{why}; kept as written in "
                                    "launch.megatron_extra_args until it is fixed", error=True))
    result.extra_args += arg.words


def _one(result: Imported, arg: Argument, kind: Kind) -> Any:
    try:
        return parse_value(kind, arg.values)
    except BadValue as exc:
        _malformed(result, arg, f"malformed value: {exc}")
        return None


def _apply_special(result: Imported, special: dict[str, Argument]) -> None:
    """Arguments that set another field, several fields, or depend on other arguments."""
    for flag, (dotted, value) in LEGACY_SPELLINGS.items():
        if flag not in special or _one(result, special[flag], "flag") is None:
            continue
        if dotted == "overlap.cuda_graph_impl" and result.get(dotted, "none") != "none":
            # validate_args: "Do not use --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl."
            result.unmapped.append(Unmapped(flag, "", f"Megatron refuses it beside --cuda-graph-impl "
                                            f"{result.get(dotted)} (validate_args); fix: keep one of them",
                                            error=True))
            continue
        result.set(dotted, value)
    _apply_enable_deepep(result, special.get("--moe-enable-deepep"))
    if "--bf16" in special or "--fp16" in special:
        result.set("training.precision", "bf16" if "--bf16" in special else "fp16")
    for flag, name in (("--fp8-format", "fp8"), ("--fp4-format", "fp4")):
        if flag in special and (value := _one(result, special[flag], "str")) is not None:
            result.set(f"training.{name}", True)
            if name == "fp8" and value != "e4m3":  # e4m3 is what `fp8: true` alone emits
                result.set("training.fp8_format", value)
    if "--use-tp-pp-dp-mapping" in special:
        result.set("parallel.order", PP_DP_ORDER)
    for flag, degree, base in (("--tensor-parallel-num-weight-shards", "gtp", "tp"),
                               ("--expert-tensor-parallel-num-weight-shards", "egtp", "etp")):
        if flag in special and (shards := _one(result, special[flag], "int")) is not None:
            size = result.get(f"parallel.{base}") or result.get("parallel.tp", 1)
            if shards % size:
                result.unmapped.append(Unmapped(flag, str(shards), f"malformed value: not a multiple of "
                                                f"{base} {size} (shards = {base} x {degree})", error=True))
            else:
                result.set(f"parallel.{degree}", shards // size)
    if "--sequence-packing-scheduler" in special:
        scheduler = _one(result, special["--sequence-packing-scheduler"], "str")
        if scheduler is not None:
            # Packed sequences are THD; Megatron dev has no qkv_format argument of its own.
            result.set("training.sequence_packing_scheduler", scheduler)
            result.set("training.qkv_format", "thd")
    # --linear-attention-type is TransformerConfig's deprecated spelling of the variant
    # (megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__ copies it over).
    variant = special.get("--experimental-attention-variant") or special.get("--linear-attention-type")
    if variant is not None:
        name = _one(result, variant, "str")
        if name == "dsv4_hybrid":
            result.set("model.attention_variant", "dsv4_hybrid")
        elif name == "dsa":  # DeepSeek-V3.2: MLA with the lightning indexer (emit writes it back)
            result.set("model.dsa", True)
        elif name == "gated_delta_net" and result.has("model.linear_attention_freq"):
            pass  # Qwen3-Next: --linear-attention-freq carries the layer pattern moeplan models
        elif name is not None:
            _keep(result, variant, f"attention variant moeplan does not model ({KEPT})")
    if result.get("model.multi_latent_attention") and result.get("model.attention_variant") is None:
        result.set("model.attention_variant", "mla")
    if result.get("model.attention_variant") == "dsv4_hybrid":
        result.data["model"].pop("multi_latent_attention", None)  # implied: DSv4 attention is MLA-based
    if result.get("model.attention_variant") not in ("mla", "dsv4_hybrid"):
        # YaRN's settings are MLATransformerConfig's: standard attention's RoPE never reads them
        # (planner/emit/megatron.py rotary_fields writes them for MLA and DSv4 attention only)
        for name in ("rotary_scaling_factor", "original_max_position_embeddings"):
            if result.has(f"model.{name}"):
                value = result.data["model"].pop(name)
                result.unmapped.append(Unmapped("--" + name.replace("_", "-"), str(value), "read only by "
                                                "MLA / DeepSeek-V4 attention's YaRN; inert with standard "
                                                "attention, so not taken into the model"))
    fsdp = result.get("training.use_megatron_fsdp")
    if result.has("training.data_parallel_sharding_strategy") and not fsdp:
        # only the Megatron-FSDP wrapper reads it (megatron/core/distributed/fsdp/); emit writes it there only
        value = result.data["training"].pop("data_parallel_sharding_strategy")
        result.unmapped.append(Unmapped("--data-parallel-sharding-strategy", str(value), "read only by "
                                        "Megatron-FSDP (--use-megatron-fsdp is not given); inert here"))
    spec = special.get("--spec")
    if spec is not None and tuple(spec.values) != HYBRID_DSV4_SPEC:
        _keep(result, spec, f"layer spec moeplan does not model ({KEPT})")
    hybrid = special.get("--hybrid-layer-pattern")
    if hybrid is not None:
        _apply_hybrid(result, hybrid)
    hashed = special.get("--moe-n-hash-layers")
    if hashed is not None and (count := _one(result, hashed, "int")) is not None:
        # The hybrid stack numbers every pattern symbol, two per DSv4 layer (emit.megatron
        # megatron_hash_layer_count); the GPT stack numbers layers 1..L.
        result.set("model.moe_n_hash_layers", count // 2 if hybrid is not None else count)
    no_table = special.get("--no-position-embedding")
    if no_table is not None:
        # validate_args refuses the deprecated flag unless the position embedding is rope, where
        # nothing reads it (GPTModel builds a learned table only for learned_absolute).
        if result.get("model.position_embedding_type") == "rope":
            result.unmapped.append(Unmapped(no_table.flag, "", "deprecated and a no-op under "
                                            "--position-embedding-type rope (validate_args); dropped"))
        else:
            _keep(result, no_table, kept_reason(no_table))


def _apply_enable_deepep(result: Imported, arg: Argument | None) -> None:
    """--moe-enable-deepep, the deprecated switch TransformerConfig.__post_init__ turns into the flex
    dispatcher's DeepEP backend (Megatron-LM dev@d48bd6be megatron/core/transformer/
    transformer_config.py), refusing it without the flex dispatcher or beside another backend."""
    if arg is None or _one(result, arg, "flag") is None:
        return
    backend = result.get("moe.moe_flex_dispatcher_backend")
    if result.get("moe.moe_token_dispatcher_type") != "flex":
        why = ("Megatron raises 'DeepEP backend is only supported with flex token dispatcher': add "
               "--moe-token-dispatcher-type flex, or use --moe-flex-dispatcher-backend deepep with it")
    elif backend in ("deepepv2", "hybridep"):
        why = (f"Megatron raises 'Only one backend is supported for flex token dispatcher' beside "
               f"--moe-flex-dispatcher-backend {backend}: drop one of them")
    else:
        result.set("moe.moe_flex_dispatcher_backend", "deepep")
        return
    result.unmapped.append(Unmapped(arg.flag, "", why, error=True))


def _apply_hybrid(result: Imported, arg: Argument) -> None:
    try:
        [text] = arg.values
        decoded = read_hybrid_pattern(text)
    except PatternNotModelled as exc:
        result.unmapped.append(Unmapped(arg.flag, arg.text, f"not modelled: {exc}", error=True))
        return
    except ValueError as exc:  # a pattern Megatron's grammar refuses, or not one value
        _malformed(result, arg, f"malformed value: {exc}")
        return
    # The pattern wins over --num-layers, and over --mtp-num-layers when it holds MTP parts
    # (Megatron-LM dev@d48bd6be megatron/training/arguments.py validate_args).
    result.set("model.num_layers", decoded["num_layers"])
    if decoded["mtp_num_layers"] or not result.has("model.mtp_num_layers"):
        result.set("model.mtp_num_layers", decoded["mtp_num_layers"])
    if "mamba_layers" in decoded:  # a Mamba stack: its mixers and mixer-only blocks
        result.set("model.mamba_layers", decoded["mamba_layers"])
        if 1 in decoded["mixer_only_layers"]:
            result.set("model.mixer_only_layers", decoded["mixer_only_layers"])
    elif not result.has("model.compress_ratios"):
        result.set("model.compress_ratios", decoded["compress_ratios"])
    result.set("model.moe_layer_freq", moe_layer_freq(decoded["moe"]))
    if len(decoded["segments"]) > 1:
        result.set("parallel.pipeline_model_parallel_layout",
                   layout_string(decoded["segments"], result.get("model.mtp_num_layers", 0), IMPORTED))


def _apply_megatron_defaults(result: Imported, model: bool = True) -> None:
    defaults = dict(MEGATRON_DEFAULTS)
    if result.get("model.attention_variant") == "mla":
        defaults.update(MLA_DEFAULTS)
    for dotted, value in defaults.items():
        if not result.has(dotted) and (model or not dotted.startswith("model.")):
            result.set(dotted, value)


def _apply_world(result: Imported, nodes: int | None, procs: int | None, world_size: int | None) -> None:
    if world_size is not None:
        result.set("parallel.world_size", world_size)
    elif nodes is not None and procs is not None:
        result.set("parallel.world_size", nodes * procs)
    if nodes is not None and procs is not None:
        result.set("cluster.nodes", nodes)
        result.set("cluster.gpus_per_node", procs)


def keep_extra_args(result: Imported) -> None:
    """The arguments moeplan does not model go to Megatron verbatim, after the plan's."""
    if result.extra_args:
        result.set("launch.megatron_extra_args", list(result.extra_args))

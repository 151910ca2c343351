"""slime (THUDM/slime) launches: `ray job submit … -- python3 train.py …`, read statically.

slime's train.py parses Megatron-LM's arguments together with its own (THUDM/slime@624b824a
slime/backends/megatron_utils/arguments.py megatron_parse_args, ignore_unknown_args) and then sets
what a plain Megatron launch would take from the command line (_set_default_megatron_args): the
distributed optimizer always, bf16 unless --fp16, seq_length 4096 and max_position_embeddings =
seq_length where unset; its validate_args turns the allgather dispatcher into alltoall, and
slime/utils/arguments.py slime_validate_args sets the global batch to rollout_batch_size x
n_samples_per_prompt // num_steps_per_rollout where the steps per rollout are given. The training
world is `--actor-num-nodes` x `--actor-num-gpus-per-node` (defaults 1 and 8; megatron_parse_args
sets args.world_size so), not the one `python3` process ray starts the driver as. slime's own
arguments (rollout, rewards, RL losses, SGLang) are consumed by train.py, never reach a Megatron
model, and are named, not carried. The model file the run script sources (scripts/models/*.sh)
builds `--moe-layer-freq` with a bash loop over NLAYERS and FIRST_K_DENSE_REPLACE; that idiom is
read as the list it prints.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from planner.config.importers.assemble import FrontEnd
from planner.config.importers.launch_facts import LaunchFacts
from planner.config.importers.megatron_args import Argument, Unmapped, parse_command
from planner.config.importers.shell_script import ShellRead
from planner.config.megatron_names import main_arguments, megatron_arguments

SOURCE = "THUDM/slime@624b824a slime/backends/megatron_utils/arguments.py"
ENTRIES = ("train.py", "train_async.py")
NAMES_FILE = Path(__file__).parent.parent / "data" / "slime_arguments.txt"
DEFAULT_SEQ_LENGTH = "4096"  # _set_default_megatron_args, where --seq-length is not given
DEFAULT_NODES, DEFAULT_GPUS = 1, 8  # slime/utils/arguments.py --actor-num-nodes / --actor-num-gpus-per-node
# scripts/models/*.sh: for ((i=0; i<NLAYERS; i++)); do if (( i < FIRST_K_DENSE_REPLACE )); then
# arr+=(0) else arr+=(1) fi done; printf -v MOE_LAYER_FREQ "[%s]" …
_DENSE_FIRST_LOOP = re.compile(
    r"for\s*\(\(\s*(\w+)\s*=\s*0\s*;\s*\1\s*<\s*\$?(\w+)\s*;\s*\1\s*\+\+\s*\)\)\s*;?\s*do\s+"
    r"if\s*\(\(\s*\1\s*<\s*\$?(\w+)\s*\)\)\s*;?\s*then\s+(\w+)\+=\(0\)\s+else\s+\4\+=\(1\)\s+fi\s+done\s+"
    r"printf\s+-v\s+(\w+)\s+\"\[%s\]\"")


@cache
def slime_arguments() -> frozenset[str]:
    lines = NAMES_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def is_slime(launcher: list[str], entry: str) -> bool:
    """A ray job submission of slime's train.py / train_async.py."""
    return ("ray" in {w.rsplit("/", 1)[-1] for w in launcher} and "submit" in launcher
            and entry.rsplit("/", 1)[-1] in ENTRIES)


def layer_freq_sets(text: str, read: ShellRead) -> dict[str, str]:
    """The value slime's dense-first loop prints, as a `--set` for its variable."""
    found: dict[str, str] = {}
    for match in _DENSE_FIRST_LOOP.finditer(text):
        layers, dense = (read.variables.get(match.group(k)) for k in (2, 3))
        if isinstance(layers, str) and isinstance(dense, str) and layers.isdigit() and dense.isdigit():
            total, first = int(layers), min(int(dense), int(layers))
            found[match.group(5)] = f"([0]*{first}+[1]*{total - first})"
    return found


# slime_plugins/models/qwen3_next.py get_qwen3_next_spec: Megatron's GPT decoder with the layers the
# Hugging Face config (--hf-checkpoint) marks linear_attention replaced by its gated DeltaNet
# (Qwen3NextGatedDeltaNet, sized by that config's linear_* keys; layer_types, else every
# full_attention_interval-th layer full attention). The checkpoint's config.json is not in the launch:
# transformers' Qwen3NextConfig defaults stand for it (they are Qwen3-Next-80B-A3B's), said in a note.
QWEN3_NEXT_SPEC = ("slime_plugins.models.qwen3_next", "get_qwen3_next_spec")
QWEN3_NEXT_DEFAULTS = (("--linear-attention-freq", "4"), ("--linear-key-head-dim", "128"),
                       ("--linear-value-head-dim", "128"), ("--linear-num-key-heads", "16"),
                       ("--linear-num-value-heads", "32"), ("--linear-conv-kernel-dim", "4"))


def _plugin_spec(arg: Argument, given: dict[str, tuple[str, ...]], front: FrontEnd) -> list[str] | None:
    """Megatron's arguments for the model a slime plugin spec builds, or None (not one moeplan reads)."""
    if arg.flag != "--spec" or arg.values != QWEN3_NEXT_SPEC:
        return None
    words = ["--experimental-attention-variant", "gated_delta_net"]
    for flag, value in QWEN3_NEXT_DEFAULTS:
        if flag not in given:
            words += [flag, value]
    checkpoint = " ".join(given.get("--hf-checkpoint", ("(not given)",)))
    why = ("slime's Qwen3-Next spec (THUDM/slime@624b824a slime_plugins/models/qwen3_next.py "
           "get_qwen3_next_spec) puts its gated DeltaNet on the layers the --hf-checkpoint config marks "
           "linear; imported as Megatron dev's gated_delta_net with Qwen3NextConfig's defaults (every "
           "4th layer attention, 16 x 128 key and 32 x 128 value heads, a 4-tap convolution); fix: "
           f"check them against {checkpoint}/config.json")
    front.notes.append(Unmapped("--spec", " ".join(arg.values), why))
    return words


def _ignored_by_slime(flag: str) -> bool:
    """An argument no Megatron parser defines and slime's parser lacks: megatron_parse_args passes
    ignore_unknown_args=True, so train.py drops it instead of refusing it."""
    name = flag[2:].replace("-", "_")
    return name not in megatron_arguments() | main_arguments() and name not in slime_arguments()


def _is_slime_own(flag: str) -> bool:
    name = flag[2:].replace("-", "_")
    megatron = megatron_arguments() | main_arguments()
    return name not in megatron and (name in slime_arguments() or flag.startswith("--sglang-"))


def slime_front_end(front: FrontEnd) -> FrontEnd:
    """The script front end of a slime launch, as slime's train.py hands it to Megatron."""
    arguments = parse_command(front.argv).arguments
    given = {a.flag: a.values for a in arguments}
    nodes = _count(given, "--actor-num-nodes", DEFAULT_NODES, front)
    per_node = _count(given, "--actor-num-gpus-per-node", DEFAULT_GPUS, front)
    own = [a for a in arguments if _is_slime_own(a.flag)]
    argv: list[str] = []
    changed: list[str] = []
    ignored: list[str] = []
    for arg in arguments:
        if _is_slime_own(arg.flag):
            continue
        spec = _plugin_spec(arg, given, front)
        if spec is not None:
            argv += spec
            continue
        if _ignored_by_slime(arg.flag) and not arg.flag.startswith("--sglang-"):
            ignored += arg.words
            continue
        if arg.flag == "--moe-token-dispatcher-type" and arg.values == ("allgather",):
            arg = Argument(arg.flag, ("alltoall",))  # slime's validate_args: allgather lacks varlen
            changed += arg.words
        argv += arg.words
    added: list[str] = []
    if "--fp16" not in given and "--bf16" not in given:
        added.append("--bf16")
    if "--use-distributed-optimizer" not in given:
        added.append("--use-distributed-optimizer")
    steps = given.get("--num-steps-per-rollout")
    if steps is not None and "--global-batch-size" not in given:
        # slime/utils/arguments.py slime_validate_args: the global batch is the rollout's samples
        # (rollout_batch_size x n_samples_per_prompt, default 1) over the steps per rollout
        words = [*given.get("--rollout-batch-size", ("",)), *given.get("--n-samples-per-prompt", ("1",)),
                 *steps]
        if all(w.isdigit() for w in words) and int(words[2]) > 0:
            added += ["--global-batch-size", str(int(words[0]) * int(words[1]) // int(words[2]))]
    seq = given.get("--seq-length")
    if seq is None:
        added += ["--seq-length", DEFAULT_SEQ_LENGTH]
    if "--max-position-embeddings" not in given:
        added += ["--max-position-embeddings", seq[0] if seq else DEFAULT_SEQ_LENGTH]
    front.argv = argv + added
    added += changed
    front.form = f"slime launch (ray job submit, {front.entry})"
    front.facts = LaunchFacts("ray job submit (slime)", nodes, per_node, nodes * per_node,
                              [f"--actor-num-nodes {nodes} x --actor-num-gpus-per-node {per_node} "
                               "(slime's megatron_parse_args)"])
    if added:
        front.notes.append(Unmapped("(slime defaults)", " ".join(added), f"set by slime's train.py where "
                                    f"the launch leaves them out ({SOURCE} _set_default_megatron_args, "
                                    "validate_args)"))
    if own:
        names = " ".join(a.flag for a in own)
        front.notes.append(Unmapped("(slime's own)", names, "arguments of slime's parser (rollout, "
                                    "rewards, RL losses, SGLang): train.py consumes them; no Megatron "
                                    "model reads them, so they are not carried"))
    if ignored:
        why = (f"no argument of Megatron-LM's parser nor slime's: {SOURCE} megatron_parse_args "
               "parses with ignore_unknown_args=True, so train.py drops it (slime's own Megatron patch "
               "may define it: --use-gated-attention is its Qwen3-Next gate, which "
               "--attention-output-gate sets in Megatron-LM)")
        front.notes.append(Unmapped("(ignored by slime)", " ".join(ignored), why))
    if "--use-dynamic-batch-size" in given:
        tokens = " ".join(given.get("--max-tokens-per-gpu", ()))
        front.notes.append(Unmapped("--use-dynamic-batch-size", tokens, "slime packs each micro-batch up "
                                    f"to --max-tokens-per-gpu {tokens or '(unset)'} tokens instead of "
                                    "--micro-batch-size samples; moeplan counts micro_batch_size x "
                                    "seq_length tokens per micro-batch, so its activation memory and "
                                    "micro-batch count follow the fixed-size batch, not the packed one"))
    if "--colocate" in given:
        front.notes.append(Unmapped("--colocate", "", "training shares its GPUs with the SGLang rollout "
                                    "engines (offloaded between phases); moeplan's memory counts the "
                                    "training step alone"))
    return front


def _count(given: dict[str, tuple[str, ...]], flag: str, default: int, front: FrontEnd) -> int:
    values = given.get(flag)
    if values is None:
        return default
    if len(values) == 1 and values[0].isdigit() and int(values[0]) > 0:
        return int(values[0])
    front.notes.append(Unmapped(flag, " ".join(values), f"not a number of ranks; slime's default "
                                f"{default} is assumed; fix: --set the variable", error=True))
    return default

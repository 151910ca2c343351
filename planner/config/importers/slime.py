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
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from planner.config.importers.assemble import FrontEnd
from planner.config.importers.launch_facts import LaunchFacts
from planner.config.importers.megatron_args import Argument, Unmapped, parse_command
from planner.config.importers.shell_script import ShellRead
from planner.config.importers.vocabulary import json_file, local_folder
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


# slime_plugins/models/qwen3_next.py get_qwen3_next_spec and qwen3_5.py get_qwen3_5_spec: Megatron's
# GPT decoder with the layers the Hugging Face config (--hf-checkpoint) marks linear_attention replaced
# by a gated DeltaNet sized by that config's linear_* keys (layer_types, else every
# full_attention_interval-th layer full attention). Where the checkpoint's config.json is at hand it
# is read; else transformers' config defaults stand for it (Qwen3NextConfig's are Qwen3-Next-80B-A3B's,
# Qwen3_5MoeTextConfig's Qwen3.5-35B-A3B's), said in a note.
_DELTANET_KEYS = (("--linear-key-head-dim", "linear_key_head_dim"),
                  ("--linear-value-head-dim", "linear_value_head_dim"),
                  ("--linear-num-key-heads", "linear_num_key_heads"),
                  ("--linear-num-value-heads", "linear_num_value_heads"),
                  ("--linear-conv-kernel-dim", "linear_conv_kernel_dim"))
_DELTANET_DEFAULTS = {"linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                      "linear_num_value_heads": 32, "linear_conv_kernel_dim": 4, "full_attention_interval": 4}
# slime_plugins/models/glm5/glm5.py get_glm5_spec: Megatron's MLA with DeepSeek's sparse attention
# (a lightning indexer of index_n_heads x index_head_dim from the checkpoint's config.json, top 2048
# keys: DSAttention.__init__ sets index_topk = 2048), Megatron dev's experimental_attention_variant dsa.
# GLM-5's config.json (zai-org/GLM-5.1, glm_moe_dsa) gives 32 heads of 128.
_DSA_DEFAULTS = {"index_n_heads": 32, "index_head_dim": 128}
GLM5_TOPK = "2048"


@dataclass(frozen=True)
class PluginSpec:
    """A slime plugin layer spec moeplan reads: what it builds, in Megatron's terms."""

    function: str
    builds: str  # what the note says it builds
    words: Callable[[dict[str, Any]], list[str]]  # Megatron's arguments, from the HF config's keys
    defaults: dict[str, Any]
    defaults_are: str  # whose defaults stand in for a config.json not at hand
    fields: dict[str, Any] = field(default_factory=dict)  # model fields no Megatron argument spells


def _deltanet_words(hf: dict[str, Any]) -> list[str]:
    interval = hf.get("full_attention_interval") or 4
    types = hf.get("layer_types")
    words = ["--experimental-attention-variant", "gated_delta_net"]
    if isinstance(types, list) and types:
        pattern = [1 if t == "linear_attention" else 0 for t in types]
        words += ["--linear-attention-freq", "[" + ",".join(map(str, pattern)) + "]"]
    else:
        words += ["--linear-attention-freq", str(interval)]
    for flag, key in _DELTANET_KEYS:
        words += [flag, str(hf[key])]
    return words


def _dsa_words(hf: dict[str, Any]) -> list[str]:
    return ["--experimental-attention-variant", "dsa", "--dsa-indexer-n-heads", str(hf["index_n_heads"]),
            "--dsa-indexer-head-dim", str(hf["index_head_dim"]), "--dsa-indexer-topk", GLM5_TOPK]


PLUGIN_SPECS: dict[str, PluginSpec] = {
    "slime_plugins.models.qwen3_next": PluginSpec(
        "get_qwen3_next_spec", "a gated DeltaNet on the layers the config marks linear",
        _deltanet_words, _DELTANET_DEFAULTS, "Qwen3NextConfig's (Qwen3-Next-80B-A3B's)"),
    "slime_plugins.models.qwen3_5": PluginSpec(
        "get_qwen3_5_spec", "a gated DeltaNet on the layers the config marks linear",
        _deltanet_words, _DELTANET_DEFAULTS, "Qwen3_5MoeTextConfig's (Qwen3.5-35B-A3B's)"),
    # slime_plugins/models/minimax_m2.py MiniMaxM2SelfAttention: one RMSNorm over all heads' q (heads
    # x d) and one over all groups' k instead of Megatron's per-head norms (model.qk_layernorm_per_layer)
    "slime_plugins.models.minimax_m2": PluginSpec(
        "get_minimax_m2_layer_spec", "q and k normalised over all heads at once (MiniMaxM2SelfAttention)",
        lambda hf: [], {}, "", {"model.qk_layernorm_per_layer": True}),
    "slime_plugins.models.glm5.glm5": PluginSpec(
        "get_glm5_spec", "MLA with DeepSeek's sparse attention (a lightning indexer choosing 2048 keys)",
        _dsa_words, _DSA_DEFAULTS, "GLM-5's published config.json"),
}


def _checkpoint_config(given: dict[str, tuple[str, ...]], origins: list[Path]) -> tuple[dict[str, Any], str]:
    """The --hf-checkpoint's config.json keys (a multimodal one's text_config) and where they came
    from, or nothing where the folder is not on this machine."""
    name = " ".join(given.get("--hf-checkpoint", ()))
    folder = local_folder(name, origins)
    data = json_file(folder / "config.json") if folder is not None else None
    if data is None:
        return {}, ""
    text = data.get("text_config")
    return (text if isinstance(text, dict) else data), str(folder / "config.json")


def _plugin_spec(arg: Argument, given: dict[str, tuple[str, ...]], front: FrontEnd) -> list[str] | None:
    """Megatron's arguments for the model a slime plugin spec builds, or None (not one moeplan reads)."""
    if arg.flag != "--spec" or len(arg.values) != 2:
        return None
    spec = PLUGIN_SPECS.get(arg.values[0])
    if spec is None or arg.values[1] != spec.function:
        return None
    hf, where = _checkpoint_config(given, front.origins)
    read = {**spec.defaults, **{k: v for k, v in hf.items() if k in spec.defaults or k == "layer_types"}}
    words = _drop_given(spec.words(read), set(given))
    front.fields.update(spec.fields)
    checkpoint = " ".join(given.get("--hf-checkpoint", ("(not given)",)))
    source = f"THUDM/slime@624b824a {arg.values[0].replace('.', '/')}.py {spec.function}"
    said = " ".join(words) or ", ".join(f"{k} {v}" for k, v in spec.fields.items())
    if where:
        whence = f"sizes read from {where}"
    elif spec.defaults:
        whence = (f"{spec.defaults_are} values stand for {checkpoint}/config.json, which is not on this "
                  f"machine; fix: check them against it")
    else:
        whence = "no checkpoint value needed"
    front.notes.append(Unmapped("--spec", " ".join(arg.values), f"slime's plugin spec ({source}) builds "
                                f"{spec.builds}: read as {said}; {whence}"))
    return words


def _drop_given(words: list[str], given: set[str]) -> list[str]:
    """The spec's words less the flags the launch gives itself (the launch's value wins; the
    attention variant is the spec's own)."""
    return [word for arg in parse_command(words).arguments
            if arg.flag not in given or arg.flag == "--experimental-attention-variant"
            for word in arg.words]


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
    if "--allgather-cp" in given and "--cp-comm-type" not in given:
        # slime's --allgather-cp: context parallelism gathers the whole sequence's keys and values
        # (slime/backends/megatron_utils/cp_utils.py; DSA models only, arguments.py
        # _validate_allgather_cp_supported), Megatron's cp_comm_type all_gather
        added += ["--cp-comm-type", "all_gather"]
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

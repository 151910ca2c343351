"""ms-swift's `megatron sft|pt|rlhf …` command (modelscope/ms-swift), read statically.

ms-swift takes Megatron's arguments in underscore spelling with explicit `true`/`false` values
(its MegatronArguments dataclass, swift/megatron/arguments/megatron_args.py at 3602360a), builds
the model from the Hugging Face checkpoint `--model` names, and starts torchrun with NNODES x
NPROC_PER_NODE processes when either is set (swift/cli/main.py get_torchrun_args). Its defaults
differ from Megatron's where the launch says nothing: global batch 16, selective recompute of
core_attn, the fused cross entropy, flash attention, the distributed optimizer, fp32 router, grouped
GEMM, bf16 (the checkpoint's dtype) with fp32 grad reduction; the sequence length is packing_length
or max_length (megatron_base_args.py). Its own arguments (dataset, epochs, output) reach no Megatron
model and are named, not carried.
"""

from __future__ import annotations

from functools import cache

from planner.config.importers.assemble import FrontEnd, checkpoint_model
from planner.config.importers.launch_facts import LaunchFacts
from planner.config.importers.megatron_args import Argument, Unmapped, parse_command
from planner.config.importers.megatron_log import destinations
from planner.config.importers.shell_script import Unknown
from planner.config.importers.vocabulary import preset_for
from planner.config.megatron_arguments import argument_table
from planner.config.megatron_names import main_arguments, megatron_arguments

SOURCE = "modelscope/ms-swift@3602360a swift/megatron/arguments/megatron_args.py MegatronArguments"
SUBCOMMANDS = ("sft", "pt", "rlhf")
# MegatronArguments defaults that differ from Megatron-LM's (flag, words when the launch is silent)
DEFAULTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("--global-batch-size", ("--global-batch-size", "16")),
    ("--recompute-granularity", ("--recompute-granularity", "selective", "--recompute-modules", "core_attn")),
    ("--cross-entropy-loss-fusion", ("--cross-entropy-loss-fusion",)),
    ("--attention-backend", ("--attention-backend", "flash")),
    ("--use-distributed-optimizer", ("--use-distributed-optimizer",)),
    ("--moe-router-dtype", ("--moe-router-dtype", "fp32")),
    ("--moe-grouped-gemm", ("--moe-grouped-gemm",)),
    ("--moe-token-dispatcher-type", ("--moe-token-dispatcher-type", "alltoall")),
    ("--expert-tensor-parallel-size", ("--expert-tensor-parallel-size", "1")),  # Megatron's: TP
)
_TRUE, _FALSE = ("true", "True", "1"), ("false", "False", "0")


def swift_at(words: list[str]) -> int | None:
    """Where `megatron <subcommand>` starts in a command's words."""
    return next((i for i, w in enumerate(words[:-1]) if w.rsplit("/", 1)[-1] == "megatron"
                 and words[i + 1] in SUBCOMMANDS), None)


@cache
def _switches() -> dict[str, str]:
    """flag → true/false: Megatron's store_true / store_false arguments (megatron_dests.tsv)."""
    return {row.flag: row.kind for rows in destinations().values() for row in rows
            if row.kind in ("true", "false")}


def _is_switch(flag: str) -> bool:
    target = argument_table().get(flag)
    return (target is not None and target[1] == "flag") or _switches().get(flag) == "true"


def swift_front_end(words: list[str], env: dict[str, str], origins: list) -> FrontEnd:
    """The front end of `megatron sft …` words (env: the assignments before them)."""
    at = swift_at(words)
    assert at is not None
    unknown = {name: value for name, value in env.items() if isinstance(value, Unknown)}
    env = {name: value for name, value in env.items() if name not in unknown}
    known = megatron_arguments() | main_arguments()
    argv: list[str] = []
    own: list[str] = []
    given: dict[str, tuple[str, ...]] = {}
    for arg in parse_command(words[at + 2:]).arguments:
        name = arg.flag[2:].replace("-", "_")
        flag = "--" + name.replace("_", "-")
        given[flag] = arg.values
        if name not in known:
            own.append(arg.flag)
            continue
        values = arg.values
        if len(values) == 1 and (values[0] in _TRUE or values[0] in _FALSE) and _is_switch(flag):
            if values[0] in _TRUE:
                argv.append(flag)
            continue
        argv += Argument(flag, values).words
    front = FrontEnd(f"ms-swift command (megatron {words[at + 1]})", argv, None, dict(env),
                     origins=origins)
    added: list[str] = []
    for flag, default in DEFAULTS:
        if flag not in given:
            added += default
    dtype = given.get("--torch-dtype", ("bfloat16",))[0]
    if "--fp16" not in given and "--bf16" not in given:
        added.append("--fp16" if dtype in ("float16", "fp16") else "--bf16" if dtype in ("bfloat16", "bf16")
                     else "")
    if "--bf16" in added and "--accumulate-allreduce-grads-in-fp32" not in given:
        added.append("--accumulate-allreduce-grads-in-fp32")  # _map_dtype: bf16 with fp32 main grads
    length = given.get("--packing-length") or given.get("--max-length")
    if "--seq-length" not in given and length:
        added += ["--seq-length", length[0]]
    front.argv = argv + [w for w in added if w]
    front.notes.append(Unmapped("(ms-swift defaults)", " ".join(w for w in added if w),
                                f"what ms-swift passes where the command is silent ({SOURCE}; bf16 "
                                "from the checkpoint's torch_dtype unless --torch_dtype says otherwise)"))
    if own:
        front.notes.append(Unmapped("(ms-swift's own)", " ".join(own), "arguments of ms-swift's parser "
                                    "(data, epochs, output, checkpoint format): no Megatron model reads "
                                    "them, so they are not carried"))
    _tuner(front, given)
    if given.get("--model"):
        front.notes.append(checkpoint_model(front, "--model", given["--model"][0], front.origins))
    elif model := given.get("--load"):
        front.model_preset = preset_for(model[0])
        if front.model_preset is not None:
            front.notes.append(Unmapped("--load", model[0], f"the model is the {front.model_preset} "
                                        "preset (its Hugging Face config.json), named by the checkpoint"))
    front.facts = _world(env, unknown)
    return front


def _world(env: dict[str, str], unknown: dict[str, str]) -> LaunchFacts:
    """NNODES x NPROC_PER_NODE, as ms-swift hands them to torchrun; NPROC_PER_NODE defaults to the
    CUDA_VISIBLE_DEVICES count (torchrun's gpu count)."""
    per_node = env.get("NPROC_PER_NODE") or (str(len(env["CUDA_VISIBLE_DEVICES"].split(",")))
                                             if env.get("CUDA_VISIBLE_DEVICES") else None)
    nodes = env.get("NNODES", "1")
    facts = LaunchFacts("ms-swift torchrun")
    if per_node and per_node.isdigit() and nodes.isdigit():
        facts.nodes, facts.per_node = int(nodes), int(per_node)
        facts.world_size = facts.nodes * facts.per_node
        facts.sources.append(f"NNODES {nodes} x NPROC_PER_NODE {per_node}")
    else:
        facts.not_numbers += [(k, unknown.get(k) or env.get(k, "unset"))
                              for k in ("NNODES", "NPROC_PER_NODE")
                              if not env.get(k, "1" if k == "NNODES" else "").isdigit()]
    return facts


# MegatronTunerMixin (swift/megatron/arguments/megatron_args.py): --tuner_type lora wraps the
# linears --target_modules names (all-linear: every linear of the decoder but the router,
# swift/megatron/utils/utils.py get_all_linears) with rank --lora_rank (8) and --lora_alpha (32).
_LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def _tuner(front: FrontEnd, given: dict[str, tuple[str, ...]]) -> None:
    """training.lora for an ms-swift LoRA run (a frozen base, adapters trained), else nothing."""
    if given.get("--tuner-type", ("full",)) != ("lora",):
        return
    targets = [t for t in given.get("--target-modules", ("all-linear",)) if t]
    named = list(_LORA_TARGETS) if targets == ["all-linear"] else [t for t in targets if t in _LORA_TARGETS]
    rank, alpha = given.get("--lora-rank", ("8",)), given.get("--lora-alpha", ("32",))
    if not named or not rank[0].isdigit():
        front.notes.append(Unmapped("--tuner_type", "lora", f"--target_modules {' '.join(targets)} names no "
                                    f"linear moeplan counts adapters on ({', '.join(_LORA_TARGETS)}); the "
                                    "run is budgeted as full training; fix: set training.lora", error=True))
        return
    front.fields["training.lora"] = {"dim": int(rank[0]), "alpha": float(alpha[0]), "target_modules": named}
    front.notes.append(Unmapped("--tuner_type", "lora", f"training.lora: rank {rank[0]}, alpha {alpha[0]} on "
                                f"{', '.join(named)} over the frozen base ({SOURCE} MegatronTunerMixin)"))

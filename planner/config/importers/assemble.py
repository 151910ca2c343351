"""One import for every input form: the argument list a front end read (argument file, launch
script, training log, YAML argument map) plus its launch facts, mapped onto the config by
planner/config/importers/megatron_args.py, with the world size and `cluster:` from the launcher,
the vocabulary from the tokenizer when the line has none, and what could not be read named with
its fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.config.importers.launch_facts import LaunchFacts
from planner.config.importers.megatron_args import (
    Argument,
    Imported,
    Unmapped,
    keep_extra_args,
    map_command,
    parse_command,
)
from planner.config.importers.pai import qwen3_next_words
from planner.config.importers.shell_script import PLACEHOLDER, Unresolved
from planner.config.importers.vocabulary import (
    folder_vocabulary,
    largest_preset_vocabulary,
    local_folder,
    preset_for,
    preset_vocabulary,
)
from planner.config.megatron_arguments import SPECIAL, argument_table
from planner.config.megatron_releases import resolve_version
from planner.config.presets import PRESETS
from planner.degrees import Degrees

_VOCABULARY_FLAGS = ("--vocab-size", "--padded-vocab-size")
GPT2_BPE_TOKENS = 50257  # the vocab.json of GPT-2 BPE that Megatron's GPT2BPETokenizer reads


@dataclass
class FrontEnd:
    """What a front end read: the form (named for the user), the Megatron arguments, the launch."""

    form: str
    argv: list[str]
    entry: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    facts: LaunchFacts = field(default_factory=LaunchFacts)
    unresolved: dict[str, Unresolved] = field(default_factory=dict)
    notes: list[Unmapped] = field(default_factory=list)
    origins: list[Path] = field(default_factory=list)  # folders a relative tokenizer path may be in
    model_preset: str | None = None  # the model is this preset (a launcher that builds it from HF)
    # config fields a launcher sets that no Megatron argument spells (a layer spec's own norm, the
    # Hugging Face config.json a trainer builds its model from: model.hf_config)
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def described(self) -> str:
        if self.facts.launcher or self.facts.world_size:
            return f"{self.form} ({self.facts.summary})"
        return self.form


def checkpoint_model(front: FrontEnd, option: str, model: str, origins: list[Path]) -> Unmapped:
    """The model a launcher builds from a Hugging Face checkpoint (verl's
    actor_rollout_ref.model.path: volcengine/verl verl/models/mcore/config_converter.py
    hf_to_mcore_config_*; ms-swift's --model): its preset where moeplan has one, else that
    checkpoint's config.json read through model.hf_config. A folder at hand is read where it is; a
    Hub name or a path not on this machine is written as its config.json, which `check` names in one
    finding (FILE001 at model.hf_config) instead of every model field missing."""
    front.model_preset = preset_for(model)
    if front.model_preset is not None:
        return Unmapped(option, model, f"the model is the {front.model_preset} preset (its Hugging Face "
                        "config.json), named by the checkpoint")
    folder = local_folder(model, origins)
    path = (str((folder / "config.json").resolve()) if folder is not None
            else f"{model.rstrip('/')}/config.json")
    front.fields["model.hf_config"] = path
    why = f"no moeplan preset has this checkpoint: the model is read from its config.json ({path})"
    if folder is None:
        why += ("; it is not on this machine, so check stops at that file; fix: download it "
                "(huggingface-cli download MODEL config.json) and set model.hf_config to its path")
    return Unmapped(option, model, why, error=folder is None)


def is_modelled(flag: str) -> bool:
    """Whether the mapping reads this flag into a field (then an unknown value matters)."""
    table = argument_table()
    if flag in table or flag in SPECIAL:
        return True
    return any(flag.startswith(p) and ("--" + flag.removeprefix(p)) in table for p in ("--no-", "--disable-"))


def _unresolved_notes(front: FrontEnd, words: list[str]) -> tuple[list[str], list[Unmapped]]:
    """Drop modelled arguments whose value holds an unknown `${NAME}` (Megatron's default is not
    what the script means, so the field stays unset and the note is an error); keep the others."""
    arguments = parse_command(words).arguments
    kept: list[str] = []
    users: dict[str, list[tuple[str, bool]]] = {}
    for arg in arguments:
        names = [m.group(1) for value in arg.values for m in PLACEHOLDER.finditer(value)]
        modelled = bool(names) and is_modelled(arg.flag)
        for name in names:
            users.setdefault(name, []).append((arg.flag, modelled))
        if not modelled:
            kept += arg.words
    notes = []
    for name, uses in users.items():
        entry = front.unresolved.get(name, Unresolved(name, "not set"))
        error = any(modelled for _, modelled in uses)
        flags = ", ".join(dict.fromkeys(flag for flag, _ in uses))
        settable = not name.startswith("$")
        fix = (f"pass --set {name}=VALUE" if settable else "replace it with its value in the file, or "
               "pass --set for the variable it is assigned to")
        effect = ("so these arguments are left out and their fields stay unset" if error else
                  "kept as written (they do not change the plan)")
        notes.append(Unmapped("$" + name if settable else name, "",
                              f"{entry.why}; used by {flags}, {effect}; fix: {fix}", error=error))
    return kept, notes


def _vocabulary(result: Imported, front: FrontEnd, arguments: list[Argument]) -> None:
    """`model.vocab_size` from a local tokenizer folder when no vocabulary flag is given; else one
    note naming the flag and field to set, with a preset's vocabulary as the suggestion."""
    values = {a.flag: a.text for a in arguments}
    padded = values.get("--padded-vocab-size", "")
    if padded.isdigit() and "--vocab-size" not in values:
        if not result.has("model.vocab_size"):
            result.set("model.vocab_size", int(padded))
            front.notes.append(Unmapped("--padded-vocab-size", padded, f"model.vocab_size {padded}: no "
                                        "tokenizer size is given, and Megatron uses the padded size as "
                                        "given (validate_args skips the padding), so the rows are the same"))
        return
    if any(flag in values for flag in _VOCABULARY_FLAGS) or result.has("model.vocab_size"):
        return
    if front.model_preset is not None and "vocab_size" in PRESETS.get(front.model_preset, {}):
        return  # the preset carries the checkpoint's vocabulary
    if "model.hf_config" in front.fields:
        return  # the config.json carries the checkpoint's vocabulary
    tokenizer = values.get("--tokenizer-model") or values.get("--tokenizer-name-or-path") or ""
    kind = values.get("--tokenizer-type", "")
    folder = local_folder(tokenizer, front.origins)
    found = folder_vocabulary(folder) if folder is not None else None
    if found is not None:
        size, where = found
        result.set("model.vocab_size", size)
        front.notes.append(Unmapped("--tokenizer-model", tokenizer, f"model.vocab_size {size} read from "
                                    f"{where} (the tokenizer's size; Megatron pads it)"))
        return
    said = " ".join(p for p in (f"--tokenizer-type {kind}" if kind else "",
                                f"--tokenizer-model {tokenizer}" if tokenizer else "") if p)
    suggestion = preset_vocabulary(tokenizer) if tokenizer else None
    hint = (f"; the {suggestion[0]} preset's vocabulary is {suggestion[1]}: --vocab-size {suggestion[1]}"
            if suggestion else "")
    if suggestion:
        result.placeholders["model.vocab_size"] = (suggestion[1], f"the {suggestion[0]} preset's "
                                                   f"vocabulary, named by the tokenizer {tokenizer}")
    elif kind == "GPT2BPETokenizer" or values.get("--vocab-file", "").endswith("vocab.json"):
        said = (f"--tokenizer-type {kind}" if kind else f"--vocab-file {values['--vocab-file']}")
        result.placeholders["model.vocab_size"] = (GPT2_BPE_TOKENS, f"assumed GPT-2 BPE's {GPT2_BPE_TOKENS} "
                                                   f"tokens ({said}), as Megatron's GPT2BPETokenizer "
                                                   "reads them")
    else:
        preset, size = largest_preset_vocabulary()
        result.placeholders["model.vocab_size"] = (size, f"assumed: no tokenizer size is readable, so "
                                                   f"the largest preset vocabulary ({preset}), which "
                                                   "does not under-count the embedding and output layer")
    why = (f"the vocabulary comes from the tokenizer ({said or 'none named'}), which is not a local "
           "folder moeplan can read")
    front.notes.append(Unmapped("--vocab-size", "", f"{why}; fix: add --vocab-size N to the arguments or "
                                f"set model.vocab_size{hint}"))


def _apply_launch(result: Imported, facts: LaunchFacts, world_size: int | None) -> None:
    world = world_size if world_size is not None else facts.world_size
    if world is not None:
        result.set("parallel.world_size", world)
    if facts.nodes and facts.per_node and (world is None or world == facts.nodes * facts.per_node):
        result.set("cluster.nodes", facts.nodes)
        result.set("cluster.gpus_per_node", facts.per_node)


def _megatron_version(result: Imported, image: str | None) -> list[Unmapped]:
    """megatron.version from the container the launch runs in: a NeMo container's tag names the
    Megatron-LM it ships; one moeplan cannot place is written as read, so rule VER001 names it,
    and another image (a PyTorch base) fixes no Megatron-LM version: said, not guessed."""
    if not image:
        return []
    known = resolve_version(image)
    if known is not None:
        result.set("megatron.version", known.name)
        return []
    name = image.rsplit("/", 1)[-1]
    if name.startswith(("nemo:", "megatron")):
        result.set("megatron.version", image)
        return []
    return [Unmapped("--container-image", image, "the container does not name the Megatron-LM it "
                     "runs (not a NeMo container), so megatron.version stays dev@d48bd6be; fix: set "
                     "megatron.version to the release, container or commit the job checks out",
                     error=False)]


def _launch_notes(front: FrontEnd, world_size: int | None) -> list[Unmapped]:
    notes = []
    for option, value in front.facts.not_numbers:
        notes.append(Unmapped(option, value, "not a fixed number, so the world size is not derived from "
                              "it; fix: pass --world-size N or --set the variable", error=False))
    if world_size is None and front.facts.world_size is None:
        notes.append(Unmapped("--world-size", "", "no launcher in the input gives the number of ranks "
                              "(torchrun --nnodes/--nproc-per-node, srun -N/--ntasks-per-node, mpirun -np, "
                              "#SBATCH --nodes); fix: pass --world-size N"))
    return notes


def _placeholders(result: Imported) -> None:
    """Stated assumptions for required fields the launch leaves out, so every other rule runs in
    the same pass: the sequence length from --max-position-embeddings (Megatron asserts it is at
    least the sequence length under learned positions), and the smallest world the layout fills
    (DP 1: PP x the larger of TP x CP and ETP x EP, as Megatron's two rank grids need both)."""
    if not result.has("training.seq_length") and isinstance(result.get("model.max_position_embeddings"), int):
        result.placeholders["training.seq_length"] = (result.get("model.max_position_embeddings"),
                                                      "--max-position-embeddings")
    if not result.has("parallel.world_size") and not result.has("cluster.nodes"):
        degrees = {name: result.get(f"parallel.{name}") for name in ("tp", "cp", "pp", "ep", "etp")}
        if all(isinstance(v, int) or v is None for v in degrees.values()):
            tp, cp, pp, ep = (degrees[n] or 1 for n in ("tp", "cp", "pp", "ep"))
            layout = Degrees(world_size=1, tp=tp, cp=cp, pp=pp, ep=ep, etp=degrees["etp"] or tp)
            result.placeholders["parallel.world_size"] = (
                layout.smallest_world, f"the smallest world the layout fills (DP 1: lcm of "
                f"TP·CP·PP {layout.dense_model_size} and ETP·EP·PP {layout.expert_model_size})")


def assemble(front: FrontEnd, world_size: int | None = None) -> Imported:
    """The config of a front end's arguments: mapped, launched, vocabulary found, notes first."""
    words, unresolved = _unresolved_notes(front, front.argv)
    words, entry_notes = qwen3_next_words(front.entry, words)
    line = parse_command(([front.entry] if front.entry else []) + words)
    from_hf = front.model_preset is not None or "model.hf_config" in front.fields
    result = map_command(line, model_defaults=not from_hf)
    if front.model_preset is not None:
        result.set("model.preset", front.model_preset)
    for dotted, value in front.fields.items():
        result.set(dotted, value)
    result.entry = front.entry or result.entry
    _apply_launch(result, front.facts, world_size)
    version_notes = _megatron_version(result, front.facts.container_image)
    if front.env:
        result.set("launch.env", dict(front.env))
        result.env = dict(front.env)
    _vocabulary(result, front, line.arguments)
    keep_extra_args(result)
    _placeholders(result)
    result.unmapped = [*front.notes, *unresolved, *entry_notes, *_launch_notes(front, world_size),
                       *version_notes, *result.unmapped]
    return result

"""Which input form a user's file is, and its import front end: a Megatron training log (an
argument dump), a YAML argument map, a shell launch script (read statically, never run), or an
argument file (a command line, one or many arguments per line). Each form yields the argument
list and launch facts that planner/config/importers/assemble.py maps onto the config.
"""

from __future__ import annotations

import re
from pathlib import Path

from planner.config.importers.arg_map import is_argument_map, load_map, read_map
from planner.config.importers.assemble import FrontEnd, assemble
from planner.config.importers.bridge_yaml import bridge_front_end, is_bridge_container
from planner.config.importers.launch_facts import launch_facts
from planner.config.importers.log_lines import clean_lines
from planner.config.importers.megatron_args import Imported, Unmapped, split_words
from planner.config.importers.megatron_log import has_dump, log_front_end
from planner.config.importers.mindspeed import is_mindspeed, mindspeed_front_end
from planner.config.importers.primus import PrimusUnreadable, is_primus, primus_front_end
from planner.config.importers.shell_script import (
    ScriptTooComplex,
    Unknown,
    argument_variables,
    entry_index,
    launch_command,
    read_script,
)
from planner.config.importers.slime import is_slime, layer_freq_sets, slime_front_end
from planner.config.importers.sourced import inline_sourced
from planner.config.importers.swift import swift_at, swift_front_end
from planner.config.importers.verl import is_megatron, verl_at, verl_front_end

ARGUMENT_FILE = "argument file"
SHELL_SCRIPT = "shell launch script"
SHELL_SNIPPET = "shell argument snippet, no launch command"
# What makes a text a script rather than one command line: assignments, expansions, control flow.
_SHELL_SIGNS = re.compile(r"^[ \t]*(?:#!|export\s|[A-Za-z_][A-Za-z0-9_]*\+?=|if\s|for\s|while\s|function\s"
                          r"|source\s|\.\s|#SBATCH)|\$[{(A-Za-z_0-9@]", re.M)


_ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


class NotAnImport(ValueError):
    """The text is none of the forms `moeplan import megatron` reads (exit 2, with why)."""


def detect_form(text: str) -> str:
    """The form's name: what the user is told the file was read as."""
    if " arguments " in text and has_dump(clean_lines(text)):  # the dump's marker line
        return "log"
    data = load_map(text)
    if data is not None and is_argument_map(data):
        return "map"
    if data is not None and is_primus(data):
        return "primus"
    if data is not None and is_bridge_container(data):
        return "bridge"
    if data is not None and {"model", "parallel"} & set(data):
        raise NotAnImport("this is a moeplan config (model/parallel sections): run `moeplan check` on it")
    return "script" if _SHELL_SIGNS.search(text) else "arguments"


def script_front_end(text: str, sets: dict[str, str], origin: Path | None) -> FrontEnd:
    text, sourced = inline_sourced(text, origin)
    read = read_script(text, sets)
    if loops := {k: v for k, v in layer_freq_sets(text, read).items() if k not in sets}:
        read = read_script(text, {**loops, **sets})
    command = launch_command(read)
    verl = next((c for c in read.commands if verl_at(c.words) is not None), None)
    if verl is not None:  # the trainer, also where a helper runs first (verl's examples convert the
        # checkpoint with `python scripts/converter_hf_to_mcore.py` before it)
        front = _verl(verl.words, {k: v for k, v in verl.env.items() if not isinstance(v, Unknown)}, origin)
        front.unresolved = dict(verl.unresolved)
        return front
    if command is None and (held := argument_variables(read)):
        names, argv, unresolved = held
        return FrontEnd(f"{SHELL_SNIPPET} ({', '.join(names)})", argv, unresolved=unresolved,
                        origins=[origin] if origin else [])
    if command is None and (swift := next((c for c in read.commands if swift_at(c.words) is not None), None)):
        front = swift_front_end(swift.words, dict(swift.env), [origin] if origin else [])
        front.unresolved = dict(swift.unresolved)
        return front
    if command is None:
        runs = [c.words[:2] for c in read.commands if c.words and c.words[0] in ("bash", "sh", "sbatch")]
        why = ("no command in it starts a Python entry script (pretrain_gpt.py, …)"
               + (f"; it runs {' '.join(runs[-1])}: import that script, or the argument map it reads"
                  if runs else ""))
        raise NotAnImport(why)
    at = entry_index(command.words)
    assert at is not None
    launcher, entry, argv = command.words[:at], command.words[at], command.words[at + 1:]
    facts = launch_facts(launcher, read.sbatch)
    env = {name: value for name, value in command.env.items() if not isinstance(value, Unknown)}
    front = FrontEnd(SHELL_SCRIPT, argv, entry.rsplit("/", 1)[-1], env, facts,
                     dict(command.unresolved), origins=[origin] if origin else [])
    for name, value in command.env.items():
        if isinstance(value, Unknown):
            front.notes.append(Unmapped(name, "", f"{value}: left out of launch.env; fix: --set the "
                                        "variable it is set from"))
    if sourced:
        front.notes.append(Unmapped("source", " ".join(sourced), "read beside the launch file, as bash "
                                    "sources it (never run)"))
    for name, value in loops.items():
        front.notes.append(Unmapped("$" + name, value, "the list slime's model-file loop prints "
                                    "(NLAYERS layers, the first FIRST_K_DENSE_REPLACE dense)"))
    for cut in (c for c in read.commands if c.words and c.words[0].startswith("--")):
        front.notes.append(Unmapped(cut.words[0], " ".join(cut.words[:4]) + " …", "a command of arguments "
                                    "only: the line before it ends without `\\`, so bash ends the launch "
                                    "command there and runs these words as a command of their own (which "
                                    "fails); the entry script gets none of them; fix: end that line "
                                    "with `\\`",
                                    error=True))
    front.notes += _positional_notes(text, sets)
    if is_slime(launcher, entry):
        front = slime_front_end(front)
    elif is_mindspeed(entry, argv):
        front = mindspeed_front_end(front)
    if read.deciders:
        names = ", ".join("$" + n if not n.startswith("$") else n for n in read.deciders)
        settable = [n for n in read.deciders if not n.startswith("$")]
        reaches = bool(read.conflicts) and _branches_reach_arguments(text, {**loops, **sets}, settable,
                                                                       argv)
        if read.conflicts and not reaches:
            why = (f"decide(s) which branch of an `if`/`case` runs; the branches set "
                   f"{', '.join(read.conflicts)} differently, but the entry script's arguments are the "
                   "same whichever runs (0, 1 or empty tried)")
        elif read.conflicts:
            why = (f"decide(s) which branch of an `if`/`case` runs, and the branches set "
                   f"{', '.join(read.conflicts)} differently; every branch was read, the last one wins")
        else:
            why = "decide(s) which branch of an `if`/`case` runs; every branch was read"
        fix = " ".join(f"--set {n}=VALUE" for n in settable) or "replace them with their values"
        front.notes.append(Unmapped(names, "", f"{why}; fix: {fix}", error=reaches))
    if read.assumed_unset:
        names = ", ".join("$" + n for n in read.assumed_unset)
        front.notes.append(Unmapped(names, "", "tested by the script and not set in it: read as unset "
                                    "(empty), as bash does; fix: --set NAME=VALUE for those your job sets"))
    if read.included:
        front.notes.append(Unmapped("source", " ".join(read.included), "files the script sources are not "
                                    "read; what they set is unresolved"))
    return front


_POSITIONAL = re.compile(r"\$\{?([1-9][0-9]*)\}?")


def _positional_notes(text: str, sets: dict[str, str]) -> list[Unmapped]:
    """Values given after the script beyond the last `$N` it reads: bash never reads them, and a
    README whose list has one value the script no longer takes shifts every later one (Pai's
    Moonlight README passes 27 to a script reading 26)."""
    given = sorted(int(name) for name in sets if name.isdigit())
    read = max((int(m.group(1)) for m in _POSITIONAL.finditer(text)), default=0)
    if not given or given[-1] <= read:
        return []
    return [Unmapped(f"${read + 1}..", " ".join(sets[str(n)] for n in given if n > read),
                     f"{len(given)} values follow the script, which reads $1 to ${read}: these are never "
                     "read; if the list is the README's, check it against the script's $N assignments "
                     "(a value it no longer takes shifts every later one)")]


_TRIED = ("0", "1", "")  # a numeric test's two sides and a string test's empty one


def _branches_reach_arguments(text: str, sets: dict[str, str], settable: list[str], argv: list[str]) -> bool:
    """Whether the undecided branches change the entry script's arguments: the script read again
    with each settable decider at 0, 1 and empty (a launcher-only difference, such as slime's
    NCCL_NVLS_ENABLE in ray's runtime environment, changes no Megatron argument)."""
    if not settable:
        return True
    for value in _TRIED:
        command = launch_command(read_script(text, {**{n: value for n in settable}, **sets}))
        at = entry_index(command.words) if command is not None else None
        if at is None or command is None or command.words[at + 1:] != argv:
            return True
    return False


def arguments_front_end(text: str, origin: Path | None) -> FrontEnd:
    words = split_words(text)
    env_end = next((i for i, w in enumerate(words) if not _ENV_WORD.match(w)), len(words))
    env = dict(w.split("=", 1) for w in words[:env_end])
    rest = words[env_end:]
    if swift_at(rest) is not None:
        return swift_front_end(rest, env, [origin] if origin else [])
    if verl_at(rest) is not None:
        return _verl(rest, env, origin)
    at = entry_index(rest)
    launcher, entry, argv = (rest[:at], rest[at], rest[at + 1:]) if at is not None else ([], None, rest)
    front = FrontEnd(ARGUMENT_FILE, argv, entry.rsplit("/", 1)[-1] if entry else None, env,
                     launch_facts(launcher), origins=[origin] if origin else [])
    if entry is not None and is_mindspeed(entry, argv):
        front = mindspeed_front_end(front)
    return front


def _verl(words: list[str], env: dict[str, str], origin: Path | None) -> FrontEnd:
    """verl's trainer command (NotAnImport for its FSDP trainer)."""
    if not is_megatron(words):
        raise NotAnImport("a verl launch of its FSDP trainer (no ppo_megatron_trainer config, megatron "
                          "strategy or actor.megatron.* override): not a Megatron-LM launch, which is "
                          "what moeplan plans")
    return verl_front_end(words, env, [origin] if origin else [])


def front_end(text: str, sets: dict[str, str] | None = None, origin: Path | None = None) -> FrontEnd:
    """The front end of whichever form `text` is (NotAnImport when it is none, or when reading it
    exceeds a budget of the static reader)."""
    try:
        return _front_end(text, sets or {}, origin)
    except ScriptTooComplex as exc:
        raise NotAnImport(str(exc)) from None


def _front_end(text: str, sets: dict[str, str], origin: Path | None) -> FrontEnd:
    form = detect_form(text)
    if form == "log":
        front, _ = log_front_end(text)
        return front
    if form == "map":
        data = load_map(text)
        assert data is not None
        found = read_map(data, sets)
        return FrontEnd(found.form, found.argv, env=found.env, unresolved=found.unresolved,
                        origins=[origin] if origin else [])
    if form == "bridge":
        front = bridge_front_end(text)
        front.origins = [origin] if origin else []
        return front
    if form == "primus":
        try:
            return primus_front_end(text, sets, origin)
        except PrimusUnreadable as exc:
            raise NotAnImport(str(exc)) from None
    if form == "script":
        return script_front_end(text, sets, origin)
    return arguments_front_end(text, origin)


def import_text(text: str, sets: dict[str, str] | None = None, world_size: int | None = None,
                origin: Path | None = None) -> tuple[Imported, FrontEnd]:
    """The imported config of any input form, and the front end that read it."""
    front = front_end(text, sets, origin)
    return assemble(front, world_size), front

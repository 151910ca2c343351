"""How many ranks a launch starts, read from the launcher words before the entry script and the
`#SBATCH` lines: torchrun / `python -m torch.distributed.run` (`--nnodes`, `--nproc-per-node`),
srun (`-N/--nodes`, `-n/--ntasks`, `--ntasks-per-node`, `--gpus-per-node`), mpirun / mpiexec
(`-np/-n`, `-npernode`, `-ppn`, `--map-by ppr:N:node`), and sbatch's own `--nodes`,
`--ntasks-per-node`, `--gpus-per-node`.

torchrun starts `nproc-per-node` ranks on each of `nnodes` nodes (torch/distributed/run.py); srun
and mpirun start one rank per task, which is how Megatron reads WORLD_SIZE and RANK without
torchrun (megatron/training/initialize.py _initialize_distributed takes them from the environment).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TORCHRUN_MODULES = {"torch.distributed.run", "torch.distributed.launch"}
_TORCHRUN = {"--nnodes": "nodes", "--nproc-per-node": "per_node", "--nproc_per_node": "per_node"}
_SRUN = {"-N": "nodes", "--nodes": "nodes", "-n": "tasks", "--ntasks": "tasks",
         "--ntasks-per-node": "per_node", "--gpus-per-node": "gpus_per_node"}
_MPIRUN = {"-np": "tasks", "-n": "tasks", "--np": "tasks", "-npernode": "per_node",
           "--npernode": "per_node", "-ppn": "per_node", "--ppn": "per_node", "-N": "per_node"}
_SBATCH = {"nodes": "nodes", "ntasks": "tasks", "ntasks-per-node": "per_node",
           "gpus-per-node": "gpus_per_node"}
_PPR = re.compile(r"ppr:(\d+):node")
DUMP_LAUNCHER = "dump"  # the facts come from a training log's argument dump, not a launcher


@dataclass
class LaunchFacts:
    """Ranks per node, nodes, total ranks and where each came from; values that are not numbers are
    listed (a `$SLURM_NNODES` the script leaves to the job) instead of guessed."""

    launcher: str = ""  # torchrun, srun, mpirun, python, or "" (no launcher in the words)
    nodes: int | None = None
    per_node: int | None = None
    world_size: int | None = None
    sources: list[str] = field(default_factory=list)  # "torchrun --nnodes 2", "#SBATCH --nodes=2"
    not_numbers: list[tuple[str, str]] = field(default_factory=list)  # (option, value)
    # the container the ranks run in (pyxis's srun/sbatch --container-image): a NeMo container's
    # tag names the Megatron-LM it ships (planner/config/megatron_releases.py)
    container_image: str | None = None

    @property
    def summary(self) -> str:
        if self.launcher == DUMP_LAUNCHER:
            return f"world_size {self.world_size}" if self.world_size else "no world_size in the dump"
        if self.world_size is None:
            return self.launcher or "no launcher"
        shape = f"{self.nodes} node(s) x {self.per_node}" if self.nodes and self.per_node else ""
        return f"{self.launcher}: {self.world_size} rank(s)" + (f" ({shape})" if shape else "")


def _options(words: list[str], table: dict[str, str]) -> dict[str, tuple[str, str]]:
    """option → (its name in `table`, value) for `--opt V`, `--opt=V` and `-nV` spellings."""
    found: dict[str, tuple[str, str]] = {}
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if flag not in table and len(word) > 2 and word[:2] in table and not word.startswith("--"):
            flag, eq, value = word[:2], "=", word[2:]  # srun -N2
        if flag in table:
            if not eq:
                value = words[i + 1] if i + 1 < len(words) else ""
            found[table[flag]] = (flag, value)
        elif flag == "--map-by" or flag == "-map-by":
            target = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            if match := _PPR.search(target):
                found["per_node"] = (flag, match.group(1))
    return found


def _programs(words: list[str]) -> list[tuple[str, list[str]]]:
    """The launcher programs in the words, each with the words that follow it up to the next one."""
    found: list[tuple[str, int]] = []
    for i, word in enumerate(words):
        name = word.rsplit("/", 1)[-1]
        if name == "torchrun" or (word == "-m" and i + 1 < len(words) and words[i + 1] in _TORCHRUN_MODULES):
            found.append(("torchrun", i))
        elif name == "srun":
            found.append(("srun", i))
        elif name in ("mpirun", "mpiexec"):
            found.append(("mpirun", i))
        elif re.fullmatch(r"python[0-9.]*", name):
            found.append(("python", i))
    return [(name, words[at + 1:(found[k + 1][1] if k + 1 < len(found) else len(words))])
            for k, (name, at) in enumerate(found)]


def _container_image(launcher: list[str], sbatch: dict[str, str] | None) -> str | None:
    """pyxis's `--container-image IMG` (or `=IMG`) on the launch line, else on an #SBATCH line."""
    for i, word in enumerate(launcher):
        flag, eq, value = word.partition("=")
        if flag == "--container-image":
            return value if eq else (launcher[i + 1] if i + 1 < len(launcher) else None)
    return (sbatch or {}).get("container-image")


def launch_facts(launcher: list[str], sbatch: dict[str, str] | None = None) -> LaunchFacts:
    facts = LaunchFacts(container_image=_container_image(launcher, sbatch))
    values: dict[str, tuple[str, str]] = {}
    names = []
    for name, words in _programs(launcher):
        names.append(name)
        table = {"torchrun": _TORCHRUN, "srun": _SRUN, "mpirun": _MPIRUN}.get(name, {})
        for key, (flag, value) in _options(words, table).items():
            # a later launcher (torchrun under srun) wins, unless its value is not a number
            if key in values and values[key][1].isdigit() and not value.isdigit():
                continue
            values[key] = (f"{name} {flag} {value}", value)
    for option, key in _SBATCH.items():  # the job's allocation, where the launch line does not count
        if sbatch and option in sbatch and (key not in values or not values[key][1].isdigit()):
            if sbatch[option].isdigit() or key not in values:
                values[key] = (f"#SBATCH --{option}={sbatch[option]}", sbatch[option])
    facts.launcher = "torchrun" if "torchrun" in names else next(iter(names), "")
    numbers: dict[str, int] = {}
    for key, (where, value) in values.items():
        if value.isdigit() and int(value) > 0:
            numbers[key] = int(value)
            facts.sources.append(where)
        else:
            facts.not_numbers.append((where.rsplit(" ", 1)[0], value))
    if facts.launcher == "torchrun":
        facts.nodes = numbers.get("nodes", 1 if "nodes" not in values else None)
        facts.per_node = numbers.get("per_node", 1 if "per_node" not in values else None)
    elif facts.launcher in ("srun", "mpirun") or numbers:
        facts.nodes = numbers.get("nodes")
        facts.per_node = numbers.get("per_node", numbers.get("gpus_per_node"))
        if "tasks" in numbers:
            facts.world_size = numbers["tasks"]
            if facts.nodes and not facts.per_node and numbers["tasks"] % facts.nodes == 0:
                facts.per_node = numbers["tasks"] // facts.nodes
            if facts.per_node and not facts.nodes and numbers["tasks"] % facts.per_node == 0:
                facts.nodes = numbers["tasks"] // facts.per_node
    elif facts.launcher == "python":
        facts.nodes, facts.per_node = 1, 1  # one process: Megatron's WORLD_SIZE defaults to 1
        facts.sources.append("a plain `python` launch runs one rank")
    if facts.world_size is None and facts.nodes and facts.per_node:
        facts.world_size = facts.nodes * facts.per_node
    return facts

"""What a launch script will not accept from the `launch:` section, and why.

Quoting (render.py) makes any printable string inert in bash. Two things quoting cannot fix:
control characters — a newline inside an `#SBATCH` value ends the directive, and the rest of the
line becomes a shell command — and environment-variable *names*, which are never quoted. Those are
refused here, before anything is rendered, with the field to blame.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from planner.config.schema import Config

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Variables that change how bash itself runs the script (or its child shells).
SHELL_INTERNAL_NAMES = frozenset({
    "IFS", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "PS4", "CDPATH", "GLOBIGNORE",
    "BASH_XTRACEFD", "PROMPT_COMMAND",
})
# Variables that change which programs and libraries the script runs: `torchrun` and `python`
# are found through PATH, and the dynamic loader (ld.so(8)) runs LD_PRELOAD / LD_AUDIT code in
# every process. Refused like the shell's own variables; set them outside moeplan if you mean it.
PROGRAM_CHOICE_NAMES = frozenset({"PATH", "LD_PRELOAD", "LD_AUDIT"})

# launch.env is an allow-list: the variables the stack a Megatron job runs on reads to tune
# itself, by prefix or by name. Anything else — PYTHONPATH, PYTHONHOME, PYTHONSTARTUP,
# PYTHONWARNINGS (its category is imported), LD_LIBRARY_PATH, a package's own hooks — can make
# every rank import or load code of the config's choosing, so it is refused, named, with the fix:
# set it in the environment the job is launched from.
ALLOWED_ENV_PREFIXES = (
    "NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "NVTE_", "NVSHMEM_", "UB_", "UCX_",
    "UCC_", "FI_", "GLOO_", "CUBLAS_", "CUBLASLT_", "CUDNN_", "NVIDIA_", "MEGATRON_", "HF_",
    "TRANSFORMERS_", "WANDB_", "RCCL_", "HIP_", "HSA_", "ROCM_", "LCE_",
)
ALLOWED_ENV_NAMES = frozenset({
    "TOKENIZERS_PARALLELISM", "MAMBA_DETERMINISTIC", "DYNAMO_CACHE_SIZE_LIMIT", "FP4_RECIPE",
    "TRITON_CACHE_AUTOTUNING", "GPU_MAX_HW_QUEUES", "TZ", "LANG", "LC_ALL",
})
# Inside the allowed prefixes, the names that choose code: where CUDA's compiler and libraries
# come from, and the caches of compiled extensions a rank loads without building them again
# (torch.utils.cpp_extension, TorchInductor and Triton read these folders' .so files).
CODE_CHOICE_NAMES = frozenset({
    "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR",
    "PYTORCH_KERNEL_CACHE_PATH", "TORCH_HOME", "HF_MODULES_CACHE", "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN", "NCCL_CONF_FILE", "HIP_PATH",
    "ROCM_PATH", "ROCM_HOME",
})


def env_refusal(name: str) -> str | None:
    """Why launch.env may not set `name` (None: it may)."""
    if name in SHELL_INTERNAL_NAMES or name.startswith("BASH_FUNC_"):
        return f"{name} changes how bash runs the launch script itself"
    if name in PROGRAM_CHOICE_NAMES or name in CODE_CHOICE_NAMES:
        return f"{name} changes which programs, libraries or compiled code every rank runs"
    if name in ALLOWED_ENV_NAMES or name.startswith(ALLOWED_ENV_PREFIXES):
        return None
    return (f"{name} is not a variable launch.env passes (it takes the tuning variables of the "
            f"stack: {', '.join(p + '*' for p in ALLOWED_ENV_PREFIXES[:8])}, … and Megatron's own); "
            "a variable such as PYTHONPATH or LD_LIBRARY_PATH could make every rank import code of "
            "the config's choosing")

# sbatch options the batch script derives from the plan or from dedicated launch fields.
MANAGED_SBATCH_OPTIONS: dict[str, str] = {
    "--nodes": "cluster.nodes", "-N": "cluster.nodes",
    "--ntasks-per-node": "the plan (one torchrun agent per node)",
    "--ntasks": "the plan (one torchrun agent per node)", "-n": "the plan (one torchrun agent per node)",
    "--gpus-per-node": "cluster.gpus_per_node",
    "--cpus-per-task": "launch.cpus_per_task", "-c": "launch.cpus_per_task",
    "--job-name": "launch.job_name", "-J": "launch.job_name",
    "--output": "launch.output_dir", "-o": "launch.output_dir",
    "--error": "launch.output_dir", "-e": "launch.output_dir",
    "--partition": "launch.partition", "-p": "launch.partition",
    "--account": "launch.account", "-A": "launch.account",
    "--time": "launch.time", "-t": "launch.time",
}


# Every long option sbatch 22.05 accepts (`sbatch --help`, `sbatch --usage`; Slurm's
# src/common/slurm_opt.c common_options). sbatch parses with getopt_long(3), which takes any
# unambiguous prefix of a long option ("--outp" is --output) and an exact name before a prefix
# ("--gpus" is --gpus, not --gpus-per-node): an entry is refused when it resolves to a managed
# option, or is a prefix of one and so would be ambiguous.
SBATCH_LONG_OPTIONS = frozenset("""
account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment constraint
container contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline
delay-boot dependency distribution error exclude exclusive export export-file extra-node-info
get-user-env gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres
gres-flags help hint hold ignore-pbs input job-name kill-on-invalid-dep licenses mail-type
mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network nice no-kill no-requeue
nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket
open-mode output overcommit oversubscribe parsable partition power prefer priority profile
propagate qos quiet reboot requeue reservation signal sockets-per-node spread-job switches
test-only thread-spec threads-per-core time time-min tmp tres-per-task uid umask usage
use-min-nodes verbose version wait wait-all-nodes wckey wrap
""".split())
# sbatch's short options that take an argument (the rest are flags: -H -O -Q -s -v -W -h -V -u
# -k): in a bundle such as `-Qo/x` each flag is read until one that takes the rest as its value.
SBATCH_SHORT_WITH_VALUE = frozenset("AaBbCcDdeFGiJLMmNnopqSTtwx")
# Slurm expands `%j`, `%x`, `%A` … in --output/--error names (sbatch(1) "filename pattern"); a
# literal % in launch.output_dir is written %% so the path is the one the user wrote.
_PATTERN = re.compile(r"%")


class EmitError(ValueError):
    """A config that is valid for planning but cannot be written as a safe launch script."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


def _strings(cfg: Config) -> Iterator[tuple[str, str]]:
    launch = cfg.launch
    for name in ("job_name", "partition", "account", "time", "container_image", "output_dir"):
        value = getattr(launch, name)
        if value is not None:
            yield f"launch.{name}", value
    for index, entry in enumerate(launch.extra_sbatch):
        yield f"launch.extra_sbatch[{index}]", entry
    for key, value in launch.env.items():
        yield f"launch.env.{key}", key
        yield f"launch.env.{key}", value
    for index, entry in enumerate(launch.megatron_extra_args):
        yield f"launch.megatron_extra_args[{index}]", entry


def _option_name(entry: str) -> str:
    """`--time=1:00` → `--time`; `-t1:00` → `-t`; `--exclusive` → `--exclusive`."""
    if entry.startswith("--"):
        return entry.split("=", 1)[0]
    return entry[:2]


def managed_option(entry: str) -> str | None:
    """The managed sbatch option an extra_sbatch entry sets, as sbatch would read it (None: it
    sets none): a long option by exact name or unambiguous prefix, each short option of a bundle."""
    if entry.startswith("--"):
        name = entry[2:].split("=", 1)[0]
        if name in SBATCH_LONG_OPTIONS:
            return f"--{name}" if f"--{name}" in MANAGED_SBATCH_OPTIONS else None
        managed = sorted(option for option in MANAGED_SBATCH_OPTIONS
                         if option.startswith("--") and name and option[2:].startswith(name))
        return managed[0] if managed else None
    for letter in entry[1:]:
        if f"-{letter}" in MANAGED_SBATCH_OPTIONS:
            return f"-{letter}"
        if letter in SBATCH_SHORT_WITH_VALUE:
            return None
    return None


def exported_names(entry: str) -> list[str]:
    """The variable names an `--export=…` entry (or its prefixes, `--exp=`) sets to a value for the
    job (`NAME=value`; ALL, NONE and a bare NAME pass on the submitter's own environment)."""
    name, _, value = entry.partition("=")
    if not entry.startswith("--") or len(name) < 5 or not "--export".startswith(name):
        return []
    return [item.split("=", 1)[0] for item in value.split(",") if "=" in item]


def slurm_literal(path: str) -> str:
    """A path as an --output/--error filename: `%` doubled so Slurm expands none of the user's."""
    return _PATTERN.sub("%%", path)


def check_launch_strings(cfg: Config) -> None:
    """Raise EmitError for the first launch value no script can carry safely."""
    for path, value in _strings(cfg):
        match = _CONTROL.search(value)
        if match:
            raise EmitError(path, f"contains the control character {match.group()!r}; launch values must "
                            "be single-line printable text")
    launch = cfg.launch
    for name in ("job_name", "time", "output_dir"):
        if not getattr(launch, name).strip():
            raise EmitError(f"launch.{name}", "must not be empty")
    for key in launch.env:
        if not _ENV_NAME.fullmatch(key):
            raise EmitError(f"launch.env.{key}", f"{key!r} is not a valid environment variable name "
                            "(letters, digits and _, not starting with a digit)")
        why = env_refusal(key)
        if why:
            raise EmitError(f"launch.env.{key}", f"{why}; set it in the environment you launch "
                            "from if you really need it")
    for index, entry in enumerate(launch.extra_sbatch):
        path = f"launch.extra_sbatch[{index}]"
        if not entry.startswith("-") or entry.strip() != entry or entry in ("-", "--"):
            raise EmitError(path, f"{entry!r} is not one sbatch option; write each option as a single "
                            "word such as '--exclusive' or '--gres=gpu:8'")
        option = managed_option(entry)
        if option is not None:
            written = _option_name(entry)
            if written == option:
                named = ""
            elif entry.startswith("--"):
                named = f"{written} abbreviates {option}: "
            else:
                named = f"{entry[:12]!r} bundles short options, one of them {option}: "
            raise EmitError(path, f"{named}{option} is set by moeplan from "
                            f"{MANAGED_SBATCH_OPTIONS[option]}; change it there")
        for name in exported_names(entry):
            why = env_refusal(name)
            if why:
                raise EmitError(path, f"--export sets {name}, which launch.env refuses ({why}); set "
                                "it outside moeplan")


def check_slurm_paths(cfg: Config) -> None:
    """What the batch script's --output/--error need (the other launchers write no log files):
    the log folder inside the run folder, and a job name that is one file name (%x)."""
    launch = cfg.launch
    _check_output_dir(launch.output_dir)
    if "/" in launch.job_name or len(launch.job_name.encode("utf-8")) > 200:
        raise EmitError("launch.job_name", f"{launch.job_name[:40]!r}: Slurm writes the logs to "
                        "<output_dir>/<job name>-<job id>.out, so the name must be one file name "
                        "(no '/', at most 200 bytes)")


def _check_output_dir(output_dir: str) -> None:
    """launch.output_dir is where Slurm opens the job's logs: a relative path stays inside the run
    folder (no `..`), and no part is a name a file system cannot hold."""
    parts = output_dir.split("/")
    if not output_dir.startswith("/") and ".." in parts:
        raise EmitError("launch.output_dir", f"{output_dir!r} climbs out of the run folder with '..'; "
                        "give a folder inside it (e.g. logs) or an absolute path")
    for part in parts:
        if len(part.encode("utf-8")) > 200:
            raise EmitError("launch.output_dir", f"the folder name {part[:20]!r}… is longer than a file "
                            "system allows once Slurm adds the job name; shorten it")

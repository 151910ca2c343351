"""`moeplan emit`: the files it writes, what it refuses, what the scripts do when bash runs them
(with fake python / srun / scontrol that record their arguments), hostile strings in every
templated field, the Megatron-LM argument list of the V4-Pro example flag by flag, shellcheck.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.cli import app
from planner.config.loader import load_config, parse_config
from planner.emit import EmitError
from planner.emit.megatron import MegatronArgs, megatron_arguments
from planner.emit.render import sbatch_quote, shquote
from planner.plan_format import read_plan
from planner.rules import run_rules
from planner.rules.example_base import example_config_data, merge
from planner.rules.facts import Facts
from tests.support.paths import EXAMPLES

TINY = EXAMPLES / "tiny-cpu-8.yaml"
V4_PRO = EXAMPLES / "deepseek-v4-pro-1024.yaml"
SCRIPTS = ("torchrun.sh", "job.sbatch", "megatron_args.sh")
runner = CliRunner()


# ----------------------------------------------------------------------------------- helpers


def emit(*args: str | Path) -> Any:
    result = runner.invoke(app, ["emit", *(str(a) for a in args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def tiny_data() -> dict[str, Any]:
    return yaml.safe_load(TINY.read_text())


def write_config(folder: Path, data: dict[str, Any], name: str = "config.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


def assert_valid(data: dict[str, Any]) -> None:
    errors = [f for f in run_rules(parse_config(data)) if f.severity == "error"]
    assert not errors, errors


def sbatch_words(line: str) -> list[str]:
    """How sbatch itself splits one `#SBATCH` line (Slurm src/sbatch/opt.c, _get_argument): blanks
    separate words, ' and " group, a backslash escapes the next character anywhere, and an
    unquoted # ends the line."""
    text, words, i = line[len("#SBATCH"):], [], 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        word, quote, escaped, started = [], "", False, False
        while i < len(text) and (quote or not text[i].isspace()):
            ch = text[i]
            i += 1
            if escaped:
                word.append(ch)
                escaped = False
            elif ch == "\\":
                escaped, started = True, True
            elif quote:
                if ch == quote:
                    quote = ""
                else:
                    word.append(ch)
            elif ch in "'\"":
                quote, started = ch, True
            elif ch == "#":
                i = len(text)
                break
            else:
                word.append(ch)
                started = True
        if started:
            words.append("".join(word))
    return words


def directives(script: str) -> list[str]:
    """Every #SBATCH word, in order, from the directive block sbatch reads (before the first command)."""
    words = []
    for line in script.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            words.extend(sbatch_words(line))
        elif line and not line.startswith("#"):
            break
    return words


def directive_map(script: str) -> dict[str, str]:
    return dict(word.split("=", 1) if "=" in word else (word, "") for word in directives(script))


FAKE_RECORDER = """#!{python}
import json, os, sys
with open(os.environ["FAKE_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps({{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                          "env": dict(os.environ)}}) + "\\n")
"""

FAKE_SCONTROL = """#!/usr/bin/env bash
if [[ $1 == show && $2 == hostnames ]]; then
    printf '%s\\n' node-a node-b
elif [[ $1 == show && $2 == node ]]; then
    printf 'NodeName=%s Arch=x86_64 CoresPerSocket=1\\n   NodeAddr=10.1.2.3 NodeHostName=%s\\n' "$3" "$3"
else
    exit 1
fi
"""


@pytest.fixture
def fakes(tmp_path: Path) -> dict[str, Any]:
    """A bin folder with a recording `python` and `srun` and a canned `scontrol`."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    recorder = FAKE_RECORDER.format(python=sys.executable)
    for name in ("fakepython", "srun"):
        (bin_dir / name).write_text(recorder)
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log),
           "PYTHON": str(bin_dir / "fakepython"), "HOME": str(tmp_path)}
    return {"env": env, "log": log, "python": str(bin_dir / "fakepython")}


def run_script(script: Path, fakes: dict[str, Any], *args: str, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run a launcher under bash with the fakes; return the result and the recorded calls."""
    full_env = {key: value for key, value in os.environ.items()
                if not key.startswith(("SLURM_", "MASTER_", "NNODES", "NPROC", "NODE_RANK", "RDZV",
                                       "MOEPLAN_", "OMP_"))}
    full_env.update(fakes["env"])
    full_env.update(env or {})
    log: Path = fakes["log"]
    log.unlink(missing_ok=True)
    result = subprocess.run(["bash", str(script), *args], env=full_env, cwd=cwd or script.parent,
                            capture_output=True, text=True, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls


def slurm_env(run_dir: Path, nodes: int = 2, cpus: int = 16) -> dict[str, str]:
    return {"SLURM_SUBMIT_DIR": str(run_dir), "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_CPUS_PER_TASK": str(cpus)}


@pytest.fixture(scope="module")
def tiny_all(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "run"
    result = emit("all", TINY, "-o", out)
    assert result.exit_code == 0, result.output
    return out


# ------------------------------------------------------------------------- files and refusals


def test_emit_all_writes_the_plan_and_three_executable_scripts(tiny_all: Path):
    plan = read_plan(tiny_all / "plan.json")  # a valid, untampered plan
    assert stat.S_IMODE((tiny_all / "plan.json").stat().st_mode) == 0o644
    for name in SCRIPTS:
        path = tiny_all / name
        text = path.read_text()
        assert stat.S_IMODE(path.stat().st_mode) == 0o755, name
        assert text.startswith("#!/usr/bin/env bash\n"), name
        assert "\nset -euo pipefail\n" in text, name
        assert f"#   plan plan.json {plan['digest']}\n" in text, name
        assert f"#   moeplan 0.1.0 from config {TINY}\n" in text, name
        assert "#   N=8: TP1 CP2 PP1 DP4 | ETP2 EP2 EDP2, order tp-cp-ep-dp-pp\n" in text, name
    assert (tiny_all / "logs").is_dir()  # Slurm cannot open --output in a missing folder
    assert sorted(p.name for p in tiny_all.iterdir()) == sorted(["plan.json", "logs", "bridge_overrides.txt",
                                                                 *SCRIPTS])
    assert stat.S_IMODE((tiny_all / "bridge_overrides.txt").stat().st_mode) == 0o644


@pytest.mark.parametrize("target, name", [("torchrun", "torchrun.sh"), ("slurm", "job.sbatch"),
                                          ("megatron", "megatron_args.sh")])
def test_one_target_writes_the_plan_and_only_its_script(tmp_path: Path, target: str, name: str):
    result = emit(target, TINY, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    expected = {"plan.json", name} | ({"logs"} if target == "slurm" else set())
    assert {p.name for p in (tmp_path / "out").iterdir()} == expected


def test_a_config_with_errors_is_refused_and_nothing_is_written(tmp_path: Path):
    data = tiny_data()
    data["parallel"]["ep"] = 3  # 8 experts over EP 3, 8 ranks over ETP2 x EP3: errors
    result = emit("all", write_config(tmp_path, data), "-o", tmp_path / "out")
    assert result.exit_code == 1
    assert "error" in result.output
    assert not (tmp_path / "out").exists()


def test_unreadable_config_is_a_usage_error(tmp_path: Path):
    result = emit("all", tmp_path / "missing.yaml", "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert not (tmp_path / "out").exists()


def test_unknown_target_is_a_usage_error(tmp_path: Path):
    result = emit("kubernetes", TINY, "-o", tmp_path / "out")
    assert result.exit_code == 2


def test_existing_files_are_not_overwritten_without_force(tmp_path: Path):
    out = tmp_path / "out"
    assert emit("torchrun", TINY, "-o", out).exit_code == 0
    (out / "torchrun.sh").write_text("# mine\n")
    result = emit("all", TINY, "-o", out)
    assert result.exit_code == 2
    assert "--force" in result.output
    assert (out / "torchrun.sh").read_text() == "# mine\n"
    assert not (out / "job.sbatch").exists()  # refused as a whole, not file by file
    result = emit("all", TINY, "-o", out, "--force")
    assert result.exit_code == 0, result.output
    assert (out / "torchrun.sh").read_text().startswith("#!/usr/bin/env bash")
    assert (out / "job.sbatch").exists()


def test_output_that_is_a_file_is_a_usage_error(tmp_path: Path):
    target = tmp_path / "file"
    target.write_text("x")
    assert emit("all", TINY, "-o", target).exit_code == 2
    assert target.read_text() == "x"


def test_dry_run_prints_everything_and_writes_nothing(tmp_path: Path):
    out = tmp_path / "out"
    result = emit("all", TINY, "-o", out, "--dry-run")
    assert result.exit_code == 0, result.output
    assert not out.exists()
    for name in ("plan.json", *SCRIPTS):
        assert f"create {out / name} (mode" in result.output
    assert f"create folder {out / 'logs'}" in result.output
    for name in SCRIPTS:
        assert f"===== {out / name} =====\n#!/usr/bin/env bash" in result.output
    assert "set -euo pipefail" in result.output


def test_a_failed_write_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    out = tmp_path / "out"
    real_replace = os.replace

    def failing_replace(src: str, dst: str) -> None:
        if str(dst).endswith("job.sbatch"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    result = emit("all", TINY, "-o", out)
    assert result.exit_code == 2
    assert "No space left on device" in result.output
    assert not out.exists()  # the run folder whole or not at all: the plan renamed before is gone


def test_a_disk_full_midway_leaves_the_run_folder_as_it_was(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch):
    """The third file's write fails: no file of the set is renamed into place, no temporary file
    stays, and an existing folder keeps what it held."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    real_fdopen = os.fdopen
    opened = []

    def filling_fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        opened.append(fd)
        if len(opened) == 3:
            os.close(fd)
            raise OSError(28, "No space left on device")
        return real_fdopen(fd, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", filling_fdopen)
    result = emit("all", TINY, "-o", out)
    assert result.exit_code == 2 and "No space left on device" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


# ------------------------------------------------------------------------- torchrun.sh, run by bash


def test_torchrun_single_node_command_line(tiny_all: Path, fakes: dict[str, Any]):
    result, calls = run_script(tiny_all / "torchrun.sh", fakes)
    assert result.returncode == 0, result.stderr
    [call] = calls
    assert call["argv"] == [
        "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "8",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29500", "--rdzv-id", "tiny-cpu-8",
        "-m", "runtime", "--plan", str(tiny_all / "plan.json"), "--report", str(tiny_all / "report.json"),
        "--steps", "2", "--check-reference",
    ]
    assert call["env"]["OMP_NUM_THREADS"] == "1"


def test_torchrun_passes_extra_arguments_to_the_runtime(tiny_all: Path, fakes: dict[str, Any]):
    _, [call] = run_script(tiny_all / "torchrun.sh", fakes, "--steps", "5", "--seed", "7")
    assert call["argv"][-4:] == ["--steps", "5", "--seed", "7"]


def test_torchrun_multi_node_from_the_environment(tiny_all: Path, fakes: dict[str, Any]):
    env = {"NNODES": "2", "NPROC_PER_NODE": "4", "MASTER_ADDR": "head.example", "MASTER_PORT": "6000",
           "RDZV_ID": "job-17", "OMP_NUM_THREADS": "3"}
    result, [call] = run_script(tiny_all / "torchrun.sh", fakes, env=env)
    assert result.returncode == 0, result.stderr
    assert call["argv"][2:12] == ["--nnodes", "2", "--nproc-per-node", "4", "--rdzv-backend", "c10d",
                                  "--rdzv-endpoint", "head.example:6000", "--rdzv-id", "job-17"]
    assert call["env"]["OMP_NUM_THREADS"] == "3"


def test_torchrun_static_rendezvous_with_node_rank(tiny_all: Path, fakes: dict[str, Any]):
    env = {"NNODES": "2", "NPROC_PER_NODE": "4", "MASTER_ADDR": "10.0.0.1", "NODE_RANK": "1"}
    result, [call] = run_script(tiny_all / "torchrun.sh", fakes, env=env)
    assert result.returncode == 0, result.stderr
    assert call["argv"][2:14] == ["--nnodes", "2", "--nproc-per-node", "4", "--rdzv-backend", "static",
                                  "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29500"]


@pytest.mark.parametrize("env, message", [
    ({"NNODES": "2"}, "the plan has 8 ranks"),
    ({"NNODES": "2", "NPROC_PER_NODE": "4"}, "needs MASTER_ADDR"),
    ({"NPROC_PER_NODE": "4"}, "the plan has 8 ranks"),
])
def test_torchrun_refuses_a_shape_that_does_not_match_the_plan(tiny_all: Path, fakes: dict[str, Any],
                                                               env: dict[str, str], message: str):
    result, calls = run_script(tiny_all / "torchrun.sh", fakes, env=env)
    assert result.returncode == 2
    assert message in result.stderr
    assert calls == []


def test_torchrun_refuses_a_plan_it_was_not_emitted_for(tmp_path: Path, fakes: dict[str, Any]):
    out = tmp_path / "out"
    assert emit("torchrun", TINY, "-o", out).exit_code == 0
    other = tiny_data()
    other["training"]["seed"] = 99
    assert runner.invoke(app, ["compile", str(write_config(tmp_path, other)), "-o", str(out / "plan.json"),
                               "--force"]).exit_code == 0
    result, calls = run_script(out / "torchrun.sh", fakes)
    assert result.returncode == 2 and "re-run moeplan emit" in result.stderr and calls == []
    (out / "plan.json").unlink()
    result, calls = run_script(out / "torchrun.sh", fakes)
    assert result.returncode == 2 and "plan.json is missing" in result.stderr and calls == []


def test_runtime_flags_follow_the_launch_and_moe_sections(tmp_path: Path, fakes: dict[str, Any]):
    data = tiny_data()
    data["launch"].update(steps=3, check_reference=False)
    data["moe"]["moe_router_force_load_balancing"] = True
    out = tmp_path / "out"
    assert emit("torchrun", write_config(tmp_path, data), "-o", out).exit_code == 0
    _, [call] = run_script(out / "torchrun.sh", fakes)
    runtime = call["argv"][call["argv"].index("runtime") + 1:]
    assert runtime == ["--plan", str(out / "plan.json"), "--report", str(out / "report.json"),
                       "--steps", "3", "--balanced"]


def test_launch_env_is_exported_literally(tmp_path: Path, fakes: dict[str, Any]):
    data = tiny_data()
    data["launch"]["env"] = {"NCCL_DEBUG": "INFO", "WANDB_DIR": "$HOME/x:${PATH}", "NVTE_EMPTY": ""}
    out = tmp_path / "out"
    assert emit("torchrun", write_config(tmp_path, data), "-o", out).exit_code == 0
    _, [call] = run_script(out / "torchrun.sh", fakes)
    assert call["env"]["NCCL_DEBUG"] == "INFO"
    assert call["env"]["WANDB_DIR"] == "$HOME/x:${PATH}"
    assert call["env"]["NVTE_EMPTY"] == ""


# ------------------------------------------------------------------------- job.sbatch


def slurm_config(tmp_path: Path, **launch: Any) -> Path:
    data = tiny_data()
    data["parallel"]["world_size"] = 16
    data["cluster"].update(nodes=2, gpus_per_node=8)
    data["training"]["global_batch_size"] = 16
    data["launch"].update(launch)
    assert_valid(data)
    return write_config(tmp_path, data)


def test_sbatch_directives(tmp_path: Path):
    config = slurm_config(tmp_path, partition="gpu", account="proj-7", time="2-00:00:00",
                          extra_sbatch=["--exclusive", "--gres=gpu:8", "--constraint=h100&ib"],
                          output_dir="/scratch/logs", cpus_per_task=64)
    assert emit("slurm", config, "-o", tmp_path / "out").exit_code == 0
    assert directives((tmp_path / "out" / "job.sbatch").read_text()) == [
        "--job-name=tiny-cpu-8", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8",
        "--cpus-per-task=64", "--time=2-00:00:00", "--partition=gpu", "--account=proj-7",
        "--output=/scratch/logs/%x-%j.out", "--error=/scratch/logs/%x-%j.err",
        "--exclusive", "--gres=gpu:8", "--constraint=h100&ib",
    ]
    assert not (tmp_path / "out" / "scratch").exists()  # absolute log folders live on the cluster


def test_sbatch_defaults_one_cpu_per_rank_without_partition_or_account(tiny_all: Path):
    found = directive_map((tiny_all / "job.sbatch").read_text())
    assert found["--cpus-per-task"] == "8"
    assert "--partition" not in found and "--account" not in found
    assert found["--output"] == "logs/%x-%j.out"


def test_sbatch_body_starts_torchrun_on_every_node(tmp_path: Path, fakes: dict[str, Any]):
    out = tmp_path / "out"
    assert emit("slurm", slurm_config(tmp_path, cpus_per_task=16), "-o", out).exit_code == 0
    result, [call] = run_script(out / "job.sbatch", fakes, "--seed", "3", env=slurm_env(out),
                                cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert call["prog"] == "srun"
    assert call["argv"] == [
        "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=16", "--kill-on-bad-exit=1",
        fakes["python"], "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=8",
        "--rdzv-backend=c10d", "--rdzv-endpoint=10.1.2.3:29500", "--rdzv-id=4242",
        "-m", "runtime", "--plan", str(out / "plan.json"), "--report", str(out / "report.json"),
        "--steps", "2", "--check-reference", "--seed", "3",
    ]
    assert call["env"]["OMP_NUM_THREADS"] == "2"  # 16 CPUs per task over 8 ranks


def test_sbatch_container_image_pyxis_style(tmp_path: Path, fakes: dict[str, Any]):
    out = tmp_path / "out"
    config = slurm_config(tmp_path, container_image="nvcr.io#nvidia/pytorch:26.06-py3")
    assert emit("slurm", config, "-o", out).exit_code == 0
    _, [call] = run_script(out / "job.sbatch", fakes, env=slurm_env(out))
    assert call["argv"][4:7] == ["--container-image=nvcr.io#nvidia/pytorch:26.06-py3",
                                 f"--container-mounts={out}:{out}", f"--container-workdir={out}"]


def test_sbatch_refuses_to_start_without_its_plan(tmp_path: Path, fakes: dict[str, Any]):
    out = tmp_path / "out"
    assert emit("slurm", slurm_config(tmp_path), "-o", out).exit_code == 0
    result, calls = run_script(out / "job.sbatch", fakes, env=slurm_env(tmp_path))  # wrong submit dir
    assert result.returncode == 2 and "MOEPLAN_RUN_DIR" in result.stderr and calls == []
    env = slurm_env(tmp_path) | {"MOEPLAN_RUN_DIR": str(out)}
    result, calls = run_script(out / "job.sbatch", fakes, env=env)
    assert result.returncode == 0 and len(calls) == 1


# ------------------------------------------------------------------------- refused launch values


@pytest.mark.parametrize("field, value, message", [
    ("job_name", "evil\ntouch PWNED", "control character"),
    ("partition", "gpu\r", "control character"),
    ("account", "a\x00b", "control character"),
    ("time", "1:00\n#SBATCH --uid=0", "control character"),
    ("output_dir", "logs\n", "control character"),
    ("container_image", "img\nrm -rf ~", "control character"),
    ("job_name", "  ", "must not be empty"),
    ("extra_sbatch", ["--exclusive\n--uid=0"], "control character"),
    ("extra_sbatch", ["exclusive"], "not one sbatch option"),
    ("extra_sbatch", ["--nodes=4"], "cluster.nodes"),
    ("extra_sbatch", ["-N4"], "cluster.nodes"),
    ("extra_sbatch", ["--job-name=x"], "launch.job_name"),
    ("env", {"BAD NAME": "x"}, "not a valid environment variable name"),
    ("env", {"X;rm -rf ~": "x"}, "not a valid environment variable name"),
    ("env", {"1ST": "x"}, "not a valid environment variable name"),
    ("env", {"IFS": "x"}, "changes how bash runs"),
    ("env", {"BASH_ENV": "/tmp/x"}, "changes how bash runs"),
    # an allow-list (issue 36): each of these made torchrun.sh import a package of the config's choosing
    *(("env", {name: "/tmp/canary"}, f"{name} is not a variable launch.env passes")
      for name in ("PYTHONPATH", "LD_LIBRARY_PATH", "PYTHONHOME", "PYTHONWARNINGS", "PYTHONSTARTUP",
                   "MY_VAR")),
    *(("env", {name: "/tmp/canary"}, "changes which programs, libraries or compiled code")
      for name in ("CUDA_HOME", "TORCH_EXTENSIONS_DIR", "NCCL_NET_PLUGIN")),
    ("extra_sbatch", ["--export=ALL,PYTHONPATH=/tmp/canary"], "--export sets PYTHONPATH"),
    ("env", {"OK": "line1\nline2"}, "control character"),
])
def test_launch_values_no_script_can_carry_are_refused(tmp_path: Path, field: str, value: Any,
                                                       message: str):
    data = tiny_data()
    data["launch"][field] = value
    result = emit("all", write_config(tmp_path, data), "-o", tmp_path / "out")
    assert result.exit_code == 1, result.output
    assert f"launch.{field}" in result.output and message in result.output
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------- hostile strings

HOSTILE = [
    'x"; touch PWNED; echo "',
    "x'; touch PWNED; echo '",
    "$(touch PWNED)",
    "`touch PWNED`",
    "a b\\c #d ${HOME} %x",
    "';touch PWNED;'\"",
    "\\",
    "ünïcødé ☃ — ok",
]


def run_everything(out: Path, fakes: dict[str, Any], cwd: Path) -> tuple[dict, dict]:
    """Run torchrun.sh, job.sbatch and megatron_args.sh; return the python and srun calls."""
    result, [torchrun_call] = run_script(out / "torchrun.sh", fakes, cwd=cwd)
    assert result.returncode == 0, result.stderr
    result, [srun_call] = run_script(out / "job.sbatch", fakes, env=slurm_env(out), cwd=cwd)
    assert result.returncode == 0, result.stderr
    result, _ = run_script(out / "megatron_args.sh", fakes, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return torchrun_call, srun_call


def assert_inert(*folders: Path) -> None:
    for folder in folders:
        assert not list(folder.rglob("PWNED")), f"a hostile string ran a command in {folder}"


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_strings_in_every_launch_field_come_out_inert(tmp_path: Path, fakes: dict[str, Any],
                                                              value: str):
    data = tiny_data()
    data["launch"].update(job_name=value, partition=value, account=value, time=value,
                          container_image=value, output_dir="logs/" + value,
                          extra_sbatch=["--comment=" + value], env={"NCCL_HOSTILE": value})
    out = tmp_path / "out"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = emit("all", write_config(tmp_path, data), "-o", out)
    assert result.exit_code == 0, result.output
    torchrun_call, srun_call = run_everything(out, fakes, cwd)
    assert_inert(tmp_path)
    # torchrun names a temporary folder after the rendezvous id: it keeps file-name characters only.
    argv = torchrun_call["argv"]
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", argv[argv.index("--rdzv-id") + 1])
    # Every other value arrived intact, as one word, where it was meant to go.
    assert torchrun_call["env"]["NCCL_HOSTILE"] == value
    assert srun_call["env"]["NCCL_HOSTILE"] == value
    assert f"--container-image={value}" in srun_call["argv"]
    found = directive_map((out / "job.sbatch").read_text())
    assert found["--job-name"] == value
    assert found["--partition"] == value
    assert found["--account"] == value
    assert found["--time"] == value
    # Slurm expands %-patterns in --output: the user's own % is doubled so the folder is literal.
    assert found["--output"] == f"logs/{value.replace('%', '%%')}/%x-%j.out"
    assert found["--comment"] == value
    assert (out / "logs" / value).is_dir()


def test_hostile_config_and_output_paths_come_out_inert(tmp_path: Path, fakes: dict[str, Any]):
    weird = 'cfg $(touch PWNED) `touch PWNED` "q\'\nnext line\n#SBATCH --uid=0'
    folder = tmp_path / "src"
    folder.mkdir()
    config = write_config(folder, tiny_data(), name=weird + ".yaml")
    out = tmp_path / "run $(touch PWNED) 'x\" ;"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = emit("all", config, "-o", out)
    assert result.exit_code == 0, result.output
    text = (out / "job.sbatch").read_text()
    assert "--uid" not in directive_map(text)
    assert "\\x0anext line\\x0a#SBATCH --uid=0" in text  # the newline stayed inside the comment
    torchrun_call, _ = run_everything(out, fakes, cwd)
    assert torchrun_call["argv"][torchrun_call["argv"].index("--plan") + 1] == str(out / "plan.json")
    assert_inert(tmp_path)


printable = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=printable)
def test_any_printable_value_survives_sbatch_and_bash_quoting(value: str):
    assume("packjob" not in value.lower())  # sbatch blanks that word out of directive lines
    assert sbatch_words(f"#SBATCH --job-name={sbatch_quote(value)}") == [f"--job-name={value}"]
    echoed = subprocess.run(["bash", "-c", f"v={shquote(value)}; printf '%s' \"$v\""],
                            capture_output=True, text=True, check=True).stdout
    assert echoed == value


# ------------------------------------------------------------------------- Megatron-LM arguments


def megatron_tokens(script: Path, *command: str) -> list[str]:
    out = subprocess.run(["bash", str(script), *command], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def flag_map(tokens: list[str]) -> dict[str, list[str]]:
    """`--flag v1 v2 --next` → {--flag: [v1, v2], --next: []}; a repeated flag fails the test."""
    flags: dict[str, list[str]] = {}
    current = None
    for token in tokens:
        if token.startswith("--"):
            assert token not in flags, f"{token} given twice"
            flags[token] = []
            current = token
        else:
            assert current is not None, token
            flags[current].append(token)
    return flags


def array_lines(script: str) -> list[str]:
    body = script.split("megatron_args=(\n", 1)[1].split("\n)\n", 1)[0]
    return body.splitlines()


def test_megatron_arguments_of_the_v4_pro_example_flag_by_flag(tmp_path: Path):
    """Every flag hand-derived from examples/deepseek-v4-pro-1024.yaml, the V4-Pro preset (the
    DeepSeek-V4 Megatron write-up) and Megatron-LM dev@d48bd6be megatron/training/arguments.py;
    nothing missing, nothing extra."""
    out = tmp_path / "out"
    assert emit("megatron", V4_PRO, "-o", out).exit_code == 0
    script = out / "megatron_args.sh"
    entry, *tokens = megatron_tokens(script)
    assert entry == "pretrain_hybrid.py"  # V4 layer patterns go through the hybrid entry

    # 61 blocks + 1 MTP block; compress ratios [128,128,4] + [128,4]*29 + [0]: HCA = H, CSA = C,
    # window only = W; every block is MoE (E). Layout Et*6|(t*8|)*6t*7mL: 6, 8 x 6, 7 (+ MTP).
    ratios = [128, 128, 4] + [128, 4] * 29 + [0]
    kind = {128: "H", 4: "C", 0: "W"}
    stages = [range(0, 6)] + [range(6 + 8 * s, 14 + 8 * s) for s in range(6)] + [range(54, 61)]
    pattern = "|".join("".join(kind[ratios[i]] + "E" for i in stage) for stage in stages)
    pattern += "/" + kind[ratios[61]] + "E"
    assert pattern.startswith("HEHECEHECEHE|CEHE") and pattern.endswith("|CEHECEHECEHECE/WE")

    expected = {
        # layout: N = 1024 = TP1 · CP2 · DP64 · PP8 = ETP1 · EP64 · EDP2 · PP8, default order
        "--tensor-model-parallel-size": ["1"],
        "--pipeline-model-parallel-size": ["8"],
        "--context-parallel-size": ["2"],
        "--expert-model-parallel-size": ["64"],
        "--expert-tensor-parallel-size": ["1"],
        "--cp-comm-type": ["p2p"],
        "--cp-partition-mode": ["contiguous"],
        "--hybrid-layer-pattern": [pattern],
        # model shape (V4-Pro preset)
        "--hidden-size": ["7168"],
        "--ffn-hidden-size": ["3072"],
        "--num-attention-heads": ["128"],
        "--kv-channels": ["512"],
        "--vocab-size": ["129280"],
        "--max-position-embeddings": ["1048576"],
        # MTP needs rope or none (Megatron-LM dev@d48bd6be megatron/training/arguments.py:919
        # validate_args); V4 trains without dropout and with q/kv norms
        "--position-embedding-type": ["rope"],
        "--hidden-dropout": ["0.0"],
        "--attention-dropout": ["0.0"],
        "--qk-layernorm": [],
        "--swiglu": [],
        "--normalization": ["RMSNorm"],
        "--norm-epsilon": ["1e-06"],
        "--disable-bias-linear": [],
        "--untie-embeddings-and-output-weights": [],
        "--activation-func-clamp-value": ["10.0"],
        # RoPE of the V4 config: theta 1e4, compressed layers 1.6e5 with YaRN x16 over 65,536
        "--rope-type": ["yarn"],
        "--rotary-base": ["10000"],
        "--rotary-scaling-factor": ["16.0"],
        "--original-max-position-embeddings": ["65536"],
        "--csa-compress-rotary-base": ["160000.0"],
        # DSv4 hybrid attention and mHC
        "--multi-latent-attention": [],
        "--experimental-attention-variant": ["dsv4_hybrid"],
        "--q-lora-rank": ["1536"],
        "--qk-pos-emb-head-dim": ["64"],
        "--v-head-dim": ["512"],
        "--o-groups": ["16"],
        "--o-lora-rank": ["1024"],
        "--csa-window-size": ["128"],
        "--csa-compress-ratios": ["[" + ",".join(str(r) for r in ratios) + "]"],
        "--dsa-indexer-n-heads": ["64"],
        "--dsa-indexer-head-dim": ["128"],
        "--dsa-indexer-topk": ["1024"],
        "--enable-hyper-connections": [],
        "--num-residual-streams": ["4"],
        "--mhc-sinkhorn-iterations": ["20"],
        "--mtp-num-layers": ["1"],
        "--mtp-loss-scaling-factor": ["0.1"],
        "--spec": ["megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_dsv4_stack_spec"],
        # MoE: 384 experts, top-6, sqrt-softplus with expert bias, 3 hash blocks, AlltoAll
        "--num-experts": ["384"],
        "--moe-ffn-hidden-size": ["3072"],
        "--moe-shared-expert-intermediate-size": ["3072"],
        "--moe-router-topk": ["6"],
        "--moe-router-score-function": ["sqrtsoftplus"],
        "--moe-router-topk-scaling-factor": ["2.5"],
        "--moe-router-enable-expert-bias": [],
        "--moe-router-bias-update-rate": ["0.001"],
        "--moe-n-hash-layers": ["6"],  # E of the 3rd block is pattern symbol 6 (test_emit_hybrid)
        "--moe-router-load-balancing-type": ["seq_aux_loss"],
        "--moe-aux-loss-coeff": ["0.0001"],
        "--moe-token-dispatcher-type": ["alltoall"],
        "--moe-grouped-gemm": [],
        # batch: B = 4096, b = 1, packed THD sequences of 8192
        "--seq-length": ["8192"],
        "--micro-batch-size": ["1"],
        "--global-batch-size": ["4096"],
        "--sequence-packing-scheduler": ["dp_balanced"],
        "--bf16": [],
        "--optimizer": ["adam"],
        "--lr": ["0.0001"],
        "--adam-beta1": ["0.9"],
        "--adam-beta2": ["0.95"],
        "--adam-eps": ["1e-08"],
        "--weight-decay": ["0.1"],
        "--seed": ["1234"],
        "--use-distributed-optimizer": [],
        "--ckpt-format": ["torch_dist"],
        # full recompute of every block, one layer at a time (the example's memory fix)
        "--recompute-granularity": ["full"],
        "--recompute-method": ["uniform"],
        "--recompute-num-layers": ["1"],
    }
    found = flag_map(tokens)
    for flag in expected:
        assert found.get(flag) == expected[flag], flag
    assert set(found) == set(expected), set(found) ^ set(expected)
    # Not allowed next to a hybrid pattern (it carries layers, split and MTP), or not needed here.
    for absent in ("--num-layers", "--pipeline-model-parallel-layout", "--moe-layer-freq",
                   "--use-tp-pp-dp-mapping", "--sequence-parallel"):
        assert absent not in found
    # One flag per line of the bash array, each with the config field it reproduces.
    lines = array_lines(script.read_text())
    assert len(lines) == len(expected)
    assert all(line.lstrip().startswith("--") and line.lstrip().count(" --") == 0 and "  # " in line
               for line in lines)


def test_megatron_script_runs_a_command_with_the_arguments_last(tiny_all: Path):
    tokens = megatron_tokens(tiny_all / "megatron_args.sh", "printf", "%s\\n", "pretrain_gpt.py",
                             "--data-path", "/data/x")
    assert tokens[:3] == ["pretrain_gpt.py", "--data-path", "/data/x"]
    assert tokens[3:] == megatron_tokens(tiny_all / "megatron_args.sh")[1:]


def test_megatron_gpt_entry_for_the_tiny_example(tiny_all: Path):
    entry, *tokens = megatron_tokens(tiny_all / "megatron_args.sh")
    found = flag_map(tokens)
    assert entry == "pretrain_gpt.py"
    assert found["--num-layers"] == ["2"]
    assert found["--moe-layer-freq"] == ["1"]
    assert found["--expert-tensor-parallel-size"] == ["2"]
    assert found["--moe-n-hash-layers"] == ["1"]
    assert "--hybrid-layer-pattern" not in found and "--multi-latent-attention" not in found


def base_gpt() -> dict[str, Any]:
    """8 ranks, PP 2 with 4 layers, EP 4: DP 4, EDP 1 (planner/rules/example_base.py shape)."""
    return {
        "model": {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 8, "num_query_groups": 4,
                  "ffn_hidden_size": 128, "vocab_size": 512, "num_experts": 8, "moe_router_topk": 2,
                  "moe_ffn_hidden_size": 64},
        "parallel": {"world_size": 8, "tp": 1, "cp": 1, "pp": 2, "ep": 4, "etp": 1},
        "training": {"seq_length": 256, "micro_batch_size": 1, "global_batch_size": 16},
    }


def test_megatron_pp_dp_order_and_pipeline_flags():
    data = base_gpt()
    data["parallel"].update(ep=1, order="tp-cp-ep-pp-dp", vpp=2, microbatch_group_size_per_vp_stage=2)
    data["model"]["moe_layer_freq"] = [1, 0, 1, 0]
    data["overlap"] = {"recompute_granularity": "full", "recompute_method": "uniform",
                       "recompute_num_layers": 1}
    assert_valid(data)  # DP = EDP = 4, so Megatron accepts pp-dp with PP > 1
    found = megatron_arguments(parse_config(data)).as_dict()
    assert found["--use-tp-pp-dp-mapping"] == ()
    assert found["--num-virtual-stages-per-pipeline-rank"] == ("2",)
    assert found["--microbatch-group-size-per-virtual-pipeline-stage"] == ("2",)
    assert found["--moe-layer-freq"] == ("[1,0,1,0]",)
    assert found["--group-query-attention"] == () and found["--num-query-groups"] == ("4",)
    assert found["--recompute-method"] == ("uniform",) and found["--recompute-num-layers"] == ("1",)


def test_a_flag_already_held_is_refused():
    """Two writers of one flag are a bug even when their values agree (argparse keeps the last)."""
    args = MegatronArgs(entry="pretrain_gpt.py", branch="dev")
    args.add("--rotary-percent", 0.5, source="model.rotary_percent")
    args.add_if(False, "--rotary-percent", 0.5, source="not written")
    with pytest.raises(ValueError, match=r"--rotary-percent is emitted twice: from model.rotary_percent "
                       r"and from rope"):
        args.add("--rotary-percent", 0.5, source="rope")
    with pytest.raises(ValueError, match="emitted twice"):
        args.add_if(True, "--rotary-percent", 0.25, source="rope")
    assert [f.flag for f in args.flags] == ["--rotary-percent"]


def test_megatron_default_order_needs_no_flag_and_size_one_axes_do_not_matter():
    data = base_gpt()
    data["parallel"]["order"] = "tp-ep-dp-pp"  # cp = 1 is appended by Megatron: same groups
    assert "--use-tp-pp-dp-mapping" not in megatron_arguments(parse_config(data)).as_dict()


def test_megatron_refuses_an_order_its_command_line_cannot_express():
    data = base_gpt()
    data["parallel"]["order"] = "tp-pp-cp-ep-dp"
    with pytest.raises(EmitError, match="parallel.order"):
        megatron_arguments(parse_config(data))


def test_hybrid_pattern_marks_dense_layers_and_needs_mtp_on_the_last_segment():
    cfg = load_config(V4_PRO)
    data = cfg.model_dump(mode="json", exclude_none=True)
    data["model"].pop("preset", None)
    data["model"]["moe_layer_freq"] = [0] + [1] * 60
    pattern = megatron_arguments(parse_config(data)).as_dict()["--hybrid-layer-pattern"][0]
    assert pattern.startswith("H-HECE") and pattern.count("-") == 1
    data["parallel"]["pipeline_model_parallel_layout"] = "Et*6|(t*8|)*5t*8m|t*7L"
    with pytest.raises(EmitError, match="MTP"):
        megatron_arguments(parse_config(data))


# ------------------------------------------------------------------------- shellcheck


def shellcheck() -> str:
    path = shutil.which("shellcheck")
    if path is None:
        pytest.skip("shellcheck is not installed (.ci/system-deps installs it)")
    return path


def emitted_variants(root: Path) -> list[Path]:
    """Every script for the examples, a container/env/extra-options config, and hostile values."""
    variants: list[tuple[str, Path]] = [("tiny", TINY), ("v4pro", V4_PRO)]
    rich = tiny_data()
    rich["launch"].update(partition="gpu", account="a", container_image="img:1", env={"NCCL_A": "1"},
                          extra_sbatch=["--exclusive"], cpus_per_task=32)
    rich["moe"]["moe_router_force_load_balancing"] = True
    variants.append(("rich", write_config(root, rich, "rich.yaml")))
    hostile = tiny_data()
    hostile["launch"].update(job_name=HOSTILE[0], partition=HOSTILE[1], account=HOSTILE[2],
                             container_image=HOSTILE[3], env={"NCCL_H": HOSTILE[4]},
                             extra_sbatch=["--comment=" + HOSTILE[5]], output_dir=HOSTILE[6])
    variants.append(("hostile", write_config(root, hostile, "hostile.yaml")))
    scripts = []
    for name, config in variants:
        out = root / name
        result = emit("all", config, "-o", out)
        assert result.exit_code == 0, result.output
        scripts += [out / script for script in SCRIPTS]
    return scripts


def test_shellcheck_finds_nothing_in_any_emitted_script(tmp_path: Path):
    tool = shellcheck()
    scripts = emitted_variants(tmp_path)
    result = subprocess.run([tool, "--shell=bash", "--severity=style", *map(str, scripts)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_bash_parses_every_emitted_script(tmp_path: Path):
    for script in emitted_variants(tmp_path):
        subprocess.run(["bash", "-n", str(script)], check=True)


def test_emitted_scripts_are_deterministic(tmp_path: Path):
    for out in ("a", "b"):
        assert emit("all", TINY, "-o", tmp_path / out).exit_code == 0
    for name in ("plan.json", *SCRIPTS):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()


def test_emit_never_imports_torch(tmp_path: Path):
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from planner.cli import app\n"
        f"result = CliRunner().invoke(app, ['emit', 'all', {str(TINY)!r}, '-o', {str(tmp_path / 'out')!r}])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(sorted(name for name in sys.modules if name == 'torch' or name.startswith('torch.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.stdout.strip() == "[]"


# ------------------------------------------------- what Megatron-LM dev requires of the arguments


def test_tiny_example_passes_what_megatron_requires():
    """Megatron-LM dev@d48bd6be megatron/training/arguments.py validate_args requires
    --max-position-embeddings (>= seq_length): without the model field it is seq_length. RoPE,
    dropout 0.1 and no q/k norm are the non-preset defaults, emitted explicitly."""
    found = megatron_arguments(load_config(TINY)).as_dict()
    assert found["--max-position-embeddings"] == ("32",)
    assert found["--position-embedding-type"] == ("rope",)
    assert found["--hidden-dropout"] == ("0.1",) and found["--attention-dropout"] == ("0.1",)
    assert "--qk-layernorm" not in found


def test_v4_presets_use_rope_no_dropout_and_qk_norms():
    """MTP refuses a learned position table (Megatron-LM dev@d48bd6be megatron/training/arguments.py:919
    validate_args); EP overlap with full recompute refuses dropout (megatron/core/transformer/
    transformer_config.py:3422 TransformerConfig.__post_init__); V4 normalises q and kv."""
    for preset in ("deepseek-v4-pro", "deepseek-v4-flash"):
        cfg = load_config(V4_PRO) if preset == "deepseek-v4-pro" else load_config(
            EXAMPLES / "deepseek-v4-flash-128.yaml")
        found = megatron_arguments(cfg).as_dict()
        assert found["--position-embedding-type"] == ("rope",)
        assert found["--hidden-dropout"] == ("0.0",) and found["--attention-dropout"] == ("0.0",)
        assert found["--qk-layernorm"] == ()


def test_user_values_for_the_new_model_fields_are_emitted():
    data = tiny_data()
    data["model"].update(position_embedding_type="none", hidden_dropout=0.0, attention_dropout=0.05,
                         qk_layernorm=True, max_position_embeddings=4096)
    found = megatron_arguments(parse_config(data)).as_dict()
    assert found["--position-embedding-type"] == ("none",)
    assert found["--hidden-dropout"] == ("0.0",) and found["--attention-dropout"] == ("0.05",)
    assert found["--qk-layernorm"] == () and found["--max-position-embeddings"] == ("4096",)


@pytest.mark.parametrize("value", ["sinusoidal", 1.5])
def test_position_embedding_type_takes_megatrons_choices_only(value: Any):
    data = tiny_data()
    data["model"]["position_embedding_type" if isinstance(value, str) else "hidden_dropout"] = value
    with pytest.raises(Exception, match="position_embedding_type|hidden_dropout"):
        parse_config(data)


@pytest.mark.parametrize(("change", "exported"), [
    ({}, True),  # CP 2: Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell
    ({"parallel": {"cp": 1}}, False),  # TP = CP = 1: no assertion
    ({"parallel": {"cp": 1, "tp": 2, "sequence_parallel": True}}, True),
    ({"training": {"use_megatron_fsdp": True}}, False),  # FSDP asserts the opposite
    ({"model": {"moe_n_hash_layers": 0}, "training": {"precision": "bf16"},
      "overlap": {"overlap_moe_expert_parallel_comm": True}}, False),  # EP overlap: a warning only
])
def test_launchers_export_cuda_device_max_connections_where_megatron_asserts_it(
        tmp_path: Path, fakes: dict[str, Any], change: dict[str, Any], exported: bool):
    """Megatron-LM dev@d48bd6be megatron/training/arguments.py validate_args: with TP or CP > 1 on
    Hopper and earlier, CUDA_DEVICE_MAX_CONNECTIONS must be 1 unless FSDP or EP-overlap is on."""
    data = tiny_data()
    for section, values in change.items():
        data.setdefault(section, {}).update(values)
    cfg = parse_config(data)
    assert ("CUDA_DEVICE_MAX_CONNECTIONS" in megatron_arguments(cfg).env) is exported
    out = tmp_path / "out"
    result = emit("all", write_config(tmp_path, data), "-o", out)
    assert result.exit_code == 0, result.output
    for name in ("torchrun.sh", "job.sbatch", "megatron_args.sh"):
        text = (out / name).read_text()
        assert ("export CUDA_DEVICE_MAX_CONNECTIONS=1" in text) is exported, name
    _, [call] = run_script(out / "torchrun.sh", fakes)
    assert (call["env"].get("CUDA_DEVICE_MAX_CONNECTIONS") == "1") is exported


def test_a_config_of_both_branches_is_an_emit_error_and_no_rule_crash() -> None:
    """GTP (main) with hyper-connections (dev): no command line runs it. The emitter says so on
    parallel.gtp; the rules read the same answer from planner/config/ as 'main or dev'."""
    cfg = parse_config(merge(example_config_data(""), {"parallel": {"gtp": 2},
                                                       "model": {"enable_hyper_connections": True}}))
    with pytest.raises(EmitError) as raised:
        megatron_arguments(cfg)
    assert raised.value.path == "parallel.gtp" and "Megatron-LM dev only" in raised.value.message
    assert Facts(cfg).megatron_branch == "main or dev"


@pytest.mark.parametrize("placement", [{"rank_distribution": "cyclic"},
                                       {"rank_nodes": [0, 1, 0, 1, 0, 1, 0, 1]}])
def test_a_placement_the_launchers_do_not_give_is_refused(tmp_path: Path, placement: dict[str, Any]):
    """One torchrun per node numbers ranks node after node; a budget planned for Slurm's cyclic
    distribution or a hostfile order would describe a placement the emitted scripts never run."""
    data = tiny_data()
    data["cluster"] = {**data.get("cluster", {}), "nodes": 2, "gpus_per_node": 4, **placement}
    path = tmp_path / "placed.yaml"
    path.write_text(yaml.safe_dump(data))
    result = emit("all", path, "-o", tmp_path / "out")
    assert result.exit_code == 1, result.output
    assert "cluster.rank_" in result.output and "rank 1 on node 1" in result.output
    assert not (tmp_path / "out").exists()
    block = {**data, "cluster": {**data["cluster"], "rank_distribution": "block", "rank_nodes": None}}
    path.write_text(yaml.safe_dump(block))
    assert emit("all", path, "-o", tmp_path / "block").exit_code == 0

"""Hostile and unlucky inputs for every command that reads or writes a file (issue 26).

Each case is a `moeplan` command line over files a setup function writes into a scratch folder:
alias bombs at several depths, `/dev/zero`, FIFOs with no writer, huge sparse files, deep JSON,
huge integers, outputs that are read-only, past `ulimit -f`, a directory or a device node, and
sbatch options that abbreviate managed ones. Every case must end in a message and exit 1 or 2
within a few seconds under a memory bound, never a traceback, a hang or a replaced device.

Two runners share the cases:

* `run_in_process` (the test, tests/integration/cli/test_hostile_inputs.py): one child process
  sets RLIMIT_AS, then runs every case through typer's CliRunner with an alarm per case and
  RLIMIT_FSIZE lowered for the `ulimit -f` case; one start-up for all of them.
* `run_as_processes` (the closing-note table, `python -m tests.support.hostile_cases TREE`):
  each case as its own `python -m planner.cli` process of any source tree (an older commit's
  too), measuring exit code, wall time and peak RSS.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny-cpu-8.yaml"
MEMORY_BOUND = 2 << 30  # RLIMIT_AS of the child: moeplan's start-up maps ~0.6 GiB
CASE_SECONDS = 20  # an alarm ends a case that hangs (the table's "timeout")
SPARSE_BYTES = 3 << 30
# Entries of the big-but-legal cases (an ignore list, an unknown section): small in CI, where the
# test only shows they end well; `python -m tests.support.hostile_cases` measures 1,000,000.
ENTRIES = int(os.environ.get("MOEPLAN_HOSTILE_ENTRIES", 10_000))


# ----------------------------------------------------------------------------- file builders


def alias_bomb(depth: int, width: int = 9) -> str:
    """`depth` levels of anchors, each a list of `width` aliases of the one before: width^depth
    leaves from a few hundred bytes (the "billion laughs" shape)."""
    lines = ['a0: &a0 ["lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, depth + 1)]
    return "\n".join(lines) + "\n"


def tiny_text() -> str:
    return TINY.read_text()


def with_launch(extra: str) -> str:
    """tiny-cpu-8.yaml with keys added to its launch section."""
    text = tiny_text()
    assert "\nlaunch:" in text
    return text.replace("\nlaunch:", "\nlaunch:\n" + extra, 1)


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


@functools.cache
def _plan_and_report() -> tuple[dict, dict]:
    """A real plan of tiny-cpu-8 and a minimal report of the right format on it."""
    from planner.config.loader import load_config
    from planner.plan import compile_plan
    from planner.rules import run_rules

    cfg = load_config(TINY)
    plan = compile_plan(cfg, run_rules(cfg))
    report = {"format": "moeplan-report", "version": 1, "plan_digest": plan["digest"],
              "balanced": True, "reference": {"checked": False},
              "ranks": [{"rank": r["rank"], "stage": r["stage"], "collectives": {}}
                        for r in plan["ranks"]]}
    return plan, report


def write_plan_pair(tmp: Path) -> None:
    plan, report = _plan_and_report()
    (tmp / "plan.json").write_text(json.dumps(plan))
    (tmp / "report.json").write_text(json.dumps(report))


def _report_text(ranks: str) -> str:
    """A report of the plan pair's plan (its real digest, so verify reads on) with these ranks."""
    digest = _plan_and_report()[0]["digest"]
    return f'{{"format": "moeplan-report", "version": 1, "plan_digest": "{digest}", "ranks": {ranks}}}'


def sparse(path: Path, size: int = SPARSE_BYTES) -> None:
    with open(path, "wb") as handle:
        handle.truncate(size)


def fifo(path: Path) -> None:
    os.mkfifo(path)


# ----------------------------------------------------------------------------- the cases

# Calibration profiles an adversarial user writes (issue 36): each refused naming the entry, exit 2.
# The readers' unit tests (tests/unit/files/test_reader_bounds.py, tests/unit/config/
# test_shell_budgets.py, tests/unit/emit/test_emit.py) hold the rest of each family.
PROFILES: dict[str, str] = {
    "profile: a negative efficiency": "factors: {gemm_bf16: -0.5}\n",
    "profile: .nan": "factors: {gemm_bf16: .nan}\n",
    "profile: a syntax error": "factors: {gemm_bf16: [\n",
    "profile: two documents": "factors: {gemm_bf16: 0.5}\n---\nfactors: {}\n",
    "profile: a python tag": "factors: !!python/object/apply:os.system [echo owned]\n",
    "profile: a 5,000-digit integer": "factors: {gemm_bf16: " + "9" * 5000 + "}\n",
    "profile: an alias bomb": alias_bomb(7) + "factors: {gemm_bf16: 0.5}\n",
}


_LAUNCH = "torchrun pretrain_gpt.py --num-layers $A\n"
# Launch scripts a few hundred bytes long that grew without bound in the shell importer (issue 36).
SCRIPTS: dict[str, str] = {
    "string doubling": "A=x\n" + "A=$A$A\n" * 40 + _LAUNCH,
    "nested ${a:-${b:-…}} 5,000 deep": "A=" + "${a:-" * 5000 + "1" + "}" * 5000 + "\n" + _LAUNCH,
    "a 320 kB ternary": "A=$((" + "1?" * 80_000 + "1" + ":1" * 80_000 + "))\n" + _LAUNCH,
    "a YAML argument map of aliases": "--a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"--{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcde", "bcdef", strict=True))
        + "--num-layers: 2\n",
}


def _profile_case(name: str, text: str, command: str = "estimate") -> Case:
    return Case(name, (command, str(TINY), "--calibration", "{tmp}/profile.yaml"),
                _write("profile.yaml", text))


def _timing_lines(ms: str) -> str:
    return "".join(f" iteration {i * 10:8d}/{30:8d} | elapsed time per iteration (ms): {ms} | "
                   "number of skipped iterations:   0 |\n" for i in (1, 2, 3))


def _with_model(line: str) -> str:
    return tiny_text().replace("model:\n", f"model:\n  {line}\n", 1)



@dataclass(frozen=True)
class Case:
    """One command line; `{tmp}` in argv is the scratch folder the setup filled."""

    name: str
    argv: tuple[str, ...]
    setup: Callable[[Path], None] = lambda tmp: None
    expect: tuple[int, ...] = (2,)
    env: dict[str, str] = field(default_factory=dict)
    file_size_limit: int | None = None  # RLIMIT_FSIZE in bytes (`ulimit -f`)
    check_after: Callable[[Path], str | None] = lambda tmp: None  # a problem left behind, or None


def _write(name: str, text: str | Callable[[], str]) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / name).write_text(text() if callable(text) else text)
    return setup


def _both(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        for step in steps:
            step(tmp)
    return setup


def _no_temp_files(tmp: Path) -> str | None:
    left = [p.name for p in tmp.rglob(".*.tmp")]
    return f"temporary files left behind: {left}" if left else None


def _edited_plan(tmp: Path) -> None:
    """The plan with step.dense_grad_reduce's send bytes doubled, digested again (so the digest
    holds) and its report pointed at it: only re-deriving the figures from the config tells."""
    from planner.plan_format import plan_digest

    plan, report = _plan_and_report()
    plan = json.loads(json.dumps(plan))
    entry = next(b for b in plan["budgets"] if b["name"] == "step.dense_grad_reduce.fwd.send_bytes")
    entry["value"] *= 2
    plan["digest"] = plan_digest(plan)
    (tmp / "edited.json").write_text(json.dumps(plan))
    (tmp / "report.json").write_text(json.dumps({**report, "plan_digest": plan["digest"]}))


def _no_run_folder(tmp: Path) -> str | None:
    return "a half-written run folder was left" if (tmp / "run").exists() else None


def _link_kept(tmp: Path) -> str | None:
    return None if (tmp / "out.json").is_symlink() else "the link was replaced"


def _hf_config_at(target: str) -> Callable[[], str]:
    return lambda: tiny_text().replace("model:\n", f"model:\n  hf_config: {target}\n", 1)


def _read_only_folder() -> str:
    """A folder nobody may write: /sys for root (where chmod does not stop anyone), else a
    chmod 555 folder made by the case's setup."""
    return "/sys" if os.geteuid() == 0 else "{tmp}/read-only"


def _make_read_only(tmp: Path) -> None:
    if os.geteuid() != 0:
        (tmp / "read-only").mkdir()
        (tmp / "read-only").chmod(0o555)


def _device_node(tmp: Path) -> None:
    """A device node of the case's own (a copy of /dev/null's numbers; a FIFO where mknod is not
    allowed). Never a system node: an older moeplan replaces the target with a regular file."""
    try:
        os.mknod(tmp / "device", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        os.mkfifo(tmp / "device")


def _device_kept(tmp: Path) -> str | None:
    mode = (tmp / "device").stat().st_mode
    return None if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) else "the device node was replaced"


def _sbatch_case(name: str, extra: str) -> Case:
    return Case(name, ("emit", "slurm", "{tmp}/job.yaml", "-o", "{tmp}/run"),
                _write("job.yaml", lambda: with_launch(extra)), expect=(1,))


CASES: tuple[Case, ...] = (
    *(Case(f"alias bomb, 9^{depth} leaves", ("check", "{tmp}/bomb.yaml"),
           _write("bomb.yaml", alias_bomb(depth)), expect=(1,)) for depth in (3, 5, 7, 9)),
    Case("recursive alias", ("check", "{tmp}/loop.yaml"), _write("loop.yaml", "a: &a [1, *a]\n"),
         expect=(1,)),
    Case("flat list over the node cap", ("check", "{tmp}/flat.yaml"),
         _write("flat.yaml", "[" + "1," * 400_000 + "1]\n"), expect=(1,),
         env={"MOEPLAN_YAML_MAX_NODES": "100000"}),
    Case(f"ignore list of {ENTRIES:,} entries", ("check", "{tmp}/ignore.yaml"),
         _write("ignore.yaml", lambda: tiny_text() + "ignore:\n" + "".join(
             f"  - PAR{i:07d}\n" for i in range(ENTRIES))), expect=(0,)),
    Case(f"unknown section of {ENTRIES:,} keys", ("check", "{tmp}/unknown.yaml"),
         _write("unknown.yaml", lambda: tiny_text() + "extra:\n" + "".join(
             f"  k{i}: {i}\n" for i in range(ENTRIES))), expect=(1,)),
    Case("check /dev/zero", ("check", "/dev/zero")),
    Case("check /dev/urandom", ("check", "/dev/urandom")),
    Case("check a FIFO with no writer", ("check", "{tmp}/fifo.yaml"),
         lambda tmp: fifo(tmp / "fifo.yaml")),
    Case("check a 3 GiB sparse file", ("check", "{tmp}/sparse.yaml"),
         lambda tmp: sparse(tmp / "sparse.yaml")),
    Case("model.hf_config: /dev/zero", ("check", "{tmp}/hf.yaml"),
         _write("hf.yaml", _hf_config_at("/dev/zero"))),
    Case("model.hf_config: a 3 GiB sparse file", ("check", "{tmp}/hf.yaml"),
         _both(_write("hf.yaml", _hf_config_at("big.json")), lambda tmp: sparse(tmp / "big.json"))),
    Case("import hf /dev/zero", ("import", "hf", "/dev/zero")),
    Case("import hf a FIFO", ("import", "hf", "{tmp}/fifo.json"), lambda tmp: fifo(tmp / "fifo.json")),
    Case("import hf 5,000-digit integer", ("import", "hf", "{tmp}/big-int.json"),
         _write("big-int.json", '{"architectures": ["MixtralForCausalLM"], "num_hidden_layers": '
                + "9" * 5000 + "}")),
    Case("import megatron /dev/zero", ("import", "megatron", "/dev/zero")),
    Case("import megatron a 3 GiB sparse file", ("import", "megatron", "{tmp}/args.txt"),
         lambda tmp: sparse(tmp / "args.txt")),
    Case("verify: plan is /dev/zero", ("verify", "/dev/zero", "{tmp}/report.json"), write_plan_pair),
    Case("verify: plan is a FIFO", ("verify", "{tmp}/fifo.json", "{tmp}/report.json"),
         _both(write_plan_pair, lambda tmp: fifo(tmp / "fifo.json"))),
    Case("verify: report nested 100,000 deep", ("verify", "{tmp}/plan.json", "{tmp}/deep.json"),
         _both(write_plan_pair, _write("deep.json", deep_json(100_000)))),
    Case("verify: report with a 5,000-digit integer", ("verify", "{tmp}/plan.json", "{tmp}/int.json"),
         _both(write_plan_pair, _write("int.json", '{"format": "moeplan-report", "version": '
                                       + "1" * 5000 + "}"))),
    Case("verify: report with Infinity", ("verify", "{tmp}/plan.json", "{tmp}/inf.json"),
         _both(write_plan_pair, _write("inf.json", lambda: _report_text(
             '[{"rank": 0, "stage": 0, "collectives": '
             '{"dense_grad_reduce.fwd": {"send_bytes": Infinity}}}]')))),
    Case("verify: report ranks of the wrong type", ("verify", "{tmp}/plan.json", "{tmp}/bad.json"),
         _both(write_plan_pair, _write("bad.json", lambda: _report_text('[{"rank": "0"}]')))),
    Case("compile -o a read-only folder", ("compile", str(TINY), "-o", _read_only_folder() + "/plan.json"),
         _make_read_only),
    Case("compile -o past ulimit -f", ("compile", str(TINY), "-o", "{tmp}/plan.json"),
         file_size_limit=16 << 10, check_after=_no_temp_files),
    Case("compile -o a directory --force", ("compile", str(TINY), "-o", "{tmp}", "--force")),
    Case("compile -o a device node --force", ("compile", str(TINY), "-o", "{tmp}/device", "--force"),
         _device_node, check_after=_device_kept),
    Case("report -o an existing file", ("report", str(TINY), "-o", "{tmp}/page.html"),
         _write("page.html", "keep me")),
    Case("groups --svg an existing file", ("groups", str(TINY), "--svg", "{tmp}/stage.svg"),
         _write("stage.svg", "keep me")),
    Case("import megatron -o an existing file", ("import", "megatron", "{tmp}/args.txt", "-o",
                                                "{tmp}/job.yaml"),
         _both(_write("args.txt", "--num-layers 2\n"), _write("job.yaml", "keep me"))),
    _sbatch_case("extra_sbatch --outp=", '  extra_sbatch: ["--outp=/elsewhere/stolen.log"]\n'),
    _sbatch_case("extra_sbatch -Qo (bundled short options)", '  extra_sbatch: ["-Qo/elsewhere/x.log"]\n'),
    _sbatch_case("extra_sbatch --job=", '  extra_sbatch: ["--job=other"]\n'),
    _sbatch_case("extra_sbatch --export=ALL,BASH_ENV=", '  extra_sbatch: ["--export=ALL,BASH_ENV=/x"]\n'),
    _sbatch_case("launch.env LD_PRELOAD", '  env: {LD_PRELOAD: /tmp/evil.so}\n'),
    _sbatch_case("launch.output_dir ../../x", '  output_dir: ../../x\n'),
    # --- round 4 (issue 36): calibration profiles, measured logs, moe_layer_freq
    *(_profile_case(name, text) for name, text in PROFILES.items()),
    _profile_case("search with a negative efficiency", "factors: {gemm_bf16: -0.5}\n", "search"),
    *(Case(f"estimate --measured: elapsed {ms} ms", ("estimate", str(TINY), "--measured", "{tmp}/m.log"),
           _write("m.log", _timing_lines(ms)), expect=(1,)) for ms in ("0", "-5000")),
    Case("estimate --measured: a 3.2 MB line of stacked stamps", ("estimate", str(TINY), "--measured",
                                                                  "{tmp}/long.log"),
         _write("long.log", lambda: "[a]" * 1_100_000 + _timing_lines("5.0"))),
    Case("calibrate: a 3.2 MB line of stacked stamps", ("calibrate", "{tmp}/long.log", "--gpu", "H100"),
         _write("long.log", lambda: "[a]" * 1_100_000 + _timing_lines("5.0"))),
    Case("moe_layer_freq: a product of a 4,800-digit number", ("compile", "{tmp}/freq.yaml", "-o",
                                                              "{tmp}/plan.json"),
         _write("freq.yaml", lambda: _with_model('moe_layer_freq: "' + "*".join(["99999999"] * 600) + '"')),
         expect=(1,)),
    Case("moe_layer_freq: a 3 MB list product", ("check", "{tmp}/freq.yaml"),
         _write("freq.yaml", lambda: _with_model('moe_layer_freq: "[1]*1000000' + "*1" * 1_500_000 + '"')),
         expect=(1,)),
    *(_sbatch_case(f"launch.env {name}", f"  env: {{{name}: /tmp/canary}}\n")
      for name in ("PYTHONPATH",)),
    Case("emit all past ulimit -f", ("emit", "all", str(TINY), "-o", "{tmp}/run"),
         file_size_limit=16 << 10, check_after=_no_run_folder),
    Case("compile -o a symlink to stdout --force", ("compile", str(TINY), "-o", "{tmp}/out.json", "--force"),
         lambda tmp: (tmp / "out.json").symlink_to("/dev/stdout"), check_after=_link_kept),
    Case("verify: a plan's dense gradient bytes doubled and re-digested",
         ("verify", "{tmp}/edited.json", "{tmp}/report.json"), _both(write_plan_pair, _edited_plan)),
    *(Case(f"import megatron: {name}", ("import", "megatron", "{tmp}/launch.sh"), _write("launch.sh", text))
      for name, text in SCRIPTS.items()),
    Case("moe_layer_freq: a list longer than the model", ("check", "{tmp}/freq.yaml"),
         _write("freq.yaml", lambda: _with_model("moe_layer_freq: [1, 0, 1]")), expect=(1,)),
)


# ----------------------------------------------------------------------------- runners


def _argv(case: Case, tmp: Path) -> list[str]:
    return [part.replace("{tmp}", str(tmp)) for part in case.argv]


@dataclass
class Outcome:
    name: str
    exit_code: int | str  # an int, or "timeout" / "traceback" / "signal N"
    seconds: float
    peak_mib: float | None
    last_line: str
    problem: str | None = None

    def ok(self, case: Case) -> bool:
        return self.exit_code in case.expect and self.problem is None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def _alarm(signum: int, frame: object) -> None:
    raise TimeoutError("case ran past its alarm")


def _child_main(scratch: Path, names: list[str]) -> None:
    """In the child: bound the memory, run the named cases through CliRunner, print JSON lines."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))
    from typer.testing import CliRunner

    from planner.cli import app

    signal.signal(signal.SIGALRM, _alarm)
    runner = CliRunner()
    for index, case in enumerate(c for c in CASES if c.name in names):
        tmp = scratch / str(index)
        tmp.mkdir()
        case.setup(tmp)
        saved = {key: os.environ.get(key) for key in case.env}
        os.environ.update(case.env)
        limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        if case.file_size_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (case.file_size_limit, limits[1]))
        started = time.monotonic()
        signal.alarm(CASE_SECONDS)
        try:
            result = runner.invoke(app, _argv(case, tmp))
            code: int | str = result.exit_code
            if not isinstance(result.exception, SystemExit | None):
                code = f"traceback ({type(result.exception).__name__})"
            text = result.output
        except TimeoutError:
            code, text = "timeout", ""
        finally:
            signal.alarm(0)
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        seconds = time.monotonic() - started
        print(json.dumps({"name": case.name, "exit_code": code, "seconds": seconds, "peak_mib": None,
                          "last_line": _last_line(text), "problem": case.check_after(tmp)}), flush=True)


def run_in_process(scratch: Path, names: list[str] | None = None) -> list[Outcome]:
    """Every case (or the named ones) in one memory-bounded child; one Outcome each."""
    names = names or [c.name for c in CASES]
    done = subprocess.run([sys.executable, "-m", "tests.support.hostile_cases", "--child", str(scratch),
                           *names], cwd=ROOT, capture_output=True, text=True,
                          timeout=CASE_SECONDS * len(names) + 60,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    outcomes = [Outcome(**json.loads(line)) for line in done.stdout.splitlines() if line.startswith("{")]
    if len(outcomes) != len(names):
        raise AssertionError(f"the child ended early (exit {done.returncode}): {done.stderr[-2000:]}")
    return outcomes


def run_as_processes(tree: Path, scratch: Path, seconds: int = CASE_SECONDS) -> list[Outcome]:
    """Each case as its own `python -m planner.cli` of the source tree `tree`, under the same
    memory bound: exit code, wall time, peak RSS (wait4's ru_maxrss)."""
    outcomes = []
    for index, case in enumerate(CASES):
        tmp = scratch / str(index)
        tmp.mkdir(parents=True)
        case.setup(tmp)

        def limit(case: Case = case) -> None:
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))
            if case.file_size_limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (case.file_size_limit,) * 2)

        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "COLUMNS": "200",
               **case.env}
        log = tmp / "moeplan-output.txt"
        started = time.monotonic()
        with open(log, "wb") as sink:
            child = subprocess.Popen([sys.executable, "-m", "planner.cli", *_argv(case, tmp)], cwd=tree,
                                     env=env, stdin=subprocess.DEVNULL, stdout=sink,
                                     stderr=subprocess.STDOUT, preexec_fn=limit)
        code: int | str = "timeout"
        peak = None
        while time.monotonic() - started < seconds:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                code = code if code >= 0 else f"signal {-code}"
                peak = usage.ru_maxrss / 1024
                break
            time.sleep(0.02)
        else:
            child.kill()
            peak = os.wait4(child.pid, 0)[2].ru_maxrss / 1024
        seconds_taken = time.monotonic() - started
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            code = f"traceback ({code})"
        outcomes.append(Outcome(case.name, code, seconds_taken, peak, _last_line(text),
                                case.check_after(tmp)))
    return outcomes


def _main() -> None:
    if sys.argv[1] == "--child":
        _child_main(Path(sys.argv[2]), sys.argv[3:])
        return
    import tempfile

    tree = Path(sys.argv[1]).resolve()
    with tempfile.TemporaryDirectory(prefix="moeplan-hostile-") as scratch:
        for outcome in run_as_processes(tree, Path(scratch)):
            print(json.dumps(outcome.__dict__), flush=True)


if __name__ == "__main__":
    _main()

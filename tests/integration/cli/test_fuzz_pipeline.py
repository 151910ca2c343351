"""Mutation fuzz of the whole pipeline: whatever the config, a result or a finding, never a crash.

Each case (tests/support/config_mutator.py, a fixed seed per case) goes through what the commands run —
load → rules → layout summary → budgets → compiled plan → every emitter, written to a temporary
folder — in-process. Allowed endings: the loader's InvalidConfig, error findings (budgets may
then refuse with BudgetError), an emitter's EmitError, an OSError writing the files (the CLI's
exit 2), or a plan and its files. Anything else is a crash; the test collects every distinct one
and prints a reproducer for each.

Every 20th case also runs the commands themselves; every 100th also estimate, verify (on a
mutated report of its plan) and import megatron (on its emitted arguments), every 1000th report.
CI runs DEFAULT_CASES; `MOEPLAN_FUZZ_EXAMPLES=20000` (and `MOEPLAN_FUZZ_SEED`) run more.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from planner.accounting import BudgetError, budgets
from planner.cli import app
from planner.config.loader import InvalidConfig, parse_config
from planner.emit import TARGETS, EmitError, emit_files, log_folder, write_files
from planner.files.writing import WriteFailed
from planner.findings import has_errors
from planner.layout.summary import layout_summary
from planner.plan import compile_plan
from planner.rules import run_rules
from tests.support.config_mutator import base_docs, mutated_config
from tests.support.json_mutator import mutate

DEFAULT_CASES = 300
CLI_EVERY = 20  # every 20th case also goes through the commands themselves
CASE_SECONDS = 30  # one case that runs longer than this is reported like a crash


_runner = CliRunner()


def run_case(doc: Any, out_dir: Path) -> str:
    """What the commands do with one config; returns how it ended (a crash propagates)."""
    try:
        cfg = parse_config(doc)
    except InvalidConfig:
        return "invalid (loader findings)"
    findings = run_rules(cfg)
    layout_summary(cfg)
    try:
        budgets(cfg)
    except BudgetError:
        if not has_errors(findings):
            raise AssertionError("budgets refused a config without error findings") from None
    if has_errors(findings):
        return "rule findings"
    plan = compile_plan(cfg, findings)
    for target in TARGETS:
        try:
            files = emit_files(cfg, plan, target, "config.yaml")
        except EmitError:
            return "emit refused (finding)"
        folder = out_dir / target
        try:
            write_files(folder, files, log_folder(cfg, folder, files))
        except WriteFailed:  # `emit` exits 2 with the OS's reason (e.g. a name over 255 bytes)
            return "emit could not write (usage error)"
    return "planned and emitted"


COMMANDS = (("check", "{cfg}", "--json"), ("budget", "{cfg}"), ("groups", "{cfg}", "--rank", "0"),
            ("compile", "{cfg}", "-o", "{out}/plan.json"), ("emit", "all", "{cfg}", "-o", "{out}/run"),
            ("reshard-plan", "{base}", "{cfg}"))
# Every other command that reads a file, on what the commands above wrote: the plan with a mutated
# runtime report (tests/support/json_mutator.py), the emitted Megatron arguments, the estimate and
# (rarely: it draws charts) the HTML report. Every EXTRA_EVERY-th CLI case runs them.
EXTRA_COMMANDS = (("estimate", "{cfg}"), ("verify", "{out}/plan.json", "{out}/report.json"),
                  ("import", "megatron", "{out}/run/megatron_args.sh", "--world-size", "8"))
EXTRA_EVERY, REPORT_EVERY = 5 * CLI_EVERY, 50 * CLI_EVERY


def _mutated_report(out_dir: Path, seed: int) -> None:
    """A runtime report of the compiled plan (when there is one), broken by the seed."""
    plan_file = out_dir / "plan.json"
    if not plan_file.is_file():
        return
    plan = json.loads(plan_file.read_text())
    report = {"format": "moeplan-report", "version": 1, "plan_digest": plan["digest"],
              "balanced": True, "reference": {"checked": False},
              "ranks": [{"rank": r["rank"], "stage": r["stage"], "collectives": {}}
                        for r in plan["ranks"]]}
    (out_dir / "report.json").write_text(json.dumps(mutate(report, seed)[0]))


def run_commands(doc: Any, base: Any, out_dir: Path, seed: int = 0) -> None:
    """The same config through the real commands (in-process): exit 0, 1 or 2 and no exception.
    reshard-plan moves a checkpoint from the unmutated base to it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"cfg": out_dir / "config.yaml", "base": out_dir / "base.yaml"}
    for key, data in (("cfg", doc), ("base", base)):
        paths[key].write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    commands = list(COMMANDS)
    if seed % EXTRA_EVERY == 0:
        commands += EXTRA_COMMANDS
    if seed % REPORT_EVERY == 0:
        commands.append(("report", "{cfg}", "-o", "{out}/report.html"))
    for command in commands:
        if command[0] == "verify":
            _mutated_report(out_dir, seed)
        args = [part.format(out=out_dir, **paths) for part in command]
        result = _runner.invoke(app, args)
        if result.exit_code not in (0, 1, 2) or not isinstance(result.exception, SystemExit | None):
            raise AssertionError(f"moeplan {' '.join(command)}: exit {result.exit_code}") \
                from result.exception


def fuzz(cases: int, first_seed: int) -> tuple[Counter[str], dict[str, str]]:
    """Run `cases` seeds; outcomes counted, and one reproducer per distinct crash site (a case
    slower than CASE_SECONDS counts as one: work that grows with an absurd input value)."""
    bases = base_docs()
    outcomes: Counter[str] = Counter()
    crashes: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="moeplan-fuzz-") as tmp:
        for seed in range(first_seed, first_seed + cases):
            base, doc, steps = mutated_config(seed, bases)
            started = time.monotonic()
            try:
                outcome = run_case(doc, Path(tmp) / str(seed))
                if seed % CLI_EVERY == 0:
                    run_commands(doc, bases[base], Path(tmp) / f"cli-{seed}", seed)
                if time.monotonic() - started > CASE_SECONDS:
                    raise TimeoutError(f"took {time.monotonic() - started:.0f} s")
            except Exception as exc:  # noqa: BLE001 — every crash is collected and reported
                frame = traceback.extract_tb(exc.__traceback__)[-1]
                site = f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}"
                outcome = "crash"
                crashes.setdefault(site, f"seed {seed}: {' | '.join(steps)}\n    {exc!r:.300}")
            outcomes[outcome] += 1
    return outcomes, crashes


CASES = int(os.environ.get("MOEPLAN_FUZZ_EXAMPLES", DEFAULT_CASES))
FIRST_SEED = int(os.environ.get("MOEPLAN_FUZZ_SEED", 0))


@pytest.mark.timeout(max(600, CASES // 10))
def test_mutated_configs_end_in_a_result_or_a_finding():
    outcomes, crashes = fuzz(CASES, FIRST_SEED)
    print(f"\n{CASES} configs from seed {FIRST_SEED}: {dict(outcomes)}")
    assert not crashes, "\n".join(f"{site}\n  {case}" for site, case in crashes.items())
    # The mutations must reach every stage, or the fuzz proves little.
    assert outcomes["planned and emitted"] >= CASES // 20, outcomes
    assert outcomes["rule findings"] >= CASES // 10, outcomes


EMIT_REFUSED = {f"architectures/{name}.yaml" for name in (
    "minimax-m2-128", "gemma-4-26b-a4b-32", "laguna-xs.2-16", "mimo-v2-flash-256", "minimax-m3-256",
    "step-3.5-flash-96", "kimi-linear-48b-a3b-32")}


@pytest.mark.parametrize("name", sorted(base_docs()))
def test_every_base_config_runs_through(name, tmp_path):
    """The unmutated starting points: the bundled invalid examples end in rule findings, and so
    do the bare presets of big models (MEM001: they do not fit 80 GiB on 128 ranks with EP 64
    without the distributed optimizer and recompute); the 30.5B-parameter Qwen3-30B-A3B fits,
    and it, the bundled valid examples and the rule base are planned and emitted — but for the
    examples valid and budgeted whose layer kinds Megatron-LM dev cannot build, so `emit megatron`
    refuses them (EMT010): MiniMax-M2's per-layer q/k norm, and the per-layer head counts, widths
    and block-sparse layers of Gemma-4, Laguna-XS.2, MiMo-V2-Flash, MiniMax-M3 and Step-3.5, and
    Kimi-Linear's KDA layers."""
    findings = name.startswith("invalid") or (name.startswith("preset")
                                              and name != "preset qwen3-30b-a3b")
    expected = "rule findings" if findings else "planned and emitted"
    if name in EMIT_REFUSED:
        expected = "emit refused (finding)"
    assert run_case(base_docs()[name], tmp_path) == expected


# ----------------------------------------------------------------------------- reading commands
# The commands that read other files than a config, each on mutated copies of real inputs
# (tests/support/text_mutator.py for text, json_mutator for Hugging Face configs): launch scripts,
# argument maps and training logs for `import megatron`, logs for `calibrate`, config.json for
# `import hf`, and a config for `search` whose space is tiny (one rank, two experts, one layer),
# judged in-process. Every case: exit 0, 1 or 2 and no exception. FILE_CASES are spread over
# the four; MOEPLAN_FUZZ_EXAMPLES raises them with the rest.
FILE_CASES = max(16, CASES // 30)
SUPPORT = Path(__file__).resolve().parents[2] / "support"
SCRIPTS = sorted((SUPPORT / "launch_corpus_files").iterdir())
LOGS = sorted((SUPPORT / "megatron_logs").glob("*.log"))
TINY_SEARCH = """\
model: {num_layers: 1, hidden_size: 64, num_attention_heads: 4, kv_channels: 16,
        ffn_hidden_size: 128, vocab_size: 256, num_experts: 2, moe_router_topk: 2,
        moe_ffn_hidden_size: 32}
parallel:
  world_size: 1
training:
  seq_length: 32
  micro_batch_size: 1
  global_batch_size: 1
  precision: fp32
cluster:
  nodes: 1
  gpus_per_node: 1
  gpu_memory_gib: 1
"""


def _reading_case(seed: int, folder: Path) -> tuple[list[str], list[str]]:
    """(the command line, the mutation steps) of one case, its input written into `folder`."""
    from tests.support.hf_configs import HF_CONFIGS
    from tests.support.text_mutator import mutate_text

    kind = ("search", "import hf", "import megatron", "calibrate")[seed % 4]
    pick = seed // 4
    if kind == "import hf":
        source = HF_CONFIGS[sorted(HF_CONFIGS)[pick % len(HF_CONFIGS)]]
        if seed % 8 < 4:
            doc, steps = mutate(source, seed)
            text = json.dumps(doc)
        else:
            text, steps = mutate_text(json.dumps(source, indent=1), seed)
        path = folder / "config.json"
        command = ["import", "hf", str(path)]
    elif kind == "search":
        text, steps = mutate_text(TINY_SEARCH, seed)
        path = folder / "search.yaml"
        command = ["search", str(path), "--refine", "1", "--top", "3"]
    else:
        originals = SCRIPTS + LOGS if kind == "import megatron" else LOGS
        original = originals[pick % len(originals)]
        text, steps = mutate_text(original.read_text(encoding="utf-8"), seed)
        path = folder / original.name
        command = (["import", "megatron", str(path), "--world-size", "8"] if kind == "import megatron"
                   else ["calibrate", str(path)] + (["--gpu", "H100"] if pick % 2 else []))
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    return command, [kind, *steps]


def test_mutated_inputs_of_every_reading_command_end_in_0_1_2(tmp_path, monkeypatch):
    import planner.search.run as search_run

    monkeypatch.setattr(search_run, "default_workers", lambda: 1)  # no process pool per case
    crashes, outcomes = [], Counter()
    for seed in range(FIRST_SEED, FIRST_SEED + FILE_CASES):
        folder = tmp_path / str(seed)
        folder.mkdir()
        command, steps = _reading_case(seed, folder)
        started = time.monotonic()
        result = _runner.invoke(app, command)
        seconds = time.monotonic() - started
        outcomes[f"{steps[0]}: exit {result.exit_code}"] += 1
        crashed = result.exit_code not in (0, 1, 2) or not isinstance(result.exception, SystemExit | None)
        if crashed or seconds > CASE_SECONDS:
            crashes.append(f"seed {seed}: {' | '.join(steps)}: exit {result.exit_code}, "
                           f"{seconds:.0f} s: {result.exception!r:.300}")
    print(f"\n{FILE_CASES} reading cases from seed {FIRST_SEED}: {dict(outcomes)}")
    assert crashes == []

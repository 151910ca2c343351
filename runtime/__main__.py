"""`python -m runtime --plan plan.json` under torchrun: run a compiled plan and prove it.

    torchrun --standalone --nproc-per-node=8 -m runtime --plan plan.json --steps 2 \\
        --check-reference --balanced --report report.json
    moeplan verify plan.json report.json

PP/VPP plans run as torch.distributed.pipelining schedules (runtime/pipeline.py). `--save DIR`
writes a layout-free checkpoint after the last step and `--load DIR` resumes from one saved under
any layout of the same model (runtime/checkpoint.py); `--steps 0 --load A --save B` re-saves.

Exit codes: 0 ok, 1 the reference check found a mismatch, 2 the plan or the launch is unusable
(refused before any process group forms, with a message and no traceback; a plan whose figures
are not what its own config compiles to, re-derived by `moeplan verify PLAN` in a child process
on rank 0, is named by its first differing figure, runtime/rederive.py), 3 this rank failed
during the run (the message names the rank; torchrun then ends the other ranks), 4 the job lost a
rank: one never arrived at the rendezvous, the store did not answer, or a peer stopped responding
(runtime/rendezvous.py, runtime/heartbeat.py; the message names the rank).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_RANK_FAILED, EXIT_PEER_LOST = 0, 1, 2, 3, 4


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m runtime",
        description="Run a compiled moeplan plan on this torchrun job and measure it.")
    parser.add_argument("--plan", required=True, type=Path, help="plan.json from `moeplan compile`")
    parser.add_argument("--steps", type=int, default=1, help="optimizer steps (default 1)")
    parser.add_argument("--check-reference", action="store_true",
                        help="also train the single-process reference and fail on any mismatch")
    parser.add_argument("--balanced", action="store_true",
                        help="forced balanced routing: every EP/ETP byte count becomes exact")
    parser.add_argument("--report", type=Path, help="write the merged report.json here (rank 0)")
    parser.add_argument("--seed", type=int, help="seed for weights and data (default: the plan's)")
    parser.add_argument("--load", type=Path, metavar="DIR",
                        help="before the first step, load a checkpoint saved under any layout of "
                             "the same model (weights, optimizer, expert bias, data position)")
    parser.add_argument("--save", type=Path, metavar="DIR",
                        help="after the last step, save a layout-free checkpoint (DCP) here")
    args = parser.parse_args(argv)
    if args.steps < 0 or (args.steps == 0 and not (args.load and args.save)):
        parser.error("--steps must be at least 1 (0 only with --load and --save: re-save a "
                     "checkpoint under this layout)")
    if args.load is not None and args.check_reference:
        parser.error("--check-reference trains the reference from initialisation: it cannot "
                     "check a run that starts from --load")
    return args


@dataclass
class Outcome:
    code: int
    report: dict[str, Any] | None  # the merged report on rank 0, None elsewhere


def _say(message: str) -> None:
    print(f"moeplan runtime: {message}", file=sys.stderr, flush=True)


def preflight(plan: Any, balanced: bool) -> None:
    """Refusals that need the MoE settings, still before any process group forms."""
    from runtime.router import MoESettings, check_balanced_routing

    settings = MoESettings.from_config(plan.model, plan.moe)
    if balanced:
        rows = int(plan.training["seq_length"]) // int(plan.layout["cp"])
        if plan.parallel.get("sequence_parallel"):  # a router sees its TP rank's share
            rows //= int(plan.layout["tp"])
        rows *= int(plan.training["micro_batch_size"])
        check_balanced_routing(rows, settings.topk, settings.num_experts)


def _single_process_env() -> None:
    """Let a one-rank plan run without torchrun (env:// needs these four variables)."""
    if "RANK" in os.environ:
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def launch_problem(plan: Any) -> str | None:
    """A plan for N ranks needs a job of N ranks; say how to start one."""
    world = os.environ.get("WORLD_SIZE")
    if world is None:
        if plan.world_size == 1:
            return None
        return (f"the plan is for {plan.world_size} ranks: start it with `torchrun --standalone "
                f"--nproc-per-node={plan.world_size} -m runtime --plan ...`")
    if not world.isdigit():
        return f"WORLD_SIZE={world!r} is not a whole number: let torchrun set it"
    if int(world) != plan.world_size:
        return (f"the plan is for {plan.world_size} ranks but this job has {world}: use "
                f"--nproc-per-node={plan.world_size} (or nodes x processes = {plan.world_size})")
    return None


def execute(plan: Any, options: Any, check: bool, report_path: Path | None,
            load: Path | None = None, save: Path | None = None) -> Outcome:
    """Groups → model → [load] → steps → [save] → reference check → report."""
    import torch.distributed as dist

    from runtime.equivalence import check_reference, describe_mismatches
    from runtime.groups import build_groups
    from runtime.heartbeat import note_phase
    from runtime.report import gather_report, write_report
    from runtime.train import RankTrainer

    note_phase("groups")
    groups = build_groups(plan)
    note_phase("model")
    trainer = RankTrainer(plan, groups, options)
    if load is not None:
        from runtime.checkpoint import load_checkpoint

        note_phase("load")
        trainer.start_step = load_checkpoint(load, plan, trainer)
    result = trainer.run()
    if save is not None:
        from runtime.checkpoint import save_checkpoint

        note_phase("save")
        save_checkpoint(save, plan, trainer, trainer.start_step + options.steps)
        if dist.get_rank() == 0:
            print(f"saved {save} after step {trainer.start_step + options.steps}", flush=True)
    note_phase("reference")
    reference = (check_reference(plan, trainer, result, options) if check
                 else {"checked": False})
    note_phase("report")
    report = gather_report(plan, options, trainer.seed, result, reference)
    code = EXIT_MISMATCH if check and not reference["ok"] else EXIT_OK
    if dist.get_rank() == 0 and report is not None:
        # Under PP only the last stage has a loss: show the lowest rank that computed one.
        source = next((share for share in report["ranks"] if share["step_losses"]), None)
        if source is not None:
            losses = ", ".join(f"{loss:.6f}" for loss in source["step_losses"])
            print(f"ran {plan.world_size} ranks x {options.steps} step(s); rank-"
                  f"{source['rank']} loss per step: {losses}", flush=True)
        if check:
            verdict = "ok" if reference["ok"] else "MISMATCH"
            print(f"reference check: {verdict}, {reference['tensors_checked']} tensors, max "
                  f"relative error {reference['max_rel_error']:.3e} (tolerance "
                  f"{reference['tolerance']:g})", flush=True)
            for line in describe_mismatches(reference):
                _say(line)
        if report_path is not None:
            write_report(report, report_path)
            print(f"wrote {report_path}", flush=True)
    return Outcome(code, report)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from runtime.plan_io import PlanError, load_plan, required
    from runtime.rederive import Rederivation, checks_here

    try:  # the plan checks need no torch: a refused plan answers at once
        plan = load_plan(args.plan)
    except PlanError as exc:
        _say(str(exc))
        return EXIT_USAGE
    # Rank 0 re-derives the plan from its config in a child while torch imports (the digest
    # proves the file intact, not that its figures follow from its config).
    rederivation = Rederivation(args.plan) if checks_here() else None
    from runtime.router import MoEConfigError

    try:
        forced = required(plan.moe, "moe_router_force_load_balancing", "config.moe")
        balanced = args.balanced or bool(forced)
        preflight(plan, balanced)
        learned = sorted(set(plan.moe_layers()) - set(plan.hash_layers()))
        if args.check_reference and plan.training["precision"] != "fp32" and learned and not balanced:
            raise PlanError(f"--check-reference at training.precision = "
                            f"{plan.training['precision']!r} with learned routing (MoE layers "
                            f"{learned}): bf16 rounding can flip a near-tied top-k choice between "
                            "the ranks and the reference, a different model rather than a rounding "
                            "error; add --balanced (forced balanced routing) to check it")
    except (PlanError, MoEConfigError) as exc:
        if rederivation is not None:
            rederivation.cancel()
        _say(str(exc))
        return EXIT_USAGE
    # An edited plan is named before a launch problem: fixing the launch would not make it run.
    problem = (rederivation.problem() if rederivation else None) or launch_problem(plan)
    if problem is not None:
        _say(problem)
        return EXIT_USAGE

    import torch.distributed as dist

    from runtime.failure import rank_failure_message
    from runtime.groups import GROUP_TIMEOUT, init_distributed
    from runtime.heartbeat import Heartbeat, Limits
    from runtime.rendezvous import LaunchEnvironmentError, RendezvousError
    from runtime.train import RunOptions

    # DCP (and DTensor with it, about a CPU second per rank) loads only for a job that loads or
    # saves a checkpoint; no other can raise CheckpointError.
    checkpoint_errors: tuple[type[Exception], ...] = ()
    if args.load is not None or args.save is not None:
        from runtime.checkpoint import CheckpointError

        checkpoint_errors = (CheckpointError,)
    options = RunOptions(steps=args.steps, balanced=balanced, seed=args.seed,
                         capture=args.check_reference, progress=args.steps > 1)
    _single_process_env()
    try:
        endpoint = init_distributed(plan.digest)
        heartbeat = (Heartbeat(endpoint, Limits.of(GROUP_TIMEOUT), EXIT_PEER_LOST).start()
                     if endpoint.world_size > 1 else None)
    except LaunchEnvironmentError as exc:
        _say(str(exc))
        return EXIT_USAGE
    except RendezvousError as exc:
        _say(str(exc))
        return EXIT_PEER_LOST
    try:
        code = execute(plan, options, args.check_reference, args.report, args.load,
                       args.save).code
    except checkpoint_errors as exc:  # raised before or between collectives: leave at once
        _say(f"rank {dist.get_rank()}: {exc}")
        os._exit(EXIT_USAGE)
    except (PlanError, MoEConfigError) as exc:
        _say(str(exc))
        if heartbeat is not None:
            heartbeat.stop()
        dist.destroy_process_group()
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - any crash: name the rank, leave at once
        if heartbeat is not None:  # a silent store is the cause: its watchdog names it and exits
            heartbeat.blame_store()
        traceback.print_exc()
        _say(rank_failure_message(dist.get_rank(), exc))
        # No teardown: the peers may be blocked in a collective with this rank, and a graceful
        # destroy could wait on them. Exiting lets torchrun's agent end the job now.
        os._exit(EXIT_RANK_FAILED)
    if heartbeat is not None:
        heartbeat.stop()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())

"""Megatron-LM's own MoE functional tests, the small-model regime (hidden 512, 4-13 layers, one
8-GPU H100 node): does moeplan's step time come within 2x of what Megatron's CI measured?

Each case is read the way a user brings it: its model_config.yaml (MODEL_ARGS, verbatim from
Megatron-LM, bench/megatron_ci/<case>.yaml with its source in the header) through `moeplan import
megatron`'s own reader, on the CI's one DGX H100 node (8 ranks), with the GPT-2 BPE vocabulary its
--vocab-file names (50,257 tokens; Megatron pads it). The measured step is the median of the
case's golden iteration times from iteration 10 on (bench/megatron_ci/measured.yaml, with source).

Printed per case: measured and predicted seconds, their ratio, and the flags the case runs that
moeplan's argument table marks as unpriced time (what moeplan does not model in that case);
with --parts, the slowest stage's step split into the parts that make it (so the term that
dominates a case's estimate is read off, not guessed); with --graphs, for a case whose golden file
records an eager step before its CUDA graphs were captured, that step beside moeplan's estimate
without graphs, and the share of the eager step the graphs leave, measured and estimated (what the
graphs remove, judged apart from the rest of the step). Summary: cases within 2x, the median
|ratio - 1|. Nothing here gates and nothing is fitted to these figures.

    OMP_NUM_THREADS=1 .venv/bin/python bench/megatron_ci.py [--markdown] [--parts] [--graphs]
                                                            [--case NAME]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.config.importers.sources import import_text  # noqa: E402
from planner.config.loader import parse_config  # noqa: E402
from planner.estimate import estimate  # noqa: E402

DATA = ROOT / "bench" / "megatron_ci"
RANKS = 8  # tests/test_utils/recipes/h100/moe.yaml: nodes 1, gpus 8
GPT2_VOCAB = 50257  # the BPE vocab.json every case's --vocab-file names


# The slowest stage's step as the time page builds it: its host time the GPU waits for (launches
# beyond the GPU work), the GPU work, communication and offload copies left exposed, the pipeline
# bubble and the optimizer step.
PARTS = (("host", "time_fixed_s"), ("gpu", "time_gpu_s"), ("comm", "time_exposed_comm_s"),
         ("bubble", "time_bubble_s"), ("optimizer", "time_optimizer_s"))


@dataclass(frozen=True)
class Case:
    name: str
    measured_s: float
    predicted_s: float | None
    why: str  # why there is no prediction, or the flags moeplan does not price
    parts: tuple[tuple[str, float], ...] = ()  # the slowest stage's step, part by part
    eager_measured_s: float | None = None  # the golden file's last step before graph capture
    eager_predicted_s: float | None = None  # moeplan's step with cuda_graph_impl none

    @property
    def ratio(self) -> float | None:
        return None if self.predicted_s is None else self.predicted_s / self.measured_s


def judge(name: str, measured_s: float, eager_s: float | None = None) -> Case:
    text = (DATA / f"{name}.yaml").read_text(encoding="utf-8")
    try:
        imported, _ = import_text(text, {}, world_size=RANKS)
        data = copy.deepcopy(imported.data)
        data.setdefault("model", {}).setdefault("vocab_size", GPT2_VOCAB)
        data.setdefault("cluster", {})["gpu"] = "H100"
        est = estimate(parse_config(data), exact=False)
        eager = None
        if eager_s is not None:
            data["overlap"] = {**data.get("overlap", {}), "cuda_graph_impl": "none",
                               "cuda_graph_scope": []}
            eager = estimate(parse_config(data), exact=False).step_time_s
    except Exception as exc:  # a bench row, not the product: report and go on
        return Case(name, measured_s, None, f"{type(exc).__name__}: {exc}"[:160])
    from planner.config.argument_classes import argument_classes
    classes = argument_classes()
    words = data.get("launch", {}).get("megatron_extra_args", [])
    unpriced = sorted({w[2:] for w in words if w.startswith("--")
                       and getattr(classes.get(w[2:].replace("-", "_")), "kind", "") == "warning"})
    env = est.envs[est.slowest_stage]
    parts = tuple((label, float(env[key])) for label, key in PARTS if key in env)
    return Case(name, measured_s, est.step_time_s, " ".join(unpriced), parts, eager_s, eager)


def cases(only: str | None = None) -> list[Case]:
    measured = yaml.safe_load((DATA / "measured.yaml").read_text(encoding="utf-8"))["cases"]
    return [judge(name, row["step_time_s"], row.get("eager_step_time_s"))
            for name, row in measured.items()
            if only is None or only in name]


def summary(rows: list[Case]) -> str:
    judged = [r for r in rows if r.ratio is not None]
    within = [r for r in judged if 0.5 <= r.ratio <= 2.0]
    errors = [abs(r.ratio - 1) for r in judged]
    return (f"{len(within)} of {len(rows)} cases within 2x "
            f"({len(rows) - len(judged)} without an estimate); median |ratio - 1| = "
            f"{100 * statistics.median(errors):.1f} %" if errors else "no case judged")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--case", help="only the cases whose name contains this")
    parser.add_argument("--parts", action="store_true",
                        help="print the slowest stage's step part by part (seconds)")
    parser.add_argument("--graphs", action="store_true",
                        help="print the eager step before graph capture beside moeplan's")
    args = parser.parse_args()
    rows = cases(args.case)
    if args.markdown:
        print("| Megatron-LM CI case (moe/) | measured s | moeplan s | ratio |")
        print("|---|---|---|---|")
    for r in rows:
        pred = "—" if r.predicted_s is None else f"{r.predicted_s:.4f}"
        ratio = "—" if r.ratio is None else f"{r.ratio:.2f}"
        if args.markdown:
            print(f"| {r.name} | {r.measured_s:.4f} | {pred} | {ratio} |")
        else:
            print(f"{r.name[:78]:78s} {r.measured_s:8.4f} {pred:>8s} {ratio:>6s}  {r.why[:60]}")
        if args.parts and r.parts:
            print("    " + "  ".join(f"{label} {value:.4f}" for label, value in r.parts))
        if args.graphs and r.eager_measured_s and r.eager_predicted_s and r.predicted_s:
            print(f"    without graphs: measured {r.eager_measured_s:.4f}  moeplan "
                  f"{r.eager_predicted_s:.4f}; graphed / eager: measured "
                  f"{r.measured_s / r.eager_measured_s:.2f}, moeplan "
                  f"{r.predicted_s / r.eager_predicted_s:.2f}")
    print()
    print(summary(rows))


if __name__ == "__main__":
    main()

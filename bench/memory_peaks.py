"""Judge the memory budget on measured `max allocated` peaks it was never fitted on
(bench/memory_peaks.yaml).

Each figure is a real moeplan config evaluated by the formula book (planner/accounting.py
stage_memory) as `moeplan budget` would. Printed per figure: the measured peak, moeplan's allocated
peak of the logging rank's stage (`peak_memory_bytes`) and the ratio, and the device total of the
busiest EP rank (`device_memory_bytes`: allocated + reserved slack + CUDA context + NCCL buffers)
with the headroom it leaves on the card. Last lines: the median |ratio - 1| per group and over all.

These figures judge; they do not gate: nothing here fails on a bad ratio.

    .venv/bin/python bench/memory_peaks.py              # table on the terminal
    .venv/bin/python bench/memory_peaks.py --markdown   # the table as Markdown
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.accounting import stage_memory  # noqa: E402
from planner.config.schema import Config  # noqa: E402

DATA = ROOT / "bench" / "memory_peaks.yaml"
GIB = 2**30


def config_of(entry: dict[str, Any]) -> Config:
    if "anchor" in entry:
        from tests.support.estimate_anchors import ANCHORS

        return ANCHORS[entry["anchor"]][0]
    if "log" in entry:  # the run's own argument dump, on the card its source names
        from planner.calibrate.calibration import with_gpu
        from planner.calibrate.megatron_log import parse_log
        from planner.calibrate.source import config_for_log

        path = ROOT / entry["log"]
        cfg = config_for_log(parse_log(path.read_text(encoding="utf-8"), str(path)), None)
        return with_gpu(cfg, entry["gpu"])
    return Config.model_validate(entry["config"], strict=False)


def rows() -> list[dict[str, Any]]:
    out = []
    for entry in yaml.safe_load(DATA.read_text(encoding="utf-8")):
        cfg = config_of(entry)
        stages = stage_memory(cfg)
        if stages is None:
            raise SystemExit(f"{entry['id']}: the config cannot be budgeted")
        env = stages[0 if entry["stage"] == "first" else -1]
        measured = entry["max_allocated_bytes"]
        peak, device, gpu = (float(env[k]) for k in ("peak_memory_bytes", "device_memory_bytes",
                                                     "gpu_memory_bytes"))
        out.append({"id": entry["id"], "group": entry["group"], "measured": measured, "peak": peak,
                    "ratio": peak / measured, "device": device, "headroom": 1 - device / gpu})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    table = rows()
    head = ("run", "measured GiB", "predicted GiB", "ratio", "device total GiB", "headroom")
    lines = [[r["id"], f"{r['measured'] / GIB:.2f}", f"{r['peak'] / GIB:.2f}", f"{r['ratio']:.3f}",
              f"{r['device'] / GIB:.2f}", f"{r['headroom']:.1%}"] for r in table]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" for _ in head) + "|")
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *lines, strict=False)]
        for line in (head, *lines):
            print("  ".join(str(x).rjust(w) for x, w in zip(line, widths, strict=True)))
    for group in dict.fromkeys(r["group"] for r in table):
        errors = [abs(r["ratio"] - 1) for r in table if r["group"] == group]
        print(f"{group}: median |ratio - 1| {statistics.median(errors):.1%} over {len(errors)}")
    overall = [abs(r["ratio"] - 1) for r in table]
    print(f"all: median |ratio - 1| {statistics.median(overall):.1%} over {len(overall)}")


if __name__ == "__main__":
    main()

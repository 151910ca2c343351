"""How fast `moeplan check` judges big-but-legal configs: an `ignore:` list and an unknown section
of a million entries (examples/tiny-cpu-8.yaml plus the entries), per 100,000 entries.

Each figure is CPU seconds of the whole check in one process (read, YAML, schema, rules), less the
same check of the bare tiny config, per 100,000 entries. Two ratios make it comparable across
machines: against libyaml's own event stream over the same text (the floor of any reading with
PyYAML), and, with `--baseline TREE`, against another source tree's moeplan timed in the same
command (`git archive <commit> planner examples | tar -x -C /tmp/old`).

Run: `.venv/bin/python bench/yaml_bench.py [--entries N] [--baseline TREE]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PER = 100_000


def big_texts(tiny: str, entries: int) -> dict[str, str]:
    """The two big-but-legal configs of issue 26: entries are one line each."""
    return {
        "ignore list": tiny + "ignore:\n" + "".join(f"  - PAR{i:07d}\n" for i in range(entries)),
        "unknown section": tiny + "extra:\n" + "".join(f"  k{i}: {i}\n" for i in range(entries)),
    }


def _check_seconds(path: Path) -> tuple[float, int]:
    """CPU seconds and exit status of `moeplan check PATH`, in this process."""
    from typer.testing import CliRunner

    from planner.cli import app

    start = time.process_time()
    result = CliRunner().invoke(app, ["check", str(path)])
    return time.process_time() - start, result.exit_code


def _event_seconds(text: str) -> float:
    """CPU seconds of libyaml's event stream over `text`, every event made a Python object."""
    import yaml

    loader = yaml.CSafeLoader(text)
    start = time.process_time()
    while loader.get_event() is not None:
        pass
    seconds = time.process_time() - start
    loader.dispose()
    return seconds


def measure(tree: Path, entries: int, scratch: Path, repeats: int = 3) -> dict[str, dict[str, float]]:
    """Per case: seconds per 100k entries, the libyaml floor per 100k, and the exit status (the
    bare check: the fastest of `repeats`)."""
    tiny = (tree / "examples" / "tiny-cpu-8.yaml").read_text()
    (scratch / "tiny.yaml").write_text(tiny)
    _check_seconds(scratch / "tiny.yaml")  # imports and first-call caches
    bare = min(_check_seconds(scratch / "tiny.yaml")[0] for _ in range(repeats))
    out = {}
    for name, text in big_texts(tiny, entries).items():
        path = scratch / (name.replace(" ", "_") + ".yaml")
        path.write_text(text)
        seconds, status = _check_seconds(path)
        per = max(seconds - bare, 0.0) * PER / entries
        floor = _event_seconds(text) * PER / entries
        out[name] = {"per_100k_s": per, "libyaml_per_100k_s": floor, "ratio_to_libyaml": per / floor,
                     "exit": status}
    return out


def _measure_tree(tree: Path, entries: int, scratch: Path) -> dict:
    """Measure a source tree in its own process (two trees' `planner` cannot share one)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(tree),
               "--entries", str(entries), "--scratch", str(scratch)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--baseline", type=Path, help="another source tree, timed the same way")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/moeplan-yaml-bench"))
    args = parser.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    if args.worker:
        print(json.dumps(measure(args.worker, args.entries, args.scratch)))
        return
    trees = {"after": ROOT} | ({"before": args.baseline.resolve()} if args.baseline else {})
    results = {label: _measure_tree(tree, args.entries, args.scratch) for label, tree in trees.items()}
    print(f"{args.entries:,} entries; CPU seconds per 100,000 entries (the bare check subtracted)")
    for case in results["after"]:
        for label, found in results.items():
            row = found[case]
            print(f"  {case:16s} {label:6s} {row['per_100k_s']:6.3f} s  exit {row['exit']}  "
                  f"{row['ratio_to_libyaml']:5.2f}× libyaml's events ({row['libyaml_per_100k_s']:.3f} s)")
        if "before" in results:
            ratio = results["before"][case]["per_100k_s"] / max(results["after"][case]["per_100k_s"], 1e-9)
            print(f"  {case:16s} before/after {ratio:.1f}×")


if __name__ == "__main__":
    main()

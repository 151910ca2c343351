"""`python -m planner.docs [--check] [--out DIR]`: regenerate (or check) the generated docs pages."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner.docs import stale_pages, write_pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.docs", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs"),
                        help="the docs folder (default: ./docs)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a committed page is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages(args.out)
        for name in stale:
            print(f"{args.out / name} is stale: run `python -m planner.docs`", file=sys.stderr)
        return 1 if stale else 0
    for name in write_pages(args.out):
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())

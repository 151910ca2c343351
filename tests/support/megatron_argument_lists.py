"""The argument names of a Megatron-LM checkout's parser, written to the committed lists moeplan reads
(planner/config/data/megatron_arguments.txt for dev@d48bd6be, megatron_arguments_main.txt for
main@d98e8a64), so CI needs no checkout of either and the classes table can say which parser has
each argument.

Regenerate a list from a checkout (a folder holding the `megatron` package):

    python -m tests.support.megatron_argument_lists dev DEV_DIR
    python -m tests.support.megatron_argument_lists main MAIN_DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner.config.megatron_names import DATA_FILE, MAIN_DATA_FILE
from tests.support.megatron_snippet import snippet_json

LISTS = {"dev": DATA_FILE, "main": MAIN_DATA_FILE}


_NAMES = """
import argparse
from megatron.training.arguments import add_megatron_arguments
from planner.config.megatron_names import names_of_parser
parser = argparse.ArgumentParser(allow_abbrev=False)
add_megatron_arguments(parser)
print(json.dumps(names_of_parser(parser)))
"""


def parser_argument_names(megatron: Path) -> list[str]:
    """The long option names of the parser a Megatron-LM checkout builds
    (megatron/training/arguments.py add_megatron_arguments), through
    tests/support/megatron_snippet.py."""
    return snippet_json(_NAMES, megatron)


def write_list(which: str, megatron: Path) -> Path:
    """Rewrite the committed list `which` (dev or main) from `megatron`, keeping its header."""
    target = LISTS[which]
    header = [line for line in target.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    target.write_text("\n".join([*header, *parser_argument_names(megatron)]) + "\n", encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=sorted(LISTS))
    parser.add_argument("checkout", type=Path)
    args = parser.parse_args(argv)
    if not (args.checkout / "megatron" / "training" / "arguments.py").is_file():
        sys.exit(f"no megatron/training/arguments.py under {args.checkout}")
    print(write_list(args.which, args.checkout))


if __name__ == "__main__":
    main()

"""The Megatron-LM version table (docs/megatron-versions.md): every Megatron file and function that
moeplan's code, rules and formulas cite, and whether it differs between the two commits moeplan
follows (dev@d48bd6be, main@d98e8a64).

Run it with both checkouts (each a folder holding the `megatron` package) to rewrite the page:

    python -m tests.support.megatron_versions --update DEV_DIR MAIN_DIR

`citations()` needs no checkout; tests/unit/test_megatron_versions.py holds the page to it (every
cited file has its row), so a new citation without a row fails the suite.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
from collections.abc import Iterable
from pathlib import Path

from tests.support.paths import ROOT

PAGE = ROOT / "docs" / "megatron-versions.md"
SCANNED = ("planner", "runtime", "templates")
DEV, MAIN = "dev@d48bd6be", "main@d98e8a64"
# A path broken over two comment lines after a slash ("megatron/core/distributed/\n    # ddp.py").
_BROKEN = re.compile(r"/[ \t]*\n[ \t]*(?:#[ \t]*)?(?=[A-Za-z_])")
_CITED = re.compile(r"(?<![\w/])megatron/((?:[A-Za-z0-9_]+/)*[A-Za-z0-9_]+\.py)(?::[\d,-]+)?"
                    r"(?:[ \t]+([A-Za-z_][\w.]*))?")
_HELPER = re.compile(r"\b(?:dev|main)\(\s*\"([a-z0-9_/]+\.py)\",\s*\"([A-Za-z_][\w.]*)\"")

# What moeplan takes from a cited function that differs, written by hand after reading both
# versions (the page shows it beside the measured difference).
NOTES: dict[tuple[str, str], str] = {
    ("core/extensions/transformer_engine.py", "TELinear.__init__"):
        "main gives experts the EP/ETP/EGTP/EDP groups when EP > 1, ETP != TP or EGTP != GTP "
        "(use_expert_pgs); dev tests EP > 1 only. moeplan follows main (Degrees.expert_grad_buffer): "
        "the two agree whenever ETP = TP and GTP = EGTP = 1",
    ("core/transformer/moe/token_dispatcher.py", "MoEFlexTokenDispatcher.__init__"):
        "dev has a fourth backend, deepepv2 (DeepEP v2's ElasticBuffer); main has deepep, hybridep "
        "and ncclep only, and refuses drop-and-pad with ncclep (MOE003 names both)",
    ("core/transformer/moe/token_dispatcher.py", "_NCCLEPManager.__init__"):
        "dev bootstraps NCCL EP with zero_copy=False and refuses moe_ncclep_use_symm_mem; main adds "
        "moe_ncclep_zero_copy (needs a rank capacity factor: MOE031) and an eager mode without one",
    ("core/transformer/moe/token_dispatcher.py", "_NCCLEPManager._ensure_bootstrap"):
        "both size the receive budget as ceil64(local tokens) · ETP·k · factor, aligned; main also "
        "allocates the persistent bf16 zero-copy buffers (moeplan's zero_copy_buffers)",
    ("core/transformer/transformer_config.py", "TransformerConfig.__post_init__"):
        "the flex backend Literal differs (deepepv2 only on dev); GTP / EGTP checks only on main",
    ("core/parallel_state.py", "initialize_model_parallel"):
        "main inserts the gtp_remat axis and its groups; with GTP = EGTP = 1 both build the same "
        "groups (tests/integration/megatron/test_megatron_core_groups.py)",
}


def _normalized(text: str) -> str:
    return _BROKEN.sub("/", text)


def citations(root: Path = ROOT) -> dict[str, set[str]]:
    """{path under megatron/: the function names cited with it} over the shipped code."""
    cited: dict[str, set[str]] = {}
    for name in SCANNED:
        for path in sorted((root / name).rglob("*")):
            if path.suffix not in {".py", ".j2"} or "__pycache__" in path.parts:
                continue
            text = _normalized(path.read_text(encoding="utf-8"))
            for found in _CITED.finditer(text):
                cited.setdefault(found.group(1), set())
                function = found.group(2)
                if function and (function[0].isupper() or "_" in function or "." in function):
                    cited[found.group(1)].add(function.rstrip("."))
            for found in _HELPER.finditer(text):
                cited.setdefault(f"core/{found.group(1)}" if not found.group(1).startswith(
                    ("core/", "training/")) else found.group(1), set()).add(found.group(2))
    return cited


def _node(tree: ast.Module, qualified: str) -> ast.AST | None:
    """The def or class `Class.method` / `function` names in a module, or None."""
    scope: Iterable[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in qualified.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                         ast.ClassDef)) and n.name == part), None)
        if node is None:
            return None
        scope = node.body  # type: ignore[attr-defined]
    return node


def _source(root: Path, path: str) -> str | None:
    file = root / "megatron" / path
    return file.read_text(encoding="utf-8") if file.is_file() else None


def _changed_lines(before: str, after: str) -> tuple[int, int]:
    added = removed = 0
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def _status(dev: str | None, main: str | None, qualified: str | None) -> str:
    if dev is None or main is None:
        return "file only on " + ("main" if dev is None else "dev") if dev or main else "in neither"
    if qualified is None:
        if dev == main:
            return "same"
        added, removed = _changed_lines(dev, main)
        return f"file differs (main +{added} −{removed} lines)"
    trees = [ast.parse(dev), ast.parse(main)]
    nodes = [_node(tree, qualified) for tree in trees]
    if nodes[0] is None or nodes[1] is None:
        where = [b for b, n in zip(("dev", "main"), nodes, strict=True) if n is not None]
        return (f"only on {where[0]}" if where else
                "no top-level def of that name in either (an attribute, or defined conditionally)")
    texts = [ast.get_source_segment(text, node) or "" for text, node in zip((dev, main), nodes, strict=True)]
    if texts[0] == texts[1]:
        return "same"
    added, removed = _changed_lines(texts[0], texts[1])
    return f"differs (main +{added} −{removed} lines)"


def page(dev_root: Path, main_root: Path) -> str:
    lines = [
        "# What changed between the Megatron-LM commits moeplan cites",
        "",
        "Every Megatron-LM file and function that moeplan's code, rule sources and formula notes "
        "cite, compared between the two commits moeplan follows: `dev` d48bd6be (2026-08-21, the "
        "default) and `main` d98e8a64 (2026-08-22, GTP/EGTP and the main-only checks). The "
        "DeepSeek-V4 write-up pins Megatron-LM of 2026-10-26; no snapshot that new was available "
        "(the newest stored one is main d98e8a64), so its facts are checked against these two, and "
        "where they differ moeplan keeps both (the rule or formula names the branch). Written by "
        "`python -m tests.support.megatron_versions --update DEV_DIR MAIN_DIR`; "
        "`tests/unit/test_megatron_versions.py` fails when a citation has no row.",
        "",
        f"| file under `megatron/` | cited function | {DEV} → {MAIN} "
        "| what moeplan takes where they differ |",
        "|---|---|---|---|",
    ]
    for path, functions in sorted(citations().items()):
        dev, main = _source(dev_root, path), _source(main_root, path)
        for qualified in [None, *sorted(functions)]:
            note = NOTES.get((path, qualified or ""), "")
            lines.append(f"| `{path}` | {f'`{qualified}`' if qualified else '(file)'} | "
                         f"{_status(dev, main, qualified)} | {note} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", required=True)
    parser.add_argument("dev", type=Path)
    parser.add_argument("main", type=Path)
    args = parser.parse_args()
    PAGE.write_text(page(args.dev, args.main), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

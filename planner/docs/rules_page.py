"""docs/rules.md: the rule catalog as one page, from the same entries `moeplan rules` prints."""

from __future__ import annotations

from planner.docs.markdown import GENERATED_NOTE, cell, fenced
from planner.rules import CATALOG
from planner.rules.example_base import EXAMPLE_BASE_YAML

FAMILIES: dict[str, str] = {
    "CFG": "The config file itself (reported by the loader)",
    "PAR": "Process grids and group sizes",
    "BAT": "Batch and microbatches",
    "PIP": "Pipeline split",
    "V4": "DeepSeek-V4 features",
    "MOE": "Routing, dispatchers and capacity",
    "OVL": "Overlap and recompute",
    "GTP": "GTP / EGTP weight rematerialisation",
    "DOP": "Distributed optimizer",
    "VEX": "Virtual experts",
    "ARC": "Current MoE architectures (gpt-oss, GLM-4.5, MiniMax-M2, Llama 4, Qwen3-Next, DeepSeek-V3.2)",
    "CLU": "Cluster",
    "MEM": "Memory budget",
    "OFL": "Fine-grained activation offloading",
    "ARG": "Megatron arguments carried verbatim",
    "IGN": "The ignore list",
}


def rules_page() -> str:
    families: dict[str, list] = {}
    for entry in CATALOG:
        families.setdefault(entry.family, []).append(entry)
    lines = [
        GENERATED_NOTE.format(what="planner/rules/"),
        "# Rule catalog",
        "",
        f"moeplan checks {len(CATALOG)} rules. `moeplan check CONFIG` reports every violated one at "
        "once, errors first; `moeplan rules` lists them and `moeplan rules CODE` prints one entry "
        "exactly as below. An error makes `check` exit 1; warnings and infos never change the exit "
        "code. A code listed under `ignore:` in the config is not reported, except the structural "
        "errors that make the layout impossible to build.",
        "",
        "Each entry gives the rule's severity, what reports it, the source it enforces (a Megatron-LM "
        "file and function at a named commit, or a moeplan module), why it exists, and a bad and a "
        "good example. The examples of checked rules are fragments merged onto this small valid "
        "8-rank config (`moeplan rules --base` prints it); the CFG examples are whole files. The "
        "test suite runs every example: the bad one must raise the code, the good one must not.",
        "",
        *fenced("yaml", EXAMPLE_BASE_YAML),
        "",
        "| code | severity | title |",
        "|---|---|---|",
        *(f"| [{e.code}](#{e.code.lower()}) | {e.severity} | {cell(e.title)} |" for e in CATALOG),
        "",
    ]
    for family, entries in families.items():
        lines += [f"## {family}: {FAMILIES.get(family, family)}", ""]
        for entry in entries:
            reported = "the loader" if entry.check is None else "`moeplan check`"
            lines += [
                f"### {entry.code}",
                "",
                f"**{entry.title}** ({entry.severity}, reported by {reported})",
                "",
                f"Source: {entry.source}",
                "",
                entry.why,
                "",
                "Bad:",
                "",
                *fenced("yaml", entry.bad),
                "",
                "Good:",
                "",
                *fenced("yaml", entry.good),
                "",
            ]
    return "\n".join(lines).rstrip("\n") + "\n"

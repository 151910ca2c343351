"""Article §0: the write-up pins Megatron-LM of 2026-10-26, moeplan follows dev@d48bd6be and
main@d98e8a64. docs/megatron-versions.md records, for every Megatron file and function the code,
rules and formulas cite, what differs between the two; this holds the page to the citations (a
new citation without its row fails) and to hand-checked facts of both commits."""

from __future__ import annotations

from tests.support.megatron_versions import PAGE, citations


def _rows() -> set[tuple[str, str]]:
    rows = set()
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows.add((cells[0].strip("`"), cells[1].strip("`")))
    return rows


def test_every_citation_has_its_row():
    rows, missing = _rows(), []
    for path, functions in citations().items():
        for name in ["(file)", *functions]:
            if (path, name) not in rows:
                missing.append(f"{path} {name}")
    assert not missing, ("cited but not in docs/megatron-versions.md (run python -m "
                         "tests.support.megatron_versions --update DEV_DIR MAIN_DIR):\n" + "\n".join(missing))


def test_hand_checked_differences():
    text = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            path, name = (c.strip().strip("`") for c in line.strip("|").split("|")[:2])
            text[f"{path} {name}"] = line
    # DeepEP v2 is dev-only; main's TELinear widens the expert-buffer condition; V4 attention is dev's
    assert "only on dev" in text["core/transformer/moe/token_dispatcher.py _DeepepV2Manager.dispatch"]
    assert "differs" in text["core/extensions/transformer_engine.py TELinear.__init__"]
    assert "file only on dev" in text["core/transformer/experimental_attention_variant/csa.py (file)"]
    # the loss-scale chain's forward_step is the same on both
    assert "| same |" in text["core/pipeline_parallel/schedules.py forward_step"]

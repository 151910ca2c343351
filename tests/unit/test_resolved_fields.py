"""A resolved config's derived fields have one home: the schema's validators fill them and every
reader takes them as they are. The scanner below fails on a fallback written at a reader
(`p.etp or p.tp`, `x.gemm_half_dim if x.gemm_half_dim is not None else ...`), which would be a
second home for the default (and a stale one the day the schema's changes)."""

from __future__ import annotations

import ast
from pathlib import Path

from planner.config.schema import Config

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "planner" / "config" / "schema.py"

# Every field the schema resolves, by section: never None on a validated Config.
RESOLVED = {
    "parallel": {"etp", "world_size"},
    "model": {"num_query_groups", "kv_channels", "ffn_hidden_size", "moe_ffn_hidden_size",
              "moe_shared_expert_intermediate_size", "qk_head_dim", "v_head_dim"},
    "cluster": {"nodes", "gpu"},
    "efficiency": {"gemm_half_dim", "gemm_fp8", "host_launch_scale"},
}
FIELDS = frozenset().union(*RESOLVED.values())

# Attributes of the same name on objects that are not a Config section (file, source text).
NOT_CONFIG = {
    ("planner/calibrate/calibration.py", "log.gpu"),  # the card a Megatron log names, if any
}


def _is_none_test(node: ast.expr) -> ast.Attribute | None:
    """The resolved attribute `node` compares with None (`a.f is None`, `a.f is not None`)."""
    if (isinstance(node, ast.Compare) and len(node.ops) == 1
            and isinstance(node.ops[0], ast.Is | ast.IsNot)
            and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None
            and isinstance(node.left, ast.Attribute) and node.left.attr in FIELDS):
        return node.left
    return None


def fallbacks(source: str, path: str = "<text>") -> list[tuple[int, str]]:
    """(line, code) of each fallback on a resolved field: a resolved attribute as a non-last operand
    of `or`, or an `if … is [not] None else` on one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        suspects: list[ast.expr] = []
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            suspects = [v for v in node.values[:-1] if isinstance(v, ast.Attribute) and v.attr in FIELDS]
        elif isinstance(node, ast.IfExp) and (attr := _is_none_test(node.test)) is not None:
            suspects = [attr]
        for attr in suspects:
            code = ast.unparse(attr)
            if (path, code) not in NOT_CONFIG:
                found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_scanner_finds_what_it_looks_for() -> None:
    assert fallbacks("etp = p.etp or p.tp") == [(1, "p.etp or p.tp")]
    assert fallbacks("n = (\n    cfg.parallel.world_size\n    or 1)") == [(2, "cfg.parallel.world_size or 1")]
    assert fallbacks("name = cfg.cluster.gpu or DEFAULT_GPU") == [(1, "cfg.cluster.gpu or DEFAULT_GPU")]
    half = "h = e.gemm_half_dim if e.gemm_half_dim is not None else card.gemm_half_dim"
    assert fallbacks(half) == [(1, half.removeprefix("h = "))]
    assert fallbacks("d = 0 if m.kv_channels is None else m.kv_channels") == [
        (1, "0 if m.kv_channels is None else m.kv_channels")]
    assert fallbacks("x = p.tp or 1") == []  # not a resolved field
    assert fallbacks("ok = p.etp == 1 or p.etp == p.tp") == []  # a test, not a fallback
    assert fallbacks("x = a or p.etp") == []  # the resolved field is the fallback itself
    assert fallbacks("s = 'p.etp or p.tp'  # p.etp or p.tp") == []  # text is not code
    assert fallbacks("g = log.gpu or gpu", "planner/calibrate/calibration.py") == []
    assert fallbacks("g = log.gpu or gpu", "planner/other.py") == [(1, "log.gpu or gpu")]


def test_no_module_falls_back_on_a_resolved_field() -> None:
    offenders = []
    for path in sorted((ROOT / "planner").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for line, code in fallbacks(path.read_text(encoding="utf-8"), rel):
            offenders.append(f"{rel}:{line}: {code}")
    assert offenders == [], ("the schema resolves these fields (planner/config/schema.py); read them "
                             "as they are:\n" + "\n".join(offenders))


def test_the_scanned_fields_are_the_schemas_resolved_fields() -> None:
    """Each scanned name is a field of its section, and a minimal config leaves none of them None."""
    cfg = Config.model_validate({
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_experts": 4,
                  "vocab_size": 128},
        "cluster": {"nodes": 1}, "training": {"seq_length": 16}, "parallel": {}})
    sections = {"parallel": cfg.parallel, "model": cfg.model, "cluster": cfg.cluster,
                "efficiency": cfg.cluster.efficiency}
    for section, names in RESOLVED.items():
        model = sections[section]
        assert names <= set(type(model).model_fields), section
        assert [n for n in sorted(names) if getattr(model, n) is None] == [], section
    # A stale exemption hides nothing: drop it once the file no longer reads that attribute.
    assert all(code in (ROOT / path).read_text(encoding="utf-8") for path, code in NOT_CONFIG)

"""The layout degrees have one owner (planner/degrees.py): hand-derived values, the formula book's
`layout` page and the grid's group sizes agree with it, and no module outside it multiplies the
degrees into a model size, DP·CP or ETP·EP again."""

from __future__ import annotations

import ast
import json
from math import lcm

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.accounting import Accounting
from planner.config.loader import load_config, parse_config
from planner.degrees import Degrees
from planner.layout.grid import Grid
from planner.layout.rank_generator import GridError
from planner.layout.spec import GridSpec, grid_spec_from_config
from planner.layout.summary import layout_summary
from planner.rules.facts import Facts
from tests.support.paths import EXAMPLES, ROOT

# ----------------------------------------------------------------- hand-derived


def test_v4_pro_layout_by_hand() -> None:
    # N = 1024 = TP1 · CP2 · DP64 · PP8 (dense) = ETP1 · EP64 · EDP2 · PP8 (expert), E = 384.
    d = load_config(EXAMPLES / "deepseek-v4-pro-1024.yaml").degrees
    assert (d.tp, d.cp, d.pp, d.ep, d.etp, d.gtp, d.egtp) == (1, 2, 8, 64, 1, 1, 1)
    assert d.dense_model_size == 1 * 2 * 8 * 1 == 16
    assert d.expert_model_size == 1 * 64 * 8 * 1 == 512
    assert (d.dp, d.edp) == (1024 // 16, 1024 // 512) == (64, 2)
    assert d.ranks_per_stage == 1024 // 8 == 128
    assert d.experts_per_rank == 384 // 64 == 6
    assert d.dp_cp_size == 64 * 2 == 128
    assert d.tp_ep_size == 1 * 64 == 64
    assert d.tp_cp_size == 1 * 2 == 2
    assert d.tp_dp_cp_size == 1 * 1 * 64 * 2 == 128
    assert d.divides and d.problems() == []


def test_tiny_cpu_layout_by_hand() -> None:
    # 8 = TP1 · CP2 · DP4 · PP1 = ETP2 · EP2 · EDP2 · PP1, E = 8: 4 experts per EP rank.
    d = load_config(EXAMPLES / "tiny-cpu-8.yaml").degrees
    assert (d.dp, d.edp, d.experts_per_rank) == (4, 2, 4)
    assert (d.dp_cp_size, d.tp_ep_size, d.tp_dp_cp_size) == (8, 4, 8)


def test_etp_defaults_to_tp() -> None:
    # Megatron's default ETP = TP: 16 = TP2 · EP2 · EDP4 with no etp given.
    d = Degrees.from_config(parse_config({
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                  "ffn_hidden_size": 128, "vocab_size": 256, "num_experts": 4},
        "parallel": {"world_size": 16, "tp": 2, "ep": 2},
        "training": {"seq_length": 64, "micro_batch_size": 1},
    }))
    assert (d.etp, d.expert_model_size, d.edp) == (2, 2 * 2 * 1 * 1, 16 // 4)


def test_problems_say_what_does_not_divide() -> None:
    # 12 ranks: TP·PP·CP·GTP = 1·1·1·1 divides, ETP·EP·PP·EGTP = 1·8·1·1 = 8 does not.
    d = Degrees(world_size=12, ep=8, num_experts=16)
    assert d.dense_divides and not d.expert_divides and not d.divides
    assert d.problems() == ["world_size 12 is not divisible by ETP·EP·PP·EGTP = 1·8·1·1 = 8"]
    both = Degrees(world_size=6, cp=4, ep=4)
    assert both.problems() == [
        "world_size 6 is not divisible by TP·PP·CP·GTP = 1·1·4·1 = 4",
        "world_size 6 is not divisible by ETP·EP·PP·EGTP = 1·4·1·1 = 4",
    ]
    assert Degrees(world_size=8, tp=0).problems() == [
        "parallel degrees must be positive integers: tp=0"]
    assert Degrees(world_size=8).problems(also={"dist_opt_instances": 0}) == [
        "parallel degrees must be positive integers: dist_opt_instances=0"]


def test_experts_per_rank_needs_an_even_split() -> None:
    assert Degrees(world_size=8, ep=4, num_experts=12).experts_per_rank == 3
    assert Degrees(world_size=8, ep=4, num_experts=6).experts_per_rank is None
    assert Degrees(world_size=8, ep=4).experts_per_rank is None  # no routed experts


def test_grid_spec_keeps_dp_exact() -> None:
    # The grid refuses a fraction where the plain degrees give the floor quotient.
    spec = GridSpec(world_size=12, ep=8)
    assert spec.degrees.edp == 1 and spec.degrees == Degrees(world_size=12, ep=8)
    try:
        _ = spec.edp
    except GridError as err:
        assert err.problems == ["world_size 12 is not divisible by ETP·EP·PP·EGTP = 1·8·1·1 = 8"]
    else:  # pragma: no cover - the assertion above is the test
        raise AssertionError("GridSpec.edp accepted a fractional EDP")


# ----------------------------------------------------------------- twins agree

DEGREE_CHOICES = st.sampled_from([1, 2, 4])


@st.composite
def dividing_configs(draw: st.DrawFn):
    """Configs whose grids tile the world; E sometimes does not split over EP."""
    tp, cp, pp, ep, etp = (draw(DEGREE_CHOICES) for _ in range(5))
    gtp, egtp = draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 1, 2]))
    world = lcm(tp * cp * pp * gtp, etp * ep * pp * egtp) * draw(st.sampled_from([1, 2, 3]))
    experts = ep * draw(st.sampled_from([1, 2, 3])) + draw(st.sampled_from([0, 0, 0, 1]))
    return parse_config({
        "model": {"num_layers": 2 * pp, "hidden_size": 64, "num_attention_heads": 8,
                  "kv_channels": 8, "ffn_hidden_size": 128, "vocab_size": 256,
                  "num_experts": experts, "moe_router_topk": 1, "moe_ffn_hidden_size": 32},
        "parallel": {"world_size": world, "tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp,
                     "gtp": gtp, "egtp": egtp},
        "training": {"seq_length": 64, "micro_batch_size": 1},
    })


# The formula book's layout page names each twin.
TWINS = {"dense_dp": "dp", "expert_dp": "edp", "ranks_per_stage": "ranks_per_stage",
         "experts_per_rank": "experts_per_rank", "dp_cp_size": "dp_cp_size",
         "tp_ep_size": "tp_ep_size", "tp_dp_cp_size": "tp_dp_cp_size"}
# The grid's groups whose size is a degree or a derived size.
GROUP_SIZES = {"dp": "dp", "expt_dp": "edp", "dp_cp": "dp_cp_size", "tp_ep": "tp_ep_size",
               "tp_cp": "tp_cp_size", "tp_dp_cp": "tp_dp_cp_size", "tp": "tp", "cp": "cp",
               "pp": "pp", "ep": "ep", "expt_tp": "etp"}


@settings(max_examples=60, deadline=None)
@given(dividing_configs())
def test_degrees_equal_the_formula_book_and_the_grid(cfg) -> None:
    d = cfg.degrees
    assert d.divides
    assert grid_spec_from_config(cfg).degrees == d == Facts(cfg).degrees

    acc = Accounting(cfg, targets=tuple(TWINS))
    formula = {q.name: acc.globals[q.ident] for q in acc.book.at("global")}
    for name, prop in TWINS.items():
        mine = getattr(d, prop)
        if mine is None:  # E not a multiple of EP: the formula's E / EP is a fraction
            assert formula[name] != int(formula[name])
        else:
            assert formula[name] == mine, name

    grid = Grid(grid_spec_from_config(cfg))
    assert grid.degrees == d and (grid.dp, grid.edp) == (d.dp, d.edp)
    for kind, prop in GROUP_SIZES.items():
        assert grid.group_size(kind) == getattr(d, prop), kind
    assert len(grid.stage_ranks(0)) == d.ranks_per_stage
    owned = grid.expert_ownership(0).expert_ids
    assert len(owned) == (d.experts_per_rank or 0)

    summary = layout_summary(cfg)
    assert summary is not None
    assert {k: summary[k] for k in ("dp", "edp", "ranks_per_stage", "experts_per_rank")} == {
        "dp": d.dp, "edp": d.edp, "ranks_per_stage": d.ranks_per_stage,
        "experts_per_rank": d.experts_per_rank}


# ----------------------------------------------------------------- one home, kept

# The recomputations this owner replaced: (degree names that must not be multiplied together, what).
PRODUCTS = (
    ({"tp", "cp", "pp"}, "the dense model size TP·CP·PP·GTP"),
    ({"etp", "ep", "pp"}, "the expert model size ETP·EP·PP·EGTP"),
    ({"dp", "cp"}, "the dp_cp size DP·CP"),
    ({"etp", "ep"}, "the tp_ep size ETP·EP"),
)
# The formula book's symbol table still derives its variant flags itself; it is being moved
# into a package and will read `cfg.degrees` there.
KNOWN_TWINS: set[str] = set()


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _factors(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def recomputations(source: str) -> list[tuple[int, str]]:
    """(line, what) for every product or quotient of the degrees that Degrees owns."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.BinOp):
            continue
        if isinstance(node.op, ast.Mult):
            names = {_name(f) for f in _factors(node)}
            found += [(node.lineno, what) for need, what in PRODUCTS if need <= names]
        elif isinstance(node.op, ast.FloorDiv | ast.Div):
            top, bottom = _name(node.left), _name(node.right)
            if top == "world_size" and (isinstance(node.right, ast.BinOp)
                                        or (bottom or "").endswith("model_size")):
                found.append((node.lineno, "DP or EDP as world_size // (…)"))
            if top == "num_experts" and bottom in ("ep", "ep_size"):
                found.append((node.lineno, "experts per rank E // EP"))
    return sorted(set(found))


def test_the_checker_finds_what_it_looks_for() -> None:
    assert recomputations("x = p.tp * p.cp * p.pp * p.gtp") == [
        (1, "the dense model size TP·CP·PP·GTP")]
    assert recomputations("x = (self.dp * s.cp) // 2") == [(1, "the dp_cp size DP·CP")]
    assert recomputations("x = f.etp * f.par.ep == 1") == [(1, "the tp_ep size ETP·EP")]
    assert recomputations("x = n.world_size // (a * b)") == [(1, "DP or EDP as world_size // (…)")]
    assert recomputations("x = m.num_experts // p.ep") == [(1, "experts per rank E // EP")]
    assert recomputations("x = 'TP * CP * PP'  # tp * cp * pp") == []  # text is not code
    assert recomputations("x = p.tp * p.gtp") == []  # weight shards are not a derived degree


def test_no_module_recomputes_the_degrees() -> None:
    offenders = []
    for path in sorted([*(ROOT / "planner").rglob("*.py"), *(ROOT / "runtime").rglob("*.py")]):
        if path == ROOT / "planner" / "degrees.py" or path.name in KNOWN_TWINS:
            continue
        for line, what in recomputations(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert offenders == [], "derive these in planner/degrees.py (Degrees) and read them there:\n" + (
        "\n".join(offenders))


def test_known_twins_exist() -> None:
    # A stale exemption hides nothing: drop it once the file reads cfg.degrees or moves.
    names = {p.name for p in (ROOT / "planner").rglob("*.py")}
    assert KNOWN_TWINS <= names


# ----------------------------------------------------------------- the runtime reads the plan


def test_runtime_takes_each_ranks_experts_from_the_plan(tmp_path) -> None:
    """A one-rank plan whose rank row (re-digested) gives the rank 2 of its 4 experts: the MoE
    runtime reads that row, not E/EP, and refuses a block its splits cannot serve."""
    from tests.support.launch import edited, runtime, small

    plan = small(tmp_path, parallel={"world_size": 1, "ep": 1}, training={"global_batch_size": 2})
    row = json.loads(plan.read_text())["ranks"][0]
    assert row["experts"] == {"first": 0, "count": 4, "ids": [0, 1, 2, 3]}  # E = 4 on EP = 1

    def halve(document: dict) -> None:
        document["ranks"][0]["experts"].update(count=2, ids=[0, 1])

    run = runtime("--plan", str(edited(plan, halve, redigest=True)), "--steps", "1")
    assert run.returncode == 2, run.stdout + run.stderr
    # refused when the plan is loaded, before any group forms (runtime/plan_io.py)
    assert "equal consecutive blocks of the 4 experts" in run.stderr

"""Differential test: `moeplan groups` against the released megatron-core 0.16.1.

megatron-core's own `parallel_state.initialize_model_parallel` runs in this process on a world of
W ranks made of torch's fake process group (no communication). Every `torch.distributed.new_group`
call is recorded with its `group_desc`, and the recording is compared kind by kind with
`planner.layout.grid.Grid` — exact memberships and exact order (groups in creation order, ranks in
group order). Layouts megatron-core refuses must be refused by `moeplan check` with the rule that
names Megatron's reason. The random layouts come from hypothesis with a fixed derandomized seed;
`MOEPLAN_MCORE_EXAMPLES` raises the count (default 200, sized for a 2-core CI runner).

megatron-core 0.16.1 has no GTP axis (that is Megatron-LM main@d98e8a64), so GTP/EGTP stay 1
here and the GTP kinds are moeplan-only; its gloo twins are switched off
(`create_gloo_process_groups=False`) because they repeat the NCCL groups' ranks.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from math import lcm
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from planner.config.loader import InvalidConfig, load_config, parse_config
from planner.layout.grid import Grid
from planner.layout.spec import grid_spec_from_config
from planner.rules.catalog import run_rules

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
EXAMPLE_COUNT = int(os.environ.get("MOEPLAN_MCORE_EXAMPLES", "200"))
CLI_ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")  # default and --use-tp-pp-dp-mapping

# megatron-core `group_desc` -> moeplan kind. Hierarchical levels carry their level number.
MCORE_TO_MOEPLAN: dict[str, str] = {
    "DATA_PARALLEL_GROUP_WITH_CP": "dp_cp",
    "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "intra_dp_cp",
    "HYBRID_DP_CP_GROUP_{k}": "hybrid_dp_cp_{k}",
    "DATA_PARALLEL_GROUP": "dp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L{i}": "hcp_l{i}",
    "MODEL_PARALLEL_GROUP": "mp",
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "EMBEDDING_GROUP": "embd",
    "POSITION_EMBEDDING_GROUP": "pos_embd",
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "tp_dp_cp",
    "TENSOR_AND_DATA_PARALLEL_GROUP": "tp_dp",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp_cp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "expt_tp",
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": "tp_ep",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": "tp_ep_pp",
    "EXPERT_DATA_PARALLEL_GROUP": "expt_dp",
    "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L0": "intra_expt_dp",
    "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L1": "inter_dist_opt",
    "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP": "intra_dist_opt",
}
# Kinds only Megatron-LM main builds (GTP axis); megatron-core 0.16.1 has none of them.
MOEPLAN_ONLY = frozenset({"gtp_remat", "expt_gtp_remat"})

# megatron-core's refusal (exception text) -> the moeplan rule that states the same condition.
REFUSALS: tuple[tuple[str, str], ...] = (
    (r"^world_size \(\d+\) is not divisible by \d+$", "PAR001"),
    (r"not divisible by expert_tensor_model_pipeline_parallel size", "PAR002"),
    (r"greater than 1 with interleaved schedule", "PIP002"),
    (r"haven't\s*specified the order", "PAR009"),
    (r"When not using pp-last rank ordering", "PAR010"),
    (r"Pipeline parallel groups are expected to be the same", "PAR011"),
    (r"^Data parallel size should be divisible by partial DistOpt", "DOP001"),
    (r"^Expert data parallel size should be divisible by partial DistOpt", "DOP002"),
    (r"^$", "PAR013"),  # the bare `assert np.prod(hierarchical_context_parallel_sizes) == cp`
    (r"Hybrid context parallel requires an even number of ranks", "PAR016"),
)
# Rules that restate a check of initialize_model_parallel / RankGenerator: the only ones that
# must stay silent when megatron-core builds the layout.
GRID_RULES = frozenset(code for _, code in REFUSALS)
# A refusal of an earlier check can hide a later one from moeplan's catalog (the order and
# instance rules need both grids to tile the world first).
STRUCTURAL = frozenset({"PAR001", "PAR002"})

BASE = yaml.safe_load((ROOT / "examples" / "tiny-cpu-8.yaml").read_text())


# ----------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    world_size: int
    tp: int = 1
    cp: int = 1
    pp: int = 1
    vpp: int | None = None
    ep: int = 1
    etp: int | None = None
    order: str = "tp-cp-ep-dp-pp"
    instances: int = 1
    hcp: tuple[int, ...] | None = None
    hybrid_cp: bool = False

    def config(self) -> dict[str, Any]:
        """A moeplan config with this layout; the model is the tiny example's."""
        data = copy.deepcopy(BASE)
        parallel: dict[str, Any] = {
            "world_size": self.world_size, "tp": self.tp, "cp": self.cp, "pp": self.pp,
            "ep": self.ep, "order": self.order, "sequence_parallel": self.tp > 1,
            "embedding_ranks_rule": "core",  # megatron-core's default_embedding_ranks
        }
        if self.vpp is not None:
            parallel["vpp"] = self.vpp
        if self.etp is not None:
            parallel["etp"] = self.etp
        if self.hcp is not None:
            parallel["hierarchical_context_parallel_sizes"] = list(self.hcp)
        if self.hybrid_cp:
            parallel["hybrid_context_parallel"] = True
        data["parallel"] = parallel
        data["training"] |= {"use_distributed_optimizer": True,
                             "num_distributed_optimizer_instances": self.instances}
        data["cluster"] |= {"nodes": 1, "gpus_per_node": self.world_size}
        return data


def chance(draw: st.DrawFn, times: int, out_of: int) -> bool:
    return draw(st.sampled_from(range(out_of))) < times


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    """Mostly layouts megatron-core builds (about two in three), the rest refused for one reason."""
    tp = draw(st.sampled_from([1, 1, 2, 3, 4]))
    cp = draw(st.sampled_from([1, 1, 2, 4]))
    pp = draw(st.sampled_from([1, 1, 2, 3, 4]))
    ep = draw(st.sampled_from([1, 2, 4, 8]))
    etp = draw(st.sampled_from([None, 1, 1, 2, 4]))
    # Hypothesis favours boundary integers, so rolls are drawn from lists (uniform).
    roll = draw(st.sampled_from(range(20)))
    if roll < 14:
        order = CLI_ORDERS[roll % 2]
    elif roll < 17:  # API-only orders: pp inside, other axes shuffled
        order = "-".join(draw(st.permutations(["tp", "cp", "ep", "dp", "pp"])))
    elif roll < 19:  # an axis left out (legal only when its size is 1)
        tokens = ["tp", "cp", "ep", "dp", "pp"]
        del tokens[draw(st.integers(0, 4))]
        order = "-".join(tokens)
    else:  # upper case: RankGenerator lower-cases, the pp-last test does not
        order = draw(st.sampled_from(CLI_ORDERS)).upper()
    expert_tp = etp or tp
    if not order.endswith("pp") and (tp * cp) % expert_tp == 0 and chance(draw, 3, 4):
        ep = (tp * cp) // expert_tp  # ETP·EP = TP·CP: DP == EDP, so a pp-inside order is legal
    span = lcm(tp * cp * pp, expert_tp * ep * pp)
    if chance(draw, 9, 10):  # mostly layouts that tile the world
        world = span * draw(st.integers(1, max(1, 384 // span)))
    else:
        world = draw(st.integers(1, 384))
    if pp > 1:
        vpp = draw(st.sampled_from([None, None, 1, 2, 3]))
    else:  # an interleaved schedule needs PP > 1
        vpp = draw(st.sampled_from([None, None, 1] if chance(draw, 9, 10) else [2, 3]))
    instances = 1
    if chance(draw, 1, 3):
        dense_ok, expert_ok = world % (tp * cp * pp) == 0, world % (expert_tp * ep * pp) == 0
        common = _divisors(world // pp // tp) if dense_ok and expert_ok else [1]
        legal = [d for d in common if d > 1 and (world // (tp * pp)) % d == 0
                 and (world // (expert_tp * ep * pp)) % d == 0] or [1]
        instances = draw(st.sampled_from(legal if chance(draw, 3, 4) else [2, 3, 4]))
    hcp: tuple[int, ...] | None = None
    hcp_roll = draw(st.sampled_from(range(10)))
    if hcp_roll < 2:
        first = draw(st.sampled_from(_divisors(cp)))
        hcp = (first, cp // first)
    elif hcp_roll == 2:
        hcp = tuple(draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3)))
    return Layout(world, tp=tp, cp=cp, pp=pp, vpp=vpp, ep=ep, etp=etp, order=order,
                  instances=instances, hcp=hcp, hybrid_cp=chance(draw, 1, 8))


# ----------------------------------------------------------------- megatron-core side


@dataclass
class McoreResult:
    groups: dict[str, list[list[int]]]  # moeplan kind -> groups, creation order
    kind_order: list[str]  # moeplan kinds in order of first creation
    unmapped: set[str]  # group_desc values without a moeplan kind
    error: BaseException | None = None


@pytest.fixture(scope="module")
def mcore() -> Iterator[Any]:
    """megatron-core's parallel_state, and the fake-backend machinery it runs on."""
    pytest.importorskip("einops", reason="megatron-core's hierarchical groups need einops (test extra)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
        parallel_state = pytest.importorskip(
            "megatron.core.parallel_state",
            reason="megatron-core 0.16.1 is a test extra: pip install -c constraints.txt '.[test]'",
        )
    yield parallel_state


def _moeplan_kind(desc: str) -> str | None:
    if desc in MCORE_TO_MOEPLAN:
        return MCORE_TO_MOEPLAN[desc]
    for pattern, kind in MCORE_TO_MOEPLAN.items():
        head, brace, tail = pattern.partition("{")
        if brace and desc.startswith(head) and desc[len(head):].isdigit():
            return kind.replace("{" + tail, desc[len(head):])
    return None


@contextmanager
def _recording_new_group(log: list[tuple[str, list[int]]]) -> Iterator[None]:
    """Record (group_desc, ranks) of every group megatron-core creates, then create it if this
    rank (0) is in it: a group without it is what `new_group` answers a non-member, and making
    each of them on the fake backend was most of the test's time."""
    import torch.distributed as dist

    original = dist.new_group

    def recording(ranks: Any = None, *args: Any, **kwargs: Any) -> Any:
        log.append((kwargs.get("group_desc") or "", list(ranks)))
        if ranks is not None and 0 not in ranks:
            return dist.GroupMember.NON_GROUP_MEMBER
        return original(ranks, *args, **kwargs)

    dist.new_group = recording  # type: ignore[assignment]
    try:
        yield
    finally:
        dist.new_group = original  # type: ignore[assignment]


def run_megatron_core(parallel_state: Any, layout: Layout) -> McoreResult:
    """initialize_model_parallel on a fake world of layout.world_size ranks, seen from rank 0."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    log: list[tuple[str, list[int]]] = []
    error: BaseException | None = None
    # Megatron's training arguments turn a virtual size of 1 into None (arguments.py
    # validate_args); moeplan's `vpp: 1` means the same.
    vpp = layout.vpp if layout.vpp and layout.vpp > 1 else None
    dist.init_process_group(backend="fake", store=FakeStore(), rank=0, world_size=layout.world_size)
    try:
        with _recording_new_group(log):
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=layout.tp,
                pipeline_model_parallel_size=layout.pp,
                virtual_pipeline_model_parallel_size=vpp,
                context_parallel_size=layout.cp,
                hierarchical_context_parallel_sizes=list(layout.hcp) if layout.hcp else None,
                hybrid_context_parallel=layout.hybrid_cp,
                expert_model_parallel_size=layout.ep,
                expert_tensor_parallel_size=layout.etp,
                num_distributed_optimizer_instances=layout.instances,
                order=layout.order,
                create_gloo_process_groups=False,
            )
    except Exception as exc:  # noqa: BLE001 - any refusal is a verdict to compare
        error = exc
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    result = McoreResult({}, [], set(), error)
    for desc, ranks in log:
        kind = _moeplan_kind(desc)
        if kind is None:
            result.unmapped.add(desc)
            continue
        if kind not in result.groups:
            result.kind_order.append(kind)
        result.groups.setdefault(kind, []).append(ranks)
    return result


# ----------------------------------------------------------------- moeplan side


@dataclass
class MoeplanResult:
    grid: Grid | None
    errors: dict[str, str]  # rule code -> first message
    all_errors: dict[str, str]


def run_moeplan(layout: Layout) -> MoeplanResult:
    try:
        cfg = parse_config(layout.config())
    except InvalidConfig as exc:
        errors = {f.code: f.message for f in exc.findings}
        return MoeplanResult(None, errors, errors)
    findings = [f for f in run_rules(cfg) if f.severity == "error"]
    all_errors: dict[str, str] = {}
    for f in findings:
        all_errors.setdefault(f.code, f.message)
    grid_errors = {c: m for c, m in all_errors.items() if c in GRID_RULES}
    grid = None if grid_errors else Grid(grid_spec_from_config(cfg))
    return MoeplanResult(grid, grid_errors, all_errors)


# ----------------------------------------------------------------- comparison


def expected_rule(error: BaseException) -> str | None:
    text = str(error).strip()
    if isinstance(error, KeyError):  # an order token RankGenerator has no size for
        return "PAR009"
    for pattern, code in REFUSALS:
        if re.search(pattern, text):
            return code
    return None


def assert_same_groups(layout: Layout, mc: McoreResult, grid: Grid) -> None:
    ours = {k: grid.groups(k) for k in grid.listing_kinds()}
    assert not mc.unmapped, f"{layout}: megatron-core groups without a moeplan kind: {mc.unmapped}"
    assert set(ours) - set(mc.groups) == MOEPLAN_ONLY, (
        f"{layout}: kinds only moeplan lists: {sorted(set(ours) - set(mc.groups))}"
    )
    assert set(mc.groups) <= set(ours), (
        f"{layout}: kinds only megatron-core builds: {sorted(set(mc.groups) - set(ours))}"
    )
    for kind, groups in mc.groups.items():
        assert ours[kind] == groups, (
            f"{layout}: {kind} differs\n megatron-core {groups[:4]}…\n moeplan       {ours[kind][:4]}…"
        )
    shared_order = [k for k in grid.listing_kinds() if k in mc.groups]
    assert shared_order == mc.kind_order, f"{layout}: creation order differs"
    # One rank's view (`moeplan groups --rank`) is arithmetic, not a listing: check it too.
    for rank in {0, layout.world_size - 1, layout.world_size // 3}:
        for kind, groups in mc.groups.items():
            member = [g for g in groups if rank in g]
            assert grid.group_of(kind, rank) == (member[0] if member else []), (
                f"{layout}: rank {rank} {kind}"
            )


def compare(mcore: Any, layout: Layout) -> None:
    mc = run_megatron_core(mcore, layout)
    ours = run_moeplan(layout)
    if mc.error is not None:
        code = expected_rule(mc.error)
        refusal = f"{type(mc.error).__name__}: {str(mc.error)[:200]}"
        assert code is not None, f"{layout}: unmapped megatron-core refusal {refusal}"
        assert ours.errors, f"{layout}: megatron-core refuses ({refusal}, rule {code}); moeplan accepts"
        assert code in ours.errors or ours.errors.keys() & STRUCTURAL, (
            f"{layout}: megatron-core refuses ({refusal}) = {code}; moeplan says {sorted(ours.errors)}"
        )
        event(f"refused: {code}")
        return
    assert not ours.errors, (
        f"{layout}: megatron-core builds it, moeplan refuses with {ours.errors}"
    )
    assert ours.grid is not None
    assert_same_groups(layout, mc, ours.grid)
    event(f"built: order {'pp-last' if layout.order.endswith('pp') else 'other'}")
    event(f"built: {'several' if layout.instances > 1 else 'one'} optimizer instance(s)")
    if layout.hcp:
        event("built: hierarchical CP")
    if layout.hybrid_cp:
        event("built: hybrid CP")
    # Rules outside the grid that still refuse a layout megatron-core builds (model-dependent).
    for code in sorted(ours.all_errors.keys() - GRID_RULES):
        event(f"built, moeplan also reports {code}")


# ----------------------------------------------------------------- tests


@settings(max_examples=EXAMPLE_COUNT, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(layout=layouts())
def test_random_layouts_match_megatron_core(mcore, layout):
    compare(mcore, layout)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_bundled_examples_build_the_same_groups(mcore, path):
    cfg = load_config(path)
    spec = dataclasses.replace(grid_spec_from_config(cfg), embedding_rule="core")
    p, t = cfg.parallel, cfg.training
    layout = Layout(p.world_size, tp=p.tp, cp=p.cp, pp=p.pp, vpp=p.vpp, ep=p.ep, etp=p.etp,
                    order=p.order, instances=t.num_distributed_optimizer_instances,
                    hcp=tuple(p.hierarchical_context_parallel_sizes or ()) or None)
    mc = run_megatron_core(mcore, layout)
    assert mc.error is None, mc.error
    assert_same_groups(layout, mc, Grid(spec))


@pytest.mark.parametrize(
    ("layout", "code"),
    [
        (Layout(12, tp=1, cp=1, pp=1, ep=8), "PAR002"),
        (Layout(10, tp=4), "PAR001"),
        (Layout(8, pp=1, vpp=2), "PIP002"),
        (Layout(8, tp=2, ep=2, order="tp-cp-dp-pp"), "PAR009"),
        # N/TP/CP/EP/ETP/PP = 8/2/2/2/1/2: DP 1 != EDP 2 and pp is not last.
        (Layout(8, tp=2, cp=2, pp=2, ep=2, etp=1, order="tp-cp-ep-pp-dp"), "PAR010"),
        (Layout(8, tp=2, pp=2, ep=2, etp=1, order="tp-pp-cp-ep-dp"), "PAR011"),
        (Layout(16, cp=2, instances=3), "DOP001"),
        (Layout(8, cp=2, ep=4, instances=4), "DOP002"),
        (Layout(8, cp=2, hcp=(2, 2)), "PAR013"),
        (Layout(6, tp=2, ep=3, etp=1, hybrid_cp=True), "PAR016"),
        (Layout(8, tp=2, order="TP-CP-EP-PP-DP", pp=2, ep=4, etp=1), "PAR010"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_refusal_is_a_moeplan_rule(mcore, layout, code):
    mc = run_megatron_core(mcore, layout)
    assert mc.error is not None and expected_rule(mc.error) == code, mc.error
    assert code in run_moeplan(layout).errors


def test_recorder_sees_every_group_megatron_core_creates(mcore):
    # N=8, TP2, CP2, EP2, ETP1, PP2 (the Megatron-LM parallel_state worked example): hand-derived.
    mc = run_megatron_core(mcore, Layout(8, tp=2, cp=2, pp=2, ep=2, etp=1))
    assert mc.error is None
    assert mc.groups["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mc.groups["cp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mc.groups["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mc.groups["expt_dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mc.groups["intra_dist_opt"] == [[0, 1, 4, 5, 2, 3, 6, 7]]


def test_a_repeated_order_token_is_refused_by_moeplan_although_megatron_core_may_build_it(mcore):
    # A deliberate difference: RankGenerator keeps both copies of a repeated token and masks only
    # the first. With that axis of size 1 the groups equal those of the order without the
    # repeat; with size > 1 megatron-core fails inside torch (rank out of range). moeplan refuses
    # both with PAR009, since a repeated axis is a typo either way.
    tolerated = run_megatron_core(mcore, Layout(8, cp=2, ep=2, order="tp-tp-cp-ep-dp-pp"))
    plain = run_megatron_core(mcore, Layout(8, cp=2, ep=2))
    assert tolerated.error is None and tolerated.groups == plain.groups
    broken = run_megatron_core(mcore, Layout(8, tp=2, cp=2, ep=2, order="tp-tp-cp-ep-dp-pp"))
    assert broken.error is not None
    for layout in (Layout(8, cp=2, ep=2, order="tp-tp-cp-ep-dp-pp"),
                   Layout(8, tp=2, cp=2, ep=2, order="tp-tp-cp-ep-dp-pp")):
        assert "more than once" in run_moeplan(layout).errors["PAR009"]

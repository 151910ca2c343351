"""One pipeline stage drawn twice: the dense view (CP × DP) beside the expert view (EP × EDP).

The point of the picture is MoE Parallel Folding (Megatron-Core's separate dense and expert rank
generators in initialize_model_parallel): the same ranks sit in two grids.
Fill colour is the routed-expert set a rank holds (so expt_dp replicas share a colour), outline
colour is the EP group a rank exchanges tokens with. Geometry is computed here; the jinja2
template only draws it, so no plotting dependency is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from planner.layout.grid import Grid
from planner.layout.rank_generator import GTP_AXIS, RankGenerator

MAX_CELLS = 128  # beyond this many ranks per stage, cells stand for blocks of ranks
_CELL_H = 30.0
_SUB_W = 30.0
_BLOCK_W = 66.0  # an aggregated cell: wide enough for "24576…" and "d_a=0–63"
_GAP = 4.0
_PANEL_GAP = 60.0
_MARGIN = 20.0
_LABEL_W = 56.0
_HEADER_H = 124.0
_MIN_PANEL_W = 420.0  # room for the panel title and subtitle
_OUTLINES = ("#1b4f72", "#922b21", "#1e8449", "#9a5b00", "#6c3483", "#117a65", "#7d6608",
             "#283747")
_MIXED = "#d5d8dc"


@dataclass(frozen=True)
class Cell:
    x: float
    y: float
    w: float
    h: float
    fill: str
    stroke: str
    label: str
    title: str


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str
    anchor: str = "middle"


@dataclass(frozen=True)
class Panel:
    title: str
    subtitle: str
    x: float
    y: float
    w: float
    h: float
    cells: tuple[Cell, ...]
    labels: tuple[Label, ...]


@dataclass(frozen=True)
class Swatch:
    fill: str
    stroke: str
    text: str


_PALETTE = ("#8fb3d9", "#f5b36b", "#ec8f8f", "#8ccfc9", "#90c987", "#f0d872", "#c9a3c2",
            "#ffb8c0", "#c4a38e", "#c9c3bf", "#5f93c8", "#e9853a", "#e06666", "#54a8a0",
            "#5fae55", "#d8b83a", "#a77ca0", "#f08aa0", "#a07c66", "#9a928d")


def expert_colour(index: int) -> str:
    """Distinct fills for the first 20 expert sets, golden-angle hues after that."""
    if index < len(_PALETTE):
        return _PALETTE[index]
    return f"hsl({(index * 137.508) % 360:.1f}, 60%, 72%)"


def outline_colour(index: int) -> str:
    return _OUTLINES[index % len(_OUTLINES)]


def _rank(layout: RankGenerator, coords: dict[str, int]) -> int:
    return sum(coords.get(a, 0) * g for a, g in zip(layout.axes, layout.strides, strict=True))


def _blocks(count: int, size: int) -> list[range]:
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


def _span(r: range, prefix: str) -> str:
    return f"{prefix}{r.start}" if len(r) == 1 else f"{prefix}{r.start}–{r.stop - 1}"


class _StagePicture:
    def __init__(self, grid: Grid, stage: int) -> None:
        self.grid, self.stage = grid, stage
        spec = grid.spec
        self.aggregate = spec.ranks_per_stage > MAX_CELLS
        x = grid.expert
        # In the expert view a column is one EP rank, or a block of EP ranks when aggregated.
        self.ep_block = _block_sizes(x.size("dp"), x.size("ep"))[1] if self.aggregate else 1
        self.per_rank = spec.experts_per_rank

    def colour_key(self, rank: int) -> int:
        return self.grid.expert.coordinate(rank, "ep") // self.ep_block

    def token_group(self, rank: int) -> int:
        """Index of the rank's EP (tp_ep) group within its stage."""
        x = self.grid.expert
        return x.coordinate(rank, "dp") * x.size(GTP_AXIS) + x.coordinate(rank, GTP_AXIS)

    def panel(self, view: str, x0: float, y0: float) -> Panel:
        grid = self.grid
        layout = grid.dense if view == "dense" else grid.expert
        row_axis, col_axis = ("cp", "dp") if view == "dense" else ("dp", "ep")
        inner = [a for a in ("tp", GTP_AXIS) if layout.size(a) > 1]
        rows, cols = layout.size(row_axis), layout.size(col_axis)
        sub = layout.size("tp") * layout.size(GTP_AXIS)
        whole = not self.aggregate
        row_block, col_block = (1, 1) if whole else _block_sizes(rows, cols)
        row_blocks, col_blocks = _blocks(rows, row_block), _blocks(cols, col_block)
        cell_w = _SUB_W * sub if whole else _BLOCK_W
        cells: list[Cell] = []
        labels: list[Label] = []
        row_name, col_name = {"dense": ("c", "d_a"), "expert": ("d_e", "e")}[view]
        for i, rb in enumerate(row_blocks):
            y = y0 + i * (_CELL_H + _GAP)
            labels.append(Label(x0 - 6, y + _CELL_H / 2 + 4, _span(rb, f"{row_name}="), "end"))
            for j, cb in enumerate(col_blocks):
                x = x0 + j * (cell_w + _GAP)
                ranks = [
                    _rank(layout, {row_axis: r, col_axis: c, "pp": self.stage, **extra})
                    for r in rb for c in cb for extra in _inner_coords(layout, inner)
                ]
                if whole:
                    cells.extend(self._rank_cell(rank, x + k * _SUB_W, y) for k, rank in
                                 enumerate(ranks))
                else:
                    cells.append(self._block_cell(ranks, x, y, cell_w))
                if i == 0:
                    labels.append(Label(x + cell_w / 2, y0 - 8, _span(cb, col_name + "=")))
        width = len(col_blocks) * (cell_w + _GAP) - _GAP
        height = len(row_blocks) * (_CELL_H + _GAP) - _GAP
        spec = grid.spec
        if view == "dense":
            title = f"dense view: CP {spec.cp} × DP {grid.dp} (attention)"
            unit = f"cell = one TP group ({sub} ranks)" if sub > 1 else "cell = one rank"
        else:
            title = f"expert view: EDP {grid.edp} × EP {spec.ep} (routed experts)"
            unit = f"cell = one ETP group ({sub} ranks)" if sub > 1 else "cell = one rank"
        if not whole:
            unit = f"aggregated: a cell is a block of ranks (≤{MAX_CELLS} cells per view)"
        return Panel(title, unit, x0, y0, width, height, tuple(cells), tuple(labels))

    def _rank_cell(self, rank: int, x: float, y: float) -> Cell:
        own = self.grid.expert_ownership(rank)
        experts = (f"experts {own.expert_ids[0]}–{own.expert_ids[-1]}" if own.expert_ids
                   else own.note)
        title = (f"rank {rank}: EP rank {own.ep_rank}, {experts}; {own.shard}; "
                 f"expt_dp replicas {list(own.replica_peers)}; "
                 f"EP group {self.token_group(rank)}")
        return Cell(x, y, _SUB_W - 2, _CELL_H, expert_colour(self.colour_key(rank)),
                    outline_colour(self.token_group(rank)), str(rank), title)

    def _block_cell(self, ranks: list[int], x: float, y: float, w: float) -> Cell:
        keys = {self.colour_key(r) for r in ranks}
        groups = {self.token_group(r) for r in ranks}
        fill = expert_colour(keys.pop()) if len(keys) == 1 else _MIXED
        stroke = outline_colour(groups.pop()) if len(groups) == 1 else "#7f8c8d"
        title = f"{len(ranks)} ranks {min(ranks)}–{max(ranks)}"
        return Cell(x, y, w - 2, _CELL_H, fill, stroke, f"{min(ranks)}…", title)

    def swatches(self) -> list[Swatch]:
        spec = self.grid.spec
        keys = ceil(spec.ep / self.ep_block)
        shown = min(keys, 16)
        out = []
        for k in range(shown):
            eps = range(k * self.ep_block, min((k + 1) * self.ep_block, spec.ep))
            if self.per_rank:
                ids = f"experts {eps.start * self.per_rank}–{eps.stop * self.per_rank - 1}"
            else:
                ids = "no even expert split"
            out.append(Swatch(expert_colour(k), "#555", f"{_span(eps, 'EP ')}: {ids}"))
        if keys > shown:
            out.append(Swatch("#ffffff", "#555", f"… {keys - shown} more colours"))
        return out

    def outlines(self) -> list[Swatch]:
        x = self.grid.expert
        count = x.size("dp") * x.size(GTP_AXIS)
        return [Swatch("#ffffff", outline_colour(i), f"EP group {i}")
                for i in range(min(count, len(_OUTLINES)))]


def _block_sizes(rows: int, cols: int) -> tuple[int, int]:
    """Rows and columns per aggregated cell: halve the longer side until ≤ MAX_CELLS cells."""
    row_block = col_block = 1
    while ceil(rows / row_block) * ceil(cols / col_block) > MAX_CELLS:
        if ceil(cols / col_block) >= ceil(rows / row_block):
            col_block *= 2
        else:
            row_block *= 2
    return row_block, col_block


def _inner_coords(layout: RankGenerator, inner: list[str]) -> list[dict[str, int]]:
    """Coordinates of the ranks inside one cell (TP, then GTP), fastest first."""
    combos: list[dict[str, int]] = [{}]
    for axis in inner:
        combos = [{**c, axis: v} for v in range(layout.size(axis)) for c in combos]
    return combos


def stage_context(grid: Grid, stage: int = 0) -> dict[str, object]:
    """Everything the template draws for one stage."""
    picture = _StagePicture(grid, stage)
    dense = picture.panel("dense", _MARGIN + _LABEL_W, _HEADER_H)
    expert_x = dense.x + max(dense.w, _MIN_PANEL_W) + _PANEL_GAP + _LABEL_W
    expert = picture.panel("expert", expert_x, _HEADER_H)
    spec = grid.spec
    formulas = grid.formulas(stage)
    legend_y = _HEADER_H + max(dense.h, expert.h) + 40
    swatches, outlines = picture.swatches(), picture.outlines()
    notes = [
        "fill colour = routed-expert set held (same colour = same experts: an expt_dp "
        "group, whose expert gradients are reduced together)",
        "outline colour = EP group: ranks that exchange tokens in the dispatcher AlltoAll",
        "dense view cells sit where attention puts the rank; the colours show how the "
        "expert grid folds over it",
    ]
    if spec.etp > 1 or spec.egtp > 1:
        notes.append("same colour inside one expert-view cell = different ETP/EGTP shards "
                     "of the same experts")
    if picture.aggregate:
        notes.append("grey fill / outline = the block mixes several expert sets / EP groups")
    legend_h = 24 * max(len(swatches), len(outlines)) + 18 * len(notes) + 60
    width = expert.x + max(expert.w, _MIN_PANEL_W) + _MARGIN
    return {
        "width": max(width, 760.0),
        "height": legend_y + legend_h,
        "title": (f"stage {stage} of {spec.pp}: {spec.ranks_per_stage} ranks "
                  f"(N = {spec.world_size}, order {spec.order})"),
        "formulas": (f"dense {formulas['dense'].text(stage=True)}   ·   "
                     f"expert {formulas['expert'].text(stage=True)}"),
        "panels": [dense, expert],
        "legend_x": _MARGIN,
        "legend_y": legend_y,
        "swatches": swatches,
        "outlines": outlines,
        "notes": notes,
    }


def render_stage_svg(grid: Grid, stage: int = 0) -> str:
    """The SVG text for one stage (jinja2 template `groups_stage.svg.j2`)."""
    import jinja2  # lazy: only `groups --svg` pays for it

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("templates", ""),
        autoescape=jinja2.select_autoescape(["svg.j2"]),
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template("groups_stage.svg.j2").render(**stage_context(grid, stage))

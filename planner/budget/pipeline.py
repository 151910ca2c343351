"""The pipeline page, the book's last: each stage's bubble and step, where the stages meet.

Stage k's step is its own busy time (all m microbatches through its chunks) plus the bubble the
other stages' chunks put in front of and behind it, as Megatron's schedules order them
(Megatron-LM dev@d48bd6be megatron/core/pipeline_parallel/schedules.py
forward_backward_pipelining_with_interleaving and forward_backward_pipelining_without_interleaving):
the first microbatch reaches stage k through the FIRST model chunk of every earlier stage, and the
last one's backward leaves through them again; stage k's first backward waits for the LAST model
chunk of every later stage, forward and backward. With equal stages this is Megatron's
(PP − 1) / VPP bubble exactly; the slowest stage k sets the step. A chunk's microbatch time is the
time page evaluated on that chunk alone (its own layers, embedding, MTP and loss): every per-layer
term of the formula book is a sum over the layers a stage holds, so the chunk's counts give its
share exactly; a once-per-step collective counts the chunk's own parameters, and an overlapped
collective hides behind the chunk's own compute.

Unlike the pages of book.py this one is written per (PP, stage, interleaved), over symbols
`t_first_j` / `t_last_j` (`chunk_times`) and two names of the time page it follows
(`PAGE_STAGE_INPUTS`); planner/estimate.py evaluates it on every stage with `pipeline_step`.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from planner.budget.book import FormulaBook, formula_book, read_items
from planner.budget.evaluate import BudgetError
from planner.budget.expr import Book, Evaluator, Number, Quantity, Symbol, compile_quantities
from planner.budget.symbols import STAGE_SYMBOLS
from planner.budget.variant import Variant
from planner.layout.pipeline import Chunk

if TYPE_CHECKING:
    from planner.budget.evaluate import Accounting

PAGE = "pipeline"
# What the pipeline page reads of its own stage (besides every stage's chunk times).
PAGE_STAGE_INPUTS = ("time_busy_s", "time_optimizer_s")
# What DualPipe's bubble reads besides: the stage's compute, its microbatches and the weight-
# gradient pass of each GEMM kind (the time page's `_gemm`), times the stack's factor.
WGRAD_PASSES = tuple(f"time_{kind}_gemm_wgrad_pass_s"
                     for kind in ("attention", "routed", "shared", "dense", "head"))
DUALPIPE_INPUTS = ("time_compute_s", "microbatches", "stack_factor", *WGRAD_PASSES)


def pipeline_step(acc: Accounting, stage: int, times: dict[str, Number],
                  stage_env: dict[str, Any]) -> dict[str, Number]:
    """The pipeline page of `stage` evaluated (its bubble and step) over every stage's chunk
    `times` and this stage's time-page results in `stage_env`."""
    dualpipe = is_dualpipe(acc.cfg.overlap.pipeline_schedule)
    reads = PAGE_STAGE_INPUTS + (DUALPIPE_INPUTS if dualpipe else ())
    inputs = {**times, **{name: stage_env[name] for name in reads}}
    return _page_evaluator(acc.cfg.parallel.pp, stage, acc.split.vpp > 1, dualpipe,
                           acc.exact)(inputs)


@cache
def _page_evaluator(pp: int, stage: int, interleaved: bool, dualpipe: bool,
                    exact: bool) -> Evaluator:
    """`pipeline_page`, compiled once per stage and mode (search evaluates it on every stage of
    thousands of candidates)."""
    return compile_quantities(pipeline_page(pp, stage, interleaved, dualpipe), exact)


def is_dualpipe(schedule: str) -> bool:
    """overlap.pipeline_schedule asks for DualPipe (an estimate Megatron cannot run: V4030)."""
    return schedule == "dualpipe"


def chunk_times(acc: Accounting, envs: list[dict[str, Any]]) -> dict[str, Number]:
    """t_first_j and t_last_j: one microbatch, forward and backward, through stage j's first and
    last model chunk alone (without interleaving both are the stage's own microbatch time)."""
    times: dict[str, Number] = {}
    if acc.split.vpp == 1:
        for j, env in enumerate(envs):
            times[f"t_first_{j}"] = times[f"t_last_{j}"] = env["time_microbatch_s"]
        return times
    reads = _chunk_reads(acc.variant)
    # Chunks whose counts and stage's placement read alike, whichever stage holds them: the
    # chunk's counts replace every count of its stage (`chunk_microbatch_time`), so the rest of
    # what it reads is the globals and the rank's placement (`Accounting.chunk_keys`).
    known: dict[tuple[Any, ...], Number] = {}

    def chunk_time(j: int, chunk: Chunk) -> Number:
        counts = acc.holdings.chunk(chunk)
        key = (acc.chunk_keys.get(j, ("stage", j)), chunk.embedding, chunk.loss,
               read_items(counts, reads))
        if key not in known:
            known[key] = chunk_microbatch_time(acc, envs[j], chunk)
        return known[key]

    for j in range(len(envs)):
        first, last = acc.split.stages[j].chunks[0], acc.split.stages[j].chunks[-1]
        times[f"t_first_{j}"] = chunk_time(j, first)
        times[f"t_last_{j}"] = chunk_time(j, last)
    return times


def chunk_microbatch_time(acc: Accounting, stage_env: dict[str, Any], chunk: Chunk) -> Number:
    """time_microbatch_s of one model chunk alone: the time page's stage and rank formulas on the
    chunk's own counts (Holdings.chunk), placed like its stage's rank (`stage_env`).

    In floats over the time page alone (search's ranking) the Accounting's own level functions
    evaluate the chunk (the levels `_count_levels` names): every formula reads the same inputs in
    the same order whichever function holds it, and those that read no count give their stage's
    value again, so the time is the same as `_chunk_formulas`' own function gives, which then is
    never compiled (two fifths of what search compiled). A formula the microbatch time does not
    read may fail on a chunk's counts (a loss-only chunk holds no layer): then `_chunk_formulas`
    alone are evaluated."""
    def alone() -> dict[str, Any]:
        return {**stage_env, **acc.holdings.chunk(chunk),
                # A chunk alone is a one-chunk stage: per microbatch it receives an activation
                # unless it holds the embedding and sends one unless it holds the loss.
                "VPP": 1, "is_first_stage": int(chunk.embedding), "is_last_stage": int(chunk.loss)}

    if not acc.exact and acc.book is not acc.full_book:
        try:
            env = alone()
            for level in _count_levels(acc.book):
                acc.evaluate_level(level, env)
            return env["time_microbatch_s"]
        except (ZeroDivisionError, OverflowError, ValueError):
            pass
    try:
        return _chunk_evaluator(acc.variant, acc.exact)(alone())["time_microbatch_s"]
    except ZeroDivisionError as exc:
        raise BudgetError(f"pipeline chunk {chunk.index}: a quantity divides by zero ({exc})") from None


# The stage flags a model chunk alone takes from its own embedding and loss (`chunk_microbatch_time`).
STAGE_FLAGS = frozenset(("is_first_stage", "is_last_stage"))


@cache
def _chunk_formulas(variant: Variant) -> tuple[tuple[Quantity, ...], frozenset[str]]:
    """The formulas time_microbatch_s needs that a chunk's counts change (everything else keeps
    its stage's value), and every name they read."""
    changed = {symbol.name for symbol in STAGE_SYMBOLS} | {"VPP"}
    needed = []
    for q in formula_book(variant).subset(("time_microbatch_s",)).quantities:
        if changed.intersection(q.refs):
            changed.add(q.ident)
            needed.append(q)
    return tuple(needed), frozenset(r for q in needed for r in q.refs)


@cache
def _chunk_reads(variant: Variant) -> frozenset[str]:
    """The counts a chunk's time reads but its stage's flags, which `chunk_microbatch_time` sets
    from the chunk's embedding and loss (`chunk_times` keys on them): one set per variant, whose
    hash is computed once (every estimate's chunks look their times up by it)."""
    return _chunk_formulas(variant)[1] - STAGE_FLAGS


@cache
def _count_levels(book: FormulaBook) -> tuple[str, ...]:
    """The levels of `book` holding a formula that a chunk's counts change (as `_chunk_formulas`
    finds them): the others keep their stage's values on a chunk (the time page's global level
    reads no count)."""
    changed = {symbol.name for symbol in STAGE_SYMBOLS} | {"VPP"}
    levels: set[str] = set()
    for q in book.quantities:
        if changed.intersection(q.refs):
            changed.add(q.ident)
            levels.add(q.level)
    return tuple(level for level in ("global", "stage", "rank") if level in levels)


@cache
def _chunk_evaluator(variant: Variant, exact: bool = True) -> Evaluator:
    """`_chunk_formulas`, compiled once per variant."""
    return compile_quantities(_chunk_formulas(variant)[0], exact)


@cache
def pipeline_page(pp: int, stage: int, interleaved: bool,
                  dualpipe: bool = False) -> tuple[Quantity, ...]:
    """The bubble and the step of stage `stage` of `pp`, as named formulas over the other stages'
    chunk times (symbols t_first_j, t_last_j) and this stage's time-page results; under
    `dualpipe`, DualPipe's bubble over this stage's own times (_dualpipe)."""
    first, last = ("first model chunk", "last model chunk") if interleaved else ("microbatch",) * 2
    symbols = [Symbol(name, f"this stage's {what} (time page)", "rank")
               for name, what in zip(PAGE_STAGE_INPUTS, ("busy time", "optimizer step"), strict=True)]
    for j in range(pp):
        symbols += [Symbol(f"t_first_{j}", f"stage {j}'s {first}: one microbatch forward and "
                           "backward (time_microbatch_s of it alone)", "rank"),
                    Symbol(f"t_last_{j}", f"stage {j}'s {last}: one microbatch forward and "
                           "backward (time_microbatch_s of it alone)", "rank")]
    if dualpipe:
        symbols += [Symbol(name, f"this stage's {name} (time page)", "rank")
                    for name in DUALPIPE_INPUTS]
    book = Book(symbols)
    book.page = PAGE
    before = " + ".join(f"t_first_{j}" for j in range(stage)) or "0"
    after = " + ".join(f"t_last_{j}" for j in range(stage + 1, pp)) or "0"
    book.add("time_bubble_before_s", before, "s", "time",
             f"the first microbatch reaching this stage through each earlier stage's {first}, "
             "and the last one's backward leaving through them")
    book.add("time_bubble_after_s", after, "s", "time",
             f"this stage's first backward waiting for each later stage's {last}, forward and "
             "backward")
    if dualpipe:
        _dualpipe(book, pp)
    else:
        book.add("time_bubble_s", "time_bubble_before_s + time_bubble_after_s", "s", "time",
                 "pipeline bubble of this stage: warm-up and cool-down passes through the other "
                 "stages' chunks (Megatron's 1F1B and interleaved schedules; (PP − 1) / VPP of a "
                 "microbatch when the stages are equal)")
    book.add("time_stage_step_s", "time_busy_s + time_bubble_s + time_optimizer_s", "s", "time",
             "this stage's step when it sets the pace; the slowest stage sets the step time")
    return tuple(book.quantities)


def _dualpipe(book: Book, pp: int) -> None:
    """DualPipe's bubble as the DeepSeek-V3 technical report's Table 2 states it (arXiv
    2412.19437, section 3.2.1): (PP/2 − 1)(F&B + B − 3W) against 1F1B's (PP − 1)(F + B), with F a
    forward chunk, B a full backward chunk, W its weight-gradient part and F&B a forward and a
    backward chunk of two microbatches run overlapped. Priced on this stage's own times (the table
    assumes equal stages): F and B a third and two thirds of a microbatch's pass, W the stage's
    weight-gradient GEMM passes, F&B the pair's compute with their communication hidden under each
    other. The busy time stays what the stage's layers cost (DualPipe feeds half the microbatches
    from each end, the same work per rank); the EP overlap DualPipe brings is what
    overlap_moe_expert_parallel_comm prices inside 1F1B. Megatron-LM has no DualPipe schedule
    (rule V4030 refuses it); this is an estimate only."""
    add = book.add
    add("dualpipe_f_s", "time_busy_s / (3 * microbatches)", "s", "time",
        "F: one forward chunk of this stage (a third of a microbatch's pass)")
    add("dualpipe_b_s", "2 * time_busy_s / (3 * microbatches)", "s", "time",
        "B: one full backward chunk (input and weight gradients)")
    add("dualpipe_w_s", "stack_factor * (" + " + ".join(WGRAD_PASSES) + ")", "s", "time",
        "W: the weight-gradient GEMMs of one backward chunk")
    add("dualpipe_fb_s", "time_compute_s / microbatches", "s", "time",
        "F&B: a forward and a backward chunk of two microbatches overlapped: their compute, each "
        "one's communication hidden under the other's")
    add("time_bubble_s", f"({pp} / 2 - 1) * Max(dualpipe_fb_s + dualpipe_b_s - 3 * dualpipe_w_s, 0)",
        "s", "time", "pipeline bubble under DualPipe (DeepSeek-V3 report, Table 2): "
        "(PP/2 − 1)(F&B + B − 3W), against 1F1B's (PP − 1)(F + B); an estimate of a schedule "
        "Megatron-LM does not have")

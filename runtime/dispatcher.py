"""Token dispatchers: move routed token rows to the ranks that hold their experts and back.

AlltoAll (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py
MoEAlltoAllTokenDispatcher), one stage per step so a reader can follow a row:

  count exchange over tp_ep → permute 1 (group by expert, duplicating tokens chosen k times)
  → AlltoAll over ep → ETP all-gather-v → permute 2 (source-major chunks → expert-major)
  → experts → undo permute 2 → ETP reduce-scatter-v → AlltoAll back (swapped splits)
  → unpermute (sum the k expert outputs of each token; the weights were applied in the experts).

AllGather (same file, MoEAllGatherTokenDispatcher): gather hidden, weights and routing map over
tp_ep, run the local experts on every row routed to them, scatter-add back, reduce-scatter over tp_ep.

Drop-and-pad gives every expert exactly `capacity` slots per source rank (E·c rows leave each
rank), so every split is even and no counts are exchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.comm import (
    CommGroup,
    Ledger,
    MoEGroups,
    all_gather_constant,
    all_gather_v,
    all_to_all_v,
    reduce_scatter_v,
)
from runtime.router import MoEConfigError, MoESettings, Routing


@dataclass(frozen=True)
class ExpertLayout:
    """This rank's routed experts as the plan assigns them (its rank row's `experts`).

    The splits below index count tables as [EP source][L local experts], so the ownership must be
    Megatron's contiguous one: EP rank r holds experts [r·L, (r+1)·L). The plan's block is checked
    against that shape here, never derived from E and EP.
    """

    num_experts: int
    ep_rank: int
    ep_size: int
    etp_rank: int
    etp_size: int
    experts: range  # global ids of the local experts, from the plan

    def __post_init__(self) -> None:
        if self.num_experts % self.ep_size:
            raise MoEConfigError(
                f"num_experts ({self.num_experts}) must be divisible by EP ({self.ep_size})"
            )
        blocks = range(self.ep_rank * len(self.experts), (self.ep_rank + 1) * len(self.experts))
        if self.experts != blocks or len(self.experts) * self.ep_size != self.num_experts:
            raise MoEConfigError(
                f"EP rank {self.ep_rank} of {self.ep_size} is assigned experts "
                f"[{self.experts.start}, {self.experts.stop}) of {self.num_experts}; the "
                "dispatcher needs equal contiguous blocks in EP-rank order (recompile the plan)"
            )

    @classmethod
    def of(cls, num_experts: int, groups: MoEGroups, experts: range | None) -> ExpertLayout:
        """The layer's layout from its groups and the plan's experts for this rank; only a single
        EP rank may omit the ownership (it then holds every expert)."""
        if experts is None:
            if groups.ep_size != 1:
                raise MoEConfigError(f"EP = {groups.ep_size} needs the plan's expert ownership "
                                     "(the rank row's `experts`)")
            experts = range(num_experts)
        return cls(num_experts, groups.ep_rank, groups.ep_size, groups.etp_rank, groups.etp_size,
                   experts)

    @property
    def num_local(self) -> int:
        return len(self.experts)

    @property
    def first_expert(self) -> int:
        return self.experts.start

    @property
    def sources(self) -> int:
        """tp_ep members whose rows reach this rank: EP·ETP of the plan's groups (MoEGroups checks
        that the plan's tp_ep group has exactly this size)."""
        return self.ep_size * self.etp_size


@dataclass(frozen=True)
class SplitPlan:
    """Row counts of every exchange for one dispatch (host integers, like Megatron's splits)."""

    input_splits: tuple[int, ...]  # rows this rank sends to each EP peer
    output_splits: tuple[int, ...]  # rows it receives from each EP peer
    output_splits_tp: tuple[int, ...]  # rows each ETP peer contributes to the gather
    chunk_counts: tuple[tuple[int, ...], ...]  # [ETP·EP sources][L local experts]

    @property
    def tokens_per_local_expert(self) -> list[int]:
        return [sum(column) for column in zip(*self.chunk_counts, strict=True)]


def split_plan(
    local_counts: torch.Tensor, gathered_counts: torch.Tensor, layout: ExpertLayout
) -> SplitPlan:
    """Splits from this rank's per-expert counts [E] and the tp_ep-gathered counts [ETP·EP, E].

    gathered rows are tp_ep members in group order (ETP fastest). Received rows are ordered
    (ETP source, EP source, local expert), so the chunk table is indexed the same way.
    """
    ep, etp, num_local = layout.ep_size, layout.etp_size, layout.num_local
    first = layout.first_expert
    input_splits = local_counts.view(ep, num_local).sum(dim=1)
    by_source = gathered_counts.view(ep, etp, layout.num_experts).transpose(0, 1)
    mine = by_source[:, :, first : first + num_local]  # [ETP, EP, L]
    per_source = mine.sum(dim=2)  # [ETP, EP]
    return SplitPlan(
        input_splits=tuple(input_splits.tolist()),
        output_splits=tuple(per_source[layout.etp_rank].tolist()),
        output_splits_tp=tuple(per_source.sum(dim=1).tolist()),
        chunk_counts=tuple(tuple(row) for row in mine.reshape(layout.sources, num_local).tolist()),
    )


def chunk_sort_index(chunk_counts: torch.Tensor) -> torch.Tensor:
    """Row index that reorders chunks [S sources, L experts] from source-major to expert-major."""
    sources, experts = chunk_counts.shape
    flat = chunk_counts.reshape(-1)
    starts = (torch.cumsum(flat, 0) - flat).view(sources, experts)
    sizes_expert_major = chunk_counts.t().reshape(-1)
    starts_expert_major = starts.t().reshape(-1)
    new_starts = torch.cumsum(sizes_expert_major, 0) - sizes_expert_major
    total = int(flat.sum())
    shift = torch.repeat_interleave(starts_expert_major - new_starts, sizes_expert_major)
    return shift + torch.arange(total)


def inverse_permutation(index: torch.Tensor) -> torch.Tensor:
    inverse = torch.empty_like(index)
    inverse[index] = torch.arange(index.numel(), device=index.device)
    return inverse


@dataclass
class DispatchResult:
    """What the experts need, plus what combine needs to undo the dispatch."""

    rows: torch.Tensor  # [M, h] sorted by local expert
    probs: torch.Tensor  # [M] routing weight of each row
    tokens_per_expert: list[int]  # [L]
    state: object


@dataclass
class _AlltoAllState:
    token_index: torch.Tensor  # source token of each permuted row (num_tokens = padding)
    num_tokens: int
    padded: bool
    plan: SplitPlan
    restore: torch.Tensor | None  # undoes permute 2


@dataclass
class _AllGatherState:
    token_index: torch.Tensor  # row in the gathered [P·n] tokens of each expert input row
    gathered_tokens: int
    sizes: tuple[int, ...]


class AlltoAllDispatcher:
    """Megatron's AlltoAll dispatcher stages on ep (hidden, weights) and expt_tp (ETP > 1)."""

    def __init__(
        self, settings: MoESettings, layout: ExpertLayout, groups: MoEGroups, ledger: Ledger
    ) -> None:
        self.settings = settings
        self.layout = layout
        self.ep = groups.comm("ep")
        self.expt_tp = groups.comm("expt_tp")
        self.tp_ep = groups.comm("tp_ep")
        self.ledger = ledger

    def dispatch(self, rows: torch.Tensor, routing: Routing) -> DispatchResult:
        if self.settings.pad_to_capacity:
            token_index, prob_index, plan = self._permute_padded(rows.shape[0], routing)
        else:
            token_index, prob_index, plan = self._permute_dropless(routing)
        padded = self.settings.pad_to_capacity
        source_rows = torch.cat([rows, rows.new_zeros(1, rows.shape[1])]) if padded else rows
        # Weights travel in the activation dtype, as Megatron's router output does by default.
        weights = routing.weights.reshape(-1).to(rows.dtype)
        source_weights = torch.cat([weights, weights.new_zeros(1)]) if padded else weights
        hidden = source_rows.index_select(0, token_index)
        probs = source_weights.index_select(0, prob_index)

        hidden = all_to_all_v(
            hidden, self.ep, plan.input_splits, plan.output_splits, self.ledger,
            "ep_dispatch_hidden",
        )
        probs = all_to_all_v(
            probs, self.ep, plan.input_splits, plan.output_splits, self.ledger,
            "ep_dispatch_probs",
        )
        hidden = all_gather_v(
            hidden, self.expt_tp, plan.output_splits_tp, self.ledger, "etp_gather_hidden"
        )
        probs = all_gather_v(
            probs, self.expt_tp, plan.output_splits_tp, self.ledger, "etp_gather_probs"
        )

        restore = None
        if len(plan.chunk_counts) > 1 and self.layout.num_local > 1:
            order = chunk_sort_index(torch.tensor(plan.chunk_counts, dtype=torch.int64))
            order = order.to(hidden.device)
            hidden, probs = hidden.index_select(0, order), probs.index_select(0, order)
            restore = inverse_permutation(order)
        state = _AlltoAllState(token_index, rows.shape[0], padded, plan, restore)
        return DispatchResult(hidden, probs, plan.tokens_per_local_expert, state)

    def combine(self, expert_out: torch.Tensor, state: object) -> torch.Tensor:
        assert isinstance(state, _AlltoAllState)
        plan = state.plan
        out = expert_out if state.restore is None else expert_out.index_select(0, state.restore)
        out = reduce_scatter_v(
            out, self.expt_tp, plan.output_splits_tp, self.ledger, "etp_scatter_hidden"
        )
        out = all_to_all_v(
            out, self.ep, plan.output_splits, plan.input_splits, self.ledger,
            "ep_combine_hidden",
        )
        if not state.padded:
            return out.new_zeros(state.num_tokens, out.shape[1]).index_add(0, state.token_index, out)
        # Padding slots point at the extra row num_tokens, which is dropped.
        summed = out.new_zeros(state.num_tokens + 1, out.shape[1])
        return summed.index_add(0, state.token_index, out)[: state.num_tokens]

    def _permute_dropless(
        self, routing: Routing
    ) -> tuple[torch.Tensor, torch.Tensor, SplitPlan]:
        """Permute 1: kept assignments grouped by expert (expert-major ⇒ destination-major)."""
        topk = routing.experts.shape[1]
        flat_experts = routing.experts.reshape(-1)
        assignments = torch.arange(flat_experts.numel(), device=flat_experts.device)
        if routing.kept is not None:
            assignments = assignments[routing.kept.reshape(-1)]
        kept_experts = flat_experts[assignments]
        order = assignments[torch.sort(kept_experts, stable=True).indices]
        counts = torch.bincount(kept_experts, minlength=self.layout.num_experts)
        plan = self._exchange_counts(counts)
        return order // topk, order, plan

    def _permute_padded(
        self, num_tokens: int, routing: Routing
    ) -> tuple[torch.Tensor, torch.Tensor, SplitPlan]:
        """Permute 1 for drop-and-pad: E·c slots, expert e owns slots [e·c, (e+1)·c)."""
        assert routing.capacity is not None and routing.kept is not None
        capacity, topk = routing.capacity, routing.experts.shape[1]
        num_experts = self.layout.num_experts
        flat_experts = routing.experts.reshape(-1)
        assignments = torch.arange(flat_experts.numel(), device=flat_experts.device)
        assignments = assignments[routing.kept.reshape(-1)]
        order = assignments[torch.sort(flat_experts[assignments], stable=True).indices]
        sorted_experts = flat_experts[order]
        counts = torch.bincount(sorted_experts, minlength=num_experts)
        starts = torch.cumsum(counts, 0) - counts
        place = torch.arange(order.numel(), device=order.device) - starts[sorted_experts]
        slot = sorted_experts * capacity + place
        token_index = torch.full((num_experts * capacity,), num_tokens, device=order.device)
        prob_index = torch.full((num_experts * capacity,), flat_experts.numel(),
                                device=order.device)
        token_index[slot] = order // topk
        prob_index[slot] = order
        ep, etp, num_local = self.layout.ep_size, self.layout.etp_size, self.layout.num_local
        plan = SplitPlan(
            input_splits=(num_local * capacity,) * ep,
            output_splits=(num_local * capacity,) * ep,
            output_splits_tp=(ep * num_local * capacity,) * etp,
            chunk_counts=((capacity,) * num_local,) * self.layout.sources,
        )
        return token_index, prob_index, plan

    def _exchange_counts(self, counts: torch.Tensor) -> SplitPlan:
        """Count exchange: all-gather the length-E int64 counts over tp_ep (one DtoH sync)."""
        counts = counts.to(torch.int64)
        gathered = all_gather_constant(counts, self.tp_ep, self.ledger, "ep_count_exchange")
        return split_plan(counts.cpu(), gathered.cpu(), self.layout)


class AllGatherDispatcher:
    """Megatron's AllGather dispatcher over tp_ep; every rank must hold the same token count."""

    def __init__(
        self, settings: MoESettings, layout: ExpertLayout, groups: MoEGroups, ledger: Ledger
    ) -> None:
        self.settings = settings
        self.layout = layout
        self.tp_ep: CommGroup = groups.comm("tp_ep")
        self.ledger = ledger

    def dispatch(self, rows: torch.Tensor, routing: Routing) -> DispatchResult:
        num_tokens = rows.shape[0]
        num_experts = self.layout.num_experts
        probs = rows.new_zeros(num_tokens, num_experts)
        probs = probs.scatter(1, routing.experts, routing.weights.to(rows.dtype))
        chosen = torch.ones_like(routing.experts, dtype=torch.bool)
        chosen = chosen if routing.kept is None else routing.kept
        routing_map = torch.zeros(num_tokens, num_experts, dtype=torch.bool, device=rows.device)
        routing_map = routing_map.scatter(1, routing.experts, chosen)

        sizes = (num_tokens,) * self.tp_ep.size
        hidden = all_gather_v(rows, self.tp_ep, sizes, self.ledger, "ag_gather_hidden")
        probs = all_gather_v(probs, self.tp_ep, sizes, self.ledger, "ag_gather_probs")
        # gloo has no bool collectives; uint8 keeps the one byte per entry.
        routing_map = all_gather_constant(
            routing_map.to(torch.uint8), self.tp_ep, self.ledger, "ag_gather_routing_map"
        ).bool()

        first, num_local = self.layout.first_expert, self.layout.num_local
        local_map = routing_map[:, first : first + num_local]
        local_expert, token_index = local_map.t().nonzero(as_tuple=True)
        tokens_per_expert = torch.bincount(local_expert, minlength=num_local).tolist()
        expert_rows = hidden.index_select(0, token_index)
        expert_probs = probs[token_index, first + local_expert]
        state = _AllGatherState(token_index, hidden.shape[0], sizes)
        return DispatchResult(expert_rows, expert_probs, tokens_per_expert, state)

    def combine(self, expert_out: torch.Tensor, state: object) -> torch.Tensor:
        assert isinstance(state, _AllGatherState)
        full = expert_out.new_zeros(state.gathered_tokens, expert_out.shape[1])
        full = full.index_add(0, state.token_index, expert_out)
        return reduce_scatter_v(full, self.tp_ep, state.sizes, self.ledger, "ag_scatter_hidden")


def make_dispatcher(
    settings: MoESettings, layout: ExpertLayout, groups: MoEGroups, ledger: Ledger
) -> AlltoAllDispatcher | AllGatherDispatcher:
    if settings.dispatcher == "allgather":
        return AllGatherDispatcher(settings, layout, groups, ledger)
    return AlltoAllDispatcher(settings, layout, groups, ledger)

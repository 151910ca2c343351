"""The collectives table: every collective moeplan prices, described once.

Each entry names the process-group kinds it runs over (kinds of planner/grid.py), the algorithm of
each phase, which of its figures depend on the routing decisions, and the config flag that can
hide it behind compute. The byte formulas (planner/budget/comm.py), `moeplan verify`
(planner/verify.py) and the runtime's byte ledger (runtime/comm.py) all look names up here, so a
collective missing from the table fails loudly in each of them instead of going uncounted.

Phases: `fwd` and `bwd` for what runs in the forward and backward pass; once-per-step work
(gradient reductions, parameter gathers, count reductions) is filed under `fwd`. An entry with
`recomputed_with` also has a `recompute` phase: the forward re-run inside the backward of a
recomputed layer, with the forward's algorithm (planner/budget/comm.py prices it from the forward).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

ALGORITHMS: Mapping[str, str] = MappingProxyType({
    "alltoall": "all-to-all, direct sends",
    "allgather": "ring all-gather: (G-1) shards on the wire",
    "reduce_scatter": "ring reduce-scatter: (G-1)/G of the input on the wire",
    "allreduce": "ring all-reduce: 2(G-1)/G of the input on the wire",
    "p2p": "point-to-point send",
})
DIRECTIONS = ("send_bytes", "recv_bytes")
RECOMPUTE = "recompute"  # the phase of a forward re-run by activation recompute

Figure = tuple[str, str]  # (phase, direction)


class UnknownCollective(ValueError):
    """A collective, phase, group or algorithm that the table does not list."""


@dataclass(frozen=True)
class Collective:
    """One collective: where it runs, how, and what routing and overlap do to it.

    `routed_rows`: it moves routed token rows, so how many depends on the router unless the
    layout fixes every split (drop-and-pad, the AllGather dispatcher, forced balanced routing).
    `fixed_when_dropless`: of a routed-rows collective, the figures a dropless all-to-all still
    fixes under learned routing — a rank always sends its n·k assignments and gets its own
    n·k rows back, whatever experts they chose.
    `recomputed_with`: the recompute settings whose backward re-runs this collective's forward
    (`full` for full-layer recompute, or a selective recompute module such as `moe`).
    `layer_kind`: the stage count of the layers that each run it once per microbatch (`blocks`,
    `L_moe`, `L_dense`, `L_csa`, `L_hca`): full recompute with the block method re-runs only the
    first recompute_num_layers blocks of each chunk, so its re-run share is counted in these.
    `grad_only`: it runs only while autograd records (Megatron's router computes the aux loss
    under torch.is_grad_enabled()); Megatron's checkpoint runs a recomputed layer's first forward
    without grad, so such a collective moves from `fwd` to `recompute` instead of running twice.
    """

    name: str
    groups: tuple[str, ...]
    phases: Mapping[str, tuple[str, ...]]
    doc: str
    routed_rows: bool = False
    fixed_when_dropless: frozenset[Figure] = field(default_factory=frozenset)
    overlap: str | None = None
    recomputed_with: frozenset[str] = frozenset()
    layer_kind: str = "blocks"
    grad_only: bool = False

    def __post_init__(self) -> None:
        if self.recomputed_with and RECOMPUTE not in self.phases:
            # The re-run forward: the forward's algorithm, and the forward's routing-free figures.
            phases = MappingProxyType({**self.phases, RECOMPUTE: self.phases["fwd"]})
            again = frozenset((RECOMPUTE, d) for phase, d in self.fixed_when_dropless
                              if phase == "fwd")
            object.__setattr__(self, "phases", phases)
            object.__setattr__(self, "fixed_when_dropless", self.fixed_when_dropless | again)

    def check(self, phase: str, group: str | None = None, algorithm: str | None = None) -> None:
        """Refuse a phase, group or algorithm this collective does not have."""
        if phase not in self.phases:
            raise UnknownCollective(f"{self.name} has no phase {phase!r} in the collectives "
                                    f"table (it has {', '.join(self.phases)})")
        if group is not None and group not in self.groups:
            raise UnknownCollective(f"{self.name} does not run over {group!r} in the collectives "
                                    f"table (it runs over {', '.join(self.groups)})")
        if algorithm is not None and algorithm not in self.phases[phase]:
            raise UnknownCollective(f"{self.name}.{phase} is not a {algorithm} in the collectives "
                                    f"table (it is {' or '.join(self.phases[phase])})")

    def figures(self) -> tuple[Figure, ...]:
        return tuple((phase, d) for phase in self.phases for d in DIRECTIONS)


def _fixed(*figures: str) -> frozenset[Figure]:
    return frozenset(tuple(f.split(".")) for f in figures)  # type: ignore[misc]


_A2A = {"fwd": ("alltoall",), "bwd": ("alltoall",)}
_GATHER = {"fwd": ("allgather",), "bwd": ("reduce_scatter",)}
_SCATTER = {"fwd": ("reduce_scatter",), "bwd": ("allgather",)}
_EP_OVERLAP = "overlap.overlap_moe_expert_parallel_comm"
_DISPATCHER = "Megatron-LM dev@d48bd6be megatron/core/transformer/moe/token_dispatcher.py"
_DDP = "Megatron-LM dev@d48bd6be megatron/core/distributed/distributed_data_parallel.py"
# Full recompute re-runs every collective of a recomputed layer (Megatron-LM dev@d48bd6be
# megatron/core/transformer/transformer_block.py TransformerBlock._checkpointed_forward); the
# selective `moe` module checkpoints the whole MoE layer, router, count exchange, dispatch,
# experts and combine (megatron/core/transformer/moe/moe_layer.py MoELayer.forward, its
# custom_forward under tensor_parallel.checkpoint), not only the experts.
_MOE_RC: dict[str, Any] = {"recomputed_with": frozenset({"full", "moe"}), "layer_kind": "L_moe"}

TABLE: Mapping[str, Collective] = MappingProxyType({c.name: c for c in (
    Collective("ep_dispatch_hidden", ("ep", "tp_ep"), _A2A,
               f"token rows to their experts (tp_ep with the Flex dispatcher); {_DISPATCHER} "
               "MoEAlltoAllTokenDispatcher.token_dispatch", routed_rows=True,
               fixed_when_dropless=_fixed("fwd.send_bytes", "bwd.recv_bytes"),
               overlap=_EP_OVERLAP, **_MOE_RC),
    Collective("ep_combine_hidden", ("ep", "tp_ep"), _A2A,
               f"expert outputs back to their tokens; {_DISPATCHER} token_combine",
               routed_rows=True, fixed_when_dropless=_fixed("fwd.recv_bytes", "bwd.send_bytes"),
               overlap=_EP_OVERLAP, **_MOE_RC),
    Collective("ep_dispatch_probs", ("ep",), _A2A,
               f"routing probabilities beside the rows; {_DISPATCHER} token_dispatch",
               routed_rows=True, fixed_when_dropless=_fixed("fwd.send_bytes", "bwd.recv_bytes"),
               overlap=_EP_OVERLAP, **_MOE_RC),
    Collective("ep_count_exchange", ("tp_ep",), {"fwd": ("allgather",)},
               f"per-expert token counts (int64 [E]); {_DISPATCHER} preprocess", **_MOE_RC),
    Collective("etp_gather_hidden", ("expt_tp",), _GATHER,
               f"received rows gathered over expert TP; {_DISPATCHER} token_dispatch",
               routed_rows=True, overlap=_EP_OVERLAP, **_MOE_RC),
    Collective("etp_gather_probs", ("expt_tp",), _GATHER,
               f"their probabilities; {_DISPATCHER} token_dispatch", routed_rows=True,
               overlap=_EP_OVERLAP, **_MOE_RC),
    Collective("etp_scatter_hidden", ("expt_tp",), _SCATTER,
               f"expert partial sums reduce-scattered over expert TP; {_DISPATCHER} "
               "token_combine", routed_rows=True, overlap=_EP_OVERLAP, **_MOE_RC),
    Collective("ag_gather_hidden", ("tp_ep",), _GATHER,
               f"AllGather dispatcher: every token to every rank; {_DISPATCHER} "
               "MoEAllGatherTokenDispatcher.token_dispatch", **_MOE_RC),
    Collective("ag_gather_probs", ("tp_ep",), _GATHER, "AllGather dispatcher: probs [n, E]", **_MOE_RC),
    Collective("ag_gather_routing_map", ("tp_ep",), {"fwd": ("allgather",)},
               "AllGather dispatcher: routing map [n, E] (no gradient)", **_MOE_RC),
    Collective("ag_scatter_hidden", ("tp_ep",), _SCATTER,
               f"AllGather dispatcher: outputs reduce-scattered back; {_DISPATCHER} "
               "MoEAllGatherTokenDispatcher.token_combine", **_MOE_RC),
    Collective("cp_kv_gather", ("cp",), _GATHER,
               "context parallelism: local K and V gathered over CP (all-gather CP attention)",
               # inside core attention: the selective `core_attn` module re-runs it too
               # (Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py
               # Attention._checkpointed_attention_forward)
               recomputed_with=frozenset({"full", "core_attn"})),
    Collective("dense_grad_reduce", ("dp_cp", "intra_dp_cp"),
               {"fwd": ("allreduce", "reduce_scatter")},
               f"dense grad buffer, once per step (reduce-scatter with the distributed "
               f"optimizer); {_DDP} start_grad_sync", overlap="overlap.overlap_grad_reduce"),
    Collective("dense_param_gather", ("dp_cp", "intra_dp_cp"), {"fwd": ("allgather",)},
               "dense parameters gathered after the sharded update (distributed optimizer)",
               overlap="overlap.overlap_param_gather"),
    Collective("dense_grad_instance_reduce", ("inter_dist_opt",), {"fwd": ("allreduce",)},
               "dense grad shard all-reduced across distributed-optimizer instances",
               overlap="overlap.overlap_grad_reduce"),
    Collective("expert_grad_reduce", ("expt_dp", "intra_expt_dp"),
               {"fwd": ("allreduce", "reduce_scatter")},
               f"routed-expert grad buffer, once per step; {_DDP} start_grad_sync",
               overlap="overlap.overlap_grad_reduce"),
    Collective("expert_param_gather", ("expt_dp", "intra_expt_dp"), {"fwd": ("allgather",)},
               "expert parameters gathered after the sharded update (distributed optimizer)",
               overlap="overlap.overlap_param_gather"),
    Collective("expert_grad_instance_reduce", ("inter_dist_opt",), {"fwd": ("allreduce",)},
               "expert grad shard all-reduced across distributed-optimizer instances",
               overlap="overlap.overlap_grad_reduce"),
    Collective("embd_grad_reduce", ("embd",), {"fwd": ("allreduce",)},
               "word-embedding grads synced over the embedding group (tied output, MTP copies); "
               "Megatron-LM dev@d48bd6be megatron/core/distributed/finalize_model_grads.py"),
    Collective("expert_bias_count_reduce", ("tp_dp_cp",), {"fwd": ("allreduce",)},
               "token counts of every expert-bias router, once per step; Megatron-LM "
               "dev@d48bd6be megatron/core/transformer/moe/moe_utils.py"),
    Collective("aux_loss_count_reduce", ("tp_cp",), {"fwd": ("allreduce",)},
               "aux-loss token counts summed over tp_cp in every router pass; Megatron-LM "
               "dev@d48bd6be megatron/core/transformer/moe/router.py", **_MOE_RC,
               grad_only=True),  # TopKRouter.routing: only under torch.is_grad_enabled()
    Collective("pp_activation", ("pp",), {"fwd": ("p2p",), "bwd": ("p2p",)},
               "pipeline activations forward, their gradients backward; Megatron-LM "
               "dev@d48bd6be megatron/core/pipeline_parallel/p2p_communication.py"),
)})


def collective(name: str) -> Collective:
    """The table entry of `name`; an unknown name fails loudly."""
    try:
        return TABLE[name]
    except KeyError:
        raise UnknownCollective(f"collective {name!r} is not in the collectives table "
                                "(planner/budget/collectives.py)") from None

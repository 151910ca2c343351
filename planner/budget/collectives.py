"""The collectives table: every collective moeplan prices, described once.

Each entry names the process-group kinds it runs over (kinds of planner/grid.py), the algorithm of
each phase, which of its figures depend on the routing decisions, and the config flag that can
hide it behind compute. The byte formulas (planner/budget/comm.py), `moeplan verify`
(planner/verify.py) and the runtime's byte ledger (runtime/comm.py) all look names up here, so a
collective missing from the table fails loudly in each of them instead of going uncounted.

Phases: `fwd` and `bwd` for what runs in the forward and backward pass; once-per-step work
(gradient reductions, parameter gathers, count reductions) is filed under `fwd`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

ALGORITHMS: Mapping[str, str] = MappingProxyType({
    "alltoall": "all-to-all, direct sends",
    "allgather": "ring all-gather: (G-1) shards on the wire",
    "reduce_scatter": "ring reduce-scatter: (G-1)/G of the input on the wire",
    "allreduce": "ring all-reduce: 2(G-1)/G of the input on the wire",
    "p2p": "point-to-point send",
})
DIRECTIONS = ("send_bytes", "recv_bytes")

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
    """

    name: str
    groups: tuple[str, ...]
    phases: Mapping[str, tuple[str, ...]]
    doc: str
    routed_rows: bool = False
    fixed_when_dropless: frozenset[Figure] = field(default_factory=frozenset)
    overlap: str | None = None
    recomputed_with: frozenset[str] = frozenset()

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
_TP_LAYERS = "Megatron-LM dev@d48bd6be megatron/core/tensor_parallel/layers.py"
_MAPPINGS = "megatron/core/tensor_parallel/mappings.py"
# A TP collective inside a transformer layer's forward runs again when that forward is recomputed:
# the whole layer ("full"), the MoE layer with its shared expert, the dense MLP, the shared expert,
# or MLA's up projections (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_layer.py).
_TP_RECOMPUTE = frozenset({"full", "moe", "mlp", "shared_experts", "mla_up_proj"})

TABLE: Mapping[str, Collective] = MappingProxyType({c.name: c for c in (
    Collective("ep_dispatch_hidden", ("ep", "tp_ep"), _A2A,
               f"token rows to their experts (tp_ep with the Flex dispatcher); {_DISPATCHER} "
               "MoEAlltoAllTokenDispatcher.token_dispatch", routed_rows=True,
               fixed_when_dropless=_fixed("fwd.send_bytes", "bwd.recv_bytes"),
               overlap=_EP_OVERLAP),
    Collective("ep_combine_hidden", ("ep", "tp_ep"), _A2A,
               f"expert outputs back to their tokens; {_DISPATCHER} token_combine",
               routed_rows=True, fixed_when_dropless=_fixed("fwd.recv_bytes", "bwd.send_bytes"),
               overlap=_EP_OVERLAP),
    Collective("ep_dispatch_probs", ("ep",), _A2A,
               f"routing probabilities beside the rows; {_DISPATCHER} token_dispatch",
               routed_rows=True, fixed_when_dropless=_fixed("fwd.send_bytes", "bwd.recv_bytes"),
               overlap=_EP_OVERLAP),
    Collective("ep_count_exchange", ("tp_ep",), {"fwd": ("allgather",)},
               f"per-expert token counts (int64 [E]); {_DISPATCHER} preprocess"),
    Collective("etp_gather_hidden", ("expt_tp",), _GATHER,
               f"received rows gathered over expert TP; {_DISPATCHER} token_dispatch",
               routed_rows=True, overlap=_EP_OVERLAP),
    Collective("etp_gather_probs", ("expt_tp",), _GATHER,
               f"their probabilities; {_DISPATCHER} token_dispatch", routed_rows=True,
               overlap=_EP_OVERLAP),
    Collective("etp_scatter_hidden", ("expt_tp",), _SCATTER,
               f"expert partial sums reduce-scattered over expert TP; {_DISPATCHER} "
               "token_combine", routed_rows=True, overlap=_EP_OVERLAP),
    Collective("ag_gather_hidden", ("tp_ep",), _GATHER,
               f"AllGather dispatcher: every token to every rank; {_DISPATCHER} "
               "MoEAllGatherTokenDispatcher.token_dispatch"),
    Collective("ag_gather_probs", ("tp_ep",), _GATHER, "AllGather dispatcher: probs [n, E]"),
    Collective("ag_gather_routing_map", ("tp_ep",), {"fwd": ("allgather",)},
               "AllGather dispatcher: routing map [n, E] (no gradient)"),
    Collective("ag_scatter_hidden", ("tp_ep",), _SCATTER,
               f"AllGather dispatcher: outputs reduce-scattered back; {_DISPATCHER} "
               "MoEAllGatherTokenDispatcher.token_combine"),
    Collective("cp_kv_gather", ("cp",), _GATHER,
               "context parallelism: local K and V gathered over CP (all-gather CP attention)"),
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
               "dev@d48bd6be megatron/core/transformer/moe/router.py"),
    Collective("pp_activation", ("pp",), {"fwd": ("p2p",), "bwd": ("p2p",)},
               "pipeline activations forward, their gradients backward; Megatron-LM "
               "dev@d48bd6be megatron/core/pipeline_parallel/p2p_communication.py"),
    Collective("tp_sp_gather", ("tp",), _GATHER,
               f"sequence parallelism: the [s/TP, b, w] input of every column-parallel linear "
               f"(attention QKV or MLA up projections, shared-expert/dense FC1, MTP eh_proj, "
               f"output layer) and MLA's rotary key all-gathered over TP; backward reduce-scatters "
               f"its grad; {_TP_LAYERS} ColumnParallelLinear, {_MAPPINGS} "
               "gather_from_sequence_parallel_region", recomputed_with=_TP_RECOMPUTE),
    Collective("tp_sp_wgrad_gather", ("tp",), {"bwd": ("allgather",)},
               f"sequence parallelism: a column-parallel linear stores its input sequence-sharded "
               f"and all-gathers it again in backward for the weight gradient; {_TP_LAYERS} "
               "LinearWithGradAccumulationAndAsyncCommunication.backward"),
    Collective("tp_sp_scatter", ("tp",), _SCATTER,
               f"sequence parallelism: the output of every row-parallel linear (attention proj, "
               f"shared-expert/dense FC2) reduce-scattered over TP to [s/TP, b, h]; backward "
               f"all-gathers its grad; {_TP_LAYERS} RowParallelLinear, {_MAPPINGS} "
               "reduce_scatter_to_sequence_parallel_region", recomputed_with=_TP_RECOMPUTE),
    Collective("tp_linear_allreduce", ("tp",), {"fwd": ("allreduce",), "bwd": ("allreduce",)},
               f"TP without sequence parallelism: forward all-reduce of every row-parallel "
               f"linear's output, backward all-reduce of every column-parallel linear's input "
               f"grad; {_TP_LAYERS} RowParallelLinear, ColumnParallelLinear",
               recomputed_with=_TP_RECOMPUTE),
    Collective("tp_embedding_reduce", ("tp",),
               {"fwd": ("reduce_scatter", "allreduce"), "bwd": ("allgather",)},
               f"vocab-parallel embedding output summed over TP: reduce-scattered to the sequence "
               f"shard with sequence parallelism (backward all-gathers its grad), else all-reduced; "
               f"{_TP_LAYERS} VocabParallelEmbedding.forward"),
    Collective("tp_mtp_gather", ("tp",), {"fwd": ("allgather",), "bwd": ("allgather",)},
               "MTP: the column-parallel eh_proj output gathered along the hidden dimension; with "
               "sequence parallelism the following sequence scatter all-gathers its grad in "
               "backward; Megatron-LM dev@d48bd6be megatron/core/transformer/"
               "multi_token_prediction.py MultiTokenPredictionLayer._concat_embeddings"),
    Collective("tp_xent_reduce", ("tp",), {"fwd": ("allreduce",)},
               "vocab-parallel cross entropy: three all-reduces over TP of [s, b] fp32 (logit max, "
               "target logit, sum of exponentials) per loss; Megatron-LM dev@d48bd6be "
               "megatron/core/tensor_parallel/cross_entropy.py VocabParallelCrossEntropy.forward"),
    Collective("tp_sp_grad_reduce", ("tp",), {"fwd": ("allreduce",)},
               "sequence parallelism: grads of the parameters replicated over TP (norms, router, "
               "MLA down projections, mHC) all-reduced over TP once per step; Megatron-LM "
               "dev@d48bd6be megatron/core/distributed/finalize_model_grads.py "
               "_allreduce_non_tensor_model_parallel_grads"),
    Collective("global_aux_count_reduce", ("tp_dp_cp",), {"fwd": ("allreduce",)},
               "global aux loss: per-expert token counts (int64 [E]) all-reduced over tp_dp_cp in "
               "every router pass, accumulated across microbatches; Megatron-LM dev@d48bd6be "
               "megatron/core/transformer/moe/router.py TopKRouter._apply_global_aux_loss",
               recomputed_with=frozenset({"full", "moe"})),
)})


def collective(name: str) -> Collective:
    """The table entry of `name`; an unknown name fails loudly."""
    try:
        return TABLE[name]
    except KeyError:
        raise UnknownCollective(f"collective {name!r} is not in the collectives table "
                                "(planner/budget/collectives.py)") from None

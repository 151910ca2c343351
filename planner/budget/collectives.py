"""The collectives table: every collective moeplan prices, described once.

Each entry names the process-group kinds it runs over (planner/layout/group_kinds.py), the algorithm of
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
# Each algorithm's transpose: the backward of a forward collective moves its gradients the other
# way, so its send is the forward's receive (an all-gather's backward is a reduce-scatter of the
# gathered grads). A backward phase whose algorithm is not the transpose of the forward's (an
# all-gather again, as GTP's and Megatron-FSDP's weight re-gathers) repeats the forward's figures.
TRANSPOSE: Mapping[str, str] = MappingProxyType({
    "alltoall": "alltoall", "allgather": "reduce_scatter", "reduce_scatter": "allgather",
    "allreduce": "allreduce", "p2p": "p2p",
})
DIRECTIONS = ("send_bytes", "recv_bytes")
RECOMPUTE = "recompute"  # the phase of a forward re-run by activation recompute

Figure = tuple[str, str]  # (phase, direction)


class UnknownCollective(ValueError):
    """A collective, phase, group or algorithm that the table does not list."""


# Megatron's --tp-comm-overlap (Transformer Engine's userbuffers, with sequence parallelism: Megatron-LM
# dev@d48bd6be megatron/training/arguments.py asserts it) overlaps the SP all-gathers and
# reduce-scatters with the linears' GEMMs (megatron/core/model_parallel_config.py tp_comm_overlap).
TP_OVERLAP = "overlap.tp_comm_overlap"


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
    `shared_expert_part`: the shared expert's GEMM (`fc1` or `fc2`) that
    `moe_shared_expert_overlap` runs on a side stream while this exchange is in flight, so its
    time can hide the exchange (Megatron-LM dev@d48bd6be megatron/core/transformer/moe/
    token_dispatcher.py MoEAlltoAllTokenDispatcher.token_dispatch launches the shared fc1 right
    after the token all-to-all, token_combine the fc2 after the combine).
    `grad_only`: it runs only while autograd records (Megatron's router computes the aux loss
    under torch.is_grad_enabled()); Megatron's checkpoint runs a recomputed layer's first forward
    without grad, so such a collective moves from `fwd` to `recompute` instead of running twice.
    `not_issued`: why a config whose groups have several ranks still issues none of it (the
    setting that turns it off, or the collective that runs instead); a group of one rank gives
    its own reason (planner/budget/comm.py Collectives.close). `{field}` names a Variant field.
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
    shared_expert_part: str | None = None
    not_issued: str = ""

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
_V4_ATTN = "Megatron-LM dev@d48bd6be megatron/core/transformer/experimental_attention_variant"
_V4_CP_UTILS = f"{_V4_ATTN}/csa_utils/cp_utils.py"
_CSA = f"{_V4_ATTN}/csa.py"
# Full recompute re-runs the whole layer forward, its CP exchanges included (Megatron-LM
# dev@d48bd6be megatron/core/transformer/transformer_block.py _checkpointed_forward); DSv4
# attention rejects the core_attn module and mla_up_proj re-runs only the up-projections
# (experimental_attention_variant/deepseek_v4_hybrid_attention.py DSv4HybridAttention).
_FULL_LAYER = frozenset({"full"})
_REGATHER = {"fwd": ("allgather",), "bwd": ("allgather",)}
_GTP = "Megatron-LM main@d98e8a64 megatron/core/tensor_parallel/generalized_tensor_parallelism.py"
_FSDP = ("Megatron-LM dev@d48bd6be megatron/core/distributed/fsdp/src/megatron_fsdp/"
         "megatron_fsdp.py")
_MUON = ("Megatron-LM dev@d48bd6be megatron/core/optimizer/emerging_optimizers.py "
         "TensorParallelMuon.orthogonalize")
_TP_LAYERS = "Megatron-LM dev@d48bd6be megatron/core/tensor_parallel/layers.py"
_MAPPINGS = "megatron/core/tensor_parallel/mappings.py"
# A TP collective inside a transformer layer's forward runs again when full recompute re-runs that
# layer (Megatron-LM dev@d48bd6be megatron/core/transformer/transformer_block.py
# _checkpointed_forward). Selective modules (moe, mlp, shared_experts, mla_up_proj) re-run only
# their own part of these collectives; one entry sums every linear of the layer, so that partial
# re-run is not priced (the figures under selective recompute are a lower bound).
_TP_RECOMPUTE = frozenset({"full"})
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
               overlap=_EP_OVERLAP, shared_expert_part="fc1", **_MOE_RC),
    Collective("ep_combine_hidden", ("ep", "tp_ep"), _A2A,
               f"expert outputs back to their tokens; {_DISPATCHER} token_combine",
               routed_rows=True, fixed_when_dropless=_fixed("fwd.recv_bytes", "bwd.send_bytes"),
               overlap=_EP_OVERLAP, shared_expert_part="fc2", **_MOE_RC),
    Collective("ep_dispatch_probs", ("ep",), _A2A,
               f"routing probabilities beside the rows; {_DISPATCHER} token_dispatch",
               routed_rows=True, fixed_when_dropless=_fixed("fwd.send_bytes", "bwd.recv_bytes"),
               overlap=_EP_OVERLAP, **_MOE_RC),
    Collective("ep_count_exchange", ("tp_ep",), {"fwd": ("allgather",)},
               f"per-expert token counts (int64 [E]); {_DISPATCHER} preprocess", **_MOE_RC,
               not_issued="drop-and-pad fixes every split: no count exchange"),
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
               "context parallelism: local K and V (standard, or MLA's per-head K and V after the "
               "up projections) gathered over CP; all-gather CP attention, and TE's p2p ring moves "
               "the same bytes",
               # inside core attention: the selective `core_attn` module re-runs it too
               # (Megatron-LM dev@d48bd6be megatron/core/transformer/attention.py
               # Attention._checkpointed_attention_forward)
               recomputed_with=frozenset({"full", "core_attn"})),
    Collective("dense_grad_reduce", ("dp_cp", "intra_dp_cp"),
               {"fwd": ("allreduce", "reduce_scatter")},
               f"dense grad buffer, once per step (reduce-scatter with the distributed "
               f"optimizer); {_DDP} start_grad_sync", overlap="overlap.overlap_grad_reduce",
               not_issued=("Megatron-FSDP {fsdp}: grads are reduce-scattered after every "
                           "backward (fsdp_dense_grad_reduce)")),
    Collective("dense_param_gather", ("dp_cp", "intra_dp_cp"), {"fwd": ("allgather",)},
               "dense parameters gathered after the sharded update (distributed optimizer)",
               overlap="overlap.overlap_param_gather",
               not_issued=("Megatron-FSDP optim_grads_params: the update writes the shard; "
                           "blocks gather before use (fsdp_dense_param_gather)")),
    Collective("dense_grad_instance_reduce", ("inter_dist_opt",), {"fwd": ("allreduce",)},
               "dense grad shard all-reduced across distributed-optimizer instances",
               overlap="overlap.overlap_grad_reduce"),
    Collective("expert_grad_reduce", ("expt_dp", "intra_expt_dp"),
               {"fwd": ("allreduce", "reduce_scatter")},
               f"routed-expert grad buffer, once per step; {_DDP} start_grad_sync",
               overlap="overlap.overlap_grad_reduce",
               not_issued=("Megatron-FSDP {fsdp}: grads are reduce-scattered after every "
                           "backward (fsdp_expert_grad_reduce)")),
    Collective("expert_param_gather", ("expt_dp", "intra_expt_dp"), {"fwd": ("allgather",)},
               "expert parameters gathered after the sharded update (distributed optimizer)",
               overlap="overlap.overlap_param_gather",
               not_issued=("Megatron-FSDP optim_grads_params: the update writes the shard; "
                           "blocks gather before use (fsdp_expert_param_gather)")),
    Collective("expert_grad_instance_reduce", ("inter_dist_opt",), {"fwd": ("allreduce",)},
               "expert grad shard all-reduced across distributed-optimizer instances",
               overlap="overlap.overlap_grad_reduce"),
    Collective("embd_grad_reduce", ("embd",), {"fwd": ("allreduce",)},
               "word-embedding grads synced over the embedding group (tied output, MTP copies); "
               "Megatron-LM dev@d48bd6be megatron/core/distributed/finalize_model_grads.py"),
    Collective("expert_bias_count_reduce", ("tp_dp_cp",), {"fwd": ("allreduce",)},
               "token counts of every expert-bias router, once per step; Megatron-LM "
               "dev@d48bd6be megatron/core/transformer/moe/moe_utils.py",
               not_issued="no expert bias"),
    Collective("aux_loss_count_reduce", ("tp_cp",), {"fwd": ("allreduce",)},
               "aux-loss token counts summed over tp_cp in every router pass; Megatron-LM "
               "dev@d48bd6be megatron/core/transformer/moe/router.py", **_MOE_RC,
               grad_only=True,  # TopKRouter.routing: only under torch.is_grad_enabled()
               not_issued="no aux loss, or TP·CP = 1: nothing to sum"),
    Collective("pp_activation", ("pp",), {"fwd": ("p2p",), "bwd": ("p2p",)},
               "pipeline activations forward, their gradients backward; Megatron-LM "
               "dev@d48bd6be megatron/core/pipeline_parallel/p2p_communication.py",
               overlap="overlap.overlap_p2p_comm"),
    # DeepSeek-V4 attention under THD context parallelism (contiguous split). The DeepSeek-V4
    # Megatron write-up calls the neighbour message "uncompressed tail KV"; Megatron sends the
    # attention input's hidden rows and projects their KV on the receiver.
    Collective("cp_boundary_hidden", ("cp",), {"fwd": ("p2p",), "bwd": ("p2p",)},
               f"V4 attention: the last max(window, compressor reach) hidden rows to the next CP "
               f"rank, their grads back; {_V4_CP_UTILS} exchange_cp_boundary_hidden",
               recomputed_with=_FULL_LAYER),
    Collective("cp_compressed_kv_gather", ("cp",), _GATHER,
               f"V4 CSA/HCA: fixed-capacity compressed KV all-gathered over CP, grads "
               f"reduce-scattered back; {_CSA} CompressedSparseAttention._forward_thd_cp",
               recomputed_with=_FULL_LAYER),
    Collective("cp_indexer_k_gather", ("cp",), _GATHER,
               f"V4 CSA: the lightning indexer's compressed keys all-gathered over CP, grads "
               f"reduce-scattered back; {_CSA} CompressedSparseAttention._forward_thd_cp",
               recomputed_with=_FULL_LAYER),
    # ---- gated DeltaNet and DSA under CP (their records' cp_bytes and cp_exchanges in
    # planner/budget/layer_kinds.py).
    Collective("cp_gdn_state_gather", ("cp",), _REGATHER,
               "gated DeltaNet, chunkwise CP: each rank's fp32 chunk state and transition matrix "
               "all-gathered, and their gradients in backward; flash-linear-attention fla/ops/cp/"
               "chunk_delta_h.py chunk_gated_delta_rule_fwd_h_pre_process / _bwd_dhu_pre_process, "
               "called from Megatron-LM dev@d48bd6be megatron/core/ssm/gated_delta_net/gdn.py",
               recomputed_with=_FULL_LAYER, layer_kind="L_linear"),
    Collective("cp_gdn_conv_boundary", ("cp",), {"fwd": ("p2p",), "bwd": ("p2p",)},
               "gated DeltaNet, chunkwise CP: the short convolution's last kernel − 1 input rows to "
               "the next CP rank, their grads back; fla causal_conv1d (conv_cp_send_recv_fwd)",
               recomputed_with=_FULL_LAYER, layer_kind="L_linear"),
    Collective("cp_gdn_relayout", ("cp",), _A2A,
               "gated DeltaNet, chunkwise CP under the zigzag layout: hidden rows converted to the "
               "contiguous layout and back; Megatron-LM dev@d48bd6be megatron/core/"
               "context_parallel_layout/conversion.py convert_module_input_tensors_cp_partition_mode",
               recomputed_with=_FULL_LAYER, layer_kind="L_linear"),
    Collective("cp_mamba_a2a", ("cp",), _A2A,
               "Mamba-2 under CP: z, x, B, C, dt turned from sequence shards into head shards "
               "before the conv and scan, the output back after; Megatron-LM dev@d48bd6be "
               "megatron/core/ssm/mamba_context_parallel.py MambaContextParallel.pre_conv_ssm",
               recomputed_with=_FULL_LAYER, layer_kind="L_mamba"),
    Collective("cp_dsa_indexer_k_gather", ("cp",), _GATHER,
               "DSA: the lightning indexer's keys all-gathered over CP, grads reduce-scattered back; "
               "Megatron-LM dev@d48bd6be megatron/core/transformer/experimental_attention_variant/"
               "dsa.py DSAttention.forward",
               recomputed_with=_FULL_LAYER),
    Collective("gtp_weight_gather", ("gtp_remat",), _REGATHER,
               f"dense GTP shards all-gathered into whole TP slices before each GEMM, again before "
               f"its backward and in a recompute forward; {_GTP} GTPShardedParam."
               "materialize_group_for_forward / materialize_group_for_backward",
               recomputed_with=frozenset({"full"})),
    Collective("gtp_wgrad_scatter", ("gtp_remat",), {"bwd": ("reduce_scatter",)},
               f"the whole temporary wgrad reduce-scattered back to the permanent GTP shard; {_GTP} "
               "GTPShardedParam.finalize_group_grads (wgrad_reduce_scatter)"),
    Collective("gtp_replicated_grad_reduce", ("gtp_remat",), {"fwd": ("allreduce",)},
               "grads of parameters GTP does not slice (norms, router, embedding ...) all-reduced "
               "over gtp_remat, once per step; Megatron-LM main@d98e8a64 megatron/core/distributed/"
               "finalize_model_grads.py _allreduce_replicated_grads_over_gtp_remat_group"),
    Collective("egtp_weight_gather", ("expt_gtp_remat",), _REGATHER,
               f"routed-expert EGTP shards all-gathered into whole ETP slices before the grouped "
               f"GEMM, again before its backward and in a recompute forward; {_GTP} "
               "GTPShardedParam.materialize_group_for_forward / materialize_group_for_backward",
               **_MOE_RC),
    Collective("egtp_wgrad_scatter", ("expt_gtp_remat",), {"bwd": ("reduce_scatter",)},
               f"the whole temporary expert wgrad reduce-scattered back to the EGTP shard; {_GTP} "
               "GTPShardedParam.finalize_group_grads (wgrad_reduce_scatter)"),
    Collective("fsdp_dense_param_gather", ("dp_cp", "intra_dp_cp"), _REGATHER,
               f"Megatron-FSDP optim_grads_params: dense parameter shards all-gathered before each "
               f"block's forward and again before its backward (a recompute forward reuses the "
               f"backward gather); {_FSDP} MegatronFSDP._register_fsdp_hooks"),
    Collective("fsdp_expert_param_gather", ("expt_dp", "intra_expt_dp"), _REGATHER,
               f"the same for routed-expert parameters over expt_dp; {_FSDP} "
               "MegatronFSDP._register_fsdp_hooks"),
    Collective("fsdp_dense_grad_reduce", ("dp_cp", "intra_dp_cp"), {"bwd": ("reduce_scatter",)},
               f"Megatron-FSDP optim_grads / optim_grads_params: dense grads reduce-scattered after "
               f"every backward (grad_reduce_every_bprop); {_FSDP} MegatronFSDP._register_fsdp_hooks",
               overlap="overlap.overlap_grad_reduce"),
    Collective("fsdp_expert_grad_reduce", ("expt_dp", "intra_expt_dp"), {"bwd": ("reduce_scatter",)},
               f"the same for routed-expert grads over expt_dp; {_FSDP} "
               "MegatronFSDP._register_fsdp_hooks", overlap="overlap.overlap_grad_reduce"),
    Collective("muon_dense_tp_gather", ("tp",), {"fwd": ("allgather",)},
               f"Muon: the TP shards of each dense matrix's fp32 momentum all-gathered for "
               f"Newton-Schulz (tp_mode duplicated), once per step; {_MUON}"),
    Collective("muon_expert_tp_gather", ("expt_tp",), {"fwd": ("allgather",)},
               f"Muon: the same for routed-expert matrices over expt_tp; {_MUON}"),
    Collective("tp_sp_gather", ("tp",), _GATHER,
               f"sequence parallelism: the [s/TP, b, w] input of every column-parallel linear "
               f"(attention QKV or MLA up projections, shared-expert/dense FC1, MTP eh_proj, "
               f"output layer) and MLA's rotary key all-gathered over TP; backward reduce-scatters "
               f"its grad; {_TP_LAYERS} ColumnParallelLinear, {_MAPPINGS} "
               "gather_from_sequence_parallel_region", recomputed_with=_TP_RECOMPUTE,
               overlap=TP_OVERLAP,
               not_issued="no sequence parallelism"),
    Collective("tp_qkv_gather", ("tp",), _GATHER,
               "fewer query groups than TP: each rank's QKV projection output [s, b, (heads + 2 * "
               "groups) * d / TP] all-gathered along the last dimension over TP, so that every "
               "rank can take its group's query, key and value heads out of the whole; backward "
               "reduce-scatters its grad; Megatron-LM dev@d48bd6be "
               "megatron/core/transformer/attention.py SelfAttention.get_query_key_value_tensors, "
               f"{_MAPPINGS} all_gather_last_dim_from_tensor_parallel_region",
               recomputed_with=_TP_RECOMPUTE,
               not_issued="as many query groups as TP, or more"),
    Collective("tp_sp_wgrad_gather", ("tp",), {"bwd": ("allgather",)},
               f"sequence parallelism: a column-parallel linear stores its input sequence-sharded "
               f"and all-gathers it again in backward for the weight gradient; {_TP_LAYERS} "
               "LinearWithGradAccumulationAndAsyncCommunication.backward", overlap=TP_OVERLAP,
               not_issued="no sequence parallelism"),
    Collective("tp_sp_scatter", ("tp",), _SCATTER,
               f"sequence parallelism: the output of every row-parallel linear (attention proj, "
               f"shared-expert/dense FC2) reduce-scattered over TP to [s/TP, b, h]; backward "
               f"all-gathers its grad; {_TP_LAYERS} RowParallelLinear, {_MAPPINGS} "
               "reduce_scatter_to_sequence_parallel_region", recomputed_with=_TP_RECOMPUTE,
               overlap=TP_OVERLAP,
               not_issued="no sequence parallelism"),
    Collective("tp_linear_allreduce", ("tp",), {"fwd": ("allreduce",), "bwd": ("allreduce",)},
               f"TP without sequence parallelism: forward all-reduce of every row-parallel "
               f"linear's output, backward all-reduce of every column-parallel linear's input "
               f"grad; {_TP_LAYERS} RowParallelLinear, ColumnParallelLinear",
               recomputed_with=_TP_RECOMPUTE,
               not_issued="sequence parallelism: reduce-scatter instead"),
    Collective("tp_embedding_reduce", ("tp",),
               {"fwd": ("reduce_scatter", "allreduce"), "bwd": ("allgather",)},
               f"vocab-parallel embedding output summed over TP: reduce-scattered to the sequence "
               f"shard with sequence parallelism (backward all-gathers its grad), else all-reduced; "
               f"{_TP_LAYERS} VocabParallelEmbedding.forward",
               not_issued="no sequence parallelism: the grad is not gathered"),
    Collective("tp_mtp_gather", ("tp",), {"fwd": ("allgather",), "bwd": ("allgather",)},
               "MTP: the column-parallel eh_proj output gathered along the hidden dimension; with "
               "sequence parallelism the following sequence scatter all-gathers its grad in "
               "backward; Megatron-LM dev@d48bd6be megatron/core/transformer/"
               "multi_token_prediction.py MultiTokenPredictionLayer._concat_embeddings",
               not_issued="no sequence parallelism: the grad is split, not gathered"),
    Collective("tp_xent_reduce", ("tp",), {"fwd": ("allreduce",)},
               "vocab-parallel cross entropy: three all-reduces over TP of [s, b] fp32 (logit max, "
               "target logit, sum of exponentials) per loss; Megatron-LM dev@d48bd6be "
               "megatron/core/tensor_parallel/cross_entropy.py VocabParallelCrossEntropy.forward"),
    Collective("tp_sp_grad_reduce", ("tp",), {"fwd": ("allreduce",)},
               "sequence parallelism: grads of the parameters replicated over TP (norms, router, "
               "MLA down projections, mHC) all-reduced over TP once per step; Megatron-LM "
               "dev@d48bd6be megatron/core/distributed/finalize_model_grads.py "
               "_allreduce_non_tensor_model_parallel_grads",
               not_issued="no sequence parallelism"),
    Collective("global_aux_count_reduce", ("tp_dp_cp",), {"fwd": ("allreduce",)},
               "global aux loss: per-expert token counts (int64 [E]) all-reduced over tp_dp_cp in "
               "every router pass, accumulated across microbatches; Megatron-LM dev@d48bd6be "
               "megatron/core/transformer/moe/router.py TopKRouter._apply_global_aux_loss",
               **_MOE_RC, grad_only=True,
               not_issued="no global aux loss"),  # TopKRouter.routing: only under is_grad_enabled()
    # Virtual experts are not in Megatron dev or main (PR #7450, open); a forward re-run plans
    # and moves the replicas again, so recomputing the MoE layer repeats the weight transfer.
    Collective("vex_weight_transfer", ("ep",), {"fwd": ("alltoall",)},
               "virtual experts: hot experts' weights copied to temporary slots on peer ranks "
               "(predicted only; Megatron-LM PR #7450, MoonEP-style expert duplication)",
               routed_rows=True, **_MOE_RC),
    Collective("vex_grad_return", ("ep",), {"bwd": ("alltoall",)},
               "virtual experts: replica weight gradients returned to the owning rank "
               "(predicted only; Megatron-LM PR #7450)", routed_rows=True),
)})


@dataclass(frozen=True)
class Exchange:
    """One collective as the comm page declares it: its forward figures, and the doc of its
    backward, whose figures and algorithm the table derives (planner/budget/comm.py
    Collectives.exchange). `algorithm` picks the forward's where the table lists several; `size`
    names the group's size where it is not the group's own symbol; `split` = (inter-node,
    intra-node) wire bytes of a backend that routes around the plain model, in both phases."""

    name: str
    group: str
    send: str
    recv: str
    doc: str
    back: str
    algorithm: str | None = None
    size: str | None = None
    split: tuple[str, str] | None = None


def collective(name: str) -> Collective:
    """The table entry of `name`; an unknown name fails loudly."""
    try:
        return TABLE[name]
    except KeyError:
        raise UnknownCollective(f"collective {name!r} is not in the collectives table "
                                "(planner/budget/collectives.py)") from None


# Once per optimizer step, not per microbatch or layer: gradient reductions, parameter gathers
# after the sharded update, count reductions and the Muon momentum gathers. The table files their
# work under phase `fwd`; displays call that phase "step" so they do not read as forward traffic.
ONCE_PER_STEP: frozenset[str] = frozenset({
    "dense_grad_reduce", "dense_param_gather", "dense_grad_instance_reduce", "expert_grad_reduce",
    "expert_param_gather", "expert_grad_instance_reduce", "embd_grad_reduce",
    "expert_bias_count_reduce", "gtp_replicated_grad_reduce", "muon_dense_tp_gather",
    "muon_expert_tp_gather", "tp_sp_grad_reduce",
})
PHASE_LABELS: Mapping[str, str] = MappingProxyType({"fwd": "forward", "bwd": "backward",
                                                     RECOMPUTE: "recompute"})


def phase_label(name: str, phase: str) -> str:
    """What a phase is for people: "step" for once-per-step work filed under `fwd`."""
    if phase == "fwd" and name in ONCE_PER_STEP:
        return "step"
    return PHASE_LABELS.get(phase, phase)

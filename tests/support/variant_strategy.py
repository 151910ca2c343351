"""Hypothesis strategy over every structural choice of the formula book (`Variant`)."""

from __future__ import annotations

from hypothesis import strategies as st

from planner.accounting import Variant

RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "shared_experts", "mlp",
                     "moe")


# Standard attention's optional kinds (planner/budget/layer_kinds.py), beside its softmax base.
STANDARD_EXTRAS = ("window", "chunked", "gdn", "sinks", "output_gate", "head_gate")
V4 = frozenset({"v4_csa", "v4_hca", "v4_window"})


def kind_sets() -> st.SearchStrategy[frozenset[str]]:
    """The modelled kinds a config can have together: one attention family's base with any of its
    kinds and features (one q/k norm form at most)."""
    standard = st.builds(lambda extra, qk: frozenset({"softmax", *extra, *qk}),
                         st.frozensets(st.sampled_from(STANDARD_EXTRAS)),
                         st.sampled_from(((), ("qk_norm",), ("qk_norm_layer",))))
    return st.one_of(standard, st.sampled_from((frozenset({"mla"}), frozenset({"mla", "dsa"}), V4)))


def variants() -> st.SearchStrategy[Variant]:
    flag = st.booleans()
    return st.builds(
        Variant,
        dispatcher=st.sampled_from(("alltoall", "allgather", "flex")),
        capacity=st.sampled_from(("dropless", "drop", "pad")),
        ep=flag, etp=flag, tp_ep=flag, dp_cp=flag, edp=flag, tp_dp_cp=flag, pp=flag,
        dist_opt=flag, instances=flag,
        kinds=kind_sets(),
        mhc=flag, per_token_loss=flag, expert_bias=flag,
        optimizer=st.sampled_from(("adam", "sgd", "muon")),
        master_copy=flag,
        recompute=st.sampled_from((None, "full", "selective")),
        recompute_method=st.sampled_from((None, "uniform", "block")),
        recompute_modules=st.frozensets(st.sampled_from(RECOMPUTE_MODULES)),
        cp=flag, mla_q_lora=flag,
        aux_counts=st.sampled_from(("", "aux_loss", "seq_aux_loss")),
        ncclep=flag,
        latent=flag,
        fsdp=st.sampled_from(("", "no_shard", "optim", "optim_grads", "optim_grads_params")),
        gtp=flag, egtp=flag, muon_tp=flag,
        tp=flag, sp=flag, shared_overlap=flag, global_aux=flag,
        flex_backend=st.sampled_from(("", "deepep", "hybridep", "ncclep")),
        quant_pad=flag, virtual_experts=flag,
        layernorm=flag, swiglu=flag, bias=flag, dropout=flag, shared_gate=flag,
        router_fp64=flag, mla_norms=flag,
    )

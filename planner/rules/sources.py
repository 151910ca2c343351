"""Where each rule comes from: Megatron-LM source paths and functions at the commits moeplan targets.

A rule's `source` names the Megatron code that enforces (or defines) the constraint, so a user can
read it in their own checkout. DeepSeek-V4 features live on the dev branch, GTP only on main; a
fact that only the DeepSeek-V4 article states is cited as that write-up, in words.
"""

from __future__ import annotations

DEV = "Megatron-LM dev@d48bd6be"
MAIN = "Megatron-LM main@d98e8a64"
V4_WRITE_UP = "the DeepSeek-V4 Megatron write-up"


def dev(path: str, function: str) -> str:
    """`Megatron-LM dev@d48bd6be megatron/<path> <function>`."""
    return f"{DEV} megatron/{path} {function}"


def main(path: str, function: str) -> str:
    """`Megatron-LM main@d98e8a64 megatron/<path> <function>` (GTP lives only on main)."""
    return f"{MAIN} megatron/{path} {function}"


TRANSFORMER_CONFIG = dev("core/transformer/transformer_config.py", "TransformerConfig.__post_init__")
VALIDATE_ARGS = dev("training/arguments.py", "validate_args")
PARALLEL_STATE = dev("core/parallel_state.py", "initialize_model_parallel")
RANK_GENERATOR = dev("core/parallel_state.py", "RankGenerator.__init__")
DDP = dev("core/distributed/distributed_data_parallel.py", "DistributedDataParallel.__init__")
FLEX_DISPATCHER = dev("core/transformer/moe/token_dispatcher.py", "MoEFlexTokenDispatcher.__init__")
NCCLEP_MANAGER = dev("core/transformer/moe/token_dispatcher.py", "_NCCLEPManager.__init__")
MAIN_VALIDATE_ARGS = main("training/arguments.py", "validate_args")
MAIN_PARALLEL_STATE = main("core/parallel_state.py", "initialize_model_parallel")
MAIN_DDP = main("core/distributed/distributed_data_parallel.py", "DistributedDataParallel.__init__")
GTP_SEQUENCE_SHARDS = ("moeplan's model of GTP sequence sharding (gtp_remat_num_sequence_shards is in "
                       f"no Megatron-LM branch: neither {MAIN} nor {DEV})")
VIRTUAL_EXPERTS = f"Megatron-LM PR #7450, MoonEP-style expert duplication (open; not in {MAIN})"

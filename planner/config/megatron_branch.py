"""Which Megatron-LM branch a config needs: DeepSeek-V4 features live only on the dev branch
(Megatron-LM dev@d48bd6be), GTP only on main. The emitter writes it into the launch line and rule
MOE003 names it; both read it here, so the rules need not load the emitter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.config.schema import Config


class BranchConflict(ValueError):
    """The config has features of both branches: no one Megatron-LM command line runs it."""

    path = "parallel.gtp"


def megatron_branch(cfg: Config) -> str:
    """The Megatron-LM branch the config's command line targets: dev, main, or 'main or dev'."""
    m, p, t = cfg.model, cfg.parallel, cfg.training
    dev = (m.attention_variant == "dsv4_hybrid" or m.moe_n_hash_layers > 0 or m.enable_hyper_connections
           or p.cp_partition_mode == "contiguous" or p.dynamic_context_parallel
           or t.sequence_packing_scheduler is not None)
    main = p.gtp > 1 or p.egtp > 1
    flex = cfg.moe.moe_token_dispatcher_type == "flex"
    # DeepEP v2 is a dev-only flex backend; NCCL EP's zero-copy path is main-only (issue 25).
    dev = dev or (flex and cfg.moe.moe_flex_dispatcher_backend == "deepepv2")
    main = main or cfg.moe.moe_ncclep_zero_copy
    if dev and main:
        raise BranchConflict("GTP or moe_ncclep_zero_copy (main branch only) cannot be combined "
                             "with DeepSeek-V4 features or the deepepv2 backend (dev branch only) "
                             "in one Megatron-LM command line")
    return "dev" if dev else "main" if main else "main or dev"

"""Which Megatron-LM branch a config needs: DeepSeek-V4 features live only on the dev branch
(Megatron-LM dev@d48bd6be), GTP and NCCL EP's zero-copy path only on main. The emitter writes it
into the launch line, rule MOE003 names it and rule V4012 refuses a config that needs both; all
read it here, so the rules need not load the emitter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.config.schema import Config


class BranchConflict(ValueError):
    """The config has features of both branches: no one Megatron-LM command line runs it. `path` is
    the field of the first main-only feature (the one to change for dev)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


def branch_features(cfg: Config) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(dev-only, main-only) features the config uses, each as (field, what it is)."""
    m, p, t, moe = cfg.model, cfg.parallel, cfg.training, cfg.moe
    dev = [(path, what) for path, what, used in (
        ("model.attention_variant", "DeepSeek-V4 attention (dsv4_hybrid)",
         m.attention_variant == "dsv4_hybrid"),
        ("model.moe_n_hash_layers", "hash routing", m.moe_n_hash_layers > 0),
        ("model.enable_hyper_connections", "mHC hyper-connections", m.enable_hyper_connections),
        ("parallel.cp_partition_mode", "the contiguous CP partition", p.cp_partition_mode == "contiguous"),
        ("parallel.dynamic_context_parallel", "dynamic CP", p.dynamic_context_parallel),
        ("training.sequence_packing_scheduler", "a sequence-packing scheduler",
         t.sequence_packing_scheduler is not None),
        ("moe.moe_flex_dispatcher_backend", "the deepepv2 flex backend",
         moe.moe_token_dispatcher_type == "flex" and moe.moe_flex_dispatcher_backend == "deepepv2"),
    ) if used]
    main = [(path, what) for path, what, used in (
        ("parallel.gtp", f"GTP {p.gtp}", p.gtp > 1),
        ("parallel.egtp", f"expert GTP {p.egtp}", p.egtp > 1),
        ("moe.moe_ncclep_zero_copy", "NCCL EP zero-copy", moe.moe_ncclep_zero_copy),
    ) if used]
    return dev, main


def megatron_branch(cfg: Config) -> str:
    """The Megatron-LM branch the config's command line targets: dev, main, or 'main or dev'."""
    dev, main = branch_features(cfg)
    if dev and main:
        raise BranchConflict(main[0][0], f"{', '.join(w for _, w in main)} (Megatron-LM main only) "
                             f"cannot be combined with {', '.join(w for _, w in dev)} (Megatron-LM dev "
                             "only) in one Megatron-LM command line")
    return "dev" if dev else "main" if main else "main or dev"

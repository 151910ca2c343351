"""Where the config of a measured run comes from: one function, so the log importer's rebuild
from Megatron's argument dump can take over from the explicit `--config` in one place."""

from __future__ import annotations

from pathlib import Path

from planner.calibrate.megatron_log import LogError, MeasuredLog
from planner.config.loader import load_config
from planner.config.schema import Config


def config_for_log(log: MeasuredLog, config: Path | None) -> Config:
    """The moeplan config of the run a log measured: the given file (raises the loader's
    UnreadableConfig / InvalidConfig), or LogError when none is given."""
    if config is None:
        raise LogError(f"{log.path}: no config for this log: pass --config CONFIG (one per log, "
                       "in order, or one for all)")
    return load_config(config)

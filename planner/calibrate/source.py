"""Where the config of a measured run comes from: the given `--config`, else the log's own
argument dump rebuilt by the log importer (planner/config/importers/megatron_log.py), so a log
alone calibrates when Megatron printed its arguments."""

from __future__ import annotations

from pathlib import Path

from planner.calibrate.megatron_log import LogError, MeasuredLog
from planner.config.importers.megatron_log import config_from_read
from planner.config.loader import load_config, parse_config
from planner.config.schema import Config


def config_for_log(log: MeasuredLog, config: Path | None) -> Config:
    """The moeplan config of the run a log measured: the given file (raises the loader's
    UnreadableConfig / InvalidConfig), else the config its argument dump rebuilds (LogError when
    the log has no dump or the dump leaves an argument moeplan cannot take over). The dump is the
    one `parse_log` already read from the cleaned lines: the log is read once."""
    if config is not None:
        return load_config(config)
    if not log.arguments or log.read is None:
        raise LogError(f"{log.path}: the log has no argument dump ('---- arguments ----'): pass "
                       "--config CONFIG (one per log, in order, or one for all)")
    data, unmapped = config_from_read(log.read, log.path)
    errors = [row for row in unmapped if row.error]
    if errors:
        shown = "; ".join(f"{row.argument} {row.value}: {row.why}" for row in errors[:5])
        raise LogError(f"{log.path}: the argument dump does not rebuild the run's config ({shown}"
                       f"{'; …' if len(errors) > 5 else ''}): pass --config CONFIG, or fix it from "
                       f"`moeplan import megatron {log.path}`")
    return parse_config(data)

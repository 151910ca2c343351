"""Launch scripts from a compiled plan: torchrun, Slurm and a Megatron-LM argument list.

`emit_files` renders everything first (refusing unsafe launch values with EmitError), `write_files`
then writes the run folder atomically. Templates live in the `templates` package (`*.j2`).
"""

from planner.emit.bundle import TARGETS, EmittedFile, emit_files, existing, log_folder, write_files
from planner.emit.safety import EmitError

__all__ = ["TARGETS", "EmitError", "EmittedFile", "emit_files", "existing", "log_folder", "write_files"]

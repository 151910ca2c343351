"""`moeplan emit bridge`: the planned layout as Megatron-Bridge ConfigContainer overrides.

A Megatron-Bridge recipe (NVIDIA-NeMo/Megatron-Bridge@067f987d) builds the model; what moeplan plans
— the parallel layout, the batch, precision, the optimizer and its offload, recompute and overlap,
the MoE dispatcher — goes in as `section.field=value` overrides after the recipe
(scripts/training/run_recipe.py takes trailing KEY=VALUE overrides of the ConfigContainer). Each
override is the `emit megatron` argument of a plan field, under the ConfigContainer field that
Megatron's argument sets (planner/config/data/megatron_dests.tsv gives the argument's dest; the
field table planner/config/data/bridge_fields.tsv, read from Bridge's and Megatron's dataclasses,
the section). Model-architecture arguments stay the recipe's: the overrides fit a recipe of the same
model. An argument with no ConfigContainer field is refused (EmitError), never dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from planner.config.argument_classes import argument_arities
from planner.config.schema import Config
from planner.emit.megatron import megatron_arguments
from planner.emit.safety import EmitError

FIELDS_FILE = Path(__file__).resolve().parents[1] / "config" / "data" / "bridge_fields.tsv"
DESTS_FILE = Path(__file__).resolve().parents[1] / "config" / "data" / "megatron_dests.tsv"
BRIDGE = "NVIDIA-NeMo/Megatron-Bridge@067f987d"
PLANNED = ("parallel.", "training.", "moe.", "overlap.")
SECTIONS = ("model", "train", "optimizer", "ddp", "dataset", "checkpoint", "rng")
# Megatron argument dests that TransformerConfig spells otherwise (Megatron-LM dev@d48bd6be
# megatron/training/arguments.py core_transformer_config_from_args)
RENAMED = {"num_virtual_stages_per_pipeline_rank": "virtual_pipeline_model_parallel_size",
           "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
           "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage"}
# the arguments both the optimizer and the DDP wrapper read (Megatron's training.py get_model /
# get_megatron_optimizer pass them to both configs)
BOTH = {"use_distributed_optimizer"}
# Bridge's mixed-precision recipes (src/megatron/bridge/training/mixed_precision.py) by moeplan's
# precision and FP8 recipe
MIXED = {("bf16", None): "bf16_mixed", ("fp16", None): "fp16_mixed",
         ("bf16", "delayed"): "bf16_with_fp8_delayed_scaling_mixed",
         ("bf16", "tensorwise"): "bf16_with_fp8_current_scaling_mixed",
         ("bf16", "blockwise"): "bf16_with_fp8_subchannel_scaling_mixed",
         ("bf16", "mxfp8"): "bf16_with_mxfp8_mixed"}
_PRECISION_FLAGS = {"--bf16", "--fp16", "--fp8-format", "--fp8-recipe", "--fp8-param-gather"}
# emitted from a plan field but the recipe's model owns it: the position table's length (GPTModelProvider
# has no max_position_embeddings; its rotary / learned embeddings are the recipe's)
_RECIPE_OWNS = {"--max-position-embeddings"}


@dataclass(frozen=True)
class Override:
    key: str  # section.field
    value: str
    source: str  # the moeplan field it reproduces

    @property
    def line(self) -> str:
        return f"{self.key}={self.value}"


@cache
def bridge_fields() -> dict[str, tuple[str, ...]]:
    """field → the ConfigContainer sections that have it, in SECTIONS order."""
    found: dict[str, list[str]] = {}
    for line in FIELDS_FILE.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            section, name = line.split("\t")
            found.setdefault(name, []).append(section)
    return {name: tuple(sorted(sections, key=SECTIONS.index)) for name, sections in found.items()}


@cache
def _dests() -> dict[str, str]:
    rows = (line.split("\t") for line in DESTS_FILE.read_text(encoding="utf-8").splitlines()
            if line and not line.startswith("#"))
    return {row[1]: row[0] for row in rows}


# list arguments whose TransformerConfig field also takes one value (Union[str, List[str]] and
# Union[float, List[float]] in transformer_config.py)
SCALAR_OR_LIST = {"moe_router_load_balancing_type", "moe_aux_loss_coeff", "cp_comm_type"}
_PLAIN = re.compile(r"[A-Za-z0-9_.+-]+")


def _quoted(text: str) -> str:
    """A Hydra override value: quoted where its grammar would read the characters otherwise."""
    return text if _PLAIN.fullmatch(text) else "'" + text.replace("'", "\\'") + "'"


def _value(flag: str, name: str, values: tuple[str, ...]) -> str:
    kind, nargs = argument_arities().get(flag, ("value", ""))
    if kind == "true" or (kind == "optional" and not values):
        return "true"
    if kind == "false":
        return "false"
    if nargs in ("+", "*") and not (name in SCALAR_OR_LIST and len(values) == 1):
        return "[" + ",".join(_quoted(v) for v in values) + "]"
    return _quoted(values[0])


def bridge_overrides(cfg: Config) -> list[Override]:
    """The plan's overrides of a Bridge recipe's ConfigContainer (EmitError for one it has no field for)."""
    args = megatron_arguments(cfg)
    found: list[Override] = []
    recipe = MIXED.get((cfg.training.precision, cfg.training.fp8_recipe if cfg.training.fp8 else None))
    if cfg.training.precision != "fp32":
        if recipe is None:
            raise EmitError("training.fp8_recipe", f"no Megatron-Bridge mixed-precision recipe for "
                            f"{cfg.training.precision} with FP8 recipe {cfg.training.fp8_recipe}")
        found.append(Override("mixed_precision", recipe, "training.precision / training.fp8_recipe"))
    for flag in args.flags:
        planned = flag.source.startswith(PLANNED) or "stage split" in flag.source
        if not planned or flag.flag in _PRECISION_FLAGS | _RECIPE_OWNS:
            continue
        dest = _dests().get(flag.flag, flag.flag[2:].replace("-", "_"))
        name = RENAMED.get(dest, dest)
        sections = bridge_fields().get(name)
        if not sections:
            raise EmitError(flag.source.split(" ")[0], f"{flag.flag} (from {flag.source}) has no field in "
                            f"Megatron-Bridge's ConfigContainer with a GPTModelProvider ({BRIDGE}); set "
                            "it in the recipe by hand")
        chosen = [s for s in sections if name in BOTH or s == sections[0]]
        if name == "seq_length":
            chosen = ["model", "dataset"]  # run_recipe.py: the dataset owns the sequence length
        value = _value(flag.flag, name, flag.values)
        found += [Override(f"{section}.{name}", value, flag.source) for section in chosen]
    return found


def bridge_text(cfg: Config, config_path: Path | str) -> str:
    """bridge_overrides.txt: one override per line, after a header saying how to use them."""
    lines = [f"# Megatron-Bridge ConfigContainer overrides for {config_path} ({BRIDGE}):",
             "# append them to a recipe run of the same model, e.g.",
             "#   python scripts/training/run_recipe.py --recipe RECIPE $(grep -v '^#' bridge_overrides.txt)",
             f"# on {cfg.parallel.world_size} ranks; each override follows the moeplan field it sets"]
    for override in bridge_overrides(cfg):
        lines += [f"# {override.source}", override.line]
    return "\n".join(lines) + "\n"

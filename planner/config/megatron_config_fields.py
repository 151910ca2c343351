"""Which section of Megatron's config container holds a field: the table `moeplan emit bridge` reads
(planner/config/data/megatron_config_fields.txt, generated from Megatron-LM's source by
tests/support/megatron_config_fields.py and checked against it in tests)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

DATA_FILE = Path(__file__).parent / "data" / "megatron_config_fields.txt"


@cache
def config_fields() -> dict[str, frozenset[str]]:
    """Section -> the field names of its config dataclass (bases included)."""
    table = {}
    for line in DATA_FILE.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            section, names = line.split(":", 1)
            table[section] = frozenset(names.split())
    return table


def sections_holding(name: str, *, mla: bool = False) -> tuple[str, ...]:
    """The sections with a field `name`, in the table's order (Megatron fills every one of them);
    MLATransformerConfig's own fields count as the model's only for a multi-latent-attention model."""
    found = []
    for section, names in config_fields().items():
        if name in names and (section != "model_mla" or mla):
            found.append("model" if section == "model_mla" else section)
    return tuple(found)

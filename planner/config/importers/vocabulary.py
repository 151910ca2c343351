"""The vocabulary a launch trains with, when its command line does not say.

Megatron takes the vocabulary from the tokenizer unless `--vocab-size` is given
(Megatron-LM dev@d48bd6be megatron/core/tokenizers/utils/build_tokenizer.py build_tokenizer, then
vocab_size_with_padding pads `tokenizer.vocab_size` to a multiple of
make_vocab_size_divisible_by x TP). A Hugging Face tokenizer's size is its vocabulary plus the
added tokens outside it (`len(tokenizer)`: tokenizer.json `model.vocab` + `added_tokens`); only
when the folder has no tokenizer.json does the model's config.json `vocab_size` (the embedding rows,
often already padded) stand in. A tokenizer that is not a local folder is named by the model it
belongs to; when moeplan has a preset of that model, its vocabulary is the suggestion.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from planner.config.loader import UnreadableConfig, read_text
from planner.config.presets import PRESETS


def json_file(path: Path) -> dict[str, Any] | None:
    """A small local JSON object (a tokenizer or model config), or None where it is absent or not one."""
    if not path.is_file():
        return None
    try:
        data = json.loads(read_text(path, "tokenizer"))
    except (UnreadableConfig, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _tokenizer_json_size(data: dict[str, Any]) -> int | None:
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not isinstance(vocab, dict | list):
        return None
    ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
    for token in data.get("added_tokens") or []:
        if isinstance(token, dict) and isinstance(token.get("id"), int):
            ids.add(token["id"])
    return len(ids)


def folder_vocabulary(folder: Path) -> tuple[int, str] | None:
    """(size, which file said so) from a local Hugging Face tokenizer or model folder."""
    tokenizer = json_file(folder / "tokenizer.json")
    if tokenizer is not None and (size := _tokenizer_json_size(tokenizer)):
        return size, str(folder / "tokenizer.json")
    settings = json_file(folder / "tokenizer_config.json")
    config = json_file(folder / "config.json")
    if config is not None and isinstance(config.get("vocab_size"), int) and config["vocab_size"] > 0:
        return config["vocab_size"], str(folder / "config.json")
    if settings is not None and isinstance(settings.get("vocab_size"), int) and settings["vocab_size"] > 0:
        return settings["vocab_size"], str(folder / "tokenizer_config.json")
    return None


def local_folder(name: str, origins: list[Path]) -> Path | None:
    """The tokenizer folder `name` names, as given or beside the launch file."""
    if not name or "${" in name:
        return None
    given = Path(name).expanduser()
    candidates = [given] + ([origin / given for origin in origins] if not given.is_absolute() else [])
    return next((c for c in candidates if c.is_dir()), None)


def _normal(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def preset_for(name: str) -> str | None:
    """The preset whose name the tokenizer's model name starts with (`Qwen/Qwen3-30B-A3B`,
    `/models/Mixtral-8x7B-v0.1` → mixtral-8x7b); the longest such name wins."""
    base = _normal(name.rstrip("/").rsplit("/", 1)[-1])
    matches = [preset for preset in PRESETS if base == preset or base.startswith(preset + "-")]
    return max(matches, key=len) if matches else None


def preset_vocabulary(name: str) -> tuple[str, int] | None:
    preset = preset_for(name)
    if preset is None or "vocab_size" not in PRESETS[preset]:
        return None
    return preset, int(PRESETS[preset]["vocab_size"])


def largest_preset_vocabulary() -> tuple[str, int]:
    """The preset with the largest vocabulary: the assumption that does not under-count the
    embedding and output layer where no tokenizer size can be read."""
    sized = [(int(values["vocab_size"]), preset) for preset, values in PRESETS.items()
             if "vocab_size" in values]
    size, preset = max(sized)
    return preset, size

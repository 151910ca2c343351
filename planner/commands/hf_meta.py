"""The no-record path of `moeplan import hf`: a config.json whose model_type has no family record
(planner/config/importers/hf_families.py) is built by transformers on the meta device (no memory,
no weights), counted tensor by tensor and refused naming what moeplan cannot price yet, instead of
a bare "unknown architecture". Only when transformers and torch are installed; they load here, in
the command, never when the planner starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.findings import Finding

SOURCE = "planner/commands/hf_meta.py::meta_finding"


def _build(hf: Mapping[str, Any]) -> Any:
    """transformers' own model for the file, on the meta device (the causal LM, else a wrapper)."""
    import torch
    import transformers

    data = {key: value for key, value in hf.items() if key != "quantization_config"}
    config = transformers.AutoConfig.for_model(**data)
    last: Exception | None = None
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModelForImageTextToText):
        try:
            with torch.device("meta"):
                return auto.from_config(config)
        except (ValueError, KeyError) as exc:  # not a model of this auto class
            last = exc
    raise ValueError(str(last))


_TOWERS = ("vision", "visual", "audio")  # module-name parts of a wrapper's non-text towers


def _tower(name: str) -> bool:
    return any(part in name for part in _TOWERS)


def _layers(model: Any) -> list[Any]:
    """The decoder's layer list: the longest ModuleList named `layers` outside the towers."""
    lists = [module for name, module in model.named_modules()
             if name.rsplit(".", 1)[-1] == "layers" and not _tower(name)]
    return max(lists, key=len) if lists else []


def meta_finding(hf: Mapping[str, Any], where: str) -> Finding | None:
    """A CFG007 finding with transformers' count and the first layer's modules moeplan has no
    layer kind for; None when transformers is not installed (the caller's finding stands)."""
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError:
        return None
    model_type = hf.get("model_type")
    try:
        model = _build(hf)
    except Exception as exc:  # transformers refuses the file: say so, in its words
        return Finding("CFG007", "error", f"{where}.model_type",
                       f"model_type {model_type!r:.40} has no moeplan family record, and "
                       f"transformers {transformers.__version__} cannot build it either: "
                       f"{type(exc).__name__}: {str(exc)[:160]}",
                       "write the model section by hand", SOURCE)
    total = sum(p.numel() for name, p in model.named_parameters() if not _tower(name))
    towers = sum(p.numel() for name, p in model.named_parameters() if _tower(name))
    layers = _layers(model)
    parts = ", ".join(f"{name} {type(child).__name__}" for name, child in
                      layers[0].named_children()) if layers else "no layer list"
    return Finding("CFG007", "error", f"{where}.model_type",
                   f"model_type {model_type!r:.40} has no moeplan family record: transformers "
                   f"{transformers.__version__} builds {type(model).__name__} with {total:,} "
                   f"parameters in its text stack ({len(layers)} decoder layers"
                   f"{f'; towers {towers:,} more' if towers else ''}); layer 0 ({parts}) maps to no "
                   "moeplan layer kind, so nothing past the count can be priced",
                   "write the model section by hand (the count above is the target), or add a "
                   "family record in planner/config/importers/hf_families.py", SOURCE)

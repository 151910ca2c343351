"""The no-record path of `moeplan import hf`: a config.json whose model_type has no family record
(planner/config/importers/hf_families.py) is built by transformers on the meta device (no memory,
no weights), counted tensor by tensor, and its decoder layers are mapped onto moeplan's layer kinds
by class and shape (planner/config/importers/hf_modules.py). When every layer maps and moeplan's
count of the mapped model equals transformers' count, the import goes on as for a known family;
otherwise it is refused naming the module (class and layer index) moeplan cannot price, never a
different model. Only when transformers and torch are installed; they load here, in the command,
never when the planner starts.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from planner.config.importers.hf_config import HfMapping
from planner.config.importers.hf_families import UNRECORDED_BRIDGES, unrecorded_bridge_line
from planner.findings import Finding

SOURCE = "planner/commands/hf_meta.py::meta_import"
# name parts of a wrapper's towers (vision and audio encoders and their projectors)
_TOWERS = ("vision", "visual", "audio", "mm_projector", "multi_modal_projector")


@dataclass
class MetaImport:
    """The mapped model (None when refused) and the findings of the meta build."""

    mapping: HfMapping | None = None
    findings: list[Finding] = field(default_factory=list)


def _kept(key: str, value: Any) -> bool:
    """Not the weights' quantisation, the remote-code pointers (auto_map, which would make
    transformers ask to run the repository's own code), or a `"rope_scaling": null`: no scaling,
    as when absent, but transformers 5.25 turns the null into rope_parameters None and fails on
    it for models with a RoPE per layer type (MiMo-V2-Flash's file states it)."""
    return key not in ("quantization_config", "auto_map") and not (
        key == "rope_scaling" and value is None)


def _plain(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The file without what is not the network (`_kept`), at the top and in sub-configs."""
    data = {key: value for key, value in hf.items() if _kept(key, value)}
    for key, value in data.items():
        if isinstance(value, Mapping):
            data[key] = {k: v for k, v in value.items() if _kept(k, v)}
    return data


def _build(hf: Mapping[str, Any]) -> Any:
    """transformers' own model for the file, on the meta device: the causal LM, else a wrapper,
    else the bare text model where transformers registers no head class for the model_type
    (transformers 5.25 builds a step3p5 file, Step-3.5-Flash's, only as Step3p7TextModel)."""
    import torch
    import transformers

    # transformers' own advice while building (e.g. a pad token outside a toy vocabulary) is not
    # moeplan's finding, and must not land in `import hf --json`'s output: errors only, restored after.
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        config = transformers.AutoConfig.for_model(**_plain(hf))
        last: Exception | None = None
        for auto in (transformers.AutoModelForCausalLM, transformers.AutoModelForImageTextToText,
                     transformers.AutoModel):
            listed = getattr(auto, "_model_mapping", None)
            if listed is not None and type(config) not in listed:
                continue  # asked anyway, an auto class's refusal imports every model to list them
            try:
                with torch.device("meta"):
                    return auto.from_config(config, trust_remote_code=False)
            except (ValueError, KeyError) as exc:  # not a model of this auto class
                last = exc
        # a text config no auto class lists (transformers 5.25 maps step3p5 to Step3p7TextConfig
        # and registers no model for it): the model class transformers names after the config
        for name in ("ForCausalLM", "Model"):
            built = getattr(transformers, type(config).__name__.removesuffix("Config") + name, None)
            if built is not None:
                with torch.device("meta"):
                    return built(config)
        raise ValueError(str(last) if last else f"no model class of transformers builds "
                         f"{type(config).__name__}")
    finally:
        transformers.logging.set_verbosity(verbosity)


# special-token ids a wrapper's file may repeat at its top level for generation (Gemma-4's NVFP4
# release states eos_token_id there): they shape no parameter
_TOKEN_KEYS = ("token_id", "token_ids")


def _declared(config: Any) -> set[str]:
    """The keys a transformers config class reads: its dataclass fields (transformers 5), else its
    constructor's parameters."""
    if dataclasses.is_dataclass(config):
        return {f.name for f in dataclasses.fields(config)}
    return set(inspect.signature(type(config).__init__).parameters)


def _stray_text_keys(hf: Mapping[str, Any], config: Any) -> list[str]:
    """Keys a wrapper's file states at its top level that its own config class does not read but its
    text config class does, holding there another value than the text stack transformers built:
    a wrapper reads its text stack from text_config only, so such a file (a flat summary under a
    wrapper's model_type) builds the text config's defaults, another model than the file says."""
    text = config.get_text_config()
    if text is config:
        return []
    own, read = _declared(config), _declared(text)
    return [key for key, value in hf.items() if key not in own and key in read
            and _kept(key, value) and not key.endswith(_TOKEN_KEYS)
            and getattr(text, key, None) != value]


def _missing_head(model: Any) -> int:
    """The output layer a bare text model (no head class in transformers) lacks: vocab_size x
    hidden_size when the config unties it, 0 when it is tied or the model has its head."""
    if model.get_output_embeddings() is not None:
        return 0
    text = model.config.get_text_config()
    if getattr(text, "tie_word_embeddings", True):
        return 0
    rows, width = model.get_input_embeddings().weight.shape
    return int(rows) * int(width)


def _tower(name: str) -> bool:
    return any(part in name for part in _TOWERS)


def _layers(model: Any) -> list[tuple[str, Any]]:
    """The decoder's layers with their paths: the longest ModuleList named `layers` outside the
    towers."""
    lists = [(name, module) for name, module in model.named_modules()
             if name.rsplit(".", 1)[-1] == "layers" and not _tower(name)]
    if not lists:
        return []
    name, layers = max(lists, key=lambda item: len(item[1]))
    return [(f"{name}.{index}", layer) for index, layer in enumerate(layers)]


def _error(where: str, message: str, fix: str) -> Finding:
    return Finding("CFG007", "error", f"{where}.model_type", message, fix, SOURCE)


def _count(model: dict[str, Any]) -> tuple[int | None, int]:
    """moeplan's count of the mapped model section, and the parameters of the rows Megatron pads
    the vocabulary with (to a multiple of make_vocab_size_divisible_by, in the embedding and an
    untied output layer), which transformers does not build."""
    from planner.config.schema import Config
    from planner.model_size import model_size

    cfg = Config.model_validate({"model": model, "parallel": {"world_size": 1},
                                 "training": {"seq_length": 16}})
    size = model_size(cfg)
    rows = cfg.padded_vocab_size - cfg.model.vocab_size
    tables = 2 if cfg.model.untie_embeddings_and_output_weights else 1
    return (None if size is None else size.total_params), rows * cfg.model.hidden_size * tables


def _mispriced(section: Mapping[str, Any], layers: list[tuple[str, Any]], biases: list[int],
               total: int) -> str | None:
    """The first decoder layer whose price in moeplan (the model section cut to that one layer,
    less what transformers holds outside the layers) is not its parameters in transformers'
    build: its index, path, class and modules; None when every layer agrees or the cut section
    is no valid model."""
    count = section["num_layers"]
    inside = [sum(int(p.numel()) for p in layer.parameters()) for _, layer in layers]
    outside = total - sum(inside)
    for index, (path, layer) in enumerate(layers):
        one = {key: [value[index]] if isinstance(value, list) and len(value) == count else value
               for key, value in section.items()}
        one["num_layers"] = 1
        try:
            counted, padding = _count(one)
        except ValueError:
            return None
        if counted is None:
            return None
        priced, built = counted - padding - outside, inside[index] - biases[index]
        if priced != built:
            modules = ", ".join(f"{name} ({type(child).__name__})"
                                for name, child in layer.named_children()
                                if any(True for _ in child.parameters()))
            return (f"layer {index}: {path} ({type(layer).__name__}: {modules}) holds {built:,} "
                    f"parameters in transformers' build, moeplan prices {priced:,} for it")
    return None


def meta_import(hf: Mapping[str, Any], where: str) -> MetaImport | None:
    """The model section transformers' meta build maps to, or the CFG007 finding naming what
    moeplan cannot price; None when transformers is not installed (the caller's finding stands)."""
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError:
        return None
    from planner.config.importers.hf_modules import (
        Unpriced,
        model_section,
        read_model,
        rope_arguments,
    )

    model_type = hf.get("model_type")
    version = transformers.__version__
    fix = ("write the model section by hand (the count above is the target), or add a family "
           "record in planner/config/importers/hf_families.py")
    try:
        model = _build(hf)
    except Exception as exc:  # transformers refuses the file: say so, in its words
        return MetaImport(findings=[_error(
            where, f"model_type {model_type!r:.40} has no moeplan family record, and transformers "
            f"{version} cannot build it either: {type(exc).__name__}: {str(exc)[:160]}",
            "write the model section by hand")])
    total = sum(p.numel() for name, p in model.named_parameters() if not _tower(name))
    towers = sum(p.numel() for name, p in model.named_parameters() if _tower(name))
    layers = _layers(model)
    head = _missing_head(model)
    total += head
    census = (f"model_type {model_type!r:.40} has no moeplan family record: transformers {version} "
              f"builds {type(model).__name__} with {total:,} parameters in its text stack "
              f"({len(layers)} decoder layers{f'; towers {towers:,} more' if towers else ''}"
              + (f"; transformers has no head class for it, so its untied output layer of "
                 f"{head:,} (vocab_size x hidden_size, as every causal LM of it adds) is counted "
                 "with it" if head else "") + ")")
    bridge = unrecorded_bridge_line(model_type)
    fix += f" ({bridge})" if model_type in UNRECORDED_BRIDGES else ""
    stray = _stray_text_keys(hf, model.config)
    if stray:
        return MetaImport(findings=[_error(
            where, f"{census}; the file states {', '.join(stray)} at its top level, where "
            f"{type(model.config).__name__} does not read them (it reads its text stack from "
            "text_config only), so transformers built its text config's defaults instead: "
            "another model than the file says",
            "nest those keys under text_config, as the model's published config.json does")])
    if not layers:
        return MetaImport(findings=[_error(where, f"{census}; no decoder layer list", fix)])
    try:
        text = model.config.get_text_config()
        read = read_model(model, layers, text, _tower)
        section, notes, warnings = model_section(read, text)
    except Unpriced as exc:
        return MetaImport(findings=[_error(
            where, f"{census}; {exc}, so moeplan cannot price it", fix)])
    except ValueError as exc:
        return MetaImport(findings=[_error(where, f"{census}; {exc}", fix)])
    except Exception as exc:  # a module or config of a shape no reader expects: refuse, say why
        return MetaImport(findings=[_error(
            where, f"{census}; its modules could not be read as moeplan's layer kinds "
            f"({type(exc).__name__}: {str(exc)[:160]})", fix)])
    try:
        counted, padding = _count(section)
    except ValueError as exc:  # pydantic's ValidationError: a value moeplan's schema refuses
        return MetaImport(findings=[_error(where, f"{census}; the mapped model section is not "
                                           f"valid: {str(exc)[:240]}", fix)])
    if counted is None or counted - padding + read.bias_params != total:
        try:
            part = _mispriced(section, layers, read.layer_bias, total)
        except Exception:  # the layer-by-layer count is a diagnosis: never a traceback
            part = None
        part = part or ("a part outside the decoder layers (embedding, output layer, final "
                        "norm) moeplan prices differently, or one no single layer shows")
        return MetaImport(findings=[_error(
            where, f"{census}; its layers map to moeplan's kinds but moeplan counts "
            f"{'nothing' if counted is None else f'{counted:,}'} (-{padding:,} vocabulary "
            f"padding, +{read.bias_params:,} router correction biases), not {total:,}: {part}",
            fix)])
    bias = (f" + {read.bias_params:,} router correction-bias parameters (Megatron keeps them as "
            "a buffer, uncounted)" if read.bias_params else "")
    if padding:
        bias += (f" - {padding:,} parameters of the rows Megatron pads the vocabulary with "
                 f"(to {section['vocab_size']:,} rounded up to a multiple of 128)")
    names = hf.get("architectures")
    architecture = names[0] if isinstance(names, list) and names and isinstance(
        names[0], str) else type(model).__name__
    return MetaImport(HfMapping(
        architecture=architecture, model=section,
        megatron_extra_args=tuple(rope_arguments(section, text)),
        notes=(f"{census}; every layer maps to moeplan's layer kinds by class and shape, and "
               f"moeplan counts {counted:,}{bias}, as transformers does",
               *notes, *(f"warning: {w}" for w in warnings)),
        family=f"{model_type} (no record: mapped from transformers' modules)",
        bridge=bridge))

"""`moeplan import hf CONFIG_JSON [-o job.yaml]`: a Hugging Face config.json as a moeplan YAML.

The model section is written out field by field (not as a `hf_config:` reference), so the YAML
stands alone and can be edited; parallel and training come from the options (a one-node starting
point by default) because a config.json says nothing about the cluster. Like every `moeplan import`
command: exit 0 valid, 1 when the written config has errors (or the config.json cannot be mapped:
then nothing is written), 2 when the config.json cannot be read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from planner.cli_common import EXIT_USAGE, check_output_or_exit, exit_with_findings, fail
from planner.commands.import_ import AsJson, Force, Output, config_yaml, finish, import_app


def hf_config_data(mapping: Any, sections: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The config's sections: the mapped model, the given parallel/training, and
    launch.megatron_extra_args when the model needs Megatron arguments moeplan does not model."""
    data: dict[str, dict[str, Any]] = {"model": dict(mapping.model), **sections}
    if mapping.moe:  # routing settings that live in Megatron's moe arguments (Llama 4)
        data["moe"] = dict(mapping.moe)
    if mapping.megatron_extra_args:
        data["launch"] = {"megatron_extra_args": list(mapping.megatron_extra_args)}
    return data


def import_hf(
    config_json: Annotated[Path, typer.Argument(help="the model's Hugging Face config.json")],
    output: Output = None,
    world_size: Annotated[int, typer.Option("--world-size", min=1, help="parallel.world_size")] = 8,
    tp: Annotated[int, typer.Option("--tp", min=1, help="parallel.tp")] = 1,
    pp: Annotated[int, typer.Option("--pp", min=1, help="parallel.pp")] = 1,
    ep: Annotated[int, typer.Option("--ep", min=1, help="parallel.ep")] = 1,
    seq_length: Annotated[int, typer.Option("--seq-length", min=1, help="training.seq_length")] = 4096,
    as_json: AsJson = False,
    force: Force = False,
) -> None:
    """Write the moeplan config equivalent to a Hugging Face config.json (the families of
    planner/config/importers/hf_families.py: DeepSeek-V2/V3/V3.2/V4, Kimi-K2 and K2.5, GLM-4.5,
    GLM-4.7-Flash, Qwen2-MoE/Qwen3-MoE/Qwen3-Next, Mixtral, gpt-oss, MiniMax-M2, Llama 4), name the
    Megatron-Bridge bridge that trains it, and report every finding of the result. A model_type
    with no record is mapped from transformers' meta-device build, module by module, or refused
    naming the module moeplan cannot price."""
    from planner.config.importers.hf_config import (
        HfConfigUnmappable,
        HfConfigUnreadable,
        map_hf_config,
        read_hf_json,
    )
    from planner.config.importers.hf_families import family_of

    if output is not None:
        check_output_or_exit(output, force=force)
    try:
        hf = read_hf_json(config_json)
        mapping = map_hf_config(hf, where=str(config_json))
    except HfConfigUnreadable as exc:
        fail(EXIT_USAGE, str(exc))
    except HfConfigUnmappable as exc:
        findings = exc.findings
        built = None
        if family_of(hf.get("architectures"), hf.get("model_type")) is None:
            from planner.commands.hf_meta import meta_import

            built = meta_import(hf, str(config_json))
            findings = [*findings, *built.findings] if built else findings
        if built is None or built.mapping is None:
            exit_with_findings(findings, as_json=as_json)
        mapping = built.mapping
    sections = {"parallel": {"world_size": world_size, "tp": tp, "pp": pp, "ep": ep},
                "training": {"seq_length": seq_length}}
    data = hf_config_data(mapping, sections)
    header = [f"imported by `moeplan import hf` from {config_json} ({mapping.architecture})",
              "model: the config.json's dimensions in Megatron-LM's argument names",
              "parallel / training: a starting point from the command's options; choose them",
              f"bridge: {mapping.bridge}",
              *(f"note: {note}" for note in mapping.notes)]
    finish(config_yaml(data, header), data, [], output, as_json,
           {"architecture": mapping.architecture, "family": mapping.family,
            "bridge": mapping.bridge, "notes": list(mapping.notes)}, force=force)


def register(app: typer.Typer) -> None:
    """Add `hf` to the `import` sub-app, which planner/commands/import_.py puts on APP."""
    import_app.command("hf")(import_hf)

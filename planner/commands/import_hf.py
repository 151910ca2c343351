"""`moeplan import hf CONFIG_JSON [-o job.yaml]`: a Hugging Face config.json as a moeplan YAML.

The model section is written out field by field (not as a `hf_config:` reference), so the YAML
stands alone and can be edited; parallel and training come from the options (a one-node starting
point by default) because a config.json says nothing about the cluster. The YAML is validated
before anything is written: exit 2 for an unreadable config.json or an existing output without
--force, exit 1 (with findings) for one that cannot be mapped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from planner.cli_common import EXIT_CONFIG, EXIT_USAGE, fail, print_findings, stderr


class _Dumper(yaml.SafeDumper):
    """Sections as blocks, lists (a layer pattern, extra arguments) on one flow line."""


_Dumper.add_representer(list, lambda dumper, data: dumper.represent_sequence(
    "tag:yaml.org,2002:seq", data, flow_style=True))


def render_yaml(mapping: Any, source: str, sections: dict[str, dict[str, Any]]) -> str:
    """The YAML text: a header naming the source and every note, then model, parallel, training
    and (when the model needs unmodelled Megatron arguments) launch.megatron_extra_args."""
    data: dict[str, Any] = {"model": mapping.model, **sections}
    if mapping.megatron_extra_args:
        data["launch"] = {"megatron_extra_args": list(mapping.megatron_extra_args)}
    header = [f"# Written by `moeplan import hf` from {source} ({mapping.architecture}).",
              "# model: the config.json's dimensions in Megatron-LM's argument names.",
              "# parallel / training: a starting point from the command's options; choose them.",
              *(f"# note: {note}" for note in mapping.notes)]
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
    return "\n".join(header) + "\n" + body


def import_hf(
    config_json: Annotated[Path, typer.Argument(help="the model's Hugging Face config.json")],
    output: Annotated[Path | None, typer.Option("-o", "--output",
                                                help="YAML file to write (default: print it)")] = None,
    world_size: Annotated[int, typer.Option("--world-size", min=1, help="parallel.world_size")] = 8,
    tp: Annotated[int, typer.Option("--tp", min=1, help="parallel.tp")] = 1,
    pp: Annotated[int, typer.Option("--pp", min=1, help="parallel.pp")] = 1,
    ep: Annotated[int, typer.Option("--ep", min=1, help="parallel.ep")] = 1,
    seq_length: Annotated[int, typer.Option("--seq-length", min=1, help="training.seq_length")] = 4096,
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing output file")] = False,
) -> None:
    """Write the moeplan YAML equivalent to a Hugging Face config.json (DeepSeek-V2/V3 incl.
    Kimi-K2, Qwen2-MoE/Qwen3-MoE, Mixtral); then run `moeplan check` on it."""
    from planner.importers.hf_config import (
        HfConfigUnmappable,
        HfConfigUnreadable,
        map_hf_config,
        read_hf_json,
    )
    from planner.loader import InvalidConfig, parse_config, parse_yaml
    from planner.plan import write_atomic

    if output is not None and output.exists() and not force:
        fail(EXIT_USAGE, f"{output} already exists; pass --force to overwrite")
    try:
        mapping = map_hf_config(read_hf_json(config_json), where=str(config_json))
    except HfConfigUnreadable as exc:
        fail(EXIT_USAGE, str(exc))
    except HfConfigUnmappable as exc:
        print_findings(exc.findings)
        raise typer.Exit(EXIT_CONFIG) from None
    sections = {"parallel": {"world_size": world_size, "tp": tp, "pp": pp, "ep": ep},
                "training": {"seq_length": seq_length}}
    text = render_yaml(mapping, str(config_json), sections)
    try:
        parse_config(*parse_yaml(text, "<import hf>"))
    except InvalidConfig as exc:
        print_findings(exc.findings)
        fail(EXIT_CONFIG, "the mapped config does not load; nothing written")
    for note in mapping.notes:
        stderr.print(f"note: {note}", markup=False)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        write_atomic(output, text)
    except OSError as exc:
        fail(EXIT_USAGE, f"cannot write {output}: {exc.strerror or exc}")
    stderr.print(f"wrote {output} ({mapping.architecture}); next: moeplan check {output}",
                 markup=False)


def register(import_app: typer.Typer) -> None:
    import_app.command("hf")(import_hf)

"""The pre-flight: run the user's own Megatron-LM on the emitted argument list and compare what it
derives with the plan.

Megatron runs in a subprocess (`planner/emit/megatron_probe.py`, which planner never imports: planner must
not import torch) under the Python the user names. The probe is given the emitted flags unchanged,
plus only data and tokenizer arguments (`DATA_ARGUMENTS`: mock data and the null tokenizer, which
takes the model's `--vocab-size`), and the environment the launchers export. It runs Megatron's
`parse_args` → `validate_args` → `set_global_variables` → `core_transformer_config_from_args` →
`hybrid_config_from_args` / `gpt_config_from_args`, then asks Megatron's pipeline helpers which layers
every pipeline rank and virtual stage builds, builds its decoder stacks (at toy sizes) to see which
MoE layers its router hash-routes, and reads the rotary settings its configs hold. A pass means
Megatron accepted the arguments *and* derived the same data-parallel size, number of microbatches,
virtual stages, per-stage decoder / MoE / MTP layers, hash-routed MoE blocks and rotary settings as
the plan.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.config.schema import Config
from planner.emit.bridge import bridge_overrides, megatron_view
from planner.emit.megatron import megatron_arguments, rotary_fields

DATA_ARGUMENTS = ("--mock-data", "--tokenizer-type", "NullTokenizer")
PROBE_TIMEOUT_S = 600
PROBE_FILE = "megatron_probe.py"


class CheckUnusable(Exception):
    """The Megatron-LM folder or the Python cannot run the check (exit 2, not a verdict)."""


@dataclass
class CheckRequest:
    name: str
    entry: str
    argv: list[str]
    env: dict[str, str]
    world_size: int
    # Megatron-Bridge override paths (planner/emit/bridge.py) whose values Megatron's own config
    # container should hold; empty: the container is not built
    container_paths: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "entry": self.entry, "argv": self.argv, "env": self.env,
                "world_size": self.world_size, "container_paths": self.container_paths}


@dataclass
class CheckResult:
    """Megatron's verdict on one config next to moeplan's plan."""

    name: str
    # "pass", "rejected" (Megatron refused), "mismatch" (it derived other values than the plan) or
    # "accepted" (it took the arguments and no plan was given to compare with)
    verdict: str
    message: str = ""
    location: str | None = None
    step: str | None = None
    derived: dict[str, Any] = field(default_factory=dict)
    expected: dict[str, Any] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


@dataclass
class CheckRun:
    results: list[CheckResult]
    stand_ins: list[str]
    python_version: str


def request_for(cfg: Config, name: str = "config", *, bridge: bool = False) -> CheckRequest:
    """The emitted flags unchanged, plus data/tokenizer arguments only; with `bridge`, the paths of
    the Megatron-Bridge overrides Megatron's own container holds too."""
    args = megatron_arguments(cfg)
    argv = [word for flag in args.flags for word in (flag.flag, *flag.values)]
    world = cfg.parallel.world_size
    assert world is not None  # resolved by Config._resolve
    paths = list(megatron_view(bridge_overrides(cfg, args))) if bridge else []
    return CheckRequest(name=name, entry=args.entry, argv=[*argv, *DATA_ARGUMENTS], env=dict(args.env),
                        world_size=world, container_paths=paths)


def expected_values(cfg: Config, plan: dict[str, Any], *, bridge: bool = False) -> dict[str, Any]:
    """What the plan says Megatron must derive, in the probe's terms (per pipeline chunk), plus the
    model's rotary fields that its attention kind reads; with `bridge`, the Megatron-Bridge
    overrides as Megatron's own config container must hold them."""
    num_layers = cfg.model.num_layers
    chunks = []
    for stage in plan["stages"]:
        moe, hashed = set(stage["moe_layers"]), set(stage["hash_layers"])
        for chunk in stage["chunks"]:
            blocks = [layer for layer in chunk["layers"] if layer in moe]
            chunks.append({
                "stage": stage["stage"], "virtual": chunk["virtual"], "layers": len(chunk["layers"]),
                "moe_layers": len(blocks),
                "mtp_layers": len(chunk["mtp_layers"]),
                "mtp_moe_layers": sum(num_layers + d in moe for d in chunk["mtp_layers"]),
                "moe_blocks": blocks, "hashed_blocks": [layer for layer in blocks if layer in hashed],
            })
    rope = {name: getattr(cfg.model, name) for name in ("position_embedding_type", *rotary_fields(cfg))}
    return {"shape": expected_shape(cfg),
            "data_parallel_size": cfg.dp, "expert_data_parallel_size": cfg.edp,
            "num_microbatches": cfg.microbatches, "padded_vocab_size": cfg.padded_vocab_size,
            "virtual_pipeline_model_parallel_size": plan["layout"].get("vpp", 1),
            "chunks": sorted(chunks, key=lambda c: (c["stage"], c["virtual"])), "rope": rope,
            "container": megatron_view(bridge_overrides(cfg)) if bridge else {}}


def expected_shape(cfg: Config) -> dict[str, Any]:
    """The model shape in Megatron's TransformerConfig terms (Megatron-LM dev@d48bd6be
    megatron/core/transformer/transformer_config.py TransformerConfig, MLATransformerConfig):
    what the probe reads back from the config Megatron built from the emitted arguments."""
    m = cfg.model
    shape: dict[str, Any] = {
        "num_attention_heads": m.num_attention_heads, "ffn_hidden_size": m.ffn_hidden_size,
        "moe_ffn_hidden_size": m.moe_ffn_hidden_size, "gated_linear_unit": m.gated_mlp,
        "normalization": m.normalization, "add_bias_linear": m.add_bias_linear,
        "qk_layernorm": m.qk_layernorm, "moe_shared_expert_gate": m.moe_shared_expert_gate,
        "moe_router_dtype": m.moe_router_dtype, "hidden_dropout": m.hidden_dropout,
        "attention_dropout": m.attention_dropout,
        "multi_latent_attention": m.attention_variant in ("mla", "dsv4_hybrid"),
        "softmax_type": m.softmax_type, "window_size": m.window_size,
        "window_attn_skip_freq": m.window_attn_skip_freq, "glu_linear_offset": m.glu_linear_offset,
        "activation_func_clamp_value": m.swiglu_limit,
        "add_qkv_bias": m.add_qkv_bias or m.add_bias_linear,
        # Megatron turns an int no_rope_freq into its per-layer list (TransformerConfig.__post_init__)
        "no_rope_freq": m.no_rope_layers(),
        "qk_l2_norm": m.qk_l2_norm, "moe_apply_probs_on_input": cfg.moe.moe_apply_probs_on_input,
        "attention_output_gate": m.attention_output_gate,
    }
    if m.linear_attention_freq is not None:  # Qwen3-Next's gated DeltaNet layers
        shape.update({name: getattr(m, name) for name in (
            "linear_attention_freq", "linear_conv_kernel_dim", "linear_key_head_dim",
            "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads")},
            experimental_attention_variant="gated_delta_net")
    if m.attention_variant == "standard":
        shape.update(num_query_groups=m.num_query_groups, kv_channels=m.kv_channels)
    if m.attention_variant == "mla":
        shape.update(q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank,
                     qk_head_dim=m.qk_head_dim, v_head_dim=m.v_head_dim,
                     qk_pos_emb_head_dim=m.qk_pos_emb_head_dim)
    return shape


_LABELS = {"data_parallel_size": "data-parallel size", "expert_data_parallel_size":
           "expert data-parallel size", "num_microbatches": "number of microbatches",
           "virtual_pipeline_model_parallel_size": "virtual pipeline stages",
           "padded_vocab_size": "padded vocabulary"}
_CHUNK_LABELS = {"layers": "decoder layers", "moe_layers": "MoE layers", "mtp_layers": "MTP layers",
                 "mtp_moe_layers": "MTP MoE layers"}


def mismatches(expected: dict[str, Any], derived: dict[str, Any]) -> list[str]:
    """Every value Megatron derived differently, naming both (keys Megatron does not expose are skipped)."""
    found = [f"{label}: Megatron {derived[key]}, moeplan {expected[key]}"
             for key, label in _LABELS.items() if key in derived and derived[key] != expected[key]]
    theirs = {(c["stage"], c["virtual"]): c for c in derived.get("chunks", [])}
    ours = {(c["stage"], c["virtual"]): c for c in expected["chunks"]}
    for key in sorted(set(theirs) | set(ours)):
        where = f"pipeline stage {key[0]}" + (f" virtual stage {key[1]}" if key[1] else "")
        if key not in theirs or key not in ours:
            found.append(f"{where}: built by {'moeplan' if key in ours else 'Megatron'} only")
            continue
        for name, label in _CHUNK_LABELS.items():
            if name in theirs[key] and theirs[key][name] != ours[key][name]:
                found.append(f"{where} {label}: Megatron {theirs[key][name]}, moeplan {ours[key][name]}")
        found.extend(_hash_mismatches(where, ours[key], theirs[key], derived.get("hash_routing_built")))
    found.extend(_rope_mismatches(expected.get("rope", {}), derived.get("rope", {})))
    theirs_shape = derived.get("shape", {})
    found.extend(f"model shape {name}: Megatron {theirs_shape[name]}, moeplan {value}"
                 for name, value in expected.get("shape", {}).items()
                 if name in theirs_shape and not _same(theirs_shape[name], value))
    theirs_container = derived.get("container", {})
    for path, value in expected.get("container", {}).items():
        if path not in theirs_container:
            found.append(f"Bridge override {path}: Megatron's config container has no such field")
        elif not _same(theirs_container[path], value) and theirs_container[path] != str(value):
            found.append(f"Bridge override {path}: Megatron's container {theirs_container[path]!r}, "
                         f"moeplan {value!r}")
    return found


def _same(a: Any, b: Any) -> bool:
    """Equal values, an int and a float of the same number included (argparse types differ)."""
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
        return float(a) == float(b)
    return bool(a == b)


def megatron_hashed(ours: dict[str, Any], theirs: dict[str, Any], built: bool | None) -> list[int] | None:
    """The chunk's MoE blocks (moeplan numbers) Megatron hash-routes: its k-th router is the chunk's
    k-th MoE block, both in build order. None when it cannot say: the probe did not report routers,
    or Megatron built another number of MoE layers (reported as such)."""
    if "routers" not in theirs:
        return [] if built is False else None  # not built: no hash count, so no router hashes
    if len(theirs["routers"]) != len(ours["moe_blocks"]):
        return None
    return [block for block, (_, hashed) in zip(ours["moe_blocks"], theirs["routers"], strict=True) if hashed]


def _hash_mismatches(where: str, ours: dict[str, Any], theirs: dict[str, Any],
                     built: bool | None) -> list[str]:
    if "hashed_blocks" not in ours:
        return []
    found = []
    hashed = megatron_hashed(ours, theirs, built)
    if hashed is not None and hashed != ours["hashed_blocks"]:
        numbers = [number for number, is_hash in theirs.get("routers", []) if is_hash]
        found.append(f"{where} hash-routed MoE blocks: Megatron {_blocks(hashed)} (its layer numbers "
                     f"{numbers or 'none'}), moeplan {_blocks(ours['hashed_blocks'])}")
    mtp = [number for number, is_hash in theirs.get("mtp_routers", []) if is_hash]
    if mtp:
        found.append(f"{where} hash-routed MTP layers: Megatron layer numbers {mtp}, moeplan none")
    return found


def _blocks(blocks: list[int]) -> str:
    return str(blocks) if blocks else "none"


def _rope_mismatches(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    return [f"model.{name}: Megatron {theirs[name]}, moeplan {value}"
            for name, value in ours.items() if name in theirs and not _same(theirs[name], value)]


def probe_script() -> Path:
    """The probe file beside this module: run as a script by the user's Python, never imported here."""
    path = Path(__file__).with_name(PROBE_FILE)
    if not path.is_file():
        raise CheckUnusable(f"the Megatron probe {path} is missing from this moeplan installation")
    return path


def check_megatron_folder(megatron_lm: Path) -> None:
    """A Megatron-LM folder holds the `megatron` package with its training arguments."""
    if not (megatron_lm / "megatron" / "training" / "arguments.py").is_file():
        raise CheckUnusable(f"{megatron_lm} is not a Megatron-LM folder: it should contain "
                            "megatron/training/arguments.py (pass the folder that holds the megatron "
                            "package)")


def run_probe(requests: list[CheckRequest], megatron_lm: Path, python: str,
              timeout_s: float = PROBE_TIMEOUT_S) -> tuple[list[dict[str, Any]], list[str], str]:
    """One subprocess for all requests; Megatron's own output is kept only for a failed start."""
    check_megatron_folder(megatron_lm)
    script = probe_script()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONWARNINGS": "ignore"}
    with tempfile.TemporaryDirectory(prefix="moeplan-check-") as work:
        request_path, result_path = Path(work, "request.json"), Path(work, "result.json")
        request_path.write_text(json.dumps({"megatron_lm": str(megatron_lm.resolve()),
                                            "configs": [r.as_json() for r in requests]}))
        try:
            done = subprocess.run([python, str(script), str(request_path), str(result_path)],
                                  capture_output=True, text=True, env=env, timeout=timeout_s,
                                  check=False, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise CheckUnusable(f"cannot run {python!r}: no such program (see --check-python)") from None
        except PermissionError:
            raise CheckUnusable(f"cannot run {python!r}: not executable (see --check-python)") from None
        except subprocess.TimeoutExpired:
            raise CheckUnusable(f"Megatron-LM did not finish within {timeout_s:.0f} s") from None
        if not result_path.is_file():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise CheckUnusable(f"{python} could not run the Megatron probe (exit code {done.returncode})"
                                f"{': ' + tail if tail else ''}")
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckUnusable(f"the Megatron probe wrote no readable result ({exc})") from None
    if "unusable" in result:
        raise CheckUnusable(result["unusable"])
    return result["results"], result["stand_ins"], result["python"]


def judge(requests: list[CheckRequest], expected: list[dict[str, Any]], megatron_lm: Path,
          python: str) -> CheckRun:
    """Run Megatron on every request and compare each pass with the plan's values."""
    raw, stand_ins, version = run_probe(requests, megatron_lm, python)
    results = []
    for request, want, got in zip(requests, expected, raw, strict=True):
        if got["verdict"] == "unusable":
            raise CheckUnusable(f"Megatron-LM could not finish the check here: {got['message']}"
                                f"{' at ' + got['location'] if got.get('location') else ''}")
        if got["verdict"] == "rejected":
            results.append(CheckResult(request.name, "rejected", got["message"], got.get("location"),
                                       got.get("step"), expected=want))
            continue
        if not want:  # no plan to compare with (a config moeplan refuses): acceptance is the answer
            results.append(CheckResult(request.name, "accepted", derived=got["derived"],
                                       not_run=got.get("not_run", [])))
            continue
        found = mismatches(want, got["derived"])
        results.append(CheckResult(request.name, "mismatch" if found else "pass",
                                   derived=got["derived"], expected=want, mismatches=found,
                                   not_run=got.get("not_run", [])))
    return CheckRun(results, stand_ins, version)


def check_config(cfg: Config, plan: dict[str, Any], megatron_lm: Path, python: str,
                 name: str = "config", *, bridge: bool = False) -> CheckRun:
    return judge([request_for(cfg, name, bridge=bridge)], [expected_values(cfg, plan, bridge=bridge)],
                 megatron_lm, python)


def summary_lines(run: CheckRun, megatron_lm: Path) -> list[str]:
    """The report printed by `--check-with`: verdict, derived values or Megatron's message, stand-ins."""
    lines = []
    for result in run.results:
        if result.verdict == "rejected":
            lines.append(f"Megatron-LM ({megatron_lm}) rejects the arguments in {result.step}: "
                         f"{result.message}")
            lines.append(f"  at {result.location or 'an unknown place (no frame inside megatron/)'}")
            continue
        if result.verdict == "mismatch":
            lines.append(f"Megatron-LM ({megatron_lm}) accepts the arguments but derives other values "
                         "than the plan:")
            lines.extend(f"  {m}" for m in result.mismatches)
        else:
            lines.append(f"Megatron-LM check: pass ({megatron_lm})")
        d = result.derived
        lines.append(f"  derived: data-parallel size {d['data_parallel_size']}, "
                     f"{d['num_microbatches']} microbatch(es), "
                     f"{d['virtual_pipeline_model_parallel_size']} virtual stage(s) per rank, "
                     f"Megatron num_layers {d['num_layers']}, padded vocab {d['padded_vocab_size']}")
        ours = {(c["stage"], c["virtual"]): c for c in result.expected.get("chunks", [])}
        for chunk in d["chunks"]:
            virtual = f" v{chunk['virtual']}" if d["virtual_pipeline_model_parallel_size"] > 1 else ""
            hashed = megatron_hashed(ours.get((chunk["stage"], chunk["virtual"]), {"moe_blocks": []}),
                                     chunk, d.get("hash_routing_built"))
            lines.append(f"    stage {chunk['stage']}{virtual}: {chunk['layers']} decoder layer(s), "
                         f"{chunk['moe_layers']} MoE, {chunk['mtp_layers']} MTP"
                         + (f", hash-routed MoE blocks {hashed}" if hashed else ""))
        if d.get("rope"):
            lines.append("  rotary: " + ", ".join(f"{name} {value}" for name, value in d["rope"].items()))
        lines.extend(f"  not run: {item}" for item in result.not_run)
    lines.extend(f"  stand-in: {item}" for item in run.stand_ins)
    return lines

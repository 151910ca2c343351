"""What each architecture's mechanisms add at DeepSeek-V4-Pro's size, from moeplan's own budget.

For each current architecture (gpt-oss, Qwen3-Next, DeepSeek-V3.2, Llama 4, MiniMax-M2, GLM-4.5)
this builds a V4-Pro-sized variant: the architecture's preset with V4-Pro's hidden size (7168),
decoder layers (61) and routed experts (384), on V4-Pro's example cluster and layout
(examples/deepseek-v4-pro-1024.yaml: 1,024 GPUs, TP1 CP2 PP8 EP64, S 8192, full recompute). Then it
turns each mechanism off in turn and prints what the mechanism adds: per layer kind, the per-layer
quantities of the book that change (parameters, stored activations per microbatch, FLOPs per
token: the names say the layer kind), and per step the bytes sent (all `step.*.send_bytes` of the
busiest stage's first rank), the peak memory of the fullest stage and the estimated step time.

    PYTHONPATH=. python bench/mechanism_table.py            # every architecture
    PYTHONPATH=. python bench/mechanism_table.py gpt-oss     # one

Nothing here is a number of its own: every figure is `moeplan estimate`'s evaluation of the book.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere, like bench/*.py

from planner.accounting import memory_by_stage
from planner.config.loader import load_config, parse_config
from planner.config.presets import PRESETS
from planner.config.schema import Config
from planner.estimate import estimate
from tests.support.paths import EXAMPLES

V4_PRO_EXAMPLE = EXAMPLES / "deepseek-v4-pro-1024.yaml"
V4_PRO_SIZE = ("hidden_size", "num_layers", "num_experts")
PER_LAYER_MARKS = ("per_block", "per_layer", "fwd_per_token")
FREQ_LISTS = ("moe_layer_freq", "window_attn_skip_freq", "no_rope_freq", "linear_attention_freq")


@dataclass(frozen=True)
class Architecture:
    name: str
    preset: str
    # mechanism -> the model fields that turn it off (the baseline it is measured against)
    mechanisms: dict[str, dict[str, Any]]


ARCHITECTURES = (
    Architecture("gpt-oss", "gpt-oss-120b", {
        "learnable sinks": {"softmax_type": "vanilla"},
        "sliding window 128 (every other layer)": {"window_size": None, "window_attn_skip_freq": None},
        "quick-GEGLU + offset (vs SwiGLU)": {"quick_geglu": False, "swiglu": True,
                                             "glu_linear_offset": 0.0},
        "linear biases (add_bias_linear)": {"add_bias_linear": False},
    }),
    Architecture("Qwen3-Next", "qwen3-next-80b-a3b", {
        "gated DeltaNet on 3 of 4 layers": {"linear_attention_freq": None},
        "attention output gate": {"attention_output_gate": False},
        "shared-expert gate": {"moe_shared_expert_gate": False},
    }),
    Architecture("DeepSeek-V3.2", "deepseek-v3.2", {
        "DSA (absorbed MLA attention + lightning indexer)": {"dsa": False},
    }),
    Architecture("Llama-4-Maverick", "llama-4-maverick", {
        "NoPE every 4th layer": {"no_rope_freq": None},
        "chunked attention 8192": {"attention_chunk_size": None},
        "L2 q/k norm": {"qk_l2_norm": False},
    }),
    Architecture("MiniMax-M2", "minimax-m2", {
        "per-layer q/k norm (vs none)": {"qk_layernorm_per_layer": False},
    }),
    Architecture("GLM-4.5", "glm-4.5", {
        "q/k/v bias": {"add_qkv_bias": False},
        "q/k norm": {"qk_layernorm": False},
    }),
)


def v4_pro_sized(preset: str, overrides: dict[str, Any]) -> Config:
    """The preset at V4-Pro's hidden size, depth and expert count on V4-Pro's example layout."""
    base = load_config(V4_PRO_EXAMPLE)
    v4 = PRESETS["deepseek-v4-pro"]
    model = {**copy.deepcopy(PRESETS[preset]), **{k: v4[k] for k in V4_PRO_SIZE}, **overrides}
    layers = model["num_layers"]
    for key in FREQ_LISTS:  # per-layer lists follow the depth: cut, or extend with the last entry
        pattern = model.get(key)
        if isinstance(pattern, list):
            model[key] = (pattern + pattern[-1:] * layers)[:layers]
    data = base.model_dump(mode="json", exclude_unset=True)
    data["model"] = model
    mtp = "m" * int(model.get("mtp_num_layers") or 0)
    data["parallel"]["pipeline_model_parallel_layout"] = f"Et*6|(t*8|)*6t*7{mtp}L"
    data["moe"].pop("moe_tid2eid_source", None)  # V4's hash tables; these models have none
    return parse_config(data)


def figures(cfg: Config) -> dict[str, float]:
    """Per-layer quantities of the busiest stage, and the step's bytes, peak memory and time."""
    est = estimate(cfg, exact=False)
    env = est.envs[est.slowest_stage]
    out = {name: float(value) for name, value in env.items()
           if (any(mark in name for mark in PER_LAYER_MARKS) or _is_time_part(name))
           and isinstance(value, (int, float))}
    out["step bytes sent (busiest stage)"] = float(sum(
        value for name, value in env.items() if name.startswith("step_") and
        name.endswith("_send_bytes")))
    memory = memory_by_stage(cfg, exact=False)
    out["peak memory, fullest stage"] = max(float(stage["peak_memory_bytes"]) for stage in memory)
    out["activation memory, fullest stage"] = max(float(stage["activation_bytes"])
                                                  for stage in memory)
    out["step time (s)"] = est.step_time_s
    return out


# The time page's per-stage seconds by part; the pipeline page's sums of them are left out.
TIME_PARTS = ("time_attention_core_s", "time_attention_gemm_s", "time_moe_gemm_s",
              "time_dense_gemm_s", "time_non_gemm_s", "time_exposed_comm_s", "time_bubble_s")
SHOWN_SECONDS = 5e-4  # a time change below half a millisecond per step prints as nothing


def _is_time_part(name: str) -> bool:
    return name in TIME_PARTS


def _fmt(value: float) -> str:
    return f"{value:+,.3f}" if abs(value) < 100 else f"{value:+,.0f}"


def table(arch: Architecture) -> list[str]:
    full = figures(v4_pro_sized(arch.preset, {}))
    lines = [f"## {arch.name} at V4-Pro size ({arch.preset}: h 7168, 61 layers, 384 experts)",
             f"step time {full['step time (s)']:.2f} s, peak memory "
             f"{full['peak memory, fullest stage'] / 2**30:.1f} GiB, step bytes "
             f"{full['step bytes sent (busiest stage)'] / 2**30:.1f} GiB sent by the busiest "
             "stage's first rank",
             "", "| mechanism | quantity | adds |", "|---|---|---|"]
    for mechanism, off in arch.mechanisms.items():
        without = figures(v4_pro_sized(arch.preset, off))
        changed = [(name, full.get(name, 0.0) - without.get(name, 0.0))
                   for name in sorted(set(full) | set(without))]
        changed = [(name, delta) for name, delta in changed if delta and not (
            (_is_time_part(name) or name == "step time (s)") and abs(delta) < SHOWN_SECONDS)]
        if not changed:
            lines.append(f"| {mechanism} | — | nothing |")
        for name, delta in changed:
            in_bytes = "memory" in name or "bytes" in name or name.startswith("act_")
            unit = (" GiB" if abs(delta) >= 2**20 else " B") if in_bytes else ""
            shown = _fmt(delta / 2**30) if unit == " GiB" else _fmt(delta)
            lines.append(f"| {mechanism} | {name} | {shown}{unit} |")
    return lines


def main(argv: list[str]) -> int:
    chosen = [a for a in ARCHITECTURES if not argv or any(w.lower() in a.name.lower() for w in argv)]
    for arch in chosen:
        print("\n".join(table(arch)), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

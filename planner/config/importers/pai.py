"""The model Pai-Megatron-Patch's Qwen3-Next entry builds, as Megatron-LM dev's arguments.

alibaba/Pai-Megatron-Patch@a098ca5a examples/qwen3_next/pretrain_qwen3_next.py builds a MambaModel
whose stack (megatron_patch/model/qwen3_next/layer_specs.py get_qwen3_next_layer_spec) reads
`--hybrid-override-pattern` symbol by symbol: `M` is a gated DeltaNet layer (GatedDeltaNetMixer),
`*` a gated softmax attention layer (GatedSoftmaxAttention: q, its sigmoid gate, k and v from one
projection, q/k RMSNorm) and `-` an MoE layer with a gated shared expert (SharedExpertMLP with
gate=True). The DeltaNet's sizes are not arguments: they are Qwen3NextTransformerConfig's fields
(megatron_patch/model/qwen3_next/transformer_config.py: head_k_dim 128, head_v_dim 128, num_k_heads
16, num_v_heads 32) and the mixer's 4-tap convolution (gated_deltanet.py GatedDeltaNetMixer.__init__
d_conv=4); the `--mamba-*` sizes and the hybrid ratios do not reach it. Read as the plain hybrid
(pretrain_gpt.py's or pretrain_mamba.py's), the same words give another model: a GPT of 96 layers
with 157 B parameters instead of Qwen3-Next's 80 B.

Megatron-LM dev builds the same layers in its GPT model (gated_delta_net as the experimental
attention variant on all but every linear_attention_freq-th layer, attention_output_gate, every
layer MoE), so the import rewrites the Pai words into those arguments and moeplan's existing
Qwen3-Next fields carry the model.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from planner.config.importers.megatron_args import Unmapped

QWEN3_NEXT_ENTRY = "pretrain_qwen3_next.py"
PAI = "alibaba/Pai-Megatron-Patch@a098ca5a"
# Qwen3NextTransformerConfig's fields and GatedDeltaNetMixer's convolution: the DeltaNet the entry builds.
DELTANET_SIZES = (("--linear-key-head-dim", "128"), ("--linear-value-head-dim", "128"),
                  ("--linear-num-key-heads", "16"), ("--linear-num-value-heads", "32"),
                  ("--linear-conv-kernel-dim", "4"))
# Arguments the entry reads only to lay out the stack, or not at all (its mixer takes its sizes above).
STACK_ARGUMENTS = ("--hybrid-override-pattern", "--hybrid-attention-ratio", "--hybrid-mlp-ratio",
                   "--is-hybrid-model", "--mamba-state-dim", "--mamba-head-dim", "--mamba-num-groups",
                   "--mamba-num-heads")
_SWITCHES = ("--is-hybrid-model",)


def _split(words: list[str]) -> tuple[list[str], dict[str, str]]:
    """The words without the stack arguments, and those arguments' values."""
    kept: list[str] = []
    taken: dict[str, str] = {}
    i = 0
    while i < len(words):
        flag, eq, value = words[i].partition("=")
        if flag in STACK_ARGUMENTS:
            if eq or flag in _SWITCHES:
                taken[flag] = value
                i += 1
            else:
                taken[flag] = words[i + 1] if i + 1 < len(words) else ""
                i += 2
            continue
        kept.append(words[i])
        i += 1
    return kept, taken


def linear_attention_freq(flags: list[int]) -> int | list[int]:
    """Megatron's --linear-attention-freq for per-layer DeltaNet flags (1 = DeltaNet): N when every
    N-th layer (1-based) is attention and the rest DeltaNet, else the list."""
    attention = [i for i, flag in enumerate(flags) if not flag]
    if attention:
        period = attention[0] + 1
        if all((i + 1) % period == 0 for i in attention) and len(attention) == len(flags) // period \
                and len(flags) % period == 0:
            return period
    return flags


def qwen3_next_words(entry: str | None, words: list[str]) -> tuple[list[str], list[Unmapped]]:
    """The words of a Pai Qwen3-Next launch as Megatron-LM dev's arguments for the same model; other
    launches pass through unchanged."""
    if entry is None or PurePosixPath(entry).name != QWEN3_NEXT_ENTRY:
        return words, []
    kept, taken = _split(words)
    pattern = taken.get("--hybrid-override-pattern")
    if not pattern:
        return words, []
    where = f"{PAI} {QWEN3_NEXT_ENTRY}"
    mixers, mlps = pattern[0::2], pattern[1::2]
    if len(pattern) % 2 or set(mixers) - {"M", "*"} or set(mlps) != {"-"}:
        return words, [Unmapped("--hybrid-override-pattern", pattern, f"{where} builds one layer per "
                                "symbol; moeplan reads its Qwen3-Next stack as pairs of a mixer (M: gated "
                                "DeltaNet, *: gated attention) and an MoE layer (-), and this pattern is "
                                "not; fix: set the model's fields by hand", error=True)]
    flags = [int(symbol == "M") for symbol in mixers]
    freq = linear_attention_freq(flags)
    out: list[str] = []
    i = 0
    while i < len(kept):  # --num-layers counts pattern symbols in the entry, blocks in Megatron's GPT
        if kept[i] == "--num-layers" and i + 1 < len(kept):
            out += ["--num-layers", str(len(mixers))]
            i += 2
            continue
        out.append(kept[i])
        i += 1
    if "--num-layers" not in out:
        out += ["--num-layers", str(len(mixers))]
    out += ["--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq",
            str(freq).replace(" ", ""), "--attention-output-gate", "--moe-layer-freq", "1",
            "--moe-shared-expert-gate"]
    for flag, value in DELTANET_SIZES:
        out += [flag, value]
    notes = [Unmapped(flag, value, f"read by {where} to lay out its hybrid stack (or not read: its "
                      "DeltaNet takes Qwen3NextTransformerConfig's sizes); imported as Megatron-LM dev's "
                      f"Qwen3-Next arguments: {len(mixers)} layers, --linear-attention-freq {freq}, the "
                      "DeltaNet's 16 x 128 key and 32 x 128 value heads, a gated attention output, every "
                      "layer MoE with a gated shared expert", error=False)
             for flag, value in taken.items()]
    return out, notes

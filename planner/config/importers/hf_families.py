"""One record per Hugging Face `model_type`: which reader maps its text stack, where a multimodal
wrapper keeps that stack, which towers it leaves out, and the Megatron-Bridge bridge that trains it.

`import hf` dispatches on these records instead of on a hand-kept list of architecture names: a
family whose text stack an existing reader maps (a multimodal wrapper around a known decoder, a
renamed DeepSeek-V3 stack) is one record here and no code. The bridges are read from
NVIDIA-NeMo/Megatron-Bridge main@067f987d (src/megatron/bridge/models/<path>: the class its
`MegatronModelBridge.register_bridge(source=..., model_type=...)` decorator registers), so the user
knows which provider trains the family in Megatron.
"""

from __future__ import annotations

from dataclasses import dataclass

BRIDGE_REPO = "NVIDIA-NeMo/Megatron-Bridge@067f987d"


@dataclass(frozen=True)
class Family:
    """A Hugging Face model_type as moeplan imports it."""

    model_type: str
    architectures: tuple[str, ...]  # the class names its config.json's `architectures` lists
    reader: str  # the hf_config.ARCHITECTURES reader of its text stack
    text_config: str | None = None  # the key a multimodal wrapper nests the text stack under
    towers: tuple[str, ...] = ()  # sub-configs of towers left out of the budget
    # keys a wrapper states for the whole model that its text stack obeys (they win over the
    # text_config's own): Qwen3-VL's top-level tie_word_embeddings false unties the output layer
    # its text_config class would tie by default
    wrapper_keys: tuple[str, ...] = ()
    bridge: str | None = None  # the Megatron-Bridge class that converts and trains it
    bridge_source: str | None = None  # that class's file under src/megatron/bridge/models/

    def bridge_line(self) -> str:
        """Which Megatron-Bridge provider trains this family, or that none does."""
        if self.bridge is None:
            return (f"Megatron-Bridge ({BRIDGE_REPO}) has no bridge for model_type "
                    f"{self.model_type}: convert the checkpoint yourself")
        return (f"Megatron-Bridge trains it with {self.bridge} (src/megatron/bridge/models/"
                f"{self.bridge_source}, {BRIDGE_REPO})")


FAMILIES: tuple[Family, ...] = (
    Family("deepseek_v2", ("DeepseekV2ForCausalLM",), "DeepseekV2ForCausalLM",
           bridge="DeepSeekV2Bridge", bridge_source="deepseek/deepseek_v2_bridge.py"),
    Family("deepseek_v3", ("DeepseekV3ForCausalLM",), "DeepseekV3ForCausalLM",
           bridge="DeepSeekV3Bridge", bridge_source="deepseek/deepseek_v3_bridge.py"),
    Family("kimi_k2", ("KimiK2ForCausalLM",), "DeepseekV3ForCausalLM",
           bridge="KimiK2Bridge", bridge_source="kimi/kimi_bridge.py"),
    # Kimi-K2.5: the DeepSeek-V3 text stack (transformers configuration_kimi_k25.py
    # Kimi_K25Config: text_config is a deepseek_v3 config) beside a MoonViT vision tower.
    Family("kimi_k25", ("KimiK25ForConditionalGeneration",), "DeepseekV3ForCausalLM",
           text_config="text_config", towers=("vision_config",),
           wrapper_keys=("tie_word_embeddings",),
           bridge="KimiK25VLBridge", bridge_source="kimi_vl/kimi_k25_vl_bridge.py"),
    Family("deepseek_v32", ("DeepseekV32ForCausalLM",), "DeepseekV32ForCausalLM"),
    # Kimi-Linear: KDA layers among MLA layers; the bridge only in a fork (the reader's note)
    Family("kimi_linear", ("KimiLinearForCausalLM",), "KimiLinearForCausalLM"),
    Family("deepseek_v4", ("DeepseekV4ForCausalLM",), "DeepseekV4ForCausalLM",
           bridge="DeepSeekV4Bridge", bridge_source="deepseek/deepseek_v4_bridge.py"),
    # GLM-4.7-Flash: the DeepSeek-V3 stack (MLA, first-k dense, sigmoid router with an expert
    # bias, one shared expert, MTP) under its own name (transformers modeling_glm4_moe_lite.py).
    Family("glm4_moe_lite", ("Glm4MoeLiteForCausalLM",), "Glm4MoeLiteForCausalLM",
           bridge="GLM47FlashBridge", bridge_source="glm/glm47_flash_bridge.py"),
    # GLM-5 / GLM-5.1: GLM-4.7-Flash's stack with a DSA indexer on every layer.
    Family("glm_moe_dsa", ("GlmMoeDsaForCausalLM",), "GlmMoeDsaForCausalLM",
           bridge="GLM5Bridge", bridge_source="glm_moe_dsa/glm5_bridge.py"),
    Family("glm4_moe", ("Glm4MoeForCausalLM",), "Glm4MoeForCausalLM",
           bridge="GLM45Bridge", bridge_source="glm/glm45_bridge.py"),
    # Nemotron-3 Nano / Super: Megatron's hybrid stack (Mamba-2, attention, MoE layers).
    Family("nemotron_h", ("NemotronHForCausalLM",), "NemotronHForCausalLM",
           bridge="NemotronHBridge", bridge_source="nemotronh/nemotron_h_bridge.py"),
    Family("qwen2_moe", ("Qwen2MoeForCausalLM",), "Qwen2MoeForCausalLM"),
    Family("qwen3_moe", ("Qwen3MoeForCausalLM",), "Qwen3MoeForCausalLM",
           bridge="Qwen3MoEBridge", bridge_source="qwen/qwen3_moe_bridge.py"),
    # Qwen3-VL-MoE: the Qwen3-MoE text stack (transformers configuration_qwen3_vl_moe.py
    # Qwen3VLMoeTextConfig; interleaved M-RoPE is RoPE numerics only) beside a vision tower.
    Family("qwen3_vl_moe", ("Qwen3VLMoeForConditionalGeneration",), "Qwen3MoeForCausalLM",
           text_config="text_config", towers=("vision_config",),
           wrapper_keys=("tie_word_embeddings",),
           bridge="Qwen3VLMoEBridge", bridge_source="qwen_vl/qwen3_vl_bridge.py"),
    # Qwen3.5-MoE: Qwen3-Next's text stack (gated DeltaNet + gated attention, a gated shared
    # expert; transformers modeling_qwen3_5_moe.py splits the DeltaNet input projection into
    # in_proj_qkv / _z / _b / _a, the same parameters) inside a vision wrapper.
    Family("qwen3_5_moe", ("Qwen3_5MoeForConditionalGeneration",), "Qwen3NextForCausalLM",
           text_config="text_config", towers=("vision_config",),
           wrapper_keys=("tie_word_embeddings",),
           bridge="Qwen35VLMoEBridge", bridge_source="qwen_vl/qwen35_vl_bridge.py"),
    Family("qwen3_5_moe_text", ("Qwen3_5MoeForCausalLM",), "Qwen3NextForCausalLM",
           bridge="Qwen35MoEBridge", bridge_source="qwen/qwen35_bridge.py"),
    Family("qwen3_next", ("Qwen3NextForCausalLM",), "Qwen3NextForCausalLM",
           bridge="Qwen3NextBridge", bridge_source="qwen/qwen3_next_bridge.py"),
    Family("mixtral", ("MixtralForCausalLM",), "MixtralForCausalLM"),
    Family("gpt_oss", ("GptOssForCausalLM",), "GptOssForCausalLM",
           bridge="GPTOSSBridge", bridge_source="gpt_oss/gpt_oss_bridge.py"),
    Family("minimax_m2", ("MiniMaxM2ForCausalLM",), "MiniMaxM2ForCausalLM",
           bridge="MiniMaxM2Bridge", bridge_source="minimax_m2/minimax_m2_bridge.py"),
    Family("llama4", ("Llama4ForConditionalGeneration",), "Llama4ForCausalLM",
           text_config="text_config", towers=("vision_config",)),
    Family("llama4_text", ("Llama4ForCausalLM",), "Llama4ForCausalLM"),
)

@dataclass(frozen=True)
class Bridge:
    """A Megatron-Bridge bridge for a model_type moeplan has no family record for (the no-record
    path of `import hf` prices it from transformers' modules, or names the part it cannot)."""

    name: str  # the class its register_bridge decorator registers
    source: str  # its file under src/megatron/bridge/models/
    commit: str  # the NVIDIA-NeMo/Megatron-Bridge commit the file was read at
    builds: str  # what its own provider or layer builds beyond Megatron-LM's arguments

    def line(self, model_type: str) -> str:
        return (f"model_type {model_type} has no moeplan family record; Megatron-Bridge trains it "
                f"with {self.name} (src/megatron/bridge/models/{self.source}, "
                f"NVIDIA-NeMo/Megatron-Bridge@{self.commit}): {self.builds}")


# Read from each file's `MegatronModelBridge.register_bridge(source=..., model_type=...)` and the
# provider it names; model_types absent here have no bridge there (Laguna, MiniMax-M3, HY-V4,
# LongCat-Flash).
UNRECORDED_BRIDGES: dict[str, Bridge] = {
    "mimo_v2_flash": Bridge(
        "MiMoV2FlashBridge", "mimo_v2_flash/mimo_v2_flash_bridge.py", "b979e638",
        "MiMoV2FlashModelProvider builds a value head dim apart from the q/k one (v_head_dim) and "
        "one KV-group count for full and another for sliding-window layers"),
    "step3p5": Bridge(
        "Step35Bridge", "stepfun/step35_bridge.py", "38173908",
        "Step35DecoderLayer overrides heads, query groups, kv_channels and the window on every "
        "sliding-attention layer (step35_provider.py)"),
    "step3p7": Bridge(
        "Step37Bridge", "stepfun/step37_bridge.py", "a1d4d4bf",
        "the Step-3.5 text stack (Step35DecoderLayer: its own head count on sliding-attention "
        "layers) beside a vision tower"),
    "gemma4": Bridge(
        "Gemma4VLBridge", "gemma_vl/gemma4_vl_bridge.py", "08908484",
        "Gemma4VLModel, its own model class for Gemma4ForConditionalGeneration"),
    "ernie4_5_moe": Bridge(
        "Ernie45Bridge", "ernie/ernie_45_bridge.py", "6c9c0bf0",
        "Megatron-Core's GPTModel from GPTModelProvider"),
    "olmoe": Bridge(
        "OlMoEBridge", "olmoe/olmoe_bridge.py", "adef63d6",
        "OLMoESelfAttention (olmoe_provider.py), its own attention whose q/k layernorms span "
        "every head at once instead of Megatron-Core's per-head ones"),
}


def unrecorded_bridge_line(model_type: object) -> str:
    """Which Megatron-Bridge bridge trains a model_type that has no record, or that none is known."""
    bridge = UNRECORDED_BRIDGES.get(model_type) if isinstance(model_type, str) else None
    if bridge is None:
        return (f"model_type {model_type!r:.40} has no moeplan family record, and Megatron-Bridge "
                f"({BRIDGE_REPO} and the files listed in hf_families.UNRECORDED_BRIDGES) has no "
                "bridge for it known here")
    return bridge.line(str(model_type))


BY_ARCHITECTURE: dict[str, Family] = {arch: family for family in FAMILIES
                                      for arch in family.architectures}
BY_MODEL_TYPE: dict[str, Family] = {family.model_type: family for family in FAMILIES}


def family_of(architectures: object, model_type: object) -> Family | None:
    """The record for a config.json: its first known architecture, else its model_type. Where the
    two records disagree on whether the text stack is nested (a wrapper's model_type with its
    text_config beside a causal LM's class name, or the reverse), the model_type's wins: it picks
    the config class transformers reads the file with (AutoConfig.for_model), so reading the
    architecture's layout would take a wrapper's top-level keys, absent, as the text stack's
    defaults and plan another model."""
    typed = BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    if isinstance(architectures, list):
        for name in architectures:
            if isinstance(name, str) and name in BY_ARCHITECTURE:
                named = BY_ARCHITECTURE[name]
                if typed is not None and (typed.text_config is None) != (named.text_config is None):
                    return typed
                return named
    return typed

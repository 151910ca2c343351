"""verl's Megatron trainer (`python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer
key=value …`, volcengine/verl), read statically from its Hydra overrides.

The actor's layout and switches are `actor_rollout_ref.actor.megatron.*` over verl's defaults
(volcengine/verl@b178a3cd verl/trainer/config/engine/megatron.yaml: TP/PP/CP/EP 1, the distributed
optimizer, bf16, no recompute, flash attention), with `override_transformer_config.*` and
`optim.override_optimizer_config.*` passed to Megatron's TransformerConfig and OptimizerConfig as
named; sequence parallelism is on exactly where TP > 1 (verl/utils/megatron_utils.py). The model is
the Hugging Face checkpoint `actor_rollout_ref.model.path` names. One optimizer step takes
ppo_mini_batch_size prompts x rollout.n samples over the data-parallel ranks, in micro-batches of
ppo_micro_batch_size_per_gpu (verl/workers/megatron_workers.py); a sample is at most
max_prompt_length + max_response_length tokens. The world is trainer.nnodes x
trainer.n_gpus_per_node.
"""

from __future__ import annotations

from planner.config.importers.assemble import FrontEnd, checkpoint_model
from planner.config.importers.launch_facts import LaunchFacts
from planner.config.importers.megatron_args import Unmapped
from planner.config.importers.megatron_log import argument_destination, destinations
from planner.config.megatron_arguments import argument_table

SOURCE = "volcengine/verl@b178a3cd verl/trainer/config/engine/megatron.yaml"
MODULES = ("verl.trainer.main_ppo", "recipe.dapo.main_dapo", "verl.trainer.main_generation")
ACTOR = "actor_rollout_ref.actor."
ENGINE = ACTOR + "megatron."
_SIZES = {"tensor_model_parallel_size": "--tensor-model-parallel-size",
          "pipeline_model_parallel_size": "--pipeline-model-parallel-size",
          "virtual_pipeline_model_parallel_size": "--virtual-pipeline-model-parallel-size",
          "context_parallel_size": "--context-parallel-size",
          "expert_model_parallel_size": "--expert-model-parallel-size",
          "expert_tensor_parallel_size": "--expert-tensor-parallel-size"}
# engine/megatron.yaml defaults that reach the model (override_transformer_config's own defaults)
DEFAULTS = {ENGINE + "tensor_model_parallel_size": "1", ENGINE + "use_distributed_optimizer": "True",
            ENGINE + "dtype": "bfloat16",
            ENGINE + "override_transformer_config.attention_backend": "flash"}
_OFFLOADS = ("param_offload", "grad_offload", "optimizer_offload")


def verl_at(words: list[str]) -> int | None:
    """Where `-m verl.trainer.main_ppo` (or a verl recipe's main) is in a command's words."""
    return next((i for i, w in enumerate(words[:-1]) if w == "-m" and words[i + 1] in MODULES), None)


def is_megatron(words: list[str]) -> bool:
    """Whether the verl launch trains with Megatron: the ppo_megatron_trainer config (its actor is
    megatron_actor), a megatron strategy or engine override, or an actor.megatron.* override;
    verl's default ppo_trainer config trains with FSDP (its actor is dp_actor)."""
    for word in words:
        key, eq, value = word.lstrip("+").partition("=")
        value = value.strip("'\"")
        if key == "--config-name" and "megatron" in value:
            return True
        engine = key.endswith((".strategy", "model_engine")) and value == "megatron"
        if eq and (engine or ".megatron." in key):
            return True
    return False


def overrides(words: list[str]) -> dict[str, str]:
    """`key=value` / `+key=value` Hydra overrides (the last one of a key wins)."""
    found: dict[str, str] = {}
    for word in words:
        key, eq, value = word.lstrip("+").partition("=")
        if eq and not key.startswith("-") and "." in key:
            found[key] = value.strip("'\"")
    return found


def _words(flag: str, value: str) -> list[str]:
    """A config value as Megatron words: a switch when Megatron's parser has one, else flag value."""
    table = argument_table().get(flag)
    switch = (table is not None and table[1] == "flag") or any(
        row.flag == flag and row.kind == "true" for rows in destinations().values() for row in rows)
    if value in ("null", "None", ""):
        return []
    if switch:
        return [flag] if value in ("True", "true", "1") else []
    if value.startswith("[") and value.endswith("]"):
        return [flag, *(v.strip(" '\"") for v in value[1:-1].split(",") if v.strip())]
    return [flag, value]


# TransformerConfig fields filled from an argument of another name (Megatron-LM dev@d48bd6be
# megatron/training/argument_utils.py core_transformer_config_from_args), as verl's
# override_transformer_config names them.
_CONFIG_FIELD_ARGUMENT = {"num_layers_in_first_pipeline_stage": "decoder_first_pipeline_num_layers",
                          "num_layers_in_last_pipeline_stage": "decoder_last_pipeline_num_layers",
                          "num_moe_experts": "num_experts", "fp8_param": "fp8_param_gather",
                          "fp4_param": "fp4_param_gather"}


def _field_words(name: str, value: str) -> list[str] | None:
    """A TransformerConfig / OptimizerConfig field set by name, as the Megatron argument whose dest
    it is (megatron_dests.tsv: `apply_rope_fusion False` is `--no-rope-fusion`); None for a field
    Megatron's parser has no argument for."""
    row = argument_destination(_CONFIG_FIELD_ARGUMENT.get(name, name))
    if row is None:
        return None
    on = value in ("True", "true", "1")
    if row.kind == "true":
        return [row.flag] if on else []
    if row.kind == "false":
        return [] if on else [row.flag]
    return _words(row.flag, value)


def verl_front_end(words: list[str], env: dict[str, str], origins: list) -> FrontEnd:
    at = verl_at(words)
    assert at is not None
    given = overrides(words[at + 2:])
    config = {**DEFAULTS, **given}
    argv: list[str] = []
    for name, flag in _SIZES.items():
        argv += _words(flag, config.get(ENGINE + name, "null"))
    tp = config.get(ENGINE + "tensor_model_parallel_size", "1")
    if tp.isdigit() and int(tp) > 1:
        argv.append("--sequence-parallel")
    argv += _words("--use-distributed-optimizer", config[ENGINE + "use_distributed_optimizer"])
    argv.append("--fp16" if config[ENGINE + "dtype"] in ("float16", "fp16") else "--bf16")
    unread: list[str] = []
    for prefix in (ENGINE + "override_transformer_config.", ACTOR + "optim.override_optimizer_config."):
        for key, value in config.items():
            if key.startswith(prefix):
                field = _field_words(key.removeprefix(prefix), value)
                if field is None:
                    unread.append(f"{key.removeprefix(prefix)}={value}")
                argv += field or []
    dynamic = config.get(ACTOR + "use_dynamic_bsz") in ("True", "true")
    for key, flag in (("optim.lr", "--lr"), ("optim.weight_decay", "--weight-decay"),
                      ("optim.clip_grad", "--clip-grad")):
        if ACTOR + key in config:
            argv += _words(flag, config[ACTOR + key])
    if dynamic:  # one micro-batch holds at most ppo_max_token_len_per_gpu tokens
        argv += ["--micro-batch-size", "1"]
    elif ACTOR + "ppo_micro_batch_size_per_gpu" in config:
        argv += _words("--micro-batch-size", config[ACTOR + "ppo_micro_batch_size_per_gpu"])
    notes: list[Unmapped] = []
    if unread:
        notes.append(Unmapped("(verl config fields)", " ".join(unread), "TransformerConfig fields Megatron's "
                              "parser has no argument for; none changes the counted model"))
    mini, samples = config.get(ACTOR + "ppo_mini_batch_size"), config.get("actor_rollout_ref.rollout.n", "1")
    if mini and mini.isdigit() and samples.isdigit():
        argv += ["--global-batch-size", str(int(mini) * int(samples))]
    prompt, response = config.get("data.max_prompt_length"), config.get("data.max_response_length")
    tokens = config.get(ACTOR + "ppo_max_token_len_per_gpu", "")
    cp = config.get(ENGINE + "context_parallel_size", "1")
    if dynamic and tokens.isdigit() and cp.isdigit():
        # volcengine/verl@b178a3cd verl/workers/actor/megatron_actor.py
        # MegatronPPOActor.update_policy and forward_backward_batch: the cap is
        # ppo_max_token_len_per_gpu x CP tokens per micro-batch (rearrange_micro_batches packs the
        # mini-batch into the fewest micro-batches under it), the sequence Megatron's CP splits.
        argv += ["--seq-length", str(int(tokens) * int(cp))]
    elif prompt and response and prompt.isdigit() and response.isdigit():
        argv += ["--seq-length", str(int(prompt) + int(response))]
    positions = config.get("actor_rollout_ref.model.override_config.model_config.max_position_embeddings")
    if positions:
        argv += ["--max-position-embeddings", positions]
    front = FrontEnd("verl Megatron trainer (Hydra overrides)", argv, None, dict(env), origins=origins)
    front.notes.append(Unmapped("(verl overrides)", " ".join(f"{k}={v}" for k, v in given.items()
                                                            if k.startswith(ACTOR)),
                                f"read as Megatron arguments over verl's defaults ({SOURCE}); one "
                                "optimizer step is ppo_mini_batch_size x rollout.n samples, a sample "
                                "at most max_prompt_length + max_response_length tokens"))
    offloaded = [k for k in _OFFLOADS if config.get(ENGINE + k) in ("True", "true")]
    if offloaded:
        notes.append(Unmapped("(verl offloads)", " ".join(offloaded), "verl moves these to the CPU between "
                              "the training, reference and rollout phases; during the training step they "
                              "are on the GPU, which is what moeplan's memory counts"))
    if dynamic:
        notes.append(Unmapped("use_dynamic_bsz", tokens, "verl packs each micro-batch up to "
                              "ppo_max_token_len_per_gpu x CP tokens (padding removed): read as "
                              "micro_batch_size 1 x seq_length of that many tokens (the activation bound; "
                              "verl fills ceil(tokens / cap) micro-batches evenly, so each is near it); "
                              "the micro-batch count per step follows the fixed-size batch, not the "
                              "packed one"))
    model = config.get("actor_rollout_ref.model.path")
    if model:
        notes.append(checkpoint_model(front, "actor_rollout_ref.model.path", model, origins))
    front.notes += notes
    front.facts = _world(config)
    return front


def _world(config: dict[str, str]) -> LaunchFacts:
    nodes, per_node = config.get("trainer.nnodes", "1"), config.get("trainer.n_gpus_per_node", "8")
    facts = LaunchFacts("verl (ray)")
    if nodes.isdigit() and per_node.isdigit():
        facts.nodes, facts.per_node = int(nodes), int(per_node)
        facts.world_size = facts.nodes * facts.per_node
        facts.sources.append(f"trainer.nnodes {nodes} x trainer.n_gpus_per_node {per_node}")
    else:
        facts.not_numbers += [(k, v) for k, v in (("trainer.nnodes", nodes),
                                                  ("trainer.n_gpus_per_node", per_node)) if not v.isdigit()]
    return facts

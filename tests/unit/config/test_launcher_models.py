"""The model a launcher builds where its own code, not Megatron's arguments, decides it: slime's
plugin layer specs, MindSpeed-LLM's layer specs and identity layers, verl's and ms-swift's Hugging
Face checkpoint, ms-swift's LoRA and its own defaults, and the Megatron-LM commit a Primus checkout
pins. Each expectation is written out by hand from the launcher's source (cited per test)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from planner.commands.import_ import validate
from planner.config.importers.sources import NotAnImport, import_text
from planner.config.loader import parse_config
from planner.config.megatron_releases import resolve_version
from tests.support.launch_corpus import FILES

SLIME = """#!/bin/bash
MODEL_ARGS=(
   --spec "slime_plugins.models.{module}" "{function}"
   --num-layers 8 --hidden-size 256 --num-attention-heads 4 --group-query-attention --num-query-groups 2
   --kv-channels 64 --ffn-hidden-size 512 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 128
   --vocab-size 1024 --swiglu --normalization RMSNorm --disable-bias-linear --qk-layernorm
   --position-embedding-type rope {more}
)
ray job submit --address=http://127.0.0.1:8265 -- python3 train.py \\
   --actor-num-nodes 1 --actor-num-gpus-per-node 8 --hf-checkpoint {checkpoint} \\
   --tensor-model-parallel-size 2 --expert-model-parallel-size 8 ${{MODEL_ARGS[@]}}
"""


def _slime(module: str, function: str, checkpoint: str = "/nowhere/ckpt", more: str = "",
           origin: Path | None = None) -> dict:
    text = SLIME.format(module=module, function=function, checkpoint=checkpoint, more=more)
    result, _ = import_text(text, origin=origin)
    assert not [u for u in result.unmapped if u.error], result.unmapped
    return result.data


def test_slime_qwen3_5_spec_reads_the_checkpoint_config_when_it_is_at_hand(tmp_path: Path) -> None:
    """slime_plugins/models/qwen3_5.py get_qwen3_5_spec puts its gated DeltaNet on the layers the
    checkpoint's layer_types marks linear_attention, sized by its linear_* keys; without the file,
    Qwen3_5MoeTextConfig's defaults (16 x 128 key, 32 x 128 value heads, 4 taps, every 4th layer
    attention) stand for it."""
    data = _slime("qwen3_5", "get_qwen3_5_spec")["model"]
    assert data["linear_attention_freq"] == 4
    assert (data["linear_num_key_heads"], data["linear_num_value_heads"]) == (16, 32)
    assert (data["linear_key_head_dim"], data["linear_value_head_dim"], data["linear_conv_kernel_dim"]) == (
        128, 128, 4)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    types = ["linear_attention", "full_attention"] * 4
    (folder / "config.json").write_text(json.dumps({"text_config": {
        "layer_types": types, "linear_num_key_heads": 8, "linear_num_value_heads": 16,
        "linear_key_head_dim": 64, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 2}}))
    data = _slime("qwen3_5", "get_qwen3_5_spec", str(folder))["model"]
    assert data["linear_attention_freq"] == [1, 0] * 4  # Megatron's list: 1 a linear layer
    assert (data["linear_num_key_heads"], data["linear_num_value_heads"], data["linear_key_head_dim"],
            data["linear_value_head_dim"], data["linear_conv_kernel_dim"]) == (8, 16, 64, 32, 2)


def test_slime_minimax_and_glm5_specs() -> None:
    """minimax_m2.py MiniMaxM2SelfAttention: one q norm over heads x d and one k norm over groups x d
    (model.qk_layernorm_per_layer); glm5/glm5.py: DSA with GLM-5's 32 x 128 indexer, top 2048, and
    slime's --allgather-cp is Megatron's cp_comm_type all_gather."""
    model = _slime("minimax_m2", "get_minimax_m2_layer_spec")["model"]
    assert model["qk_layernorm_per_layer"] is True and model["qk_layernorm"] is True
    data = _slime("glm5.glm5", "get_glm5_spec", more="--multi-latent-attention --kv-lora-rank 64 "
                  "--q-lora-rank 64 --qk-head-dim 32 --qk-pos-emb-head-dim 16 --v-head-dim 32 --allgather-cp")
    assert data["model"]["dsa"] is True
    assert (data["model"]["index_n_heads"], data["model"]["index_head_dim"], data["model"]["index_topk"]) == (
        32, 128, 2048)
    assert data["parallel"]["cp_comm_type"] == "all_gather"


def test_a_command_of_arguments_only_after_the_launch_is_an_error() -> None:
    """slime's run-kimi-k2-Instruct.sh ends `--update-weight-buffer-size $((…))` without `\\`: bash
    runs `${MODEL_ARGS[@]} …` as a command of its own, so train.py gets no model arguments."""
    text = """#!/bin/bash
MODEL_ARGS=(--num-layers 4 --hidden-size 64)
ray job submit --address=x -- python3 train.py \\
   --actor-num-nodes 1 \\
   --update-weight-buffer-size $(( 4 * 1024 ))
   ${MODEL_ARGS[@]}
"""
    result, _ = import_text(text)
    [cut] = [u for u in result.unmapped if u.error]
    assert cut.argument == "--num-layers" and "without `\\`" in cut.why
    assert "num_layers" not in result.data.get("model", {})


def test_a_sourced_model_file_from_the_repository_layout_is_found_beside_a_copy(tmp_path: Path) -> None:
    """slime's run-glm4.7-30B-A3B.sh sources "${SCRIPT_DIR}/../scripts/models/…": a copy of the
    script with models/ beside it finds the file under the same folder names."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.sh").write_text("MODEL_ARGS=(--num-layers 6)\n")
    text = ('source "${SCRIPT_DIR}/../scripts/models/m.sh"\n'
            "torchrun --nproc-per-node 1 pretrain_gpt.py ${MODEL_ARGS[@]}\n")
    result, _ = import_text(text, origin=tmp_path)
    assert result.data["model"]["num_layers"] == 6


VERL = """#!/bin/bash
python scripts/converter_hf_to_mcore.py --hf_model_path $HF_MODEL_PATH --output_path /ckpt
python3 -m verl.trainer.main_ppo --config-path=./config --config-name='ppo_megatron_trainer' \\
    actor_rollout_ref.model.path=$HF_MODEL_PATH \\
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=4 \\
    data.max_prompt_length=512 data.max_response_length=512 trainer.nnodes=1 trainer.n_gpus_per_node=8
"""


def test_verl_reads_the_checkpoint_config_or_names_it_once(tmp_path: Path) -> None:
    """verl's examples run the checkpoint converter before the trainer (the trainer is the launch);
    a checkpoint with no preset is its config.json (model.hf_config): a local folder is read, one
    not on this machine is one FILE001 finding at model.hf_config, not every model field missing."""
    result, front = import_text(VERL, {"HF_MODEL_PATH": "Org/Unknown-MoE"})
    assert front.form.startswith("verl Megatron trainer")
    assert result.data["model"] == {"hf_config": "Org/Unknown-MoE/config.json"}
    [finding] = validate(result.data, result.placeholders)
    assert (finding.code, finding.path) == ("FILE001", "model.hf_config")
    folder = tmp_path / "Qwen1.5-MoE-A2.7B"  # published Qwen/Qwen1.5-MoE-A2.7B config.json sizes
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": 151936,
        "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
        "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
        "max_position_embeddings": 8192, "norm_topk_prob": False, "tie_word_embeddings": False}))
    result, _ = import_text(VERL, {"HF_MODEL_PATH": str(folder)})
    cfg = parse_config(result.data)
    assert (cfg.model.num_layers, cfg.model.num_experts, cfg.parallel.ep, cfg.parallel.world_size) == (
        24, 60, 4, 8)


@pytest.mark.parametrize(("cp", "seq"), [(1, 12288), (2, 24576)])
def test_verl_dynamic_batches_hold_the_token_cap_times_cp(cp: int, seq: int) -> None:
    """volcengine/verl@b178a3cd megatron_actor.py update_policy: with use_dynamic_bsz a micro-batch
    holds up to ppo_max_token_len_per_gpu x CP tokens, the sequence Megatron's CP splits: one
    micro-batch of 12,288 x CP tokens, whatever max_prompt_length + max_response_length is."""
    text = VERL.replace("trainer.nnodes=1", "actor_rollout_ref.actor.use_dynamic_bsz=True "
                        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=12288 "
                        f"actor_rollout_ref.actor.megatron.context_parallel_size={cp} trainer.nnodes=1")
    result, _ = import_text(text, {"HF_MODEL_PATH": "Qwen/Qwen3-30B-A3B"})
    assert (result.data["training"]["seq_length"], result.data["training"]["micro_batch_size"],
            result.data["parallel"].get("cp", 1)) == (seq, 1, cp)


def test_verl_fsdp_trainer_is_not_a_megatron_launch() -> None:
    """verl's default ppo_trainer config trains with FSDP (its actor is dp_actor)."""
    with pytest.raises(NotAnImport, match="FSDP"):
        import_text("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen3-8B "
                    "actor_rollout_ref.actor.fsdp_config.param_offload=False\n")


def test_ms_swift_lora_and_its_etp_default() -> None:
    """ms-swift MegatronArguments: expert_tensor_parallel_size defaults to 1 (Megatron's: TP), and
    --tuner_type lora trains rank-8, alpha-32 adapters on all linears over a frozen base."""
    result, _ = import_text("NPROC_PER_NODE=8 megatron sft --model Qwen/Qwen3-30B-A3B --tuner_type lora "
                            "--tensor_model_parallel_size 4 --expert_model_parallel_size 2 "
                            "--max_length 2048\n")
    cfg = parse_config(result.data)
    assert (cfg.parallel.tp, cfg.parallel.etp, cfg.parallel.ep) == (4, 1, 2)
    assert cfg.training.lora is not None and (cfg.training.lora.dim, cfg.training.lora.alpha) == (8, 32.0)
    assert cfg.training.lora.target_modules == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]


MINDSPEED = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 16 --hidden-size 64 "
             "--num-attention-heads 4 --num-experts 8 --moe-router-topk 2 --pipeline-model-parallel-size 2 "
             "--use-fused-rmsnorm --vocab-size 1024 --seq-length 128 --max-position-embeddings 128 {more}\n")


@pytest.mark.parametrize(("more", "layout"), [
    ("--noop-layers 1,15", "Et*7|t*7L"),  # GLM-4.5-Air's pattern: one in each stage
    ("--noop-layers 14,15 --num-layers-per-virtual-pipeline-stage 4", "Et*4|(t*4|)*2t*2L"),
    ("--noop-layers 0,15 --mtp-num-layers 1", "Et*7|t*7mL"),
])
def test_mindspeed_noop_layers_keep_their_slots(more: str, layout: str) -> None:
    """MindSpeed-LLM features_manager/pipeline_parallel/noop_layers.py: identity layers keep their
    slots of the even split of --num-layers over PP x VPP chunks; each chunk holds its slots less
    them, which Megatron writes as --pipeline-model-parallel-layout."""
    result, _ = import_text(MINDSPEED.format(more=more))
    assert result.data["parallel"]["pipeline_model_parallel_layout"] == layout
    assert result.data["model"]["num_layers"] == 14


def test_mindspeed_qwen3_next_spec_and_pai_aux_loss() -> None:
    """qwen3_next_spec.py: DeltaNet on the linear layers, every --full-attention-interval-th layer
    gated attention; pai_megatron.py pai_megatron_aux_loss: pre-softmax top-k, the switch aux loss."""
    more = ("--spec mindspeed_llm.tasks.models.spec.qwen3_next_spec layer_spec --full-attention-interval 4 "
            "--mamba-d-conv 4 --linear-key-head-dim 32 --linear-value-head-dim 32 --linear-num-key-heads 2 "
            "--linear-num-value-heads 4 --partial-rotary-factor 0.25 --add-rmsnorm-offset "
            "--moe-router-load-balancing-type pai_megatron_aux_loss --reuse-fp32-param")
    result, _ = import_text(MINDSPEED.format(more=more))
    model, moe = result.data["model"], result.data["moe"]
    assert (model["linear_attention_freq"], model["linear_conv_kernel_dim"], model["attention_output_gate"],
            model["rotary_percent"]) == (4, 4, True, 0.25)
    assert (moe["moe_router_load_balancing_type"], model["moe_router_pre_softmax"]) == ("aux_loss", True)
    assert "--reuse-fp32-param" in result.data["launch"]["megatron_extra_args"]


def test_primus_checkout_pins_its_megatron(tmp_path: Path) -> None:
    """AMD-AGI/Primus@fd1eeabb primus/_thirdparty.lock pins Megatron-LM d3528a21: the release table
    places it, so megatron.version is that row."""
    shutil.copytree(FILES / "primus", tmp_path / "primus")
    lock = {"third_party": [{"name": "torchtitan", "commit": "73a0e6979dd10b6b1904098eb3c8f62c18ab87ce"},
                            {"name": "Megatron-LM", "commit": "d3528a21301db2d12e92912b3ec025dc8a2ed4d6"}]}
    (tmp_path / "primus" / "_thirdparty.lock").write_text(json.dumps(lock))
    text = (FILES / "primus_qwen3_30b_a3b.yaml").read_text(encoding="utf-8")
    result, _ = import_text(text, world_size=8, origin=tmp_path)
    assert result.data["megatron"]["version"] == "main@d3528a21"
    assert resolve_version("d3528a21").name == "main@d3528a21"


def test_values_after_the_script_beyond_what_it_reads_are_named() -> None:
    """Pai's Moonlight README passes 27 values to run_mcore_moonlight.sh, which reads $1 to $26 (its
    flash-attention switch is gone): bash never reads the last one, and every value after the
    dropped switch lands one place later; the import names the unread values."""
    text = "A=$1\nB=${2}\ntorchrun --nproc-per-node 8 pretrain_gpt.py --num-layers $A --hidden-size $B\n"
    result, _ = import_text(text, {"1": "4", "2": "64", "3": "extra"})
    [note] = [u for u in result.unmapped if u.argument == "$3.."]
    assert note.value == "extra" and "never read" in note.why and not note.error
    result, _ = import_text(text, {"1": "4", "2": "64"})
    assert not [u for u in result.unmapped if u.argument.startswith("$3")]

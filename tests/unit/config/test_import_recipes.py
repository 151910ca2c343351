"""What real MoE recipes carry, read as Megatron reads it: the functional-test runner's bracketed
lists split into words (Megatron-LM d98e8a64 tests/functional_tests/shell_test_utils/_run_training.sh)
and ModelZoo's unquoted values split at spaces; ms-swift's underscore spellings; the deprecated
CUDA-graph switches; `--moe-layer-freq -N` as Python's `i % -N`; a malformed value kept in the YAML;
the MXFP8 recipe arguments classed by what they change; MOE019 beside the TE op fuser; check
refusing what emit refuses (V4 with GTP or NCCL EP zero-copy); ckpt_format torch with ETP ≠ TP."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from planner.cli import app
from planner.cli_common import collect_findings
from planner.config.importers.megatron_args import import_arguments
from planner.config.importers.sources import front_end, import_text
from planner.config.loader import load_config, parse_config
from planner.emit import EmitError
from planner.emit.megatron import megatron_arguments
from tests.support.paths import EXAMPLES

MODEL = ("pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4 --num-experts 8 "
         "--moe-router-topk 2 --seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 "
         "--global-batch-size 16 --vocab-size 1024 --bf16")


def test_functional_test_runner_splits_bracketed_lists_only() -> None:
    text = ("TEST_TYPE: regular\nMODEL_ARGS:\n  --recompute-granularity: selective\n"
            '  --recompute-modules: "[layernorm moe_act]"\n  --moe-layer-freq: ([0]*1+[1]*3)\n'
            "  --spec: a b\n  --bf16: true\n  --fp16: false\n")
    assert front_end(text).argv == ["--recompute-granularity", "selective", "--recompute-modules",
                                    "layernorm", "moe_act", "--moe-layer-freq", "([0]*1+[1]*3)",
                                    "--spec", "a b", "--bf16"]


def test_modelzoo_values_split_at_spaces() -> None:
    text = "MODEL_ARGS:\n  --recompute-modules: moe_act layernorm\n  --bf16: true\n"
    assert front_end(text).argv == ["--recompute-modules", "moe_act", "layernorm", "--bf16"]


def test_recompute_list_reaches_its_field() -> None:
    text = ("TEST_TYPE: regular\nMODEL_ARGS:\n  --recompute-granularity: selective\n"
            '  --recompute-modules: "[layernorm moe_act]"\n')
    result, _ = import_text(text, world_size=8)
    assert result.get("overlap.recompute_modules") == ["layernorm", "moe_act"]


def test_underscore_spellings_are_megatrons_arguments() -> None:
    result, _ = import_text(MODEL + " --tensor_model_parallel_size 2 --expert_model_parallel_size 4 "
                            "--sequence_parallel --not_an_argument 1", world_size=8)
    assert (result.get("parallel.tp"), result.get("parallel.ep")) == (2, 4)
    assert result.get("parallel.sequence_parallel") is True
    assert result.get("launch.megatron_extra_args") == ["--not_an_argument", "1"]


def test_cuda_graph_modules_is_the_scope() -> None:
    """Megatron dev's --cuda-graph-modules and its deprecated --cuda-graph-scope fill one list
    (megatron/training/arguments.py _normalize_cuda_graph_modules_args); the emitter writes dev's."""
    for flag in ("--cuda-graph-modules", "--cuda-graph-scope"):
        result, _ = import_text(MODEL + f" --cuda-graph-impl transformer_engine {flag} attn moe_router",
                                world_size=8)
        assert result.get("overlap.cuda_graph_scope") == ["attn", "moe_router"], flag
    from planner.config.megatron_arguments import emit_steps
    flags = {step.flag for step in emit_steps() if hasattr(step, "flag")}
    assert "--cuda-graph-modules" in flags and "--cuda-graph-scope" not in flags


def test_deprecated_cuda_graph_switches() -> None:
    result, _ = import_text(MODEL + " --external-cuda-graph", world_size=8)
    assert result.get("overlap.cuda_graph_impl") == "transformer_engine"
    result, _ = import_text(MODEL + " --enable-cuda-graph", world_size=8)
    assert result.get("overlap.cuda_graph_impl") == "local"
    result, _ = import_text(MODEL + " --cuda-graph-impl local --external-cuda-graph", world_size=8)
    [refused] = [u for u in result.unmapped if u.error]
    assert refused.argument == "--external-cuda-graph" and "--cuda-graph-impl" in refused.why


def test_negative_moe_layer_freq_is_pythons_modulo() -> None:
    # layer i is MoE where i % freq == 0: i % -1 == 0 for every i, i % -2 == 0 for even i
    for written, read in (("-1", 1), ("-2", 2)):
        result, _ = import_text(MODEL + f" --moe-layer-freq {written}", world_size=8)
        assert result.get("model.moe_layer_freq") == read
        assert not [u for u in result.unmapped if u.error]
    result, _ = import_text(MODEL + " --moe-layer-freq 0", world_size=8)
    assert [u.argument for u in result.unmapped if u.error] == ["--moe-layer-freq"]


def test_malformed_value_stays_in_the_yaml(tmp_path: Path) -> None:
    source = tmp_path / "args.txt"
    source.write_text(MODEL + " --optimizer-offload-fraction none")
    out = tmp_path / "job.yaml"
    ran = CliRunner().invoke(app, ["import", "megatron", str(source), "--world-size", "8", "-o", str(out)])
    assert ran.exit_code == 1
    text = out.read_text()
    assert "# error: --optimizer-offload-fraction none: malformed value" in text
    assert yaml.safe_load(text)["launch"]["megatron_extra_args"] == ["--optimizer-offload-fraction", "none"]
    codes = {(f.code, f.path) for f in collect_findings(load_config(out))}
    assert ("ARG005", "launch.megatron_extra_args[0]") in codes


def test_mtp_zero_with_ep_overlap_is_refused() -> None:
    result, _ = import_text(MODEL + " --mtp-num-layers 0 --overlap-moe-expert-parallel-comm", world_size=8)
    assert [u.argument for u in result.unmapped if u.error] == ["--mtp-num-layers"]


def _codes(extra: list[str]) -> dict[str, str]:
    result, _ = import_text(MODEL, world_size=8)
    result.set("launch.megatron_extra_args", extra)
    return {f.code: f.severity for f in collect_findings(parse_config(result.data))
            if f.code.startswith("ARG")}


def test_mxfp8_recipe_arguments_are_not_arg001() -> None:
    """Megatron-MoE-ModelZoo sbatch_benchmarking.sh's MXFP8 recipe and the offload/stash switches."""
    assert _codes(["--moe-router-padding-for-quantization", "--moe-router-padding-for-fp8"]) == {
        "ARG002": "warning"}
    assert _codes(["--reuse-grad-buf-for-mxfp8-param-ag"]) == {}
    assert _codes(["--chunked-optimizer-state-offload", "--moe-paged-stash",
                   "--delay-offload-until-cuda-graph"]) == {"ARG002": "warning"}


def _hybridep(fuser: bool) -> set[tuple[str, str]]:
    data = load_config(EXAMPLES / "tiny-cpu-8.yaml").model_dump(exclude_unset=True)
    data["moe"] = {**data.get("moe", {}), "moe_token_dispatcher_type": "flex",
                   "moe_flex_dispatcher_backend": "hybridep", "moe_expert_rank_capacity_factor": 1.5}
    data["launch"] = {**data.get("launch", {}),
                      "megatron_extra_args": ["--use-transformer-engine-op-fuser"] if fuser else []}
    return {(f.code, f.path) for f in collect_findings(parse_config(data))}


def test_moe019_reads_the_op_fuser() -> None:
    assert ("MOE019", "moe.moe_expert_rank_capacity_factor") in _hybridep(False)
    assert not [c for c, _ in _hybridep(True) if c == "MOE019"]


def _v4(**moe_or_parallel: object) -> dict:
    data = load_config(EXAMPLES / "deepseek-v4-flash-128.yaml").model_dump(exclude_unset=True)
    for dotted, value in moe_or_parallel.items():
        section, name = dotted.split("__")
        data.setdefault(section, {})[name] = value
    return data


def test_check_refuses_what_emit_refuses_naming_the_field() -> None:
    for change, path in (({"parallel__gtp": 2}, "parallel.gtp"),
                         ({"moe__moe_ncclep_zero_copy": True}, "moe.moe_ncclep_zero_copy")):
        cfg = parse_config(_v4(**change))
        found = [f for f in collect_findings(cfg) if f.code == "V4012"]
        assert [f.path for f in found] == [path]
        try:
            megatron_arguments(cfg)
        except EmitError as exc:
            assert exc.path == path
        else:
            raise AssertionError("emit accepted a config no one Megatron runs")


def test_torch_checkpoint_with_etp_other_than_tp() -> None:
    data = load_config(EXAMPLES / "tiny-cpu-8.yaml").model_dump(exclude_unset=True)
    data["training"] = {**data.get("training", {}), "ckpt_format": "torch"}
    data["parallel"] = {**data["parallel"], "tp": 2, "etp": 1, "sequence_parallel": True}
    assert "PAR017" in {f.code for f in collect_findings(parse_config(data))}
    data["parallel"]["etp"] = 2
    assert "PAR017" not in {f.code for f in collect_findings(parse_config(data))}


def test_one_pass_with_named_placeholders(tmp_path: Path) -> None:
    """ModelZoo's Qwen3-30B-A3B map with neither vocabulary nor world size: both stay CFG003 errors,
    and ARG006 (Megatron dev refuses TE cross entropy with loss fusion) arrives in the same pass,
    computed with the qwen3-30b-a3b preset's vocabulary and the smallest world (EP 8)."""
    from dataclasses import replace as with_fields

    from planner.commands.import_ import validate
    from tests.support.launch_corpus import BY_NAME, import_entry

    entry = with_fields(BY_NAME["modelzoo_qwen3_30b_a3b.yaml"], vocab_size=None, world_size=None)
    result, _ = import_entry(entry, tmp_path)
    assert result.placeholders["model.vocab_size"][0] == 151936
    assert result.placeholders["parallel.world_size"][0] == 8
    assert "vocab_size" not in result.data["model"]  # the YAML keeps the field missing
    found = validate(result.data, result.placeholders)
    assert {(f.code, f.path) for f in found if f.code == "CFG003"} == {
        ("CFG003", "model.vocab_size"), ("CFG003", "parallel.world_size")}
    assert all("assume" in f.message for f in found if f.code == "CFG003")
    assert "ARG006" in {f.code for f in found}


def test_no_tokenizer_name_assumes_the_largest_preset_vocabulary() -> None:
    from planner.config.importers.vocabulary import largest_preset_vocabulary

    result, _ = import_text(MODEL.replace(" --vocab-size 1024", ""), world_size=8)
    assert result.placeholders["model.vocab_size"][0] == largest_preset_vocabulary()[1]


def test_slime_launch_as_train_py_hands_it_to_megatron(tmp_path: Path) -> None:
    """THUDM/slime scripts/run-qwen3-30B-A3B.sh: the sourced model file is read, slime's defaults
    (bf16, distributed optimizer, seq_length 4096) applied, the world is actor nodes x GPUs per node,
    slime's own arguments are named and not carried, and the NVLink probe (`if` on nvidia-smi output,
    which only reaches ray's runtime environment) is no error."""
    from tests.support.launch_corpus import BY_NAME, import_entry

    result, front = import_entry(BY_NAME["slime_qwen3_30b_a3b.sh"], tmp_path)
    assert front.form.startswith("slime launch") and front.facts.world_size == 8
    assert (result.get("training.precision"), result.get("training.use_distributed_optimizer"),
            result.get("training.seq_length"), result.get("model.max_position_embeddings")) == (
        "bf16", True, 4096, 4096)
    assert result.get("model.moe_layer_freq") == 1  # the loop prints 48 ones
    assert result.get("model.vocab_size") == 151936 and result.get("parallel.world_size") == 8
    extra = result.get("launch.megatron_extra_args")
    assert "--rollout-batch-size" not in extra and not [w for w in extra if w.startswith("--sglang-")]
    assert not [u for u in result.unmapped if u.error]


def test_slime_global_batch_and_dense_first_layers(tmp_path: Path) -> None:
    """scripts/run-glm4.7-355B-A32B.sh: 8 nodes by default, 3 dense layers first (the model file's
    `[0]*3+[1]*89`), and slime's global batch 128 x 8 // 4 = 256."""
    from tests.support.launch_corpus import BY_NAME, import_entry

    result, _ = import_entry(BY_NAME["slime_glm4.7_355b_a32b.sh"], tmp_path)
    assert result.get("parallel.world_size") == 64
    assert result.get("model.moe_layer_freq") == [0] * 3 + [1] * 89
    assert result.get("training.global_batch_size") == 256


def test_ms_swift_megatron_command(tmp_path: Path) -> None:
    """modelscope/ms-swift examples/megatron/moe/qwen3_moe_offload.sh: underscore spellings with
    true/false values, the model from --model (the qwen3-30b-a3b preset), ms-swift's defaults, the
    world from NPROC_PER_NODE, and its own arguments (dataset, epochs) not carried."""
    from tests.support.launch_corpus import BY_NAME, import_entry

    result, front = import_entry(BY_NAME["swift_qwen3_moe_offload.sh"], tmp_path)
    assert front.form.startswith("ms-swift command") and result.get("parallel.world_size") == 4
    assert result.get("model.preset") == "qwen3-30b-a3b" and "num_layers" not in result.data["model"]
    assert (result.get("training.seq_length"), result.get("training.global_batch_size"),
            result.get("training.precision"), result.get("moe.moe_token_dispatcher_type")) == (
        8192, 16, "bf16", "alltoall")
    assert result.get("training.optimizer_cpu_offload") is True
    extra = result.get("launch.megatron_extra_args")
    assert "--finetune" in extra and "true" not in extra and "--dataset" not in extra
    result, _ = import_text("megatron sft --model Qwen/Qwen3-30B-A3B --moe_grouped_gemm false "
                            "--cross_entropy_loss_fusion false --max_length 4096", world_size=8)
    assert result.get("moe.moe_grouped_gemm") is False  # Megatron's default once ms-swift's is refused
    assert "--cross-entropy-loss-fusion" not in (result.get("launch.megatron_extra_args") or [])


def test_an_environment_value_known_only_at_run_time_is_no_traceback(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("NNODES=$WORLD_SIZE torchrun --nproc-per-node 8 pretrain_gpt.py " + MODEL[15:] + "\n")
    ran = CliRunner().invoke(app, ["import", "megatron", str(script), "-o", str(tmp_path / "job.yaml")])
    assert ran.exception is None or isinstance(ran.exception, SystemExit), ran.exception
    written = yaml.safe_load((tmp_path / "job.yaml").read_text())
    assert "NNODES" not in written.get("launch", {}).get("env", {})


def test_positional_values_after_the_script(tmp_path: Path) -> None:
    """Pai-Megatron-Patch's README runs `sh run_mcore_qwen3.sh dlc A3B 1 8 …`: the values after the
    script are its $1 $2 …, as a --set of each would give them."""
    from tests.support.launch_corpus import BY_NAME, FILES

    entry = BY_NAME["pai_qwen3.sh"]
    values = [entry.sets[str(i)] for i in range(1, 28)]
    named = [f"--set={k}={v}" for k, v in entry.sets.items() if not k.isdigit()]
    out = tmp_path / "job.yaml"
    ran = CliRunner().invoke(app, ["import", "megatron", str(FILES / entry.name), *values, *named,
                                   "-o", str(out)])
    assert ran.exit_code in (0, 1), ran.output
    data = yaml.safe_load(out.read_text())
    assert (data["parallel"]["tp"], data["parallel"]["pp"], data["parallel"]["ep"]) == (4, 2, 4)
    assert data["training"]["micro_batch_size"] == 1 and data["training"]["global_batch_size"] == 8


def test_verl_megatron_trainer_overrides(tmp_path: Path) -> None:
    """volcengine/verl examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh: EP 8 from the actor's
    megatron overrides, verl's bf16 and distributed optimizer, TransformerConfig fields as their
    Megatron arguments (moe_enable_deepep True: the flex dispatcher's DeepEP backend; apply_rope_fusion
    True: Megatron's default, no word), one step of 128 prompts x 16 samples, a packed micro-batch of
    ppo_max_token_len_per_gpu 10240 tokens, the world trainer.nnodes x n_gpus_per_node."""
    from tests.support.launch_corpus import BY_NAME, import_entry

    result, front = import_entry(BY_NAME["verl_qwen3moe_30b_megatron.sh"], tmp_path)
    assert front.form.startswith("verl Megatron trainer") and result.get("parallel.world_size") == 8
    assert (result.get("parallel.ep"), result.get("parallel.tp"), result.get("model.preset")) == (
        8, 1, "qwen3-30b-a3b")
    assert (result.get("training.global_batch_size"), result.get("training.micro_batch_size"),
            result.get("training.seq_length"), result.get("training.precision")) == (2048, 1, 10240, "bf16")
    assert result.get("moe.moe_flex_dispatcher_backend") == "deepep"
    # --attention-backend is modelled (training.attention_backend: the unfused backends keep s x s scores)
    assert result.get("training.attention_backend") == "flash"
    assert result.get("launch.megatron_extra_args") == ["--overlap-cpu-optimizer-d2h-h2d"]


def test_primus_experiment_merged_over_its_presets(tmp_path: Path) -> None:
    """AMD-AGI/Primus examples/megatron/configs/MI300X/qwen3_30B_A3B-BF16-pretrain.yaml: the model
    from models/megatron/qwen3_30B_A3B.yaml's extends chain (Qwen3's 48 layers, 128 experts top-8),
    the trainer from modules/megatron/pre_trainer.yaml's, the experiment's overrides last (EP 8 from
    ${PRIMUS_EP:8}, micro batch 2, norm epsilon 1e-6 by Megatron's --norm-epsilon); Primus's Turbo
    keys named, not carried; --set PRIMUS_EP=4 is the environment."""
    from tests.support.launch_corpus import BY_NAME, FILES, import_entry

    result, front = import_entry(BY_NAME["primus_qwen3_30b_a3b.yaml"], tmp_path)
    assert front.form.startswith("Primus experiment")
    fields = ("model.num_layers", "model.num_experts", "model.moe_router_topk", "model.norm_epsilon",
              "parallel.ep", "training.micro_batch_size", "training.precision")
    assert tuple(result.get(f) for f in fields) == (48, 128, 8, 1e-6, 8, 2, "bf16")
    assert not [w for w in result.get("launch.megatron_extra_args") if "turbo" in w]
    again, _ = import_text((FILES / "primus_qwen3_30b_a3b.yaml").read_text(), {"PRIMUS_EP": "4"}, 8, FILES)
    assert again.get("parallel.ep") == 4


def test_mindspeed_llm_deepseek3(tmp_path: Path) -> None:
    """Ascend/MindSpeed-LLM examples/mcore/deepseek3/pretrain_deepseek3_671b_4k_ptd.sh: --noop-layers
    61,62,63 of 64 on PP 8 are identity layers padding the last stage (61 layers, the last stage 8 - 3),
    --first-k-dense-replace 3 the dense first layers, --n-shared-experts 1 a shared expert of
    1 x 2048; the unquoted placeholder --save path splits into words (ARG007)."""
    from tests.support.launch_corpus import BY_NAME, import_entry

    result, front = import_entry(BY_NAME["mindspeed_deepseek3_671b.sh"], tmp_path)
    assert front.form.startswith("MindSpeed-LLM launch") and result.get("parallel.world_size") == 512
    assert result.get("model.num_layers") == 61
    assert result.get("model.moe_layer_freq") == [0] * 3 + [1] * 58
    assert result.get("model.moe_shared_expert_intermediate_size") == 2048
    assert result.get("parallel.decoder_last_pipeline_num_layers") == 5
    cfg = parse_config(result.data)
    codes = {f.code for f in collect_findings(cfg)}
    assert {"PAR017", "ARG007"} <= codes


def test_carried_argument_arity() -> None:
    assert _codes(["--save", "your", "ckpt", "path"]) == {"ARG007": "error"}
    assert _codes(["--save", "/ckpt"]) == {}


def test_mindspeed_llm_shared_expert_gate_and_fp32_router_switches() -> None:
    """MindSpeed-LLM features_manager/moe/shared_expert.py --shared-expert-gate (one output, the
    default --shared-expert-gate-output-dimension) is Megatron's --moe-shared-expert-gate;
    moe_router.py's --router-gating-in-fp32 and --topk-softmax-in-fp32 are numerics, named, not carried
    (Ascend/MindSpeed-LLM@c77308a1 examples/mcore/qwen3_moe/pretrain_qwen3_235b_a22b_4k_A3_ptd.sh uses
    the last; they were ARG003 errors)."""
    from planner.config.importers.sources import import_text

    script = ("#!/bin/bash\ntorchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 64 "
              "--num-attention-heads 4 --num-experts 8 --moe-router-topk 2 --seq-length 128 "
              "--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 16 --vocab-size 512 "
              "--moe-ffn-hidden-size 32 --n-shared-experts 1 --shared-expert-gate --router-gating-in-fp32 "
              "--topk-softmax-in-fp32")
    result, front = import_text(script)
    assert front.form.startswith("MindSpeed-LLM launch")
    assert result.get("model.moe_shared_expert_gate") is True
    assert result.get("model.moe_shared_expert_intermediate_size") == 32
    assert not [w for w in result.get("launch.megatron_extra_args", []) if "fp32" in w or "gate" in w]


def test_verl_config_fields_named_after_their_transformer_config_field() -> None:
    """verl's override_transformer_config names TransformerConfig fields; where
    core_transformer_config_from_args fills one from an argument of another name (Megatron-LM
    dev@d48bd6be megatron/training/argument_utils.py), the argument is that one: volcengine/verl@b178a3cd
    examples/grpo_trainer/run_deepseek671b_math_megatron_80gb.sh's first stage of 4 and last of 1 layer
    (61 = 4 + 14 x 4 + 1 on PP 16) were dropped and PIP001 refused the split."""
    from planner.config.importers.verl import _field_words

    first, last = "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"
    assert _field_words("num_layers_in_first_pipeline_stage", "4") == [first, "4"]
    assert _field_words("num_layers_in_last_pipeline_stage", "1") == [last, "1"]
    assert _field_words("recompute_num_layers", "1") == ["--recompute-num-layers", "1"]


def test_megatron_moe_recipe_args_are_read_as_flags() -> None:
    """Megatron-LM dev@d48bd6be examples/moe_recipes/*/*/*.yaml (README: DEPENDENCIES, ENV_VARS, and
    ARGS, Megatron-LM's training arguments by their underscore names): each name is its flag, true
    the bare switch, false left out, a list its words, ${VAR} from ENV_VARS or --set (the form was
    "no command starts a Python entry script")."""
    text = """
DEPENDENCIES: {pytorch_base_image: nvcr.io/nvidia/pytorch:26.03-py3}
ENV_VARS: {NVTE_FUSED_ATTN: '1'}
ARGS:
  num_layers: 4
  hidden_size: 64
  num_attention_heads: 4
  num_experts: 8
  moe_router_topk: 2
  seq_length: 128
  max_position_embeddings: 128
  micro_batch_size: 1
  global_batch_size: 16
  vocab_size: 512
  disable_bias_linear: true
  moe_router_pre_softmax: false
  cuda_graph_scope: [attn, moe_router]
  save: ${OUTPUT_PATH}/checkpoints
"""
    result, front = import_text(text, {"OUTPUT_PATH": "/out"}, world_size=8)
    assert front.form == "YAML argument map (ARGS of a Megatron-LM MoE recipe)"
    assert front.argv[:2] == ["--num-layers", "4"] and "--moe-router-pre-softmax" not in front.argv
    assert "--disable-bias-linear" in front.argv and front.env == {"NVTE_FUSED_ATTN": "1"}
    at = front.argv.index("--cuda-graph-scope")
    assert front.argv[at:at + 3] == ["--cuda-graph-scope", "attn", "moe_router"]
    assert front.argv[front.argv.index("--save") + 1] == "/out/checkpoints"
    assert result.get("model.num_layers") == 4 and result.get("model.add_bias_linear") is False


def test_a_value_moeplan_does_not_model_is_named_and_the_rest_judged() -> None:
    """Ascend/MindSpeed-LLM@c77308a1 examples/mcore/phi35/pretrain_phi35_moe_ptd.sh: --rope-type longrope
    and --moe-router-load-balancing-type sparsemixer_topk are values of modelled arguments moeplan has
    no model of. Written into the fields they refused the whole config (CFG002, nothing else judged);
    kept as written they are one ARG005 each, and every other rule runs in the same pass."""
    result = import_arguments("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --num-experts 8 "
                              "--moe-router-topk 2 --seq-length 128 --max-position-embeddings 128 "
                              "--micro-batch-size 1 --global-batch-size 16 --vocab-size 512 "
                              "--rope-type longrope --tensor-model-parallel-size 3", world_size=8)
    [note] = [u for u in result.unmapped if u.argument == "--rope-type"]
    assert note.error and "'longrope'" in note.why and not result.has("model.rope_type")
    codes = {f.code: f for f in collect_findings(parse_config(result.data))}
    assert "rope, yarn only" in codes["ARG005"].message and "PAR001" in codes  # TP 3 still judged

"""The launch corpus: real public MoE launch scripts and argument maps (each file in
tests/support/launch_corpus_files/ names its repository, path and commit in its first lines), with
what a user passes beside the file — `--set` values the file leaves to its environment, a world size
where no launcher in the file gives one, and the vocabulary the import asks for when only a
tokenizer fixes it — each with where that value comes from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from planner.config.importers.assemble import assemble
from planner.config.importers.megatron_args import Imported
from planner.config.importers.sources import FrontEnd, front_end
from planner.config.schema import Config
from planner.emit.megatron_check import DATA_ARGUMENTS, CheckRequest, request_for

FILES = Path(__file__).parent / "launch_corpus_files"
# Megatron-LM tests/test_utils/recipes/h100/moe.yaml runs every MoE functional test on one node of 8.
FUNCTIONAL_TEST_WORLD = 8
FUNCTIONAL_TEST = "YAML argument map (MODEL_ARGS of a Megatron-LM"
# GPT-2 BPE, which the functional tests' --vocab-file bpe/vocab.json holds (50257 tokens).
GPT2_VOCABULARY = 50257


@dataclass(frozen=True)
class CorpusEntry:
    name: str  # file in FILES
    form: str  # the form the import names (a prefix of FrontEnd.form)
    sets: dict[str, str] = field(default_factory=dict)
    world_size: int | None = None
    vocab_size: int | None = None  # what the user adds after the vocabulary note
    why: str = ""  # where sets / world size / vocabulary come from
    appended: tuple[str, ...] = ()  # arguments the file's harness appends to the map
    gpu: str | None = None  # the GPU the file's harness runs on (cluster.gpu)


def modelzoo_sets(tp: int, pp: int, ep: int, cp: int, vpp: int, mbs: int, gbs: int, layers: int,
                  dispatcher: str, grouped: str, seq: int = 4096) -> dict[str, str]:
    """The variables Megatron-MoE-ModelZoo runtime_configs/benchmarking/runtime.conf sets for a model
    (its BENCHMARKING_MODEL_CONFIGS row; LAYERS_PER_VP = layers / PP / VPP when VPP > 1, else false)."""
    return {"TP": str(tp), "PP": str(pp), "EP": str(ep), "CP": str(cp), "VPP": str(vpp), "MBS": str(mbs),
            "GBS": str(gbs), "MOE_TOKEN_DISPATCHER": dispatcher, "MOE_GROUPED_GEMM": grouped,
            "SEQ_LEN": str(seq), "LAYERS_PER_VP": str(layers // pp // vpp) if vpp > 1 else "false",
            "NUM_LAYERS": str(layers)}


MODELZOO_RUNTIME = ("yanring/Megatron-MoE-ModelZoo runtime_configs/benchmarking/runtime.conf "
                    "BENCHMARKING_MODEL_CONFIGS (commit e8650517), 8 GPUs per node")
PAI_README = "alibaba/Pai-Megatron-Patch examples/{model}/README.md pretraining command (commit a098ca5a)"


# MindSpeed-LLM's scripts leave their paths to the user ("please fill these path configurations"):
# filled, as a user does before running (left as written, the placeholders split into words and
# Megatron refuses them: ARG007, as mindspeed_qwen3_30b_a3b.sh shows).
MINDSPEED_PATHS = {"CKPT_SAVE_DIR": "/ckpt", "CKPT_LOAD_DIR": "/ckpt", "DATA_PATH": "/data/text_document",
                   "TOKENIZER_PATH": "/tokenizer"}
MINDSPEED_FILLED = "the torchrun world and --padded-vocab-size are the script's; its path placeholders set"


def _positional(values: list[str]) -> dict[str, str]:
    return {str(i + 1): value for i, value in enumerate(values)}


CORPUS: tuple[CorpusEntry, ...] = (
    CorpusEntry("mlm_mixtral_8x7b_distributed.sh", "shell launch script",
                sets={"TOKENIZER_MODEL": "{tokenizer_folder}", "SLURM_NNODES": "4"},
                why="PP 4 x EP 8 needs 32 ranks: 4 nodes (the script reads SLURM_NNODES); a Mixtral "
                    "tokenizer folder (config.json vocab_size 32000, mistralai/Mixtral-8x7B-v0.1)"),
    CorpusEntry("mlm_mfsdp_deepseek_v3.sh", "shell argument snippet", world_size=256, vocab_size=129280,
                why="its sbatch heredoc leaves nodes to the user (your_own_num_nodes): 32 nodes of 8 "
                    "(EP 8 x DP); vocabulary of the deepseek-v3 preset the note suggests"),
    CorpusEntry("mlm_gptoss_train.sh", "shell launch script", vocab_size=201088,
                why="gpt-oss's o200k_harmony tokenizer (openai/gpt-oss-20b config.json vocab_size 201088)"),
    CorpusEntry("mlm_modelopt_qwen3_30b_a3b.sh", "shell argument snippet", world_size=8, vocab_size=151936,
                why="one node of 8; vocabulary of the qwen3-30b-a3b preset the note suggests"),
    CorpusEntry("mlm_modelopt_deepseek_v2_lite.sh", "shell argument snippet", world_size=8,
                vocab_size=102400, why="one node of 8; DeepSeek-V2-Lite config.json vocab_size 102400"),
    CorpusEntry("mlm_ft_tp2_pp1_8experts_etp1_ep4.yaml", FUNCTIONAL_TEST,
                world_size=FUNCTIONAL_TEST_WORLD, vocab_size=GPT2_VOCABULARY,
                why="tests/test_utils/recipes/h100/moe.yaml: nodes 1, gpus 8; GPT-2 BPE vocabulary"),
    CorpusEntry("mlm_ft_tp2_pp2_ep2_4experts.yaml", FUNCTIONAL_TEST,
                world_size=FUNCTIONAL_TEST_WORLD, vocab_size=GPT2_VOCABULARY,
                why="tests/test_utils/recipes/h100/moe.yaml: nodes 1, gpus 8; GPT-2 BPE vocabulary"),
    CorpusEntry("mlm_ft_tp4_ep2_etp2_pp2_dist_optimizer.yaml", FUNCTIONAL_TEST,
                world_size=FUNCTIONAL_TEST_WORLD, vocab_size=GPT2_VOCABULARY,
                why="tests/test_utils/recipes/h100/moe.yaml: nodes 1, gpus 8; GPT-2 BPE vocabulary"),
    CorpusEntry("mlm_ft_tp2_pp2_ep4_etp1_mtp_fp8.yaml", FUNCTIONAL_TEST,
                world_size=FUNCTIONAL_TEST_WORLD, vocab_size=GPT2_VOCABULARY,
                why="tests/test_utils/recipes/h100/moe.yaml: nodes 1, gpus 8; GPT-2 BPE vocabulary"),
    CorpusEntry("modelzoo_qwen3_30b_a3b.yaml", "YAML argument map (MODEL_ARGS, as Megatron-MoE-ModelZoo",
                sets=modelzoo_sets(1, 1, 8, 1, 1, 1, 256, 48, "alltoall", "true"), world_size=32,
                vocab_size=151936, why=f"{MODELZOO_RUNTIME}: NNODES 4; qwen3-30b-a3b preset vocabulary"),
    CorpusEntry("modelzoo_qwen3_235b_a22b.yaml", "YAML argument map (MODEL_ARGS, as Megatron-MoE-ModelZoo",
                sets=modelzoo_sets(2, 8, 32, 1, 4, 1, 256, 96, "flex", "true"), world_size=256,
                vocab_size=151936, why=f"{MODELZOO_RUNTIME}: NNODES 32 (96 = 94 layers + embedding + "
                                        "loss); qwen3-235b-a22b preset vocabulary"),
    CorpusEntry("modelzoo_mixtral_8x7b.yaml", "YAML argument map (MODEL_ARGS, as Megatron-MoE-ModelZoo",
                sets=modelzoo_sets(1, 4, 8, 1, 8, 1, 256, 32, "alltoall", "true"), world_size=64,
                vocab_size=32000, why=f"{MODELZOO_RUNTIME}: NNODES 8; Mixtral vocabulary 32000"),
    CorpusEntry("modelzoo_deepseek_v2_lite.yaml", "YAML argument map (MODEL_ARGS, as Megatron-MoE-ModelZoo",
                sets=modelzoo_sets(1, 1, 8, 1, 1, 1, 512, 27, "alltoall", "true"), world_size=8,
                vocab_size=102400, why=f"{MODELZOO_RUNTIME}: NNODES 1; DeepSeek-V2-Lite vocabulary 102400"),
    CorpusEntry("modelzoo_deepseek_v3.yaml", "YAML argument map (MODEL_ARGS, as Megatron-MoE-ModelZoo",
                sets={**modelzoo_sets(1, 16, 64, 1, 1, 1, 8192, 61, "flex", "true"), "PP_FIRST": "4",
                      "PP_LAST": "1"}, world_size=1024, vocab_size=129280,
                appended=("--decoder-first-pipeline-num-layers", "4",
                          "--decoder-last-pipeline-num-layers", "1"),
                why=f"{MODELZOO_RUNTIME}: NNODES 128; sbatch_benchmarking.sh appends PP_FIRST 4 / PP_LAST 1 "
                    "as --decoder-first/last-pipeline-num-layers (61 layers over PP 16); deepseek-v3 preset "
                    "vocabulary"),
    CorpusEntry("pai_deepseek_v3.sh", "shell launch script",
                sets={**_positional(["dsw", "A37B", "1", "8", "1e-5", "1e-6", "1024", "1024", "bf16", "8",
                                     "8", "1", "1", "16", "true", "true", "false", "false", "sel", "1.0",
                                     "100000", "/data", "/data", "/ckpt", "1000000000", "10000", "/out"]),
                      "MP_PP0_LAYERS": "5", "GPUS_PER_NODE": "8", "NNODES": "16"},
                vocab_size=129280, why=PAI_README.format(model="deepseek_v3") + " with MP_PP0_LAYERS=5; "
                "16 nodes of 8 (EP 16 x PP 8); deepseek-v3 preset vocabulary"),
    CorpusEntry("slime_qwen3_30b_a3b.sh", "slime launch",
                why="nothing added: the sourced models/qwen3-30B-A3B.sh gives the vocabulary, slime's "
                    "--actor-num-nodes 1 x --actor-num-gpus-per-node 8 the world"),
    CorpusEntry("slime_glm4.7_355b_a32b.sh", "slime launch",
                why="nothing added: ACTOR_NUM_NODES defaults to 8 (x 8 GPUs), the sourced "
                    "models/glm4.5-355B-A32B.sh gives the model and vocabulary"),
    CorpusEntry("slime_qwen3_next_80b_a3b.sh", "slime launch",
                why="nothing added: 4 actor nodes x 8, the sourced models/qwen3-next-80B-A3B.sh gives "
                    "the model and vocabulary (out of sample: added after the import was written)"),
    CorpusEntry("swift_qwen3_moe.sh", "ms-swift command", sets={"WORLD_SIZE": "2"}, world_size=16,
                why="Alibaba Cloud DLC sets WORLD_SIZE (nodes: 2) and 8 processes per node; the header's "
                    "'16 * 80GiB'; the model is --model Qwen/Qwen3-30B-A3B-Base, the qwen3-30b-a3b preset"),
    CorpusEntry("swift_qwen3_moe_offload.sh", "ms-swift command",
                why="nothing added: NPROC_PER_NODE=4 on one node; the model is the qwen3-30b-a3b preset"),
    CorpusEntry("verl_qwen3moe_30b_megatron.sh", "verl Megatron trainer", gpu="H20",
                why="NNODES 1 x NGPUS_PER_NODES 8 (the script's defaults); the model is "
                    "actor_rollout_ref.model.path Qwen/Qwen3-30B-A3B-Base, the qwen3-30b-a3b preset; "
                    "the GPU is the header's ('tested in NNODES=1~4 * 96G H20 GPU')"),
    CorpusEntry("primus_qwen3_30b_a3b.yaml", "Primus experiment", world_size=8, vocab_size=151936,
                gpu="MI300X",
                why="examples/megatron/configs/MI300X: one MI300X node of 8 (EP 8); the tokenizer "
                    "Qwen/Qwen3-30B-A3B's vocabulary (the qwen3-30b-a3b preset's)"),
    CorpusEntry("mindspeed_qwen3_30b_a3b.sh", "MindSpeed-LLM launch",
                why="nothing added: torchrun 2 nodes x 8 NPUs, --padded-vocab-size 151936"),
    CorpusEntry("mindspeed_deepseek3_671b.sh", "MindSpeed-LLM launch",
                why="nothing added: torchrun 64 nodes x 8 NPUs, --vocab-size 129280"),
    CorpusEntry("pai_qwen3.sh", "shell launch script",
                sets={**_positional(["dlc", "A3B", "1", "8", "1e-5", "1e-6", "128", "128", "bf16", "4", "2",
                                     "1", "1", "4", "true", "true", "true", "false", "sel", "false", "100000",
                                     "/data", "/data", "/ckpt", "10000", "100", "/out"]),
                      "WORLD_SIZE": "1", "RANK": "0", "KUBERNETES_CONTAINER_RESOURCE_GPU": "8"},
                why=PAI_README.format(model="qwen3") + "; one dlc node of 8 (its --padded-vocab-size "
                "gives the vocabulary)"),
    CorpusEntry("pai_qwen3_next.sh", "shell launch script",
                sets={**_positional(["dsw", "A3B", "1", "8", "1e-5", "1e-6", "1024", "1024", "bf16", "1", "1",
                                     "1", "1", "8", "true", "true", "false", "false", "none", "false",
                                     "100000", "/data", "/data", "/ckpt", "1000000000", "10000", "/out"]),
                      "GPUS_PER_NODE": "8"},
                why=PAI_README.format(model="qwen3_next") + " (continued pretraining); dsw is one node "
                "whose GPU count the script asks torch for: 8"),
    # Out of sample: added after the import was written (each found an import bug, fixed since).
    CorpusEntry("slime_qwen3.5_35b_a3b_sft.sh", "slime launch",
                why="nothing added: 1 actor node x 8; the sourced models/qwen3.5-35B-A3B.sh gives the model, "
                    "its plugin spec the gated DeltaNet layers"),
    CorpusEntry("slime_minimax_m2.sh", "slime launch",
                why="nothing added: 16 actor nodes x 8; the sourced models/minimax-m2.sh gives the model"),
    CorpusEntry("slime_glm5_744b_a40b.sh", "slime launch",
                why="nothing added: the sourced models/glm5-744B-A40B.sh gives the model, its plugin spec "
                    "DSA"),
    CorpusEntry("mindspeed_qwen3_next_80b.sh", "MindSpeed-LLM launch", sets=MINDSPEED_PATHS,
                why=MINDSPEED_FILLED),
    CorpusEntry("mindspeed_glm45_air_106b.sh", "MindSpeed-LLM launch", sets=MINDSPEED_PATHS,
                why=MINDSPEED_FILLED),
    CorpusEntry("mindspeed_qwen3_235b_a22b.sh", "MindSpeed-LLM launch", sets=MINDSPEED_PATHS,
                why=MINDSPEED_FILLED),
    CorpusEntry("mindspeed_deepseek2_lite_16b.sh", "MindSpeed-LLM launch", sets=MINDSPEED_PATHS,
                why=MINDSPEED_FILLED),
    CorpusEntry("pai_deepseek_v2_lite.sh", "shell launch script",
                sets={**_positional(["dsw", "A2.4B", "1", "8", "1e-5", "1e-6", "1024", "1024", "bf16", "1",
                                     "4", "1", "2", "true", "true", "true", "false", "sel", "false", "100000",
                                     "/data", "/data", "/ckpt", "1000000000", "10000", "/out"]),
                      "MP_PP0_LAYERS": "6", "GPUS_PER_NODE": "8"},
                vocab_size=102400, why=PAI_README.format(model="deepseek_v2") + " with MP_PP0_LAYERS=6; dsw: "
                "one node of 8; DeepSeek-V2-Lite config.json vocab_size 102400"),
    CorpusEntry("pai_moonlight.sh", "shell launch script",
                sets={**_positional(["dsw", "A3B", "1", "8", "1e-5", "1e-6", "1024", "1024", "bf16", "1", "1",
                                     "1", "1", "8", "true", "true", "false", "none", "false", "100000",
                                     "/data", "/data", "/ckpt", "1000000000", "10000", "/out"]),
                      "GPUS_PER_NODE": "8"},
                vocab_size=163840, why=PAI_README.format(model="moonlight") + " less its 17th value: the "
                "README still passes a flash-attention switch the script no longer reads, which shifts "
                "every later value (--optimizer-offload-fraction none: ARG005, as Megatron refuses it); "
                "Moonlight's config.json vocab_size 163840"),
    CorpusEntry("swift_qwen3_30b_a3b_pp2.sh", "ms-swift command",
                why="nothing added: NPROC_PER_NODE=8 on one node; --model Qwen/Qwen3-30B-A3B-Instruct-2507 "
                    "is the qwen3-30b-a3b preset"),
    CorpusEntry("swift_qwen3_235b_lora.sh", "ms-swift command",
                why="nothing added: NPROC_PER_NODE=8; the qwen3-235b-a22b preset"),
    CorpusEntry("primus_gpt_oss_20b.yaml", "Primus experiment", world_size=8, vocab_size=201088, gpu="MI300X",
                why="examples/megatron/configs/MI300X: one MI300X node of 8; gpt-oss's o200k_harmony "
                    "vocabulary (openai/gpt-oss-20b config.json vocab_size 201088)"),
    CorpusEntry("mlm_ft_tp2_pp1_a2a_ovlp_8experts_etp1_ep4.yaml", FUNCTIONAL_TEST,
                world_size=FUNCTIONAL_TEST_WORLD, vocab_size=GPT2_VOCABULARY,
                why="tests/test_utils/recipes/h100/moe.yaml: nodes 1, gpus 8; GPT-2 BPE vocabulary"),
    CorpusEntry("mlm_ft_tp2_pp2_ep4_etp1_fine_grained_offloading.yaml", FUNCTIONAL_TEST,
                world_size=FUNCTIONAL_TEST_WORLD, vocab_size=GPT2_VOCABULARY,
                why="tests/test_utils/recipes/h100/moe.yaml: nodes 1, gpus 8; GPT-2 BPE vocabulary"),
    CorpusEntry("verl_deepseek671b_megatron_80gb.sh", "verl Megatron trainer",
                sets={"LLM": "deepseek-ai/DeepSeek-V3"},
                why="the script's LLM=\"<path_to_dsv3_config>\" placeholder set to the checkpoint it names "
                    "(the deepseek-v3 preset); NODES and GPUs from the script"),
)


MIXTRAL_VOCABULARY = 32000


def tokenizer_folder(root: Path) -> Path:
    """A local Hugging Face folder standing for the Mixtral tokenizer the script's $2 names."""
    folder = root / "mixtral-tokenizer"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"vocab_size": MIXTRAL_VOCABULARY}))
    return folder


@cache
def imported_once(name: str) -> tuple[Imported, FrontEnd]:
    """`import_entry` of a corpus entry, once per test run (the corpus tests and the shared Megatron
    run read it without changing it); its tokenizer folder in a folder of its own."""
    import tempfile

    return import_entry(BY_NAME[name], Path(tempfile.mkdtemp(prefix="moeplan-corpus-")))


def import_entry(entry: CorpusEntry, root: Path) -> tuple[Imported, FrontEnd]:
    """The entry imported as a user would: the file, its `--set`s and world size, the vocabulary
    the note asks for and the arguments its harness appends."""
    sets = {name: value.replace("{tokenizer_folder}", str(tokenizer_folder(root)))
            for name, value in entry.sets.items()}
    front = front_end((FILES / entry.name).read_text(encoding="utf-8"), sets, FILES)
    front.argv += list(entry.appended)
    if entry.vocab_size is not None:
        front.argv += ["--vocab-size", str(entry.vocab_size)]
    result = assemble(front, entry.world_size)
    if entry.gpu is not None:
        result.set("cluster.gpu", entry.gpu)
    return result, front


# Flags whose only check in Megatron is that a kernel library is installed, which the probe machine
# lacks (it runs Megatron on CPU with stand-ins): the corpus judges the rest of the arguments.
ENVIRONMENT_ONLY = {
    "--moe-permute-fusion": "megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__ "
                            "asks for Transformer Engine's fused permutation kernels",
}


# Data and tokenizer arguments: the probe runs on mock data with the null tokenizer (DATA_ARGUMENTS),
# which takes the model's --vocab-size.
DATA_AND_TOKENIZER = {"--data-path", "--train-data-path", "--valid-data-path", "--test-data-path", "--split",
                      "--data-cache-path", "--tokenizer-type", "--tokenizer-model", "--vocab-file",
                      "--merge-file", "--data-args-path", "--per-split-data-args-path", "--mock-data"}


def without_environment_flags(argv: list[str]) -> list[str]:
    """The arguments the probe machine can judge: no kernel-library checks, no data or tokenizer
    (replaced by mock data), and only Megatron's own arguments — an entry script such as
    Pai-Megatron-Patch's pretrain_qwen.py adds its own parser's (--patch-tokenizer-type, …)."""
    from planner.config.importers.megatron_args import parse_command
    from planner.config.megatron_names import megatron_arguments

    known = megatron_arguments()
    return [w for a in parse_command(argv).arguments
            if a.flag not in ENVIRONMENT_ONLY and a.flag not in DATA_AND_TOKENIZER
            and a.flag.removeprefix("--").replace("-", "_") in known for w in a.words]


def known_arguments(argv: list[str]) -> list[str]:
    """The arguments whose values the file gives (those holding an unknown `${NAME}` left out)."""
    from planner.config.importers.megatron_args import parse_command

    return [w for a in parse_command(argv).arguments if not any("${" in v for v in a.values) for w in a.words]


def megatron_request(name: str, result: Imported, front: FrontEnd, cfg: Config | None) -> CheckRequest:
    """What Megatron is asked to judge: the arguments `emit megatron` writes for the imported config,
    its launch.megatron_extra_args included (those with a value the file leaves unknown left out);
    where the config has no stage split to emit (moeplan refuses it), the file's own arguments
    (those whose value the file leaves unknown left out)."""
    from planner.emit.megatron import megatron_arguments
    from planner.emit.safety import EmitError

    if cfg is not None and cfg.model.qk_layernorm_per_layer:
        # a norm Megatron has no spelling for (MiniMax-M2's over all heads, a launcher's own layer
        # spec): Megatron judges the launch with its per-head norms, the same layout and sizes
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"qk_layernorm_per_layer": False})})
    if cfg is not None:
        try:
            plain = request_for(cfg, name)
            passthrough = known_arguments(list(megatron_arguments(cfg).extra))
            flags = plain.argv[:len(plain.argv) - len(DATA_ARGUMENTS)]
            return CheckRequest(name, plain.entry, [*without_environment_flags(flags + passthrough),
                                                    *DATA_ARGUMENTS], plain.env, plain.world_size)
        except EmitError:
            pass
    known = known_arguments(front.argv)
    world = result.get("parallel.world_size") or 1
    return CheckRequest(name, front.entry or "pretrain_gpt.py",
                        [*without_environment_flags(known), *DATA_ARGUMENTS], dict(front.env), world)


BY_NAME = {entry.name: entry for entry in CORPUS}

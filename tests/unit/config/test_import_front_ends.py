"""`moeplan import megatron` front ends: the input form detected and named; a shell launch script
read statically (assignments, export, defaults, arrays, continuations, arithmetic, if/case, eval)
and what it leaves unknown named with `--set NAME=VALUE`; launcher facts (torchrun, srun, mpirun,
#SBATCH) as world size and `cluster:`; YAML argument maps; the vocabulary from a tokenizer folder or
a preset's suggestion; the written YAML loads back. Expected values are written out by hand from
the bash semantics and the launchers' documented options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app
from planner.commands.import_ import config_yaml
from planner.config.importers.launch_facts import launch_facts
from planner.config.importers.shell_script import launch_command, read_script
from planner.config.importers.sources import NotAnImport, detect_form, import_text
from planner.config.loader import parse_config, parse_yaml
from tests.support.paths import EXAMPLES

runner = CliRunner()
MODEL = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --num-experts 8 --moe-router-topk 2 "
         "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 16")


def words_of(script: str, sets: dict[str, str] | None = None) -> list[str]:
    command = launch_command(read_script(script, sets))
    assert command is not None
    return command.words


def test_assignments_defaults_arrays_and_continuations() -> None:
    script = r"""#!/bin/bash
export TP=${TP:-2}            # a default
EP="${EP-4}"
NAME=run-$TP
ARGS=(
    --tensor-model-parallel-size $TP   # comment inside an array
    --expert-model-parallel-size "${EP}"
)
ARGS+=(--lr 1e-4)
MORE="--min-lr 1e-5 \
      --save /ckpt/$NAME"
LAYERS=$(( 2 * (TP + 1) ))
torchrun --nproc-per-node 8 pretrain_gpt.py "${ARGS[@]}" $MORE --num-layers $LAYERS \
    --empty "" ${UNSET_OK:+--x}
"""
    assert words_of(script) == ["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py",
                                "--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "4",
                                "--lr", "1e-4", "--min-lr", "1e-5", "--save", "/ckpt/run-2",
                                "--num-layers", "6", "--empty", ""]
    assert words_of(script, {"TP": "4"})[5] == "4"  # --set wins over the script's own value


def test_if_case_and_eval() -> None:
    script = """
SIZE=$1
if [ "$SIZE" = small ]; then
    LAYERS=2
elif [[ $SIZE == big ]]; then
    LAYERS=64
else
    LAYERS=8
fi
case $SIZE in
    small|tiny) HEADS=4 ;;
    *) HEADS=32 ;;
esac
if [ -z "$NOT_SET_ANYWHERE" ] && [ $LAYERS -gt 1 ]; then EXTRA="--swiglu"; fi
CMD="python pretrain_gpt.py --num-layers $LAYERS --num-attention-heads $HEADS $EXTRA"
eval $CMD
"""
    assert words_of(script, {"1": "small"})[2:] == ["--num-layers", "2", "--num-attention-heads", "4",
                                                    "--swiglu"]
    assert words_of(script, {"1": "big"})[2:6] == ["--num-layers", "64", "--num-attention-heads", "32"]
    read = read_script(script)  # $1 unknown: every branch read, and LAYERS set differently is named
    assert set(read.deciders) >= {"SIZE"} and "LAYERS" in read.conflicts


def test_unknown_values_are_named_with_the_set_fix() -> None:
    script = f"""
CKPT=$1
HOST=$(hostname)
torchrun --nnodes $NNODES --nproc-per-node 8 pretrain_gpt.py {MODEL} --vocab-size 1000 \\
    --tensor-model-parallel-size $TP --save $CKPT --tensorboard-dir /tb/$HOST
"""
    result, front = import_text(script, world_size=8)
    rows = {u.argument: u for u in result.unmapped}
    assert rows["$TP"].error and "--set TP=VALUE" in rows["$TP"].why  # a modelled argument: an error
    assert "parallel.tp" not in {f"parallel.{k}" for k in result.data["parallel"]}
    assert not rows["$CKPT"].error and "positional argument $1" in rows["$CKPT"].why
    assert "$(hostname)" in rows["$HOST"].why and not rows["$HOST"].error
    assert ("torchrun --nnodes", "${NNODES}") in front.facts.not_numbers
    fixed, _ = import_text(script, {"TP": "2", "NNODES": "1", "1": "/ckpt"})
    assert fixed.data["parallel"]["tp"] == 2 and fixed.data["parallel"]["world_size"] == 8
    assert not [u for u in fixed.unmapped if u.error]


@pytest.mark.parametrize(("launcher", "sbatch", "expected"), [
    ("torchrun --nnodes=2 --nproc_per_node=8", {}, (2, 8, 16)),
    ("python -m torch.distributed.run --nproc-per-node 4", {}, (1, 4, 4)),
    ("srun -N 4 --ntasks-per-node=8 python", {}, (4, 8, 32)),
    ("srun -n 16 python", {"nodes": "2"}, (2, 8, 16)),
    ("mpirun -np 16 -npernode 8 python", {}, (2, 8, 16)),
    ("mpirun -n 8 --map-by ppr:4:node python", {}, (2, 4, 8)),
    ("srun torchrun --nnodes $SLURM_NNODES --nproc-per-node 8", {"nodes": "4"}, (4, 8, 32)),
    ("python", {}, (1, 1, 1)),
    ("", {"nodes": "2", "gpus-per-node": "8"}, (2, 8, 16)),
])
def test_launch_facts(launcher: str, sbatch: dict[str, str], expected: tuple[int, int, int]) -> None:
    facts = launch_facts(launcher.split(), sbatch)
    assert (facts.nodes, facts.per_node, facts.world_size) == expected


def test_sbatch_lines_give_the_cluster() -> None:
    script = f"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
srun python pretrain_gpt.py {MODEL} --vocab-size 1000
"""
    result, front = import_text(script)
    assert front.described.startswith("shell launch script (srun: 16 rank(s)")
    assert result.data["cluster"] == {"nodes": 2, "gpus_per_node": 8}
    assert result.data["parallel"]["world_size"] == 16


MAP_LINES = "\n".join(f"  {flag}: {value}" for flag, value in zip(MODEL.split()[::2], MODEL.split()[1::2],
                                                                   strict=True))


def test_yaml_argument_maps() -> None:
    text = f"""
ENV_VARS:
  CUDA_DEVICE_MAX_CONNECTIONS: 1
MODEL_ARGS:
{MAP_LINES}
  --vocab-size: 1000
  --moe-grouped-gemm: true
  --moe-router-pre-softmax: false
  --tensor-model-parallel-size: ${{TP}}
  --min-lr: 1e-6
TEST_TYPE: regular
"""
    assert detect_form(text) == "map"
    result, front = import_text(text, {"TP": "2"}, world_size=8)
    assert front.form == "YAML argument map (MODEL_ARGS of a Megatron-LM functional test)"
    assert result.data["moe"]["moe_grouped_gemm"] is True and result.data["parallel"]["tp"] == 2
    assert "moe_router_pre_softmax" not in result.data["model"]  # false: the flag is left out
    assert result.data["launch"]["env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert result.data["launch"]["megatron_extra_args"] == ["--min-lr", "1e-6"]
    written, _, _ = parse_yaml(config_yaml(result.data, []))
    assert written == result.data  # '1e-6' is written quoted, so it loads back as the string
    parse_config(written)


def test_a_moeplan_config_or_an_unknown_script_is_refused_with_why() -> None:
    with pytest.raises(NotAnImport, match="moeplan check"):
        import_text("model: {preset: deepseek-v3}\nparallel: {world_size: 8}\n")
    with pytest.raises(NotAnImport, match="it runs bash ./sbatch_benchmarking.sh"):
        import_text("TP=2 PP=8 bash ./sbatch_benchmarking.sh --recompute-granularity selective\nexport A=1\n")


def test_argument_snippets_without_a_launch() -> None:
    result, front = import_text(f'MODEL_ARGS=" {MODEL} --vocab-size 1000 "\n', world_size=2)
    assert front.form == "shell argument snippet, no launch command (MODEL_ARGS)"
    assert result.data["model"]["num_layers"] == 4


def test_vocabulary_from_a_tokenizer_folder_or_a_preset_suggestion(tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps({
        "model": {"vocab": {"a": 0, "b": 1, "c": 2}}, "added_tokens": [{"id": 2}, {"id": 3}]}))
    (folder / "config.json").write_text(json.dumps({"vocab_size": 128}))
    line = f"pretrain_gpt.py {MODEL} --tokenizer-type HuggingFaceTokenizer --tokenizer-model tok"
    result, _ = import_text(line, world_size=2, origin=tmp_path)  # relative to the launch file
    assert result.data["model"]["vocab_size"] == 4  # len(tokenizer): vocabulary plus added tokens
    (folder / "tokenizer.json").unlink()
    assert import_text(line, world_size=2, origin=tmp_path)[0].data["model"]["vocab_size"] == 128
    named, _ = import_text(line.replace(" tok", " Qwen/Qwen3-30B-A3B"), world_size=2)
    [row] = [u for u in named.unmapped if u.argument == "--vocab-size"]
    assert "model.vocab_size" in row.why and "qwen3-30b-a3b preset's vocabulary is 151936" in row.why
    padded, _ = import_text(f"pretrain_gpt.py {MODEL} --padded-vocab-size 1024", world_size=2)
    assert (padded.data["model"]["vocab_size"], parse_config(padded.data).padded_vocab_size) == (1024, 1024)


def test_cli_names_the_form_and_prints_check_findings_at_once(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/bash\nTP=${{TP:-2}}\ntorchrun --nproc-per-node 8 pretrain_gpt.py {MODEL} "
                      "--vocab-size 1000 --tensor-model-parallel-size $TP --pipeline-model-parallel-size 3\n")
    out = tmp_path / "job.yaml"
    result = runner.invoke(app, ["import", "megatron", str(script), "-o", str(out), "--set", "TP=4"])
    assert result.exit_code == 1, result.output  # 4 layers on 3 stages: check's PIP001, printed here
    assert "as: shell launch script (torchrun: 8 rank(s)" in result.output
    assert "PIP001" in result.output
    data = yaml.safe_load(out.read_text())
    assert data["parallel"]["tp"] == 4 and data["cluster"] == {"nodes": 1, "gpus_per_node": 8}
    bad = runner.invoke(app, ["import", "megatron", str(script), "--set", "TP"])
    assert bad.exit_code == 2 and "expected NAME=VALUE" in bad.output


EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml")) + sorted((EXAMPLES / "warnings").glob("*.yaml"))


@pytest.mark.parametrize("config", EXAMPLE_FILES, ids=lambda p: p.name)
def test_every_example_imports_the_same_through_the_front_end(config: Path) -> None:
    """The argument-file front end gives what the mapping alone gives (the round trip of
    test_import_megatron.py), and its YAML loads back as written."""
    import shlex

    from planner.config.importers.megatron_args import import_arguments
    from planner.config.loader import load_config
    from planner.emit.megatron import megatron_arguments

    cfg = load_config(config)
    args = megatron_arguments(cfg)
    nodes, world = cfg.cluster.nodes, cfg.parallel.world_size
    assert nodes is not None and world is not None
    words = [args.entry, *(w for flag in args.flags for w in (flag.flag, *flag.values)), *args.extra]
    text = f"torchrun --nnodes {nodes} --nproc-per-node {world // nodes} " + shlex.join(words)
    result, front = import_text(text)
    assert front.form == "argument file" and result.data == import_arguments(text).data
    written, _, _ = parse_yaml(config_yaml(result.data, []))
    assert written == result.data


def test_a_log_over_the_argument_cap_is_streamed_as_a_log(tmp_path: Path, monkeypatch) -> None:
    """A log is a log: a file over the `args` cap holding Megatron's argument dump is read line by
    line under the log cap (only its dump and derived lines kept) and imports as the dump alone
    does; a file over the cap without a dump is still refused by size (exit 2)."""
    from planner.config.importers.megatron_log import config_from_log
    from tests.support.megatron_logs import LOGGED, LOGS

    name = sorted(LOGGED)[0]
    text = (LOGS / name).read_text(encoding="utf-8")
    monkeypatch.setenv("MOEPLAN_MAX_BYTES_ARGS", str(len(text.encode()) + 100))
    noise = "".join(f" iteration {i:>6}/ 100000 | lm loss: 1.0E+00 | grad norm: 0.5 |\n" for i in range(3000))
    log = tmp_path / "train.log"
    log.write_text(text + noise, encoding="utf-8")
    out = tmp_path / "job.yaml"
    result = runner.invoke(app, ["import", "megatron", str(log), "-o", str(out)])
    assert "as: Megatron training log" in result.output, result.output
    assert yaml.safe_load(out.read_text())["model"] == config_from_log(text, name)[0]["model"]
    plain = tmp_path / "args.txt"
    plain.write_text("--num-layers 4 " * 20_000, encoding="utf-8")
    refused = runner.invoke(app, ["import", "megatron", str(plain)])
    assert refused.exit_code == 2 and "MOEPLAN_MAX_BYTES_ARGS" in refused.output, refused.output


@pytest.mark.parametrize(("image", "version", "noted"), [
    ("nvcr.io/nvidia/nemo:25.09", "25.09-alpha", False),  # a NeMo container ships its Megatron-LM
    ("nvcr.io/nvidia/nemo:25.07", "nvcr.io/nvidia/nemo:25.07", False),  # unplaceable: kept for VER001
    ("nvcr.io/nvidia/pytorch:25.09-py3", None, True),  # a PyTorch base names no Megatron-LM
])
def test_container_image_gives_the_megatron_version(image: str, version: str | None, noted: bool) -> None:
    script = f"#!/bin/bash\n#SBATCH --nodes=1\nIMAGE={image}\n" \
             f"srun --container-image=$IMAGE --ntasks-per-node=8 python pretrain_gpt.py {MODEL}\n"
    result, front = import_text(script)
    assert front.facts.container_image == image
    assert result.get("megatron.version") == version if version else not result.has("megatron.version")
    assert any(u.argument == "--container-image" for u in result.unmapped) is noted


@pytest.mark.parametrize(("flags", "freq"), [
    ([1, 1, 1, 0] * 12, 4),  # Qwen3-Next: every 4th layer attention
    ([1, 0] * 3, 2),
    ([1, 1, 0, 1], [1, 1, 0, 1]),  # irregular: Megatron's list form
    ([1, 1, 1], [1, 1, 1]),  # no attention layer at all
])
def test_pai_pattern_to_linear_attention_freq(flags: list[int], freq: int | list[int]) -> None:
    from planner.config.importers.pai import linear_attention_freq
    assert linear_attention_freq(flags) == freq


def test_pai_pattern_not_in_pairs_is_refused_by_name() -> None:
    from planner.config.importers.pai import qwen3_next_words
    words = ["--num-layers", "3", "--hybrid-override-pattern", "MM-", "--is-hybrid-model"]
    out, [note] = qwen3_next_words("examples/qwen3_next/pretrain_qwen3_next.py", words)
    assert out == words and note.error and note.argument == "--hybrid-override-pattern"
    assert qwen3_next_words("pretrain_gpt.py", words) == (words, [])


def test_array_expanded_inside_a_quoted_assignment_keeps_every_element() -> None:
    # Pai-Megatron-Patch examples/qwen3_next/run_mcore_qwen3_lite.sh: cmd="torchrun ${ARGS[@]} …";
    # eval $cmd. In an assignment bash joins the elements with spaces (no fields are made there).
    script = ('A=(--nproc-per-node 8 --nnodes 1)\n'
              'cmd="torchrun ${A[@]} pretrain_gpt.py \\\n --num-layers 2"\neval $cmd\n')
    assert words_of(script) == ["torchrun", "--nproc-per-node", "8", "--nnodes", "1", "pretrain_gpt.py",
                                "--num-layers", "2"]

"""`moeplan import megatron`: emit → import gives back every example config; a hand-written
DeepSeek-V3 launch line imports with its data/tokenizer/LR arguments reported and kept; bad input
is exit 2 (unreadable) or a finding naming the argument (exit 1), never a traceback."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.cli import app
from planner.config.hybrid_pattern import read_hybrid_pattern
from planner.config.importers.megatron_args import (
    import_arguments,
    map_arguments,
    moe_layer_freq,
    parse_value,
)
from planner.config.layout_strings import IMPORTED
from planner.config.layout_strings import layout_string as write_layout_string
from planner.config.loader import load_config, parse_config
from planner.config.schema import Config
from tests.support.megatron_snippet import SnippetFailed, snippet_json
from tests.support.paths import EXAMPLES


def layout_string(segments: list[int], mtp: int) -> str:
    """The layout as `moeplan import megatron` spells it."""
    return write_layout_string(segments, mtp, IMPORTED)


runner = CliRunner()
ROUND_TRIP_EXAMPLES = sorted(EXAMPLES.glob("*.yaml")) + sorted((EXAMPLES / "warnings").glob("*.yaml"))

# Fields no Megatron argument carries, so `emit megatron` cannot pass them and an import cannot
# recover them; the round trip compares everything else.
NOT_EMITTED = {
    "model.preset": "a preset name; the emitter passes the preset's resolved fields, which are compared",
    "moe.moe_tid2eid_source": "where moeplan's runtime takes the hash-routing table from; no Megatron "
                              "argument",
    "parallel.embedding_ranks_rule": "which embedding-rank convention moeplan models; no Megatron argument",
    "cluster.gpu_memory_gib": "hardware, not a Megatron argument",
    "cluster.intra_node_bandwidth_gb_s": "hardware, not a Megatron argument",
    "cluster.inter_node_bandwidth_gb_s": "hardware, not a Megatron argument",
    "launch": "job name, Slurm and runtime settings of moeplan's launchers, not Megatron arguments",
    "ignore": "moeplan's rule suppressions",
}
# Not emitted for DeepSeek-V4 attention: Megatron's dsv4_hybrid attention reads neither
# (Megatron-LM dev@d48bd6be megatron/core/transformer/experimental_attention_variant/
# deepseek_v4_hybrid_attention.py uses one shared KV head and no kv_lora_rank).
NOT_EMITTED_DSV4 = {"model.kv_lora_rank", "model.num_query_groups"}


def _drop(dump: dict[str, Any], dotted: str) -> None:
    section, _, name = dotted.partition(".")
    if not name:
        dump.pop(section, None)
    else:
        dump.get(section, {}).pop(name, None)


def comparable(cfg: Config, original: Config) -> dict[str, Any]:
    """The resolved config minus what is not emitted by design; fields the emitter fills with
    Megatron's required value when the YAML leaves them unset are compared as resolved values."""
    dump = cfg.model_dump()
    for dotted in NOT_EMITTED:
        _drop(dump, dotted)
    if original.model.attention_variant == "dsv4_hybrid":
        for dotted in NOT_EMITTED_DSV4:
            _drop(dump, dotted)
    if original.model.max_position_embeddings is None:  # emitted as seq_length, which Megatron needs
        _drop(dump, "model.max_position_embeddings")
    dump["training"]["global_batch_size"] = cfg.global_batch_size  # emitted resolved
    return dump


def emitted_command(config: Path, tmp_path: Path) -> str:
    """`moeplan emit megatron` → `bash megatron_args.sh` (entry, then one argument a line), run
    the way its header suggests: torchrun with the plan's nodes and ranks per node in front."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["emit", "megatron", str(config), "-o", str(out)])
    assert result.exit_code == 0, result.output
    printed = subprocess.run(["bash", str(out / "megatron_args.sh")], capture_output=True, text=True,
                             check=True).stdout
    cfg = load_config(config)
    nodes = cfg.cluster.nodes
    assert nodes is not None and cfg.parallel.world_size is not None
    per_node = cfg.parallel.world_size // nodes
    return f"torchrun --nnodes {nodes} --nproc-per-node {per_node} \\\n" + printed.replace("\n", " \\\n")


@pytest.mark.parametrize("config", ROUND_TRIP_EXAMPLES, ids=lambda p: p.name)
def test_round_trip_gives_back_every_example(config: Path, tmp_path: Path) -> None:
    original = load_config(config)
    imported = import_arguments(emitted_command(config, tmp_path))
    # Only the example's own launch.megatron_extra_args are left over, kept there again.
    assert all("megatron_extra_args" in u.why and not u.error for u in imported.unmapped), imported.unmapped
    back = parse_config(imported.data)
    assert comparable(back, original) == comparable(original, original)


def test_round_trip_through_the_cli(tmp_path: Path) -> None:
    """The same through `moeplan import megatron -o`: exit 0, the YAML loads as the example."""
    config = EXAMPLES / "tiny-cpu-8.yaml"
    source = tmp_path / "args.txt"
    source.write_text(emitted_command(config, tmp_path))
    out = tmp_path / "job.yaml"
    result = runner.invoke(app, ["import", "megatron", str(source), "-o", str(out)])
    assert result.exit_code == 0, result.output
    original = load_config(config)
    assert comparable(load_config(out), original) == comparable(original, original)


def test_round_trip_of_the_defaults_the_schema_fills_in(tmp_path: Path) -> None:
    """Flex without a backend and FP8 without a recipe: the emitter passes Megatron's defaults
    (deepep, delayed) that the schema filled in, and the import gives the same config back."""
    data = yaml.safe_load((EXAMPLES / "tiny-cpu-8.yaml").read_text())
    data.setdefault("moe", {})["moe_token_dispatcher_type"] = "flex"
    data["training"]["fp8"] = True
    config = tmp_path / "flex-fp8.yaml"
    config.write_text(yaml.safe_dump(data))
    command = emitted_command(config, tmp_path)
    words = command.replace("\\\n", "").split()
    for flag, value in (("--moe-flex-dispatcher-backend", "deepep"), ("--fp8-recipe", "delayed")):
        assert words[words.index(flag) + 1] == value
    original = load_config(config)
    back = parse_config(import_arguments(command).data)
    assert comparable(back, original) == comparable(original, original)


# ------------------------------------------------------------------------------ DeepSeek-V3
# As people launch it: env, torchrun, the entry script, one or many arguments a line, comments,
# data / tokenizer / LR-schedule / checkpoint arguments mixed in. Dims from the DeepSeek-V3 model card
# and config.json (61 layers, 3 dense, 256 routed experts top-8, MLA 1536/512/128+64/128).
V3_LINE = r"""
# DeepSeek-V3 on 64 nodes x 8 GPUs
CUDA_DEVICE_MAX_CONNECTIONS=1 NCCL_DEBUG=WARN torchrun --nnodes 64 --nproc-per-node 8 \
    --rdzv-backend c10d --rdzv-endpoint "$HEAD_NODE:29500" \
    "$MEGATRON_LM/pretrain_gpt.py" \
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 \
    --expert-model-parallel-size 64 --expert-tensor-parallel-size 1 \
    --sequence-parallel --use-distributed-optimizer \
    --pipeline-model-parallel-layout "Et*7|(t*8|)*6t*6mL" \
    --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 \
    --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 \
    --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 \
    --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --disable-bias-linear \
    --untie-embeddings-and-output-weights --position-embedding-type rope \
    --rotary-base 10000 --rotary-scaling-factor 40 --original-max-position-embeddings 4096 \
    --num-experts 256 --moe-layer-freq "([0]*3+[1]*58)" \
    --moe-ffn-hidden-size 2048 --moe-shared-expert-intermediate-size 2048 \
    --moe-router-topk 8 --moe-router-score-function sigmoid --moe-router-topk-scaling-factor 2.5 \
    --moe-router-enable-expert-bias --moe-router-num-groups 8 --moe-router-group-topk 4 \
    --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4 --moe-router-dtype fp32 \
    --moe-grouped-gemm --moe-token-dispatcher-type alltoall --moe-permute-fusion \
    --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1 \
    --seq-length 4096 --max-position-embeddings 163840 --micro-batch-size 1 --global-batch-size 8192 \
    --lr 2.2e-4 --min-lr 2.2e-5 --lr-decay-style cosine --lr-warmup-iters 2000 --train-iters 500000 \
    --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0 --bf16 \
    --data-path "$DATA/v3_text_document" --split 99,1,0 \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model deepseek-ai/DeepSeek-V3 \
    --save "$CKPT" --load "$CKPT" --save-interval 1000 --log-interval 1 \
    --recompute-granularity selective --recompute-modules mla_up_proj moe_act
"""
# What the data / tokenizer / schedule / checkpoint part must leave verbatim.
V3_NOT_MODELLED = [
    "--min-lr", "2.2e-5", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2000", "--train-iters",
    "500000", "--clip-grad", "1.0", "--data-path", "$DATA/v3_text_document", "--split", "99,1,0",
    "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "deepseek-ai/DeepSeek-V3",
    "--save", "$CKPT", "--load", "$CKPT", "--save-interval", "1000", "--log-interval", "1",
]
# Model fields of the V3 line that only Megatron's names spell (EXPLICIT), read from it by name.
V3_NEW_FIELDS = {
    "multi_latent_attention": True, "qk_head_dim": 128, "v_head_dim": 128, "normalization": "RMSNorm",
    "swiglu": True, "moe_router_dtype": "fp32",
}


def test_v3_launch_line_maps_every_modelled_argument() -> None:
    mapped = map_arguments(V3_LINE)
    assert mapped.entry == "pretrain_gpt.py"
    assert mapped.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_DEBUG": "WARN"}
    model = mapped.data["model"]
    assert {k: model[k] for k in V3_NEW_FIELDS} == V3_NEW_FIELDS
    assert model["attention_variant"] == "mla"
    assert (model["q_lora_rank"], model["kv_lora_rank"], model["qk_pos_emb_head_dim"]) == (1536, 512, 64)
    assert model["moe_layer_freq"] == [0, 0, 0] + [1] * 58  # 3 dense, then 58 MoE: 61 layers
    assert (model["num_experts"], model["moe_router_topk"], model["num_layers"]) == (256, 8, 61)
    assert model["add_bias_linear"] is False and model["norm_epsilon"] == 1e-6
    assert (model["moe_router_num_groups"], model["moe_router_group_topk"]) == (8, 4)
    par = mapped.data["parallel"]
    # torchrun: 64 nodes x 8 processes = 512 ranks
    assert (par["world_size"], par["tp"], par["pp"], par["ep"], par["etp"]) == (512, 2, 8, 64, 1)
    assert par["sequence_parallel"] is True
    assert par["pipeline_model_parallel_layout"] == "Et*7|(t*8|)*6t*6mL"
    assert mapped.data["cluster"] == {"nodes": 64, "gpus_per_node": 8}
    assert mapped.data["launch"]["env"] == mapped.env
    train = mapped.data["training"]
    assert (train["precision"], train["lr"], train["global_batch_size"]) == ("bf16", 2.2e-4, 8192)
    assert mapped.data["moe"]["moe_router_load_balancing_type"] == "seq_aux_loss"
    assert mapped.data["overlap"]["recompute_modules"] == ["mla_up_proj", "moe_act"]
    assert mapped.extra_args == V3_NOT_MODELLED
    assert {u.argument for u in mapped.unmapped} == {w for w in V3_NOT_MODELLED if w.startswith("--")}
    assert all(u.why.startswith("not modelled") and not u.error for u in mapped.unmapped)


def test_v3_launch_line_loads_completely() -> None:
    """The line names no --vocab-size (the tokenizer gives it), so one is added; the rest loads,
    the arguments moeplan does not model kept verbatim."""
    result = import_arguments(V3_LINE)
    result.data["model"]["vocab_size"] = 129280
    cfg = parse_config(result.data)
    assert cfg.launch.megatron_extra_args == V3_NOT_MODELLED
    assert all(getattr(cfg.model, k) == v for k, v in V3_NEW_FIELDS.items())
    assert cfg.model.attention_variant == "mla" and cfg.dp == 32 and cfg.edp == 1  # 512/(2·8), 512/(64·8)


def test_v3_cli_reports_unmapped_and_findings_at_once(tmp_path: Path) -> None:
    source = tmp_path / "v3.sh"
    source.write_text(V3_LINE)
    out = tmp_path / "v3.yaml"
    result = runner.invoke(app, ["import", "megatron", str(source), "-o", str(out), "--json"])
    assert result.exit_code == 1, result.output  # model.vocab_size is missing
    payload = json.loads(result.stdout)
    assert payload["ok"] is False and payload["entry"] == "pretrain_gpt.py"
    assert any(f["path"] == "model.vocab_size" for f in payload["findings"])
    assert {"--tokenizer-model", "--lr-decay-style"} <= {u["argument"] for u in payload["unmapped"]}
    written = yaml.safe_load(out.read_text())  # written anyway, to be edited
    assert written["model"]["num_experts"] == 256


# ------------------------------------------------------------------------------ semantics
def test_megatron_defaults_fill_what_the_line_leaves_out() -> None:
    """No --bf16, no dispatcher, no --disable-bias-linear: Megatron's fp32, allgather, biases on
    (Megatron-LM dev@d48bd6be transformer_config.py TransformerConfig add_bias_linear default True)."""
    data = import_arguments("--num-layers 2 --hidden-size 8 --num-attention-heads 2 --vocab-size 64 "
                            "--num-experts 4 --seq-length 16", world_size=4).data
    assert data["training"]["precision"] == "fp32"
    assert data["moe"]["moe_token_dispatcher_type"] == "allgather"
    assert data["moe"]["moe_grouped_gemm"] is False
    assert data["model"]["add_bias_linear"] is True
    assert data["model"]["position_embedding_type"] == "learned_absolute"
    assert data["parallel"]["world_size"] == 4


def test_flags_negations_lists_and_equals_form() -> None:
    data = map_arguments("python pretrain_gpt.py --qk-layernorm --no-qk-layernorm "
                         "--recompute-modules=core_attn --hierarchical-context-parallel-sizes 2 4 "
                         "--use-tp-pp-dp-mapping --fp8-format hybrid "
                         "--no-gradient-accumulation-fusion").data
    assert data["model"]["qk_layernorm"] is False  # the later --no-* wins, as argparse's last store
    assert data["overlap"]["recompute_modules"] == ["core_attn"]
    assert data["parallel"]["hierarchical_context_parallel_sizes"] == [2, 4]
    assert data["parallel"]["order"] == "tp-cp-ep-pp-dp"
    assert data["training"]["fp8"] is True
    assert data["training"]["gradient_accumulation_fusion"] is False  # the --no- of an on default


def test_launcher_forms() -> None:
    """`python -m torch.distributed.run --nproc_per_node=4 --nnodes=2 entry.py`: 2 x 4 ranks; a
    shell variable as the node count cannot give a world size and is reported."""
    data = map_arguments("python -m torch.distributed.run --nproc_per_node=4 --nnodes=2 "
                         "train/pretrain_gpt.py --num-layers 2").data
    assert data["parallel"]["world_size"] == 8 and data["model"]["num_layers"] == 2
    mapped = map_arguments("torchrun --nnodes $NNODES --nproc-per-node 8 pretrain_gpt.py --num-layers 2")
    assert "world_size" not in mapped.data.get("parallel", {})
    assert [u.argument for u in mapped.unmapped] == ["--nnodes"]


def test_moe_layer_freq_spellings() -> None:
    assert parse_value("moe_freq", ("2",)) == 2
    # Megatron's own help example: "([1]*3+[0]*2)*2" → 3 MoE, 2 dense, twice
    assert parse_value("moe_freq", ("([1]*3+[0]*2)*2",)) == [1, 1, 1, 0, 0, 1, 1, 1, 0, 0]
    assert parse_value("moe_freq", ("[1,0,1]",)) == [1, 0, 1]
    assert moe_layer_freq([1, 0, 1, 0]) == 2 and moe_layer_freq([0, 1, 1]) == [0, 1, 1]


def test_window_attention_arguments_are_read_as_megatron_parses_them() -> None:
    """--window-size is megatron/training/arguments.py tuple_type ("127,0", parentheses allowed);
    --window-attn-skip-freq, --no-rope-freq and --linear-attention-freq are an int or a list
    expression (moe_freq_type, no_rope_freq_type, la_freq_type), as in examples/gptoss/02_train.sh."""
    data = import_arguments("--window-size 127,0 --window-attn-skip-freq 2 --no-rope-freq 4 "
                            "--linear-attention-freq '[1,1,1,0]'").data["model"]
    assert data["window_size"] == [127, 0] and data["window_attn_skip_freq"] == 2
    assert data["no_rope_freq"] == 4 and data["linear_attention_freq"] == [1, 1, 1, 0]
    assert parse_value("int_tuple", ("(128,0)",)) == [128, 0]


def test_hybrid_pattern_and_layout_inverse() -> None:
    decoded = read_hybrid_pattern("WEHE|CEC-|CECE/WE")
    # 6 decoder layers (W H | C C | C C) + 1 MTP (W); the 4th layer's MLP is dense ('-')
    assert decoded["compress_ratios"] == [0, 128, 4, 4, 4, 4, 0]
    assert decoded["moe"] == [1, 1, 1, 0, 1, 1] and decoded["mtp_num_layers"] == 1
    assert layout_string(decoded["segments"], 1) == "Et*2|t*2|t*2mL"
    assert layout_string([6, 8, 8, 8, 7], 1) == "Et*6|(t*8|)*3t*7mL"
    assert layout_string([1, 1], 0) == "Et|tL"


@given(st.lists(st.integers(1, 12), min_size=1, max_size=12), st.integers(0, 2))
def test_layout_string_expands_to_its_segments(segments: list[int], mtp: int) -> None:
    """Megatron's layout grammar (planner/config/layout_strings.py parse_layout) reads back the segments:
    embedding first, MTP and loss last, one decoder layer per `t`."""
    from planner.config.layout_strings import parse_layout

    stages = parse_layout(layout_string(segments, mtp))
    assert [stage.count("t") for stage in stages] == segments
    assert stages[0][0] == "E" and stages[-1][-1] == "L" and stages[-1].count("m") == mtp


@given(st.lists(st.sampled_from([0, 1]), min_size=1, max_size=40))
def test_moe_layer_freq_means_the_same_layers(pattern: list[int]) -> None:
    """Whatever spelling moe_layer_freq picks (every N-th, or the list), the MoE layers are the same."""
    freq = moe_layer_freq(pattern)
    moe = [layer % freq == 0 if isinstance(freq, int) else freq[layer] == 1 for layer in range(len(pattern))]
    assert moe == [bit == 1 for bit in pattern]
    assert parse_value("moe_freq", (str(pattern),)) == pattern


# ------------------------------------------------------------------------------ bad input
def test_unreadable_input_is_exit_2(tmp_path: Path) -> None:
    binary = tmp_path / "bin"
    binary.write_bytes(b"\x00\x01")
    quote = tmp_path / "quote"
    quote.write_text("--num-layers '2")
    for source in (tmp_path / "missing", tmp_path, binary, quote):
        result = runner.invoke(app, ["import", "megatron", str(source)])
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize(("argument", "value"), [
    ("--num-layers", "abc"), ("--moe-layer-freq", "__import__('os')"), ("--lr", "fast"),
    ("--hybrid-layer-pattern", "WEW"), ("--sequence-parallel", "yes"),
])
def test_malformed_value_names_the_argument(argument: str, value: str, tmp_path: Path) -> None:
    source = tmp_path / "args"
    source.write_text(f"--num-layers 2 --hidden-size 8 --num-attention-heads 2 --vocab-size 64 "
                      f"--num-experts 4 --seq-length 16 {argument} {value!r}\n")
    out = tmp_path / "job.yaml"
    result = runner.invoke(app, ["import", "megatron", str(source), "--world-size", "4", "-o", str(out),
                                 "--json"])
    assert result.exit_code == 1, result.output
    payload = json.loads(result.stdout)
    bad = [u for u in payload["unmapped"] if u["error"]]
    assert [u["argument"] for u in bad] == [argument] and "malformed value" in bad[0]["why"]


def test_hybrid_pattern_of_other_layers_is_not_modelled() -> None:
    """A Mamba stack reads as blocks (a mixer, then at most one MLP); a layer moeplan cannot pair
    (an MLP with no mixer before it, gated DeltaNet's G) is valid Megatron but not modelled."""
    mapped = map_arguments("pretrain_hybrid.py --hybrid-layer-pattern 'M*M-'")
    model = mapped.data["model"]
    assert (model["num_layers"], model["mamba_layers"], model["mixer_only_layers"]) == (
        3, [1, 0, 1], [1, 1, 0])
    for pattern in ("-M*E", "MGE"):
        mapped = map_arguments(f"pretrain_hybrid.py --hybrid-layer-pattern '{pattern}'")
        [bad] = mapped.unmapped
        assert bad.error and bad.why.startswith("not modelled:") and bad.argument == "--hybrid-layer-pattern"
    mapped = map_arguments("pretrain_hybrid.py --hybrid-layer-pattern WEHE --mtp-num-layers 1")
    assert mapped.data["model"]["mtp_num_layers"] == 1  # no '/' part: the flag stands
    assert mapped.data["model"]["num_layers"] == 2


def test_stdin_and_unwritable_output(tmp_path: Path) -> None:
    line = ("--num-layers 2 --hidden-size 8 --num-attention-heads 2 --vocab-size 64 --num-experts 4 "
            "--seq-length 16 --log-interval 1")
    result = runner.invoke(app, ["import", "megatron", "-", "--world-size", "4"], input=line)
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout.split("arguments not mapped")[0])["model"]["num_layers"] == 2
    target = tmp_path / "no-such-folder" / "job.yaml"
    result = runner.invoke(app, ["import", "megatron", "-", "--world-size", "4", "-o", str(target)],
                           input=line)
    assert result.exit_code == 2 and not target.parent.exists()


# ------------------------------------------------------------------------------ against Megatron
# Megatron's own parser, run in a subprocess on the oracle checkout (tests/support/megatron_snippet.py):
# for each argument, which attribute it sets and to what.
PARSER_PROBE = r"""
import argparse
from megatron.training import arguments
request = json.loads(sys.stdin.read())
parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
dests = {flag: action.dest for flag, action in parser._option_string_actions.items()}
out = []
for argv in request["argvs"]:
    args = parser.parse_args(argv)
    out.append({dest: getattr(args, dest, None) for dest in set(dests.values())})
print(json.dumps({"dests": dests, "values": out}, default=str))
"""
MINIMAL = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --vocab-size 64 --num-experts 4"


def megatron_parse(lines: list[str]) -> tuple[dict[str, str], list[dict[str, Any]]]:
    from planner.config.importers.megatron_args import parse_command, split_words
    from tests.support.oracle import megatron_lm_dir

    root, why = megatron_lm_dir()
    if root is None:
        pytest.skip(why)
    argvs = [[w for a in parse_command(split_words(line)).arguments for w in a.words] for line in lines]
    try:
        payload = snippet_json(PARSER_PROBE, root, {"argvs": argvs})
    except SnippetFailed as failed:
        pytest.skip(f"Megatron's parser cannot run here: {str(failed).strip().splitlines()[-1:]}")
    return payload["dests"], payload["values"]


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(theirs, list) and len(theirs) == 1 and not isinstance(ours, list):
        theirs = theirs[0]  # nargs='+' arguments moeplan models as one value
    return ours == theirs


@pytest.fixture(scope="module")
def parsed() -> tuple[dict[str, str], list[dict[str, Any]]]:
    """One run of Megatron's parser for this module's tests: the V3 line, the minimal line and the
    minimal line with MLA."""
    return megatron_parse([V3_LINE, MINIMAL, MINIMAL + " --multi-latent-attention"])


def test_values_and_defaults_match_megatrons_parser(parsed) -> None:
    """Every argument of the V3 line that maps to a field reads as Megatron's parser reads it, and
    every default the import writes for an absent argument is Megatron's."""
    from planner.config.megatron_arguments import MEGATRON_DEFAULTS, MLA_DEFAULTS, argument_table

    dests, (v3, minimal, mla) = parsed
    table = argument_table()
    v3_mapped = map_arguments(V3_LINE)
    compared = 0
    for arg in parse_command_arguments(V3_LINE):
        if arg in table and arg in dests:
            dotted = table[arg][0]
            assert _same(v3_mapped.get(dotted), v3[dests[arg]]), (arg, v3_mapped.get(dotted), v3[dests[arg]])
            compared += 1
    assert compared >= 50  # the V3 line's modelled arguments, not a vacuous pass
    flag_of = {dotted: flag for flag, (dotted, _) in table.items()}
    for values, defaults, line in ((minimal, MEGATRON_DEFAULTS, MINIMAL),
                                   (mla, MLA_DEFAULTS, MINIMAL + " --multi-latent-attention")):
        ours = map_arguments(line, world_size=8)
        for dotted in defaults:
            if dotted == "training.precision":
                assert (values["bf16"], values["fp16"]) == (False, False)
                continue
            assert _same(ours.get(dotted), values[dests[flag_of[dotted]]]), dotted


# Flags the table maps that Megatron-LM dev@d48bd6be's parser lacks, and why they are still mapped.
NOT_ON_DEV = {
    "--tensor-parallel-num-weight-shards": "GTP, Megatron-LM main only (emitted for parallel.gtp)",
    "--expert-tensor-parallel-num-weight-shards": "EGTP, Megatron-LM main only",
    "--gtp-remat-num-sequence-shards": "GTP sequence shards, Megatron-LM main only",
    "--virtual-pipeline-model-parallel-size": "the older spelling of --num-virtual-stages-per-pipeline-rank",
    "--variable-seq-lengths": "emitted by `emit megatron` for training.variable_seq_lengths",
    "--moe-ncclep-zero-copy": "NCCL EP zero-copy, Megatron-LM main only (moe.moe_ncclep_zero_copy)",
}


def test_every_mapped_flag_is_a_megatron_argument(parsed) -> None:
    from planner.config.megatron_arguments import SPECIAL, argument_table

    dests, _ = parsed
    unknown = {f for f in [*argument_table(), *SPECIAL] if f not in dests}
    assert unknown == set(NOT_ON_DEV)


def parse_command_arguments(line: str) -> list[str]:
    from planner.config.importers.megatron_args import parse_command, split_words

    return [a.flag for a in parse_command(split_words(line)).arguments]


@pytest.mark.parametrize(("words", "field", "value"), [
    # megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__: the deprecated spelling
    ("--linear-attention-type gated_delta_net --linear-attention-freq 4", "linear_attention_freq", 4),
    ("--experimental-attention-variant gated_delta_net --linear-attention-freq 4",
     "linear_attention_freq", 4),
    ("--experimental-attention-variant dsa --multi-latent-attention", "dsa", True),
    # validate_args refuses --no-position-embedding unless rope, where nothing reads it
    ("--position-embedding-type rope --no-position-embedding", "position_embedding_type", "rope"),
])
def test_variant_spellings_import_as_the_fields_emit_writes_back(words: str, field: str, value: Any):
    result = import_arguments(words)
    assert result.data["model"][field] == value
    assert not result.extra_args, result.extra_args


def test_argument_table_is_built_once_and_read_only() -> None:
    """The emitter looks up every plain step in the table, so it is built once; shared by import and
    emit, it cannot be changed by either."""
    from planner.config.megatron_arguments import argument_table

    table = argument_table()
    assert argument_table() is table
    assert table["--hidden-size"] == ("model.hidden_size", "int")
    with pytest.raises(TypeError):
        table["--hidden-size"] = ("model.num_layers", "int")  # type: ignore[index]

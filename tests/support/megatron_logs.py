"""Training-log fixtures printed by Megatron-LM itself: for a corpus launch, the lines a training
run prints before its first iteration that carry the configuration — the argument dump of
validate_args (megatron/training/arguments.py _print_args), the tokenizer's padded-vocabulary line
(megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding) and the microbatch
line (megatron/core/num_microbatches_calculator.py), through Python logging's default format as a
run without a logging config prints them.

The folder also holds public logs (each header names its repository, path or issue and commit or
date), which this module neither lists nor regenerates.

Regenerate with `python -m tests.support.megatron_logs` (needs the Megatron-LM checkout of
tests/support/oracle.py; runs Megatron's parser on CPU through tests/support/megatron_snippet.py).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.support.launch_corpus import BY_NAME, import_entry, known_arguments, without_environment_flags
from tests.support.megatron_snippet import run_snippet

LOGS = Path(__file__).parent / "megatron_logs"
# log file → the corpus launch it ran
LOGGED = {"mixtral_8x7b_vpp.log": "modelzoo_mixtral_8x7b.yaml",
          "deepseek_v2_lite.log": "modelzoo_deepseek_v2_lite.yaml"}

_PRINT = r"""
import logging, os
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
request = json.loads(sys.stdin.read())
os.environ.update({"WORLD_SIZE": str(request["world_size"]), "RANK": "0", "LOCAL_RANK": "0"})
sys.argv = ["pretrain_gpt.py", *request["argv"]]
from megatron.training.arguments import parse_args, validate_args
from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding
from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
args = validate_args(parse_args(), {})
vocab_size_with_padding(args.vocab_size, args)
init_num_microbatches_calculator(0, args.rampup_batch_size, args.global_batch_size, args.micro_batch_size,
                                 args.data_parallel_size, args.decrease_batch_size_if_needed)
"""

def print_log(corpus_name: str, megatron_lm: Path) -> str:
    """What Megatron prints for the corpus launch's own arguments (mock data, null tokenizer)."""
    from planner.emit.megatron_check import DATA_ARGUMENTS

    entry = BY_NAME[corpus_name]
    with tempfile.TemporaryDirectory() as root:
        result, front = import_entry(entry, Path(root))
    argv = [*without_environment_flags(known_arguments(front.argv)), *DATA_ARGUMENTS]
    request = {"argv": argv, "world_size": result.get("parallel.world_size")}
    return run_snippet(_PRINT, megatron_lm, request)


if __name__ == "__main__":
    from tests.support.oracle import megatron_lm_dir

    folder, why = megatron_lm_dir()
    if folder is None:
        sys.exit(why)
    LOGS.mkdir(exist_ok=True)
    for log, corpus in LOGGED.items():
        header = (f"# Printed by Megatron-LM dev@d48bd6be for the arguments of the launch corpus file "
                  f"{corpus} (tests/support/launch_corpus_files), mock data and the null tokenizer;\n"
                  f"# regenerate with python -m tests.support.megatron_logs\n")
        (LOGS / log).write_text(header + print_log(corpus, folder), encoding="utf-8")

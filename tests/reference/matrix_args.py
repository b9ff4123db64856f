"""The reference matrix's Megatron arguments, made by Megatron-LM's own parse_args and
validate_args (pretrain_gpt.py's args_defaults) from each cell's launch line.

Run by record_matrix.py in a process of its own (`python matrix_args.py LM_ROOT` with
a JSON list of launch lines on stdin, the JSON list of argument namespaces on
stdout): parse_args needs megatron.training whole, which record_matrix.py's process
cannot import beside the training code it cuts out of two versions at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# a model Megatron accepts on a CPU: the matrix reads only data arguments from it
MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--max-position-embeddings",
         "128", "--lr", "1e-4", "--transformer-impl", "local", "--tokenizer-type", "NullTokenizer",
         "--num-workers", "0"]


def cell_line(sampler: tuple[str, bool], keys: dict, dp: int, mbs: int, transitions: list[int] | None,
              data_path: list[str], mc) -> list[str]:
    """pretrain_gpt.py's launch line of a matrix cell (without --rampup-batch-size, which
    Megatron-LM core_v0.19.0's parser no longer has)."""
    dataloader_type, sharding = sampler
    line = [*MODEL, "--vocab-size", str(mc.EOD + 1), "--seed", str(mc.SEED), "--seq-length", str(mc.SEQUENCE_LENGTH),
            "--split", mc.SPLIT, "--micro-batch-size", str(mbs), "--train-samples", str(mc.TRAIN_SAMPLES),
            "--eval-interval", str(mc.EVAL_INTERVAL), "--eval-iters", str(mc.EVAL_ITERS),
            "--dataloader-type", dataloader_type, "--data-path", *data_path]
    if keys.get("global_batch_size") is not None:
        line += ["--global-batch-size", str(keys["global_batch_size"])]
    if keys.get("step_batch_size_schedule") is not None:
        line += ["--step-batch-size-schedule", keys["step_batch_size_schedule"]]
    if not sharding:
        line.append("--no-data-sharding")
    if transitions:
        line += ["--phase-transition-iterations", ",".join(map(str, transitions))]
    return line


def parsed(lm: str, lines: list[list[str]], world_sizes: list[int]) -> list[dict]:
    """vars(args) of each line after validate_args (the JSON-able values)."""
    sys.path.insert(0, str(HERE))
    from record_megatron_iterators import prepare_megatron

    m = prepare_megatron(lm)
    out = []
    for line, world in zip(lines, world_sizes):
        os.environ.update(WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0")
        sys.argv = ["pretrain_gpt.py", *line]
        with contextlib.redirect_stdout(sys.stderr):
            args = m.parse_args()
            m.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
        fields = {}
        for k, v in vars(args).items():
            try:
                json.dumps(v)
            except TypeError:
                continue
            fields[k] = v
        out.append(fields)
    return out


if __name__ == "__main__":
    request = json.load(sys.stdin)
    json.dump(parsed(sys.argv[1], request["lines"], request["world_sizes"]), sys.stdout)

"""Record the index cache files Megatron-LM's own build writes for a launch line of
each tokenizer type pretrain_gpt.py takes, into megatron_cache_names.json beside
this file (tests/test_megatron_cache_names.py builds the same lines with mmfs and
compares the file names, which hash the tokenizer's unique identifiers).

    python tests/reference/record_megatron_cache_names.py --megatron-lm PATH/TO/Megatron-LM

Needs torch 2.13.0 (CPU), the megatron-core 0.19.2 wheel (its megatron/training and
megatron/core/tokenizers), transformers, tokenizers, sentencepiece and tiktoken, and
a Megatron-LM checkout at core_v0.19.0 for pretrain_gpt.py (appended to sys.path; the
wheel's megatron package is the one imported). Deterministic.

For each case: sys.argv is pretrain_gpt.py's launch line; Megatron's parse_args and
validate_args (with pretrain_gpt.py's args_defaults) read it; megatron-core's
build_tokenizer builds the tokenizer from those args (offline: GPT2BPETokenizer's
"gpt2" is a local folder holding only its model type, as record_megatron_tokenizers.py
does); pretrain_gpt.py's train_valid_test_datasets_provider builds train, valid and
test through BlendedMegatronDatasetBuilder with the sample counts training.py's
get_train_valid_test_num_samples gives, on one data-parallel rank (the CPU set-up of
record_megatron_iterators.py). The files its build writes into --data-cache-path
are recorded by name, with the tokenizer's unique_identifiers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "megatron_cache_names.json"
TOKENIZERS = ROOT / "tests" / "golden" / "preprocess" / "tokenizers"
HF = ROOT / "tests" / "golden" / "preprocess" / "hf_tokenizer"
MODEL = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --max-position-embeddings 128 --lr 1e-4 "
         "--transformer-impl local --num-workers 0")
RUN = ("--data-path 0.6 data/u16_docs 0.4 data/u16_small --split 90,8,2 --seq-length 64 --micro-batch-size 2 "
       "--global-batch-size 8 --train-iters 20 --eval-interval 10 --eval-iters 2 --data-cache-path cache")
# name: the tokenizer flags of the launch line (paths relative to the folder it runs in:
# tok/ and hf/ are the tokenizers of tests/golden/preprocess)
CASES = {
    "gpt2-default": "--vocab-file tok/gpt2-vocab.json --merge-file tok/gpt2-merges.txt",
    "gpt2-special": "--tokenizer-type GPT2BPETokenizer --vocab-file tok/gpt2-vocab.json "
                    "--merge-file tok/gpt2-merges.txt --tokenizer-special-tokens <a> <b>",
    "huggingface": "--tokenizer-type HuggingFaceTokenizer --tokenizer-model hf",
    "sentencepiece": "--tokenizer-type SentencePieceTokenizer --tokenizer-model tok/sp.model",
    "gpt-sentencepiece": "--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model tok/sp.model",
    "llama2": "--tokenizer-type Llama2Tokenizer --tokenizer-model tok/sp.model "
              "--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
    "tiktoken": "--tokenizer-type TikTokenizer --tokenizer-model tok/tiktoken.json --tiktoken-pattern v2 "
                "--vocab-size 2200",
    "tiktoken-v1": "--tokenizer-type TikTokenizer --tokenizer-model tok/tiktoken.json --tiktoken-pattern v1 "
                   "--vocab-size 2200",
    "null": "--tokenizer-type NullTokenizer --vocab-size 50257",
    "null-eod-pad": "--tokenizer-type NullTokenizer --vocab-size 50257 --null-tokenizer-eod-id 50256 "
                    "--null-tokenizer-pad-id 3",
}


def provenance(megatron_lm: str, commit: str | None) -> dict:
    if commit is None:
        done = subprocess.run(["git", "-C", megatron_lm, "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = done.stdout.strip() or "unknown (not a git checkout; give --megatron-lm-commit)"
    return {"megatron-core": metadata.version("megatron-core"), "torch": metadata.version("torch"),
            "transformers": metadata.version("transformers"), "python": platform.python_version(),
            "megatron_lm_pretrain_gpt": commit,
            "args": "Megatron's parse_args and validate_args with pretrain_gpt.py's args_defaults"}


def run_case(m, name: str, work: Path) -> dict:
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training import global_vars

    folder = work / name
    folder.mkdir()
    for link, target in (("data", ROOT / "tests" / "golden" / "data"), ("tok", TOKENIZERS), ("hf", HF),
                         ("gpt2", work / "gpt2")):
        (folder / link).symlink_to(target, target_is_directory=True)
    os.chdir(folder)
    os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0")
    line = f"{MODEL} {RUN} {CASES[name]}"
    sys.argv = ["pretrain_gpt.py", *shlex.split(line)]
    with contextlib.redirect_stdout(sys.stderr):
        args = m.parse_args()
        m.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
        m.set_args(args)
        tokenizer = build_tokenizer(args)
        global_vars._GLOBAL_TOKENIZER = tokenizer
        sizes = m.training.get_train_valid_test_num_samples()
        from record_megatron_iterators import data_parallel_rank

        with data_parallel_rank(m.mpu, 0, 1):
            m.pretrain_gpt.train_valid_test_datasets_provider(sizes)
    files = sorted(p.name for p in (folder / "cache").rglob("*") if p.is_file())
    print(f"{name}: {len(files)} files", flush=True)
    return {"launch": f"{RUN} {CASES[name]}", "unique_identifiers": dict(tokenizer.unique_identifiers),
            "eod": tokenizer.eod, "pad": getattr(tokenizer, "pad", None), "num_samples": list(sizes),
            "files": files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron-lm", required=True, help="a Megatron-LM checkout at core_v0.19.0")
    parser.add_argument("--megatron-lm-commit", help="the commit of a `git archive` given as --megatron-lm")
    parser.add_argument("--cases", default=",".join(CASES))
    opts = parser.parse_args()
    sys.path.insert(0, str(HERE))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from record_megatron_iterators import prepare_megatron

    m = prepare_megatron(opts.megatron_lm)
    out = {"about": "the index cache files Megatron-LM's build writes for pretrain_gpt.py launch lines of each "
                    "tokenizer type (record_megatron_cache_names.py)",
           "provenance": provenance(opts.megatron_lm, opts.megatron_lm_commit), "model_args": MODEL, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "gpt2").mkdir()  # "gpt2" for transformers' AutoTokenizer, offline: its model type only
        (work / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
        (work / "gpt2" / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}))
        for name in opts.cases.split(","):
            out["cases"][name] = run_case(m, name, work)
    OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

"""Record Megatron-LM's own GPT example launch lines and what Megatron builds from
them into megatron_examples.json beside this file (tests/test_megatron_examples.py
gives each line to `mmfs config --from-megatron` and compares the mount with it).

    python tests/reference/record_megatron_examples.py --megatron-git GIT_DIR --megatron-lm LM_ROOT

GIT_DIR: a Megatron-LM git repository (the scripts are read with `git show` at each
commit of COMMITS); LM_ROOT: a checkout (or `git archive`) at core_v0.19.0 for
pretrain_gpt.py. Needs torch 2.13.0 (CPU), the megatron-core 0.19.2 wheel,
transformers, tokenizers and sentencepiece. Deterministic.

For each example script (examples/ at core_v0.19.0 and at main): the script itself
runs under bash with `torchrun` a shell function that prints its arguments (nothing
else of the script is changed), its positional arguments placeholders; the words
after pretrain_gpt.py are the launch line, recorded as the script gives it. Then it
is adapted to this machine, each change recorded: the data and tokenizer
placeholders become the golden datasets and tokenizers, the run is cut to a few
iterations (--train-iters 20 or --train-samples 20 x the global batch, --eval-interval
10, --eval-iters 2), --data-cache-path is `cache` (given or added), and the world size (torchrun's
--nproc_per_node x --nnodes, as WORLD_SIZE) is raised to twice the tensor x pipeline
x context parallel size where the script's single node does not hold it, and
--no-rope-fusion is added where rope is used (Transformer Engine, which the rope
fusion needs, is not on this CPU machine; the data is not touched by it);
torch.cuda.get_device_capability and get_device_properties answer an H100's 9.0 (the
scripts' target) for validate_args' checks of the GPU (--moe-grouped-gemm, --fp16);
a --split that gives a split none of the 2,003 documents of the golden dataset
(99990,8,2) becomes 98,1,1; GPT2BPETokenizer's "gpt2" is a local folder holding only its model type (offline, as
record_megatron_cache_names.py) (megatron-core's
GPTDataset would hang on a split of no tokens; mmfs refuses that line). Megatron's
parse_args and validate_args (pretrain_gpt.py's args_defaults) read the adapted line:
a line they refuse is recorded with Megatron's message; else pretrain_gpt.py's
train_valid_test_datasets_provider builds the splits with the counts training.py's
get_train_valid_test_num_samples gives, and each split's length and the digests of
its first samples are recorded (the sample's tokens as its GPTDataset reads them,
what the mount's samples/ files hold).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import traceback
import types
from importlib import metadata
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "megatron_examples.json"
COMMITS = {"core_v0.19.0": "5be9626709af2722333bf54797c954c09edeada3",
           "main": "d98e8a64ddf34856e74b24714e3bedb2f5a39553"}
# script: its positional arguments (placeholders)
SCRIPTS = {"examples/gpt3/train_gpt3_175b_distributed.sh": "CKPT TB VOCAB_FILE MERGE_FILE DATA_PREFIX",
           "examples/llama/train_llama3_8b_h100_fp8.sh": "CKPT TB TOKENIZER_MODEL DATA_PREFIX",
           "examples/mixtral/train_mixtral_8x7b_distributed.sh": "CKPT TOKENIZER_MODEL DATA_PREFIX"}
PLACES = {"DATA_PREFIX": "data/u16_docs", "VOCAB_FILE": "tok/gpt2-vocab.json", "MERGE_FILE": "tok/gpt2-merges.txt"}
TOKENIZER_MODEL = {"HuggingFaceTokenizer": "hf", "TikTokenizer": "tok/tiktoken.json"}  # else tok/sp.model
DOCUMENTS = 2003  # of data/u16_docs
SHOWN = 32  # samples of each split whose digests are recorded


def script_line(git_dir: str, commit: str, script: str, work: Path) -> list[str]:
    text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{script}"], capture_output=True,
                          text=True, check=True).stdout
    (work / "script.sh").write_text(text)
    (work / "pretrain_gpt.py").touch()  # scripts that check it is there
    shim = 'torchrun() { printf "%s\\n" "$@"; }; export -f torchrun; bash script.sh ' + SCRIPTS[script]
    done = subprocess.run(["bash", "-c", shim], capture_output=True, text=True, cwd=work, timeout=60)
    return done.stdout.splitlines()


def _value(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words else None


def _set(words: list[str], flag: str, value: str, changes: list[str]) -> None:
    if flag in words:
        i = words.index(flag)
        if words[i + 1] != value:
            changes.append(f"{flag} {words[i + 1]} -> {value}")
            words[i + 1] = value


def adapt(words: list[str]) -> tuple[list[str], int, list[str]]:
    """(the launch line after pretrain_gpt.py, adapted; WORLD_SIZE; the changes)."""
    at = words.index("pretrain_gpt.py")
    launcher, line, changes = words[:at], list(words[at + 1:]), []
    for i, w in enumerate(line):
        if w in PLACES:
            line[i] = PLACES[w]
        elif w == "TOKENIZER_MODEL":
            line[i] = TOKENIZER_MODEL.get(_value(line, "--tokenizer-type"), "tok/sp.model")
    if "--train-iters" in line:
        _set(line, "--train-iters", "20", changes)
    if "--train-samples" in line:
        _set(line, "--train-samples", str(20 * int(_value(line, "--global-batch-size") or 16)), changes)
    _set(line, "--eval-interval", "10", changes)
    _set(line, "--eval-iters", "2", changes)
    _set(line, "--data-cache-path", "cache", changes)
    if "--data-cache-path" not in line:  # Megatron's default puts it beside the data: the golden folder here
        line += ["--data-cache-path", "cache"]
        changes.append("--data-cache-path cache added")
    shares = [float(x) for x in re.findall(r"[.0-9]+", _value(line, "--split") or "969,30,1")]  # as megatron-core
    if any(0 < x / sum(shares) * DOCUMENTS < 1 for x in shares):  # a split of no document: Megatron hangs
        _set(line, "--split", "98,1,1", changes)
    if "--position-embedding-type" in line and "--no-rope-fusion" not in line:
        line.append("--no-rope-fusion")  # the transformer config asks Transformer Engine for it otherwise
        changes.append("--no-rope-fusion added (no Transformer Engine here)")
    world = int(_value(launcher, "--nproc_per_node") or 1) * int(_value(launcher, "--nnodes") or 1)
    model = 1
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size"):
        model *= int(_value(line, flag) or 1)
    if world % model:
        changes.append(f"WORLD_SIZE {world} -> {2 * model} (twice the model-parallel size)")
        world = 2 * model
    return line, world, changes


def digest(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:16]


def raw_sample(ds, i: int) -> np.ndarray:
    """Sample i's tokens as its GPTDataset reads them (sequence_length + 1), before
    __getitem__ turns pad ids into 0 in tokens and labels (which mmfs.loader does too)."""
    if hasattr(ds, "dataset_index"):  # a BlendedDataset
        ds, i = ds.datasets[int(ds.dataset_index[i])], int(ds.dataset_sample_index[i])
    return ds._query_document_sample_shuffle_indices(i)[0]


def megatron_build(m, line: list[str], world: int, folder: Path) -> dict:
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training import global_vars
    from record_megatron_iterators import data_parallel_rank

    os.chdir(folder)
    # the GPT-3 script exports CUDA_DEVICE_MAX_CONNECTIONS=1 (validate_args asserts it with tensor parallelism)
    os.environ.update(WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    sys.argv = ["pretrain_gpt.py", *line]
    said = io.StringIO()
    import torch

    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # an H100's, the scripts' target: no GPU here
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(major=9, minor=0)
    try:
        with contextlib.redirect_stdout(sys.stderr), contextlib.redirect_stderr(said):
            args = m.parse_args()
            m.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
    except (AssertionError, ValueError, SystemExit) as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
        message = said.getvalue().strip().splitlines()[-1] if isinstance(exc, SystemExit) else str(exc)
        return {"refused": f"{type(exc).__name__} at {where}: {message}"}
    with contextlib.redirect_stdout(sys.stderr):
        m.set_args(args)
        global_vars._GLOBAL_TOKENIZER = build_tokenizer(args)
        m.training.update_train_iters(args)
        sizes = m.training.get_train_valid_test_num_samples()
        with data_parallel_rank(m.mpu, 0, args.data_parallel_size):
            built = m.pretrain_gpt.train_valid_test_datasets_provider(sizes)
    splits = {}
    for name, ds in zip(("train", "valid", "test"), built):
        if ds is not None:
            splits[name] = {"samples": len(ds), "digests": [digest(raw_sample(ds, i))
                                                            for i in range(min(SHOWN, len(ds)))]}
    return {"num_samples": list(sizes), "data_parallel_size": args.data_parallel_size,
            "global_batch_size": args.global_batch_size, "seq_length": args.seq_length,
            "tokenizer_type": args.tokenizer_type, "splits": splits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megatron-git", required=True)
    parser.add_argument("--megatron-lm", required=True, help="a checkout at core_v0.19.0 (pretrain_gpt.py)")
    opts = parser.parse_args()
    sys.path.insert(0, str(HERE))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from record_megatron_iterators import prepare_megatron

    m = prepare_megatron(opts.megatron_lm)
    out = {"about": "Megatron-LM's GPT example launch lines and Megatron's build of each, adapted to local data "
                    "(record_megatron_examples.py)",
           "provenance": {"megatron-core": metadata.version("megatron-core"), "torch": metadata.version("torch"),
                          "python": platform.python_version(), "commits": COMMITS,
                          "megatron_lm_pretrain_gpt": "core_v0.19.0",
                          "args": "Megatron's parse_args and validate_args with pretrain_gpt.py's args_defaults"},
           "examples": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for version, commit in COMMITS.items():
            for script in SCRIPTS:
                name = f"{version}:{script.split('/')[-1][:-3]}"
                folder = work / name.replace(":", "-")
                folder.mkdir()
                words = script_line(opts.megatron_git, commit, script, folder)
                for variant, changed in variants(words).items():
                    out["examples"][name + variant] = record(m, script, commit, changed, folder, variant)
    OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


def variants(words: list[str]) -> dict[str, list[str]]:
    """The script's line, and where it splits --step-batch-size-schedule's value into words
    (the GPT-3 script's unquoted array does), that value as one word (as written in the
    script), with and without --global-batch-size (which Megatron refuses beside it)."""
    out = {"": words}
    if "--step-batch-size-schedule" in words:
        i = words.index("--step-batch-size-schedule") + 1
        j = i + 1
        while j < len(words) and not words[j].startswith("--"):
            j += 1
        if j > i + 1:
            joined = [*words[:i], " ".join(words[i:j]), *words[j:]]
            out["+schedule-one-word"] = joined
            k = joined.index("--global-batch-size")
            out["+schedule-one-word-no-global-batch"] = joined[:k] + joined[k + 2:]
    return out


def record(m, script: str, commit: str, words: list[str], parent: Path, variant: str) -> dict:
    folder = parent / (variant or "as-written")
    folder.mkdir()
    line, world, changes = adapt(words)
    for link, target in (("data", ROOT / "tests/golden/data"), ("tok", ROOT / "tests/golden/preprocess/tokenizers"),
                         ("hf", ROOT / "tests/golden/preprocess/hf_tokenizer")):
        (folder / link).symlink_to(target, target_is_directory=True)
    (folder / "gpt2").mkdir()  # "gpt2" for transformers' AutoTokenizer, offline: its model type only
    (folder / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (folder / "gpt2" / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}))
    entry = {"script": script, "commit": commit, "variant": variant or "as the script gives it",
             "launch": shlex.join(words), "adapted": shlex.join(line), "world_size": world, "changes": changes,
             "megatron": megatron_build(m, line, world, folder)}
    print(script, variant, "refused" if "refused" in entry["megatron"] else "built", flush=True)
    return entry


if __name__ == "__main__":
    main()

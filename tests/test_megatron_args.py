"""`mmfs config --from-megatron`: Megatron-LM launch arguments to a YAML config that
loads, and mounted gives megatron-core's recorded samples; the YAML forms of
Megatron's data arguments (data_path as words, data_args_path,
per_split_data_args_path)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from golden_cases import GOLDEN, expected_samples, load_case
from mmfs.config.blend import MAX_ARGS_FILE
from mmfs.config.schema import load_config
from mmfs.tools.megatron.words import split_words
from mount_fixtures import mmfs, mounted


def _folder(tmp_path: Path) -> Path:
    """A folder to launch Megatron from: data -> the golden datasets."""
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    return tmp_path


def _from_megatron(folder: Path, *args: str, world_size: str | None = None) -> Path:
    old = os.environ.pop("WORLD_SIZE", None)
    if world_size is not None:
        os.environ["WORLD_SIZE"] = world_size  # the mmfs child inherits it
    try:
        proc = mmfs("config", "--from-megatron", *args, cwd=folder)
    finally:
        os.environ.pop("WORLD_SIZE", None)
        if old is not None:
            os.environ["WORLD_SIZE"] = old
    assert proc.returncode == 0, proc.stderr
    path = folder / "config.yaml"
    path.write_text(proc.stdout)
    return path


# p2_blend2_u16 as a launch line: samples 1200/100/20 from --train-samples 1200, global
# batch 20 (60 iterations), eval every 15 iterations (60 // 15 + 1 = 5 evaluations) of 1.
P2_ARGS = """\
# as a launch script's DATA_ARGS and TRAINING_ARGS hold them
--data-path 0.7 data/u16_docs \\
            0.3 data/u16_small
--split 90,8,2 --seq-length 128 --seed 42 --data-cache-path cache
--micro-batch-size 5 --global-batch-size 20 --train-samples 1200
--eval-interval 15 --eval-iters 1
--tokenizer-type NullTokenizer --vocab-size 50257
--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
--num-layers 2 --hidden-size 64 --lr 3e-4 --eod-mask-loss
"""


def test_a_launch_line_mounts_megatrons_samples(tmp_path):
    folder = _folder(tmp_path)
    (folder / "args.txt").write_text(P2_ARGS)
    config = _from_megatron(folder, "@args.txt", world_size="16")
    text = config.read_text()
    assert "# ignored --eod-mask-loss: a batch field" in text and "--lr" not in text
    loaded = load_config(str(config))
    case = load_case("p2_blend2_u16")
    assert loaded.samples == {"train": 1200, "valid": 100, "test": 20}
    assert loaded.training.data_parallel_size == 4 and loaded.training.micro_batch_size == 5
    assert loaded.eod == case["eod_id"] and loaded.effective_pad == case["effective_pad_token_id"]
    with mounted(config, tmp_path / "mnt") as m:
        info = json.loads((m.path / "mmfs.json").read_text())
        for split in ("train", "valid", "test"):
            rows = expected_samples("p2_blend2_u16", split)
            want = rows.astype(np.dtype(info["dtype"]).newbyteorder("<"))
            for i in range(len(want)):
                assert (m.path / split / "samples" / f"{i:07d}.bin").read_bytes() == want[i].tobytes()


# Launch lines after Megatron-LM's examples (gpt3/train_gpt3_175b_distributed.sh of
# megatron-core 0.17, llama/train_llama3_8b_h100_fp8.sh, mixtral/train_mixtral_8x7b_distributed.sh),
# with their datasets replaced by the golden ones.
EXAMPLES = {
    "gpt3_175b": ["--nproc_per_node", "8", "--nnodes", "16", "pretrain_gpt.py",
                  "--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96",
                  "--seq-length", "2048", "--max-position-embeddings", "2048", "--attention-backend", "auto",
                  "--micro-batch-size", "1", "--global-batch-size", "1536",
                  "--rampup-batch-size", "16", "16", "5859375", "--train-iters", "500000",
                  "--weight-decay", "0.1", "--fp16", "--lr", "6.0e-5", "--lr-decay-style", "cosine",
                  "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "16",
                  "--data-path", "data/u16_docs", "--vocab-file", "vocab.json", "--merge-file", "merges.txt",
                  "--tokenizer-type", "GPT2BPETokenizer", "--split", "949,50,1",
                  "--log-interval", "100", "--save-interval", "10000", "--eval-interval", "1000",
                  "--eval-iters", "10"],
    "llama3_8b": ["--use-mcore-models", "--num-layers", "32", "--seq-length", "8192",
                  "--micro-batch-size", "1", "--global-batch-size", "128", "--train-samples", "1953125000",
                  "--tensor-model-parallel-size", "1", "--context-parallel-size", "2",
                  "--data-path", "data/u16_docs", "--tokenizer-type", "NullTokenizer", "--vocab-size", "128256",
                  "--split", "99,1,0", "--no-create-attention-mask-in-dataloader",
                  "--eval-iters", "32", "--eval-interval", "100", "--world-size", "8"],
    "mixtral": ["--per-split-data-args-path", "splits.json", "--seq-length", "4096",
                "--micro-batch-size", "1", "--global-batch-size", "256", "--train-iters", "500000",
                "--expert-model-parallel-size", "8", "--pipeline-model-parallel-size", "4",
                "--tokenizer-type", "NullTokenizer", "--vocab-size", "32000", "--dataloader-type", "cyclic",
                "--eval-interval", "1000", "--eval-iters", "10", "--world-size", "64"],
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_megatrons_example_launch_lines_give_configs_that_load(tmp_path, name):
    folder = _folder(tmp_path)
    (folder / "vocab.json").write_text(json.dumps({"!": 0, "<|endoftext|>": 50256}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    (folder / "splits.json").write_text(json.dumps({"train": "1 data/u16_docs", "valid": ["data/u16_small"],
                                                    "test": None}))
    config = load_config(str(_from_megatron(folder, *EXAMPLES[name])))
    assert config.training is not None and config.eod is not None
    raw = yaml.safe_load((folder / "config.yaml").read_text())
    if name == "gpt3_175b":
        assert config.training.data_parallel_size == 1 and config.eod == 50256
        assert raw["split"] == "949,50,1" and "rampup_batch_size" not in raw["training"]
        assert config.samples["valid"] == (500000 // 1000 + 1) * 10 * 1536
    if name == "llama3_8b":
        assert config.training.data_parallel_size == 4 and config.samples["train"] == 1953125000
    if name == "mixtral":
        assert config.training.data_parallel_size == 16 and config.training.dataloader_type == "cyclic"
        assert config.blend_per_split["test"] is None and config.blend_per_split["train"].weights == [1.0]


LINE = ["--data-path", "data/u16_docs", "--seq-length", "8", "--tokenizer-type", "NullTokenizer", "--vocab-size", "9"]


@pytest.mark.parametrize("args,words", [
    (["--mock-data", "--seq-length", "8"], "--mock-data: mmfs cannot serve it"),
    # pretrain_gpt.py's default tokenizer type, GPT2BPETokenizer, without its files
    (["--data-path", "data/u16_docs", "--seq-length", "8", "--micro-batch-size", "1"],
     "--vocab-file: missing: GPT2BPETokenizer loads it"),
    (["--data-path", "data/u16_docs", "--seq-length", "8", "--tokenizer-type", "TikTokenizer"],
     "--tokenizer-model: missing: TikTokenizer loads it"),
    (["--data-path", "data/u16_docs", "--seq-length", "8", "--tokenizer-type", "BertWordPieceCase"],
     "--tokenizer-type: BertWordPieceCase: mmfs knows"),
    (["--data-path", "data/u16_docs", "--seq-length", "8", "--tokenizer-type", "NullTokenizer",
      "--vocab-size", "9", "--micro-batch-size", "1", "--world-size", "6", "--tensor-model-parallel-size", "4"],
     "--world-size: 6 is not a multiple"),
    (["--data-path", "data/u16_docs", "--seq-length", "x"], "--seq-length: 'x' is not an integer"),
    (["--seq-length", "8"], "--data-path: missing"),
    (["@missing.txt"], "missing.txt: file not found"),
    (["--data-path", "data/u16_docs", "--seq-length", "8", "--tokenizer-type", "NullTokenizer",
      "--vocab-size", "9", "--micro-batch-size", "1", "--global-batch-size", "8",
      "--step-batch-size-schedule", "0:8"], "--step-batch-size-schedule: Megatron-LM refuses it"),
    (["--data-path", "data/u16_docs", "--seq-length", "8", "--tokenizer-type", "NullTokenizer",
      "--vocab-size", "9", "--micro-batch-size", "1", "--dataloader-type", "external"],
     "--dataloader-type: external is how a job reads the mount"),
    (["--data-path", "data/u16_docs", "--seq-length", "8", "--tokenizer-type", "GPT2BPETokenizer",
      "--vocab-file", "nothere.json", "--merge-file", "merges.txt"], "--vocab-file: "),
    # what Megatron-LM's validate_args (and the microbatch calculator) refuse at start-up
    ([*LINE, "--micro-batch-size", "0"], "--micro-batch-size: 0: Megatron asserts"),
    ([*LINE, "--micro-batch-size", "1", "--seq-length", "-5"], "--seq-length: -5: a sample holds at least 1 token"),
    ([*LINE, "--micro-batch-size", "1", "--seq-length", "0"], "--seq-length: 0:"),
    ([*LINE, "--micro-batch-size", "2", "--world-size", "2", "--global-batch-size", "6"],
     "--global-batch-size: 6 is not a multiple of --micro-batch-size x the data-parallel size"),
    ([*LINE, "--micro-batch-size", "1", "--global-batch-size", "0"], "--global-batch-size: must be at least 1"),
    ([*LINE, "--micro-batch-size", "1", "--world-size", "4", "--context-parallel-size", "2", "--seq-length", "6"],
     "--seq-length: 6 is not a multiple of 2 x --context-parallel-size = 4"),
    ([*LINE, "--micro-batch-size", "1", "--max-position-embeddings", "4"],
     "--seq-length: 8 is more than --max-position-embeddings 4"),
    ([*LINE, "--micro-batch-size", "1", "--train-iters", "10", "--eval-interval", "0"],
     "--eval-interval: must be at least 1"),
    ([*LINE, "--micro-batch-size", "1", "--tensor-model-parallel-size", "0"], "--tensor-model-parallel-size: 0"),
    ([*LINE, "--micro-batch-size", "1", "--seed", "-1"], "--seed: -1:"),
    # torchrun's flags: no process is no world (was a TypeError)
    ([*LINE, "--micro-batch-size", "1", "--nproc_per_node", "0"], "--nproc_per_node: 0: torchrun starts"),
    ([*LINE, "--micro-batch-size", "1", "--nproc-per-node", "2", "--nnodes", "0"], "--nnodes: 0: torchrun starts"),
    # printed, these were refused only by mmfs build (the config's own checks)
    ([*LINE, "--micro-batch-size", "1", "--seq-length", "9" * 23], "--seq-length: 999"),
    ([*LINE, "--micro-batch-size", "1", "--split", "1,2,3,4"], "--split: '1,2,3,4' is not a split"),
    ([*LINE, "--micro-batch-size", "1", "--split", "0,0,0"], "--split: '0,0,0' gives every split a zero share"),
    (["--data-path", "nan", "data/u16_docs", "1", "data/u16_small", *LINE[2:], "--micro-batch-size", "1"],
     "--data-path: the weight nan of data/u16_docs is not a positive number"),
    (["--data-path", "0", "data/u16_docs", "1", "data/u16_small", *LINE[2:], "--micro-batch-size", "1"],
     "--data-path: the weight 0.0 of data/u16_docs"),
    # special files: refused at once, never read
    (["@/dev/zero"], "/dev/zero: is a character device, not a regular file"),
    (["@."], ".: is a directory, not a regular file"),
])
def test_arguments_mmfs_cannot_honour_are_one_line(tmp_path, args, words):
    proc = mmfs("config", "--from-megatron", *args, cwd=_folder(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr


BASE = {"split": "90,8,2", "samples": {"train": 100, "valid": 10, "test": 5}, "sequence_length": 64,
        "seed": 3, "tokenizer": {"eod": 50256, "pad": None}}


def _yaml(folder: Path, **keys) -> Path:
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, **keys}, sort_keys=False))
    return path


def test_megatrons_data_forms_in_yaml_mean_what_megatron_reads(tmp_path):
    folder = _folder(tmp_path)
    mapping = load_config(str(_yaml(folder, datasets=[{"path": "data/u16_docs", "weight": 0.5},
                                                      {"path": "data/u16_small", "weight": 0.5}])))
    words = load_config(str(_yaml(folder, data_path=["0.5", "data/u16_docs", "0.5", "data/u16_small"])))
    (folder / "args.txt").write_text("0.5 data/u16_docs\n0.5   data/u16_small\n")
    from_file = load_config(str(_yaml(folder, data_args_path="args.txt")))
    assert mapping.blend == words.blend == from_file.blend
    paths = load_config(str(_yaml(folder, data_path=["data/u16_docs", "data/u16_small"])))
    assert paths.blend.weights is None and [d.path for d in paths.blend.datasets] == ["data/u16_docs",
                                                                                        "data/u16_small"]
    (folder / "per_split.json").write_text(json.dumps({"train": "0.5 data/u16_docs 0.5 data/u16_small",
                                                       "valid": ["data/u16_small"], "test": None}))
    raw = {k: v for k, v in BASE.items() if k != "split"}
    path = folder / "p.yaml"
    path.write_text(yaml.safe_dump({**raw, "per_split_data_args_path": "per_split.json"}))
    per_split = load_config(str(path))
    assert per_split.blend_per_split["train"] == mapping.blend
    assert [d.path for d in per_split.blend_per_split["valid"].datasets] == ["data/u16_small"]
    assert per_split.blend_per_split["test"] is None


@pytest.mark.parametrize("keys,files,words", [
    ({"data_args_path": "nothere.txt"}, {}, "data_args_path: "),
    ({"per_split_data_args_path": "p.json"}, {"p.json": '{"train": ' + "[" * 100_000 + "]" * 100_000 + "}"},
     "per_split_data_args_path: p.json nests deeper than"),
    ({"data_args_path": "a.txt"}, {"a.txt": b"0.5 data/u16_docs \xff"}, "a.txt: not UTF-8 text (byte 18)"),
    ({"data_args_path": "a.txt"}, {"a.txt": "0.5 data/u16_docs x data/u16_small"},
     "data_args_path[0].path: no dataset"),  # Megatron reads every word as a path then
    ({"per_split_data_args_path": "p.json"}, {"p.json": "{"}, "per_split_data_args_path: p.json is not JSON"),
    ({"per_split_data_args_path": "p.json"}, {"p.json": '{"train": "data/u16_docs"}'}, "has no 'valid' key"),
    ({"per_split_data_args_path": "p.json"}, {"p.json": '{"train": 5, "valid": null, "test": null}'},
     "expected a string or a list of strings"),
    ({"data_path": "data/u16_docs", "data_args_path": "a.txt"}, {}, "give exactly one of"),
])
def test_bad_megatron_data_forms_are_one_line(tmp_path, keys, files, words):
    folder = _folder(tmp_path)
    for name, text in files.items():
        (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    base = {k: v for k, v in BASE.items() if not (k == "split" and "per_split_data_args_path" in keys)}
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump({**base, **keys}))
    proc = mmfs("build", path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr


def _one_line(proc, words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr


@pytest.mark.parametrize("key", ["data_args_path", "per_split_data_args_path"])
def test_a_fifo_as_megatrons_data_file_is_refused_at_once(tmp_path, key):
    folder = _folder(tmp_path)
    os.mkfifo(folder / "fifo")  # opened for reading, it would block until a writer comes
    base = {k: v for k, v in BASE.items() if not (k == "split" and key == "per_split_data_args_path")}
    path = folder / "c.yaml"
    path.write_text(yaml.safe_dump({**base, key: "fifo"}))
    _one_line(mmfs("build", path), f"{key}: {folder / 'fifo'}: is a FIFO (named pipe), not a regular file")


def test_a_fifo_as_arguments_file_is_refused_at_once(tmp_path):
    folder = _folder(tmp_path)
    os.mkfifo(folder / "args.txt")
    _one_line(mmfs("config", "--from-megatron", "@args.txt", cwd=folder),
              "args.txt: is a FIFO (named pipe), not a regular file")


def test_an_arguments_file_past_the_limit_is_refused_not_cut(tmp_path):
    folder = _folder(tmp_path)
    with open(folder / "args.txt", "wb") as f:  # sparse: no disk used
        f.truncate(MAX_ARGS_FILE + 1)
    _one_line(mmfs("config", "--from-megatron", "@args.txt", cwd=folder),
              f"args.txt: is {MAX_ARGS_FILE + 1:,} bytes, more than any arguments file (256 MiB at most)")
    (folder / "c.yaml").write_text(yaml.safe_dump({**BASE, "data_args_path": "args.txt"}))
    _one_line(mmfs("build", folder / "c.yaml"), "more than any arguments file (256 MiB at most)")


def test_an_arguments_file_past_16_mib_is_read_whole(tmp_path):
    """379,271 datasets (17 MB): every one reaches the config, the last one whole."""
    folder = _folder(tmp_path)
    n = 379_271
    with open(folder / "args.txt", "w") as f:
        f.write(" ".join(LINE[2:]) + " --micro-batch-size 1 --world-size 1\n--data-path \\\n")
        for i in range(n):
            f.write(f"0.001 /data/corpus/part-{i:07d}_text_document \\\n")
        f.write("\n")
    assert os.path.getsize(folder / "args.txt") > 17_000_000
    proc = mmfs("config", "--from-megatron", "@args.txt", cwd=folder, timeout=600)
    assert proc.returncode == 0, proc.stderr
    words = yaml.load(proc.stdout, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["data_path"]
    assert len(words) == 2 * n and words[-1] == f"/data/corpus/part-{n - 1:07d}_text_document"
    # quoting and comments still read as a shell reads them
    assert split_words("--a 'b c' # d\n\"e\\\"f\" \\\ng") == ["--a", "b c", 'e"f', "g"]


def test_a_launch_line_without_a_world_size_says_data_parallel_size_is_1(tmp_path):
    folder = _folder(tmp_path)
    old = os.environ.pop("WORLD_SIZE", None)
    try:
        proc = mmfs("config", "--from-megatron", *LINE, "--micro-batch-size", "1", cwd=folder)
    finally:
        if old is not None:
            os.environ["WORLD_SIZE"] = old
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("\n") == 1 and "data_parallel_size: 1 because the launch line gives no world size" \
        in proc.stderr and "--world-size" in proc.stderr and "WORLD_SIZE" in proc.stderr, proc.stderr
    assert "# data_parallel_size: 1 because the launch line gives no world size" in proc.stdout
    assert yaml.safe_load(proc.stdout)["training"]["data_parallel_size"] == 1
    given = mmfs("config", "--from-megatron", *LINE, "--micro-batch-size", "1", "--world-size", "1", cwd=folder)
    assert given.returncode == 0 and given.stderr == "" and "world size" not in given.stdout


def test_hybrid_context_parallel_says_ranks_do_not_show_what_a_rank_trains_on(tmp_path):
    folder = _folder(tmp_path)
    proc = mmfs("config", "--from-megatron", *LINE, "--micro-batch-size", "1", "--world-size", "4",
                "--context-parallel-size", "2", "--hybrid-context-parallel", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    line = "--hybrid-context-parallel: Megatron reroutes sub-samples between the data x context parallel ranks"
    assert proc.stderr.count("\n") == 1 and line in proc.stderr, proc.stderr
    assert f"# {line}" in proc.stdout and "train/ranks/ nor train/streams/" in proc.stdout
    assert yaml.safe_load(proc.stdout)["training"]["data_parallel_size"] == 2

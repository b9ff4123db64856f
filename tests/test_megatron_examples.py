"""Megatron-LM's own GPT example launch lines (examples/gpt3, examples/llama,
examples/mixtral at core_v0.19.0 and at main), adapted to local data as
tests/reference/record_megatron_examples.py records them with what Megatron's
parse_args, validate_args and pretrain_gpt.py's dataset provider make of each: a line
Megatron refuses, `mmfs config --from-megatron` refuses in one line (exit 2); every
other gives a config whose mount serves Megatron's split lengths and samples (issue 42
item 1)."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import numpy as np
import pytest

from golden_cases import GOLDEN
from mmfs.loader import Mount
from mount_fixtures import mmfs, mounted

HERE = Path(__file__).resolve().parent
RECORDED = json.loads((HERE / "reference" / "megatron_examples.json").read_text())
PREPROCESS = HERE / "golden" / "preprocess"


def _folder(tmp_path: Path) -> Path:
    for link, target in (("data", GOLDEN / "data"), ("tok", PREPROCESS / "tokenizers"),
                         ("hf", PREPROCESS / "hf_tokenizer")):
        (tmp_path / link).symlink_to(target, target_is_directory=True)
    return tmp_path


def digest(tokens: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:16]


def test_the_recording_says_where_it_came_from():
    p = RECORDED["provenance"]
    assert p["megatron-core"] == "0.19.2" and set(p["commits"]) == {"core_v0.19.0", "main"}
    for example in RECORDED["examples"].values():
        assert example["commit"] in p["commits"].values() and example["launch"]
    # Megatron-LM's own GPT-3 script as written: its unquoted array splits the schedule
    assert "unrecognized arguments: 2.4B:320" in RECORDED["examples"]["main:train_gpt3_175b_distributed"][
        "megatron"]["refused"]


@pytest.mark.parametrize("name", sorted(RECORDED["examples"]))
def test_an_example_line_gives_megatron_s_samples_or_megatron_s_refusal(name, tmp_path, monkeypatch):
    example = RECORDED["examples"][name]
    folder = _folder(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", str(example["world_size"]))
    done = mmfs("config", "--from-megatron", *shlex.split(example["adapted"]), cwd=folder)
    megatron = example["megatron"]
    if "refused" in megatron:
        assert done.returncode == 2 and done.stdout == "", (megatron["refused"], done.stderr)
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("mmfs: error: ")
        return
    assert done.returncode == 0, done.stderr
    (folder / "run.yaml").write_text(done.stdout)
    with mounted(folder / "run.yaml", folder / "mnt") as m:
        mount = Mount(m.path)
        assert mount.training["data_parallel_size"] == megatron["data_parallel_size"]
        for split, want in megatron["splits"].items():
            assert mount.split_samples(split) == want["samples"], split
            got = [digest(mount.sample(split, i)) for i in range(len(want["digests"]))]
            assert got == want["digests"], split

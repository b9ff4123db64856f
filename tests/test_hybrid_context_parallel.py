"""--hybrid-context-parallel (issue 42 item 4): Megatron-LM wraps the train iterator in
HybridCPDataLoaderWrapper (training.py, core_v0.19.0 and main), which re-deals each
step's sub-samples between the data x context parallel ranks. The config says
training.hybrid_context_parallel; the mount does not serve train/ranks/ nor
train/streams/ and mmfs.json says why; valid's and test's views are served as
without it; `mmfs which` says its train rank answers are the samplers'."""

from __future__ import annotations

import json

import pytest
import yaml

from golden_cases import GOLDEN
from mmfs.mount.manifest import HYBRID_CP_WHY
from mount_fixtures import mmfs, mounted

LINE = ["--data-path", "data/u16_docs", "--split", "90,8,2", "--seq-length", "64", "--tokenizer-type",
        "NullTokenizer", "--vocab-size", "50257", "--micro-batch-size", "2", "--global-batch-size", "16",
        "--train-iters", "50", "--eval-interval", "100", "--eval-iters", "1", "--world-size", "8",
        "--context-parallel-size", "2", "--data-cache-path", "cache"]


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    return tmp_path


@pytest.mark.parametrize("sampler", ["single", "cyclic"])
def test_train_ranks_and_streams_are_not_served(folder, sampler):
    done = mmfs("config", "--from-megatron", *LINE, "--hybrid-context-parallel", "--dataloader-type", sampler,
                cwd=folder)
    assert done.returncode == 0, done.stderr
    assert "--hybrid-context-parallel" in done.stderr
    assert yaml.safe_load(done.stdout)["training"]["hybrid_context_parallel"] is True
    (folder / "run.yaml").write_text(done.stdout)
    with mounted(folder / "run.yaml", folder / "mnt") as m:
        assert sorted(p.name for p in (m.path / "train").iterdir()) == ["samples"]
        assert not (m.path / "train" / "streams" / "dp=4,mbs=2").exists()
        assert (m.path / "valid" / "ranks" / "000").is_dir() and (m.path / "valid" / "streams").is_dir()
        training = json.loads((m.path / "mmfs.json").read_text())["training"]
        assert training["not_served"] == {"train/ranks": HYBRID_CP_WHY, "train/streams": HYBRID_CP_WHY}
        assert "train" not in training["ranks_path"] and "valid" in training["ranks_path"]
    which = mmfs("which", folder / "run.yaml", "--iteration", "1", "--json")
    answer = json.loads(which.stdout)
    assert answer["not_what_a_rank_trains_on"] == HYBRID_CP_WHY
    assert all(b["file"] is None for r in answer["ranks"] for b in r["microbatches"])
    text = mmfs("which", folder / "run.yaml", "--iteration", "1").stdout
    assert "not what the rank trains on" in text
    valid = json.loads(mmfs("which", folder / "run.yaml", "--iteration", "1", "--split", "valid", "--json").stdout)
    assert "not_what_a_rank_trains_on" not in valid


def test_without_it_train_ranks_are_served(folder):
    done = mmfs("config", "--from-megatron", *LINE, cwd=folder)
    assert "hybrid_context_parallel" not in done.stdout
    (folder / "run.yaml").write_text(done.stdout)
    with mounted(folder / "run.yaml", folder / "mnt") as m:
        assert (m.path / "train" / "ranks").is_dir()
        assert "not_served" not in json.loads((m.path / "mmfs.json").read_text())["training"]


def test_the_key_is_a_boolean(folder):
    done = mmfs("config", "--from-megatron", *LINE, "--hybrid-context-parallel", cwd=folder)
    (folder / "run.yaml").write_text(done.stdout.replace("hybrid_context_parallel: true",
                                                         "hybrid_context_parallel: 3"))
    built = mmfs("build", folder / "run.yaml")
    assert built.returncode == 2 and "training.hybrid_context_parallel" in built.stderr
    assert "expected true or false" in built.stderr

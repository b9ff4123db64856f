"""The optional `training:` block: parsed, checked (one line naming the key, exit 2
from `mmfs build`), and the sample counts Megatron derives from train_iters."""

from __future__ import annotations

import json

import pytest
import yaml

from golden_cases import write_case_config
from mmfs.config.schema import load_config
from mount_fixtures import mmfs

GOOD = {"data_parallel_size": 4, "micro_batch_size": 2}


def _config(tmp_path, training, drop_samples=False):
    path = write_case_config("p1_single_u16", tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["training"] = training
    if drop_samples:
        raw.pop("samples")
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("training,key,words", [
    ([4, 2], "training", "expected a mapping"),
    ({**GOOD, "tensor_parallel_size": 2}, "training.tensor_parallel_size", "unknown key"),
    ({"micro_batch_size": 2}, "training.data_parallel_size", "missing"),
    ({"data_parallel_size": 4}, "training.micro_batch_size", "missing"),
    ({**GOOD, "micro_batch_size": 0}, "training.micro_batch_size", "at least 1"),
    ({**GOOD, "data_parallel_size": "8"}, "training.data_parallel_size", "expected an integer"),
    ({**GOOD, "data_parallel_size": 16385}, "training.data_parallel_size", "at most 16384"),
    ({**GOOD, "data_parallel_size": 2**63}, "training.data_parallel_size", "at most 16384"),
    ({**GOOD, "micro_batch_size": -1}, "training.micro_batch_size", "at least 1"),
    ({**GOOD, "dataloader_type": "external"}, "training.dataloader_type", "single or cyclic"),
    ({**GOOD, "data_sharding": False}, "training.data_sharding", "only applies with dataloader_type: cyclic"),
    ({**GOOD, "dataloader_type": "cyclic", "data_sharding": "yes"}, "training.data_sharding", "true or false"),
    ({**GOOD, "global_batch_size": 12}, "training.global_batch_size",
     "not a multiple of micro_batch_size x data_parallel_size = 8"),
    ({**GOOD, "train_iters": 10}, "training.global_batch_size", "missing"),
    ({**GOOD, "global_batch_size": 8, "train_iters": 10}, "training.eval_interval", "missing"),
    ({**GOOD, "eval_iters": 10}, "training.eval_iters", "only used with train_iters"),
    ({**GOOD, "global_batch_size": 8, "train_iters": 10, "eval_interval": 0}, "training.eval_interval",
     "at least 1"),
    ({**GOOD, "global_batch_size": 8, "train_iters": 10, "eval_interval": 5, "eval_iters": 1}, "samples.train",
     "disagrees with training.train_iters, which gives 80"),
])
def test_a_bad_training_block_is_one_line_naming_the_key(tmp_path, training, key, words):
    config = _config(tmp_path, training)
    proc = mmfs("build", config)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert f"{config}: {key}: " in proc.stderr and words in proc.stderr, proc.stderr


def test_train_iters_derive_the_sample_counts_as_megatron_does(tmp_path):
    training = {**GOOD, "dataloader_type": "cyclic", "global_batch_size": 16, "train_iters": 10,
                "eval_interval": 4, "eval_iters": 2}
    config = load_config(str(_config(tmp_path, training, drop_samples=True)))
    # Megatron: train_iters * gbs; (train_iters // eval_interval + 1) * eval_iters * gbs; eval_iters * gbs
    assert config.samples == {"train": 160, "valid": (10 // 4 + 1) * 2 * 16, "test": 32}
    assert config.training.data_sharding is True  # Megatron's default
    proc = mmfs("build", config.path, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["config"]["training"] == {**training, "data_sharding": True}


def test_megatrons_default_eval_iters_and_agreeing_counts(tmp_path):
    training = {**GOOD, "global_batch_size": 8, "train_iters": 125, "eval_interval": 1000}
    path = _config(tmp_path, training)  # the case gives samples.train 1000 = 125 x 8
    raw = yaml.safe_load(path.read_text())
    raw["samples"] = {"train": 1000, "valid": None, "test": None}
    path.write_text(yaml.safe_dump(raw))
    config = load_config(str(path))
    assert config.samples == {"train": 1000, "valid": 1 * 100 * 8, "test": 100 * 8}


def test_without_the_block_nothing_changes(tmp_path):
    path = write_case_config("p1_single_u16", tmp_path)
    config = load_config(str(path))
    assert config.training is None and config.as_dict()["training"] is None
    assert config.samples == {"train": 1000, "valid": 40, "test": 4}

"""What megatron-core 0.19.2 does where a config sizes its splits from the training
arguments or gives a split no sequences, recorded by
tests/reference/record_derived_counts.py, and what mmfs does in each case: the same
samples where Megatron builds them, one line saying what Megatron does where it
hangs or asserts, before any index is built."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from golden_cases import GOLDEN
from mmfs.formats.writer import IndexedDatasetWriter
from mmfs.megatron import open_corpus
from mount_fixtures import mmfs, mounted

RECORDED = json.loads((Path(__file__).parent / "reference" / "derived_counts.json").read_text())


def _derived_config(tmp_path) -> Path:
    d = RECORDED["derived"]
    b = d["blend"]
    (tmp_path / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    config = tmp_path / "derived.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": [{"path": p, "weight": w} for p, w in zip(b["prefixes"], b["weights"])],
        "split": b["split"], "sequence_length": b["sequence_length"], "seed": b["seed"],
        "tokenizer": {"eod": b["eod"], "pad": None}, "cache_dir": "cache", "training": d["training"]}))
    return config


def test_a_weighted_blend_sized_by_train_iters_is_megatrons(tmp_path):
    config = _derived_config(tmp_path)
    corpus = open_corpus(str(config), progress=False)
    recorded = RECORDED["derived"]["splits"]
    assert corpus.config.samples == dict(zip(("train", "valid", "test"), RECORDED["derived"]["sizes"]))
    for name, split in corpus.splits.items():
        want = recorded[name]
        assert len(split) == want["samples"]
        assert [len(g) for g in corpus.indices[name].gpts] == want["gpt_samples"]
        digest = hashlib.sha256()
        for i in range(len(split)):  # Megatron's tokens: the sample without its extra token
            digest.update(split.tokens(i)[:-1].astype(np.int64).tobytes())
        assert digest.hexdigest() == want["tokens_sha256"], name
    with mounted(config, tmp_path / "mnt") as m:
        manifest = json.loads((m.path / "mmfs.json").read_text())
        assert manifest["samples"] == {k: v["samples"] for k, v in recorded.items()}


def _zero_config(tmp_path, case: str) -> Path:
    z = RECORDED["zero_sequences"]
    c = z["cases"][case]
    rng = np.random.RandomState(0)
    for prefix, n in z["lengths"].items():
        with IndexedDatasetWriter(str(tmp_path / f"{prefix}.bin"), dtype=np.uint16) as w:
            for _ in range(n):
                w.add_item(rng.randint(1, 100, size=20))
                w.end_document()
            w.finalize(str(tmp_path / f"{prefix}.idx"))
    weights = c["weights"] or [None] * len(c["prefixes"])
    raw = {"datasets": [{"path": p, **({"weight": w} if w is not None else {})}
                        for p, w in zip(c["prefixes"], weights)],
           "split": z["split"], "sequence_length": z["sequence_length"], "seed": z["seed"],
           "tokenizer": {"eod": z["eod"]}, "cache_dir": "cache"}
    if c["sizes"][0] is not None:
        raw["samples"] = dict(zip(("train", "valid", "test"), c["sizes"]))
    config = tmp_path / f"{case}.yaml"
    config.write_text(yaml.safe_dump(raw))
    return config


@pytest.mark.parametrize("case", sorted(RECORDED["zero_sequences"]["cases"]))
def test_a_split_of_no_sequences_is_what_megatron_does(tmp_path, case):
    recorded = RECORDED["zero_sequences"]["cases"][case]
    config = _zero_config(tmp_path, case)
    proc = mmfs("build", config, "--json")
    if recorded["outcome"] == "built":
        assert proc.returncode == 0, proc.stderr
        samples = json.loads(proc.stdout)["samples"]
        assert [samples.get(s, 0) for s in ("train", "valid")] == recorded["samples"][:2]
        assert mmfs("build", config).returncode == 0  # and again, from the cache
        return
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    words = {"hang": "Megatron's GPTDataset hangs on it",
             "AssertionError": "its BlendedDataset asserts that every weight is above 0"}
    assert f"{config}: datasets: " in proc.stderr and words[recorded["outcome"]] in proc.stderr
    cache = tmp_path / "cache"  # refused before any index was built
    assert not (cache.exists() and any(n.endswith(".npy") for n in os.listdir(cache)))


def test_a_derived_count_too_big_names_its_keys_before_any_index_is_built(tmp_path):
    config = _derived_config(tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["training"]["train_iters"] = 10**9
    config.write_text(yaml.safe_dump(raw))
    proc = mmfs("build", config)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{config}: training.train_iters × training.global_batch_size: " in proc.stderr
    assert "GiB of memory" in proc.stderr
    cache = tmp_path / "cache"
    assert not (cache.exists() and any(n.endswith(".npy") for n in os.listdir(cache)))

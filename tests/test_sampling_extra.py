"""More megatron-core 0.19.2 reference cases (tests/golden/extra_cases.json): samples of
every split (as a sha256 of int64 rows) and the cache file names, through the YAML."""

import hashlib
import json
import os

import numpy as np
import pytest
import yaml

from golden_cases import GOLDEN, SPLITS
from mmfs.megatron import open_corpus

CASES = json.loads((GOLDEN / "extra_cases.json").read_text())


def entries(blend):
    if blend is None:
        return None
    prefixes, weights = blend
    weights = weights or [None] * len(prefixes)
    return [{"path": p, **({} if w is None else {"weight": w})} for p, w in zip(prefixes, weights)]


def write_config(case, folder):
    c = case["config"]
    config = {
        "samples": dict(zip(SPLITS, c["sizes"])),
        "sequence_length": c["S"],
        "seed": c["seed"],
        "add_extra_token_to_sequence": c["e"],
        "drop_last_partial_validation_sequence": c["drop_last"],
        "mid_level_dataset_surplus": c["surplus"],
        "tokenizer": {"eod": c["eod"], "pad": c["pad"], "vocab_size": c["vocab"]},
        "cache_dir": "cache",
    }
    if c["blend"]:
        config["datasets"] = entries(c["blend"])
        config["split"] = c["split"]
    else:
        config["blend_per_split"] = dict(zip(SPLITS, map(entries, c["blend_per_split"])))
    (folder / "data").symlink_to(GOLDEN / "data", target_is_directory=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_extra_case(tmp_path, case):
    corpus = open_corpus(str(write_config(case, tmp_path)), progress=False)
    assert sorted(os.listdir(tmp_path / "cache")) == case["cache_files"]
    for split, info in case["splits"].items():
        if info is None:
            assert split not in corpus.indices
            continue
        reader = corpus.splits[split]
        assert len(reader) == info["length"]
        assert ("BlendedDataset" if corpus.indices[split].blend else "GPTDataset") == info["class"]
        rows = np.stack([reader.tokens(i) for i in range(len(reader))]).astype(np.int64)
        if corpus.pad == -1 and corpus.dtype.kind == "u":
            rows[rows == np.iinfo(corpus.dtype).max] = -1  # the pad, as Megatron's int64 holds it
        assert hashlib.sha256(rows.tobytes()).hexdigest() == info["samples_sha256"]

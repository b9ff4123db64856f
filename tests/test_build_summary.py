"""`mmfs build`'s summary says when Megatron's blend rounds a split up (Σ ceil(n·w))."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from golden_cases import GOLDEN
from mmfs.megatron.indices.blend import blend_rounding


@pytest.mark.parametrize("asked, weights, expected", [
    (15, [0.5, 0.5], [8, 8]),
    (16, [0.5, 0.5], None),
    (16, [0.3, 0.7], [5, 12]),  # ceil(4.8) + ceil(11.2)
    (0, [0.5, 0.5], None),
    (10, [1.0], None),
])
def test_blend_rounding(asked, weights, expected):
    assert blend_rounding(asked, weights) == expected


def test_build_says_when_a_split_gets_more_than_asked(tmp_path):
    data = GOLDEN / "data"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "datasets": [{"path": str(data / "u16_docs"), "weight": 0.5},
                     {"path": str(data / "u16_multiseq"), "weight": 0.5}],
        "split": "90,8,2", "samples": {"train": 100, "valid": 15, "test": 4}, "sequence_length": 32,
        "tokenizer": {"eod": 0}, "cache_dir": str(tmp_path / "cache")}))
    out = subprocess.run([sys.executable, "-m", "mmfs.cli", "-q", "build", str(config)], capture_output=True,
                         text=True, check=True).stdout
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if line.startswith("  ") and
             not line.startswith("    ")}
    assert lines["valid"].endswith("valid: 16 samples (BlendedDataset); 1 more than the 15 asked (samples.valid): "
                                   "Megatron's blend takes ceil(15 × weight) of each dataset, 8 + 8")
    assert lines["train"].endswith("train: 100 samples (BlendedDataset)")
    assert lines["test"].endswith("test: 4 samples (BlendedDataset)")

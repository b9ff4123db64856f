"""The public golden cases (megatron-core 0.19.2 outputs) as mmfs configs.

Each case.json names dataset prefixes relative to the golden/ folder (e.g.
"data/u16_docs"); Megatron hashed that exact string into its cache names, so the
config written here uses the same strings, with a `data` link beside the YAML.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import yaml

GOLDEN = Path(__file__).resolve().parent / "golden"
PUBLIC = GOLDEN / "public"
SPLITS = ("train", "valid", "test")


def case_names() -> list[str]:
    return sorted(p.name for p in PUBLIC.iterdir() if (p / "case.json").is_file())


def load_case(name: str) -> dict:
    return json.loads((PUBLIC / name / "case.json").read_text())


def _blend_entries(blend: dict | None) -> list[dict] | None:
    if blend is None:
        return None
    weights = blend["weights"]
    entries = []
    for i, prefix in enumerate(blend["prefixes"]):
        entry = {"path": prefix}
        if weights is not None:
            entry["weight"] = weights[i]
        entries.append(entry)
    return entries


def case_config(case: dict) -> dict:
    """The mmfs YAML (as a dict) equivalent to a case's Megatron config."""
    c = case["config"]
    tok = c["tokenizer"]
    out: dict = {}
    if c["blend"] is not None:
        out["datasets"] = _blend_entries(c["blend"])
        out["split"] = c["split"]
    else:
        out["blend_per_split"] = {
            s: _blend_entries(b) for s, b in zip(SPLITS, c["blend_per_split"])
        }
    out["samples"] = dict(zip(SPLITS, c["sizes"]))
    out["sequence_length"] = c["sequence_length"]
    out["seed"] = c["random_seed"]
    out["add_extra_token_to_sequence"] = c["add_extra_token_to_sequence"]
    out["drop_last_partial_validation_sequence"] = c["drop_last_partial_validation_sequence"]
    out["mid_level_dataset_surplus"] = c["mid_level_dataset_surplus"]
    out["tokenizer"] = {"eod": tok["eod_id"], "pad": tok["pad_id"], "vocab_size": tok["vocab_size"]}
    out["cache_dir"] = "cache"
    return out


def write_case_config(case_name: str, out_dir: str | os.PathLike) -> Path:
    """Write <out_dir>/config.yaml for a case, with <out_dir>/data -> golden/data."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    link = out_dir / "data"
    if not link.exists():
        link.symlink_to(GOLDEN / "data", target_is_directory=True)
    path = out_dir / "config.yaml"
    path.write_text(yaml.safe_dump(case_config(load_case(case_name)), sort_keys=False))
    return path


def expected_samples(case_name: str, split: str) -> np.ndarray | None:
    """Megatron's samples of a split (int32 rows; pad as -1), or None if absent."""
    split_info = load_case(case_name)["splits"].get(split)
    if split_info is None:
        return None
    return np.load(PUBLIC / case_name / split_info["samples"])


# A small weighted blend of two golden datasets (paths relative to a folder
# holding a `data` link to golden/data), for config and cache tests.
BLEND_CONFIG = {
    "datasets": [{"path": "data/u16_docs", "weight": 0.7}, {"path": "data/u16_small", "weight": 0.3}],
    "split": "90,8,2",
    "samples": {"train": 100, "valid": 10, "test": 5},
    "sequence_length": 64,
    "seed": 3,
    "tokenizer": {"eod": 50256, "pad": None, "vocab_size": 50257},
    "cache_dir": "cache",
}

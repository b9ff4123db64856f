"""Record what megatron-core 0.19.2 builds for runs in phases (issue 27,
docs/phases.md). Writes phases.json beside this file.

restart (Megatron-LM's --phase-transition-iterations): each phase is the
BlendedDataset megatron-core builds from that phase's data arguments alone, with
train samples = (next boundary − boundary) × global_batch_size (the last phase: to
train_iters), read from its sample 0. Recorded: a digest of every sample of every
phase. continue: its first phase is the BlendedDataset of the first phase's
arguments with the run's train sample count; recorded: a digest of each of its
samples before the second phase, and of every valid and test sample (which phases
leave alone).

A sample's digest: the first 16 hex digits of sha256 of its tokens as int64.

Run from the repository root with a Python that has torch 2.13.0 (CPU) and
megatron-core 0.19.2 (no triton needed: the dataset modules are loaded with
the package __init__ files skipped):
    python tests/reference/record_phases.py
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent / "golden"
OUT = HERE / "phases.json"

# name: the run (prefixes relative to tests/golden; phases: (start_iteration, {prefix: weight}),
# or (start_iteration, prefix): one prefix without a weight, which megatron-core builds as a
# bare GPTDataset, not a one-dataset BlendedDataset; start_as: how the tests write each
# phase's start: start_iteration, start_samples or start_tokens)
CASES = {
    "two_datasets_weights_swap": {
        "split": "90,8,2", "sequence_length": 32, "seed": 1234,
        "training": {"global_batch_size": 8, "train_iters": 50, "eval_interval": 25, "eval_iters": 2},
        "phases": [(0, {"data/u16_docs": 0.7, "data/u16_multiseq": 0.3}),
                   (25, {"data/u16_docs": 0.3, "data/u16_multiseq": 0.7})],
    },
    "added_and_dropped_four_phases": {
        "split": "95,4,1", "sequence_length": 64, "seed": 7,
        "training": {"global_batch_size": 12, "train_iters": 40, "eval_interval": 20, "eval_iters": 2},
        "phases": [(0, {"data/u16_docs": 3.0, "data/u16_multiseq": 1.0}),
                   (10, {"data/u16_docs": 1.0, "data/u16_multiseq": 1.0, "data/u16_small": 2.0}),
                   (17, {"data/u16_multiseq": 0.2, "data/u16_small": 0.8}),
                   (31, {"data/u16_small": 0.1, "data/u16_docs": 0.5, "data/i32_docs": 0.3,
                         "data/u16_multiseq": 0.1})],
    },
    "multi_epoch_three_phases": {
        "split": "90,8,2", "sequence_length": 1024, "seed": 99,
        "training": {"global_batch_size": 16, "train_iters": 30, "eval_interval": 30, "eval_iters": 1},
        "phases": [(0, {"data/u16_small": 0.5, "data/u16_multiseq": 0.5}),
                   (8, {"data/u16_small": 0.9, "data/u16_multiseq": 0.1}),
                   (20, {"data/u16_multiseq": 1.0, "data/u16_small": 1.0})],
    },
}
# One prefix, bare and weighted, over a dataset read for almost two epochs (630 samples of
# 352 an epoch at 256 tokens: the bare GPTDataset keeps its last epoch apart, the one
# with the blend's 0.5 % surplus does not); datasets added and dropped; starts as samples
# and tokens.
CASES.update({
    "single_prefix_bare_then_weighted": {
        "split": "90,8,2", "sequence_length": 256, "seed": 3,
        "training": {"global_batch_size": 10, "train_iters": 186, "eval_interval": 50, "eval_iters": 1},
        "phases": [(0, {"data/u16_docs": 0.6, "data/u16_multiseq": 0.3, "data/i32_docs": 0.1}),
                   (30, "data/u16_small"),
                   (93, {"data/u16_small": 1.0}),
                   (156, {"data/u16_multiseq": 0.5, "data/u16_small": 0.25, "data/i32_docs": 0.25})],
        "start_as": ["start_iteration", "start_samples", "start_tokens", "start_iteration"],
    },
    "single_prefix_first_phase": {
        "split": "90,8,2", "sequence_length": 256, "seed": 11,
        "training": {"global_batch_size": 10, "train_iters": 63, "eval_interval": 30, "eval_iters": 1},
        "phases": [(0, "data/u16_small"),
                   (40, {"data/u16_small": 0.5, "data/u16_docs": 0.5})],
        "start_as": ["start_iteration", "start_tokens"],
    },
    "single_weighted_first_phase": {
        "split": "90,8,2", "sequence_length": 256, "seed": 11,
        "training": {"global_batch_size": 10, "train_iters": 63, "eval_interval": 30, "eval_iters": 1},
        "phases": [(0, {"data/u16_small": 2.0}),
                   (35, {"data/u16_docs": 0.5, "data/u16_small": 0.5}),
                   (50, {"data/i32_docs": 1.0, "data/u16_multiseq": 3.0})],
        "start_as": ["start_iteration", "start_samples", "start_iteration"],
    },
})
# continue only (Megatron's phase transitions need a fixed batch size): the first
# phase under a batch-size ramp-up, sized to the run's train_samples.
SCHEDULE_CASE = {
    "split": "90,8,2", "sequence_length": 32, "seed": 5,
    "training": {"global_batch_size": 16, "rampup_batch_size": [4, 4, 96], "train_samples": 800,
                 "eval_interval": 10, "eval_iters": 1},
    "phases": [(0, {"data/u16_multiseq": 0.4, "data/u16_docs": 0.6}),
               (12, {"data/u16_docs": 1.0})],
}


def load_megatron() -> None:
    """megatron-core's dataset modules without its package __init__ (which imports
    the training stack: triton and more). Only logging and the safe numpy loader
    (np.load of the index cache) are stubbed; the index math is the wheel's own."""
    root = os.path.dirname(importlib.util.find_spec("megatron").submodule_search_locations[0])
    for name in ("megatron", "megatron.core", "megatron.core.datasets", "megatron.core.tokenizers"):
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = module
    utils = types.ModuleType("megatron.core.utils")
    utils.log_single_rank = lambda logger, level, msg, *a, **k: logger.log(level, msg)
    sys.modules[utils.__name__] = utils
    sys.modules["megatron.core.tokenizers"].MegatronTokenizerBase = object
    safe = types.ModuleType("megatron.core.safe_globals")
    safe.safe_numpy_load = np.load
    sys.modules[safe.__name__] = safe


class Tokenizer:
    pad = -1
    vocab_size = None
    eod = 0
    unique_identifiers = {"class": "recorder", "eod": 0}


def build(blend: dict, sizes: list[int], case: dict, cache: str):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    config = GPTDatasetConfig(random_seed=case["seed"], sequence_length=case["sequence_length"],
                              path_to_cache=cache, tokenizer=Tokenizer(), reset_position_ids=False,
                              reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
                              blend=_blend(blend), split=case["split"])
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


def _blend(blend: dict | str) -> tuple:
    """megatron-core's blend: a bare prefix has no weights (get_blend_from_list of one word)."""
    return ([blend], None) if isinstance(blend, str) else (list(blend), list(blend.values()))


def digest(sample) -> str:
    tokens = np.ascontiguousarray(sample["tokens"].numpy(), dtype=np.int64)
    labels_tail = np.ascontiguousarray(sample["labels"].numpy()[-1:], dtype=np.int64)
    return hashlib.sha256(tokens.tobytes() + labels_tail.tobytes()).hexdigest()[:16]


def sizes_of(t: dict) -> tuple[int, int, int]:
    """Megatron-LM's get_train_valid_test_num_samples (without phases)."""
    gbs = t["global_batch_size"]
    if "train_samples" in t:
        train = t["train_samples"]
        iters = None
    else:
        iters = t["train_iters"]
        train = iters * gbs
    valid = ((iters if iters is not None else train // gbs) // t["eval_interval"] + 1) * t["eval_iters"] * gbs
    return train, valid, t["eval_iters"] * gbs


def record(case: dict, restart: bool) -> dict:
    train, valid, test = sizes_of(case["training"])
    gbs = case["training"]["global_batch_size"]
    starts = [it * gbs for it, _ in case["phases"][1:]]
    out: dict = {}
    with tempfile.TemporaryDirectory() as cache:
        first = build(case["phases"][0][1], [train, valid, test], case, cache)
        end = starts[0] if starts else train
        out["continue_first_phase"] = [digest(first[0][i]) for i in range(end)]
        out["valid"] = [digest(first[1][i]) for i in range(len(first[1]))]
        out["test"] = [digest(first[2][i]) for i in range(len(first[2]))]
        if restart:
            bounds = [0, *starts, train]
            phases = []
            for (_, blend), a, b in zip(case["phases"], bounds, bounds[1:]):
                # Megatron builds valid and test again in each phase; phases leave them to the top level
                built = build(blend, [b - a, valid, test], case, cache)
                phases.append([digest(built[0][i]) for i in range(b - a)])
            out["restart"] = phases
    return out


if __name__ == "__main__":
    load_megatron()
    import torch

    os.chdir(GOLDEN)
    cases = {}
    for name, case in CASES.items():
        cases[name] = {**case, "phases": [list(p) for p in case["phases"]], **record(case, restart=True)}
    # the ramp-up's first phase: a stock build sized to train_samples; its boundary is mmfs's to find
    cases["rampup_continue"] = {**SCHEDULE_CASE, "phases": [list(p) for p in SCHEDULE_CASE["phases"]]}
    with tempfile.TemporaryDirectory() as cache:
        train, valid, test = 800, (800 // 16 // 10 + 1) * 16, 16
        built = build(SCHEDULE_CASE["phases"][0][1], [train, valid, test], SCHEDULE_CASE, cache)
        cases["rampup_continue"]["first_phase_full"] = [digest(built[0][i]) for i in range(train)]
    import megatron.core.datasets.gpt_dataset as gpt

    OUT.write_text(json.dumps({"megatron_core": "0.19.2", "torch_version": torch.__version__,
                               "digest": "sha256(tokens as int64 + the last label)[:16]",
                               "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT} ({gpt.__name__})")

"""Record what megatron-core 0.19.2 builds for a weighted blend whose sample counts
come from the training arguments (train_iters, global_batch_size, eval_interval,
eval_iters), and what it does with a split that gets no sequences. Writes
derived_counts.json beside this file.

Run from the repository root with a Python that has torch 2.13.0 (CPU) and
megatron-core 0.19.2:
    python tests/reference/record_derived_counts.py
The sample counts are Megatron-LM's get_train_valid_test_num_samples:
train_iters x gbs; (train_iters // eval_interval + 1) x eval_iters x gbs;
eval_iters x gbs. A hang is recorded when the build has not returned after 20 s.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent / "golden"
OUT = HERE / "derived_counts.json"

TRAINING = {"data_parallel_size": 2, "micro_batch_size": 3, "global_batch_size": 12,
            "train_iters": 50, "eval_interval": 20, "eval_iters": 4}
BLEND = {"prefixes": ["data/u16_docs", "data/u16_multiseq"], "weights": [0.3, 0.7],
         "split": "90,8,2", "sequence_length": 64, "seed": 1234, "eod": 50256}

# A split of no sequences: round(0.99 * 10) = round(1.0 * 10) gives valid none of ten.
ZERO = {"split": "99,1,0", "sequence_length": 8, "seed": 1, "eod": 0, "lengths": {"a": 10, "b": 100}}
ZERO_CASES = {  # name: (prefixes, weights, sizes)
    "weighted": (["a", "b"], [1.0, 1.0], [100, 10, 0]),
    "by_length": (["a", "b"], None, [None, None, None]),
    "single_sized": (["a"], None, [100, 10, 0]),
    "single_unsized": (["a"], None, [None, None, None]),
}


class Tokenizer:
    pad = -1
    vocab_size = None

    def __init__(self, eod: int) -> None:
        self.eod = eod
        self.unique_identifiers = {"class": "recorder", "eod": eod}


def derived_sizes(t: dict) -> list[int]:
    gbs = t["global_batch_size"]
    return [t["train_iters"] * gbs, (t["train_iters"] // t["eval_interval"] + 1) * t["eval_iters"] * gbs,
            t["eval_iters"] * gbs]


def gpt_config(blend, split, sequence_length, seed, eod, cache):
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    return GPTDatasetConfig(random_seed=seed, sequence_length=sequence_length, path_to_cache=cache,
                            tokenizer=Tokenizer(eod), reset_position_ids=False, reset_attention_mask=False,
                            eod_mask_loss=False, create_attention_mask=False, blend=blend, split=split)


def build(sizes, config):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset

    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


def record_derived() -> dict:
    os.chdir(GOLDEN)
    sizes = derived_sizes(TRAINING)
    with tempfile.TemporaryDirectory() as cache:
        built = build(sizes, gpt_config((BLEND["prefixes"], BLEND["weights"]), BLEND["split"],
                                        BLEND["sequence_length"], BLEND["seed"], BLEND["eod"], cache))
        out = {}
        for name, ds in zip(["train", "valid", "test"], built):
            digest = hashlib.sha256()
            for i in range(len(ds)):
                digest.update(np.ascontiguousarray(ds[i]["tokens"].numpy(), dtype=np.int64).tobytes())
            out[name] = {"samples": len(ds), "gpt_samples": [len(d) for d in ds.datasets],
                         "tokens_sha256": digest.hexdigest()}
    return {"training": TRAINING, "blend": BLEND, "sizes": sizes, "splits": out}


def _zero_case(name: str, folder: str, queue) -> None:
    prefixes, weights, sizes = ZERO_CASES[name]
    os.chdir(folder)
    try:
        built = build(sizes, gpt_config((prefixes, weights), ZERO["split"], ZERO["sequence_length"],
                                        ZERO["seed"], ZERO["eod"], None))
        queue.put({"outcome": "built", "samples": [None if d is None else len(d) for d in built]})
    except AssertionError as exc:
        import traceback

        frame = traceback.extract_tb(exc.__traceback__)[-1]
        queue.put({"outcome": "AssertionError", "where": f"{Path(frame.filename).name}: {frame.line}"})


def record_zero() -> dict:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    out = {}
    with tempfile.TemporaryDirectory() as folder:
        rng = np.random.RandomState(0)
        for prefix, n in ZERO["lengths"].items():
            builder = IndexedDatasetBuilder(f"{folder}/{prefix}.bin", dtype=np.uint16)
            for _ in range(n):
                builder.add_document(np.asarray(rng.randint(1, 100, size=20)), [20])
            builder.finalize(f"{folder}/{prefix}.idx")
        for name in ZERO_CASES:
            queue = multiprocessing.Queue()
            proc = multiprocessing.Process(target=_zero_case, args=(name, folder, queue))
            proc.start()
            proc.join(20)
            if proc.is_alive():
                proc.kill()
                out[name] = {"outcome": "hang"}
            else:
                out[name] = queue.get(timeout=5)
    return {**ZERO, "cases": {k: {"prefixes": v[0], "weights": v[1], "sizes": v[2], **out[k]}
                              for k, v in ZERO_CASES.items()}}


if __name__ == "__main__":
    zero = record_zero()
    derived = record_derived()
    OUT.write_text(json.dumps({"derived": derived, "zero_sequences": zero}, indent=1) + "\n")
    print(OUT.read_text())

"""The reference matrix's data and runs (issue 31 item 5), shared by its recorder
(tests/reference/record_matrix.py, which runs Megatron's own code on them) and its
suite (tests/test_matrix.py, which runs mmfs on them). numpy only: the recorder's
Python has no mmfs.

Three small generated datasets, written the same three ways by the suite (an
IndexedDataset pair, a JSONL text the config tokenizes byte-level into its cache, and
the same pair in the S3 test server): token = byte of the ASCII text, EOD 256 after
each document, uint16, one sequence per document, so every storage kind holds the
same tokens and one recording serves them all.

The runs cross {single, cyclic sharded, cyclic unsharded} x {no phases, continue,
restart} x {constant batch, ramp-up, step schedule}; restart needs a constant global
batch (Megatron-LM's --phase-transition-iterations counts a phase's samples as
iterations x global batch size), so restart under a schedule is a refused cell.
"""

from __future__ import annotations

import json

import numpy as np

EOD = 256
SEQUENCE_LENGTH = 16
SEED = 31
SPLIT = "80,15,5"
DATASETS = {  # name: (documents, alphabet, RandomState seed)
    "web": (120, "abcdefghijklmnopqrstuvwxyz     ", 1),
    "code": (90, "(){};=.,abcxyz_ \n", 2),
    "math": (60, "0123456789+-*/=() ", 3),
}
DATA_PARALLEL_SIZE, MICRO_BATCH_SIZE = 2, 2
OTHER_LAYOUT = (4, 1)  # (dp, mbs) of a job resumed on another layout (dp x mbs divides every batch size)
TRAIN_SAMPLES = 240
EVAL_INTERVAL, EVAL_ITERS = 5, 2
SAMPLERS = {"single": ("single", True), "sharded": ("cyclic", True), "unsharded": ("cyclic", False)}
SCHEDULES = {  # the training: keys of each batch schedule (besides the layout and the run's length)
    "constant": {"global_batch_size": 8},
    # megatron-core <= 0.17's ramp-up (0.18+ ignore the flag): 4 until consumed sample 48, then 8
    "rampup": {"global_batch_size": 8, "rampup_batch_size": [4, 4, 48]},
    # tokens: 4 from 0, 8 from sample 40 (640 tokens), 16 from sample 160 (2,560 tokens)
    "step": {"step_batch_size_schedule": "0:4 640:8 2560:16"},
}
MODES = ("none", "continue", "restart")
# The phases: weights, then a bare prefix (megatron-core builds the GPTDataset itself,
# which can hold more samples than its phase), then three datasets. Phase k starts at
# iteration PHASE_STARTS[k - 1] (Megatron-LM's --phase-transition-iterations).
PHASES = [{"web": 0.6, "code": 0.4}, "math", {"web": 0.3, "code": 0.3, "math": 0.4}]
PHASE_STARTS = [10, 19]
REFUSED = {  # (mode, schedule): why Megatron-LM refuses it
    ("restart", "rampup"): "--phase-transition-iterations needs a fixed global batch size (Megatron-LM's help)",
    ("restart", "step"): "--phase-transition-iterations needs a fixed global batch size (Megatron-LM's help)",
}


def documents(name: str) -> list[str]:
    """The documents of dataset `name`: ASCII text of 4 to 69 characters."""
    count, alphabet, seed = DATASETS[name]
    rng = np.random.RandomState(seed)
    chars = np.array(list(alphabet))
    return ["".join(chars[rng.randint(0, len(chars), size=rng.randint(4, 70))]) for _ in range(count)]


def tokens(name: str) -> list[np.ndarray]:
    """Each document's tokens as `mmfs preprocess --tokenizer-type ByteLevel --append-eod` writes them."""
    return [np.array([*text.encode("ascii"), EOD], dtype=np.uint16) for text in documents(name)]


def jsonl(name: str) -> str:
    return "".join(json.dumps({"text": text}) + "\n" for text in documents(name))


def cells() -> list[tuple[str, str, str]]:
    """Every (sampler, mode, schedule) of the matrix, refused ones included."""
    return [(s, m, b) for m in MODES for b in SCHEDULES for s in SAMPLERS]


def training(sampler: str, schedule: str) -> dict:
    """The config's training: block of a cell."""
    dataloader_type, sharding = SAMPLERS[sampler]
    block = {"data_parallel_size": DATA_PARALLEL_SIZE, "micro_batch_size": MICRO_BATCH_SIZE,
             "dataloader_type": dataloader_type, **SCHEDULES[schedule], "train_samples": TRAIN_SAMPLES,
             "eval_interval": EVAL_INTERVAL, "eval_iters": EVAL_ITERS}
    if dataloader_type == "cyclic":
        block["data_sharding"] = sharding
    return block


def data_words(blend, path_of) -> list[str]:
    """A phase's --data-path words (a bare prefix stays one word, without a weight)."""
    if isinstance(blend, str):
        return [path_of(blend)]
    return [w for name, weight in blend.items() for w in (str(weight), path_of(name))]

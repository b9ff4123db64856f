"""One GPTDataset's indices, exactly as megatron-core builds them:
document index (numpy RandomState shuffle), sample index (C), shuffle index.

Shapes and dtypes (megatron-core's):
    document_index  int32[E * n]            sequence ids, E shuffled epochs
    sample_index    int32[N + 1, 2]         (document_index position, token offset);
                    int64 when len(document_index) exceeds int32
    shuffle_index   uint32[N]               a permutation of [0, N); int64 when N >= 2**32 - 2
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmfs.native import check, ffi, lib, pointer

log = logging.getLogger(__name__)

SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80
INT32_MAX = np.iinfo(np.int32).max
UINT32_MAX = np.iinfo(np.uint32).max


@dataclass(frozen=True)
class GptParams:
    """What one GPTDataset is built from (besides the dataset's sequence lengths)."""

    dataset_path: str  # as written in the config; hashed into the description
    split: str  # index split name: train, valid or test
    beg: int  # sequence ids [beg, end) of the split
    end: int
    num_samples: int | None
    sequence_length: int
    seed: int
    add_extra_token: bool
    drop_last_partial: bool
    config_split: str | None
    config_split_matrix: tuple | None
    tokenizer_identifiers: dict[str, Any]

    @property
    def extra(self) -> int:
        return int(self.add_extra_token)

    def description(self) -> str:
        """Megatron's unique description (json.dumps(indent=4)), whose MD5 names the cache."""
        ident = OrderedDict()
        ident["class"] = "GPTDataset"
        ident["dataset_path"] = self.dataset_path
        ident["num_samples"] = self.num_samples
        ident["index_split"] = self.split
        ident["random_seed"] = self.seed
        ident["sequence_length"] = self.sequence_length
        ident["split"] = self.config_split
        ident["split_matrix"] = self.config_split_matrix
        ident["tokenizer"] = self.tokenizer_identifiers
        return json.dumps(ident, indent=4)

    def identifiers(self) -> dict:
        return json.loads(self.description(), object_pairs_hook=OrderedDict)


def num_epochs(tokens_per_epoch: int, num_samples: int | None, seq_len: int, extra: int) -> int:
    """The smallest E >= 1 with E * T >= num_samples * S + extra (1 for num_samples None)."""
    if num_samples is None:
        return 1
    needed = num_samples * seq_len + extra
    return max(1, -(-needed // tokens_per_epoch))


@dataclass
class EpochPlan:
    tokens_per_epoch: int
    num_epochs: int
    separate_final_epoch: bool
    num_samples_sans_final_epoch: int | None


def plan_epochs(p: GptParams, tokens_per_epoch: int) -> EpochPlan:
    e, s = p.extra, p.sequence_length
    epochs = num_epochs(tokens_per_epoch, p.num_samples, s, e)
    if epochs == 1:
        return EpochPlan(tokens_per_epoch, 1, False, None)
    sans = ((epochs - 1) * tokens_per_epoch - e) // s
    from_final = p.num_samples - sans
    per_epoch = (tokens_per_epoch - e) // s
    separate = from_final < int(SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch)
    return EpochPlan(tokens_per_epoch, epochs, separate, sans)


def build_document_index(beg: int, end: int, epochs: int, rng: np.random.RandomState,
                         separate_final_epoch: bool) -> np.ndarray:
    """E copies of [beg, end) shuffled together; with a separate final epoch the
    first E-1 copies are shuffled, then the last one on its own (same RandomState)."""
    if not separate_final_epoch or epochs == 1:
        index = np.tile(np.arange(beg, end, dtype=np.int32), epochs)
        rng.shuffle(index)
        return index
    first = build_document_index(beg, end, epochs - 1, rng, False)
    last = build_document_index(beg, end, 1, rng, False)
    return np.concatenate((first, last))


def build_sample_index(lengths: np.ndarray, document_index: np.ndarray, p: GptParams,
                       plan: EpochPlan) -> np.ndarray:
    """Megatron's build_sample_idx, in C."""
    if plan.tokens_per_epoch == 0:  # a split of no tokens and no sample count: empty, as Megatron's
        return np.zeros((1, 2), dtype=np.int32)
    drop_last = int(p.drop_last_partial)
    n = lib.mmfs_sample_count(plan.num_epochs, plan.tokens_per_epoch, p.sequence_length,
                              drop_last, p.extra)
    check(n, "sample count")
    wide = len(document_index) > INT32_MAX
    out = np.empty((n + 1, 2), dtype=np.int64 if wide else np.int32)
    lengths = np.ascontiguousarray(lengths, dtype=np.int32)
    document_index = np.ascontiguousarray(document_index, dtype=np.int32)
    rc = lib.mmfs_build_sample_index(
        pointer(lengths, "int32_t *"), len(lengths),
        pointer(document_index, "int32_t *"), len(document_index),
        p.sequence_length, plan.num_epochs, plan.tokens_per_epoch, drop_last, p.extra,
        ffi.cast("void *", out.ctypes.data), n + 1, int(wide),
    )
    check(rc, f"{p.dataset_path} ({p.split}): sample index")
    return out


def build_shuffle_index(num_samples: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    """perm([0, num_samples)) then perm([num_samples, total)), from the same RandomState."""
    dtype = np.int64 if total >= UINT32_MAX - 1 else np.uint32
    first = np.arange(0, num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total:
        return first
    last = np.arange(num_samples, total, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def build_gpt_indices(lengths: np.ndarray, p: GptParams, label: str) -> dict[str, np.ndarray]:
    """All three indices of one GPTDataset; logs each step with its time (and, for
    a big one, what it is about to build first: each step can take minutes)."""
    t0 = time.perf_counter()
    tokens = int(np.asarray(lengths[p.beg : p.end]).sum(dtype=np.int64))
    plan = plan_epochs(p, tokens)
    size = predict_gpt_size(p, plan)
    announce = log.info if size.peak >= ANNOUNCE_BYTES else log.debug
    announce("%s: building the document index, %s epoch(s) x %s sequences (%s)", label,
             f"{plan.num_epochs:,}", f"{p.end - p.beg:,}", gib(size.document_index))
    rng = np.random.RandomState(p.seed)
    document_index = build_document_index(p.beg, p.end, plan.num_epochs, rng,
                                          plan.separate_final_epoch)
    t1 = time.perf_counter()
    log.info("%s: document index, %d epoch(s) x %d sequences (%.2f s)", label,
             plan.num_epochs, p.end - p.beg, t1 - t0)
    announce("%s: building the sample index, %s samples (%s)", label, f"{size.samples:,}",
             gib(size.sample_index))
    sample_index = build_sample_index(lengths, document_index, p, plan)
    total = sample_index.shape[0] - 1
    t2 = time.perf_counter()
    log.info("%s: sample index, %d samples (%.2f s)", label, total, t2 - t1)
    announce("%s: building the shuffle index (%s)", label, gib(size.shuffle_index))
    first = plan.num_samples_sans_final_epoch if plan.separate_final_epoch else total
    shuffle_index = build_shuffle_index(first, total, rng)
    t3 = time.perf_counter()
    log.info("%s: shuffle index (%.2f s); built in %.2f s", label, t3 - t2, t3 - t0)
    return {"document_index": document_index, "sample_index": sample_index,
            "shuffle_index": shuffle_index}


# -- sizes, predicted before a build ---------------------------------------------------

ANNOUNCE_BYTES = 256 << 20  # steps over this many bytes are announced before they run


def gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.1f} GiB" if nbytes >= 2**30 / 10 else f"{nbytes / 2**20:,.1f} MiB"


@dataclass(frozen=True)
class GptSize:
    """Bytes of one GPTDataset's indices, predicted from the counts alone."""

    epochs: int
    samples: int
    document_index: int
    sample_index: int
    shuffle_index: int
    peak: int  # memory while building (separate final epochs concatenate copies)

    @property
    def total(self) -> int:
        return self.document_index + self.sample_index + self.shuffle_index


def predict_gpt_size(p: GptParams, plan: EpochPlan) -> GptSize:
    """Python-int arithmetic, so that no count can overflow before it is judged."""
    s, e = p.sequence_length, p.extra
    tokens = plan.num_epochs * plan.tokens_per_epoch - e
    # drop_last=False counts with a float32 ceil in Megatron: at most one more
    samples = tokens // s if p.drop_last_partial else -(-tokens // s) + 1
    doc_entries = plan.num_epochs * (p.end - p.beg)
    document_index = 4 * doc_entries
    sample_index = (samples + 1) * 2 * (8 if doc_entries > INT32_MAX else 4)
    shuffle_index = samples * (8 if samples >= UINT32_MAX - 1 else 4)
    copies = 2 if plan.separate_final_epoch else 1
    peak = max(copies * document_index, document_index + sample_index + copies * shuffle_index)
    return GptSize(plan.num_epochs, samples, document_index, sample_index, shuffle_index, peak)

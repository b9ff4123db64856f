"""Megatron's data-parallel samplers, without torch: which samples each rank reads.

megatron-core 0.19.2's `megatron/training/datasets/data_samplers.py` hands each
data-parallel rank micro-batches of sample ids of a split (ids in training order,
i.e. the mount's sample files). Ported here exactly:

- `single` (MegatronPretrainingSampler, drop_last): ids consumed..total in groups
  of mbs*dp; rank r takes [r*mbs, (r+1)*mbs) of each group. No randomness.
- `cyclic` (MegatronPretrainingRandomSampler): active = total - total % (mbs*dp),
  epoch = consumed // active, and a permutation torch.randperm(n) from a generator
  seeded with the *epoch* (not the run's seed).
  sharded (data_sharding, Megatron's default): n = bucket = (total // (mbs*dp)) * mbs;
  rank r reads r*bucket + perm[(consumed % active) // dp:] in groups of mbs.
  unsharded: n = (total // mbs) * mbs; rank r reads perm[consumed % active:][r::dp]
  in groups of mbs.
  Each yield adds mbs*dp to the sampler's consumed count; when a pass ends the
  training loop iterates the sampler again (Megatron's cyclic_iter), which starts the
  next pass from that count.

torch.randperm is reproduced in C (native/mmfs_randperm.c): torch's CPU MT19937 and
its two algorithms (swap for n < 2**32 / 20, inside-out with 64-bit draws above).

The mount (`<split>/ranks/RRR/NNNNNNN.bin`) serves, for each rank, the first
`files = total // (mbs*dp)` micro-batches the rank reads from consumed_samples 0.
`RankPlan` describes them without listing them: file j of rank r is
`microbatch_ids(plan, r, j)` (in C: `mmfs_microbatch_ids` on `native_plan(plan)`,
native/mmfs_randperm.h). File j is also the first micro-batch Megatron reads
when it resumes at consumed_samples = j*mbs*dp, for every kind (for unsharded
cyclic, every rank has at least `files` micro-batches in epoch 0: perm[r::dp] holds
at least files*mbs ids).

Where Megatron's own resume differs from "read on from file j":
- cyclic, after the files: epoch 1 uses a new permutation (seed 1), and so on; the
  files hold epoch 0 only (`stream_microbatch` gives any later micro-batch).
- cyclic unsharded, when (total // mbs) * mbs > active: in an uninterrupted run a
  rank whose perm[r::dp] holds more than files*mbs ids reads those extra
  micro-batches before its next pass, so the ranks' counters drift apart
  (rank 0 may be in epoch 1 at an offset while rank 1 starts epoch 1 at 0). A
  job resumed at consumed_samples restarts every rank at the same point and so
  reads something else after the files than the uninterrupted run did.
- single: Megatron's iterator ends after the split (no second pass); resuming at
  consumed_samples >= total is an error in Megatron.
- valid: Megatron resumes validation at its own consumed_valid_samples; test
  always starts again at 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from mmfs.errors import MmfsError
from mmfs.megatron.arrays import ArrayPlacer
from mmfs.native import ffi, lib


class SamplerError(MmfsError):
    """A sampler was asked for something Megatron's sampler rejects."""


# -- torch.randperm and its generator ------------------------------------------


def mt19937_raw(seed: int, n: int) -> np.ndarray:
    """The first n 32-bit outputs of torch's CPU generator after manual_seed(seed)
    (also numpy's legacy RandomState(seed) stream)."""
    out = np.empty(n, dtype=np.uint32)
    rc = lib.mmfs_mt19937_raw(seed, n, ffi.cast("uint32_t *", out.ctypes.data))
    if rc < 0:
        raise ValueError(f"mt19937_raw: bad arguments (seed {seed}, n {n})")
    return out


def randperm(n: int, seed: int, dtype: Any = np.int64) -> np.ndarray:
    """torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU,
    as int64 (torch's dtype) or int32 (same values, half the memory)."""
    dtype = np.dtype(dtype)
    if n < 0 or seed < 0:
        raise ValueError(f"randperm: n and seed must not be negative (n {n}, seed {seed})")
    out = np.empty(n, dtype=dtype)
    if dtype == np.int64:
        rc = lib.mmfs_randperm_i64(seed, n, ffi.cast("int64_t *", out.ctypes.data))
    elif dtype == np.int32:
        rc = lib.mmfs_randperm_i32(seed, n, ffi.cast("int32_t *", out.ctypes.data))
    else:
        raise ValueError(f"randperm: dtype must be int64 or int32, not {dtype}")
    if rc < 0:
        raise ValueError(f"randperm: n {n} does not fit {dtype}")
    return out


@lru_cache(maxsize=4)
def epoch_permutation(n: int, epoch: int) -> np.ndarray:
    """randperm(n, epoch), read-only and kept for the next caller (a run reads
    one epoch's permutation over and over)."""
    perm = randperm(n, epoch)
    perm.flags.writeable = False
    return perm


def _index_dtype(n: int) -> np.dtype:
    return np.dtype(np.int32) if n <= np.iinfo(np.int32).max else np.dtype(np.int64)


# -- the samplers, as Megatron iterates them ------------------------------------


def _check(total: int, mbs: int, rank: int, dp: int) -> None:
    # Megatron's asserts, as errors.
    if total <= 0:
        raise SamplerError(f"no sample to consume: the split has {total} samples")
    if mbs <= 0 or dp <= 0:
        raise SamplerError(f"micro_batch_size ({mbs}) and data_parallel_size ({dp}) must be positive")
    if not 0 <= rank < dp:
        raise SamplerError(f"rank {rank} is not below data_parallel_size {dp}")


def single_sampler(total: int, consumed: int, mbs: int, rank: int, dp: int) -> Iterator[list[int]]:
    """MegatronPretrainingSampler(total, consumed, mbs, rank, dp), drop_last: one pass."""
    _check(total, mbs, rank, dp)
    if consumed >= total:
        raise SamplerError(f"no samples left to consume: consumed_samples {consumed} >= {total}")
    group = mbs * dp
    for first in range(consumed, total - group + 1, group):
        yield list(range(first + rank * mbs, first + (rank + 1) * mbs))


class RandomSampler:
    """MegatronPretrainingRandomSampler: each iteration is one pass over the epoch
    that `consumed_samples` falls in; yielding advances consumed_samples."""

    def __init__(self, total: int, consumed: int, mbs: int, rank: int, dp: int, data_sharding: bool) -> None:
        _check(total, mbs, rank, dp)
        self.total, self.consumed_samples = total, consumed
        self.mbs, self.rank, self.dp, self.data_sharding = mbs, rank, dp, data_sharding
        self.group = mbs * dp
        self.active = total - total % self.group
        if self.active == 0:
            raise SamplerError(
                f"cyclic sampler over {total} samples: fewer than micro_batch_size x data_parallel_size "
                f"= {self.group} (Megatron divides by zero here)"
            )

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.consumed_samples // self.active
        offset = self.consumed_samples % self.active
        if offset % self.group:
            raise SamplerError(
                f"consumed_samples {self.consumed_samples} is not a multiple of "
                f"micro_batch_size x data_parallel_size = {self.group} within its epoch"
            )
        if self.data_sharding:
            bucket = (self.total // self.group) * self.mbs
            ids = self.rank * bucket + randperm(bucket, epoch)[offset // self.dp:]
        else:
            full = (self.total // self.mbs) * self.mbs
            ids = randperm(full, epoch)[offset:][self.rank::self.dp]
        for k in range(len(ids) // self.mbs):
            self.consumed_samples += self.group
            yield ids[k * self.mbs:(k + 1) * self.mbs].tolist()


# -- the compact plan the mount serves ------------------------------------------


@dataclass(frozen=True)
class RankPlan:
    """Epoch 0 of one split's sampler, for every rank, without per-rank lists.

    kind:        "single" | "sharded" | "unsharded"
    total:       samples in the split
    micro_batch_size, data_parallel_size
    files_per_rank: total // (mbs * dp), the same for every rank
    permutation: None for single; else randperm(bucket_size, seed 0), C-contiguous,
                 int32 (int64 above 2**31 - 1 entries), shared by all ranks
    bucket_size: len(permutation); 0 for single
    """

    kind: str
    total: int
    micro_batch_size: int
    data_parallel_size: int
    files_per_rank: int
    bucket_size: int
    permutation: np.ndarray | None

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch_size * self.data_parallel_size


def plan_kind(dataloader_type: str, data_sharding: bool) -> str:
    if dataloader_type == "single":
        return "single"
    if dataloader_type == "cyclic":
        return "sharded" if data_sharding else "unsharded"
    raise SamplerError(f"unknown dataloader_type {dataloader_type!r} (single or cyclic)")


def plan_ranks(total: int, micro_batch_size: int, data_parallel_size: int,
               dataloader_type: str = "single", data_sharding: bool = True) -> RankPlan:
    """The plan of one split (total samples) under the training block's sampler."""
    mbs, dp = micro_batch_size, data_parallel_size
    if total < 0 or mbs <= 0 or dp <= 0:
        raise SamplerError(f"bad plan arguments: total {total}, micro_batch_size {mbs}, data_parallel_size {dp}")
    kind = plan_kind(dataloader_type, data_sharding)
    files = total // (mbs * dp)
    bucket = 0
    if kind == "sharded":
        bucket = files * mbs
    elif kind == "unsharded":
        bucket = (total // mbs) * mbs
    permutation = None if kind == "single" else randperm(bucket, 0, _index_dtype(bucket))
    return RankPlan(kind, total, mbs, dp, files, bucket, permutation)


def plan_splits(training_cfg: Any, split_lengths: dict[str, int]) -> dict[str, RankPlan]:
    """The plan of every split under a config's TrainingConfig (config.training);
    split_lengths: {split: samples}, e.g. from Corpus.splits."""
    return {
        split: plan_ranks(int(n), training_cfg.micro_batch_size, training_cfg.data_parallel_size,
                          training_cfg.dataloader_type, training_cfg.data_sharding)
        for split, n in split_lengths.items()
    }


_KIND_CODES = {"single": lib.MMFS_PLAN_SINGLE, "sharded": lib.MMFS_PLAN_SHARDED,
               "unsharded": lib.MMFS_PLAN_UNSHARDED}


def native_plan(plan: RankPlan, placer: ArrayPlacer | None = None):
    """The plan as the C struct `mmfs_rank_plan *` (native/mmfs_native.h), for the
    C reader of rank files (mmfs_microbatch_ids). The struct points into
    plan.permutation, placed by `placer` (in memory, or read with pread): keep
    the plan alive as long as the struct."""
    c = ffi.new("mmfs_rank_plan *")
    c.kind = _KIND_CODES[plan.kind]
    c.micro_batch_size = plan.micro_batch_size
    c.data_parallel_size = plan.data_parallel_size
    c.files_per_rank = plan.files_per_rank
    c.bucket_size = plan.bucket_size
    perm = plan.permutation
    if perm is not None and perm.size:
        placed = (placer or ArrayPlacer()).place(c.permutation, perm)
        if placed is not perm:
            raise ValueError("plan.permutation must be C-contiguous, native int32 or int64")
    return c


def _check_rank(plan: RankPlan, rank: int) -> None:
    if not 0 <= rank < plan.data_parallel_size:
        raise SamplerError(f"rank {rank} is not below data_parallel_size {plan.data_parallel_size}")


def microbatch_ids(plan: RankPlan, rank: int, j: int) -> np.ndarray:
    """Sample ids (int64, [mbs]) of micro-batch file j of `rank`, by the C
    reader's formula (mmfs_microbatch_ids, native/mmfs_native.h: the one copy)."""
    _check_rank(plan, rank)
    if not 0 <= j < plan.files_per_rank:
        raise SamplerError(f"micro-batch {j} is not below the {plan.files_per_rank} files of a rank")
    out = np.empty(plan.micro_batch_size, dtype=np.int64)
    rc = lib.mmfs_microbatch_ids(native_plan(plan), rank, j, ffi.cast("int64_t *", out.ctypes.data))
    if rc < 0:
        raise SamplerError(f"micro-batch {j} of rank {rank}: not in the plan (error {rc})")
    return out


# -- any micro-batch of an uninterrupted run -------------------------------------


def stream_microbatch(plan: RankPlan, rank: int, n: int) -> tuple[np.ndarray, int] | None:
    """(ids, epoch) of the n-th micro-batch (0-based) `rank` reads in a run started
    at consumed_samples 0, as the training loop iterates; None where Megatron's
    iterator has ended (single, after the split)."""
    _check_rank(plan, rank)
    if n < 0:
        raise SamplerError(f"micro-batch {n} is negative")
    if n < plan.files_per_rank:
        return microbatch_ids(plan, rank, n), 0
    if plan.kind == "single":
        return None
    mbs, dp, group = plan.micro_batch_size, plan.data_parallel_size, plan.samples_per_step
    active = plan.files_per_rank * group
    if plan.kind == "sharded":  # every pass is a whole epoch of files_per_rank
        epoch, j = divmod(n, plan.files_per_rank)
        perm = epoch_permutation(plan.bucket_size, epoch)
        return rank * plan.bucket_size + perm[j * mbs:(j + 1) * mbs], epoch
    consumed, remaining = 0, n
    while True:  # unsharded: passes may end off the epoch boundary (see the module doc)
        epoch, offset = divmod(consumed, active)
        count = max(0, -(-(plan.bucket_size - offset - rank) // dp)) // mbs
        if remaining < count:
            perm = epoch_permutation(plan.bucket_size, epoch)
            m = np.arange(mbs, dtype=np.int64)
            return perm[offset + (remaining * mbs + m) * dp + rank], epoch
        remaining -= count
        consumed += count * group

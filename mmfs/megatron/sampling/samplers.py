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

torch.randperm: mmfs/megatron/sampling/randperm.py; the compact plans of the files the
mount serves: mmfs/megatron/sampling/rankplan.py.
"""

from __future__ import annotations

from collections.abc import Iterator

from mmfs.errors import MmfsError
from mmfs.megatron.sampling.randperm import randperm


class SamplerError(MmfsError):
    """A sampler was asked for something Megatron's sampler rejects."""


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


def training_stream(dataloader_type: str, total: int, consumed: int, mbs: int, rank: int, dp: int,
                    data_sharding: bool = True) -> Iterator[list[int]]:
    """The micro-batches a rank reads from `consumed`, as Megatron's training loop
    iterates its data loader: `single` once; `cyclic` again and again (cyclic_iter)."""
    if dataloader_type == "single":
        yield from single_sampler(total, consumed, mbs, rank, dp)
        return
    if dataloader_type != "cyclic":
        raise SamplerError(f"unknown dataloader_type {dataloader_type!r} (single or cyclic)")
    sampler = RandomSampler(total, consumed, mbs, rank, dp, data_sharding)
    while True:
        count = 0
        for batch in sampler:
            count += 1
            yield batch
        if count == 0:
            raise SamplerError("the cyclic sampler produced no micro-batch in a pass")

"""Does a job that resumes on another layout read every sample exactly once?

A job ran on the old layout from consumed_samples 0 to C (each rank as
Megatron's training loop iterates its sampler, again and again for cyclic) and
resumes with Megatron's sampler rebuilt on the new layout at consumed_samples C,
which makes one pass: to the end of the split (single) or of its epoch (cyclic).

What the two read together is compared with what the old layout, uninterrupted,
reads in the same pass: for single, its one pass over the split; for cyclic, its
pass over the epoch the new sampler resumes in (only what the old job read in that
epoch counts). Repeated: ids read more than once; skipped: ids of that pass
never read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mmfs.megatron.sampling.rankplan import plan_stream, rank_ids
from mmfs.megatron.sampling.samplers import SamplerError


@dataclass(frozen=True)
class Sampling:
    """A data-parallel layout and its sampler."""

    data_parallel_size: int
    micro_batch_size: int
    dataloader_type: str = "single"
    data_sharding: bool = True

    @property
    def group(self) -> int:
        return self.data_parallel_size * self.micro_batch_size


@dataclass(frozen=True)
class ResumeReport:
    epoch: int | None  # cyclic: the epoch the new sampler resumes in
    expected: int  # samples in the old layout's uninterrupted pass
    read_before: int  # of them, what the old job read in that pass
    read_after: int  # what the new sampler reads
    repeated: np.ndarray  # ids read more than once, ascending
    skipped: np.ndarray  # ids of the pass never read, ascending

    @property
    def exactly_once(self) -> bool:
        return self.repeated.size == 0 and self.skipped.size == 0


def _pass_ids(total: int, s: Sampling, consumed: int, end: int | None = None) -> tuple[list[np.ndarray], int]:
    """(each rank's micro-batches [files, mbs], the epoch) of the pass the sampler
    makes from `consumed` (cut where the job stops at consumed_samples `end`)."""
    plan = plan_stream(total, s.micro_batch_size, s.data_parallel_size, consumed, s.dataloader_type,
                       s.data_sharding)
    ranks = [rank_ids(plan, r) for r in range(s.data_parallel_size)]
    if end is not None:
        ranks = [ids[:max(0, (end - consumed) // s.group)] for ids in ranks]
    return ranks, plan.epoch


MAX_PASSES = 1000  # a cyclic job's passes walked (each makes its epoch's permutation)


def job_reads(total: int, s: Sampling, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, epochs): every id the ranks read in their first `steps` micro-batches
    from consumed_samples 0, and the epoch each was read in (each rank iterates its
    sampler again when a pass ends, from its own count, as cyclic_iter does)."""
    ids, epochs = [], []
    active = total - total % s.group
    if s.dataloader_type == "cyclic" and active and steps * s.group // active > MAX_PASSES:
        raise SamplerError(f"consumed_samples {steps * s.group} is {steps * s.group // active:,} epochs in: the old "
                           f"job's passes are walked one by one, at most {MAX_PASSES:,}")
    for rank in range(s.data_parallel_size):
        consumed, left = 0, steps
        while left > 0:
            if s.dataloader_type == "single" and consumed > 0:
                raise SamplerError(f"the single sampler ends after {consumed} samples on "
                                   f"dp={s.data_parallel_size},mbs={s.micro_batch_size}: the job cannot "
                                   f"have consumed {steps * s.group}")
            passes, epoch = _pass_ids(total, s, consumed)
            got = passes[rank][:left]
            if got.shape[0] == 0:
                raise SamplerError("a sampler pass yielded no micro-batch")
            ids.append(got.ravel())
            epochs.append(np.full(got.size, epoch, dtype=np.int64))
            left -= got.shape[0]
            consumed += got.shape[0] * s.group
    if not ids:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(ids), np.concatenate(epochs)


def check_resume(total: int, old: Sampling, consumed: int, new: Sampling, end: int | None = None) -> ResumeReport:
    """The report for a job on `old` up to `consumed` resumed on `new`
    (SamplerError where Megatron's samplers refuse it); end: where both jobs stop
    (a phase's end: sampling/phaseplan.py), else each pass runs to its epoch's end."""
    if consumed < 0 or consumed % old.group:
        raise SamplerError(f"consumed_samples {consumed} is not a multiple of the old layout's micro_batch_size "
                           f"x data_parallel_size = {old.group}: the job cannot have stopped there")
    after, epoch = _pass_ids(total, new, consumed, end)
    before, before_epochs = job_reads(total, old, consumed // old.group)
    cyclic = new.dataloader_type == "cyclic"
    if cyclic:
        before = before[before_epochs == epoch]
        old_active = total - total % old.group
        expected = np.concatenate([p.ravel() for p in _pass_ids(total, old, epoch * old_active, end)[0]])
    else:
        expected = np.concatenate([p.ravel() for p in _pass_ids(total, old, 0, end)[0]])
    read_after = np.concatenate([p.ravel() for p in after])
    counts = np.bincount(np.concatenate([before, read_after]), minlength=total)
    wanted = np.unique(expected)
    return ResumeReport(
        epoch=epoch if cyclic else None,
        expected=int(wanted.size),
        read_before=int(before.size),
        read_after=int(read_after.size),
        repeated=np.flatnonzero(counts > 1),
        skipped=wanted[counts[wanted] == 0],
    )

"""Megatron's cyclic sampler in a run in phases (docs/phases.md): each phase is read
by a MegatronPretrainingRandomSampler of its own.

restart (Megatron-LM's --phase-transition-iterations, as training.py's
get_train_valid_test_num_samples and build_train_valid_test_data_loaders read it):
the relaunch of phase k builds the phase's own dataset of `length` samples (its
BlendedDataset, whose size sums ceil(samples x weight) over its datasets, or for one
prefix without a weight the bare GPTDataset: both can be longer than the phase's
`listed` samples of the run) and a cyclic sampler over all `length` of them, built
at the samples consumed in the phase (0 at its transition). The job exits at the
next transition, so phase k reads `listed` samples; the last phase's sampler goes on
as cyclic_iter iterates it. continue (mmfs's rule): the same, each phase's sampler
over its own range of the run (length = listed); a run without phases is one phase.

A phase's sample x (its sampler's index) is the split's sample start + x below
`listed`, and beyond + x - listed past it: ids at or past the split's length, served
by the split's beyond view (mmfs/mount/declarations.py).

`phased_stream` is the rule as Megatron's loop runs it, sampler by sampler;
`PhasedSampler` gives the same micro-batches at once (the plans the C reader serves,
any micro-batch of the run, of a resumed job); `check_phased_resume` is
resume.check_resume within the phase a job resumes in.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from mmfs.megatron.sampling.rankplan import RankPlan, plan_ranks, plan_stream, resumed_microbatch, stream_microbatch
from mmfs.megatron.sampling.resume import ResumeReport, Sampling, check_resume
from mmfs.megatron.sampling.samplers import SamplerError, training_stream


@dataclass(frozen=True)
class PhaseSpan:
    """One phase as its cyclic sampler reads it.

    start:  the split id of the phase's sample 0;
    listed: the phase's samples in the split, [start, start + listed);
    length: the samples of the dataset its sampler is built over (>= listed);
    beyond: the split id of its sample `listed` (past the split's own samples)."""

    start: int
    listed: int
    length: int
    beyond: int

    def split_ids(self, local) -> np.ndarray:
        """The split ids (int64) of the phase's samples `local`."""
        local = np.asarray(local, dtype=np.int64)
        return np.where(local < self.listed, self.start + local, self.beyond + local - self.listed)


@dataclass(frozen=True)
class PhasePass:
    """One phase's pass in a phased RankPlan (C: mmfs_phase_plan): its files start at
    the plan's file first_file, and `plan` (its own sampler's pass) gives their ids."""

    first_file: int
    first_id: int
    listed: int
    beyond_id: int
    plan: RankPlan


def phase_at(spans: list[PhaseSpan], consumed: int) -> int:
    """The phase that split sample `consumed` is read in (the last one from its end on)."""
    return max(0, bisect.bisect_right([s.start for s in spans], consumed) - 1)


def _check_steps(spans: list[PhaseSpan], k: int, consumed: int, group: int) -> None:
    """A layout reads whole micro-batch steps: each phase it crosses must hold a whole
    number of them (Megatron's global batch is a multiple of micro_batch_size x
    data_parallel_size, and a phase starts where a global batch starts)."""
    if (consumed - spans[k].start) % group:
        raise SamplerError(f"consumed_samples {consumed} is {consumed - spans[k].start} into phase {k}, not a "
                           f"multiple of micro_batch_size x data_parallel_size = {group}")
    for q in range(k, len(spans) - 1):
        if spans[q].listed % group:
            raise SamplerError(f"phase {q + 1} starts at sample {spans[q + 1].start}, {spans[q].listed} samples after "
                               f"phase {q}: not whole micro-batch steps of micro_batch_size x data_parallel_size = "
                               f"{group} (a phase starts where a global batch starts)")


def phased_stream(spans: list[PhaseSpan], consumed: int, mbs: int, rank: int, dp: int,
                  data_sharding: bool = True) -> Iterator[np.ndarray]:
    """The micro-batches (split ids) `rank` reads from split sample `consumed` on, as
    the relaunched phases read them: the phase's RandomSampler built at consumed -
    start and read to the phase's end, then each later phase's from 0, the last one's
    again and again (cyclic_iter)."""
    group = mbs * dp
    k = phase_at(spans, consumed)
    _check_steps(spans, k, consumed, group)
    for q in range(k, len(spans)):
        span = spans[q]
        c = consumed - span.start if q == k else 0
        stream = training_stream("cyclic", span.length, c, mbs, rank, dp, data_sharding)
        if q == len(spans) - 1:
            yield from map(span.split_ids, stream)
            return
        for _ in range((span.listed - c) // group):
            yield span.split_ids(next(stream))


class PhasedSampler:
    """The cyclic samplers of a run in phases on one layout (micro_batch_size,
    data_parallel_size, data_sharding): plans for the C reader and any micro-batch."""

    def __init__(self, spans: list[PhaseSpan], micro_batch_size: int, data_parallel_size: int,
                 data_sharding: bool = True) -> None:
        if not spans:
            raise SamplerError("a run in phases without a phase")
        self.spans = list(spans)
        self.mbs, self.dp, self.sharding = micro_batch_size, data_parallel_size, data_sharding
        self.group = micro_batch_size * data_parallel_size
        self.total = spans[-1].start + spans[-1].listed
        self._plans: dict[tuple[int, int], RankPlan] = {}  # (phase, consumed in it) -> its pass
        self._passes: dict = {}  # resumed_microbatch's passes of the last phase

    def _pass(self, q: int, consumed: int) -> RankPlan:
        key = (q, consumed)
        if key not in self._plans:
            self._plans[key] = plan_stream(self.spans[q].length, self.mbs, self.dp, consumed, "cyclic",
                                           self.sharding)
        return self._plans[key]

    def plan(self, consumed: int = 0, whole_pass: bool = True) -> RankPlan:
        """The files each rank reads from split sample `consumed`: the rest of its phase,
        then every later phase, as one phased RankPlan; the last phase to the end of
        its sampler's pass (whole_pass: a stream) or to the end of the split (the rank
        views). SamplerError where Megatron's sampler refuses."""
        k = phase_at(self.spans, consumed)
        _check_steps(self.spans, k, consumed, self.group)
        passes: list[PhasePass] = []
        first_file = 0
        for q in range(k, len(self.spans)):
            span = self.spans[q]
            c = consumed - span.start if q == k else 0
            last = q == len(self.spans) - 1
            files = None if last and whole_pass else (span.listed - c) // self.group
            if files == 0:
                continue
            own = self._pass(q, c)
            if files is not None:
                own = replace(own, files_per_rank=min(files, own.files_per_rank), whole_pass=False)
            passes.append(PhasePass(first_file, span.start, span.listed, span.beyond, own))
            first_file += own.files_per_rank
        epoch = passes[0].plan.epoch if passes else 0
        return RankPlan("phased", self.total, self.mbs, self.dp, first_file, 0, None, consumed, epoch, whole_pass,
                        tuple(passes))

    def microbatch(self, rank: int, n: int) -> tuple[np.ndarray, int, int]:
        """(split ids, epoch, phase) of the n-th micro-batch (0-based) `rank` reads in
        the run from consumed_samples 0 (the last phase on into later epochs)."""
        _check_steps(self.spans, 0, 0, self.group)
        if n < 0:
            raise SamplerError(f"micro-batch {n} is negative")
        first = 0
        for q, span in enumerate(self.spans[:-1]):
            steps = span.listed // self.group
            if n < first + steps:  # within the phase: epoch 0 of its own sampler
                plan = replace(self._pass(q, 0), files_per_rank=steps, whole_pass=False)
                ids, epoch = stream_microbatch(plan, rank, n - first)
                return span.split_ids(ids), epoch, q
            first += steps
        q, span = len(self.spans) - 1, self.spans[-1]
        plan = self._plans.get((q, -1))
        if plan is None:
            plan = self._plans[(q, -1)] = plan_ranks(span.length, self.mbs, self.dp, "cyclic", self.sharding)
        found = stream_microbatch(plan, rank, n - first)
        if found is None:
            raise SamplerError(f"micro-batch {n} of rank {rank}: the cyclic sampler ended")
        return span.split_ids(found[0]), found[1], q

    def resumed_microbatch(self, consumed: int, rank: int, k: int) -> tuple[np.ndarray, int, int]:
        """(split ids, epoch, phase) of the k-th micro-batch `rank` reads in a job resumed
        at split sample `consumed`: its phase's sampler rebuilt there (Megatron's
        relaunch at that iteration), then the later phases from 0."""
        p = phase_at(self.spans, consumed)
        _check_steps(self.spans, p, consumed, self.group)
        for q in range(p, len(self.spans)):
            span = self.spans[q]
            c = consumed - span.start if q == p else 0
            if q < len(self.spans) - 1:
                steps = (span.listed - c) // self.group
                if k >= steps:
                    k -= steps
                    continue
            found = resumed_microbatch(span.length, self.mbs, self.dp, c, "cyclic", self.sharding, rank, k,
                                       self._passes.setdefault(q, {}))
            return span.split_ids(found[0]), found[1], q
        raise SamplerError("no phase")  # (the last phase's sampler never ends)


def check_phased_resume(spans: list[PhaseSpan], old: Sampling, consumed: int, new: Sampling) -> ResumeReport:
    """resume.check_resume within the phase the job resumes in (its sampler rebuilt at
    consumed - start on each layout, every pass cut at the phase's end: the last
    phase's too, where the job stops at train_iters however long its dataset is),
    ids as the split's."""
    p = phase_at(spans, consumed)
    for s in (old, new):
        _check_steps(spans, p, consumed if s is new else spans[p].start, s.group)
    span = spans[p]
    report = check_resume(span.length, old, consumed - span.start, new, span.listed)
    return replace(report, repeated=np.sort(span.split_ids(report.repeated)),
                   skipped=np.sort(span.split_ids(report.skipped)))

"""Compact plans of the micro-batch files the mount serves: which samples file j
of rank r holds, without per-rank lists, and their C struct (the C reader's
formula, mmfs_microbatch_ids, is the one copy of it).

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

from dataclasses import dataclass
from typing import Any

import numpy as np

from mmfs.megatron.arrays import ArrayPlacer
from mmfs.megatron.sampling.randperm import epoch_permutation, index_dtype, randperm
from mmfs.megatron.sampling.samplers import SamplerError
from mmfs.native import ffi, lib


@dataclass(frozen=True)
class RankPlan:
    """One pass of one split's sampler, for every rank, without per-rank lists.

    kind:        "single" | "sharded" | "unsharded" | "batch" (Megatron-Bridge's)
    total:       samples in the split
    micro_batch_size, data_parallel_size
    files_per_rank: the micro-batches of rank 0 (the most of any rank; the same
                 for every rank except in an unsharded stream, see files_of)
    permutation: None for single; else randperm(bucket_size, seed = epoch),
                 C-contiguous, int32 (int64 above 2**31 - 1 entries), shared by all ranks
    bucket_size: len(permutation); 0 for single
    start:       where the pass starts: single, the first sample id; cyclic, the
                 first index into the permutation (0 for the rank views)
    epoch:       the epoch of the pass (cyclic; 0 for single)
    whole_pass:  every rank reads to the end of its pass (a stream); else every
                 rank has files_per_rank files (the rank views: an unsharded rank
                 may read a few more before its pass ends)
    phases:      kind "phased" (a run in phases under the cyclic sampler): each
                 phase's own pass, a PhasePass of sampling/phaseplan.py, in order
    """

    kind: str
    total: int
    micro_batch_size: int
    data_parallel_size: int
    files_per_rank: int
    bucket_size: int
    permutation: np.ndarray | None
    start: int = 0
    epoch: int = 0
    whole_pass: bool = False
    phases: tuple = ()
    seed: int = 0  # batch: the base seed; the epoch's permutation is randperm(total, seed + epoch)
    global_batch_size: int = 0  # batch: the global batch it deals whole

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch_size * self.data_parallel_size

    @property
    def permutation_bytes(self) -> int:
        """Memory its permutations hold (each phase's own, for a phased plan)."""
        own = 0 if self.permutation is None else self.permutation.nbytes
        return own + sum(p.plan.permutation_bytes for p in self.phases)

    def files_of(self, rank: int) -> int:
        """The micro-batches `rank` reads in this pass."""
        if self.kind == "phased":  # only the last phase's pass may end earlier for some ranks
            last = self.phases[-1]
            return last.first_file + last.plan.files_of(rank)
        if self.kind not in ("unsharded",) or not self.whole_pass:  # batch: every rank alike
            return self.files_per_rank
        # perm[start:][rank::dp], cut to whole micro-batches
        return len(range(self.start + rank, self.bucket_size, self.data_parallel_size)) // self.micro_batch_size


def plan_kind(dataloader_type: str, data_sharding: bool) -> str:
    if dataloader_type in ("single", "batch"):
        return dataloader_type
    if dataloader_type == "cyclic":
        return "sharded" if data_sharding else "unsharded"
    raise SamplerError(f"unknown dataloader_type {dataloader_type!r} (single or cyclic)")


def plan_ranks(total: int, micro_batch_size: int, data_parallel_size: int,
               dataloader_type: str = "single", data_sharding: bool = True, global_batch_size: int = 0,
               seed: int = 0) -> RankPlan:
    """The plan of one split (total samples) under the training block's sampler
    (batch: global_batch_size and the base seed too)."""
    mbs, dp = micro_batch_size, data_parallel_size
    if total < 0 or mbs <= 0 or dp <= 0:
        raise SamplerError(f"bad plan arguments: total {total}, micro_batch_size {mbs}, data_parallel_size {dp}")
    kind = plan_kind(dataloader_type, data_sharding)
    if kind == "batch":
        return _batch_plan(total, mbs, dp, global_batch_size, seed, 0)
    files = total // (mbs * dp)
    bucket = 0
    if kind == "sharded":
        bucket = files * mbs
    elif kind == "unsharded":
        bucket = (total // mbs) * mbs
    permutation = None if kind == "single" else randperm(bucket, 0, index_dtype(bucket))
    return RankPlan(kind, total, mbs, dp, files, bucket, permutation)


def _batch_plan(total: int, mbs: int, dp: int, gbs: int, seed: int, consumed: int) -> RankPlan:
    """Megatron-Bridge's MegatronPretrainingBatchSampler (drop_last) built at `consumed`: whole
    global batches G of randperm(total, seed + epoch) from the epoch's offset, rank r reading
    G[r::dp] in order: file j is perm[offset + (j*mbs + m)*dp + r], the unsharded formula."""
    group = mbs * dp
    if gbs <= 0 or gbs % group:
        raise SamplerError(f"global_batch_size {gbs} is not a multiple of micro_batch_size x data_parallel_size "
                           f"= {group} (Bridge's batch sampler raises)")
    active = (total // gbs) * gbs
    if active == 0:
        raise SamplerError(f"the batch sampler over {total} samples needs at least one global batch of {gbs} "
                           "(Bridge asserts)")
    epoch, offset = divmod(consumed, active)
    if seed + epoch > MAX_TORCH_SEED:
        raise SamplerError(f"consumed_samples {consumed} is in epoch {epoch}: the batch sampler seeds torch's "
                           f"generator with seed + epoch = {seed + epoch}, past 2**64 - 1 (torch raises)")
    files = (total - offset) // gbs * (gbs // group)
    return RankPlan("batch", total, mbs, dp, files, total, randperm(total, seed + epoch, index_dtype(total)), offset,
                    epoch, True, seed=seed, global_batch_size=gbs)


def plan_splits(training_cfg: Any, split_lengths: dict[str, int]) -> dict[str, RankPlan]:
    """The plan of every split under a config's TrainingConfig (config.training);
    split_lengths: {split: samples}, e.g. from Corpus.splits."""
    plans = {}
    for split, n in split_lengths.items():
        kind, mbs = training_cfg.layout(split)
        plans[split] = plan_ranks(int(n), mbs, training_cfg.data_parallel_size, kind, training_cfg.data_sharding,
                                  training_cfg.split_batch_size(split), training_cfg.batch_seed)
    return plans


# batch reads by the unsharded formula (_batch_plan)
_KIND_CODES = {"single": lib.MMFS_PLAN_SINGLE, "sharded": lib.MMFS_PLAN_SHARDED,
               "unsharded": lib.MMFS_PLAN_UNSHARDED, "phased": lib.MMFS_PLAN_PHASED, "batch": lib.MMFS_PLAN_UNSHARDED}


def _fill(c, plan: RankPlan, placer: ArrayPlacer) -> list:
    """Write `plan` into the struct c; the cdata it points into, to keep alive."""
    c.kind = _KIND_CODES[plan.kind]
    c.micro_batch_size = plan.micro_batch_size
    c.data_parallel_size = plan.data_parallel_size
    c.files_per_rank = plan.files_per_rank
    c.start = plan.start
    c.bucket_size = plan.bucket_size
    perm = plan.permutation
    if perm is not None and perm.size:
        placed = placer.place(c.permutation, perm)
        if placed is not perm:
            raise ValueError("plan.permutation must be C-contiguous, native int32 or int64")
    keep: list = []
    if plan.phases:
        phases = ffi.new("mmfs_phase_plan[]", len(plan.phases))
        for cp, p in zip(phases, plan.phases):
            cp.first_file, cp.first_id, cp.listed, cp.beyond_id = p.first_file, p.first_id, p.listed, p.beyond_id
            keep += _fill(ffi.addressof(cp, "plan"), p.plan, placer)
        c.phases, c.num_phases = phases, len(plan.phases)
        keep.append(phases)
    return keep


def native_plan(plan: RankPlan, placer: ArrayPlacer | None = None):
    """The plan as the C struct `mmfs_rank_plan *` (native/mmfs_native.h), for the
    C reader of rank files (mmfs_microbatch_ids). The struct points into
    plan.permutation (each phase's, for a phased plan), placed by `placer` (in memory,
    or read with pread): keep the plan alive as long as the struct."""
    c = ffi.new("mmfs_rank_plan *")
    keep = _fill(c, plan, placer or ArrayPlacer())
    return ffi.gc(c, lambda _c, _keep=keep: None) if keep else c


# torch.Generator.manual_seed takes seeds up to 2**64 - 1 (and keeps their low 32
# bits for its MT19937, as randperm does here): the last epoch a cyclic sampler has.
MAX_TORCH_SEED = 2**64 - 1


def plan_stream(total: int, micro_batch_size: int, data_parallel_size: int, consumed: int,
                dataloader_type: str = "single", data_sharding: bool = True, global_batch_size: int = 0,
                seed: int = 0) -> RankPlan:
    """The pass Megatron's sampler makes when it is built with this layout and
    consumed_samples = `consumed`: to the end of the split (single) or of the
    current epoch (cyclic, batch). SamplerError where Megatron's sampler asserts."""
    mbs, dp = micro_batch_size, data_parallel_size
    if mbs <= 0 or dp <= 0 or total <= 0 or consumed < 0:
        raise SamplerError(f"bad stream arguments: total {total}, micro_batch_size {mbs}, "
                           f"data_parallel_size {dp}, consumed_samples {consumed}")
    kind = plan_kind(dataloader_type, data_sharding)
    if kind == "batch":
        return _batch_plan(total, mbs, dp, global_batch_size, seed, consumed)
    group = mbs * dp
    if kind == "single":
        if consumed >= total:
            raise SamplerError(f"no samples left to consume: consumed_samples {consumed} >= {total} "
                               "(Megatron's single sampler asserts)")
        return RankPlan(kind, total, mbs, dp, (total - consumed) // group, 0, None, consumed, 0, True)
    active = total - total % group
    if active == 0:
        raise SamplerError(f"the cyclic sampler over {total} samples needs at least micro_batch_size x "
                           f"data_parallel_size = {group} (Megatron divides by zero)")
    epoch, offset = divmod(consumed, active)
    if epoch > MAX_TORCH_SEED:
        raise SamplerError(f"consumed_samples {consumed} is in epoch {epoch}: Megatron's cyclic sampler seeds "
                           f"torch's generator with the epoch, which takes at most 2**64 - 1 (torch raises)")
    if offset % group:
        raise SamplerError(f"consumed_samples {consumed} is {offset} into its epoch, not a multiple of "
                           f"micro_batch_size x data_parallel_size = {group} (Megatron's cyclic sampler asserts)")
    if kind == "sharded":
        bucket = (total // group) * mbs
        start = offset // dp
        files = (bucket - start) // mbs
    else:
        bucket = (total // mbs) * mbs
        start = offset
        files = len(range(start, bucket, dp)) // mbs  # rank 0's, the most
    return RankPlan(kind, total, mbs, dp, files, bucket, randperm(bucket, epoch, index_dtype(bucket)), start, epoch,
                    True)


def _check_rank(plan: RankPlan, rank: int) -> None:
    if not 0 <= rank < plan.data_parallel_size:
        raise SamplerError(f"rank {rank} is not below data_parallel_size {plan.data_parallel_size}")


def microbatch_ids(plan: RankPlan, rank: int, j: int) -> np.ndarray:
    """Sample ids (int64, [mbs]) of micro-batch file j of `rank`, by the C
    reader's formula (mmfs_microbatch_ids, native/mmfs_native.h: the one copy)."""
    return rank_ids(plan, rank, j, 1)[0]


def rank_ids(plan: RankPlan, rank: int, first: int = 0, count: int | None = None) -> np.ndarray:
    """Sample ids (int64, [count, mbs]) of `rank`'s files first .. first + count
    (default: to its last), through the C reader's formula."""
    _check_rank(plan, rank)
    files = plan.files_of(rank)
    count = files - first if count is None else count
    if not (0 <= first and 0 <= count and first + count <= files):
        raise SamplerError(f"micro-batches {first}..{first + count - 1} are not below the {files} files "
                           f"of rank {rank}")
    out = np.empty((count, plan.micro_batch_size), dtype=np.int64)
    c = native_plan(plan)
    for j in range(count):  # one cffi call per file: a plan's files, not a hot path
        rc = lib.mmfs_microbatch_ids(c, rank, first + j, ffi.cast("int64_t *", out[j].ctypes.data))
        if rc < 0:
            raise SamplerError(f"micro-batch {first + j} of rank {rank}: not in the plan (error {rc})")
    return out


# -- any micro-batch of an uninterrupted run -------------------------------------


MAX_WALKED_PASSES = 1_000_000  # an unsharded cyclic run's passes walked to find a micro-batch


def _check_epoch(epoch: int) -> None:
    if epoch > MAX_TORCH_SEED:
        raise SamplerError(f"epoch {epoch}: Megatron's cyclic sampler seeds torch's generator with the epoch, "
                           "which takes at most 2**64 - 1 (torch raises)")


def resumed_pass(total: int, micro_batch_size: int, data_parallel_size: int, consumed: int,
                 dataloader_type: str, data_sharding: bool, rank: int, k: int,
                 plans: dict | None = None, global_batch_size: int = 0,
                 seed: int = 0) -> tuple[RankPlan, int, int] | None:
    """Where the k-th micro-batch (0-based) `rank` reads in a job resumed at
    consumed_samples `consumed` lies: (the pass that holds it, the consumed_samples
    that pass's sampler is built at, its index in the pass). The first pass is
    Megatron's sampler rebuilt at `consumed`; for cyclic the next ones follow, each
    from the rank's own count (as cyclic_iter iterates it again); the mount's stream
    folder `from=` that count holds each pass (docs/streams.md). None where the
    single sampler's pass has ended. SamplerError where Megatron's sampler refuses
    `consumed`. plans: the passes made so far, by consumed_samples (a caller asking
    for several micro-batches keeps one dict)."""
    plans = {} if plans is None else plans
    while True:
        plan = plans.get(consumed)
        if plan is None:
            plan = plans[consumed] = plan_stream(total, micro_batch_size, data_parallel_size, consumed,
                                                 dataloader_type, data_sharding, global_batch_size, seed)
        files = plan.files_of(rank)
        if k < files:
            return plan, consumed, k
        if plan.kind == "single":
            return None
        if files == 0:
            raise SamplerError(f"rank {rank}'s pass from consumed_samples {consumed} yields no micro-batch")
        k -= files
        consumed += files * plan.samples_per_step


def resumed_microbatch(total: int, micro_batch_size: int, data_parallel_size: int, consumed: int,
                       dataloader_type: str, data_sharding: bool, rank: int, k: int,
                       plans: dict | None = None) -> tuple[np.ndarray, int] | None:
    """(ids, epoch) of the k-th micro-batch (0-based) `rank` reads in a job resumed at
    consumed_samples `consumed` (resumed_pass: Megatron's sampler rebuilt there, and
    for cyclic its next passes); None where the single sampler's pass has ended."""
    found = resumed_pass(total, micro_batch_size, data_parallel_size, consumed, dataloader_type, data_sharding,
                         rank, k, plans)
    if found is None:
        return None
    plan, _at, j = found
    return rank_ids(plan, rank, j, 1)[0], plan.epoch


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
    if plan.kind == "batch":  # every pass a whole epoch of files_per_rank, randperm(total, seed + epoch)
        epoch, j = divmod(n, plan.files_per_rank)
        if plan.seed + epoch > MAX_TORCH_SEED:
            raise SamplerError(f"epoch {epoch}: the batch sampler seeds torch's generator with seed + epoch, "
                               "which takes at most 2**64 - 1 (torch raises)")
        perm = epoch_permutation(plan.total, plan.seed + epoch)
        return perm[(j * mbs + np.arange(mbs, dtype=np.int64)) * dp + rank], epoch
    active = plan.files_per_rank * group
    if plan.kind == "sharded":  # every pass is a whole epoch of files_per_rank
        epoch, j = divmod(n, plan.files_per_rank)
        _check_epoch(epoch)
        perm = epoch_permutation(plan.bucket_size, epoch)
        return rank * plan.bucket_size + perm[j * mbs:(j + 1) * mbs], epoch
    if n // plan.files_per_rank > MAX_WALKED_PASSES:
        raise SamplerError(f"micro-batch {n} of rank {rank} is some {n // plan.files_per_rank:,} passes in: an "
                           f"unsharded cyclic run is walked pass by pass, at most {MAX_WALKED_PASSES:,} (a job "
                           "resumed there is answered at once: its sampler is rebuilt at that consumed_samples)")
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


# -- a whole pass at once -------------------------------------------------------


def stream_order(plan: RankPlan) -> np.ndarray:
    """Sample ids (int64) of the plan's files in the order the job consumes them:
    micro-step j (every rank's file j), rank r, sample m at position
    (j * dp + r) * mbs + m, so that global batch [c, c + B) of the stream is
    positions [c, c + B) and position p is read by rank (p // mbs) % dp. The same
    ids as microbatch_ids(plan, r, j), for every file of every rank at once."""
    mbs, dp, files = plan.micro_batch_size, plan.data_parallel_size, plan.files_per_rank
    n = files * mbs * dp
    if plan.kind == "phased":  # each phase's own files in turn, their ids read as the split's
        parts = [np.where(local < p.listed, p.first_id + local, p.beyond_id + local - p.listed)
                 for p in plan.phases for local in (stream_order(p.plan),)]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    if plan.kind == "single":
        return np.arange(plan.start, plan.start + n, dtype=np.int64)
    perm = np.asarray(plan.permutation, dtype=np.int64)
    if plan.kind == "sharded":  # rank r reads r * bucket + perm[start + j * mbs + m]
        own = perm[plan.start:plan.start + files * mbs].reshape(files, 1, mbs)
        return (own + (np.arange(dp, dtype=np.int64) * plan.bucket_size).reshape(1, dp, 1)).reshape(n)
    # unsharded: rank r reads perm[start + (j * mbs + m) * dp + r]
    return perm[plan.start:plan.start + n].reshape(files, mbs, dp).transpose(0, 2, 1).reshape(n)


def rank_of_position(positions: np.ndarray, micro_batch_size: int, data_parallel_size: int) -> np.ndarray:
    """The data-parallel rank that reads each position of stream_order."""
    return (positions // micro_batch_size) % data_parallel_size

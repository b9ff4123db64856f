"""Megatron-LM trained on an mmfs mount: the datasets provider for pretrain()
with `--dataloader-type external` (docs/megatron.md).

    from mmfs.adapters.megatron import mount_datasets_provider
    pretrain(full_config, mount_datasets_provider(os.environ["MMFS_MOUNT"]), ...)

With `--dataloader-type external`, Megatron-LM's build_pretraining_data_loader
returns what the provider built, unchanged, and build_train_valid_test_data_iterators
wraps it as it is (RerunDataIterator): the training loop calls next() on it once per
micro-batch, and pretrain_gpt.py's get_batch takes the fields it knows from the dict.
The provider returns, on every rank, three lazy iterators of micro-batches in
megatron-core 0.19.2's GPTDataset.__getitem__ fields and order, stacked as torch's
default collate stacks them (mmfs.loader.Mount.microbatch_file):

- train: what Megatron's sampler, built with the job's data-parallel size and
  --micro-batch-size at args.consumed_train_samples, gives this data-parallel rank
  (the mount's `train/streams/dp=D,mbs=M,from=C/RRR/`, docs/streams.md); `cyclic` on
  into later passes, each from the rank's own count as cyclic_iter does. A run in
  phases is one launch: the mount's train split is the whole run.
- valid: the same with --eval-micro-batch-size from args.consumed_valid_samples;
  test: from 0.
- Megatron-LM's own relaunch at --phase-transition-iterations (phase_mode restart)
  works too: train reads on from the global consumed count, and valid and test are
  the phase's own, as that launch builds them, on any data-parallel size and
  micro-batch size (`<split>/phases/<phase>/streams/dp=D,mbs=M,from=C/RRR/`, valid
  from the carried consumed_valid_samples, test from 0).

The data-parallel rank and size are Megatron's parallel state's
(mpu.get_data_parallel_rank / _world_size, without context parallelism, as
build_pretraining_data_loader asks), so the tensor-, pipeline- and context-parallel
ranks of one data-parallel rank get the same stream, as Megatron's loader gives them.
The sampler (single or cyclic, sharding) is the mount's `training:` block's.
BlendedDataset's `dataset_id` is left out: get_batch never reads it.

A job that does not fit the mount (its --seq-length, --micro-batch-size or global
batch size, more samples than the mount serves, a consumed count Megatron's sampler
refuses) is one line, `mmfs: error: ...`, and exit 2 on that rank; so is a read
that fails later (a mount that died under the job).

Importing this module needs numpy only; torch and megatron are imported when the
provider runs. `rank_stream` gives the same micro-batches as numpy arrays.
"""

from __future__ import annotations

import bisect
import itertools
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from mmfs.adapters.megatron_job import MegatronJobError, check_identity, checked_args, checked_samples
from mmfs.errors import MmfsError
from mmfs.loader import LoaderError, Mount
from mmfs.loader.files import KernelFiles
from mmfs.mount import contract

SPLITS = ("train", "valid", "test")
# The fields mmfs.loader adds to Megatron's (which get_batch would not read).
MMFS_FIELDS = ("sample_ids", "phase")
# Megatron-LM arguments whose runs read these iterators in another way than
# build_train_valid_test_data_iterators does for `external`, with why.
REFUSED_ARGS = {
    "full_validation": "--full-validation asks len() of the validation loader; the mount's valid split is read "
                       "as a stream",
    "multiple_validation_sets": "--multiple-validation-sets needs one validation loader per set; the mount "
                                "serves one valid split",
    "hybrid_context_parallel": "--hybrid-context-parallel reroutes sub-samples between ranks at every step; the "
                               "mount serves each rank's sampler stream",
    "sft": "--sft reads SFTDataset's packed samples, not GPT samples",
    "skip_train": "--skip-train makes Megatron read the validation split from sample 0, not from the "
                  "checkpoint's consumed_valid_samples as the provider does",
    "mock_data": "--mock-data trains on Megatron's generated samples, not on the mount's",
    "fim_data": "--fim-data rewrites every sample (fill-in-the-middle); the mount serves GPT samples",
    "use_varlen_dataset": "--use-varlen-dataset reads conversations through VarlenDataset, not GPT samples",
    "perform_rl_step": "--perform-rl-step trains on the rollouts it generates, not on a data loader's samples",
    "decrease_batch_size_if_needed": "--decrease-batch-size-if-needed changes the global batch with the ranks "
                                     "left; the mount's streams follow its configured batch size",
    "sequence_packing_scheduler": "--sequence-packing-scheduler re-deals each global batch between the ranks; "
                                  "the mount serves each rank's sampler stream",
}


def _sampler(mount: Mount, split: str) -> str:
    """The sampler that reads `split` (the mount's streams/ default for it)."""
    return mount.layout(split)[0] if mount.training else "single"


def rank_stream_files(mount: Mount, split: str, rank: int, data_parallel_size: int, micro_batch_size: int,
                      consumed_samples: int, phase: int | None = None) -> Iterator[str]:
    """The micro-batch files `rank` reads from consumed_samples, in order: one pass
    for the single sampler (Megatron's iterator ends there), pass after pass for the
    cyclic one, each from where the rank's own sampler count ends the pass before
    (MegatronPretrainingRandomSampler counts per rank; cyclic_iter iterates it again).
    phase k: of phase k's own valid or test (phase_mode restart), as that phase's
    relaunch builds its loader. The first folder is listed at once, so a layout
    Megatron's sampler refuses is refused here, not at the first next()."""
    group = data_parallel_size * micro_batch_size

    def folder(consumed: int) -> list[str]:
        return mount.stream_files(split, rank, data_parallel_size, micro_batch_size, consumed, phase=phase)

    def passes(files: list[str], consumed: int) -> Iterator[str]:
        while True:
            yield from files
            if _sampler(mount, split) != "cyclic":
                return
            if not files:
                raise LoaderError(f"{split}: rank {rank}'s pass from consumed_samples {consumed} holds no "
                                  "micro-batch (Megatron's cyclic_iter raises here)")
            consumed += len(files) * group
            files = folder(consumed)

    return passes(folder(consumed_samples), consumed_samples)


def relaunch_phase(mount: Mount, args: Any) -> int | None:
    """The phase a launch of Megatron-LM's own relaunch at --phase-transition-iterations
    trains in (from its iteration), or None for a run in one launch."""
    if not getattr(args, "phase_transition_iterations", None) or not mount.phases:
        return None
    starts = [int(p["start_sample"]) for p in mount.phases["phases"]]
    return bisect.bisect_right(starts, int(getattr(args, "iteration", 0) or 0) * int(args.global_batch_size)) - 1


def eval_phase(mount: Mount, split: str, phase: int | None) -> int | None:
    """Where a relaunch's valid or test comes from: phase `phase`'s own under restart
    (MegatronJobError where the mount has none), the mount's split otherwise."""
    if phase is None or split == "train":
        return None
    entry = mount.phases["phases"][phase].get(contract.KEY_SPLITS, {}).get(split) or {}
    if contract.KEY_STREAMS_PATH not in entry:
        raise MegatronJobError(f"{mount.path}/mmfs.json: phase {phase} has no {split} of its own (a run in phases "
                               "under phase_mode restart serves each phase's; mount it with this version of mmfs): "
                               "train in one launch, without --phase-transition-iterations")
    return phase


def rank_stream(mount: Mount, split: str, rank: int, data_parallel_size: int, micro_batch_size: int,
                consumed_samples: int, **flags: bool) -> Iterator[dict[str, np.ndarray]]:
    """The micro-batches of rank_stream_files, in GPTDataset's fields (numpy)."""
    for path in rank_stream_files(mount, split, rank, data_parallel_size, micro_batch_size, consumed_samples):
        batch = mount.microbatch_file(path, **flags)
        yield {name: value for name, value in batch.items() if name not in MMFS_FIELDS}


def batch_flags(args: Any) -> dict[str, bool]:
    """Megatron-LM's arguments that shape GPTDataset's fields (its GPTDatasetConfig)."""
    return {
        "eod_mask_loss": bool(getattr(args, "eod_mask_loss", False)),
        "reset_position_ids": bool(getattr(args, "reset_position_ids", False)),
        "reset_attention_mask": bool(getattr(args, "reset_attention_mask", False)),
        "create_attention_mask": bool(getattr(args, "create_attention_mask_in_dataloader", False)),
        "inter_document_masking": bool(getattr(args, "dataloader_inter_document_masking", False)),
    }


def split_micro_batch_size(args: Any, split: str) -> int:
    """The micro-batch size Megatron reads `split` with (eval_micro_batch_size for
    valid and test, as build_pretraining_data_loader does)."""
    if split == "train":
        return int(args.micro_batch_size)
    return int(getattr(args, "eval_micro_batch_size", None) or args.micro_batch_size)


def start_samples(args: Any) -> dict[str, int]:
    """Where each split's stream starts: Megatron's consumed counts of a resumed job
    (set before the provider is called, also for an old checkpoint that holds only
    the iteration), test from 0."""
    return {"train": int(args.consumed_train_samples or 0), "valid": int(args.consumed_valid_samples or 0),
            "test": 0}


def _mount_batch_size(mount: Mount) -> int:
    t = mount.training
    return int(t.get("global_batch_size") or int(t["micro_batch_size"]) * int(t["data_parallel_size"]))


def _rampup(value: Any) -> list[int] | None:
    return None if value in (None, [], ()) else [int(x) for x in value]


def check_job(mount: Mount, args: Any, train_val_test_num_samples: Any) -> None:
    """Refuse, in one line naming the flag and the mount's key, a job whose
    arguments do not fit the mount (MegatronJobError)."""
    where = f"{mount.path}/mmfs.json"
    args = checked_args(args)
    train_val_test_num_samples = checked_samples(train_val_test_num_samples)
    if getattr(args, "dataloader_type", "external") != "external":
        raise MegatronJobError(f"{mount.path}: launch with --dataloader-type external (was "
                               f"{args.dataloader_type}): Megatron would wrap these iterators in its own samplers")
    for name, why in REFUSED_ARGS.items():
        if getattr(args, name, False):
            raise MegatronJobError(f"{mount.path}: {why}: leave the flag out to train on the mount")
    check_identity(mount, args)
    t = mount.training
    if not t:
        raise MegatronJobError(f"{where} has no training section: mount a config with a training: block "
                               "(`mmfs config --from-megatron` writes it from the launch line)")
    if int(args.seq_length) != mount.sequence_length:
        raise MegatronJobError(f"{where}: sequence_length is {mount.sequence_length}, the job's --seq-length "
                               f"{args.seq_length}: give the job --seq-length {mount.sequence_length} or mount a "
                               "config with its sequence_length")
    if int(args.micro_batch_size) != int(t["micro_batch_size"]):
        raise MegatronJobError(f"{where}: training.micro_batch_size is {t['micro_batch_size']}, the job's "
                               f"--micro-batch-size {args.micro_batch_size}: mount a config with micro_batch_size: "
                               f"{args.micro_batch_size} (its samples are the same; `mmfs which` then answers for "
                               "this job)")
    schedule = t.get("step_batch_size_schedule")
    if (getattr(args, "step_batch_size_schedule", None) or None) != (schedule or None):
        raise MegatronJobError(f"{where}: training.step_batch_size_schedule is {schedule!r}, the job's "
                               f"--step-batch-size-schedule {getattr(args, 'step_batch_size_schedule', None)!r}: "
                               "give both the same schedule")
    rampup = _rampup(t.get("rampup_batch_size"))
    if _rampup(getattr(args, "rampup_batch_size", None)) != rampup:
        raise MegatronJobError(f"{where}: training.rampup_batch_size is {rampup}, the job's --rampup-batch-size "
                               f"{getattr(args, 'rampup_batch_size', None)}: give both the same ramp-up")
    gbs = _mount_batch_size(mount)
    if schedule is None and int(args.global_batch_size) != gbs:
        key = "global_batch_size" if t.get("global_batch_size") else "micro_batch_size x data_parallel_size"
        raise MegatronJobError(f"{where}: training.{key} is {gbs}, the job's --global-batch-size "
                               f"{args.global_batch_size}: give the job --global-batch-size {gbs} (its iterations "
                               "are the mount's) or mount a config with the job's")
    eval_gbs = getattr(args, "eval_global_batch_size", None)
    if eval_gbs is not None and int(eval_gbs) != gbs:
        raise MegatronJobError(f"{where}: the mount's evaluation steps read {gbs} samples (its global batch "
                               f"size), the job's --eval-global-batch-size {eval_gbs}: leave the flag out")
    _check_phases(mount, args, where)
    for split, wanted in zip(SPLITS, train_val_test_num_samples):
        have = mount.samples.get(split, 0)
        if split == "train":
            wanted = _train_samples_needed(mount, args, wanted)
        if wanted and have < wanted:
            raise MegatronJobError(f"{where}: the {split} split has {have} samples, the job reads {wanted}: give the "
                                   f"config's samples.{split} (or training.train_iters / train_samples) to match "
                                   "and mount it again")


def _check_phases(mount: Mount, args: Any, where: str) -> None:
    """A relaunch at Megatron's --phase-transition-iterations reads on in the same
    mount (from the global consumed_train_samples) when its transitions are the
    mount's phase starts; a run in phases needs no relaunch."""
    transitions = getattr(args, "phase_transition_iterations", None)
    if not transitions:
        return
    if isinstance(transitions, str):  # as given, before Megatron's validate_args parses it
        transitions = sorted(int(x) for x in transitions.split(","))
    starts = [int(p["start_sample"]) for p in (mount.phases or {}).get("phases", [])[1:]]
    asked = [int(x) * int(args.global_batch_size) for x in transitions]
    if asked != starts:
        raise MegatronJobError(f"{where}: the job's --phase-transition-iterations start phases at samples {asked}, "
                               f"the mount's phases at {starts}: leave the flag out (the mount serves every phase "
                               "in one launch) or give the config's phase starts")


def _train_samples_needed(mount: Mount, args: Any, wanted: int) -> int:
    """The train samples the job reads to its end: Megatron's count, or under
    --phase-transition-iterations the end of the phase it is in (Megatron then
    passes the phase's own count)."""
    transitions = getattr(args, "phase_transition_iterations", None)
    if not transitions or not mount.phases:
        return wanted
    current = int(getattr(args, "iteration", 0) or 0) * int(args.global_batch_size)
    ends = [int(p["end_sample"]) for p in mount.phases["phases"]]
    return next((end for end in ends if end > current), ends[-1])


def _torch_tensor(value: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(value))


def _megatron_data_parallel() -> tuple[int, int]:
    from megatron.core import mpu

    return mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()


def _megatron_args():
    from megatron.training import get_args

    return get_args()


def _exit(exc: MmfsError, hint: str = "") -> None:
    """One line on this rank's stderr and exit 2: no traceback for a user's mistake."""
    print(f"mmfs: error: {exc}{hint}", file=sys.stderr, flush=True)
    raise SystemExit(2)


DEAD_MOUNT_HINT = ("; if the mount on this node is gone, mount it again (`mmfs umount --lazy MOUNT`, then `mmfs "
                   "mount CONFIG MOUNT`) and resume the job from its last checkpoint")


def _guarded(batches: Iterator[dict[str, Any]], hint: str = DEAD_MOUNT_HINT) -> Iterator[dict[str, Any]]:
    try:
        yield from batches
    except MmfsError as exc:
        _exit(exc, hint)


def copy_reads(mount: Mount, args: Any, split: str, wanted: int, start: int, group: int,
               files: Iterator[str]) -> Iterator[str]:
    """A plain folder copy: the micro-batch files the rank reads of `split` to the end of
    the job, listed (and checked against the copy's manifest) before training starts, so
    that a short copy is refused up front; the stream goes on lazily past them."""
    if split == "train":
        wanted = _train_samples_needed(mount, args, wanted)
    elif relaunch_phase(mount, args) is not None:
        return files  # a relaunch's own valid and test: Megatron's count is the whole run's, not this launch's
    need = max(wanted - start, 0) // group
    first: list[str] = []
    why = ""
    try:
        first.extend(itertools.islice(files, need))
    except LoaderError as exc:
        why = f" ({exc})"
    if len(first) < need:
        raise MegatronJobError(f"{mount.path}: the copy holds {len(first)} of the {need} micro-batches this rank "
                               f"reads of {split} from consumed_samples {start} ({wanted} samples in all){why}: copy "
                               "what the job reads (mmfs.adapters.megatron_copy.copy_job_files, its reads) again")
    return itertools.chain(first, files)


def mount_datasets_provider(mount_path: str | os.PathLike, *, get_args: Callable[[], Any] | None = None,
                            data_parallel: Callable[[], tuple[int, int]] | None = None,
                            to_tensor: Callable[[np.ndarray], Any] | None = None):
    """A train_valid_test_datasets_provider for pretrain() with --dataloader-type
    external, reading the mount (or a plain folder copy of its files) at mount_path, or
    given a config file, its mount's files served in this process (mmfs.loader.Mount).
    get_args, data_parallel (-> (rank, size)) and to_tensor default to Megatron's
    and torch's; the tests pass their own."""
    get_args = get_args or _megatron_args
    data_parallel = data_parallel or _megatron_data_parallel
    to_tensor = to_tensor or _torch_tensor

    def provider(train_val_test_num_samples, vp_stage=None):
        rank, size = data_parallel()
        try:
            args = checked_args(get_args())
            samples = checked_samples(train_val_test_num_samples)
            flags = batch_flags(args)
            starts = start_samples(args)
            mount = Mount(mount_path)
            check_job(mount, args, samples)
            phase = relaunch_phase(mount, args)  # Megatron's own relaunch: valid and test are the phase's
            streams = {}
            for split, wanted in zip(SPLITS, samples):
                if not wanted:
                    continue
                mbs = split_micro_batch_size(args, split)
                streams[split] = rank_stream_files(mount, split, rank, size, mbs, starts[split],
                                                   eval_phase(mount, split, phase))
                if mount.copy is not None:
                    streams[split] = copy_reads(mount, args, split, wanted, starts[split], size * mbs,
                                                streams[split])
        except MmfsError as exc:
            _exit(exc)
        hint = DEAD_MOUNT_HINT if isinstance(mount.files, KernelFiles) and mount.copy is None else ""  # a mount

        def iterator(split: str):
            if split not in streams:
                return None
            batches = ({name: to_tensor(value) for name, value in mount.microbatch_file(path, **flags).items()
                        if name not in MMFS_FIELDS} for path in streams[split])
            return _guarded(batches, hint)

        return tuple(iterator(split) for split in SPLITS)

    provider.is_distributed = True  # built on every rank: each reads its own stream, lazily
    return provider


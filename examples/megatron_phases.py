"""Megatron-LM trained on an mmfs mount (a run in phases included) through
`--dataloader-type external`.

With `--dataloader-type external`, Megatron-LM's build_pretraining_data_loader
hands back whatever the datasets provider returned, and
build_train_valid_test_data_iterators wraps it as it is (RerunDataIterator): the
training loop then calls next() on it once per micro-batch, and pretrain_gpt.py's
get_batch takes the fields it knows (tokens, labels, loss_mask, position_ids, and
attention_mask or cu_seqlens / max_seqlen when asked for) from the dict it gets.
`mount_datasets_provider(MOUNT)` is such a provider: on each rank it returns three
iterators over the rank's stream of the mount, each item one micro-batch in
megatron-core 0.19.2's GPTDataset.__getitem__ fields and order, stacked as torch's
default collate stacks them (mmfs.loader.Mount.megatron_batch):

- train: what Megatron's sampler, built with this job's data-parallel size and
  micro-batch size at args.consumed_train_samples, gives this rank
  (`<mount>/train/streams/dp=D,mbs=M,from=C/RRR/`, docs/streams.md), on into later
  epochs for `training.dataloader_type: cyclic`. The samples are the mount's: a run
  in phases is one launch, its blend changing at each phase's start (no
  --phase-transition-iterations, no relaunch).
- valid: the same from args.consumed_valid_samples; test: from 0.

The sampler (single or cyclic, sharding) is the mount's `training:` block's.
BlendedDataset's `dataset_id` is left out: get_batch never reads it.

The lines of a pretrain_gpt.py-style script that change (docs/phases.md):

    from megatron_phases import mount_datasets_provider      # this file, next to the script
    ...
    # setattr(train_valid_test_datasets_provider, "is_distributed", True)   # drop: the provider sets it
    pretrain(
        full_config,
        mount_datasets_provider(os.environ["MMFS_MOUNT"]),  # was: train_valid_test_datasets_provider
        ModelType.encoder_or_decoder,
        forward_step,
        ...
    )

and the launch line gains `--dataloader-type external` (the --data-path and
--split arguments are no longer read). get_batch and forward_step stay as they are.

Without torch and Megatron (the tests), `rank_stream` gives the same micro-batches
as numpy arrays; torch and megatron are imported only when the provider runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from mmfs.loader import LoaderError, Mount

# The fields mmfs.loader adds to Megatron's (which get_batch would not read).
MMFS_FIELDS = ("sample_ids", "phase")


def rank_stream(mount: Mount, split: str, rank: int, data_parallel_size: int, micro_batch_size: int,
                consumed_samples: int, **flags: bool) -> Iterator[dict[str, np.ndarray]]:
    """The micro-batches Megatron's sampler gives `rank` from consumed_samples, in
    GPTDataset's fields: one pass for the single sampler (Megatron's iterator ends
    there), pass after pass for the cyclic one (as cyclic_iter goes on)."""
    training = mount.info.get("training") or {}
    sampler = training.get("dataloader_type", "single")
    group = data_parallel_size * micro_batch_size
    while True:
        files = mount.stream_files(split, rank, data_parallel_size, micro_batch_size, consumed_samples)
        for path in files:
            batch = mount.microbatch_file(path, **flags)
            yield {name: value for name, value in batch.items() if name not in MMFS_FIELDS}
        if sampler != "cyclic":
            return
        # the next epoch starts where rank 0's pass ends (every rank's, but unsharded
        # cyclic's last micro-batch of a rank may be one short of rank 0's)
        first_rank = mount.stream_files(split, 0, data_parallel_size, micro_batch_size, consumed_samples)
        consumed_samples += len(first_rank) * group


def batch_flags(args: Any) -> dict[str, bool]:
    """Megatron-LM's arguments that shape GPTDataset's fields (its GPTDatasetConfig)."""
    return {
        "eod_mask_loss": bool(getattr(args, "eod_mask_loss", False)),
        "reset_position_ids": bool(getattr(args, "reset_position_ids", False)),
        "reset_attention_mask": bool(getattr(args, "reset_attention_mask", False)),
        "create_attention_mask": bool(getattr(args, "create_attention_mask_in_dataloader", False)),
        "inter_document_masking": bool(getattr(args, "dataloader_inter_document_masking", False)),
    }


def _torch_tensor(value: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(value))


def _megatron_data_parallel() -> tuple[int, int]:
    from megatron.core import mpu

    return mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()


def _megatron_args():
    from megatron.training import get_args

    return get_args()


def mount_datasets_provider(mount_path: str | os.PathLike, *, get_args: Callable[[], Any] | None = None,
                            data_parallel: Callable[[], tuple[int, int]] | None = None,
                            to_tensor: Callable[[np.ndarray], Any] | None = None):
    """A train_valid_test_datasets_provider for pretrain() with --dataloader-type
    external. get_args, data_parallel (-> (rank, size)) and to_tensor default to
    Megatron's and torch's; the tests pass their own."""
    get_args = get_args or _megatron_args
    data_parallel = data_parallel or _megatron_data_parallel
    to_tensor = to_tensor or _torch_tensor

    def provider(train_val_test_num_samples, vp_stage=None):
        args = get_args()
        mount = Mount(mount_path)
        if getattr(args, "dataloader_type", "external") != "external":
            raise LoaderError(f"{mount_path}: launch with --dataloader-type external (Megatron would wrap these "
                              "iterators in its own samplers otherwise)")
        if mount.sequence_length != args.seq_length:
            raise LoaderError(f"{mount_path}: the mount's sequence_length is {mount.sequence_length}, the job's "
                              f"--seq-length {args.seq_length}")
        for split, wanted in zip(("train", "valid", "test"), train_val_test_num_samples):
            have = mount.samples.get(split, 0)
            if wanted and have < wanted:
                raise LoaderError(f"{mount_path}: the {split} split has {have} samples, the job reads {wanted}; "
                                  f"give the config's samples.{split} (or training: train_iters ...) to match")
        rank, size = data_parallel()
        flags = batch_flags(args)
        starts = {"train": args.consumed_train_samples, "valid": args.consumed_valid_samples, "test": 0}

        def stream(split: str):
            if not train_val_test_num_samples[("train", "valid", "test").index(split)]:
                return None
            batches = rank_stream(mount, split, rank, size, args.micro_batch_size, starts[split], **flags)
            return ({name: to_tensor(value) for name, value in batch.items()} for batch in batches)

        return stream("train"), stream("valid"), stream("test")

    provider.is_distributed = True  # built on every rank: each reads its own stream, on tensor-parallel rank 0
    return provider

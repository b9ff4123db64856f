"""Megatron-Bridge 0.6.x trained on an mmfs mount: a train/valid/test datasets provider
with the signature of Bridge's own (data/utils.py's
pretrain_train_valid_test_datasets_provider), whose datasets are map-style: sample i of
a split is the mount's `<split>/samples/i`, as megatron-core's GPTDataset.__getitem__(i)
gives it. Bridge's own samplers and loaders stay in charge (data/loaders.py: the
training sampler of dataset.dataloader_type, the cyclic sampler for validation, the
eval batch sizes, the consumed counts of train_state.pt), so a job reads exactly what
it read from its blend, provided the mount's config is `mmfs config --from-bridge` of
that run (docs/bridge.md):

    from megatron.bridge.data import utils as bridge_data
    from megatron.bridge.training.config import GPTDatasetConfig
    from mmfs.adapters.bridge import mount_datasets_provider

    bridge_data._REGISTRY[GPTDatasetConfig] = mount_datasets_provider(os.environ["MMFS_MOUNT"])
    pretrain(cfg, forward_step)   # cfg.dataset stays the run's GPTDatasetConfig

Bridge 0.6.x picks the provider of a dataset config by its class (a registry), and only
a GPTDatasetConfig validates with the cyclic sampler, so the provider replaces the
registry's entry for that class rather than the config.

Items are dicts of numpy arrays, GPTDataset's fields in its order (tokens, labels,
[attention_mask,] loss_mask, position_ids; no dataset_id), by the dataset config's
flags (create_attention_mask, eod_mask_loss, reset_position_ids, reset_attention_mask);
torch's default collate stacks them into the tensors GPTDataset's would give. Importing
this module needs numpy only. A job that does not fit the mount (another sequence
length or seed, more samples than the mount serves) is one line and a LoaderError.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mmfs.loader import LoaderError, Mount

SPLITS = ("train", "valid", "test")
FLAGS = ("create_attention_mask", "eod_mask_loss", "reset_position_ids", "reset_attention_mask")


class MountSplit:
    """One split of a mount as a map-style dataset: len() samples, [i] GPTDataset's item i."""

    def __init__(self, mount: Mount, split: str, flags: dict[str, bool]) -> None:
        self.mount, self.split, self.flags = mount, split, dict(flags)

    def __len__(self) -> int:
        return self.mount.samples.get(self.split, 0)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"{self.split}: a sample index is an integer, got {type(i).__name__}")
        if not 0 <= i < len(self):
            raise IndexError(f"{self.split}: sample {i} is outside [0, {len(self)})")
        return self.mount.megatron_item(self.split, int(i), **self.flags)


def _check(mount: Mount, counts: Any, dataset_config: Any) -> None:
    """The job's dataset config and sample counts against the mount's."""
    seq = getattr(dataset_config, "sequence_length", None) or getattr(dataset_config, "seq_length", None)
    if seq is not None and int(seq) != mount.sequence_length:
        raise LoaderError(f"{mount.path}: dataset.seq_length {seq} differs from the mount's sequence_length "
                          f"{mount.sequence_length}; mount the config of this run (mmfs config --from-bridge)")
    seed, own = getattr(dataset_config, "random_seed", None), (mount.info.get("config") or {}).get("seed")
    if seed is not None and own is not None and int(seed) != int(own):
        raise LoaderError(f"{mount.path}: dataset.random_seed {seed} differs from the mount's seed {own}; "
                          "mount the config of this run (mmfs config --from-bridge)")
    for split, wanted in zip(SPLITS, counts):
        if wanted and int(wanted) > mount.samples.get(split, 0):
            raise LoaderError(f"{mount.path}: Bridge asks {int(wanted)} {split} samples, the mount serves "
                              f"{mount.samples.get(split, 0)}; mount the config of this run "
                              "(mmfs config --from-bridge)")


def mount_datasets_provider(mount_path: str | os.PathLike):
    """Bridge's provider callable over the mount at mount_path (or, given a config file,
    its mount's files served in this process: mmfs.loader.Mount):
    provider(train_val_test_num_samples, dataset_config) -> (train, valid, test)."""
    mount = Mount(mount_path)

    def provider(train_val_test_num_samples, dataset_config, *_args: Any, **_kwargs: Any):
        _check(mount, list(train_val_test_num_samples), dataset_config)
        flags = {f: bool(getattr(dataset_config, f, False)) for f in FLAGS}
        return tuple(MountSplit(mount, split, flags) if mount.samples.get(split) else None for split in SPLITS)

    return provider

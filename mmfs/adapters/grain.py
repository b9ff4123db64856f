"""A split of a mount as a grain RandomAccessDataSource: __len__ and __getitem__,
picklable (it holds the mount's path; each process opens the mount itself, or, given a
config, serves it itself: mmfs.loader.Mount) and thread-safe (every read is its own
read of a sample file).

    source = SampleSource("/mnt/data", "train")            # tokens, in the mount's dtype
    source = SampleSource("/mnt/data", "train", megatron=True, eod_mask_loss=True)
    source = SampleSource("/mnt/data", "valid", phase=1)    # phase 1's own valid (phase_mode restart)
    dataset = grain.MapDataset.source(source)

grain need not be installed to build one; it only calls the protocol.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mmfs.loader import Mount


class SampleSource:
    """The samples of one split, by id (the mount's order: Megatron's dataset index)."""

    def __init__(self, mount: str | os.PathLike, split: str = "train", *, megatron: bool = False,
                 phase: int | None = None, **flags: bool) -> None:
        self.path, self.split, self.megatron, self.flags = os.fspath(mount), split, megatron, flags
        self.phase = phase  # a restart phase's own valid or test
        self._open()

    def _open(self) -> None:
        self._mount = Mount(self.path)
        self._mount.sample_path(self.split, 0, self.phase)  # the split exists and has a sample
        self._len = self._mount.split_samples(self.split, self.phase)
        self._beyond = self._mount.beyond_samples(self.split) if self.phase is None else 0

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, record_key: int) -> np.ndarray | dict[str, np.ndarray]:
        i = int(record_key)
        # ids past the split's samples: a restart phase's own (its beyond view), which its
        # cyclic sampler's micro-batches name; grain's own sampling stays within __len__
        if not 0 <= i < self._len + self._beyond:
            raise IndexError(f"record {i} is outside [0, {self._len + self._beyond}) of {self.split}")
        if self.megatron:
            return self._mount.megatron_item(self.split, i, phase=self.phase, **self.flags)
        return self._mount.sample(self.split, i, self.phase)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "split": self.split, "megatron": self.megatron, "flags": self.flags,
                "phase": self.phase}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"phase": None, **state})  # (a source pickled before phase=)
        self._open()

    def __repr__(self) -> str:  # grain logs sources by repr
        phase = "" if self.phase is None else f", phase={self.phase}"
        return f"SampleSource({self.path!r}, {self.split!r}, megatron={self.megatron}{phase})"

"""What an epoch warning line is made of (mmfs/megatron/epochs.py for a run,
mmfs/megatron/phases/epochs.py for a run in phases): a GPTDataset's one epoch by
tokens, where a sample falls in the run, and what Megatron does past it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

MEGATRON_GOES_ON = ("Megatron goes on: its GPTDataset builds as many epochs of the documents as the samples asked "
                    "need, and the model sees them again")


@dataclass(frozen=True)
class Member:
    """One GPTDataset of a split: its name and what one epoch of it holds."""

    name: str
    tokens: int  # tokens of its documents in the split
    sequence_length: int
    extra: int  # the extra token of each sample (0 or 1)

    @property
    def one_epoch(self) -> int:
        return max(0, (self.tokens - self.extra) // self.sequence_length)

    def epochs(self, samples: int) -> float:
        """The passes over its documents that `samples` samples read (by tokens)."""
        return (samples * self.sequence_length + self.extra) / max(1, self.tokens)


def where(split: str, position: int, schedule: Any, cyclic: bool, about: bool) -> str:
    near = "about " if about else ""
    if schedule is None:
        return f"at {near}sample {position:,} of the {split} split"
    iteration, _ = schedule.iteration_at(position)
    what = "iteration" if split == "train" else "evaluation step"
    shuffled = " (in the split's order; the cyclic sampler reads it shuffled)" if cyclic and split == "train" else ""
    return f"at {what} {near}{iteration:,} (sample {position:,}){shuffled}"


def tokens_of(dataset: Any, beg: int, end: int) -> int:
    """The tokens of sequences [beg, end) of an opened dataset."""
    read = getattr(dataset, "read_sequence_lengths", None)
    lengths = read() if read else dataset.sequence_lengths
    return int(np.asarray(lengths[beg:end]).sum(dtype=np.int64))

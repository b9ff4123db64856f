"""What an epoch warning line is made of (mmfs/megatron/epochs.py for a run,
mmfs/megatron/phases/epochs.py and eval_epochs.py for a run in phases): a
GPTDataset's one epoch by tokens, where a split's reads pass it, where a sample
falls in the run, and what Megatron does past it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

MEGATRON_GOES_ON = ("Megatron goes on: its GPTDataset builds as many epochs of the documents as the samples asked "
                    "need, and the model sees them again")


EXACT_UP_TO = 16_000_000  # blend positions read (or computed) exactly, at most


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


@dataclass(frozen=True)
class Past:
    """Where the reads [start, end) of a split pass one of its datasets' documents."""

    member: Member
    first: int  # the split position of the first sample read past them
    about: bool  # first, reach and read estimated from the weight
    reach: int  # the dataset's samples the split draws before `end`
    read: int  # of those, the ones drawn within the reads


def reads_past(start: int, end: int, members: list[Member], weights: list[float] | None,
               blend_prefix: Callable[[int], np.ndarray] | None) -> list[Past]:
    """Each dataset whose samples read in split positions [start, end) reach past its
    documents (blend_prefix(n): the blend's first n dataset ids, a prefix of any
    longer blend's, as the greedy blend is; None: one GPTDataset, the split itself)."""
    out = []
    known: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]

    def prefix(n: int) -> np.ndarray:  # one blend computation for every dataset of the split
        if len(known[0]) < n:
            known[0] = np.asarray(blend_prefix(n))
        return known[0][:n]

    for d, m in enumerate(members):
        epoch = m.one_epoch
        if blend_prefix is None:  # the GPTDataset's sample i is the split's
            if max(epoch, start) < end:
                out.append(Past(m, max(epoch, start), False, end, end - start))
            continue
        w = weights[d]
        if w <= 0 or w * end <= epoch - 1:  # the greedy blend draws within 1 of weight x samples
            continue
        first: int | None
        need = min(end, math.ceil((epoch + 2) / w) + len(members) + 2)
        if need <= EXACT_UP_TO:
            drawn = np.flatnonzero(prefix(need) == d)
            first, about = (int(drawn[epoch]) if drawn.size > epoch else None), False
        else:
            first, about = min(end - 1, math.ceil((epoch + 1) / w) - 1), True
        if first is None:
            continue
        if first < start:  # past them before the reads: from the reads' first draw of it
            need = min(end, start + math.ceil(1 / w) + len(members) + 2)
            if need <= EXACT_UP_TO:
                drawn = np.flatnonzero(prefix(need)[start:] == d)
                first = start + int(drawn[0]) if drawn.size else None
            else:
                first, about = start, True
        if first is None or first >= end:
            continue
        if end <= EXACT_UP_TO:
            ids = prefix(end)
            reach, read = int(np.count_nonzero(ids == d)), int(np.count_nonzero(ids[start:] == d))
        else:
            reach, read = round(w * end), round(w * (end - start))
        if reach > epoch:
            out.append(Past(m, first, about, reach, read))
    return out


def where(split: str, position: int, schedule: Any, cyclic: bool, about: bool) -> str:
    near = "about " if about else ""
    if schedule is None:
        return f"at {near}sample {position:,} of the {split} split"
    iteration, _ = schedule.iteration_at(position)
    what = "iteration" if split == "train" else "evaluation step"
    shuffled = " (in the split's order; the cyclic sampler reads it shuffled)" if cyclic else ""
    return f"at {what} {near}{iteration:,} (sample {position:,}){shuffled}"


def tokens_of(dataset: Any, beg: int, end: int) -> int:
    """The tokens of sequences [beg, end) of an opened dataset."""
    read = getattr(dataset, "read_sequence_lengths", None)
    lengths = read() if read else dataset.sequence_lengths
    return int(np.asarray(lengths[beg:end]).sum(dtype=np.int64))

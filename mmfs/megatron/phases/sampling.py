"""A run in phases as the cyclic sampler reads it (docs/phases.md): each phase's span
for sampling/phaseplan.py, and the samples past the run's own that a restart phase's
dataset holds (the train split's beyond view serves them).

Under restart, Megatron-LM's relaunch of phase k samples from the phase's own
dataset: its BlendedDataset (sum of ceil(samples x weight) over its datasets, a few
more than the phase's samples) or, for one prefix without a weight, the bare
GPTDataset (as long as its epochs make it). The run lists the first `listed` samples
of it; the others (its tail) get split ids past the run's last, phase after phase.
Under continue, each phase's sampler reads its own range of the run and nothing
else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mmfs.megatron.sampling.phaseplan import PhasedSampler, PhaseSpan


@dataclass(frozen=True)
class PhaseTail:
    """What a restart phase's own dataset holds past its share of the run.

    listed: the phase's samples in the run; length: its dataset's samples;
    runs: the samples after the first `listed`, in its order, as (the run's
    GPTDataset id, that GPTDataset's sample as its __getitem__ takes it, count)."""

    listed: int
    length: int
    runs: tuple[tuple[int, int, int], ...] = ()


def blend_tail(dataset_index: Any, dataset_sample_index: Any, members: list[int], listed: int) -> PhaseTail:
    """The tail of a phase's BlendedDataset (its two arrays, ids local to the phase;
    members maps them to the run's GPTDatasets): each entry a run of one sample."""
    ids = np.asarray(dataset_index[listed:], dtype=np.int64)
    samples = np.asarray(dataset_sample_index[listed:], dtype=np.int64)
    runs = tuple((int(members[d]), int(j), 1) for d, j in zip(ids, samples))
    return PhaseTail(listed, listed + len(runs), runs)


def gpt_tail(gpt: int, length: int, listed: int) -> PhaseTail:
    """The tail of a bare GPTDataset of `length` samples: its samples from `listed` on."""
    return PhaseTail(listed, length, ((gpt, listed, length - listed),) if length > listed else ())


def cyclic_spans(split: Any) -> list[PhaseSpan]:
    """Each phase of a PhasedSplit (phases/build.py) as its cyclic sampler reads it."""
    tails = getattr(split, "tails", None) or [None] * len(split.slices)
    spans, beyond = [], len(split)
    for s, tail in zip(split.slices, tails):
        length = s.size if tail is None else tail.length
        spans.append(PhaseSpan(s.start, s.size, length, beyond))
        beyond += length - s.size
    return spans


def beyond_runs(split: Any) -> list[tuple[int, int, int, int]]:
    """The split's samples past its own, as (offset past its last id, count, GPTDataset,
    its sample): the C reader's mmfs_sample_run array. Empty without restart tails."""
    out, at = [], 0
    for tail in getattr(split, "tails", None) or ():
        for gpt, sample, count in tail.runs:
            out.append((at, count, gpt, sample))
            at += count
    return out


def sample_phase(split: Any, i: int) -> int:
    """The phase of split id i, the run's own samples and those past them alike."""
    if i < len(split):
        return split.phase_of(i)
    for k, span in enumerate(cyclic_spans(split)):
        if span.beyond <= i < span.beyond + span.length - span.listed:
            return k
    raise IndexError(f"train: sample {i} is past the run's samples and their phases' own")


def split_sampler(split: Any, dataloader_type: str, micro_batch_size: int, data_parallel_size: int,
                  data_sharding: bool = True) -> PhasedSampler | None:
    """The cyclic samplers of a phased split (its SplitIndices) on a layout, or None
    where one sampler reads the whole split (single, valid and test, no phases)."""
    if dataloader_type != "cyclic" or getattr(split, "phases", None) is None:
        return None
    return PhasedSampler(cyclic_spans(split), micro_batch_size, data_parallel_size, data_sharding)


def beyond_count(split: Any) -> int:
    """How many split ids lie past the split's own samples (its beyond view's files)."""
    return sum(t.length - t.listed for t in getattr(split, "tails", None) or ())


def sampler_facts(split: Any) -> list[dict[str, int]]:
    """Per phase, mmfs.json's `sampler_samples` (the samples its cyclic sampler draws
    from: Megatron's len(dataset) in its relaunch under restart, its own samples
    under continue) and `beyond_first_id` (the split id of its sample `samples`)."""
    return [{"sampler_samples": s.length, "beyond_first_id": s.beyond} for s in cyclic_spans(split)]

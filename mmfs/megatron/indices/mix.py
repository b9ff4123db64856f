"""What a split's indices hold, counted: which GPTDataset each sample comes from,
which of its samples a run reads, and how those samples cut documents. Counts
only (numpy over whole index arrays); mmfs.tools.report.command turns them into figures."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mmfs.megatron.build.builder import GptIndices, SplitIndices


def sequence_lengths(dataset) -> np.ndarray:
    """A dataset's sequence lengths as an array (read once for a remote or packed one)."""
    read = getattr(dataset, "read_sequence_lengths", None)
    return np.asarray(read() if read else dataset.sequence_lengths)


def _entries(split: SplitIndices, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(GPTDataset, the id its __getitem__ takes) of each top-level sample id; ids past
    the split's own samples are a restart phase's own (phases/sampling.py's beyond)."""
    ids = np.asarray(ids, dtype=np.int64)
    own = ids < len(split)
    which, inner = np.zeros(len(ids), dtype=np.int16), ids.copy()
    if split.blend is not None:
        which[own] = np.asarray(split.blend.dataset_index)[ids[own]]
        inner[own] = np.asarray(split.blend.dataset_sample_index)[ids[own]]
    if not own.all():
        from mmfs.megatron.phases.sampling import beyond_runs  # (phases build on these counts)

        runs = np.asarray(beyond_runs(split), dtype=np.int64).reshape(-1, 4)  # first, count, gpt, sample
        at = ids[~own] - len(split)
        r = np.searchsorted(runs[:, 0], at, side="right") - 1
        which[~own], inner[~own] = runs[r, 2], runs[r, 3] + at - runs[r, 0]
    return which, inner


def dataset_of(split: SplitIndices, ids: np.ndarray) -> np.ndarray:
    """The GPTDataset (position in split.gpts) of each top-level sample id."""
    return _entries(split, ids)[0]


def gpt_samples(split: SplitIndices, ids: np.ndarray) -> list[np.ndarray]:
    """For each GPTDataset of the split, the ids (of its __getitem__) that the
    top-level samples `ids` read, in the order given."""
    which, inner = _entries(split, ids)
    order = np.argsort(which, kind="stable")
    ends = np.cumsum(np.bincount(which, minlength=len(split.gpts)))
    inner = inner[order]
    return [inner[a:b] for a, b in zip(np.concatenate(([0], ends[:-1])), ends)]


def epochs_in_index(gpt: GptIndices) -> int:
    """How many epochs of the split's documents the document index holds."""
    n = gpt.params.end - gpt.params.beg
    return gpt.shape("document_index")[0] // n if n else 0


@dataclass(frozen=True)
class Cuts:
    """How a GPTDataset's samples (those a run reads) are cut from its documents."""

    documents_per_sample: np.ndarray  # [k] = samples that read k documents (document index entries)
    mid_document: int  # samples whose last token is not the last of its document
    epochs_reached: int  # 1 + the highest epoch of the document index a sample reads
    read_per_epoch: np.ndarray  # [e] = samples that start in epoch e of the document index


def sample_cuts(gpt: GptIndices, samples: np.ndarray, lengths: np.ndarray) -> Cuts:
    """Cuts of GPTDataset samples `samples` (ids of its __getitem__). Sample k reads
    document index entries sample_index[k, 0] .. sample_index[k + 1, 0], the last up
    to token sample_index[k + 1, 1] + add_extra_token (megatron-core's GPTDataset)."""
    if len(samples) == 0:
        return Cuts(np.zeros(1, dtype=np.int64), 0, 0, np.zeros(0, dtype=np.int64))
    k = np.asarray(gpt.shuffle_index)[samples].astype(np.int64)
    rows = np.asarray(gpt.sample_index)
    first = rows[k, 0].astype(np.int64)
    last = rows[k + 1, 0].astype(np.int64)
    end = rows[k + 1, 1].astype(np.int64) + gpt.params.extra
    docs = np.asarray(gpt.document_index)
    mid = int(np.count_nonzero(end < lengths[docs[last]]))
    n = gpt.params.end - gpt.params.beg
    per_epoch = np.bincount(first // n)
    return Cuts(np.bincount(last - first + 1), mid, int(last.max() // n) + 1, per_epoch)

"""Stream a dataset's index arrays in fixed-size chunks.

Scanning a memory-mapped .idx pages the whole file into the process (a 2 GB index
shows up as 2 GB resident); reading chunks with plain file reads keeps memory at
one chunk whatever the dataset size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import numpy as np

from mmfs.errors import FormatError

CHUNK = 1 << 20  # entries per chunk: 4-8 MB per array

log = logging.getLogger(__name__)


def iter_array(ds, name: str, chunk: int = CHUNK, begin: int = 0,
               end: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """(first index, values) chunks of entries [begin, end) of the array `name` of
    dataset `ds` (end None: to the last entry)."""
    spec = ds.arrays.get(name)
    if spec is None:  # an array the format makes up (a .pbin's 0..N document bounds)
        arr = getattr(ds, name)
        stop = len(arr) if end is None else min(end, len(arr))
        for start in range(begin, stop, chunk):
            yield start, np.asarray(arr[start : min(start + chunk, stop)])
        return
    count = spec.count if end is None else min(end, spec.count)
    # No opened() block here: a generator may be closed later, by another thread
    # (one open per chunk of a million entries costs nothing).
    for start in range(begin, count, chunk):
        yield start, spec.read(start, min(chunk, count - start))


def element_offset(ds, name: str, i: int) -> str:
    """'name[i] (byte B of the .idx)' when the array lives in a file, else 'name[i]'."""
    spec = ds.arrays.get(name)
    if spec is None or spec.source.url != ds.idx_path:  # not in the index file
        return f"{name}[{i}]"
    return f"{name}[{i}] (byte {spec.offset + i * spec.dtype.itemsize})"


class Progress:
    """Logs 'what: p%' at most every `every` seconds; silent for quick jobs."""

    def __init__(self, what: str, total: int, every: float = 5.0) -> None:
        self.what, self.total, self.every = what, max(total, 1), every
        self.last = time.monotonic()

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            log.info("%s: %d%% (%s of %s)", self.what, 100 * done // self.total,
                     f"{done:,}", f"{self.total:,}")


def iter_document_lengths(ds, chunk: int = CHUNK) -> Iterator[np.ndarray]:
    """Tokens per document (int64 chunks), from sequence lengths and document_indices
    streamed side by side. document_indices must be valid (verify.check_document_indices)."""
    seqs = iter_array(ds, "sequence_lengths", chunk)
    # A window of prefix sums: win[j] = tokens in sequences [0, s + j).
    s, win = 0, np.zeros(1, dtype=np.int64)
    prev = None
    for _, docs in iter_array(ds, "document_indices", chunk):
        prefix = np.empty(len(docs), dtype=np.int64)
        i = 0
        while i < len(docs):
            e = s + len(win) - 1
            k = int(np.searchsorted(docs, e, side="right"))  # docs[i:k] fall in the window
            if k > i:
                prefix[i:k] = win[docs[i:k] - s]
                i = k
            if i < len(docs):
                try:
                    _, lengths = next(seqs)
                except StopIteration:
                    raise FormatError(f"{ds.idx_path}: document_indices names sequence "
                                      f"{int(docs[i])}, past the last one; run `mmfs verify "
                                      f"{ds.path_prefix}`") from None
                sums = np.cumsum(lengths, dtype=np.int64)
                sums += win[-1]
                s, win = e, np.concatenate((win[-1:], sums))
        if prev is None:
            out = np.diff(prefix)
        else:
            out = np.diff(prefix, prepend=prev)
        prev = int(prefix[-1])
        if out.size:
            yield out

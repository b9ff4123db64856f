"""What every token-file reader shares: bounds-checked reads of sequences and
documents from the attributes a format class fills in at open.

A subclass sets: path_prefix, idx_path, bin_path, dtype, num_sequences,
num_documents, sequence_lengths (int32[N]), sequence_pointers (int64[N], byte
offsets into `data`), document_indices (int64[M+1]), data (uint8 buffer) and
data_section ((start, end) bytes of `data` that may hold tokens).
"""

from __future__ import annotations

import os
import stat
from functools import cached_property

import numpy as np

from mmfs.errors import FormatError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def file_problem(path: str) -> str | None:
    """Why `path` cannot be opened as a regular file, or None when it can be.
    (Opening a FIFO would block, so nothing is opened here.)"""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "file not found"
    except ValueError:  # an embedded NUL byte
        return "not a usable file name"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    kind = next((what for test, what in _KINDS if test(mode)), "not a file")
    return f"is {kind}, not a regular file"


class SequenceDataset:
    """Reads sequences and documents; never returns bytes outside the data section."""

    path_prefix: str
    idx_path: str
    bin_path: str
    dtype: np.dtype
    num_sequences: int
    num_documents: int
    sequence_lengths: np.ndarray
    sequence_pointers: np.ndarray
    document_indices: np.ndarray
    data: np.ndarray
    data_section: tuple[int, int]
    # True when the format makes every document one sequence (document_indices is
    # 0..N by construction: nothing to check, no need to build it)
    documents_are_sequences = False

    def __len__(self) -> int:
        return self.num_sequences

    @cached_property
    def num_tokens(self) -> int:
        """Sum of the sequence lengths (reads the whole length array once)."""
        return int(self.sequence_lengths.sum(dtype=np.int64))

    def get(self, seq: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens [offset, offset + length) of sequence `seq` (bounds-checked)."""
        seq, offset = int(seq), int(offset)
        n = self.num_sequences
        if not 0 <= seq < n:
            raise IndexError(f"{self.path_prefix}: sequence {seq} out of range [0, {n})")
        seq_len = int(self.sequence_lengths[seq])
        if seq_len < 0:
            raise FormatError(
                f"{self.idx_path}: sequence {seq} has negative length {seq_len}; "
                f"run `mmfs verify {self.path_prefix}`"
            )
        length = seq_len - offset if length is None else int(length)
        if offset < 0 or length < 0 or offset + length > seq_len:
            raise IndexError(
                f"{self.path_prefix}: tokens [{offset}, {offset + length}) outside sequence "
                f"{seq} of length {seq_len}"
            )
        item = self.dtype.itemsize
        start = int(self.sequence_pointers[seq]) + offset * item
        stop = start + length * item
        lo, hi = self.data_section
        if start < lo or stop > hi:
            raise FormatError(
                f"{self.bin_path}: sequence {seq} points to bytes {start}..{stop}, outside the "
                f"token data (bytes {lo}..{hi}); run `mmfs verify {self.path_prefix}`"
            )
        return np.frombuffer(self._buffer, dtype=self.dtype, count=length, offset=start)

    @cached_property
    def _buffer(self) -> memoryview:
        # frombuffer on a memoryview is cheaper than on the memmap object itself
        return memoryview(self.data)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(self.num_sequences)
            if step != 1:
                raise ValueError("slices must be contiguous")
            return [self.get(i) for i in range(start, stop)]
        key = int(key)
        if key < 0:
            key += self.num_sequences
        return self.get(key)

    def document_sequences(self, doc: int) -> range:
        """The sequence ids of document `doc`."""
        doc = int(doc)
        if not 0 <= doc < self.num_documents:
            raise IndexError(
                f"{self.path_prefix}: document {doc} out of range [0, {self.num_documents})"
            )
        beg, end = int(self.document_indices[doc]), int(self.document_indices[doc + 1])
        if not 0 <= beg <= end <= self.num_sequences:
            raise FormatError(
                f"{self.idx_path}: document {doc} spans sequences {beg}..{end}, outside "
                f"[0, {self.num_sequences}]; run `mmfs verify {self.path_prefix}`"
            )
        return range(beg, end)

    def get_document(self, doc: int) -> np.ndarray:
        """Every token of document `doc` (its sequences concatenated)."""
        parts = [self.get(s) for s in self.document_sequences(doc)]
        return np.concatenate(parts) if parts else np.zeros(0, self.dtype)

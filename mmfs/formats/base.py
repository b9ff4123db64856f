"""What every token-file reader shares: bounds-checked reads of sequences and
documents from the attributes a format class fills in at open.

A subclass sets: path_prefix, idx_path, bin_path, dtype, num_sequences,
num_documents, arrays (name -> ArraySpec: "tokens", the token file as uint8, and
"sequence_lengths", "sequence_pointers" (byte offsets into the token file), and
"document_indices" unless every document is one sequence), sequence_lengths
(int32[N]), sequence_pointers (int64[N]), document_indices (int64[M+1]) and
data_section ((start, end) bytes of the token file that may hold tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from mmfs.errors import FormatError
from mmfs.storage.base import Source


@dataclass(frozen=True)
class ArraySpec:
    """Where one of a dataset's arrays lies: `count` elements of `dtype` from byte
    `offset` of `source`. Every format describes its arrays this way, so readers
    (the streaming checks, the C core) need no case per format."""

    source: Source
    offset: int
    dtype: np.dtype
    count: int

    def read(self, start: int, count: int) -> np.ndarray:
        """Entries [start, start + count) in native byte order, read from the source."""
        out = np.empty(count, dtype=self.dtype)
        got = self.source.read_into(self.offset + start * self.dtype.itemsize,
                                    memoryview(out).cast("B"))
        if got != out.nbytes:  # the file shrank after it was opened
            raise FormatError(f"{self.source.url}: ends inside an array at entry "
                              f"{start + got // self.dtype.itemsize}; the file was truncated "
                              "while open")
        return out if self.dtype.isnative else out.astype(self.dtype.newbyteorder("="))


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
    arrays: dict[str, ArraySpec]
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
        if self._buffer is None:  # a source that cannot be mapped: read these bytes
            return ArraySpec(self.arrays["tokens"].source, start, self.dtype, length).read(0, length)
        return np.frombuffer(self._buffer, dtype=self.dtype, count=length, offset=start)

    @cached_property
    def data(self) -> np.ndarray | None:
        """The token file as uint8, mapped (or in memory; None for a source that cannot
        be mapped): sequence pointers index it."""
        source = self.arrays["tokens"].source
        return source.map() if hasattr(source, "map") else None

    @cached_property
    def _buffer(self) -> memoryview | None:
        # frombuffer on a memoryview is cheaper than on the memmap object itself
        return None if self.data is None else memoryview(self.data)

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

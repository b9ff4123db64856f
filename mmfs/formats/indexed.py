"""Reader of Megatron's IndexedDataset (MMIDIDX version 1): a `.idx` index and a
`.bin` of tokens, both memory-mapped.

.idx layout (little-endian):
    9 bytes   magic b"MMIDIDX\\x00\\x00"
    u64       version (1)
    u8        dtype code (see dtypes.CODE_TO_DTYPE)
    u64       N, the number of sequences
    u64       M + 1, the length of document_indices
    int32[N]  sequence lengths (tokens)
    int64[N]  sequence pointers (byte offsets into .bin)
    int64[M+1] document indices (sequence id where each document starts, then N)
    int8[N]   sequence modes, multimodal datasets only (told apart by file size)

Opening checks only what costs O(1); `mmfs verify` (verify.py) checks the rest.
"""

import os
import struct

import numpy as np

from ..errors import FormatError
from .dtypes import CODE_TO_DTYPE

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, N, M+1
HEADER_SIZE = HEADER.size  # 34


def prefix_of(path: str) -> str:
    """The dataset prefix for a prefix, a `.idx` or a `.bin` path."""
    for suffix in (".idx", ".bin"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


class IndexedDataset:
    """A memory-mapped Megatron IndexedDataset.

    Attributes: path_prefix, idx_path, bin_path, dtype (numpy), dtype_code,
    sequence_lengths (int32[N]), sequence_pointers (int64[N]),
    document_indices (int64[M+1]), sequence_modes (int8[N] or None),
    data (uint8 memmap of the whole .bin; sequence pointers index into it).
    """

    format_name = "megatron-indexed"

    def __init__(self, path: str) -> None:
        self.path_prefix = prefix_of(path)
        self.idx_path = self.path_prefix + ".idx"
        self.bin_path = self.path_prefix + ".bin"
        for p in (self.idx_path, self.bin_path):
            if not os.path.isfile(p):
                raise FormatError(
                    f"{p}: file not found (an IndexedDataset needs both "
                    f"{os.path.basename(self.idx_path)} and {os.path.basename(self.bin_path)})"
                )
        self._open_index()
        self._open_data()

    # -- opening ---------------------------------------------------------

    def _open_index(self) -> None:
        idx_size = os.path.getsize(self.idx_path)
        if idx_size < HEADER_SIZE:
            raise FormatError(
                f"{self.idx_path}: {idx_size} bytes is shorter than the {HEADER_SIZE}-byte "
                "MMIDIDX header; the file is truncated or not an IndexedDataset index"
            )
        with open(self.idx_path, "rb") as f:
            magic, version, code, n, doc_count = HEADER.unpack(f.read(HEADER_SIZE))
        if magic != MAGIC:
            raise FormatError(
                f"{self.idx_path}: bad magic {magic!r} at byte 0 (expected {MAGIC!r}); "
                "not a Megatron IndexedDataset index"
            )
        if version != VERSION:
            raise FormatError(
                f"{self.idx_path}: unsupported version {version} at byte 9 (only {VERSION} exists)"
            )
        if code not in CODE_TO_DTYPE:
            raise FormatError(
                f"{self.idx_path}: unknown dtype code {code} at byte 17 (valid codes: 1-8)"
            )
        if doc_count < 1:
            raise FormatError(
                f"{self.idx_path}: document count field at byte 26 is {doc_count}; it must be "
                "at least 1 (document_indices always ends with the sequence count)"
            )
        base = HEADER_SIZE + 12 * n + 8 * doc_count
        if idx_size not in (base, base + n):
            raise FormatError(
                f"{self.idx_path}: size {idx_size} bytes does not match its header "
                f"({n} sequences, {doc_count} document indices need {base} bytes, "
                f"or {base + n} with multimodal modes); the file is truncated or corrupt"
            )
        self.dtype_code = code
        self.dtype = CODE_TO_DTYPE[code]
        self.num_sequences = n
        self.num_documents = doc_count - 1
        self.multimodal = idx_size == base + n
        self.idx_size = idx_size
        mm = np.memmap(self.idx_path, dtype=np.uint8, mode="r") if idx_size else None
        self._idx_map = mm
        off = HEADER_SIZE
        self.sequence_lengths = mm[off : off + 4 * n].view(np.int32)
        off += 4 * n
        self.sequence_pointers = mm[off : off + 8 * n].view(np.int64)
        off += 8 * n
        self.document_indices = mm[off : off + 8 * doc_count].view(np.int64)
        off += 8 * doc_count
        self.sequence_modes = mm[off : off + n].view(np.int8) if self.multimodal else None

    def _open_data(self) -> None:
        self.bin_size = os.path.getsize(self.bin_path)
        n = self.num_sequences
        if n:
            last_ptr = int(self.sequence_pointers[-1])
            last_len = int(self.sequence_lengths[-1])
            end = last_ptr + last_len * self.dtype.itemsize
            if last_ptr < 0 or last_len < 0 or end > self.bin_size:
                raise FormatError(
                    f"{self.bin_path}: the last sequence (id {n - 1}) spans bytes "
                    f"{last_ptr}..{end} but the file has {self.bin_size} bytes; the .bin is "
                    "truncated or does not belong to this .idx"
                )
        if self.document_indices[-1] != n:
            raise FormatError(
                f"{self.idx_path}: document_indices ends with {int(self.document_indices[-1])}, "
                f"expected the sequence count {n}; the index is corrupt"
            )
        if self.bin_size:
            self.data = np.memmap(self.bin_path, dtype=np.uint8, mode="r")
        else:
            self.data = np.zeros(0, dtype=np.uint8)

    # -- reading ---------------------------------------------------------

    def __len__(self) -> int:
        return self.num_sequences

    @property
    def num_tokens(self) -> int:
        return int(self.sequence_lengths.sum(dtype=np.int64))

    def get(self, seq: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens [offset, offset + length) of sequence `seq` (bounds-checked)."""
        n = self.num_sequences
        if not 0 <= seq < n:
            raise IndexError(f"{self.path_prefix}: sequence {seq} out of range [0, {n})")
        seq_len = int(self.sequence_lengths[seq])
        if length is None:
            length = seq_len - offset
        if offset < 0 or length < 0 or offset + length > seq_len:
            raise IndexError(
                f"{self.path_prefix}: tokens [{offset}, {offset + length}) outside sequence "
                f"{seq} of length {seq_len}"
            )
        item = self.dtype.itemsize
        start = int(self.sequence_pointers[seq]) + offset * item
        stop = start + length * item
        if start < 0 or stop > self.bin_size:
            raise FormatError(
                f"{self.bin_path}: sequence {seq} points to bytes {start}..{stop}, outside the "
                f"{self.bin_size}-byte file; run `mmfs verify {self.path_prefix}`"
            )
        return np.frombuffer(self.data, dtype=self.dtype, count=length, offset=start)

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
        if not 0 <= doc < self.num_documents:
            raise IndexError(f"{self.path_prefix}: document {doc} out of range")
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

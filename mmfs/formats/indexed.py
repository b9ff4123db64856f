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

Opening checks only what costs O(1), reading the header and six spot values with
pread; the arrays are mapped when first used. `mmfs verify` (verify.py) checks
the rest.
"""

import os
import struct
from functools import cached_property

import numpy as np

from mmfs.errors import FormatError
from mmfs.formats.base import ArraySpec, SequenceDataset
from mmfs.formats.dtypes import CODE_TO_DTYPE
from mmfs.storage import StorageError, open_source
from mmfs.storage.file import FileSource

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, N, M+1
HEADER_SIZE = HEADER.size  # 34


def prefix_of(path: str | os.PathLike) -> str:
    """The dataset prefix for a prefix, a `.idx` or a `.bin` path."""
    path = os.fspath(path)
    for suffix in (".idx", ".bin"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def recognise(head: bytes, size: int) -> bool:
    """An MMIDIDX index: its magic bytes."""
    return head.startswith(MAGIC)


class IndexedDataset(SequenceDataset):
    """A memory-mapped Megatron IndexedDataset.

    Attributes: path_prefix, idx_path, bin_path, dtype (numpy), dtype_code,
    sequence_lengths (int32[N]), sequence_pointers (int64[N]),
    document_indices (int64[M+1]), sequence_modes (int8[N] or None),
    data (uint8 map of the whole .bin; sequence pointers index into it),
    data_section ((start, end) bytes of `data` that hold tokens: the whole .bin),
    idx and bin (their sources), arrays (name -> ArraySpec of each array, for
    readers that stream the index in chunks instead of paging it all in).
    """

    format_name = "megatron-indexed"

    def __init__(self, path: str | os.PathLike, known: tuple | None = None) -> None:
        """known: (idx stat, bin stat, header) of files a re-open found unchanged since
        a record of them (`facts`): the dataset is described from it, nothing read."""
        self.path_prefix = prefix_of(path)
        self.idx_path = self.path_prefix + ".idx"
        self.bin_path = self.path_prefix + ".bin"
        if known is not None:
            idx_stat, bin_stat, (code, n, doc_count, *tokens) = known
            base = HEADER_SIZE + 12 * n + 8 * doc_count
            if code not in CODE_TO_DTYPE or doc_count < 1 or idx_stat.st_size not in (base, base + n):
                raise FormatError(f"{self.idx_path}: the record of it does not fit its size; run the command again")
            self.idx, self.bin = FileSource.known(self.idx_path, idx_stat), FileSource.known(self.bin_path, bin_stat)
            self._describe(code, n, doc_count)
            self.bin_size = self.bin.size
            self.data_section = (0, self.bin_size)
            if tokens:
                self.num_tokens = int(tokens[0])  # (the cached property, known)
            return
        try:
            self.idx = open_source(self.idx_path, whole=True)  # read often: a local copy
            self.bin = open_source(self.bin_path)
        except StorageError as exc:
            raise FormatError(
                f"{exc} (an IndexedDataset needs both {os.path.basename(self.idx_path)} and "
                f"{os.path.basename(self.bin_path)})") from None
        try:
            with self.idx.opened():
                self._open_index()
                self._open_data()
        except OSError as exc:  # unreadable file, not a bug: one line for the user
            raise FormatError(f"{exc.filename or self.path_prefix}: cannot read "
                              f"({exc.strerror or exc}); check the file's permissions") from None

    # -- opening ---------------------------------------------------------

    def _open_index(self) -> None:
        idx_size = self.idx.size
        if idx_size < HEADER_SIZE:
            raise FormatError(
                f"{self.idx_path}: {idx_size} bytes is shorter than the {HEADER_SIZE}-byte "
                "MMIDIDX header; the file is truncated or not an IndexedDataset index"
            )
        magic, version, code, n, doc_count = HEADER.unpack(self._read_bytes(0, HEADER_SIZE))
        if magic != MAGIC:
            raise FormatError(
                f"{self.idx_path}: bad magic {magic!r} at byte 0 (expected {MAGIC!r}); "
                "not a Megatron IndexedDataset index"
            )
        if version != VERSION:
            raise FormatError(
                f"{self.idx_path}: unsupported version {version} at byte 9 (only "
                f"{VERSION} exists); the index is corrupt or not written by Megatron"
            )
        if code not in CODE_TO_DTYPE:
            raise FormatError(
                f"{self.idx_path}: unknown dtype code {code} at byte 17 (valid codes: 1-8); "
                "the index is corrupt, rebuild it"
            )
        if doc_count < 1:
            raise FormatError(
                f"{self.idx_path}: document count field at byte 26 is {doc_count}; it must be "
                "at least 1 (document_indices always ends with the sequence count); "
                "the index is corrupt, rebuild it"
            )
        base = HEADER_SIZE + 12 * n + 8 * doc_count
        if idx_size not in (base, base + n):
            raise FormatError(
                f"{self.idx_path}: size {idx_size} bytes does not match its header "
                f"({n} sequences, {doc_count} document indices need {base} bytes, "
                f"or {base + n} with multimodal modes); the file is truncated or corrupt"
            )
        self._describe(code, n, doc_count)

    def facts(self) -> tuple[int, ...]:
        """What a re-open needs to describe the dataset without reading it (see __init__'s
        known), and its token count (mmfs.json's, which reads every sequence length)."""
        return self.dtype_code, self.num_sequences, self.num_documents + 1, self.num_tokens

    def _describe(self, code: int, n: int, doc_count: int) -> None:
        """The arrays of an index of `n` sequences and `doc_count` document indices, as checked."""
        idx_size = self.idx.size
        base = HEADER_SIZE + 12 * n + 8 * doc_count
        self.dtype_code = code
        self.dtype = CODE_TO_DTYPE[code]
        self.num_sequences = n
        self.num_documents = doc_count - 1
        # with no sequences the modes array is empty and the two layouts coincide
        self.multimodal = n > 0 and idx_size == base + n
        self.idx_size = idx_size
        off_ptr = HEADER_SIZE + 4 * n
        off_doc = off_ptr + 8 * n
        off_mode = off_doc + 8 * doc_count
        self.arrays = {
            "tokens": ArraySpec(self.bin, 0, np.dtype(np.uint8), self.bin.size),
            "sequence_lengths": ArraySpec(self.idx, HEADER_SIZE, np.dtype("<i4"), n),
            "sequence_pointers": ArraySpec(self.idx, off_ptr, np.dtype("<i8"), n),
            "document_indices": ArraySpec(self.idx, off_doc, np.dtype("<i8"), doc_count),
        }
        if self.multimodal:
            self.arrays["sequence_modes"] = ArraySpec(self.idx, off_mode, np.dtype("i1"), n)

    # -- arrays, mapped on first use ---------------------------------------
    # Opening reads the header and a few spot values with pread and maps nothing:
    # a blend of thousands of datasets opens without paging in their indices.

    @cached_property
    def _idx_map(self) -> np.ndarray:
        # Plain ndarray views of the map: indexing a np.memmap goes through a Python-level
        # __getitem__, which costs more than the rest of a sequence read.
        return self.idx.map().view(np.ndarray)

    def _mapped(self, name: str) -> np.ndarray:
        spec = self.arrays[name]
        if not hasattr(self.idx, "map"):  # a source that cannot be mapped: read it whole
            return spec.read(0, spec.count)
        size = spec.dtype.itemsize * spec.count
        return self._idx_map[spec.offset : spec.offset + size].view(spec.dtype.newbyteorder("="))

    @cached_property
    def sequence_lengths(self) -> np.ndarray:
        return self._mapped("sequence_lengths")

    @cached_property
    def sequence_pointers(self) -> np.ndarray:
        return self._mapped("sequence_pointers")

    @cached_property
    def document_indices(self) -> np.ndarray:
        return self._mapped("document_indices")

    @cached_property
    def sequence_modes(self) -> np.ndarray | None:
        return self._mapped("sequence_modes") if self.multimodal else None

    @cached_property
    def num_tokens(self) -> int:
        """Sum of the sequence lengths, read with pread in chunks: the length array
        is never mapped, so a long-running reader (the mount) keeps none of it."""
        total, chunk = 0, 1 << 20
        for start in range(0, self.num_sequences, chunk):
            count = min(chunk, self.num_sequences - start)
            total += int(self._read("sequence_lengths", start, count).sum(dtype=np.int64))
        return total

    def read_sequence_lengths(self) -> np.ndarray:
        """The sequence lengths read into memory with pread, never mapped: a builder
        that needs them once does not keep their pages in its resident memory."""
        return self._read("sequence_lengths", 0, self.num_sequences)

    def _read(self, name: str, start: int, count: int) -> np.ndarray:
        return self.arrays[name].read(start, count)

    def _read_bytes(self, offset: int, size: int) -> bytes:
        raw = bytearray(size)
        if self.idx.read_into(offset, raw) != size:
            raise FormatError(f"{self.idx_path}: shorter than its header says; the file was "
                              "truncated while open")
        return bytes(raw)

    def _spot(self, name: str, index: int) -> int:
        return int(self._read(name, index, 1)[0])

    def _open_data(self) -> None:
        # O(1) spot checks of what Megatron's writer guarantees: the first and last
        # sequence and both ends of document_indices. `mmfs verify` checks the rest.
        self.bin_size = self.bin.size
        self.data_section = (0, self.bin_size)
        n = self.num_sequences
        item = self.dtype.itemsize
        for seq in sorted({0, n - 1}) if n else ():
            ptr = self._spot("sequence_pointers", seq)
            length = self._spot("sequence_lengths", seq)
            end = ptr + length * item
            if length < 0:
                raise FormatError(
                    f"{self.idx_path}: sequence_lengths[{seq}] (byte "
                    f"{HEADER_SIZE + 4 * seq}) is {length}, negative; the index is corrupt, "
                    "rebuild it"
                )
            if ptr < 0 or end > self.bin_size:
                raise FormatError(
                    f"{self.bin_path}: sequence {seq} spans bytes {ptr}..{end} but the file "
                    f"has {self.bin_size} bytes; the .bin is truncated or does not belong to "
                    "this .idx (rebuild or re-copy both files)"
                )
        off_doc = self.arrays["document_indices"].offset
        first = self._spot("document_indices", 0)
        last = self._spot("document_indices", self.num_documents)
        if first != 0:
            raise FormatError(
                f"{self.idx_path}: document_indices[0] (byte {off_doc}) is {first}, expected 0; "
                "the index is corrupt, rebuild it"
            )
        if last != n:
            k = self.num_documents
            raise FormatError(
                f"{self.idx_path}: document_indices[{k}] (byte {off_doc + 8 * k}) is {last}, "
                f"expected the sequence count {n}; the index is corrupt, rebuild it"
            )

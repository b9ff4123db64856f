"""Writers: Megatron's IndexedDataset (.bin/.idx) and Modalities' packed .pbin.

`IndexedDatasetWriter` follows megatron-core's `IndexedDatasetBuilder`: for the same
calls it writes byte-identical files. It differs only where Megatron would write a
file its own reader rejects or silently corrupt tokens: out-of-range token values,
lengths that do not add up, and sequences never closed by `end_document()` raise
ValueError instead.
"""

from __future__ import annotations

import os
import pickle
import struct
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from mmfs.formats.dtypes import DTYPE_TO_CODE
from mmfs.formats.indexed import HEADER, MAGIC, VERSION

_INT32_MAX = 2**31 - 1
SPOOL_LIMIT = 1 << 17  # index values (1 MB) a writer keeps in memory before spilling to a file


def _as_tokens(tokens, dtype: np.dtype) -> np.ndarray:
    """`tokens` as a flat C-order array of `dtype`; ValueError if a value does not fit."""
    src = np.asarray(tokens)
    if src.dtype == object:
        raise ValueError("tokens must be numbers, not Python objects")
    out = np.ascontiguousarray(src, dtype=dtype).reshape(-1)
    # Megatron casts blindly (70000 becomes 4464 in uint16); a round trip catches it.
    back = out.astype(src.dtype, copy=False).reshape(-1)
    same = np.array_equal(back, src.reshape(-1), equal_nan=src.dtype.kind in "fc")
    if not same:
        raise ValueError(f"token values do not fit {dtype.name} (vocabulary too large?)")
    return out


def _check_lengths(lengths: np.ndarray) -> None:
    if lengths.size and (lengths.min() < 0 or lengths.max() > _INT32_MAX):
        raise ValueError("sequence lengths must be in [0, 2**31 - 1]")


class _Int64Spool:
    """An append-only list of int64 that keeps at most `limit` values in memory and the
    rest in an unnamed temporary file beside the output: a writer's index arrays then
    cost bounded memory whatever the number of sequences."""

    def __init__(self, folder: str, first: Iterable[int] = ()) -> None:
        self._folder = folder
        self._limit = SPOOL_LIMIT
        self._mem = array("q", first)
        self._file = None
        self._spilled = 0

    def __len__(self) -> int:
        return self._spilled + len(self._mem)

    def __getitem__(self, i: int) -> int:
        if i != -1 or not len(self):
            raise IndexError("only the last value can be read back")
        if self._mem:
            return self._mem[-1]
        self._file.seek(-8, os.SEEK_END)
        return int(np.frombuffer(self._file.read(8), np.int64)[0])

    def append(self, value: int) -> None:
        self._mem.append(value)
        self._spill()

    def extend(self, values: Iterable[int]) -> None:
        self._mem.extend(values)
        self._spill()

    def frombytes(self, data: bytes) -> None:
        """Append native int64 values given as bytes."""
        self._mem.frombytes(data)
        self._spill()

    def _spill(self) -> None:
        if len(self._mem) < self._limit:
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(dir=self._folder)  # noqa: SIM115 - closed in close()
        self._file.seek(0, os.SEEK_END)
        self._file.write(self._mem.tobytes())
        self._spilled += len(self._mem)
        self._mem = array("q")

    def slices(self, size: int = 1 << 20) -> Iterator[np.ndarray]:
        """The values in order, as int64 arrays of at most `size` (plus the in-memory tail)."""
        if self._file is not None:
            self._file.seek(0)
            for _ in range(0, self._spilled, size):
                yield np.frombuffer(self._file.read(size * 8), dtype=np.int64)
        if self._mem:
            yield np.frombuffer(self._mem, dtype=np.int64)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class IndexedDatasetWriter:
    """Writes a Megatron IndexedDataset: tokens go to `bin_path` as they come, the
    index to `finalize(idx_path)`.

    dtype: token dtype (one of MMIDIDX codes 1-8; see dtypes.optimal_dtype).
    multimodal: also store one int8 mode per sequence.
    """

    def __init__(self, bin_path: str, dtype=np.int32, multimodal: bool = False) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype not in DTYPE_TO_CODE:
            raise ValueError(f"dtype {self.dtype} has no MMIDIDX code (valid: uint8, int8, "
                             "int16, int32, int64, float64, float32, uint16)")
        self.bin_path = os.fspath(bin_path)
        self.multimodal = multimodal
        # Compact typed buffers spilled to a temporary file past SPOOL_LIMIT values: a Python
        # list of ints costs ~10x the memory, and a large dataset's index far more.
        folder = os.path.dirname(os.path.abspath(self.bin_path))
        self.sequence_lengths = _Int64Spool(folder)
        self.document_indices = _Int64Spool(folder, [0])
        self.sequence_modes = _Int64Spool(folder) if multimodal else None
        self._data = open(self.bin_path, "wb")  # noqa: SIM115 - open until finalize()

    def __enter__(self) -> IndexedDatasetWriter:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        self._release()

    def close(self) -> None:
        """Close the .bin without writing an index (finalize closes it too)."""
        if not self._data.closed:
            self._data.close()

    def _release(self) -> None:
        for spool in (self.sequence_lengths, self.document_indices, self.sequence_modes):
            if spool is not None:
                spool.close()

    def add_item(self, tokens, mode: int | None = None) -> None:
        """Append one sequence (any array-like, flattened in C order)."""
        arr = _as_tokens(tokens, self.dtype)
        self._data.write(arr.tobytes())
        self.sequence_lengths.append(arr.size)
        if self.sequence_modes is not None:
            self.sequence_modes.append(0 if mode is None else int(mode))

    def end_document(self) -> None:
        """Close the current document: it holds the sequences added since the last one."""
        self.document_indices.append(len(self.sequence_lengths))

    def add_document(self, tokens, lengths: Sequence[int],
                     modes: Sequence[int] | None = None) -> None:
        """Append one document of several sequences: `tokens` concatenated, split by `lengths`."""
        arr = _as_tokens(tokens, self.dtype)
        lens = np.asarray(lengths, dtype=np.int64).reshape(-1)
        _check_lengths(lens)
        if int(lens.sum()) != arr.size:
            raise ValueError(f"lengths add up to {int(lens.sum())} but there are {arr.size} tokens")
        if modes is not None and len(modes) != lens.size:
            raise ValueError(f"{len(modes)} modes for {lens.size} sequences")
        self._data.write(arr.tobytes())
        self.sequence_lengths.extend(lens.tolist())
        self.document_indices.append(len(self.sequence_lengths))
        if self.sequence_modes is not None:
            # Megatron's default here is a bug ([0] * list); zero per sequence is its intent.
            self.sequence_modes.extend([int(m) for m in modes] if modes is not None
                                       else [0] * lens.size)

    def add_documents(self, tokens, sequence_lengths: Sequence[int],
                      document_sizes: Sequence[int]) -> None:
        """Append many documents at once (what add_document does, one call per batch):
        `tokens` concatenated, split into sequences by `sequence_lengths`, the
        sequences grouped into documents by `document_sizes` (sequences per document,
        0 for an empty document)."""
        arr = _as_tokens(tokens, self.dtype)
        lens = np.asarray(sequence_lengths, dtype=np.int64).reshape(-1)
        sizes = np.asarray(document_sizes, dtype=np.int64).reshape(-1)
        _check_lengths(lens)
        if int(lens.sum()) != arr.size:
            raise ValueError(f"lengths add up to {int(lens.sum())} but there are {arr.size} tokens")
        if sizes.size and (sizes.min() < 0 or int(sizes.sum()) != lens.size):
            raise ValueError(f"document sizes must be >= 0 and add up to {lens.size} sequences")
        self._data.write(arr.tobytes())
        ends = len(self.sequence_lengths) + np.cumsum(sizes)
        self.sequence_lengths.frombytes(lens.astype(np.int64).tobytes())
        self.document_indices.frombytes(ends.astype(np.int64).tobytes())
        if self.sequence_modes is not None:
            self.sequence_modes.frombytes(np.zeros(lens.size, np.int64).tobytes())

    def finalize(self, idx_path: str) -> None:
        """Close the .bin and write the .idx."""
        self.close()
        try:
            if self.document_indices[-1] != len(self.sequence_lengths):
                raise ValueError("sequences were added after the last end_document(); "
                                 "call end_document() before finalize()")
            modes = None
            if self.sequence_modes is not None:
                modes = self.sequence_modes.slices
                for part in modes():
                    if part.size and (part.min() < -128 or part.max() > 127):
                        raise ValueError("sequence modes must fit int8")
            _write_index_slices(idx_path, self.dtype, len(self.sequence_lengths), len(self.document_indices),
                                self.sequence_lengths.slices, self.document_indices.slices, modes)
        finally:
            self._release()


# megatron-core's name for the same thing.
IndexedDatasetBuilder = IndexedDatasetWriter


def write_index(idx_path: str, dtype, sequence_lengths: np.ndarray,
                document_indices: np.ndarray, sequence_modes: np.ndarray | None = None) -> None:
    """Write an MMIDIDX index; pointers follow from the lengths (tokens back to back)."""
    lengths = np.asarray(sequence_lengths, dtype=np.int64).reshape(-1)
    docs = np.asarray(document_indices, dtype=np.int64).reshape(-1)
    modes = None if sequence_modes is None else (lambda: iter([np.asarray(sequence_modes)]))
    _write_index_slices(idx_path, dtype, lengths.size, docs.size, lambda: iter([lengths]), lambda: iter([docs]),
                        modes)


def _write_index_slices(idx_path: str, dtype, num_sequences: int, num_documents: int,
                        lengths: Callable[[], Iterator[np.ndarray]], docs: Callable[[], Iterator[np.ndarray]],
                        modes: Callable[[], Iterator[np.ndarray]] | None) -> None:
    """write_index over arrays given in slices (each callable starts them anew), so
    that converting them costs memory for one slice at a time."""
    dtype = np.dtype(dtype)
    for part in lengths():
        _check_lengths(part)
    with open(idx_path, "wb") as f:
        f.write(HEADER.pack(MAGIC, VERSION, DTYPE_TO_CODE[dtype], num_sequences, num_documents))
        for part in lengths():
            f.write(part.astype("<i4").tobytes())
        offset = 0  # pointer of the next sequence: the bytes of all before it
        for part in lengths():
            sizes = part * dtype.itemsize
            ends = np.cumsum(sizes) + offset
            f.write((ends - sizes).astype("<i8").tobytes())
            offset = int(ends[-1]) if ends.size else offset
        for part in docs():
            f.write(part.astype("<i8").tobytes())
        if modes is not None:
            for part in modes():
                f.write(part.astype("<i1").tobytes())


# -- Modalities .pbin -------------------------------------------------------

PBIN_HEADER = struct.Struct("<QI")  # data-section length, token size in bytes


def write_packed(path: str, documents: Iterable, token_size: int = 2) -> None:
    """Write a Modalities packed file (.pbin): header, tokens of every document back to
    back, then the pickled list of (byte offset, byte length) per document, offsets
    counted from the start of the data section."""
    dtype = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}.get(token_size)
    if dtype is None:
        raise ValueError(f"token size {token_size} is not 1, 2 or 4")
    index: list[tuple[int, int]] = []
    offset = 0
    with open(path, "wb") as f:
        f.write(PBIN_HEADER.pack(0, token_size))  # length patched below
        for doc in documents:
            data = _as_tokens(doc, dtype).tobytes()
            f.write(data)
            index.append((offset, len(data)))
            offset += len(data)
        f.write(pickle.dumps(index))
        f.seek(0)
        f.write(struct.pack("<Q", offset))

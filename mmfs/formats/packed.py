"""Reader of Modalities' packed data file (.pbin), one sequence per document.

Layout (little-endian):
    u64     data-section length in bytes (D)
    u32     token size in bytes: 1, 2 or 4 (uint8, uint16, uint32)
    D bytes the tokens of every document
    rest    pickle of a list of (byte offset, byte length) per document, offsets
            counted from the start of the data section (byte 12)

The index is a pickle, and pickle can run code. It is read by an Unpickler that
refuses every class or function lookup, so only lists, tuples and numbers come
out of it; the result is checked entry by entry before use. Opening costs O(N)
(the whole index is parsed and checked), unlike an MMIDIDX .idx.
"""

from __future__ import annotations

import io
import os
import pickle
import reprlib
import struct

import numpy as np

from ..errors import FormatError
from .base import SequenceDataset
from .dtypes import native_code

HEADER = struct.Struct("<QI")  # data-section length, token size
HEADER_SIZE = HEADER.size  # 12
TOKEN_DTYPES = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32)}
_INT32_MAX = 2**31 - 1


class _DataOnlyUnpickler(pickle.Unpickler):
    """Builds containers and numbers only: any class or function is refused, so a
    hostile file cannot make unpickling run code."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refused to load {module}.{name}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused a persistent id")


class PackedDataset(SequenceDataset):
    """A memory-mapped Modalities .pbin with the same attributes as IndexedDataset.

    Every document is one sequence; sequence_pointers are absolute byte offsets
    into `data` (the whole file), i.e. 12 + the offset stored in the file.
    """

    format_name = "modalities-packed"

    def __init__(self, path: str | os.PathLike) -> None:
        path = os.fspath(path)
        self.path_prefix = self.idx_path = self.bin_path = path
        if not os.path.isfile(path):
            raise FormatError(f"{path}: file not found (expected a Modalities .pbin file)")
        try:
            self._open()
        except OSError as exc:
            raise FormatError(f"{path}: cannot read ({exc.strerror or exc}); "
                              "check the file's permissions") from None

    def _fail(self, what: str) -> FormatError:
        return FormatError(f"{self.bin_path}: {what}")

    def _open(self) -> None:
        size = os.path.getsize(self.bin_path)
        self.bin_size = size
        if size < HEADER_SIZE:
            raise self._fail(f"{size} bytes is shorter than the {HEADER_SIZE}-byte .pbin "
                             "header; the file is truncated or not a Modalities packed file")
        with open(self.bin_path, "rb") as f:
            data_len, token_size = HEADER.unpack(f.read(HEADER_SIZE))
            if token_size not in TOKEN_DTYPES:
                raise self._fail(f"token size {token_size} at byte 8 is not 1, 2 or 4; the file "
                                 "is corrupt or not a Modalities packed file")
            end = HEADER_SIZE + data_len
            if end > size:
                raise self._fail(f"data-section length {data_len} at byte 0 reaches byte {end}, "
                                 f"past the end of the {size}-byte file; the file is truncated")
            f.seek(end)
            raw_index = f.read()
        self.data_len = data_len
        self.data_section = (HEADER_SIZE, end)
        self.dtype = TOKEN_DTYPES[token_size]
        self.dtype_code = native_code(self.dtype)
        offsets, lengths = self._parse_index(raw_index, end, token_size)
        n = offsets.size
        self.num_sequences = self.num_documents = n
        self.multimodal = False
        self.sequence_modes = None
        self.sequence_lengths = (lengths // token_size).astype(np.int32)
        self.sequence_pointers = offsets + HEADER_SIZE
        self.document_indices = np.arange(n + 1, dtype=np.int64)
        self.data = (np.memmap(self.bin_path, dtype=np.uint8, mode="r") if size
                     else np.zeros(0, np.uint8))

    def _parse_index(self, raw: bytes, at: int, token_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, byte lengths) as int64 arrays, every entry checked."""
        where = f"the index (pickle at byte {at})"
        if not raw:
            raise self._fail(f"no index after the data section (byte {at}); the file is "
                             "truncated")
        try:
            obj = _DataOnlyUnpickler(io.BytesIO(raw)).load()
        except Exception as exc:  # noqa: BLE001 - whatever a bad pickle raises is a FormatError
            raise self._fail(f"{where} cannot be read ({type(exc).__name__}: {exc}); the file "
                             "is corrupt or truncated") from None
        if not isinstance(obj, (list, tuple)):
            raise self._fail(f"{where} is a {type(obj).__name__}, expected a list of "
                             "(offset, length) pairs")
        if not obj:
            empty = np.zeros(0, np.int64)
            return empty, empty
        # Entries are checked in Python before numpy sees them: numpy's shape discovery
        # never returns on a self-referencing list, which a hostile pickle can build.
        if not all(map(_is_int_pair, obj)):
            bad = next(i for i, e in enumerate(obj) if not _is_int_pair(e))
            raise self._fail(f"{where}: entry {bad} is {reprlib.repr(obj[bad])}; expected "
                             "(offset, length) pairs of 64-bit integers")
        table = np.array(obj, dtype=np.int64)
        offsets, lengths = table[:, 0].copy(), table[:, 1].copy()
        data_len = self.data_len
        checks = [
            (offsets < 0, "has a negative offset"),
            (lengths < 0, "has a negative length"),
            (lengths % token_size != 0, f"has a length not a multiple of {token_size} bytes"),
            (lengths // token_size > _INT32_MAX, "is longer than 2**31 - 1 tokens"),
            (offsets > data_len - lengths, f"ends past the {data_len}-byte data section"),
        ]
        for bad, what in checks:
            if bad.any():
                i = int(np.argmax(bad))
                raise self._fail(f"{where}: entry {i} (offset {int(offsets[i])}, length "
                                 f"{int(lengths[i])}) {what}; the file is corrupt")
        return offsets, lengths


def _is_int_pair(entry) -> bool:
    return (isinstance(entry, (tuple, list)) and len(entry) == 2
            and all(type(v) is int and -(2**63) <= v < 2**63 for v in entry))

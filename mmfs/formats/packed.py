"""Reader of Modalities' packed data file (.pbin), one sequence per document.

Layout (little-endian):
    u64     data-section length in bytes (D)
    u32     token size in bytes: 1, 2 or 4 (uint8, uint16, uint32)
    D bytes the tokens of every document
    rest    pickle of a list of (byte offset, byte length) per document, offsets
            counted from the start of the data section (byte 12)

The index is a pickle, and pickle can run code. A streaming reader in C that
knows only the opcodes of a list of integer pairs writes it straight into
int64/int32 arrays, checking each entry (no Python object per document); a
pickle it does not know goes to an Unpickler that refuses every class or
function lookup, so only lists, tuples and numbers come out of it. The parsed
index of a large file is kept in <prefix>/cache/PackedDataset_index/, named by
the file's size and mtime, so a later open maps it in O(1); the index of a .pbin
in object storage is kept in the storage cache folder, named by URL and ETag.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import reprlib
import struct
from functools import cached_property

import numpy as np

from mmfs.errors import FormatError
from mmfs.formats.base import ArraySpec, SequenceDataset
from mmfs.formats.dtypes import native_code
from mmfs.native import ffi, lib
from mmfs.storage import StorageError, copy_path, open_source
from mmfs.storage.file import FileSource
from mmfs.storage.localfiles import map_npy
from mmfs.storage.memory import MemorySource

HEADER = struct.Struct("<QI")  # data-section length, token size
HEADER_SIZE = HEADER.size  # 12
TOKEN_DTYPES = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32)}
_INT32_MAX = 2**31 - 1
CACHE_FROM = 100_000  # documents: a smaller index parses faster than a cache file opens
_PROBLEMS = {
    1: "has a negative offset",
    2: "has a negative length",
    3: "has a length not a multiple of {t} bytes",
    4: "is longer than 2**31 - 1 tokens",
    5: "ends past the {d}-byte data section",
}
log = logging.getLogger(__name__)


def recognise(head: bytes, size: int) -> bool:
    """A .pbin: a token size of 1, 2 or 4 bytes and a data section that ends inside
    the file (the index follows it)."""
    if len(head) < HEADER_SIZE:
        return False
    data_len, token_size = HEADER.unpack_from(head)
    return token_size in TOKEN_DTYPES and HEADER_SIZE + data_len < size


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
    documents_are_sequences = True

    def __init__(self, path: str | os.PathLike) -> None:
        path = os.fspath(path)
        self.path_prefix = self.idx_path = self.bin_path = path
        try:
            self.source = open_source(path)
        except StorageError as exc:
            raise FormatError(f"{exc} (expected a Modalities .pbin file)") from None
        try:
            with self.source.opened():
                self._open()
        except OSError as exc:
            raise FormatError(f"{path}: cannot read ({exc.strerror or exc}); "
                              "check the file's permissions") from None

    def _fail(self, what: str) -> FormatError:
        return FormatError(f"{self.bin_path}: {what}")

    def _open(self) -> None:
        size = self.bin_size = self.source.size
        if size < HEADER_SIZE:
            raise self._fail(f"{size} bytes is shorter than the {HEADER_SIZE}-byte .pbin "
                             "header; the file is truncated or not a Modalities packed file")
        head = bytearray(HEADER_SIZE)
        self.source.read_into(0, head)
        data_len, token_size = HEADER.unpack(head)
        if token_size not in TOKEN_DTYPES:
            raise self._fail(f"token size {token_size} at byte 8 is not 1, 2 or 4; the file "
                             "is corrupt or not a Modalities packed file")
        end = HEADER_SIZE + data_len
        if end > size:
            raise self._fail(f"data-section length {data_len} at byte 0 reaches byte {end}, "
                             f"past the end of the {size}-byte file; the file is truncated")
        if end == size:
            raise self._fail(f"no index after the data section (byte {end}); the file is "
                             "truncated")
        self.data_len = data_len
        self.data_section = (HEADER_SIZE, end)
        self.dtype = TOKEN_DTYPES[token_size]
        self.dtype_code = native_code(self.dtype)
        cacheable = not isinstance(self.source, MemorySource)
        cached = self._load_cached_index() if cacheable else None
        if cached is None:
            pointers, lengths = self._read_index(end, token_size)
            if cacheable:
                self._save_cached_index(pointers, lengths)
        else:
            pointers, lengths = cached
        n = lengths.size
        self.num_sequences = self.num_documents = n
        self.multimodal = False
        self.sequence_modes = None
        self.sequence_lengths = lengths
        self.sequence_pointers = pointers
        # The index is parsed into memory (or mapped from its cache): arrays in memory.
        self.arrays = {
            "tokens": ArraySpec(self.source, 0, np.dtype(np.uint8), size),
            "sequence_lengths": ArraySpec(MemorySource(f"{path_of(self)}#lengths", lengths),
                                          0, lengths.dtype, n),
            "sequence_pointers": ArraySpec(MemorySource(f"{path_of(self)}#pointers", pointers),
                                           0, pointers.dtype, n),
        }

    @cached_property
    def document_indices(self) -> np.ndarray:
        return np.arange(self.num_sequences + 1, dtype=np.int64)

    # -- the index, parsed once and kept in a cache folder ----------------------------

    @property
    def index_cache_dir(self) -> str:
        """Beside the file, as Megatron's default index cache: <prefix>/cache/..."""
        return os.path.join(self.bin_path[: -len(".pbin")] if self.bin_path.endswith(".pbin")
                            else self.bin_path, "cache", "PackedDataset_index")

    @property
    def _remote(self) -> bool:
        return not isinstance(self.source, FileSource)

    def _cache_paths(self) -> tuple[str, str]:
        if self._remote:  # fetching it is what the cache saves: keyed by URL and ETag
            base = copy_path(self.source.url, self.source.identity)
        else:
            size, mtime_ns, _ = self.source.identity
            base = os.path.join(self.index_cache_dir, f"{os.path.basename(self.bin_path)}-"
                                                      f"{size}-{mtime_ns}")
        return base + "-pointers.npy", base + "-lengths.npy"

    def _load_cached_index(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The parsed index if a cache file for this size and mtime is sound; O(1)."""
        arrays = []
        for path, dtype in zip(self._cache_paths(), ("int64", "int32")):
            try:
                arrays.append(map_npy(path))
            except (OSError, ValueError):
                return None
            if arrays[-1].dtype != np.dtype(dtype) or arrays[-1].ndim != 1:
                return None
        pointers, lengths = arrays
        if pointers.shape != lengths.shape:
            return None
        return pointers, lengths

    def _save_cached_index(self, pointers: np.ndarray, lengths: np.ndarray) -> None:
        """Best effort: a folder that cannot take it only costs the next open a parse."""
        if pointers.size < CACHE_FROM and not self._remote:
            return
        folder = os.path.dirname(self._cache_paths()[0])
        try:
            os.makedirs(folder, exist_ok=True)
            stem = os.path.basename(self.bin_path) + "-"
            for name in os.listdir(folder) if not self._remote else ():  # an older version's index
                if name.startswith(stem) and name.endswith(".npy"):
                    os.unlink(os.path.join(folder, name))
            for path, array in zip(self._cache_paths(), (pointers, lengths)):
                tmp = f"{path}.tmp-{os.getpid()}"
                with open(tmp, "wb") as out:
                    np.save(out, array)
                os.replace(tmp, path)
        except OSError as exc:
            log.debug("%s: index not cached in %s (%s)", self.bin_path, folder, exc)

    def _read_index(self, at: int, token_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(sequence pointers int64, lengths in tokens int32), every entry checked:
        by the streaming reader in C (a local file), or the Unpickler."""
        if isinstance(self.source, FileSource):
            with open(self.source.path, "rb") as f:
                parsed = self._parse_file_index(f.fileno(), at, token_size)
            if parsed is not None:
                return parsed
        raw = bytearray(self.bin_size - at)
        self.source.read_into(at, raw)
        offsets, byte_lengths = self._parse_index(bytes(raw), at, token_size)
        return offsets + HEADER_SIZE, (byte_lengths // token_size).astype(np.int32)

    def _parse_file_index(self, fd: int, at: int, token_size: int):
        """The C streaming reader's (pointers, lengths), or None for a pickle it does
        not know."""
        end = self.bin_size
        count, problem = ffi.new("int64_t *"), ffi.new("int32_t *")
        bad = ffi.new("int64_t[2]")
        # One pass into arrays sized for the most pairs the pickle can hold (5 bytes
        # each); pages past the last pair are never touched, so never resident.
        capacity = (end - at) // 5 + 1
        offsets = np.empty(capacity, np.int64)
        lengths = np.empty(capacity, np.int32)
        rc = lib.mmfs_parse_pickle_pairs(
            fd, at, end, self.data_len, token_size,
            ffi.cast("int64_t *", offsets.ctypes.data), ffi.cast("int32_t *", lengths.ctypes.data),
            capacity, count, problem, bad)
        if rc == lib.MMFS_E_INDEX_RANGE:
            raise self._fail(f"the index (pickle at byte {at}): entry {int(count[0])} (offset "
                             f"{int(bad[0])}, length {int(bad[1])}) "
                             f"{_PROBLEMS[problem[0]].format(t=token_size, d=self.data_len)}; "
                             "the file is corrupt")
        if rc == lib.MMFS_OK:
            n = int(count[0])
            offsets, lengths = offsets[:n], lengths[:n]
            offsets += HEADER_SIZE
            return offsets, lengths
        if rc == lib.MMFS_E_IO:
            raise OSError(f"{self.bin_path}: read failed")
        return None

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


def path_of(ds: PackedDataset) -> str:
    return ds.bin_path


def _is_int_pair(entry) -> bool:
    return (isinstance(entry, (tuple, list)) and len(entry) == 2
            and all(type(v) is int and -(2**63) <= v < 2**63 for v in entry))

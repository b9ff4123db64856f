"""The C core's view of numpy arrays (`mmfs_array`): in memory, or read with pread.

Index and token files are memory-mapped. Every page a read touches through a
map stays in the process's page tables and counts in its resident memory, so a
long-running reader of random samples (the mount daemon) would grow to the size
of everything it ever touched: gigabytes for a config of 100M samples. A map
also kills its reader with SIGBUS when the file shrinks under it. So for the
daemon, `ArrayPlacer` copies the smallest file-backed arrays into its own
memory, up to a limit in total, and has the C core read the rest with pread(2)
from the file: the same bytes, served from the page cache, never mapped; a
file that shrinks then gives a short read, which the C core reports as an
error naming the file, never a crash. The files read with pread are opened on
first use and closed when idle (the C core's open-files table,
storage/localfiles.py), so ten thousand datasets cost a few hundred
descriptors, not eighty thousand; each is checked to be the file the indices
were made from whenever it is opened again.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from mmfs.errors import FormatError, MmfsError
from mmfs.formats.dtypes import native_code
from mmfs.megatron.cache.npyfile import HEAD, CachedArray
from mmfs.native import ffi, lib, note_fetch_failure
from mmfs.storage import localfiles
from mmfs.storage.file import FileSource
from mmfs.storage.memory import MemorySource


class FetchedArray(NamedTuple):
    """An array of a source that is neither in memory nor a local file: the C core
    reads it through the source's fetcher (the fetched kind of mmfs_array)."""

    source: Any
    offset: int
    dtype: np.dtype
    count: int

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize


_noting = threading.local()


@contextmanager
def noted_fetches() -> Iterator[list[tuple[Any, int, int]]]:
    """Inside the block, this thread's C reads of fetched sources fetch nothing:
    they note (source, offset, length) in the list it yields, and the bytes they
    return are garbage. A caller learns what a read needs, fetches it all at once,
    then reads for real."""
    noted: list[tuple[Any, int, int]] = []
    _noting.wanted = noted
    try:
        yield noted
    finally:
        _noting.wanted = None


def _fetch(ctx, pos: int, n: int, to) -> int:
    """mmfs_fetch_fn: bytes of the source behind ctx, for the C core."""
    source = ffi.from_handle(ctx)
    wanted = getattr(_noting, "wanted", None)
    if wanted is not None:
        wanted.append((source, pos, n))
        return n
    try:
        return source.read_into(pos, ffi.buffer(to, n))
    except (MmfsError, OSError) as exc:  # said once, in the failed read's line (error_detail)
        note_fetch_failure(pos, str(exc))
        return lib.MMFS_E_IO


# One C entry point for every fetched source (the source is its ctx); an exception it
# does not expect is EIO for the READ that asked, never a crash.
_FETCH = ffi.callback("mmfs_fetch_fn", _fetch, error=lib.MMFS_E_IO)


def file_region(array: np.ndarray) -> tuple[str, int] | None:
    """(file name, byte offset) of the bytes of a C-contiguous array that views a
    file map (localfiles.FileMap, or a np.memmap) through any chain of views, or
    None for an array in memory."""
    region = localfiles.mapped_region(array)
    if region is not None or not array.flags.c_contiguous or array.size == 0:
        return region
    node: Any = array
    for _ in range(64):
        if isinstance(node, np.memmap) and isinstance(getattr(node, "_mmap", None), mmap.mmap):
            m = node._mmap
            # np.memmap maps from `offset` rounded down to the allocation granularity.
            map_start = node.offset - node.offset % mmap.ALLOCATIONGRANULARITY
            map_address = np.frombuffer(m, dtype=np.uint8).ctypes.data
            if not node.filename:
                return None
            return str(node.filename), map_start + (array.ctypes.data - map_address)
        node = getattr(node, "base", None)
        if not isinstance(node, np.ndarray):
            return None
    return None


def native_array(array: np.ndarray) -> np.ndarray:
    """The array C-contiguous in native byte order (a copy only when it is not)."""
    array = np.asarray(array)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return np.ascontiguousarray(array)


_fetched = itertools.count(1)  # one per fetched source a placer places: keys the C block cache


class ArrayPlacer:
    """Fills `mmfs_array` structs and decides where each array is read from.

    `place(c, array)` points c at the array (its map) at once; `finish()` then
    switches the largest file-backed arrays to pread until the others fit in
    `map_limit` bytes (None: everything stays mapped), and copies those of the
    others still in their cache files; `load()` replaces the maps of the rest by
    copies in memory."""

    def __init__(self, map_limit: int | None = None) -> None:
        self.map_limit = map_limit
        self._placed: list[tuple[Any, np.ndarray, tuple[str, int] | None]] = []
        self._files: dict[str, int] = {}  # path -> its id in the open-files table
        self._within: list[tuple[tuple[str, int], np.ndarray]] = []  # kept within the limit
        self._by_region: dict[tuple[str, int], list[Any]] = {}  # structs placed on each file region
        self._copies: list[np.ndarray] = []  # what load() made
        self._handles: dict[int, tuple[Any, int]] = {}  # id(source) -> (ctx handle, file)
        self.mapped_bytes = 0  # file-backed, mapped (or copied by load())
        self.pread_bytes = 0   # file-backed, read with pread
        self.memory_bytes = 0  # not file-backed: held in the process's memory
        self.fetched_bytes = 0  # read through a source's fetcher

    @staticmethod
    def source_array(source: Any, offset: int, dtype: np.dtype, count: int) -> Any:
        """`count` elements of `dtype` at byte `offset` of a source, as place() takes
        them: a region of a local file (unmapped), memory, or a fetched array."""
        dtype = np.dtype(dtype)
        if isinstance(source, FileSource):
            return CachedArray(source.path, dtype, (count,), offset, file=source.file_identity)
        if isinstance(source, MemorySource):
            raw = source.map()[offset : offset + count * dtype.itemsize]
            return raw.view(dtype)
        return FetchedArray(source, offset, dtype, count)

    def _place_fetched(self, c: Any, array: FetchedArray) -> FetchedArray:
        handle, file = self._handles.get(id(array.source), (None, 0))
        if handle is None:
            handle, file = ffi.new_handle(array.source), next(_fetched)
            self._handles[id(array.source)] = (handle, file)
        c.dtype = native_code(array.dtype)
        c.count = array.count
        c.data, c.file, c.offset = ffi.NULL, file, array.offset
        c.fetch, c.fetch_ctx = _FETCH, handle
        self.fetched_bytes += array.nbytes
        return array

    def place(self, c: Any, array: Any) -> Any:
        """Describe `array` (made native and contiguous) in the struct c; returns
        the array the struct points into (the caller keeps it alive).

        An array still in its cache file (a CachedArray, not mapped) stays unmapped
        under a map limit: finish() decides whether load() copies it or the C
        core preads it. Without a limit it is mapped here."""
        if isinstance(array, FetchedArray):
            return self._place_fetched(c, array)
        c.file = 0
        c.offset = 0
        if isinstance(array, CachedArray):
            if self.map_limit is not None and array.dtype.isnative and array.size:
                c.dtype = native_code(array.dtype)
                c.count = array.size
                c.data = ffi.NULL  # until load(), or for pread
                self._placed.append((c, array, (array.path, array.offset)))
                return array
            array = array.map()
        array = native_array(array)
        c.dtype = native_code(array.dtype)
        c.count = array.size
        c.data = ffi.cast("const uint8_t *", array.ctypes.data) if array.size else ffi.NULL
        region = file_region(array)
        if region is None:
            self.memory_bytes += array.nbytes
        self._placed.append((c, array, region))
        return array

    def _file(self, path: str, array: Any) -> int:
        """The open-files id of `path` (registered on first use, with the identity
        the array was made from when it is known)."""
        file = self._files.get(path)
        if file is None:
            identity = array.file if isinstance(array, CachedArray) else None
            file = self._files[path] = localfiles.register(path, identity)
        return file

    def finish(self) -> None:
        """Apply the map limit (once every array is placed)."""
        # Each file region once (the same bytes may be placed twice).
        placed = self._placed
        by_region: dict[tuple[str, int], list[Any]] = {}
        firsts: list[int] = []  # the placing of each region's first struct
        for i, (c, _, region) in enumerate(placed):
            if region:
                structs = by_region.get(region)
                if structs is None:
                    by_region[region] = [c]
                    firsts.append(i)
                else:
                    structs.append(c)
        self._by_region = by_region
        nbytes = np.array([placed[i][1].nbytes for i in firsts], dtype=np.int64)
        if self.map_limit is None:
            self.mapped_bytes += int(nbytes.sum())
            return
        # Smallest first (ties in placing order): the shortest that fit in the limit
        # together stay (mapped or copied), in bulk rather than array by array.
        order = np.argsort(nbytes, kind="stable")
        kept = int(np.searchsorted(np.cumsum(nbytes[order]), self.map_limit - self.mapped_bytes, side="right"))
        self.mapped_bytes += int(nbytes[order[:kept]].sum())
        self.pread_bytes += int(nbytes[order[kept:]].sum())
        copied: list[tuple[tuple[str, int], CachedArray]] = []
        for i in order[:kept].tolist():
            _, array, region = placed[firsts[i]]
            if isinstance(array, CachedArray):
                copied.append((region, array))
            else:
                self._within.append((region, array))  # mapped until load() copies it
        unchecked: list[tuple[int, CachedArray]] = []  # known from a header file or record
        for i in order[kept:].tolist():
            _, array, region = placed[firsts[i]]
            path, offset = region
            file = self._file(path, array)
            if isinstance(array, CachedArray) and array.known_from is not None:
                unchecked.append((file, array))
            for c in by_region[region]:
                c.data, c.file, c.offset = ffi.NULL, file, offset
        self._copy(copied)
        _check_heads(unchecked)

    def _copy(self, arrays: list[tuple[tuple[str, int], CachedArray]]) -> None:
        """Copy the unmapped arrays kept within the limit into one block of memory, each
        file read once, in one C call (tens of thousands of small index files), and
        checked as it is read: the file the array was made from, and the header the
        header file or record it is known from says (HeaderFileLied when not). A copy
        never faults however its file changes later; a daemon forked after inherits it."""
        if not arrays:
            return
        at = np.zeros(len(arrays) + 1, dtype=np.int64)
        # each copy starts 64-byte aligned: any dtype may view it
        np.cumsum([-(-a.nbytes // 64) * 64 for _, a in arrays], out=at[1:])
        block = np.empty(int(at[-1]), dtype=np.uint8)
        paths = b"".join(path.encode("utf-8", "surrogateescape") + b"\0" for (path, _), _ in arrays)
        identity = np.array([a.file if a.file is not None else (-1, -1, -1) for _, a in arrays],
                            dtype=np.int64).reshape(-1, 3)
        offsets = np.array([offset for (_, offset), _ in arrays], dtype=np.int64)
        lengths = np.array([a.nbytes for _, a in arrays], dtype=np.int64)
        heads = np.empty((len(arrays), HEADS), dtype=np.uint8)
        got = np.empty(len(arrays), dtype=np.int32)
        lib.mmfs_files_copy(paths, len(arrays), ffi.from_buffer("int64_t[]", identity), HEADS,
                            ffi.from_buffer("uint8_t[]", heads), ffi.from_buffer("int32_t[]", got),
                            ffi.from_buffer("int64_t[]", offsets), ffi.from_buffer("int64_t[]", lengths),
                            ffi.from_buffer("uint8_t[]", block), ffi.from_buffer("int64_t[]", at))
        raw, start = heads.tobytes(), block.ctypes.data
        for k, (region, array) in enumerate(arrays):
            n = int(got[k])
            if n < 0:
                why = "changed since it was read" if n == lib.MMFS_E_CHANGED else "cannot be read"
                if array.known_from is not None:
                    raise array.lied(f"{array.path}: {why}")
                raise FormatError(f"{array.path}: {why}; run the command again")
            if array.known_from is not None:
                if n == HEADS and array.offset > HEADS:  # a long header: read on its own
                    array.vouched()
                else:
                    array.check_head(raw[k * HEADS : k * HEADS + n])
            address = ffi.cast("const uint8_t *", start + int(at[k]))
            for c in self._by_region[region]:
                c.data, c.file, c.offset = address, 0, 0
        self._copies.append(block)

    def load(self) -> None:
        """Replace the maps of the arrays kept within the limit (arrays already
        mapped when placed; those still in their cache files were copied by
        finish()) by copies read from their files, in this process's memory. Call
        it in the process that serves reads (the daemon, after the fork): a copy
        never faults, however its file changes later."""
        for region, array in self._within:
            path, offset = region
            copy = np.fromfile(path, dtype=array.dtype, count=array.size, offset=offset)
            if copy.size != array.size:
                raise FormatError(f"{path}: shorter than when it was opened (it changed); "
                                  "run the command again")
            address = ffi.cast("const uint8_t *", copy.ctypes.data)
            for c in self._by_region[region]:
                c.data = address
            self._copies.append(copy)
        self._within = []
        self._by_region = {}  # (what load needed; the structs point at the copies now)

    def files(self) -> list[str]:
        """Every file an array placed here comes from."""
        return sorted({region[0] for _, _, region in self._placed if region})

    def close(self) -> None:
        files, self._files = self._files, {}
        for file in files.values():
            localfiles.forget(file)

    def __del__(self) -> None:
        self.close()


def _why(exc: OSError) -> str:
    return exc.strerror if exc.strerror and exc.filename else str(exc).split(": ", 1)[-1]


HEADS = 512  # bytes read first of each file: a numpy header is 128 bytes, rarely more


def _check_heads(arrays: list[tuple[int, CachedArray]]) -> None:
    """Check each array's file against what the header file or record it is known
    from says, reading the first bytes of all of them in one C call (thousands of
    files); HeaderFileLied for the first that disagrees or cannot be read."""
    if not arrays:
        return
    ids = np.array([file for file, _ in arrays], dtype=np.int64)
    heads = np.empty((len(arrays), HEADS), dtype=np.uint8)
    got = np.empty(len(arrays), dtype=np.int32)
    lib.mmfs_files_heads(ffi.from_buffer("int64_t[]", ids), len(arrays), HEADS,
                         ffi.from_buffer("uint8_t[]", heads), ffi.from_buffer("int32_t[]", got))
    raw = heads.tobytes()
    for k, (file, array) in enumerate(arrays):
        n = int(got[k])
        if n < 0 or (n == HEADS and array.offset > HEADS):  # not read, or a long header: file by file
            array.check_head(_head(file, array))
        else:
            array.check_head(raw[k * HEADS : k * HEADS + n])


def _head(file: int, array: CachedArray) -> bytes:
    """The first page of a registered file, known from a header file or record; when
    it is gone or changed, that header file or record lied (HeaderFileLied)."""
    try:
        with localfiles.descriptor(file) as fd:
            return os.pread(fd, HEAD, 0)
    except OSError as exc:
        raise array.lied(f"{array.path}: {_why(exc)}") from None

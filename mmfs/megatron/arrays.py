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
import math
import mmap
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from mmfs.errors import FormatError, MmfsError
from mmfs.formats.dtypes import native_code
from mmfs.megatron.cache.npyfile import CachedArray, FileId
from mmfs.megatron.placement import FileArrays
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


def _map_checked(path: str, identity: FileId) -> np.ndarray:
    """The whole file mapped, once it is checked to be the file `identity` names."""
    st = os.stat(path)
    if (st.st_size, st.st_mtime_ns, st.st_ino) != tuple(identity):
        raise FormatError(f"{path}: changed since the indices were read from it; run the command again")
    whole = localfiles.map_file(path)
    if len(whole) != identity[0]:
        raise FormatError(f"{path}: changed since the indices were read from it; run the command again")
    return whole


class ArrayPlacer:
    """Fills `mmfs_array` structs and decides where each array is read from.

    `place(c, array)` points c at the array (its map) at once; `finish()` then
    switches the largest file-backed arrays to pread until the others fit in
    `map_limit` bytes (None: everything stays mapped), and copies those of the
    others still in their cache files; `load()` replaces the maps of the rest by
    copies in memory. Under a limit, an array still in its file is placed as a
    row of facts (placement.py: `place_file`, `place_source`), no object each."""

    def __init__(self, map_limit: int | None = None) -> None:
        self.map_limit = map_limit
        self._rows = FileArrays()  # file-backed arrays under a limit
        self._mapped: dict[tuple[str, int], int] = {}  # without a limit: each file region mapped, its bytes
        self._whole: dict[str, np.ndarray] = {}  # without a limit: files mapped whole (a pack: cache/pack.py)
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

    def place_source(self, c: Any, source: Any, offset: int, dtype: np.dtype, count: int) -> Any:
        """place(c, source_array(...)), without an object for a local file's region."""
        if isinstance(source, FileSource) and self.map_limit is not None and dtype.isnative and count:
            self._rows.add(c, source.path, offset, dtype, (count,), count, source.file_identity)
            return None
        return self.place(c, self.source_array(source, offset, dtype, count))

    def place_file(self, c: Any, path: str, offset: int, dtype: np.dtype, shape: tuple[int, ...],
                   identity: FileId | None = None, known_from: str | None = None) -> Any:
        """place(c, CachedArray(...)) for an array still in its file (a cache file's, as
        a record gives it), without the object when it is placed under a limit."""
        count = shape[0] if len(shape) == 1 else math.prod(shape)
        if self.map_limit is not None and dtype.isnative and count:
            self._rows.add(c, path, offset, dtype, shape, count, identity, known_from)
            return None
        if known_from is None and identity is not None and count:  # a region of a pack: its one map
            whole = self._whole.get(path)
            if whole is None:
                whole = self._whole[path] = _map_checked(path, identity)
            return self.place(c, whole[offset : offset + count * dtype.itemsize].view(dtype).reshape(shape))
        return self.place(c, CachedArray(path, dtype, shape, offset, file=identity, known_from=known_from))

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
        under a map limit: finish() decides whether it is copied or the C core
        preads it. Without a limit it is mapped here."""
        if isinstance(array, FetchedArray):
            return self._place_fetched(c, array)
        c.file = 0
        c.offset = 0
        if isinstance(array, CachedArray):
            if self.map_limit is not None and array.dtype.isnative and array.size:
                c.dtype = native_code(array.dtype)
                c.count = array.size
                c.data = ffi.NULL  # until finish(), or load()
                self._rows.add(c, array.path, array.offset, array.dtype, array.shape, array.size,
                               array.file, array.known_from)
                return array
            array = array.map()
        array = native_array(array)
        c.dtype = native_code(array.dtype)
        c.count = array.size
        c.data = ffi.cast("const uint8_t *", array.ctypes.data) if array.size else ffi.NULL
        region = file_region(array)
        if region is None:
            self.memory_bytes += array.nbytes
        elif self.map_limit is None:
            self._mapped.setdefault(region, array.nbytes)
        else:
            self._rows.add(c, region[0], region[1], array.dtype, array.shape, array.size,
                           mapped=array.ctypes.data)
        return array

    def finish(self) -> None:
        """Apply the map limit (once every array is placed)."""
        if self.map_limit is None:
            self.mapped_bytes += sum(self._mapped.values())
            return
        kept, pread = self._rows.finish(self.map_limit - self.mapped_bytes)
        self.mapped_bytes += kept
        self.pread_bytes += pread

    def load(self) -> None:
        """Replace the maps of the arrays kept within the limit (arrays already
        mapped when placed; those still in their cache files were copied by
        finish()) by copies read from their files, in this process's memory. Call
        it in the process that serves reads (the daemon, after the fork): a copy
        never faults, however its file changes later."""
        for path, offset, dtype, count, structs in self._rows.within:
            copy = np.fromfile(path, dtype=dtype, count=count, offset=offset)
            if copy.size != count:
                raise FormatError(f"{path}: shorter than when it was opened (it changed); "
                                  "run the command again")
            address = ffi.cast("const uint8_t *", copy.ctypes.data)
            for c in structs:
                c.data, c.file, c.offset = address, 0, 0
            self._rows.copies.append(copy)
        self._rows.within = []

    def files(self) -> list[str]:
        """Every file an array placed here comes from."""
        return sorted({*self._rows.paths(), *(path for path, _ in self._mapped)})

    def close(self) -> None:
        files, self._rows.file_ids = self._rows.file_ids, []
        for file in files:
            localfiles.forget(file)

    def __del__(self) -> None:
        self.close()

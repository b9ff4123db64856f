"""Local files without a descriptor each: maps that keep none open, and the C
core's table of files it reads with pread, opened on first use and closed when
idle (native/mmfs_files.h). A blend of ten thousand datasets has eighty thousand
files; a process holds a few hundred descriptors whatever their number."""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from mmfs.errors import MmfsError
from mmfs.native import ffi, file_path, lib

log = logging.getLogger(__name__)

# Descriptors the table keeps open at most (idle ones are closed beyond it).
DEFAULT_OPEN_FILES = 256
# Descriptors a mount daemon uses besides the table's: /dev/fuse, its log, the
# standard streams, connections to a store, a lock or two.
RESERVE = 32


class FileMap:
    """A read-only map of a whole file that holds no descriptor (numpy's memmap
    keeps one open per map through Python's mmap). Unmapped when the last array
    viewing it is gone; `np.asarray(file_map)` is its bytes as uint8."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.size = os.fstat(fd).st_size
            address = lib.mmfs_map_file(fd, self.size) if self.size else ffi.NULL
            if self.size and address == ffi.NULL:
                raise OSError(ffi.errno, os.strerror(ffi.errno), path)
        finally:
            os.close(fd)
        self.path = path
        size = self.size
        self._address = ffi.gc(address, lambda p: lib.mmfs_unmap(p, size), size) if size else None
        data = int(ffi.cast("uintptr_t", address)) if size else 0
        self.__array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (data, True),
                                    "version": 3}

    def start(self) -> int:
        """The address of the file's byte 0."""
        return self.__array_interface__["data"][0]


def map_file(path: str) -> np.ndarray:
    """The whole file as a read-only uint8 array, mapped (an empty file: an empty array)."""
    m = FileMap(path)
    return np.asarray(m) if m.size else np.zeros(0, np.uint8)


def map_region(path: str, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """`shape` elements of `dtype` from byte `offset` of a file, mapped read-only."""
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.zeros(shape, dtype)
    whole = map_file(path)
    return whole[offset : offset + count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)


_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def map_npy(path: str) -> np.ndarray:
    """A plain .npy file's array, mapped read-only (np.load's mmap_mode keeps a
    descriptor per map); ValueError when it is not a plain C-order array."""
    with open(path, "rb") as f:
        read_header = _NPY_HEADERS.get(np.lib.format.read_magic(f))
        if read_header is None:
            raise ValueError(f"{path}: a .npy format version mmfs does not read")
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
    if fortran or dtype.hasobject:
        raise ValueError(f"{path}: not a plain C-order array")
    size = os.path.getsize(path)
    if size != offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise ValueError(f"{path}: {size} bytes, not what its header says")
    return map_region(path, offset, dtype, shape)


def mapped_region(array: np.ndarray) -> tuple[str, int] | None:
    """(path, byte offset) of the bytes of a C-contiguous array that views a FileMap
    (through any chain of views), or None."""
    if not array.flags.c_contiguous or array.size == 0:
        return None
    node = array
    for _ in range(64):
        node = getattr(node, "base", None)
        if isinstance(node, FileMap):
            return node.path, array.ctypes.data - node.start()
        if not isinstance(node, np.ndarray):
            return None
    return None


class Counts(NamedTuple):
    known: int  # files registered
    open: int  # descriptors open now
    limit: int  # the cap
    opened: int  # open(2) calls so far
    closed: int  # descriptors closed to stay under the cap
    changed: int  # opens refused: not the file registered


_U64 = (1 << 64) - 1


def identity_words(identity: tuple[int, int, int] | None) -> tuple[int, int, int, int]:
    """A file's identity as the C core holds it: (known, size, mtime_ns, inode), each
    an unsigned 64-bit word (mmfs_files.h). stat's inode numbers are unsigned and
    reach 2^63 and beyond on FUSE and network file systems (rclone's); a time before
    1970 is negative: kept as its two's complement, compared as such."""
    if identity is None:
        return (0, 0, 0, 0)
    size, mtime_ns, inode = identity
    return (1, size & _U64, mtime_ns & _U64, inode & _U64)


def register(path: str, identity: tuple[int, int, int] | None) -> int:
    """A file's id in the table (nothing is opened). identity: (size, mtime_ns,
    inode) as the indices were made from it; None: as first opened."""
    file = lib.mmfs_file_add(path.encode("utf-8", "surrogateescape"), identity_words(identity))
    if file < 0:
        raise MemoryError(f"{path}: no memory for the open-files table")
    return file


def forget(file: int) -> None:
    lib.mmfs_file_forget(file)


@contextmanager
def descriptor(file: int) -> Iterator[int]:
    """An open descriptor of a registered file, for reads inside the block; OSError
    when it cannot be opened or is not the file registered."""
    fd = lib.mmfs_file_acquire(file)
    if fd < 0:
        err = ffi.errno if fd == lib.MMFS_E_IO else 0
        path = file_path(file) or f"file {file}"
        if fd == lib.MMFS_E_CHANGED:
            raise OSError(f"{path}: changed since it was read (its size, modification time or inode "
                          "is not what it was)")
        raise OSError(err, os.strerror(err) if err else "cannot be opened", path)
    try:
        yield fd
    finally:
        lib.mmfs_file_release(file)


def set_limit(max_open: int) -> None:
    lib.mmfs_files_set_limit(max_open)


def counts() -> Counts:
    c = ffi.new("mmfs_files_counts *")
    lib.mmfs_files_counts_get(c)
    return Counts(c.known, c.open, c.limit, c.opened, c.closed, c.changed)


def limits() -> tuple[int, int]:
    """(soft, hard) limits on this process's open files (`ulimit -n`, `ulimit -Hn`)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def fit_open_files(others: int, wanted: int = DEFAULT_OPEN_FILES, what: str = "this mount") -> int:
    """Make room for the table's `wanted` descriptors beside `others` that stay
    open (RESERVE more): raise the soft limit toward the hard one when it is lower,
    saying so once, and lower the table's cap where even the hard limit is short.
    Returns the cap set; MmfsError, one line, when not even a small cap fits."""
    soft, hard = limits()
    room = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    needed = others + RESERVE + wanted
    if needed > soft and room > soft:
        raised = min(room, max(needed, 2 * soft))
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            log.info("raised the open-file limit (`ulimit -n`) from %d to %d: %s keeps up to %d files "
                     "open", soft, raised, what, needed)
            soft = raised
        except (OSError, ValueError) as exc:
            log.debug("open-file limit not raised: %s", exc)
    cap = min(wanted, soft - others - RESERVE)
    if cap < 8:
        held = f" ({others} of them for datasets in object storage)" if others else ""
        raise MmfsError(f"{what} needs about {needed} open files{held}, but `ulimit -n` allows {soft} "
                        f"(hard limit {hard}); raise it, e.g. `ulimit -n {needed}`, and run again")
    set_limit(cap)
    return cap


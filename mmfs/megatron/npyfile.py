"""Index-cache files as they lie on disk: a `.npy` file known from its header
(`CachedArray`, read with pread and mapped only when used), the checks that its
dtype and shape are what an index needs, and the identity (size, mtime, inode)
that says a file is unchanged."""

from __future__ import annotations

import ast
import errno
import functools
import logging
import math
import os
import re
import stat
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

_NPY_HEADER = re.compile(r"\{'descr': '([^']+)', 'fortran_order': (True|False), "
                         r"'shape': \(([0-9, ]*)\), \}")



# A file is taken as unchanged while its size, mtime and inode are.
FileId = tuple[int, int, int]


def file_id(st: os.stat_result) -> FileId:
    return (st.st_size, st.st_mtime_ns, st.st_ino)



@dataclass(frozen=True)
class CachedArray:
    """An array stored in a .npy file: known from its header, mapped on demand."""

    path: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int  # of the data in the file
    head: bytes = b""  # the file's first bytes, as read for the header
    file: FileId | None = None  # the file as read or written
    tail: bytes = b""  # its last bytes (a sample index's last row), read with the header

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def map(self) -> np.ndarray:
        if math.prod(self.shape) == 0:
            return np.zeros(self.shape, self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset,
                         shape=self.shape)

    def read_item(self, flat_index: int) -> int:
        """One element (C order) read with pread, without mapping the file."""
        size = self.dtype.itemsize
        at = self.offset + flat_index * size
        if at + size <= len(self.head):
            return int(np.frombuffer(self.head, dtype=self.dtype, count=1, offset=at)[0])
        tail_at = self.offset + self.nbytes - len(self.tail)
        if at >= tail_at and at + size <= tail_at + len(self.tail):
            return int(np.frombuffer(self.tail, dtype=self.dtype, count=1, offset=at - tail_at)[0])
        with open(self.path, "rb", buffering=0) as f:
            raw = os.pread(f.fileno(), size, self.offset + flat_index * size)
        if len(raw) != size:
            raise ValueError(f"{self.path}: truncated")
        return int(np.frombuffer(raw, dtype=self.dtype)[0])


NPY_MIN_HEADER = 10  # magic, version and header length: no array starts before
TAIL = 16  # bytes read from a .npy file's end with its header: a sample index's last row


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """An open descriptor of a cache file and its stat, never blocking: a FIFO or a
    device where a cache file belongs is an OSError (the index is a miss, rebuilt)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd, st


def read_npy_header(path: str) -> CachedArray:
    """dtype, shape and data offset of a .npy file from its first bytes; ValueError
    when it is not a whole, plain .npy file (truncated, pickled, Fortran order)."""
    fd, st = open_regular(path)
    try:
        head = os.pread(fd, 4096, 0)
        size = st.st_size
        tail = os.pread(fd, TAIL, size - TAIL) if size > len(head) else b""
    finally:
        os.close(fd)
    if head[:6] != b"\x93NUMPY" or len(head) < 10:
        raise ValueError("not a .npy file")
    if head[6] == 1:
        start, length = 10, int.from_bytes(head[8:10], "little")
    else:
        start, length = 12, int.from_bytes(head[8:12], "little")
    text = head[start : start + length].decode("latin1")
    if len(text) != length:
        raise ValueError("header truncated")
    m = _NPY_HEADER.match(text)
    if m:
        descr, fortran = m.group(1), m.group(2) == "True"
        shape = tuple(int(v) for v in m.group(3).replace(" ", "").split(",") if v)
    else:
        meta = ast.literal_eval(text)
        descr, fortran, shape = meta["descr"], meta["fortran_order"], tuple(meta["shape"])
    dtype = np.dtype(descr)
    if fortran or dtype.hasobject:
        raise ValueError("not a plain C-order array")
    offset = start + length
    if size != offset + math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{size} bytes, not the {offset + math.prod(shape) * dtype.itemsize} "
                         "its header says")
    return CachedArray(path, dtype, shape, offset, head, file_id(st),
                       tail if len(tail) == TAIL else b"")


def read_text(path: str, limit: int) -> tuple[str, FileId]:
    """At most `limit` bytes of a file, as text, and the file's FileId."""
    fd, st = open_regular(path)
    try:
        raw = os.read(fd, limit)
    finally:
        os.close(fd)
    return raw.decode("utf-8"), file_id(st)


@functools.lru_cache(maxsize=None)
def _native_dtypes(names: tuple[str, ...]) -> frozenset[np.dtype]:
    return frozenset(np.dtype(n) for n in names)


def arrays_fit_specs(arrays: dict[str, CachedArray], specs: dict) -> bool:
    """Each array has one of its allowed dtypes (in native byte order) and its
    number of dimensions. specs: name -> (allowed dtype names, ndim)."""
    for name, (dtypes, ndim) in specs.items():
        a = arrays[name]
        if a.dtype not in _native_dtypes(dtypes) or len(a.shape) != ndim:
            log.warning("%s: unexpected dtype %s / shape %s; rebuilding", a.path, a.dtype, a.shape)
            return False
    return True

"""Index-cache files as they lie on disk: a `.npy` file known from its header
(`CachedArray`, read with pread and mapped only when used), the checks that its
dtype and shape are what an index needs, and the identity (size, mtime, inode)
that says a file is unchanged."""

from __future__ import annotations

import ast
import dataclasses
import errno
import functools
import logging
import math
import operator
import os
import re
import stat
from dataclasses import dataclass, field

import numpy as np

from mmfs.errors import FormatError
from mmfs.storage.localfiles import map_region

log = logging.getLogger(__name__)

_NPY_HEADER = re.compile(r"\{'descr': '([^']+)', 'fortran_order': (True|False), "
                         r"'shape': \(([0-9, ]*)\), \}")



# A file is taken as unchanged while its size, mtime and inode are.
FileId = tuple[int, int, int]


def file_id(st: os.stat_result) -> FileId:
    return (st.st_size, st.st_mtime_ns, st.st_ino)



@dataclass(frozen=True, slots=True)  # slots: a blend of 10,000 datasets holds 60,000 of them
class CachedArray:
    """An array stored in a .npy file: known from its header, mapped on demand."""

    path: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int  # of the data in the file
    head: bytes = b""  # the file's first bytes, as read for the header
    file: FileId | None = None  # the file as read or written
    tail: bytes = b""  # its last bytes (a sample index's last row), read with the header
    # The header file this array is known from, its own header not read yet (None:
    # read). Such an array is checked against the file's own header before any of
    # its bytes are used (`vouched`): a cache entry never changes what is served.
    known_from: str | None = None
    size: int = field(init=False)  # elements

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", math.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def vouched(self, head: bytes | None = None) -> CachedArray:
        """This array, once its file's own header (in `head`, its first bytes, or
        read here) says what its header-file entry said; HeaderFileLied when it
        does not (and the header file is removed: it is not to be believed again)."""
        if self.known_from is None:
            return self
        if head is None:
            try:
                fd, st = open_regular(self.path)
            except OSError as exc:
                raise self.lied(f"{self.path}: {exc.strerror or exc}") from None
            try:
                if self.file is not None and file_id(st) != self.file:
                    raise self.lied(f"{self.path}: changed since {self.known_from} was written")
                head = os.pread(fd, HEAD, 0)
            finally:
                os.close(fd)
        self.check_head(head)
        return dataclasses.replace(self, known_from=None, head=head)

    def check_head(self, head: bytes) -> None:
        """HeaderFileLied unless the file's first bytes `head` are the header its
        header-file entry (or record) says."""
        if head[: self.offset] == npy_header(self.dtype, self.shape, self.offset):
            return  # the very bytes numpy writes for it (most files): no need to parse them
        try:
            dtype, shape, offset = parse_npy_header(head)
        except ValueError as exc:
            raise self.lied(f"{self.path}: {exc}, but {self.known_from} says {self.dtype.str} "
                            f"{list(self.shape)} at byte {self.offset}") from None
        if dtype != self.dtype or (shape, offset) != (self.shape, self.offset):
            raise self.lied(f"{self.path}: its header says {dtype.str} {list(shape)} at byte {offset}, but "
                            f"{self.known_from} says {self.dtype.str} {list(self.shape)} at byte {self.offset}")

    def lied(self, why: str) -> HeaderFileLied:
        """The error for a file that is not what the header file (or record) this array
        is known from says; that file is removed: it is not to be believed again."""
        try:
            os.unlink(self.known_from)
        except OSError:
            pass
        what = "header file" if self.known_from.endswith("-mmfs-headers.json") else "record"
        return HeaderFileLied(self.known_from, f"{why}; that {what} is removed")

    def map(self) -> np.ndarray:
        if self.known_from is not None:
            return self.vouched().map()
        return map_region(self.path, self.offset, self.dtype, self.shape)

    def read_item(self, flat_index: int) -> int:
        """One element (C order) read with pread, without mapping the file."""
        if self.known_from is not None:
            return self.vouched().read_item(flat_index)
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


class HeaderFileLied(FormatError):
    """A header file's entry for a cache file disagrees with the file's own header."""

    def __init__(self, header_file: str, message: str) -> None:
        super().__init__(message + "; run the command again")
        self.header_file = header_file
        self.why = message


NPY_MIN_HEADER = 10  # magic, version and header length: no array starts before
HEAD = 4096  # bytes read for a header: numpy writes headers of 64 to a few hundred
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


def npy_header(dtype: np.dtype, shape: tuple[int, ...], offset: int) -> bytes:
    """The header numpy's np.save writes (format 1.0) for an array of `dtype` and
    `shape` whose data starts at `offset` (b"" when no such header ends there)."""
    text = f"{{'descr': {dtype.str!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    pad = offset - NPY_MIN_HEADER - len(text) - 1
    if pad < 0 or offset - NPY_MIN_HEADER > 0xFFFF:
        return b""
    return b"\x93NUMPY\x01\x00" + (offset - NPY_MIN_HEADER).to_bytes(2, "little") + \
        (text + " " * pad + "\n").encode("latin1")


def parse_npy_header(head: bytes) -> tuple[np.dtype, tuple[int, ...], int]:
    """dtype, shape and data offset from a .npy file's first bytes; ValueError when
    they are not the header of a plain C-order array."""
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
        try:
            meta = ast.literal_eval(text)
            descr, fortran, shape = meta["descr"], meta["fortran_order"], tuple(meta["shape"])
        except (SyntaxError, LookupError, TypeError, MemoryError, RecursionError):
            raise ValueError("malformed header") from None
    try:
        dtype = np.dtype(descr)
        shape = tuple(operator.index(n) for n in shape)
    except TypeError:
        raise ValueError("malformed header") from None
    if fortran or dtype.hasobject:
        raise ValueError("not a plain C-order array")
    return dtype, shape, start + length


def read_npy_header(path: str) -> CachedArray:
    """dtype, shape and data offset of a .npy file from its first bytes; ValueError
    when it is not a whole, plain .npy file (truncated, pickled, Fortran order)."""
    fd, st = open_regular(path)
    try:
        head = os.pread(fd, HEAD, 0)
        size = st.st_size
        tail = os.pread(fd, TAIL, size - TAIL) if size > len(head) else b""
    finally:
        os.close(fd)
    dtype, shape, offset = parse_npy_header(head)
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

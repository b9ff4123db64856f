"""A local file as a source: positional reads with pread, and a map where a reader
wants one (the fast paths of local data stay as they were)."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from mmfs.storage.base import NotThere, StorageError
from mmfs.storage.localfiles import map_file

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def file_problem(path: str) -> str | None:
    """Why `path` cannot be opened as a regular file, or None when it can be.
    (Opening a FIFO would block, so nothing is opened here.)"""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "file not found"
    except ValueError:  # an embedded NUL byte
        return "not a usable file name"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    kind = next((what for test, what in _KINDS if test(mode)), "not a file")
    return f"is {kind}, not a regular file"


def sized_file_problem(path: str, limit: int, what: str) -> str | None:
    """Why `path` is not a regular file of at most `limit` bytes (`what` it should
    hold names the limit), or None. Nothing is opened: a FIFO would block the read,
    /dev/zero or a huge sparse file would fill memory."""
    problem = file_problem(path)
    if problem is None:
        size = os.path.getsize(path)
        if size > limit:
            problem = f"is {size:,} bytes, more than any {what} ({limit >> 20} MiB at most)"
    return problem


def read_text_file(path: str, limit: int, what: str) -> str:
    """The whole UTF-8 text of a regular file of at most `limit` bytes; StorageError
    naming the file and why not (never a cut text, never a blocked read)."""
    problem = sized_file_problem(path, limit, what)
    if problem is None:
        try:  # non-blocking: a FIFO put in the file's place since the check opens at once
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            problem = f"cannot be read ({exc.strerror or exc})"
    if problem is None:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                problem = "is not a regular file"
            else:
                data = f.read(limit + 1)
                if len(data) > limit:
                    problem = f"grew past {limit >> 20} MiB while read (any {what} is smaller)"
    if problem is not None:
        raise StorageError(f"{path}: {problem}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StorageError(f"{path}: not UTF-8 text (byte {exc.start}); give the {what} as text") from None


class FileSource:
    """A regular file. Its identity is (size, mtime_ns, inode) at open."""

    def __init__(self, path: str) -> None:
        problem = file_problem(path)
        if problem is not None:
            raise (NotThere if problem == "file not found" else StorageError)(f"{path}: {problem}")
        st = os.stat(path)
        self.url = self.path = path
        self.size = st.st_size
        # the file's own (size, mtime_ns, inode); `identity` is the source's (an object's copy: the object's)
        self.file_identity = self.identity = (st.st_size, st.st_mtime_ns, st.st_ino)

    @classmethod
    def known(cls, path: str, st: os.stat_result) -> FileSource:
        """The source of a regular file whose stat is at hand (a re-open that checked
        it against a record): no stat of its own."""
        source = cls.__new__(cls)
        source.url = source.path = path
        source.size = st.st_size
        source.file_identity = source.identity = (st.st_size, st.st_mtime_ns, st.st_ino)
        return source

    @contextmanager
    def opened(self) -> Iterator[None]:
        """Keep the file open for this thread's reads inside the block (opening a
        dataset reads its header and a few spot values: one open, not one per read).
        Builder threads share sources, so the descriptor is the thread's own."""
        held = _held()
        if id(self) in held:
            yield
            return
        fd = held[id(self)] = self._open()
        try:
            yield
        finally:
            del held[id(self)]
            os.close(fd)

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise StorageError(f"{self.path}: cannot read ({exc.strerror or exc}); "
                               "check the file's permissions") from None

    def read_into(self, offset: int, buffer) -> int:
        view = memoryview(buffer).cast("B")
        fd = _held().get(id(self))
        if fd is not None:
            return read_fd_into(fd, offset, view)
        fd = self._open()
        try:
            return read_fd_into(fd, offset, view)
        finally:
            os.close(fd)

    def map(self) -> np.ndarray:
        """The whole file as a read-only uint8 array (a map that holds no descriptor;
        empty files: an empty array)."""
        if not self.size:
            return np.zeros(0, np.uint8)
        return map_file(self.path)


_opened = threading.local()  # this thread's descriptors of the sources inside opened(), by id


def _held() -> dict[int, int]:
    held = getattr(_opened, "fds", None)
    if held is None:
        held = _opened.fds = {}
    return held


def read_fd_into(fd: int, offset: int, view: memoryview) -> int:
    """Fill `view` from fd at `offset`; the bytes read (fewer only at the end of the file)."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done

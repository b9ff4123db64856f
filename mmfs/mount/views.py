"""The registry of the mount's views: directories of generated files, as the
C core serves them.

A view is declared once (mmfs/mount/declarations.py): its directory, its file
count (and so its name width), the C reader of its files' tokens, their dtype,
their extended attributes. Everything else follows from the declaration: the
tree lists, looks up and stats the view's files from it, and the C FUSE
handlers (native/mmfs_fuse.c) serve getattr, read and readdir of every
registered view without entering Python. File names follow the mount contract
(mmfs/mount/contract.py; the C side parses and formats the same).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmfs.errors import NativeError
from mmfs.mount.contract import file_name, file_name_format, name_width
from mmfs.native import error_detail, ffi, lib


@dataclass
class View:
    """A directory of `count` generated files.

    reader: the C reader family; file i holds `mmfs_<reader>_length(ctx, i)`
    tokens (or `file_tokens` for every file) of dtype `dtype`, written by
    `mmfs_<reader>_tokens`. ctx: the C struct that reader reads (kept alive
    by `keep`). xattrs: file id -> {name: value}, computed on request."""

    path: str
    count: int
    dtype: np.dtype
    reader: str
    ctx: Any
    mtime_ns: int
    file_tokens: int | None = None
    xattr_names: tuple[str, ...] = ()
    xattrs: Callable[[int], dict[str, bytes]] | None = None
    total_tokens: Callable[[], int] | None = None  # all files' tokens, for statfs (None: count * file_tokens)
    describe_file: Callable[[int], str] | None = None  # " (dataset x, ...)" for messages
    keep: Any = None
    width: int = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, np.dtype):  # (20,000 views at 10,000 datasets: most have one)
            self.dtype = np.dtype(self.dtype)
        self.width = name_width(self.count)

    def name(self, i: int) -> str:
        """The name of file i (the C side parses and formats the same)."""
        return file_name(i, self.width)

    def names(self, start: int = 0) -> Iterator[str]:
        fmt = file_name_format(self.width)
        for i in range(max(start, 0), self.count):
            yield fmt % i

    @property
    def file_bytes(self) -> int | None:
        """The size of every file, when they all have one."""
        return None if self.file_tokens is None else self.file_tokens * self.dtype.itemsize

    @property
    def total_bytes(self) -> int:
        tokens = self.total_tokens() if self.total_tokens is not None else self.count * (self.file_tokens or 0)
        return tokens * self.dtype.itemsize

    def fill(self, c: Any, path: Any) -> None:
        """Describe the view in the C struct c (an mmfs_view)."""
        c.path = path
        c.count = self.count
        c.name_width = self.width
        c.item = self.dtype.itemsize
        c.file_tokens = -1 if self.file_tokens is None else self.file_tokens
        c.length, c.tokens = _reader_functions(self.reader)
        c.ctx = self.ctx
        c.mtime_ns = self.mtime_ns


_READERS: dict[str, tuple[Any, Any]] = {}


def _reader_functions(reader: str) -> tuple[Any, Any]:
    """The C functions of a reader family: mmfs_<reader>_length and _tokens (looked up
    once each, not for each of the views)."""
    found = _READERS.get(reader)
    if found is None:
        found = _READERS[reader] = (ffi.addressof(lib, f"mmfs_{reader}_length"),
                                    ffi.addressof(lib, f"mmfs_{reader}_tokens"))
    return found


class Registry:
    """The views of a mount, as the C handlers and the tree see them."""

    def __init__(self, views: list[View]) -> None:
        paths = [v.path for v in views]
        if len(set(paths)) != len(paths):
            raise ValueError(f"a view is declared twice: {paths}")
        # Sorted by path: the C side finds a path by binary search.
        self.views = views = sorted(views, key=lambda v: v.path.encode("utf-8", "surrogateescape"))
        self.index = {id(v): d for d, v in enumerate(views)}
        self.by_path = {v.path: v for v in views}
        self._paths = [ffi.new("char[]", v.path.encode()) for v in views]
        self.c = ffi.new("mmfs_view[]", max(len(views), 1))
        for c, view, path in zip(self.c, views, self._paths):
            view.fill(c, path)

    def __len__(self) -> int:
        return len(self.views)

    def find(self, path: str) -> tuple[int, View | None, int]:
        """(lib.MMFS_PATH_*, view, file id) of a path in the mount."""
        d, i = ffi.new("int32_t *"), ffi.new("int64_t *")
        kind = lib.mmfs_view_find(self.c, len(self.views), path.encode("utf-8", "surrogateescape"), d, i)
        view = self.views[d[0]] if kind != lib.MMFS_PATH_OTHER else None
        return kind, view, i[0]

    def _c(self, view: View) -> Any:
        return self.c + self.index[id(view)]

    def size(self, view: View, i: int) -> int:
        """Bytes in file i of view."""
        if view.file_bytes is not None:
            return view.file_bytes
        n = lib.mmfs_view_size(self._c(view), i)
        if n < 0:
            raise NativeError(read_failure(view, i, n))
        return n

    def read(self, view: View, i: int, offset: int, size: int) -> bytes:
        """Bytes [offset, offset + size) of file i of view (fewer at its end)."""
        if offset < 0 or size <= 0:
            return b""
        size = min(size, max(self.size(view, i) - offset, 0))
        buf = ffi.new("uint8_t[]", max(size, 1))
        n = self._read(view, i, offset, size, buf)
        return ffi.buffer(buf, n)[:]

    def read_into(self, view: View, i: int, offset: int, out: bytearray) -> int:
        """Bytes [offset, offset + len(out)) of file i of view, into out: how many."""
        return self._read(view, i, offset, len(out), ffi.from_buffer("uint8_t[]", out)) if out and offset >= 0 else 0

    def _read(self, view: View, i: int, offset: int, size: int, buf: Any) -> int:
        """mmfs_view_read, what the C read handler calls for a view's file."""
        n = lib.mmfs_view_read(self._c(view), i, offset, size, buf)
        if n < 0:
            raise NativeError(read_failure(view, i, n))
        return n


def read_failure(view: View, i: int, rc: int) -> str:
    """One line on why file i of view could not be read: the C core's code and
    what it was doing (the file, the sequence, the byte offset)."""
    return "".join(read_failure_parts(view, i, rc))


def read_failure_parts(view: View, i: int, rc: int) -> tuple[str, str]:
    """read_failure's line in two: the file ("PATH (what it is): ") and why."""
    detail = error_detail(rc)  # first: describe_file may call the C core again
    where = view.describe_file(i) if view.describe_file is not None else ""
    return f"{view.path}/{view.name(i)}{where}: ", detail

"""The file-backed arrays an ArrayPlacer places under a map limit, held as rows of
plain facts (no object per array): a mount of ten thousand datasets places some
hundred thousand of them. `finish` applies the limit to them together and then,
in a few C calls rather than a Python step per array: copies those kept into one
block of memory (each file opened, checked to be the file the indices were made
from, and read), registers the files of the others in the open-files table, checks
the .npy header of every array known from a header file or record (its dtype,
shape and offset, as those say), and fills every array's C struct. Only an array
whose check fails (or cannot be made in C: a long or unusual header) is looked at
in Python, where the error names it (HeaderFileLied, FormatError)."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np

from mmfs.errors import FormatError
from mmfs.formats.dtypes import native_code
from mmfs.megatron.cache.npyfile import HEAD, CachedArray
from mmfs.native import ffi, lib
from mmfs.storage import localfiles

_STRUCT = ffi.typeof("mmfs_array")  # a struct (a field of another): placed by its address
HEADS = 512  # bytes read first of each file: a numpy header is 128 bytes, rarely more


class _Row(NamedTuple):
    struct: Any  # the mmfs_array it is described in
    path: str
    offset: int  # of its bytes in the file
    dtype: np.dtype  # native byte order
    shape: tuple[int, ...]
    count: int  # elements
    identity: tuple[int, int, int] | None  # the file's (size, mtime_ns, inode) as the indices were made from it
    known_from: str | None  # the header file or record its facts come from (its own header not read yet)
    mapped: int  # the address of its bytes where it is mapped now, else 0


class Mapped(NamedTuple):
    """A mapped array kept within the limit: copied by the daemon (ArrayPlacer.load)."""

    path: str
    offset: int
    dtype: np.dtype
    count: int
    structs: list


def _bytes(texts) -> bytes:
    """NUL-terminated strings one after another, as the C calls take them."""
    return b"".join(t.encode("utf-8", "surrogateescape") + b"\0" for t in texts)


def _ptr(kind: str, array: np.ndarray):
    return ffi.from_buffer(f"{kind}[]", array)


class FileArrays:
    """Rows of file-backed arrays, placed then finished in bulk."""

    def __init__(self) -> None:
        self._rows: list[_Row] = []
        self.file_ids: list[int] = []  # registered in the open-files table (the placer forgets them)
        self.paths: list[str] = []  # every file an array comes from, once
        self.within: list[Mapped] = []  # mapped arrays kept: load() copies them
        self.copies: list[np.ndarray] = []  # the block of the copies made

    def add(self, c: Any, path: str, offset: int, dtype: np.dtype, shape: tuple[int, ...], count: int,
            identity: tuple[int, int, int] | None = None, known_from: str | None = None, mapped: int = 0) -> None:
        self._rows.append(_Row(c, path, offset, dtype, shape, count, identity, known_from, mapped))

    def finish(self, room: int) -> tuple[int, int]:
        """Keep the smallest arrays (each file region once) that fit in `room` bytes
        together, as they were placed when tied; read the others with pread. Returns
        (bytes kept, bytes read with pread)."""
        rows, self._rows = self._rows, []
        if not rows:
            return 0, 0
        structs, paths, offsets, dtypes, shapes, counts, identities, known, mapped = zip(*rows)
        # Each file region once (the same bytes may be placed twice): its first row.
        regions: dict[tuple[str, int], int] = {}
        region_of = np.fromiter((regions.setdefault(key, len(regions)) for key in zip(paths, offsets)),
                                dtype=np.int64, count=len(rows))
        first = np.unique(region_of, return_index=True)[1]
        counts_ = np.array(counts, dtype=np.int64)
        itemsizes = np.array([d.itemsize for d in dtypes], dtype=np.int64)
        nbytes = (counts_ * itemsizes)[first]
        self.paths = sorted(set(paths))
        # Smallest first (ties in placing order): those that fit in the room together stay.
        order = np.argsort(nbytes, kind="stable")
        kept = int(np.searchsorted(np.cumsum(nbytes[order]), room, side="right"))
        kept_bytes, pread_bytes = int(nbytes[order[:kept]].sum()), int(nbytes[order[kept:]].sum())
        is_mapped = np.array(mapped, dtype=np.int64)[first] != 0
        keep = np.zeros(len(first), dtype=bool)
        keep[order[:kept]] = True

        address = np.array(mapped, dtype=np.int64)  # a mapped array points at its map until load()
        file = np.zeros(len(rows), dtype=np.int64)
        copied = np.flatnonzero(keep & ~is_mapped)  # regions
        if len(copied):
            at = self._copy(rows, first[copied])
            address_of_region = np.zeros(len(first), dtype=np.int64)
            address_of_region[copied] = at
            to_copy = np.flatnonzero(np.isin(region_of, copied))
            address[to_copy] = address_of_region[region_of[to_copy]]
        for r in np.flatnonzero(keep & is_mapped).tolist():
            row = rows[first[r]]
            self.within.append(Mapped(row.path, row.offset, row.dtype, row.count,
                                      [rows[i].struct for i in np.flatnonzero(region_of == r).tolist()]))
        read = np.flatnonzero(~keep)  # regions read with pread
        if len(read):
            file_of_region = np.zeros(len(first), dtype=np.int64)
            file_of_region[read] = self._register(rows, first[read])
            by_pread = np.flatnonzero(~keep[region_of])
            file[by_pread] = file_of_region[region_of[by_pread]]
            address[by_pread] = 0  # (a mapped array read with pread)
            self._check_heads(rows, first[read], file_of_region[read])
        pointers = [ffi.addressof(c) if ffi.typeof(c) is _STRUCT else c for c in structs]
        lib.mmfs_arrays_fill(ffi.new("mmfs_array *[]", pointers), len(rows),
                             _ptr("int64_t", address), _ptr("int64_t", file),
                             _ptr("int64_t", np.array(offsets, dtype=np.int64)), _ptr("int64_t", counts_),
                             _ptr("int32_t", np.array([native_code(d) for d in dtypes], dtype=np.int32)))
        return kept_bytes, pread_bytes

    def _copy(self, rows: list[_Row], which: np.ndarray) -> np.ndarray:
        """Copy the arrays of rows `which` into one block of memory, each file read once,
        in one C call (tens of thousands of small index files), and checked as it is
        read: the file the array was made from, and the header the header file or
        record it is known from says (HeaderFileLied when not). A copy never faults
        however its file changes later; a daemon forked after inherits it. Returns
        the address of each copy."""
        chosen = [rows[i] for i in which.tolist()]
        n = len(chosen)
        lengths = np.array([r.count * r.dtype.itemsize for r in chosen], dtype=np.int64)
        at = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(-(-lengths // 64) * 64, out=at[1:])  # each copy starts 64-byte aligned: any dtype may view it
        block = np.empty(int(at[-1]), dtype=np.uint8)
        identity = np.array([r.identity or (-1, -1, -1) for r in chosen], dtype=np.int64).reshape(-1, 3)
        heads = np.empty((n, HEADS), dtype=np.uint8)
        got = np.empty(n, dtype=np.int32)
        lib.mmfs_files_copy(_bytes(r.path for r in chosen), n, _ptr("int64_t", identity), HEADS,
                            _ptr("uint8_t", heads), _ptr("int32_t", got),
                            _ptr("int64_t", np.array([r.offset for r in chosen], dtype=np.int64)),
                            _ptr("int64_t", lengths), _ptr("uint8_t", block), _ptr("int64_t", at))
        for k in np.flatnonzero(got < 0).tolist():
            why = "changed since it was read" if got[k] == lib.MMFS_E_CHANGED else "cannot be read"
            row = chosen[k]
            if row.known_from is not None:
                raise _array(row).lied(f"{row.path}: {why}")
            raise FormatError(f"{row.path}: {why}; run the command again")
        for k in _unmatched(chosen, heads, got).tolist():
            array, n_got = _array(chosen[k]), int(got[k])
            if n_got == HEADS and array.offset > HEADS:  # a long header: read on its own
                array.vouched()
            else:
                array.check_head(heads[k, :n_got].tobytes())
        self.copies.append(block)
        return block.ctypes.data + at[:-1]

    def _register(self, rows: list[_Row], which: np.ndarray) -> np.ndarray:
        """The open-files ids of the files of rows `which` (each file registered once,
        with the identity of its first array's)."""
        ids: dict[str, int] = {}
        index = np.fromiter((ids.setdefault(rows[i].path, len(ids)) for i in which.tolist()),
                            dtype=np.int64, count=len(which))
        firsts = which[np.unique(index, return_index=True)[1]]
        identity = np.array([rows[i].identity or (-1, -1, -1) for i in firsts.tolist()],
                            dtype=np.int64).reshape(-1, 3)
        files = np.empty(len(ids), dtype=np.int64)
        lib.mmfs_files_add_many(_bytes(ids), len(ids), _ptr("int64_t", identity), _ptr("int64_t", files))
        self.file_ids.extend(int(f) for f in files[files > 0])
        if (files < 0).any():
            raise MemoryError("no memory for the open-files table")
        return files[index]

    def _check_heads(self, rows: list[_Row], which: np.ndarray, files: np.ndarray) -> None:
        """Check each array of rows `which` known from a header file or record against
        its file's own header, reading the first bytes of all of them in one C call
        (thousands of files); HeaderFileLied for the first that disagrees or cannot
        be read."""
        unchecked = [k for k, i in enumerate(which.tolist()) if rows[i].known_from is not None]
        if not unchecked:
            return
        chosen = [rows[i] for i in which[unchecked].tolist()]
        ids = np.ascontiguousarray(files[unchecked])
        heads = np.empty((len(chosen), HEADS), dtype=np.uint8)
        got = np.empty(len(chosen), dtype=np.int32)
        lib.mmfs_files_heads(_ptr("int64_t", ids), len(chosen), HEADS, _ptr("uint8_t", heads), _ptr("int32_t", got))
        for k in _unmatched(chosen, heads, got).tolist():
            array, n = _array(chosen[k]), int(got[k])
            if n < 0 or (n == HEADS and array.offset > HEADS):  # not read, or a long header: file by file
                array.check_head(_head(int(ids[k]), array))
            else:
                array.check_head(heads[k, :n].tobytes())


def _unmatched(rows: list[_Row], heads: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Which of rows, known from a header file or record, have a file whose head (as
    read) is not the very header numpy writes for what that says (checked in C, in
    one call); the caller parses those heads itself."""
    check = np.array([r.known_from is not None for r in rows], dtype=bool)
    if not check.any():
        return np.zeros(0, dtype=np.int64)
    ndim = np.array([len(r.shape) if 1 <= len(r.shape) <= 2 else -1 for r in rows], dtype=np.int32)
    shapes = np.array([(r.shape + (0, 0))[:2] for r in rows], dtype=np.int64).reshape(-1, 2)
    ok = np.zeros(len(rows), dtype=np.uint8)
    lib.mmfs_npy_headers_match(_ptr("uint8_t", heads), _ptr("int32_t", got), HEADS, len(rows),
                               _bytes(r.dtype.str for r in rows), _ptr("int32_t", ndim), _ptr("int64_t", shapes),
                               _ptr("int64_t", np.array([r.offset for r in rows], dtype=np.int64)),
                               _ptr("uint8_t", ok))
    return np.flatnonzero(check & (ok == 0))


def _array(row: _Row) -> CachedArray:
    """The array of a row, as an object (for the error that names it)."""
    return CachedArray(row.path, row.dtype, row.shape, row.offset, file=row.identity, known_from=row.known_from)


def _head(file: int, array: CachedArray) -> bytes:
    """The first page of a registered file, known from a header file or record; when
    it is gone or changed, that header file or record lied (HeaderFileLied)."""
    try:
        with localfiles.descriptor(file) as fd:
            return os.pread(fd, HEAD, 0)
    except OSError as exc:
        raise array.lied(f"{array.path}: {_why(exc)}") from None


def _why(exc: OSError) -> str:
    return exc.strerror if exc.strerror and exc.filename else str(exc).split(": ", 1)[-1]

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

import itertools
import os
from collections import Counter
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
    """A row's facts, as add() takes them (a plain tuple each; this names them for the
    few looked at one by one)."""

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


def _bytes(texts: list[str]) -> bytes:
    """NUL-terminated strings one after another, as the C calls take them."""
    return ("\0".join(texts) + "\0").encode("utf-8", "surrogateescape") if texts else b""


def _code(dtype: np.dtype) -> int:
    """The C core's code of a dtype, or -1."""
    try:
        return native_code(dtype)
    except KeyError:
        return -1


def _ptr(kind: str, array: np.ndarray):
    return ffi.from_buffer(f"{kind}[]", array)


def _identities(column) -> np.ndarray:
    """The files' identities as the C core takes them: unsigned 64-bit words, four a file
    (localfiles.identity_words; None: taken when first opened)."""
    return np.fromiter(itertools.chain.from_iterable(localfiles.identity_words(i) for i in column),
                       dtype=np.uint64, count=4 * len(column))


class _Columns:
    """The rows' facts as columns, taken at the first row of each file region."""

    def __init__(self, rows: list[tuple]) -> None:
        columns = list(zip(*rows))
        self.structs = columns[0]
        self.paths, self.offsets = columns[1], np.array(columns[2], dtype=np.int64)
        self.dtypes, self.shapes = np.array(columns[3], dtype=object), columns[4]
        self.counts = np.array(columns[5], dtype=np.int64)
        self.identities, self.known = columns[6], np.array(columns[7], dtype=object)
        self.mapped = np.array(columns[8], dtype=np.int64)
        info = {d: (d.itemsize, _code(d)) for d in set(columns[3])}
        facts = np.array([info[d] for d in columns[3]], dtype=np.int64).reshape(-1, 2)
        self.itemsizes, self.codes = facts[:, 0], facts[:, 1].astype(np.int32)
        # Each file region once (the same bytes may be placed twice): rows of one region share its first's.
        keys = list(zip(self.paths, columns[2]))
        if len(set(keys)) == len(keys):
            self.region_of = np.arange(len(keys), dtype=np.int64)
        else:
            regions: dict[tuple[str, int], int] = {}
            self.region_of = np.fromiter((regions.setdefault(key, len(regions)) for key in keys),
                                         dtype=np.int64, count=len(keys))
        self.first = np.unique(self.region_of, return_index=True)[1]

    def row(self, i: int) -> _Row:
        return _Row(self.structs[i], self.paths[i], int(self.offsets[i]), self.dtypes[i], self.shapes[i],
                    int(self.counts[i]), self.identities[i], self.known[i], int(self.mapped[i]))

    def take(self, column, rows: np.ndarray) -> list:
        return [column[i] for i in rows.tolist()] if isinstance(column, tuple) else column[rows].tolist()


class FileArrays:
    """Rows of file-backed arrays, placed then finished in bulk."""

    def __init__(self) -> None:
        self._rows: list[tuple] = []
        self.file_ids: list[int] = []  # registered in the open-files table (the placer forgets them)
        self._paths: Any = ()  # the files of the arrays finished
        self.within: list[Mapped] = []  # mapped arrays kept: load() copies them
        self.copies: list[np.ndarray] = []  # the block of the copies made

    def add(self, c: Any, path: str, offset: int, dtype: np.dtype, shape: tuple[int, ...], count: int,
            identity: tuple[int, int, int] | None = None, known_from: str | None = None, mapped: int = 0) -> None:
        """Place an array (see _Row), as a row of facts."""
        self._rows.append((c, path, offset, dtype, shape, count, identity, known_from, mapped))

    def paths(self) -> set[str]:
        """Every file an array placed here comes from."""
        return {*self._paths, *(row[1] for row in self._rows)}

    def finish(self, room: int) -> tuple[int, int]:
        """Keep the smallest arrays (each file region once) that fit in `room` bytes
        together, as they were placed when tied; read the others with pread. Returns
        (bytes kept, bytes read with pread)."""
        rows, self._rows = self._rows, []
        if not rows:
            return 0, 0
        t = _Columns(rows)
        self._paths = t.paths
        first, region_of = t.first, t.region_of
        nbytes = (t.counts * t.itemsizes)[first]
        # Smallest first (ties in placing order): those that fit in the room together stay.
        order = np.argsort(nbytes, kind="stable")
        kept = int(np.searchsorted(np.cumsum(nbytes[order]), room, side="right"))
        kept_bytes, pread_bytes = int(nbytes[order[:kept]].sum()), int(nbytes[order[kept:]].sum())
        is_mapped = t.mapped[first] != 0
        keep = np.zeros(len(first), dtype=bool)
        keep[order[:kept]] = True

        address = t.mapped.copy()  # a mapped array points at its map until load()
        file = np.zeros(len(rows), dtype=np.int64)
        copied = np.flatnonzero(keep & ~is_mapped)  # regions
        if len(copied):
            at = np.zeros(len(first), dtype=np.int64)
            at[copied] = self._copy(t, first[copied])
            to_copy = np.flatnonzero(np.isin(region_of, copied))
            address[to_copy] = at[region_of[to_copy]]
        for r in np.flatnonzero(keep & is_mapped).tolist():
            row = t.row(first[r])
            self.within.append(Mapped(row.path, row.offset, row.dtype, row.count,
                                      t.take(t.structs, np.flatnonzero(region_of == r))))
        read = np.flatnonzero(~keep)  # regions read with pread
        if len(read):
            file_of_region = np.zeros(len(first), dtype=np.int64)
            file_of_region[read] = self._register(t, first[read])
            by_pread = np.flatnonzero(~keep[region_of])
            file[by_pread] = file_of_region[region_of[by_pread]]
            address[by_pread] = 0  # (a mapped array read with pread)
            self._check_heads(t, first[read], file_of_region[read])
        for i in np.flatnonzero(t.codes < 0)[:1].tolist():  # (its header said so too: checked above)
            raise FormatError(f"{t.paths[i]}: {t.dtypes[i]} is no dtype the C core reads; run the command again")
        pointers = [ffi.addressof(c) if ffi.typeof(c) is _STRUCT else c for c in t.structs]
        lib.mmfs_arrays_fill(ffi.new("mmfs_array *[]", pointers), len(rows), _ptr("int64_t", address),
                             _ptr("int64_t", file), _ptr("int64_t", t.offsets), _ptr("int64_t", t.counts),
                             _ptr("int32_t", t.codes))
        return kept_bytes, pread_bytes

    def _copy(self, t: _Columns, which: np.ndarray) -> np.ndarray:
        """Copy the arrays of rows `which` into one block of memory, each file read once,
        in one C call (tens of thousands of small index files), and checked as it is
        read: the file the array was made from, and the header the header file or
        record it is known from says (HeaderFileLied when not). A copy never faults
        however its file changes later; a daemon forked after inherits it. Returns
        the address of each copy."""
        n = len(which)
        lengths = t.counts[which] * t.itemsizes[which]
        at = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(-(-lengths // 64) * 64, out=at[1:])  # each copy starts 64-byte aligned: any dtype may view it
        block = np.empty(int(at[-1]), dtype=np.uint8)
        heads, got = np.zeros((n, HEADS), dtype=np.uint8), np.zeros(n, dtype=np.int32)
        packed = _packed(t, which)
        rest = np.flatnonzero(~packed)
        if len(rest):
            heads[rest], got[rest] = _read(t, which[rest], lengths[rest], block, np.ascontiguousarray(at[rest]))
        for rows in _by_file(t, which, packed):
            got[rows] = lib.mmfs_regions_copy(
                _bytes([t.paths[which[rows[0]]]]), _ptr("uint64_t", _identities(t.take(t.identities, which[rows[:1]]))),
                len(rows), _ptr("int64_t", np.ascontiguousarray(t.offsets[which[rows]])),
                _ptr("int64_t", np.ascontiguousarray(lengths[rows])), _ptr("uint8_t", block),
                _ptr("int64_t", np.ascontiguousarray(at[rows])))
        for k in np.flatnonzero(got < 0).tolist():
            why = "changed since it was read" if got[k] == lib.MMFS_E_CHANGED else "cannot be read"
            row = t.row(which[k])
            if row.known_from is not None:
                raise _array(row).lied(f"{row.path}: {why}")
            raise FormatError(f"{row.path}: {why}; run the command again")
        for k in _unmatched(t, which, heads, got).tolist():
            array, n_got = _array(t.row(which[k])), int(got[k])
            if n_got == HEADS and array.offset > HEADS:  # a long header: read on its own
                array.vouched()
            else:
                array.check_head(heads[k, :n_got].tobytes())
        self.copies.append(block)
        return block.ctypes.data + at[:-1]

    def _register(self, t: _Columns, which: np.ndarray) -> np.ndarray:
        """The open-files ids of the files of rows `which` (each file registered once,
        with the identity of its first array's)."""
        paths = t.take(t.paths, which)
        if len(set(paths)) == len(paths):
            index, firsts = np.arange(len(paths)), which
        else:
            ids: dict[str, int] = {}
            index = np.fromiter((ids.setdefault(p, len(ids)) for p in paths), dtype=np.int64, count=len(paths))
            unique = np.unique(index, return_index=True)[1]
            paths, firsts = [paths[i] for i in unique.tolist()], which[unique]
        files = np.empty(len(paths), dtype=np.int64)
        lib.mmfs_files_add_many(_bytes(paths), len(paths), _ptr("uint64_t", _identities(t.take(t.identities, firsts))),
                                _ptr("int64_t", files))
        self.file_ids.extend(files[files > 0].tolist())
        if (files < 0).any():
            raise MemoryError("no memory for the open-files table")
        return files[index]

    def _check_heads(self, t: _Columns, which: np.ndarray, files: np.ndarray) -> None:
        """Check each array of rows `which` known from a header file or record against
        its file's own header, reading the first bytes of all of them in one C call
        (thousands of files); HeaderFileLied for the first that disagrees or cannot
        be read (asked again through the open-files table, for the reason)."""
        checked = t.known[which] != None  # noqa: E711 (element-wise)
        which, ids = which[checked], np.ascontiguousarray(files[checked])
        if not len(which):
            return
        # Each file opened, checked to be the file the facts were taken from and its head
        # read as a copy of no bytes is (shared among threads, without the table's lock).
        nothing = np.zeros(len(which) + 1, dtype=np.int64)
        heads, got = _read(t, which, nothing[1:], np.zeros(1, dtype=np.uint8), nothing)
        for k in _unmatched(t, which, heads, got).tolist():
            array, n = _array(t.row(which[k])), int(got[k])
            if n < 0 or (n == HEADS and array.offset > HEADS):  # not read, or a long header: file by file
                array.check_head(_head(int(ids[k]), array))
            else:
                array.check_head(heads[k, :n].tobytes())


PACKED_FROM = 16  # rows of one file, none to check against a .npy header: a pack's, read as one file


def _packed(t: _Columns, which: np.ndarray) -> np.ndarray:
    """Which of rows `which` lie in a file holding PACKED_FROM of them or more with no
    .npy header to check (the config's pack, cache/pack.py): copied file by file
    (mmfs_regions_copy: one open, a few long reads), not array by array."""
    paths = t.take(t.paths, which)
    unchecked = t.known[which] == None  # noqa: E711 (element-wise)
    many = {p for p, n in Counter(p for p, u in zip(paths, unchecked.tolist()) if u).items() if n >= PACKED_FROM}
    if not many:
        return np.zeros(len(which), dtype=bool)
    return unchecked & np.fromiter((p in many for p in paths), dtype=bool, count=len(paths))


def _by_file(t: _Columns, which: np.ndarray, packed: np.ndarray) -> list[np.ndarray]:
    """The packed rows (positions in `which`) of each file, in the order of their offsets."""
    rows = np.flatnonzero(packed)
    groups: dict[str, list[int]] = {}
    for k in rows.tolist():
        groups.setdefault(t.paths[which[k]], []).append(k)
    out = []
    for ks in groups.values():
        ks = np.array(ks, dtype=np.int64)
        out.append(ks[np.argsort(t.offsets[which[ks]], kind="stable")])
    return out


def _read(t: _Columns, which: np.ndarray, lengths: np.ndarray, block: np.ndarray,
          at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mmfs_files_copy of rows `which`: lengths[k] bytes of each array to block + at[k];
    returns the heads read (HEADS bytes each) and how many bytes of each, or the error."""
    n = len(which)
    heads, got = np.empty((n, HEADS), dtype=np.uint8), np.empty(n, dtype=np.int32)
    lib.mmfs_files_copy(_bytes(t.take(t.paths, which)), n, _ptr("uint64_t", _identities(t.take(t.identities, which))),
                        HEADS, _ptr("uint8_t", heads), _ptr("int32_t", got), _ptr("int64_t", t.offsets[which]),
                        _ptr("int64_t", lengths), _ptr("uint8_t", block), _ptr("int64_t", at))
    return heads, got


def _unmatched(t: _Columns, which: np.ndarray, heads: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Which of rows `which`, known from a header file or record, have a file whose head
    (as read) is not the very header numpy writes for what that says (checked in C,
    in one call); the caller parses those heads itself."""
    check = t.known[which] != None  # noqa: E711 (element-wise)
    if not check.any():
        return np.zeros(0, dtype=np.int64)
    shapes = t.take(t.shapes, which)
    ndim = np.fromiter((len(s) if 1 <= len(s) <= 2 else -1 for s in shapes), dtype=np.int32, count=len(shapes))
    dims = np.fromiter(itertools.chain.from_iterable((s + (0, 0))[:2] for s in shapes), dtype=np.int64,
                       count=2 * len(shapes))
    ok = np.zeros(len(which), dtype=np.uint8)
    lib.mmfs_npy_headers_match(_ptr("uint8_t", heads), _ptr("int32_t", got), HEADS, len(which),
                               _bytes([d.str for d in t.dtypes[which].tolist()]), _ptr("int32_t", ndim),
                               _ptr("int64_t", dims), _ptr("int64_t", t.offsets[which]), _ptr("uint8_t", ok))
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

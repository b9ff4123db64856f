"""Megatron's index cache: `<md5>-<Class>-<split>-<suffix>` files in a folder.

Loading reads each file's .npy header (and the description) with pread and maps
nothing: an array is mapped when first used, so re-opening a blend of thousands
of datasets costs a few small reads per index. A file that does not load, has
the wrong dtype or shape, or whose description differs, is a miss and is
rebuilt, never trusted.

Saving is in two steps so that thousands of files cost one sync, not one fsync
each: `IndexCache.stage` writes an index's files under temporary names, and
`Batch.commit` syncs the file system once, renames every staged file into place
(the description last: a hit needs all files) and syncs the folder. Builders on
many hosts sharing a folder so never see half a file. Temporary files left by a
killed builder are removed by the next one (see `clean_stale_temporaries`).

A folder holding many indices of one config also gets a header file
(`HeaderFile`): every array's header and every file's size, mtime and inode, as
loaded or saved. The next open of the same indices stats their files instead of
reading them, so a blend of a thousand datasets re-opens with one read.
"""

from __future__ import annotations

import ast
import ctypes
import errno
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass

import numpy as np

from mmfs.errors import CacheError
from mmfs.megatron.cachelock import HOST, Lock, pid_alive

log = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"
STALE_TEMP_AGE = 24 * 3600.0  # a temporary file of another host older than this is dead
_NPY_HEADER = re.compile(r"\{'descr': '([^']+)', 'fortran_order': (True|False), "
                         r"'shape': \(([0-9, ]*)\), \}")


def description_hash(description: str) -> str:
    return hashlib.md5(description.encode("utf-8")).hexdigest()


# -- reading -----------------------------------------------------------------------

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


def read_npy_header(path: str) -> CachedArray:
    """dtype, shape and data offset of a .npy file from its first bytes; ValueError
    when it is not a whole, plain .npy file (truncated, pickled, Fortran order)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        head = os.pread(fd, 4096, 0)
        st = os.fstat(fd)
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


def _read_text(path: str, limit: int) -> tuple[str, FileId]:
    """At most `limit` bytes of a file, as text, and the file's FileId."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
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


# -- writing -----------------------------------------------------------------------


_RUN = uuid.uuid4().hex[:8]  # with the pid and a count: unique, without a uuid per file
_COUNT = itertools.count()


def _temp_name(folder: str, final: str) -> str:
    return os.path.join(folder, f"{TEMP_PREFIX}{os.getpid()}@{HOST}@{_RUN}.{next(_COUNT)}-"
                                f"{os.path.basename(final)}")


def clean_stale_temporaries(folder: str) -> int:
    """Remove temporary files whose writer is gone (a process of this host that
    no longer runs, or another host's file older than STALE_TEMP_AGE); returns
    how many were removed."""
    removed = 0
    try:
        entries = [e for e in os.scandir(folder) if e.name.startswith(TEMP_PREFIX)]
    except OSError:
        return 0
    now = time.time()
    for e in entries:
        pid, _, rest = e.name[len(TEMP_PREFIX):].partition("@")
        host, _, _ = rest.partition("@")
        try:
            if host == HOST and pid.isdigit():
                stale = not pid_alive(int(pid))
            else:  # another host's, or an older mmfs's name: judge by age
                stale = now - e.stat().st_mtime > STALE_TEMP_AGE
            if stale:
                os.unlink(e.path)
                removed += 1
        except OSError:
            pass
    if removed:
        log.info("%s: removed %d temporary file(s) left by killed builders", folder, removed)
    return removed


def _syncfs(folder: str) -> None:
    """Flush the file system holding `folder` (one call for every staged file)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = getattr(libc, "syncfs", None)
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory; the renames still hold
        pass
    finally:
        os.close(fd)


def write_problem(folder: str, exc: OSError) -> str:
    """What went wrong writing the cache in `folder`, and what to do, in words."""
    code = exc.errno
    text = str(exc)
    if code in (errno.EEXIST, errno.ENOTDIR) and (os.path.exists(folder)
                                                   and not os.path.isdir(folder)
                                                   or code == errno.ENOTDIR):
        return (f"{folder} is a file, not a folder; set cache_dir in the config to a folder "
                "(or move the file away)")
    if code in (errno.ENOSPC, errno.EDQUOT) or "requested and" in text:
        return (f"no space left in {folder} (disk or quota full); free some space or set "
                "cache_dir in the config to a folder on another disk")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"{folder} is not writable ({exc.strerror}); set cache_dir in the config to "
                "a writable folder")
    return f"cannot write in {folder} ({exc.strerror or text}); set cache_dir in the config " \
           "to a writable folder"


class Batch:
    """Staged index files waiting for one sync and their renames, and the build
    locks to release once they are in place (thread-safe)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._staged: list[tuple[str, str]] = []  # (temporary, final)
        self._locks: list[Lock] = []
        self._warned: set[str] = set()
        self._cleaned: set[str] = set()

    def add(self, moves: list[tuple[str, str]]) -> None:
        with self._guard:
            self._staged.extend(moves)

    def hold(self, lock: Lock) -> None:
        """Release `lock` at the commit (or abandon)."""
        with self._guard:
            self._locks.append(lock)

    def first_write_in(self, folder: str) -> bool:
        with self._guard:
            first = folder not in self._cleaned
            self._cleaned.add(folder)
            return first

    def warn_once(self, folder: str, message: str) -> None:
        with self._guard:
            if folder in self._warned:
                return
            self._warned.add(folder)
        log.warning("cannot write the index cache: %s. Indices stay in memory.", message)

    def _take(self) -> tuple[list[tuple[str, str]], list[Lock]]:
        with self._guard:
            staged, self._staged = self._staged, []
            locks, self._locks = self._locks, []
        return staged, locks

    def commit(self) -> None:
        """Sync once, rename every staged file into place, release the locks."""
        staged, locks = self._take()
        try:
            if not staged:
                return
            folders = sorted({os.path.dirname(final) for _, final in staged})
            try:
                for folder in folders:
                    _syncfs(folder)
                for tmp, final in staged:
                    os.replace(tmp, final)
                for folder in folders:
                    _fsync_dir(folder)
            except OSError as exc:
                for tmp, _ in staged:
                    _unlink(tmp)
                raise CacheError(f"cannot finish the index cache: "
                                 f"{write_problem(os.path.dirname(exc.filename or folders[0]), exc)}"
                                 ) from None
        finally:
            for lock in locks:
                lock.release()

    def abandon(self) -> None:
        """Drop staged files and release locks (a build that failed)."""
        staged, locks = self._take()
        for tmp, _ in staged:
            _unlink(tmp)
        for lock in locks:
            lock.release()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# Indices this process built but could not save, by cache file base: a second open
# of the same config in this process (the mount re-opens) does not build them again.
_UNSAVED: dict[str, dict[str, np.ndarray]] = {}


class IndexCache:
    """The cache files of one dataset object (a GPTDataset or a BlendedDataset split)."""

    def __init__(self, folder: str | None, description: str, class_name: str, split: str) -> None:
        self.folder = folder
        self.description = description
        self.hash = description_hash(description)
        self.base = f"{self.hash}-{class_name}-{split}"
        self.description_file: FileId | None = None  # as last loaded or staged

    def path(self, suffix: str) -> str:
        if self.folder is None:
            raise CacheError("no cache folder")
        return os.path.join(self.folder, f"{self.base}-{suffix}")

    @property
    def lock_path(self) -> str:
        return os.path.join(self.folder or "", f"{self.base}.lock")

    def _key(self) -> str:
        return os.path.join(self.folder or "", self.base)

    def unsaved(self) -> dict[str, np.ndarray] | None:
        """Arrays built earlier in this process that the cache could not keep."""
        return _UNSAVED.get(self._key())

    def load(self, specs: dict[str, tuple[tuple[str, ...], int]]) -> dict[str, CachedArray] | None:
        """Every array's header if all files are present and sound, else None.

        specs: name -> (allowed dtypes, ndim). Nothing is mapped."""
        if self.folder is None:
            return None
        description_path = self.path("description.txt")
        try:
            # one byte more than ours: a longer file differs, however long it is
            text, self.description_file = _read_text(description_path,
                                                     len(self.description.encode("utf-8")) + 1)
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("%s: unreadable (%s); rebuilding", description_path, exc)
            return None
        if text != self.description:
            log.warning("%s: description differs from this config; rebuilding", description_path)
            return None
        arrays = {}
        for name in specs:
            p = self.path(f"{name}.npy")
            try:
                arrays[name] = read_npy_header(p)
            except FileNotFoundError:
                return None
            except (OSError, ValueError, SyntaxError, KeyError, TypeError) as exc:
                log.warning("%s: corrupt or truncated (%s); rebuilding", p, exc)
                return None
        return arrays if arrays_fit_specs(arrays, specs) else None

    def stage(self, arrays: dict[str, np.ndarray], batch: Batch) -> dict[str, CachedArray | np.ndarray]:
        """Write the arrays and the description under temporary names, to be renamed
        by batch.commit(). Returns where each array will be (mapped after the
        commit), or the arrays themselves when the folder cannot take them."""
        if self.folder is None:
            return arrays
        moves: list[tuple[str, str]] = []
        out: dict[str, CachedArray | np.ndarray] = {}
        try:
            if batch.first_write_in(self.folder):
                os.makedirs(self.folder, exist_ok=True)
                clean_stale_temporaries(self.folder)
            for name, array in arrays.items():
                final = self.path(f"{name}.npy")
                written = self._write(final, lambda f, a=array: np.save(f, a), moves)
                out[name] = CachedArray(final, array.dtype, array.shape,
                                        written[0] - array.nbytes, file=written)
            self.description_file = self._write(
                self.path("description.txt"), lambda f: f.write(self.description.encode("utf-8")),
                moves)
        except OSError as exc:
            for tmp, _ in moves:
                _unlink(tmp)
            batch.warn_once(self.folder, write_problem(self.folder, exc))
            _UNSAVED[self._key()] = arrays
            return arrays
        batch.add(moves)
        return out

    @staticmethod
    def _write(final: str, write, moves: list) -> FileId:
        """Write a temporary file to be renamed to `final`; the FileId it will have."""
        tmp = _temp_name(os.path.dirname(final), final)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        moves.append((tmp, final))
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            return file_id(os.fstat(fd))


# -- the headers of many indices in one file ----------------------------------------

HEADERS_FROM = 16  # indices of a config in one folder; with fewer, their own files do


class HeaderFile:
    """The headers of a config's indices in one folder, in `<md5>-mmfs-headers.json`
    (the md5 of their file names), with each file's FileId as it was loaded or
    written. An index whose files all still have those ids is known without reading
    them; one whose files changed is loaded the usual way (and the header file
    written again). Losing this file costs only time, so it is not synced."""

    VERSION = 1

    def __init__(self, folder: str, caches: list[IndexCache]) -> None:
        self.folder = folder
        key = description_hash("\n".join(sorted({c.base for c in caches})))
        self.path = os.path.join(folder, f"{key}-mmfs-headers.json")

    def read(self, specs: dict[str, dict]) -> dict[str, tuple[FileId, dict[str, CachedArray]]]:
        """base -> (its description's FileId, its arrays), for each index of `specs`
        (base -> its arrays' specs) whose files are unchanged; nothing when the
        header file is missing or unreadable."""
        try:
            with open(self.path, "rb") as f:
                saved = json.loads(f.read())
            entries = saved["indices"] if saved["version"] == self.VERSION else {}
        except (OSError, ValueError, LookupError, TypeError):
            return {}
        if not isinstance(entries, dict):
            return {}
        dtypes: dict[str, np.dtype] = {}
        known = {}
        for base, array_specs in specs.items():
            try:
                arrays = self._unchanged(base, entries.get(base), array_specs, dtypes)
            except (OSError, ValueError, LookupError, TypeError, AttributeError):
                arrays = None  # gone, changed or malformed: load it the usual way
            if arrays is not None:
                known[base] = arrays
        return known

    def _unchanged(self, base: str, entry: dict, specs: dict,
                   dtypes: dict) -> tuple[FileId, dict[str, CachedArray]] | None:
        description = file_id(os.stat(os.path.join(self.folder, f"{base}-description.txt")))
        if description != tuple(entry["description.txt"]):
            return None
        arrays = {}
        for name in specs:
            descr, shape, offset, saved_id = entry[name]
            path = os.path.join(self.folder, f"{base}-{name}.npy")
            now = file_id(os.stat(path))
            dtype = dtypes.get(descr) or dtypes.setdefault(descr, np.dtype(descr))
            shape, offset = tuple(int(n) for n in shape), int(offset)
            if now != tuple(saved_id) or min(shape, default=0) < 0 or offset < NPY_MIN_HEADER \
                    or now[0] != offset + math.prod(shape) * dtype.itemsize:
                return None
            arrays[name] = CachedArray(path, dtype, shape, offset, file=now)
        return (description, arrays) if arrays_fit_specs(arrays, specs) else None

    def write(self, indices: list[tuple[IndexCache, dict]]) -> None:
        """Record every index (cache, arrays) held in its cache files."""
        entries = {}
        for cache, arrays in indices:
            if cache.description_file is None or not all(
                    isinstance(a, CachedArray) and a.file for a in arrays.values()):
                continue  # held in memory: not in the cache
            entries[cache.base] = {"description.txt": cache.description_file, **{
                name: [a.dtype.str, a.shape, a.offset, a.file] for name, a in arrays.items()}}
        text = json.dumps({"version": self.VERSION, "indices": entries}, separators=(",", ":"))
        tmp = _temp_name(self.folder, self.path)
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)  # dumps, not dump: dump encodes in pure Python
            os.replace(tmp, self.path)
        except OSError as exc:
            _unlink(tmp)
            log.debug("%s: not written (%s)", self.path, exc)

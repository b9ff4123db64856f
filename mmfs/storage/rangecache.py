"""Byte ranges of remote objects, cached on local disk under a size limit.

Each object's fetched ranges go into a sparse file of the object's size, at their
own offsets; which ranges are there is known in memory (this process's own cache
folder, so no other process needs to agree on it). A read takes what is cached
and fetches exactly the rest: the gaps, never a byte more, split at
`max_request` bytes. The disk holds whole pages, so a range counts as the pages
it touches. Before a range is fetched into the cache its pages are reserved:
the least recently used ranges are dropped (their pages punched out of the
file) until the cached and reserved pages fit the limit, so the folder never
holds more than the limit, not even while ranges are in flight; a range that
cannot be reserved is fetched for its read only. What stays in memory is the
list of ranges, not their bytes: the kernel's page cache holds those.

A range counts as cached only once all its bytes are written. A write that fails
or stores less (a full disk, an I/O error) leaves the range uncached (its pages
are punched out again) and the read is served from the fetched bytes. A full
disk lowers the limit below what the cache holds (it shrinks to make room); any
other error, or a limit shrunk to nothing, turns the disk cache off: from then
on every read is fetched for itself. Each is logged once.

A read that needs a range another thread is fetching waits for that fetch
instead of fetching it again; reads of cached bytes never wait for a fetch
(the lock is held only to look up and copy local bytes).
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import errno
import logging
import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable

log = logging.getLogger(__name__)

# fallocate(2) modes: give the bytes of a dropped range back to the file system.
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]

PAGE = 4096  # the file system's block: what the disk holds for a byte
MAX_REQUEST = 8 << 20  # bytes in one request: a long gap is fetched in pieces
WAIT_SECONDS = 600  # for another thread's fetch (its own timeouts end it sooner)
MIN_DISK = 64 * PAGE  # a full disk that leaves less than this: no disk cache at all

Fetch = Callable[[int, memoryview], None]  # (offset, buffer): fill it whole or raise


def punch_hole(fd: int, offset: int, length: int) -> bool:
    return length <= 0 or _libc.fallocate(fd, _PUNCH_HOLE, offset, length) == 0


def disk_bytes(lo: int, hi: int) -> int:
    """The bytes of the pages that [lo, hi) touches."""
    return (-(-hi // PAGE) - lo // PAGE) * PAGE


class _Object:
    """One object's data file and its cached ranges (sorted, never overlapping)."""

    def __init__(self, path: str, size: int) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.ftruncate(self.fd, size)
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.pending: list[tuple[int, int, threading.Event]] = []

    def overlapping(self, lo: int, hi: int) -> range:
        """Indices of the cached ranges that overlap [lo, hi)."""
        first = bisect.bisect_right(self.ends, lo)
        last = bisect.bisect_left(self.starts, hi)
        return range(first, max(first, last))

    def gaps(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The parts of [lo, hi) neither cached nor being fetched."""
        taken = [(self.starts[i], self.ends[i]) for i in self.overlapping(lo, hi)]
        taken += [(a, b) for a, b, _ in self.pending if a < hi and b > lo]
        return _minus(lo, hi, taken)

    def add(self, lo: int, hi: int) -> None:
        i = bisect.bisect_left(self.starts, lo)
        self.starts.insert(i, lo)
        self.ends.insert(i, hi)

    def remove(self, lo: int) -> tuple[int, int]:
        """Forget the cached range that starts at `lo`; the part of the file to free."""
        i = bisect.bisect_left(self.starts, lo)
        if i == len(self.starts) or self.starts[i] != lo:
            return 0, 0
        hi = self.ends.pop(i)
        self.starts.pop(i)
        return self.freeable(lo, hi)

    def freeable(self, lo: int, hi: int) -> tuple[int, int]:
        """The pages of [lo, hi) (neither cached nor being fetched itself), less a page
        at either end that a neighbouring cached range still uses, or that a range being
        fetched may have written already (it is recorded as cached only after its bytes
        are in the file)."""
        free_lo, free_hi = lo // PAGE * PAGE, -(-hi // PAGE) * PAGE
        if self._used(free_lo):
            free_lo += PAGE
        if free_hi > free_lo and self._used(free_hi - PAGE):
            free_hi -= PAGE
        return free_lo, max(free_lo, free_hi)

    def _used(self, page: int) -> bool:
        return bool(self.overlapping(page, page + PAGE)) or any(
            a < page + PAGE and b > page for a, b, _ in self.pending)


class RangeCache:
    """Cached byte ranges of objects in `folder` (this process's own), at most
    `limit` bytes of them on disk, in flight included."""

    def __init__(self, folder: str, limit: int) -> None:
        self.folder = folder
        self.limit = max(0, int(limit))
        os.makedirs(folder, exist_ok=True)
        self._lock = threading.Lock()
        self._objects: dict[str, _Object] = {}
        self._lru: OrderedDict[tuple[str, int], int] = OrderedDict()  # (key, start) -> disk bytes
        self.cached_bytes = 0  # on disk, counted in pages (a page two ranges share, twice)
        self.reserved_bytes = 0  # pages of the ranges being fetched into the cache
        self.peak_bytes = 0  # the most cached + reserved at once
        self.on_disk = True  # False once the folder failed: every read fetches for itself
        self.fetched_bytes = 0
        self.requests = 0
        self.dropped_bytes = 0  # pages of cached ranges dropped to make room (or when the limit was lowered)
        self._warned: set[str] = set()
        self._shrinks = 0  # times a full disk lowered the limit

    def _object(self, key: str, size: int) -> _Object | None:
        obj = self._objects.get(key)
        if obj is None and self.on_disk:
            try:
                obj = self._objects[key] = _Object(os.path.join(self.folder, f"{len(self._objects)}.data"), size)
            except OSError as exc:
                self._disk_failed(exc.errno or errno.EIO, "create a file in")
        return obj

    def read(self, key: str, size: int, offset: int, buffer: memoryview, fetch: Fetch) -> int:
        """Fill `buffer` with the object's bytes at `offset` (fewer only at its end,
        `size`); `fetch` gets the ranges that are not cached. Raises what fetch
        raises."""
        view = memoryview(buffer).cast("B")
        lo, hi = offset, min(offset + len(view), size)
        if hi <= lo:
            return 0
        have: list[tuple[int, int]] = []  # ranges of [lo, hi) already in `view`
        for _ in range(3):  # a range dropped or a fetch failed meanwhile: look again
            with self._lock:
                obj = self._object(key, size) if self.on_disk else None
                if obj is None:  # no disk cache
                    break
                mine, alone = [], []  # fetched into the cache / for this read only (no room)
                for a, b in _split([g for part in _minus(lo, hi, have) for g in obj.gaps(*part)]):
                    if self._reserve(a, b):
                        mine.append((a, b, threading.Event()))
                    else:
                        alone.append((a, b))
                obj.pending.extend(mine)
                waits = [ev for a, b, ev in obj.pending if a < hi and b > lo]
                shrinks = self._shrinks
            stored = []
            try:
                for a, b, _ in mine:
                    fetch(a, view[a - lo : b - lo])
                    have.append((a, b))
                    if self._store(obj, view[a - lo : b - lo], a, shrinks):
                        stored.append((a, b))
                for a, b in alone:
                    self._fetch_alone(fetch, a, view[a - lo : b - lo])
                    have.append((a, b))
            finally:
                with self._lock:
                    for a, b, ev in mine:
                        obj.pending.remove((a, b, ev))
                        self._settle(key, obj, a, b, (a, b) in have, (a, b) in stored)
                        ev.set()
            for ev in waits:
                ev.wait(WAIT_SECONDS)
            with self._lock:
                if self._copy_cached(key, obj, lo, hi, view, have):
                    return hi - lo
        # No disk cache, or readers want more than the limit holds at once (what they
        # wait for is dropped before they copy it): fetch the rest for this read only.
        for a, b in _minus(lo, hi, have):
            self._fetch_alone(fetch, a, view[a - lo : b - lo])
        return hi - lo

    def warm(self, key: str, size: int, offset: int, length: int, fetch: Fetch) -> int:
        """Fetch into the cache the parts of [offset, offset + length) neither cached
        nor being fetched, without waiting for other threads' fetches and copying
        nothing out (read-ahead: a thread that holds a request slot never waits for
        one that may not have one yet). A part that finds no room is not fetched.
        The bytes fetched; raises what fetch raises."""
        lo, hi = offset, min(offset + length, size)
        if hi <= lo:
            return 0
        with self._lock:
            obj = self._object(key, size) if self.on_disk else None
            if obj is None:
                return 0
            mine = [(a, b, threading.Event()) for a, b in _split(obj.gaps(lo, hi)) if self._reserve(a, b)]
            obj.pending.extend(mine)
            shrinks = self._shrinks
        buffer = bytearray(max((b - a for a, b, _ in mine), default=0))
        fetched = []
        try:
            for a, b, _ in mine:
                part = memoryview(buffer)[: b - a]
                fetch(a, part)
                fetched.append((a, b, self._store(obj, part, a, shrinks)))
        finally:
            with self._lock:
                done = {(a, b): stored for a, b, stored in fetched}
                for a, b, ev in mine:
                    obj.pending.remove((a, b, ev))
                    self._settle(key, obj, a, b, (a, b) in done, done.get((a, b), False))
                    ev.set()
        return sum(b - a for a, b, _ in fetched)

    def _fetch_alone(self, fetch: Fetch, offset: int, part: memoryview) -> None:
        fetch(offset, part)
        with self._lock:
            self.fetched_bytes += len(part)
            self.requests += 1

    def _reserve(self, a: int, b: int) -> bool:
        """Room on disk for [a, b) before it is fetched, dropping the least recently
        used ranges as needed; False if it does not fit (under the lock)."""
        cost = disk_bytes(a, b)
        if not self.on_disk or cost > self.limit:
            return False
        while self.cached_bytes + self.reserved_bytes + cost > self.limit and self._lru:
            self._drop_oldest()
        if self.cached_bytes + self.reserved_bytes + cost > self.limit:
            return False  # the rest is reserved by ranges in flight
        self.reserved_bytes += cost
        self.peak_bytes = max(self.peak_bytes, self.cached_bytes + self.reserved_bytes)
        return True

    def _store(self, obj: _Object, part: memoryview, offset: int, shrinks: int) -> bool:
        """Write a fetched range into the object's file: True only if all of it is there.
        (shrinks: the limit's shrinks when it was reserved, for _disk_failed.)"""
        try:
            written = os.pwrite(obj.fd, part, offset)
        except OSError as exc:
            failure = exc.errno or errno.EIO
        else:
            if written == len(part):
                return True
            failure = errno.ENOSPC  # a short write: the file system ran out of room
        with self._lock:
            self._disk_failed(failure, "write", shrinks)
        return False

    def _settle(self, key: str, obj: _Object, a: int, b: int, fetched: bool, stored: bool) -> None:
        """A reserved range is fetched (or failed): cache it, or give back its pages."""
        cost = disk_bytes(a, b)
        self.reserved_bytes -= cost
        self.fetched_bytes += (b - a) * fetched
        self.requests += fetched
        if stored and self.on_disk:
            obj.add(a, b)
            self._lru[(key, a)] = cost
            self.cached_bytes += cost
            while self.cached_bytes + self.reserved_bytes > self.limit and self._lru:  # (a lowered limit)
                self._drop_oldest()
        else:  # what it may have written, or a neighbour's page kept for it
            self._punch(obj, *obj.freeable(a, b))

    def _drop_oldest(self) -> None:
        (key, start), cost = self._lru.popitem(last=False)
        obj = self._objects[key]
        self.cached_bytes -= cost
        self.dropped_bytes += cost
        self._punch(obj, *obj.remove(start))

    def _punch(self, obj: _Object, lo: int, hi: int) -> None:
        if not punch_hole(obj.fd, lo, hi - lo) and self.on_disk:  # (once off, the folder failed already)
            self._warn_once("punch", "%s: the file system cannot free dropped ranges (fallocate: %s); "
                            "the cache folder may grow past cache_limit", self.folder,
                            os.strerror(ctypes.get_errno()))

    def _disk_failed(self, failure: int, doing: str, shrinks: int | None = None) -> None:
        """The cache folder failed (under the lock): a full disk lowers the limit below
        what is cached now (once for the writes that failed together: those reserved
        before the last shrink do not shrink it again); anything else, or nothing
        left, turns the disk cache off."""
        if failure in (errno.ENOSPC, errno.EDQUOT) and self.on_disk:
            if shrinks is not None and shrinks < self._shrinks:
                return
            lowered = self.cached_bytes * 3 // 4 // PAGE * PAGE
            if lowered >= MIN_DISK:
                if lowered < self.limit:
                    self._shrinks += 1
                    self._warn_once("disk", "%s: the disk is full (%s): cached ranges are kept under %d bytes "
                                    "from now on (cache_limit %d), less if it fills again, none if nothing "
                                    "fits; the reads go on", self.folder, os.strerror(failure), lowered,
                                    self.limit)
                    self.limit = lowered
                    while self.cached_bytes + self.reserved_bytes > self.limit and self._lru:
                        self._drop_oldest()
                return
        if self.on_disk:
            self._warn_once("disk", "%s: cannot %s the cache folder (%s): the mount goes on without a disk "
                            "cache, every read fetched for itself", self.folder, doing, os.strerror(failure))
            self.on_disk = False
            self.limit = 0
            while self._lru:
                self._drop_oldest()

    def _warn_once(self, kind: str, message: str, *args: object) -> None:
        """One line per kind of trouble ("disk": the folder failed; "punch") per cache."""
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message, *args)

    def _copy_cached(self, key: str, obj: _Object, lo: int, hi: int, view: memoryview,
                     have: list[tuple[int, int]]) -> bool:
        """Copy every part of [lo, hi) not in `have` from the data file; False
        when some part is not cached (under the lock: nothing is dropped meanwhile)."""
        for a, b in _minus(lo, hi, have):
            covered = a
            for i in obj.overlapping(a, b):
                s, e = obj.starts[i], obj.ends[i]
                if s > covered:
                    return False
                part_lo, part_hi = max(s, a), min(e, b)
                try:
                    got = os.preadv(obj.fd, [view[part_lo - lo : part_hi - lo]], part_lo)
                except OSError as exc:
                    self._disk_failed(exc.errno or errno.EIO, "read")
                    return False
                if got != part_hi - part_lo:
                    return False
                self._lru.move_to_end((key, s), last=True)
                covered = part_hi
            if covered < b:
                return False
        return True

    def counters(self) -> dict:
        """What the cache holds and did so far (the mount's counters), in bytes: its limit,
        the pages of ranges cached and being fetched into it, the most of both at once,
        the pages dropped to make room, and the bytes fetched, in `requests` fetches."""
        with self._lock:
            return {"limit": self.limit, "cached": self.cached_bytes, "reserved": self.reserved_bytes,
                    "peak": self.peak_bytes, "dropped": self.dropped_bytes, "fetched": self.fetched_bytes,
                    "requests": self.requests, "on_disk": self.on_disk}

    def close(self) -> None:
        with self._lock:
            for obj in self._objects.values():
                os.close(obj.fd)
            self._objects.clear()
            self._lru.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


def _minus(lo: int, hi: int, taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [lo, hi) outside the ranges `taken`."""
    out, at = [], lo
    for a, b in sorted(taken):
        if a > at:
            out.append((at, min(a, hi)))
        at = max(at, b)
        if at >= hi:
            break
    if at < hi:
        out.append((at, hi))
    return out


def _split(gaps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for a, b in gaps:
        out += [(s, min(s + MAX_REQUEST, b)) for s in range(a, b, MAX_REQUEST)]
    return out

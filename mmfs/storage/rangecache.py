"""Byte ranges of remote objects, cached on local disk under a size limit.

Each object's fetched ranges go into a sparse file of the object's size, at their
own offsets; which ranges are there is known in memory (this process's own cache
folder, so no other process needs to agree on it). A read takes what is cached
and fetches exactly the rest: the gaps, never a byte more, split at
`max_request` bytes. The least recently used ranges are dropped (their bytes
punched out of the file) when the total passes the limit. The disk holds whole
pages, so a range counts as the pages it touches, and dropping it frees every
page no other cached range shares. What stays in memory is the list of ranges,
not their bytes: the kernel's page cache holds those.

A read that needs a range another thread is fetching waits for that fetch
instead of fetching it again; reads of cached bytes never wait for a fetch
(the lock is held only to look up and copy local bytes).
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
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

    def add(self, lo: int, hi: int) -> None:
        i = bisect.bisect_left(self.starts, lo)
        self.starts.insert(i, lo)
        self.ends.insert(i, hi)

    def remove(self, lo: int) -> tuple[int, int]:
        """Forget the range that starts at `lo`; the part of the file to free: its
        pages, less a page at either end that a neighbouring range still uses, or
        that a range being fetched may have written already (it is recorded as
        cached only after its bytes are in the file)."""
        i = bisect.bisect_left(self.starts, lo)
        if i == len(self.starts) or self.starts[i] != lo:
            return 0, 0
        hi = self.ends.pop(i)
        self.starts.pop(i)
        free_lo, free_hi = lo // PAGE * PAGE, -(-hi // PAGE) * PAGE
        first, last = free_lo, free_hi - PAGE  # the end pages, the only ones others can share
        if (i > 0 and self.ends[i - 1] > first) or self._fetching(first):
            free_lo += PAGE
        if (i < len(self.starts) and self.starts[i] < free_hi) or self._fetching(last):
            free_hi -= PAGE
        return free_lo, free_hi

    def _fetching(self, page: int) -> bool:
        return any(a < page + PAGE and b > page for a, b, _ in self.pending)


class RangeCache:
    """Cached byte ranges of objects in `folder` (this process's own), at most
    `limit` bytes of them."""

    def __init__(self, folder: str, limit: int) -> None:
        self.folder = folder
        self.limit = max(0, int(limit))
        os.makedirs(folder, exist_ok=True)
        self._lock = threading.Lock()
        self._objects: dict[str, _Object] = {}
        self._lru: OrderedDict[tuple[str, int], int] = OrderedDict()  # (key, start) -> disk bytes
        self.cached_bytes = 0  # on disk, counted in pages (a page two ranges share, twice)
        self.fetched_bytes = 0
        self.requests = 0
        self._punch_warned = False

    def _object(self, key: str, size: int) -> _Object:
        obj = self._objects.get(key)
        if obj is None:
            obj = self._objects[key] = _Object(os.path.join(self.folder, f"{len(self._objects)}.data"), size)
        return obj

    def read(self, key: str, size: int, offset: int, buffer: memoryview, fetch: Fetch) -> int:
        """Fill `buffer` with the object's bytes at `offset` (fewer only at its end,
        `size`); `fetch` gets the ranges that are not cached. Raises what fetch
        raises."""
        view = memoryview(buffer).cast("B")
        lo, hi = offset, min(offset + len(view), size)
        if hi <= lo:
            return 0
        for _ in range(3):  # a range dropped or a fetch failed meanwhile: look again
            with self._lock:
                obj = self._object(key, size)
                mine = [(a, b, threading.Event()) for a, b in _split(obj.gaps(lo, hi))]
                obj.pending.extend(mine)
                waits = [ev for a, b, ev in obj.pending if a < hi and b > lo]
            fetched = []
            try:
                for a, b, _ in mine:
                    part = view[a - lo : b - lo]
                    fetch(a, part)
                    os.pwrite(obj.fd, part, a)
                    fetched.append((a, b))
            finally:
                with self._lock:
                    for a, b, ev in mine:
                        obj.pending.remove((a, b, ev))
                        if (a, b) in fetched:
                            self._keep(key, obj, a, b)
                        ev.set()
            for ev in waits:
                ev.wait(WAIT_SECONDS)
            with self._lock:
                if self._copy_cached(key, obj, lo, hi, view, fetched):
                    return hi - lo
        # Readers want more than the limit holds at once: what they wait for is dropped
        # before they copy it. Fetch it all for this read, past the cache.
        fetch(lo, view[: hi - lo])
        with self._lock:
            self.fetched_bytes += hi - lo
            self.requests += 1
        return hi - lo

    def _copy_cached(self, key: str, obj: _Object, lo: int, hi: int, view: memoryview,
                     fetched: list[tuple[int, int]]) -> bool:
        """Copy every part of [lo, hi) not in `fetched` from the data file; False
        when some part is not cached (under the lock: nothing is dropped meanwhile)."""
        needed, at = [], lo
        for a, b in sorted(fetched):
            if a > at:
                needed.append((at, a))
            at = max(at, b)
        if at < hi:
            needed.append((at, hi))
        for a, b in needed:
            covered = a
            for i in obj.overlapping(a, b):
                s, e = obj.starts[i], obj.ends[i]
                if s > covered:
                    return False
                part_lo, part_hi = max(s, a), min(e, b)
                got = os.preadv(obj.fd, [view[part_lo - lo : part_hi - lo]], part_lo)
                if got != part_hi - part_lo:
                    return False
                self._lru.move_to_end((key, s), last=True)
                covered = part_hi
            if covered < b:
                return False
        return True

    def _keep(self, key: str, obj: _Object, a: int, b: int) -> None:
        obj.add(a, b)
        self._lru[(key, a)] = disk_bytes(a, b)
        self.cached_bytes += disk_bytes(a, b)
        self.fetched_bytes += b - a
        self.requests += 1
        while self.cached_bytes > self.limit and self._lru:
            (old_key, start), cost = self._lru.popitem(last=False)
            old = self._objects[old_key]
            self.cached_bytes -= cost
            free_lo, free_hi = old.remove(start)
            if not punch_hole(old.fd, free_lo, free_hi - free_lo) and not self._punch_warned:
                self._punch_warned = True
                log.warning("%s: the file system cannot free dropped ranges (fallocate: %s); "
                            "the cache folder may grow past cache_limit", self.folder,
                            os.strerror(ctypes.get_errno()))

    def close(self) -> None:
        with self._lock:
            for obj in self._objects.values():
                os.close(obj.fd)
            self._objects.clear()
            self._lru.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


def _split(gaps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for a, b in gaps:
        out += [(s, min(s + MAX_REQUEST, b)) for s in range(a, b, MAX_REQUEST)]
    return out

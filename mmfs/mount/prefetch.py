"""Order-aware prefetch for a mount whose data is in object storage.

Every file of a view is followed by the next one: a reader of samples/, of a
rank's micro-batches (ranks/RRR, or a stream layout's rank folder) or of
documents reads file j + 1 after file j. When the C handlers serve the first
bytes of file j of a view, they tell this prefetcher (mmfs_fuse_set_read_hook,
with the view's path), which reads files j + 1, j + 2, ... of that view in the
background, ahead of the reader, on `max_requests` workers, each of which holds
one of the store's request slots while it fetches (storage/inflight.py: their
number, the limit, follows the readers' demand and the store's answers, and the
readers' own requests take free slots first). The window starts at two files and
doubles, up to `prefetch` bytes, each time the reader reaches a file whose fetch
has not finished while the view has fewer fetches waiting or running than its
share of the slots (the limit over the views fetching; with its share busy, the
store is what the reader waits for, and a wider window would only fetch further
ahead): it grows until it hides the store's latency at the reader's pace, and no
further, and never past a tenth of what its reader has read so far (AHEAD_OF_READ;
twice its first size at the start), so what is fetched and never read when a reader
stops stays within a tenth of what it read, on a node of one rank as of eight. (The
share is each view's own: counted against all the slots, the ranks that came
first could grow their windows and keep the others' from growing.) A worker
fetches only what is neither cached nor being fetched, and waits for no other
fetch while it holds its slot.
Reading a file through the C core fetches exactly the byte ranges of its pieces
into the range cache, so the reader then finds them there. Each view has its own
window: a rank that reads only its own files fetches only its own samples' bytes.
A reader that jumps (a resumed job) moves the window to where it now reads. The
windows' files wait in one fair queue (mount/fairshare.py): the file earliest in
what its reader reads goes first, so the readers of a mount (the ranks of a node)
get fetches in proportion to what they read, and a rank that falls behind is
served before the ranks ahead of it; all windows together stay within `budget`
bytes ahead, each view's fair part of it at least.

A file the window has not fetched yet is fetched when its first bytes are read:
every piece at once (the C core would fetch them one after another, a round trip
each), before the read goes on. Either way a file's pieces that lie back to back in
an object (the sequences of a document) are joined into one request.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from mmfs.errors import MmfsError
from mmfs.megatron.arrays import noted_fetches
from mmfs.mount.fairshare import FairQueue
from mmfs.native import ffi, lib
from mmfs.storage.inflight import Gate
from mmfs.storage.rangecache import MAX_REQUEST

log = logging.getLogger(__name__)


@dataclass
class _Window:
    registry: Any  # the Registry the view is read through
    view: Any
    reading: int = -1  # the file the reader last started
    next: int = -1  # the next file to fetch (none yet: a first read starts the window as a jump does)
    ahead: int = 0  # bytes scheduled in (reading, next)
    target: int = 0  # bytes to keep ahead: doubled whenever the reader outruns the window
    at: float = 0.0  # when the reader started its last file
    slowness: float = 0.0  # seconds it takes a byte: a running average over its files (0: none yet)
    read: int = 0  # bytes of the files the reader has passed
    floor: int = 0  # bytes the window may always hold: twice its first size


class _File:
    """A file of a window whose pieces are fetched, each by a worker of its own: the
    pieces left, and how the file went ("fetched" unless a piece failed or was skipped)."""

    __slots__ = ("left", "outcome")

    def __init__(self, pieces: int) -> None:
        self.left = pieces
        self.outcome = "fetched"


FindView = Callable[[str], "tuple[Any, Any] | None"]  # a view's path -> (registry, view)
PACE_WEIGHT = 0.1  # of each file in a reader's running pace
# A window holds at most this share of what its reader has read (or its first two sizes):
# what a node fetches and its ranks never read (when they stop) stays within a tenth of
# what they read, however thin each node's slice of the job (issue 43: 2 to 8 nodes).
AHEAD_OF_READ = 0.1


class Prefetcher:
    """Reads ahead of the readers of the views `find_view` knows (mount/views.py)."""

    def __init__(self, find_view: FindView, prefetch: int, max_requests: int, budget: int | None = None,
                 slots: Gate | None = None) -> None:
        self.find_view = find_view
        self.prefetch = prefetch
        self.budget = budget if budget is not None else 4 * prefetch  # bytes ahead, all windows together
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._windows: dict[str, _Window] = {}
        self._sizes: dict[tuple[str, int], int] = {}  # (view, file) scheduled -> bytes
        self._done: set[tuple[str, int]] = set()  # (view, file) scheduled and fetched
        self._running: Counter[str] = Counter()  # per view: pieces scheduled and not finished (under _lock)
        self.max_requests = max_requests
        self.slots = slots if slots is not None else Gate(max_requests)  # the store's request slots
        self.queue = FairQueue()
        self._workers = [threading.Thread(target=self._work, name=f"mmfs-prefetch-{k}", daemon=True)
                         for k in range(max_requests)]
        self._pieces = ThreadPoolExecutor(max_requests, thread_name_prefix="mmfs-fetch")  # for readers
        self.files = self.failed = 0
        self._lock = threading.Lock()  # the pieces left of the files being fetched
        self._hook = ffi.callback("mmfs_read_hook", self._told)  # kept alive with self
        self._thread = threading.Thread(target=self._run, name="mmfs-prefetch-plan", daemon=True)

    def start(self) -> None:
        if self.prefetch > 0:  # 0: no window; a read still fetches its own pieces at once
            self._thread.start()
            for worker in self._workers:
                worker.start()
        lib.mmfs_fuse_set_read_hook(self._hook)

    def stop(self) -> None:
        lib.mmfs_fuse_set_read_hook(ffi.NULL)
        self._events.put(None)
        self.queue.close()
        self._pieces.shutdown(wait=False, cancel_futures=True)
        if self.prefetch > 0:
            log.info("prefetch: %d files fetched ahead, %d failed; bytes per view: %s", self.files,
                     self.failed, json.dumps(self.queue.given, sort_keys=True))
        log.info("requests in flight: %s", json.dumps(self.slots.counters(), sort_keys=True))

    def _told(self, path, file: int) -> None:
        """From a FUSE thread, in C's read handler, before it reads file `file` of
        the view at `path`: tell the planner, and fetch the file's pieces now unless
        the window has."""
        key = ffi.string(path).decode("utf-8", "surrogateescape")
        found = self.find_view(key)
        if found is None:
            return
        if self.prefetch > 0:
            self._events.put(("read", key, file, (found, time.monotonic())))
        if (key, file) in self._done:
            return
        try:
            self._warm(*found, file)
        except Exception:  # the read itself fetches what is missing, and says why it fails
            log.debug("fetching the pieces of file %d of %s failed", file, key, exc_info=True)

    def _warm(self, registry, view, file: int) -> None:
        wanted = _noted(registry, view, file)
        if len(wanted) > 1:  # (one piece: the read fetches it itself)
            wait([self._pieces.submit(_fill, *piece) for piece in merged(wanted)])

    def _run(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            kind, key, file, found = event
            try:
                if kind == "read":
                    self._advance(key, found[0], file, found[1])
                elif kind == "fetched" and (key, file) in self._sizes:  # (else "failed" or "skipped")
                    self._done.add((key, file))
            except Exception:  # never let the planner die: the mount still serves
                log.exception("prefetch planning failed")

    def _advance(self, key: str, found: tuple[Any, Any], file: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        w = self._windows.get(key)
        if w is None or w.view is not found[1]:  # (a stream layout made again: the same files)
            w = self._windows[key] = _Window(*found)
        registry, view = found
        if file <= w.reading or file > w.next:  # a jump (or a re-read): start over here
            for _, j, _, state in self.queue.drop(key):
                self._piece_done(key, j, state, "skipped")
            w.next, w.ahead = file + 1, 0
            w.target = 2 * registry.size(view, file)
            w.floor = max(w.floor, 2 * w.target)
            self._sizes = {k: v for k, v in self._sizes.items() if k[0] != key}
            self._done = {k for k in self._done if k[0] != key}
        else:  # the reader moved on: what it passed no longer counts ahead
            passed = 0
            for j in range(w.reading + 1, file + 1):
                passed += registry.size(view, j - 1)  # (the files read since the last one started)
                w.ahead -= self._sizes.pop((key, j), 0)
                self._done.discard((key, j))
            if passed:  # (per byte, not bytes a second: a burst of cached files weighs what it took)
                w.slowness += PACE_WEIGHT * ((now - w.at) / passed - w.slowness)
                w.read += passed
            if (key, file) not in self._done and self._running[key] < self._share() and self._short(w):
                w.target = 2 * w.target  # it caught up with a window that was not the limit
            w.next = max(w.next, file + 1)
        w.reading, w.at = file, now
        w.target = min(max(w.target, 1), self.prefetch, max(w.floor, int(AHEAD_OF_READ * w.read)))
        ahead = sum(x.ahead for x in self._windows.values())
        share = self.budget // max(1, sum(x.ahead > 0 or x is w for x in self._windows.values()))
        while w.ahead < w.target and w.next < view.count and (ahead < self.budget or w.ahead < share):
            j = w.next
            size = registry.size(view, j)
            self._sizes[(key, j)] = size
            w.ahead += size
            ahead += size
            w.next += 1
            pieces = merged(_noted(registry, view, j)) or [None]  # (None: nothing to fetch, all local)
            state = _File(len(pieces))
            with self._lock:
                self._running[key] += len(pieces)
            for piece in pieces:  # each its own request: the file is there in one round trip
                self.queue.put(key, size if piece is None else piece[2], (w, j, piece, state))

    def _short(self, w: _Window) -> bool:
        """Whether the window holds less than twice what its reader reads while a
        request is answered (Little's law, at the reader's pace and the store's
        latency): wider, it would only fetch further ahead of a reader that waits
        for something else. True while either is not measured yet."""
        latency = self.slots.latency
        return not latency or not w.slowness or w.target * w.slowness < 2 * latency

    def _share(self) -> int:
        """A view's fair part of the request slots: the limit over the views fetching."""
        with self._lock:
            fetching = sum(n > 0 for n in self._running.values())
        return max(1, self.slots.limit // max(1, fetching))

    def _piece_done(self, key: str, j: int, state: _File, outcome: str) -> None:
        """A piece of file j of view `key` went as `outcome`; the file's event once
        all its pieces are done."""
        with self._lock:
            self._running[key] -= 1
            state.left -= 1
            if outcome != "fetched" and state.outcome != "failed":
                state.outcome = outcome
            if state.left:
                return
        if state.outcome == "fetched":
            self.files += 1
        elif state.outcome == "failed":
            self.failed += 1
        self._events.put((state.outcome, key, j, None))

    def _work(self) -> None:
        """A worker: the fair queue's next piece, into the range cache."""
        while (got := self.queue.get()) is not None:
            key, (w, j, piece, state) = got
            outcome = "failed"
            try:
                if piece is not None:
                    with self.slots.slot(background=True):  # the fair queue's order, behind the readers' own
                        if j <= w.reading or self._windows.get(key) is not w:
                            outcome = "skipped"  # its reader is there already: it fetches it itself
                            continue
                        source, offset, n = piece
                        if hasattr(source, "warm"):
                            source.warm(offset, n)
                        else:  # a backend without it: read the bytes
                            source.read_into(offset, bytearray(n))
                outcome = "fetched"
            except MmfsError as exc:  # the reader's own read will say why, with EIO
                log.debug("prefetch of %s/%s: %s", w.view.path, w.view.name(j), exc)
            except Exception:  # a worker never dies
                log.debug("prefetch of %s/%s failed", w.view.path, w.view.name(j), exc_info=True)
            finally:
                self._piece_done(key, j, state, outcome)


def _noted(registry, view, file: int) -> list[tuple[object, int, int]]:
    """The (source, offset, length) pieces reading the file fetches, fetching none."""
    with noted_fetches() as wanted:
        registry.read(view, file, 0, registry.size(view, file))
    return wanted


def merged(pieces: list[tuple[object, int, int]]) -> list[tuple[object, int, int]]:
    """(source, offset, length) pieces with the adjacent or overlapping ranges of a
    source joined into one, of at most MAX_REQUEST bytes (the sequences of a
    document lie back to back: one request, not one per sequence)."""
    out: list[tuple[object, int, int]] = []
    for source, offset, n in sorted(pieces, key=lambda p: (id(p[0]), p[1])):
        if out and out[-1][0] is source:
            _, start, length = out[-1]
            end = max(start + length, offset + n)
            if offset <= start + length and end - start <= MAX_REQUEST:
                out[-1] = (source, start, end - start)
                continue
        out.append((source, offset, n))
    return out


def _fill(source, offset: int, n: int) -> None:
    """Bring bytes of a source into its cache (errors: the reader's read reports them)."""
    try:
        source.read_into(offset, bytearray(n))
    except MmfsError:
        pass

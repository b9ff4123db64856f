"""Order-aware prefetch for a mount whose data is in object storage.

Every file of a view is followed by the next one: a reader of samples/, of a
rank's micro-batches or of documents reads file j + 1 after file j. When the C
handlers serve the first bytes of file j of a view, they tell this prefetcher
(mmfs_fuse_set_read_hook), which reads files j + 1, j + 2, ... of that view in
the background, ahead of the reader, with at most `max_requests` reads at once.
The window starts at two files and doubles, up to `prefetch` bytes, each time the
reader reaches a file whose fetch has not finished while fewer than `max_requests`
fetches run (with them all running, the store is what the reader waits for, and a
wider window would only fetch further ahead): it grows until it hides the store's
latency at the reader's pace, and no further, so what is fetched and never read
when a reader stops stays small. Reading a file through the C core fetches exactly
the byte ranges of its pieces into the range cache, so the reader then finds
them there. Each view has its own window: a rank that reads only its own files
fetches only its own samples' bytes. A reader that jumps (a resumed job) moves
the window to where it now reads.

A file the window has not fetched yet is fetched when its first bytes are read:
every piece at once (the C core would fetch them one after another, a round trip
each), before the read goes on. Either way a file's pieces that lie back to back in
an object (the sequences of a document) are joined into one request.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from mmfs.errors import MmfsError
from mmfs.megatron.arrays import noted_fetches
from mmfs.native import ffi, lib
from mmfs.storage.rangecache import MAX_REQUEST

log = logging.getLogger(__name__)


@dataclass
class _Window:
    reading: int = -1  # the file the reader last started
    next: int = 0  # the next file to fetch
    ahead: int = 0  # bytes scheduled in (reading, next)
    target: int = 0  # bytes to keep ahead: doubled whenever the reader outruns the window


class Prefetcher:
    """Reads ahead of the readers of `registry`'s views (mount/views.py)."""

    def __init__(self, registry, prefetch: int, max_requests: int) -> None:
        self.registry = registry
        self.prefetch = prefetch
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._windows: dict[int, _Window] = {}
        self._sizes: dict[tuple[int, int], int] = {}  # (view, file) scheduled -> bytes
        self._done: set[tuple[int, int]] = set()  # (view, file) scheduled and fetched
        self._running = 0  # fetches scheduled and not finished
        self.max_requests = max_requests
        self._pool = ThreadPoolExecutor(max_requests, thread_name_prefix="mmfs-prefetch")
        self._pieces = ThreadPoolExecutor(max_requests, thread_name_prefix="mmfs-fetch")  # for readers
        self._slots = threading.BoundedSemaphore(max_requests * 2)  # queued + running reads
        self.files = self.failed = 0
        self._hook = ffi.callback("mmfs_read_hook", self._told)  # kept alive with self
        self._thread = threading.Thread(target=self._run, name="mmfs-prefetch-plan", daemon=True)

    def start(self) -> None:
        if self.prefetch > 0:  # 0: no window; a read still fetches its own pieces at once
            self._thread.start()
        lib.mmfs_fuse_set_read_hook(self._hook)

    def stop(self) -> None:
        lib.mmfs_fuse_set_read_hook(ffi.NULL)
        self._events.put(None)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pieces.shutdown(wait=False, cancel_futures=True)

    def _told(self, view: int, file: int) -> None:
        """From a FUSE thread, in C's read handler, before it reads file `file`:
        tell the planner, and fetch the file's pieces now unless the window has."""
        if self.prefetch > 0:
            self._events.put(("read", view, file))
        if (view, file) in self._done:
            return
        try:
            self._warm(self.registry.views[view], file)
        except Exception:  # the read itself fetches what is missing, and says why it fails
            log.debug("fetching the pieces of file %d of view %d failed", file, view, exc_info=True)

    def _warm(self, view, file: int) -> None:
        wanted = self._noted(view, file)
        if len(wanted) > 1:  # (one piece: the read fetches it itself)
            wait([self._pieces.submit(_fill, *piece) for piece in merged(wanted)])

    def _noted(self, view, file: int) -> list[tuple[object, int, int]]:
        """The (source, offset, length) pieces reading the file fetches, fetching none."""
        with noted_fetches() as wanted:
            self.registry.read(view, file, 0, self.registry.size(view, file))
        return wanted

    def _run(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            kind, d, file = event
            try:
                if kind == "read":
                    self._advance(d, file)
                else:  # "fetched" or "failed"
                    self._running -= 1
                    if kind == "fetched" and (d, file) in self._sizes:
                        self._done.add((d, file))
            except Exception:  # never let the planner die: the mount still serves
                log.exception("prefetch planning failed")

    def _advance(self, d: int, file: int) -> None:
        view = self.registry.views[d]
        w = self._windows.setdefault(d, _Window())
        if file <= w.reading or file > w.next:  # a jump (or a re-read): start over here
            w.next, w.ahead = file + 1, 0
            w.target = 2 * self.registry.size(view, file)
            self._sizes = {k: v for k, v in self._sizes.items() if k[0] != d}
            self._done = {k for k in self._done if k[0] != d}
        else:  # the reader moved on: what it passed no longer counts ahead
            if (d, file) not in self._done and self._running < self.max_requests:
                w.target = 2 * w.target  # it caught up with a window that was not the limit
            for j in range(w.reading + 1, file + 1):
                w.ahead -= self._sizes.pop((d, j), 0)
                self._done.discard((d, j))
            w.next = max(w.next, file + 1)
        w.reading = file
        w.target = min(max(w.target, 1), self.prefetch)
        count = view.count
        while w.ahead < w.target and w.next < count:
            j = w.next
            size = self.registry.size(view, j)
            if not self._slots.acquire(blocking=False):
                break  # enough in flight: the next read of the reader moves on
            self._sizes[(d, j)] = size
            w.ahead += size
            w.next += 1
            self._running += 1
            self._pool.submit(self._fetch, d, view, j, size)

    def _fetch(self, d: int, view, j: int, size: int) -> None:
        # one file a task: files are fetched side by side, the (joined) pieces of each in turn
        outcome = "failed"
        try:
            for source, offset, n in merged(self._noted(view, j)):  # into the range cache
                source.read_into(offset, bytearray(n))
            self.files += 1
            outcome = "fetched"
        except MmfsError as exc:  # the reader's own read will say why, with EIO
            self.failed += 1
            log.debug("prefetch of %s/%s: %s", view.path, view.name(j), exc)
        finally:
            self._slots.release()
            self._events.put((outcome, d, j))


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

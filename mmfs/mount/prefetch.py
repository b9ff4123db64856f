"""Order-aware prefetch for a mount whose data is in object storage.

Every file of a view is followed by the next one: a reader of samples/, of a
rank's micro-batches or of documents reads file j + 1 after file j. When the C
handlers serve the first bytes of file j of a view, they tell this prefetcher
(mmfs_fuse_set_read_hook), which reads files j + 1, j + 2, ... of that view in
the background, up to `prefetch` bytes ahead of the reader, with at most
`max_requests` reads at once. Reading a file through the C core fetches exactly
the byte ranges of its pieces into the range cache, so the reader then finds
them there. Each view has its own window: a rank that reads only its own files
fetches only its own samples' bytes. A reader that jumps (a resumed job) moves
the window to where it now reads.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mmfs.errors import MmfsError
from mmfs.native import ffi, lib

log = logging.getLogger(__name__)


@dataclass
class _Window:
    reading: int = -1  # the file the reader last started
    next: int = 0  # the next file to fetch
    ahead: int = 0  # bytes scheduled in (reading, next)


class Prefetcher:
    """Reads ahead of the readers of `registry`'s views (mount/views.py)."""

    def __init__(self, registry, prefetch: int, max_requests: int) -> None:
        self.registry = registry
        self.prefetch = prefetch
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._windows: dict[int, _Window] = {}
        self._sizes: dict[tuple[int, int], int] = {}  # (view, file) scheduled -> bytes
        self._pool = ThreadPoolExecutor(max_requests, thread_name_prefix="mmfs-prefetch")
        self._slots = threading.BoundedSemaphore(max_requests * 2)  # queued + running reads
        self.files = self.failed = 0
        self._hook = ffi.callback("mmfs_read_hook", self._told)  # kept alive with self
        self._thread = threading.Thread(target=self._run, name="mmfs-prefetch-plan", daemon=True)

    def start(self) -> None:
        if self.prefetch <= 0:
            return
        self._thread.start()
        lib.mmfs_fuse_set_read_hook(self._hook)

    def stop(self) -> None:
        lib.mmfs_fuse_set_read_hook(ffi.NULL)
        self._events.put(None)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _told(self, view: int, file: int) -> None:
        """From a FUSE thread, in C's read handler: note it, return at once."""
        self._events.put((view, file))

    def _run(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            try:
                self._advance(*event)
            except Exception:  # never let the planner die: the mount still serves
                log.exception("prefetch planning failed")

    def _advance(self, d: int, file: int) -> None:
        view = self.registry.views[d]
        w = self._windows.setdefault(d, _Window())
        if file <= w.reading or file > w.next:  # a jump (or a re-read): start over here
            w.next, w.ahead = file + 1, 0
            self._sizes = {k: v for k, v in self._sizes.items() if k[0] != d}
        else:  # the reader moved on: what it passed no longer counts ahead
            for j in range(w.reading + 1, file + 1):
                w.ahead -= self._sizes.pop((d, j), 0)
            w.next = max(w.next, file + 1)
        w.reading = file
        count = view.count
        while w.ahead < self.prefetch and w.next < count:
            j = w.next
            size = self.registry.size(view, j)
            if not self._slots.acquire(blocking=False):
                break  # enough in flight: the next read of the reader moves on
            self._sizes[(d, j)] = size
            w.ahead += size
            w.next += 1
            self._pool.submit(self._fetch, view, j, size)

    def _fetch(self, view, j: int, size: int) -> None:
        try:
            self.registry.read(view, j, 0, size)  # into the range cache, through the C core
            self.files += 1
        except MmfsError as exc:  # the reader's own read will say why, with EIO
            self.failed += 1
            log.debug("prefetch of %s/%s: %s", view.path, view.name(j), exc)
        finally:
            self._slots.release()

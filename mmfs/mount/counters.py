"""The daemon's own counters, as `user.mmfs.counters` on the mount's root gives them
(docs/mount.md): the FUSE requests it was sent by kind (the C handlers count theirs,
native/mmfs_fuse.c; this counts the ones Python answers), the most READs in the
daemon at once, the requests to the store in flight (storage/inflight.py), what
the range caches hold and dropped (storage/rangecache.py) and the readers' block
caches (native/mmfs_readers.c: one per thread alive that read with pread)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from mmfs.native import ffi, lib
from mmfs.storage.inflight import counters as storage_counters
from mmfs.storage.remote import range_counters


def block_caches() -> dict[str, int]:
    """The C readers' block caches: held by threads alive now, pooled (given back by
    threads that ended), made and freed so far."""
    c = ffi.new("mmfs_block_caches *")
    lib.mmfs_block_caches_get(c)
    return {"held": c.held, "pooled": c.pooled, "made": c.made, "freed": c.freed}


class Counters:
    def __init__(self) -> None:
        self._python: Counter[str] = Counter()  # the requests Python answers, by table entry
        self._lock = threading.Lock()

    def count(self, name: str) -> None:
        with self._lock:
            self._python[name] += 1

    def read(self) -> dict[str, Any]:
        requests = {}
        kind = 0
        while (name := lib.mmfs_fuse_request_name(kind)) != ffi.NULL:
            requests[ffi.string(name).decode()] = lib.mmfs_fuse_requests(kind)
            kind += 1
        with self._lock:
            requests.update(self._python)
        return {"requests": requests, "reads_at_once": lib.mmfs_fuse_reads_at_once(), "storage": storage_counters(),
                "ranges": range_counters(), "block_caches": block_caches()}

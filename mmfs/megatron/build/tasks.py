"""The build's bookkeeping: one index to obtain (a task), the locks tasks are
built under, and the progress a build logs."""

from __future__ import annotations

import logging
import os
import threading
import time

from mmfs.megatron.cache.index_cache import IndexCache, description_hash
from mmfs.megatron.indices.built import BLEND_ARRAYS

log = logging.getLogger("mmfs.megatron.build.builder")
DETAILED_UP_TO = 16  # indices: a build of more logs only its progress


class _Task:
    """One index to obtain: from the cache, by building it, or by waiting for the
    builder that holds its lock. `result` is set once it is obtained."""

    def __init__(self, cache: IndexCache, specs: dict, label: str, fits, make, check) -> None:
        self.cache = cache
        self.specs = specs
        self.label = label
        self.fits = fits  # cached arrays (headers) -> bool
        self.make = make  # () -> dict of arrays
        self.check = check  # () -> None: raises when it cannot be built (before any is)
        self.checked = False
        self.result: tuple[dict, bool] | None = None  # (arrays, from_cache)
        self.weights: list | None = None  # a blend's, as Megatron describes them
        self.lock_path = cache.lock_path  # or its claim's (assign_locks)


CLAIM_MAX = 32  # indices under one build lock


def assign_locks(tasks: list[_Task]) -> None:
    """The lock each task is built under. A lock file per index would create and
    delete thousands of inodes for a large blend (and on ext4 without a journal,
    every file created in the next minutes scans the freed ones), so GPTDatasets
    go in claims of up to CLAIM_MAX, named after their members: builders of one
    config agree on them. A config of fewer than 128 indices keeps a lock per
    index; a larger one has at least 64 claims, to share among threads and builders."""
    size = max(1, min(CLAIM_MAX, len(tasks) // 64))
    if size == 1:
        return
    groups: dict[tuple, list[_Task]] = {}
    for t in tasks:  # a blend (a long build) stays alone
        groups.setdefault((t.cache.folder, t.specs is BLEND_ARRAYS), []).append(t)
    for (folder, blends), group in groups.items():
        if blends or folder is None:
            continue
        for k in range(0, len(group), size):
            members = group[k:k + size]
            if len(members) > 1:
                name = description_hash("\n".join(t.cache.base for t in members))
                for t in members:
                    t.lock_path = os.path.join(folder, f"{name}-indices.lock")


class _Progress:
    """Logs how many indices are ready, at most once a second, and at the end. A
    small build also names each index it builds and its steps; a large one (a
    blend of many datasets) only counts."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.built = self.loaded = 0
        self.detailed = total <= DETAILED_UP_TO
        self.t0 = self.last = time.perf_counter()
        self._guard = threading.Lock()

    def building(self, label: str) -> None:
        with self._guard:
            n = self.built + self.loaded + 1
        log.log(logging.INFO if self.detailed else logging.DEBUG, "[%d] building %s indices",
                n, label)

    def step(self, built: bool) -> None:
        with self._guard:
            if built:
                self.built += 1
            else:
                self.loaded += 1
            now = time.perf_counter()
            done = self.built + self.loaded
            if now - self.last >= 1.0 or done == self.total:
                self.last = now
                log.info("indices: %d/%d ready (%d built, %d from cache) in %.1f s", done,
                         self.total, self.built, self.loaded, now - self.t0)


class _DropInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno != logging.INFO


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)

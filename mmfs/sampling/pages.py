"""Keeping a long-running reader's resident memory flat.

Every index and token file is memory-mapped; each page a read touches stays
mapped into the process and counts in its RSS, so a daemon reading random
samples of a large config would grow to the size of everything it touched.
`MappedFiles.release()` drops those mappings (madvise MADV_DONTNEED): the data
stays in the page cache and the next touch maps it back with a minor fault.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE")


def _mapping_of(array) -> mmap.mmap | None:
    """The mmap an array is a view of (through any chain of views), if any."""
    seen = 0
    while array is not None and seen < 64:
        if isinstance(array, mmap.mmap):
            return array
        if isinstance(array, np.memmap) and isinstance(getattr(array, "_mmap", None), mmap.mmap):
            return array._mmap
        array = getattr(array, "base", None) if not isinstance(array, memoryview) else array.obj
        seen += 1
    return None


class MappedFiles:
    """The distinct file mappings behind a set of arrays."""

    def __init__(self, arrays) -> None:
        maps: dict[int, mmap.mmap] = {}
        for a in arrays:
            m = _mapping_of(a)
            if m is not None:
                maps[id(m)] = m
        self.maps = list(maps.values())

    def trim(self, limit_bytes: int) -> bool:
        """release() if the process's resident memory is above limit_bytes (cheap to
        call often: one small read of /proc/self/statm)."""
        try:
            with open("/proc/self/statm", "rb") as f:
                resident = int(f.read().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            return False
        if resident <= limit_bytes:
            return False
        self.release()
        return True

    def release(self) -> None:
        for m in self.maps:
            try:
                m.madvise(mmap.MADV_DONTNEED)
            except (ValueError, OSError):  # closed, or a zero-length map
                pass
